//! Fuzz target: the QP engine's receive path on hostile input. Any byte
//! stream, split anywhere, with CRC and markers on or off, must end in a
//! well-formed state: no panic, no write outside a registered region (the
//! SimMemory checks every access), at most one Terminate, and after an
//! error nothing but that Terminate leaves the engine.
#![no_main]

use iwarp_proto::engine::{
    Engine, EngineConfig, EngineEvent, LinkParams, QpState, RecvWr, RxHint, SgList, Sge, TxFrame,
};
use iwarp_proto::mem::{Access, MemoryAccess, SimMemory};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, rest)) = data.split_first() else {
        return;
    };
    let mem = SimMemory::new();
    let pd = 1;
    // STag 0x101: writable target; 0x202: read-only source; both small.
    let w = mem.register(pd, Access::ALL, 0, 256);
    let _r = mem.register(pd, Access::REMOTE_READ, 0x1000, 64);
    let mut eng = Engine::new(EngineConfig {
        pd,
        sq_depth: 8,
        rq_depth: 8,
    });
    eng.establish(LinkParams {
        crc: cfg & 1 != 0,
        markers_tx: cfg & 2 != 0,
        markers_rx: cfg & 2 != 0,
        mulpdu: 64 + (cfg as u32 >> 2) * 16,
        ird: 2,
        ord: 2,
    });
    for k in 0..2u64 {
        let _ = eng.post_recv(RecvWr {
            wr_id: k,
            sgl: SgList::single(Sge {
                addr: k * 64,
                length: 64,
                lkey: w,
            }),
        });
    }
    let mut frame = TxFrame::default();
    let mut terminates = 0;
    let mut i = 0;
    let mut step = 1 + (cfg as usize % 7);
    while i < rest.len() {
        let n = step.min(rest.len() - i);
        match eng.rx_hint() {
            RxHint::Direct { stag, to, len } if cfg & 4 != 0 => {
                let k = n.min(len as usize);
                mem.write(stag, to, &rest[i..i + k])
                    .expect("direct target was validated");
                eng.handle_direct(k, &mem);
                i += k;
            }
            _ => {
                let used = eng.handle_input(&rest[i..i + n], &mem);
                assert_eq!(used, n);
                i += n;
            }
        }
        step = step % 13 + 1;
        frame.clear();
        while eng.poll_transmit(&mut frame, 1 << 16, &mem) {
            eng.confirm_transmit();
            if frame.len() > 1 << 20 {
                break;
            }
        }
        while eng.poll_completion().is_some() {}
        while let Some(ev) = eng.poll_event() {
            if matches!(ev, EngineEvent::TerminateSent(_)) {
                terminates += 1;
            }
        }
    }
    assert!(terminates <= 1, "one Terminate per stream");
    if eng.state() == QpState::Error {
        frame.clear();
        assert!(
            !eng.poll_transmit(&mut frame, 1 << 16, &mem),
            "nothing after the Terminate"
        );
        assert!(eng.wants_close());
    }
});
