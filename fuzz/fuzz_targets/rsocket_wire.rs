//! Fuzz target: the rsockets wire formats of `iwarp-sockets` (message
//! words, connection private data) and one connection's state machine fed
//! by a hostile peer. Nothing may panic. A message word or conn data that
//! parses emits back to the same meaning; a flow given words and target
//! SGL bytes the peer chose either goes on or ends in an error, and never
//! hands out more receive bytes than its buffer holds.
#![no_main]

use iwarp_sockets::flow::{Action, Config, Flow, TARGET_SGL_LEN};
use iwarp_sockets::wire::{ByteOrder, ConnData, ConnDataRepr, Message, CONN_DATA_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let order = if sel & 1 == 0 {
        ByteOrder::Little
    } else {
        ByteOrder::Big
    };
    // A message word as a Send payload: round trip.
    if let Ok(m) = Message::from_send_payload(&rest[..rest.len().min(4)], order) {
        let w = m.emit().expect("a parsed message emits");
        let back = Message::from_send_payload(&w.to_send_payload(order), order)
            .expect("an emitted word parses");
        assert_eq!(back, m);
    }
    // Conn data: round trip.
    if let Ok(c) = ConnDataRepr::parse_bytes(rest) {
        let mut buf = [0u8; CONN_DATA_LEN];
        c.emit(&mut ConnData::new_checked(&mut buf[..]).expect("40 bytes"))
            .expect("emit into 40 bytes");
        assert_eq!(ConnDataRepr::parse_bytes(&buf).expect("reparses"), c);
    }
    // A flow against a peer whose conn data, target SGL writes and message
    // words all come from the input.
    if rest.len() < CONN_DATA_LEN + TARGET_SGL_LEN {
        return;
    }
    let (pd, rest) = rest.split_at(CONN_DATA_LEN);
    let (sgl, words) = rest.split_at(TARGET_SGL_LEN);
    let Ok(peer) = ConnDataRepr::parse_bytes(pd) else {
        return;
    };
    let cfg = Config {
        sq_size: 16,
        rq_size: 16,
        sbuf_size: 4096,
        rbuf_size: 4096,
        ..Config::default()
    };
    let Ok(mut flow) = Flow::new(cfg) else {
        return;
    };
    let mut target = [0u8; TARGET_SGL_LEN];
    if flow.establish(&peer, &mut target).is_err() {
        return;
    }
    target.copy_from_slice(sgl);
    for (i, w) in words.chunks(4).enumerate() {
        let _ = flow.on_recv(w);
        if let Ok(g) = flow.recv(u32::MAX) {
            assert!(g.spans.len() <= cfg.rbuf_size, "granted more than the ring");
        }
        // The application's sends, chosen by the input: plain, buffered
        // (held or pushed), zero copy, and a push of what is held.
        let pick = w.get(1).copied().unwrap_or(0);
        let want = u32::from(w.get(2).copied().unwrap_or(64)) * 37;
        match (i % 3, pick % 5) {
            (0, 0) => {
                let _ = flow.send(want, &mut target);
            }
            (0, 1) => {
                let _ = flow.send_buffered(want, &mut target, false);
            }
            (0, 2) => {
                let _ = flow.send_buffered(want, &mut target, true);
            }
            (0, 3) => {
                let _ = flow.send_zcopy(want, &mut target);
            }
            (0, _) => {
                flow.push(&mut target);
            }
            _ => {}
        }
        assert!(flow.buffered() <= cfg.sbuf_size, "buffered more than the send ring");
        // Complete what the flow posts, as a driver would (the peer's
        // input decides whether the completions succeed).
        let ok = w.first().is_none_or(|b| b & 0x80 == 0);
        while let Some(a) = flow.poll_action() {
            match a {
                Action::Send { tag, .. } | Action::RdmaWrite { tag, .. } => {
                    let _ = flow.on_send_complete(tag, ok);
                }
                Action::PostRecv { .. } => {}
            }
        }
        if flow.error().is_some() {
            break;
        }
    }
});
