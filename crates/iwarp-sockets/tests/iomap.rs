//! `riomap` / `riowrite` / `riounmap` over loopback: bytes placed straight
//! into the peer's mapped buffer in both directions, checked; the error
//! paths (no mapping, outside a mapping, a full or absent table, unmap of
//! something never mapped, a write after the peer unmapped); and a raw
//! verbs peer that RDMA-Writes past the end of our mapping (a Terminate,
//! `ConnectionReset`, nothing outside the mapping touched). Every wait is
//! bounded.

use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use iwarp::cm::{self, ConnParam};
use iwarp::{
    Access, CompletionQueue, Context, MemoryRegion, QpInitAttr, QueuePair, RecvWr, SendWr, SgList,
    WrOpcode,
};
use iwarp_sockets::wire::{ByteOrder, ConnDataRepr, Iomap, Sge, IOMAP_LEN};
use iwarp_sockets::{Listener, Options, Stream};

const T: Duration = Duration::from_secs(20);

fn opts(iomap: u16) -> Options {
    Options {
        iomap_size: iomap,
        ..Options::default()
    }
}

fn pair_with(client: &Options, server: &Options) -> (Stream, Stream) {
    let l = Listener::bind_with("127.0.0.1:0".parse().unwrap(), server).unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        tx.send(s).unwrap();
    });
    let c = Stream::connect_with(addr, client).unwrap();
    let s = rx.recv_timeout(T).expect("accepted in time");
    h.join().unwrap();
    for x in [&c, &s] {
        x.set_read_timeout(Some(T)).unwrap();
        x.set_write_timeout(Some(T)).unwrap();
    }
    (c, s)
}

fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Waits until `s` knows `n` mappings of its peer.
fn wait_peer_maps(s: &Stream, n: usize) -> Vec<(u64, u32)> {
    let t = Instant::now();
    loop {
        let m = s.peer_iomaps();
        if m.len() >= n {
            return m;
        }
        assert!(t.elapsed() < T, "the peer's mapping did not arrive: {m:?}");
        thread::sleep(Duration::from_millis(1));
    }
}

/// `writer` riowrites `data` at `offset` into `reader`'s mapping in odd
/// pieces, then tells it with one stream byte; the reader waits for the
/// byte (the Send is placed after the Writes before it).
fn riowrite_then_tell(writer: &Stream, reader: &Stream, data: &[u8], offset: u64) {
    let mut done = 0;
    for piece in [1usize, 4095, 65536, 300_000, usize::MAX] {
        if done == data.len() {
            break;
        }
        let n = piece.min(data.len() - done);
        assert_eq!(
            writer
                .riowrite(&data[done..done + n], offset + done as u64)
                .unwrap(),
            n
        );
        done += n;
    }
    (&*writer).write_all(b"!").unwrap();
    let mut b = [0u8; 1];
    (&*reader).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"!");
}

#[test]
fn riowrite_places_bytes_in_the_peers_mapping_both_ways() {
    let (c, s) = pair_with(&opts(4), &opts(4));
    let len = 1 << 20;
    // The server maps at an offset it chooses, the client at its address.
    let sm = s.riomap(len, Some(0x10_0000)).unwrap();
    assert_eq!(sm.offset(), 0x10_0000);
    assert_eq!(sm.len(), len);
    let cm = c.riomap(len, None).unwrap();
    assert_ne!(cm.offset(), 0, "offset -1 maps at the buffer's address");

    assert_eq!(wait_peer_maps(&c, 1), vec![(0x10_0000, len as u32)]);
    let d = pattern(len, 1);
    riowrite_then_tell(&c, &s, &d, 0x10_0000);
    assert_eq!(sm.to_vec(), d);

    assert_eq!(wait_peer_maps(&s, 1), vec![(cm.offset(), len as u32)]);
    let d2 = pattern(len - 100, 2);
    riowrite_then_tell(&s, &c, &d2, cm.offset() + 100);
    let got = cm.to_vec();
    assert!(
        got[..100].iter().all(|&b| b == 0),
        "nothing before the offset"
    );
    assert_eq!(got[100..], d2[..]);

    assert_eq!(c.stats().iowrite_bytes, len as u64);
    assert_eq!(s.stats().iowrite_bytes, len as u64 - 100);
    assert_eq!(c.stats().bytes_sent, 1, "riowrite is not stream data");

    // The stream still carries data afterwards, in order.
    let d3 = pattern(300_000, 3);
    let w = {
        let c = c.clone();
        let d3 = d3.clone();
        thread::spawn(move || (&c).write_all(&d3).unwrap())
    };
    let mut got = vec![0u8; d3.len()];
    (&s).read_exact(&mut got).unwrap();
    w.join().unwrap();
    assert_eq!(got, d3);
    sm.unmap().unwrap();
    drop(cm);
}

#[test]
fn riowrite_outside_the_peers_mappings_is_einval_and_writes_nothing() {
    let (c, s) = pair_with(&opts(2), &opts(2));
    // Nothing mapped yet.
    let e = c.riowrite(&[1; 16], 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("riomap"), "{e}");

    let m = s.riomap(4096, Some(8192)).unwrap();
    wait_peer_maps(&c, 1);
    for (off, len) in [
        (8191u64, 2usize),
        (8192 + 4090, 7),
        (8192 + 4096, 1),
        (0, 1),
    ] {
        let e = c.riowrite(&vec![0xEE; len], off).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{off} {len}");
    }
    c.riowrite(&[0x55; 4096], 8192).unwrap();
    (&c).write_all(b"!").unwrap();
    let mut b = [0u8; 1];
    (&s).read_exact(&mut b).unwrap();
    assert!(
        m.to_vec().iter().all(|&x| x == 0x55),
        "only the good write landed"
    );
    // The connection is still fine.
    (&s).write_all(b"ok").unwrap();
    let mut b2 = [0u8; 2];
    (&c).read_exact(&mut b2).unwrap();
    assert_eq!(&b2, b"ok");
}

#[test]
fn a_full_or_absent_table_is_enomem_and_unmap_frees_an_entry() {
    // The client advertises one entry, the server none.
    let (c, s) = pair_with(&opts(1), &opts(0));
    let e = c.riomap(64, Some(0)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfMemory);
    assert!(e.to_string().contains("RDMA_IOMAPSIZE"), "{e}");

    let m = s.riomap(64, Some(0)).unwrap();
    let e = s.riomap(64, Some(64)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfMemory);
    assert!(e.to_string().contains("in use"), "{e}");
    drop(m);
    let m2 = s.riomap(64, Some(128)).unwrap();
    let t = Instant::now();
    while c.peer_iomaps() != vec![(128, 64)] {
        assert!(t.elapsed() < T, "remap not seen: {:?}", c.peer_iomaps());
        thread::sleep(Duration::from_millis(1));
    }
    drop(m2);

    // Zero bytes, and unmapping what was never mapped.
    assert_eq!(
        s.riomap(0, None).unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
    let mut v = vec![0u8; 16];
    assert_eq!(
        s.riounmap_raw(v.as_mut_ptr(), v.len()).unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
}

#[test]
fn a_write_after_the_peer_unmapped_resets_and_misses_the_memory() {
    let (c, s) = pair_with(&opts(1), &opts(1));
    let mut buf = vec![0u8; 8192];
    // SAFETY: `buf` outlives the mapping (riounmap_raw below) and is not
    // touched through a reference until then.
    let off = unsafe { s.riomap_raw(buf.as_mut_ptr(), buf.len(), Some(0)) }.unwrap();
    assert_eq!(off, 0);
    wait_peer_maps(&c, 1);
    c.riowrite(&[0x11; 8192], 0).unwrap();
    (&c).write_all(b"!").unwrap();
    let mut b = [0u8; 1];
    (&s).read_exact(&mut b).unwrap();
    s.riounmap_raw(buf.as_mut_ptr(), buf.len()).unwrap();
    assert!(buf.iter().all(|&x| x == 0x11));
    assert_eq!(
        s.riounmap_raw(buf.as_mut_ptr(), buf.len())
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidInput,
        "twice"
    );

    // The client is not told (rsocket.c does not either): its next write
    // hits a deregistered STag; the server's verbs layer refuses it with a
    // Terminate and both streams end with ConnectionReset.
    let r = c.riowrite(&[0x22; 4096], 0);
    let t = Instant::now();
    let mut tmp = [0u8; 16];
    let e = loop {
        match (&s).read(&mut tmp) {
            Err(e) => break e,
            Ok(0) => panic!("end of stream instead of a reset"),
            Ok(_) => {}
        }
        assert!(t.elapsed() < T);
    };
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    let e = match r {
        Err(e) => e,
        Ok(_) => loop {
            match (&c).read(&mut tmp) {
                Err(e) => break e,
                Ok(0) => panic!("end of stream instead of a reset"),
                Ok(_) => {}
            }
            assert!(t.elapsed() < T);
        },
    };
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    assert!(buf.iter().all(|&x| x == 0x11), "nothing landed after unmap");
}

/// A raw verbs client that advertises an iomap table of one entry.
struct Raw {
    _ctx: Context,
    _cq: CompletionQueue,
    qp: QueuePair,
    tsgl: MemoryRegion,
    _rbuf: MemoryRegion,
    scratch: MemoryRegion,
}

impl Raw {
    fn connect(addr: SocketAddr) -> Raw {
        let ctx = Context::open().unwrap();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(256).unwrap();
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                max_send_wr: 64,
                max_recv_wr: 128,
            })
            .unwrap();
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let tsgl = pd.reg_mr(32 + IOMAP_LEN, rw).unwrap();
        tsgl.fill(0);
        let rbuf = pd.reg_mr(8192 + 4 * 128, rw).unwrap();
        let scratch = pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
        for slot in 0..128u64 {
            qp.post_recv(&RecvWr {
                wr_id: slot,
                sgl: SgList::single(rbuf.sge(8192 + 4 * slot as usize, 4)),
            })
            .unwrap();
        }
        let pdata = ConnDataRepr {
            order: ByteOrder::NATIVE,
            iomap: true,
            other_flags: 0,
            credits: 64,
            target_iomap_size: 1,
            target_sgl: Sge {
                addr: tsgl.addr(),
                key: tsgl.rkey(),
                length: 2,
            },
            data_buf: Sge {
                addr: rbuf.addr(),
                key: rbuf.rkey(),
                length: 4096,
            },
        }
        .to_bytes()
        .to_vec();
        cm::connect(
            &qp,
            addr,
            &ConnParam {
                private_data: pdata,
                ..Default::default()
            },
        )
        .unwrap();
        Raw {
            _ctx: ctx,
            _cq: cq,
            qp,
            tsgl,
            _rbuf: rbuf,
            scratch,
        }
    }

    /// The entry the stream wrote into our table, once it is there.
    fn entry(&self) -> Iomap {
        let t = Instant::now();
        loop {
            let mut b = [0u8; IOMAP_LEN];
            self.tsgl.read_at(32, &mut b);
            let e = Iomap::parse(&b, ByteOrder::NATIVE).unwrap();
            if e.sge.length != 0 {
                return e;
            }
            assert!(t.elapsed() < T, "no iomap entry arrived");
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// An RDMA Write of `bytes` (none: the zero-length keepalive frame,
    /// which also lets a responder start sending, RFC 6581 §5).
    fn write(&self, remote_addr: u64, rkey: u32, bytes: &[u8]) {
        self.scratch.write_at(0, bytes);
        let sgl = if bytes.is_empty() {
            SgList::new()
        } else {
            SgList::single(self.scratch.sge(0, bytes.len()))
        };
        self.qp
            .post_send(&SendWr {
                wr_id: 1,
                opcode: WrOpcode::RdmaWrite { remote_addr, rkey },
                sgl,
                signaled: false,
                solicited: false,
            })
            .unwrap();
    }
}

#[test]
fn a_peer_writing_past_our_mapping_gets_a_terminate_and_nothing_lands() {
    let l = Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(l.accept().map(|(s, _)| s));
    });
    let raw = Raw::connect(addr);
    let s = rx.recv_timeout(T).expect("accepted").unwrap();
    s.set_read_timeout(Some(T)).unwrap();

    // Map bytes 4096..8192 of a 12 KiB buffer: guards on both sides.
    let mut buf = vec![0xAAu8; 12288];
    let inner = buf[4096..].as_mut_ptr();
    // SAFETY: `buf` outlives the stream's use of it: it is unmapped below
    // before it is read through a reference.
    let off = unsafe { s.riomap_raw(inner, 4096, Some(0)) }.unwrap();
    assert_eq!(off, 0);
    raw.write(0, 0, &[]);
    let e = raw.entry();
    assert_eq!(e.offset, 0);
    assert_eq!(e.sge.length, 4096);

    // 16 bytes from 8 before the end: 8 of them outside.
    raw.write(e.sge.addr + 4088, e.sge.key, &[0x5A; 16]);
    let t = Instant::now();
    let mut tmp = [0u8; 16];
    let err = loop {
        match (&s).read(&mut tmp) {
            Err(e) => break e,
            Ok(0) => panic!("end of stream instead of a reset"),
            Ok(_) => {}
        }
        assert!(t.elapsed() < T);
    };
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    s.riounmap_raw(inner, 4096).unwrap();
    assert!(
        buf.iter().all(|&x| x == 0xAA),
        "the out-of-bounds Write placed nothing, inside or outside the mapping"
    );
}
