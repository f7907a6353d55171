//! Fuzz target: the rsockets wire formats of `iwarp-sockets` (message
//! words, connection private data) and one connection's state machine fed
//! by a hostile peer. Nothing may panic. A message word or conn data that
//! parses emits back to the same meaning; a flow given words and target
//! SGL bytes the peer chose either goes on or ends in an error, and never
//! hands out more receive bytes than its buffer holds. The iomap calls
//! (riomap, riounmap, the peer's announced entries, riowrite) are driven
//! by the input too: a direct write never leaves the peer's mapping it
//! was aimed at.
#![no_main]

use iwarp_sockets::flow::{Action, Config, Flow, Source, TARGET_SGL_LEN};
use iwarp_sockets::wire::{ByteOrder, ConnData, ConnDataRepr, Message, Sge, CONN_DATA_LEN};
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
    let _ = flow.set_iomap_size(u16::from(sel >> 1) & 7);
    // Our iomap table as the peer wrote it: input bytes.
    let table: Vec<u8> = words
        .iter()
        .copied()
        .cycle()
        .take(24 * usize::from(flow.iomap_size()))
        .collect();
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
            // riomap / riounmap / sending entries / the peer's entries /
            // riowrite.
            (1, 0) => {
                let _ = flow.map_remote(
                    u64::from(want),
                    Sge {
                        addr: u64::from(pick) << 12,
                        key: 7,
                        length: want,
                    },
                );
            }
            (1, 1) => {
                let _ = flow.unmap_remote(u16::from(pick % 4));
            }
            (1, 2) => {
                if let Some(g) = flow.push_iomap() {
                    assert_eq!(g.spans.len(), 24, "an rs_iomap is 24 bytes");
                }
            }
            (1, 3) => flow.iomap_refresh(&table),
            (1, _) => {
                let off = u64::from(want) * u64::from(pick);
                if let Ok(n) = flow.write_direct(off, u64::from(want)) {
                    // The Write it queued lies inside the peer's mapping
                    // that holds `off`.
                    let maps: Vec<_> = flow.peer_iomaps().map(|(_, e)| e).collect();
                    let mut last = None;
                    while let Some(a) = flow.poll_action() {
                        if let Action::RdmaWrite {
                            src: Source::External { len },
                            remote_addr,
                            tag,
                            ..
                        } = a
                        {
                            last = Some((len, remote_addr));
                            let _ = flow.on_send_complete(tag, true);
                        } else if let Action::Send { tag, .. } | Action::RdmaWrite { tag, .. } = a {
                            let _ = flow.on_send_complete(tag, true);
                        }
                    }
                    if n > 0 {
                        let (len, at) = last.expect("a direct write queues an RDMA Write");
                        assert_eq!(len, n);
                        assert!(
                            maps.iter().any(|e| off >= e.offset
                                && at == e.sge.addr.wrapping_add(off - e.offset)
                                && u64::from(n) <= u64::from(e.sge.length) - (off - e.offset)),
                            "a direct write left the peer's mapping"
                        );
                    }
                }
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
