//! Experiment: RDMA Reads of a slot that is being rewritten, with MPA CRC
//! required on both sides.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ccache::table::VersionTable;
use ccache_proto::slot::{Advert, SLOT_LEN};
use iwarp::cm::{self, ConnParam, Listener, MpaConfig, Policy};
use iwarp::{Access, Context, QpInitAttr, SendWr, SgList, WcStatus, WrOpcode};

#[test]
#[ignore = "experiment (docs/CACHE.md): prints how Reads fare under concurrent updates"]
fn reads_during_updates_crc_required_vs_off() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
    for crc in [Policy::Required, Policy::Off] {
        let r = run(crc);
        eprintln!("MPA CRC {crc:?}: {r}");
    }
}

fn run(crc: Policy) -> String {
    let t = Duration::from_secs(5);
    let mpa = MpaConfig {
        crc,
        ..MpaConfig::default()
    };
    let sctx = Context::open().unwrap();
    let spd = sctx.alloc_pd();
    let scq = sctx.create_cq(4).unwrap();
    let table = Arc::new(VersionTable::new(&spd, 1, 1).unwrap());
    let l = Listener::bind("127.0.0.1:0".parse().unwrap(), mpa.clone()).unwrap();
    let addr = l.local_addr();
    let tb = table.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let server = std::thread::spawn(move || {
        let qp = spd
            .create_qp(&QpInitAttr {
                send_cq: scq.clone(),
                recv_cq: scq.clone(),
                max_send_wr: 4,
                max_recv_wr: 4,
            })
            .unwrap();
        let req = l.get_request(Some(t)).unwrap();
        req.accept(
            &qp,
            &ConnParam {
                private_data: tb.advert().emit().to_vec(),
                ..ConnParam::default()
            },
        )
        .unwrap();
        let mut v = 2u64;
        while !st.load(Ordering::Relaxed) {
            tb.publish(0, v);
            v += 1;
        }
        drop(qp);
        v
    });
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(4).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            max_send_wr: 4,
            max_recv_wr: 1,
        })
        .unwrap();
    let buf = pd.reg_mr(SLOT_LEN, Access::LOCAL_WRITE).unwrap();
    let pdata = cm::connect(
        &qp,
        addr,
        &ConnParam {
            mpa,
            ..ConnParam::default()
        },
    )
    .unwrap();
    let a = Advert::parse(&pdata).unwrap();
    let mut ok = 0u64;
    let mut torn = 0u64;
    let mut fail = None;
    for i in 0..200_000u64 {
        qp.post_send(&SendWr {
            wr_id: i,
            opcode: WrOpcode::RdmaRead {
                remote_addr: a.slot_addr(0),
                rkey: a.rkey,
            },
            sgl: SgList::single(buf.sge(0, SLOT_LEN)),
            signaled: true,
            solicited: false,
        })
        .unwrap();
        let wc = cq.wait_one(t).unwrap().expect("completion");
        if wc.status != WcStatus::Success {
            fail = Some((i, wc.status));
            break;
        }
        let mut b = [0u8; SLOT_LEN];
        buf.read_at(0, &mut b);
        if ccache_proto::slot::decode(0, &b).is_ok() {
            ok += 1
        } else {
            torn += 1
        }
    }
    stop.store(true, Ordering::Relaxed);
    let writes = server.join().unwrap();
    format!("{ok} reads consistent, {torn} torn (check word), failure {fail:?}, {writes} publishes meanwhile, QP {:?}", qp.state())
}
