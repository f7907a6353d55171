//! The README's quick tour: a server and a client in one process, over
//! 127.0.0.1. The client RDMA-Writes into the server's buffer, RDMA-Reads
//! it back, then Sends a message. Run: `cargo run --example quick_tour`.

use std::time::Duration;

use iwarp::cm::{self, ConnParam, Listener, MpaConfig, Policy};
use iwarp::{Access, Context, QpInitAttr, RecvWr, SendWr, SgList, WcStatus, WrOpcode};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let t = Duration::from_secs(5);
    let mpa = MpaConfig {
        crc: Policy::Required,
        ..MpaConfig::default()
    };

    // Server: listen, expose a 4 KiB region, keep a receive posted.
    let listener = Listener::bind("127.0.0.1:0".parse()?, mpa.clone())?;
    let addr = listener.local_addr();
    let server = std::thread::spawn(move || -> Result<String, String> {
        let ctx = Context::open().map_err(|e| e.to_string())?;
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(16).map_err(|e| e.to_string())?;
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                max_send_wr: 16,
                max_recv_wr: 16,
            })
            .map_err(|e| e.to_string())?;
        let buf = pd
            .reg_mr(
                4096,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .map_err(|e| e.to_string())?;
        let inbox = pd
            .reg_mr(64, Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        qp.post_recv(&RecvWr {
            wr_id: 1,
            sgl: SgList::single(inbox.sge(0, 64)),
        })
        .map_err(|e| e.to_string())?;
        let req = listener.get_request(Some(t)).map_err(|e| e.to_string())?;
        // Tell the client where to write: address and rkey as private data.
        let mut pdata = buf.addr().to_be_bytes().to_vec();
        pdata.extend_from_slice(&buf.rkey().to_be_bytes());
        req.accept(
            &qp,
            &ConnParam {
                private_data: pdata,
                ..ConnParam::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let wc = cq
            .wait_one(t)
            .map_err(|e| e.to_string())?
            .ok_or("no Send arrived")?;
        assert_eq!(wc.status, WcStatus::Success);
        let mut msg = vec![0u8; wc.byte_len as usize];
        inbox.read_at(0, &mut msg);
        let mut written = vec![0u8; 13];
        buf.read_at(0, &mut written);
        Ok(format!(
            "{} / {}",
            String::from_utf8_lossy(&msg),
            String::from_utf8_lossy(&written)
        ))
    });

    // Client: connect, learn the server's buffer from the private data.
    let ctx = Context::open()?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16)?;
    let qp = pd.create_qp(&QpInitAttr {
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        max_send_wr: 16,
        max_recv_wr: 16,
    })?;
    let peer = cm::connect(
        &qp,
        addr,
        &ConnParam {
            mpa,
            ..ConnParam::default()
        },
    )?;
    let remote_addr = u64::from_be_bytes(peer[..8].try_into()?);
    let rkey = u32::from_be_bytes(peer[8..12].try_into()?);

    let local = pd.reg_mr(4096, Access::LOCAL_WRITE)?;
    local.write_at(0, b"hello, iWARP!");
    // RDMA Write 13 bytes into the server's buffer, then read them back.
    qp.post_send(&SendWr {
        wr_id: 10,
        opcode: WrOpcode::RdmaWrite { remote_addr, rkey },
        sgl: SgList::single(local.sge(0, 13)),
        signaled: true,
        solicited: false,
    })?;
    qp.post_send(&SendWr {
        wr_id: 11,
        opcode: WrOpcode::RdmaRead { remote_addr, rkey },
        sgl: SgList::single(local.sge(100, 13)),
        signaled: true,
        solicited: false,
    })?;
    for want in [10, 11] {
        let wc = cq.wait_one(t)?.ok_or("completion timed out")?;
        assert_eq!((wc.wr_id, wc.status), (want, WcStatus::Success));
    }
    let mut back = [0u8; 13];
    local.read_at(100, &mut back);
    assert_eq!(&back, b"hello, iWARP!");
    // A two-sided Send completes the server's posted receive.
    local.write_at(200, b"done");
    qp.post_send(&SendWr {
        wr_id: 12,
        opcode: WrOpcode::Send,
        sgl: SgList::single(local.sge(200, 4)),
        signaled: true,
        solicited: false,
    })?;
    assert_eq!(
        cq.wait_one(t)?.ok_or("send timed out")?.status,
        WcStatus::Success
    );

    let seen = server.join().map_err(|_| "server panicked")??;
    println!("server saw: {seen}");
    qp.disconnect();
    Ok(())
}
