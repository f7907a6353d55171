//! The verbs API over a kernel RDMA device (the rdma-core provider): a
//! server and a client thread in one process, on one device, connected
//! through rdma_cm over `ADDR` (an address of that device's netdev).
//!
//! ```text
//! rdma_loopback list                      devices and what they report
//! rdma_loopback DEVICE ADDR PORT          Send, RDMA Write, RDMA Read, flush
//! rdma_loopback server DEVICE ADDR PORT [WAIT_SECS]
//! rdma_loopback client DEVICE ADDR PORT   the same as two processes
//! ```
//!
//! DEVICE is `soft` (this crate's TCP stack), `auto`, or a kernel device;
//! a `soft` end talks to a kernel iWARP end (siw) over the wire.
//!
//! Each step prints `PASS <step>` or `FAIL <step>: why`; the exit status is
//! 0 only when every step passed. Used by scripts/test-rdmacore.sh inside
//! the siw-vm guest on siw0 and rxe0.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use iwarp::rdma::cm;
use iwarp::{
    Access, CompletionQueue, Context, QpEvent, QpInitAttr, QueuePair, RecvWr, SendWr, SgList,
    WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

const T: Duration = Duration::from_secs(10);
const LEN: usize = 4096;

type Res<T> = Result<T, String>;

fn wait(cq: &CompletionQueue, what: &str) -> Res<WorkCompletion> {
    match cq.wait_one(T) {
        Ok(Some(wc)) => Ok(wc),
        Ok(None) => Err(format!("{what}: no completion within {T:?}")),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

fn expect_ok(wc: &WorkCompletion, op: WcOpcode, what: &str) -> Res<()> {
    if wc.status != WcStatus::Success || wc.opcode != op {
        return Err(format!("{what}: {wc:?}"));
    }
    Ok(())
}

/// A listener of either provider: rdma_cm for a kernel device, this
/// crate's cm for `soft` (the mixed pairs: soft on one end, a kernel device
/// on the other).
enum Listener {
    Soft(iwarp::cm::Listener),
    Rdma(cm::Listener),
}

impl Listener {
    fn bind(ctx: &Context, addr: SocketAddr) -> Res<Listener> {
        if ctx.device_name() == "soft" {
            iwarp::cm::Listener::bind(addr, iwarp::cm::MpaConfig::default())
                .map(Listener::Soft)
                .map_err(|e| e.to_string())
        } else {
            cm::Listener::bind(ctx, addr)
                .map(Listener::Rdma)
                .map_err(|e| e.to_string())
        }
    }

    /// Take one request, check its private data, accept it on `qp` with
    /// `reply`.
    fn accept_one(
        &mut self,
        qp: &QueuePair,
        expect: &[u8],
        reply: &[u8],
        accept_wait: Duration,
    ) -> Res<()> {
        let check = |got: &[u8]| {
            if got.starts_with(expect) {
                Ok(())
            } else {
                Err(format!("client private data {got:?}"))
            }
        };
        match self {
            Listener::Soft(l) => {
                let req = l
                    .get_request(Some(accept_wait))
                    .map_err(|e| e.to_string())?;
                check(req.private_data())?;
                let param = iwarp::cm::ConnParam {
                    private_data: reply.to_vec(),
                    ..iwarp::cm::ConnParam::default()
                };
                req.accept(qp, &param).map_err(|e| e.to_string())
            }
            Listener::Rdma(l) => {
                let req = l
                    .get_request(accept_wait)
                    .map_err(|e| e.to_string())?
                    .ok_or("no connect request")?;
                check(req.private_data())?;
                req.accept(qp, reply, T).map_err(|e| e.to_string())
            }
        }
    }
}

fn connect(ctx: &Context, qp: &QueuePair, addr: SocketAddr, data: &[u8]) -> Res<Vec<u8>> {
    if ctx.device_name() == "soft" {
        let param = iwarp::cm::ConnParam {
            private_data: data.to_vec(),
            timeout: T,
            ..iwarp::cm::ConnParam::default()
        };
        iwarp::cm::connect(qp, addr, &param).map_err(|e| e.to_string())
    } else {
        cm::connect(qp, addr, data, T).map_err(|e| e.to_string())
    }
}

fn list() -> ExitCode {
    for d in iwarp::list_devices() {
        println!(
            "{:<10} {:<24} {}",
            d.name,
            d.transport.to_string(),
            d.provider
        );
        if d.provider == "rdma-core" {
            match Context::open_device(&d.name) {
                Ok(ctx) => println!("    {:?}", ctx.device_attr()),
                Err(e) => println!("    cannot open: {e}"),
            }
        }
    }
    ExitCode::SUCCESS
}

fn server(
    ctx: Context,
    addr: SocketAddr,
    ready: mpsc::Sender<()>,
    accept_wait: Duration,
) -> Res<()> {
    let cq = ctx.create_cq(64).map_err(|e| e.to_string())?;
    let pd = ctx.alloc_pd();
    // The client writes into `buf` and reads it back: remote write and read.
    let buf = pd
        .reg_mr(
            LEN,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .map_err(|e| e.to_string())?;
    let rbuf = pd
        .reg_mr(LEN, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            max_send_wr: 16,
            max_recv_wr: 16,
        })
        .map_err(|e| e.to_string())?;
    qp.post_recv(&RecvWr {
        wr_id: 100,
        sgl: SgList::single(rbuf.sge(0, LEN)),
    })
    .map_err(|e| e.to_string())?;
    let mut l = Listener::bind(&ctx, addr)?;
    ready.send(()).ok();
    let mut pd_out = Vec::new();
    pd_out.extend_from_slice(&buf.addr().to_be_bytes());
    pd_out.extend_from_slice(&buf.rkey().to_be_bytes());
    l.accept_one(&qp, b"client hello", &pd_out, accept_wait)?;
    let wc = wait(&cq, "server receive")?;
    expect_ok(&wc, WcOpcode::Recv, "server receive")?;
    let mut got = vec![0u8; wc.byte_len as usize];
    rbuf.read_at(0, &mut got);
    if got != b"ping over rdma-core" {
        return Err(format!("server received {got:?}"));
    }
    // Answer so the client knows the Send landed, then wait for its close.
    qp.post_recv(&RecvWr {
        wr_id: 101,
        sgl: SgList::single(rbuf.sge(0, LEN)),
    })
    .map_err(|e| e.to_string())?;
    rbuf.write_at(0, b"pong");
    qp.post_send(&SendWr {
        wr_id: 102,
        opcode: WrOpcode::Send,
        sgl: SgList::single(rbuf.sge(0, 4)),
        signaled: true,
        solicited: false,
    })
    .map_err(|e| e.to_string())?;
    // The reply Send completes, the client disconnects after its Read,
    // and the disconnect flushes receive 101 (in whatever order the
    // device reports them).
    let (mut sent, mut flushed, mut disconnected) = (false, false, false);
    let deadline = std::time::Instant::now() + T;
    while !(sent && flushed) {
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "server: reply sent {sent}, receive flushed {flushed}, disconnected {disconnected} after {T:?}"
            ));
        }
        if let Some(wc) = cq.poll_one() {
            match (wc.wr_id, wc.status) {
                (102, WcStatus::Success) => sent = true,
                (101, WcStatus::WrFlushErr) => flushed = true,
                _ => return Err(format!("server: unexpected {wc:?}")),
            }
        } else if !disconnected {
            if let Some(QpEvent::Disconnected) = qp.next_event(Duration::from_millis(100)) {
                disconnected = true;
            }
        } else {
            let _ = cq.wait(Duration::from_millis(100));
        }
    }
    // The client wrote the pattern before disconnecting.
    let mut w = vec![0u8; LEN];
    buf.read_at(0, &mut w);
    if w.iter().enumerate().any(|(i, &b)| b != (i % 251) as u8) {
        return Err("server: the RDMA Write's data is wrong".into());
    }
    Ok(())
}

fn client(ctx: Context, addr: SocketAddr) -> Res<Vec<&'static str>> {
    let mut passed = Vec::new();
    let cq = ctx.create_cq(64).map_err(|e| e.to_string())?;
    let pd = ctx.alloc_pd();
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            max_send_wr: 16,
            max_recv_wr: 16,
        })
        .map_err(|e| e.to_string())?;
    if let Some(caps) = iwarp::rdma::qp_caps(&qp) {
        println!("queue pair granted {caps:?}");
    }
    // iWARP: the sink of an RDMA Read needs REMOTE_WRITE.
    let mem = pd
        .reg_mr(LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .map_err(|e| e.to_string())?;
    let back = pd
        .reg_mr(LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .map_err(|e| e.to_string())?;
    let rx = pd
        .reg_mr(64, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    qp.post_recv(&RecvWr {
        wr_id: 1,
        sgl: SgList::single(rx.sge(0, 64)),
    })
    .map_err(|e| e.to_string())?;
    let peer = connect(&ctx, &qp, addr, b"client hello")?;
    if peer.len() < 12 {
        return Err(format!("server private data too short: {peer:?}"));
    }
    let raddr = u64::from_be_bytes(peer[..8].try_into().unwrap());
    let rkey = u32::from_be_bytes(peer[8..12].try_into().unwrap());
    passed.push("connect (private data both ways)");

    mem.write_at(0, b"ping over rdma-core");
    qp.post_send(&SendWr {
        wr_id: 2,
        opcode: WrOpcode::Send,
        sgl: SgList::single(mem.sge(0, 19)),
        signaled: true,
        solicited: false,
    })
    .map_err(|e| e.to_string())?;
    let mut got_send = false;
    let mut got_recv = false;
    while !(got_send && got_recv) {
        let wc = wait(&cq, "client send / reply")?;
        match wc.wr_id {
            2 => {
                expect_ok(&wc, WcOpcode::Send, "client send")?;
                got_send = true;
            }
            1 => {
                expect_ok(&wc, WcOpcode::Recv, "client receive")?;
                let mut b = [0u8; 4];
                rx.read_at(0, &mut b);
                if &b != b"pong" || wc.byte_len != 4 {
                    return Err(format!("client received {b:?} ({} bytes)", wc.byte_len));
                }
                got_recv = true;
            }
            _ => return Err(format!("client: unexpected {wc:?}")),
        }
    }
    passed.push("send/recv both ways");

    let pattern: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    mem.write_at(0, &pattern);
    qp.post_send(&SendWr {
        wr_id: 3,
        opcode: WrOpcode::RdmaWrite {
            remote_addr: raddr,
            rkey,
        },
        sgl: SgList::single(mem.sge(0, LEN)),
        signaled: true,
        solicited: false,
    })
    .map_err(|e| e.to_string())?;
    expect_ok(
        &wait(&cq, "client write")?,
        WcOpcode::RdmaWrite,
        "client write",
    )?;
    passed.push("rdma write 4 KiB");

    qp.post_send(&SendWr {
        wr_id: 4,
        opcode: WrOpcode::RdmaRead {
            remote_addr: raddr,
            rkey,
        },
        sgl: SgList::single(back.sge(0, LEN)),
        signaled: true,
        solicited: false,
    })
    .map_err(|e| e.to_string())?;
    let wc = wait(&cq, "client read")?;
    expect_ok(&wc, WcOpcode::RdmaRead, "client read")?;
    if back.to_vec() != pattern {
        return Err("the RDMA Read returned other bytes than were written".into());
    }
    passed.push("rdma read 4 KiB, data checked");

    // A receive posted now is flushed by the disconnect.
    qp.post_recv(&RecvWr {
        wr_id: 5,
        sgl: SgList::single(rx.sge(0, 64)),
    })
    .map_err(|e| e.to_string())?;
    qp.disconnect();
    let wc = wait(&cq, "client flush")?;
    if wc.wr_id != 5 || wc.status != WcStatus::WrFlushErr {
        return Err(format!("client flush: {wc:?}"));
    }
    passed.push("disconnect flushes a posted receive (WrFlushErr)");
    Ok(passed)
}

fn report(client: Option<Res<Vec<&'static str>>>, server: Option<Res<()>>) -> ExitCode {
    let mut ok = true;
    match client {
        Some(Ok(steps)) => {
            for s in steps {
                println!("PASS {s}");
            }
        }
        Some(Err(e)) => {
            ok = false;
            println!("FAIL client: {e}");
        }
        None => {}
    }
    match server {
        Some(Ok(())) => println!("PASS server side (receive, reply, write data checked, flush)"),
        Some(Err(e)) => {
            ok = false;
            println!("FAIL server: {e}");
        }
        None => {}
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("list") {
        return list();
    }
    let role = match args.first().map(String::as_str) {
        Some("server") | Some("client") => Some(args.remove(0)),
        _ => None,
    };
    // `server ... WAIT_SECS`: how long to wait for the client (default 10).
    let mut accept_wait = T;
    if role.as_deref() == Some("server") && args.len() == 4 {
        match args.pop().and_then(|w| w.parse::<u64>().ok()) {
            Some(secs) => accept_wait = Duration::from_secs(secs),
            None => {
                eprintln!("WAIT_SECS must be a number of seconds");
                return ExitCode::from(2);
            }
        }
    }
    if args.len() != 3 {
        eprintln!(
            "usage: rdma_loopback list | rdma_loopback [server|client] DEVICE ADDR PORT [WAIT_SECS (server)]  (DEVICE: soft, auto, siw0, rxe0, ...)"
        );
        return ExitCode::from(2);
    }
    let ctx = match Context::open_device(&args[0]) {
        Ok(c) => c,
        Err(e) => {
            println!("FAIL open {}: {e}", args[0]);
            return ExitCode::FAILURE;
        }
    };
    println!(
        "device {} ({}): {:?}",
        ctx.device_name(),
        ctx.transport(),
        ctx.device_attr()
    );
    let addr: SocketAddr = match format!("{}:{}", args[1], args[2]).parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bad address: {e}");
            return ExitCode::from(2);
        }
    };
    match role.as_deref() {
        Some("server") => {
            let (tx, rx) = mpsc::channel();
            let h = std::thread::spawn(move || {
                // Say READY once listening, for scripts that start the
                // client then.
                if rx.recv_timeout(T).is_ok() {
                    println!("READY");
                }
            });
            let r = server(ctx, addr, tx, accept_wait);
            let _ = h.join();
            report(None, Some(r))
        }
        Some(_) => report(Some(client(ctx, addr)), None),
        None => {
            let (tx, rx) = mpsc::channel();
            let sctx = ctx.clone();
            let srv = std::thread::spawn(move || server(sctx, addr, tx, T));
            if rx.recv_timeout(T).is_err() {
                println!("FAIL server did not start: {:?}", srv.join());
                return ExitCode::FAILURE;
            }
            let c = client(ctx, addr);
            let s = srv
                .join()
                .unwrap_or_else(|_| Err("server thread panicked".into()));
            report(Some(c), Some(s))
        }
    }
}
