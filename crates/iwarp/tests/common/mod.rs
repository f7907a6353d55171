//! Shared helpers of the loopback tests: one "host" per side (its own
//! device, PD, CQs and QP), connected over 127.0.0.1 through the CM.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use iwarp::cm::{self, CmError, ConnParam, Listener};
use iwarp::{
    Access, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpEvent, QpInitAttr,
    QueuePair, RecvWr, SendWr, SgList, WorkCompletion, WrOpcode,
};
use iwarp_proto::handshake::MpaConfig;

pub const T: Duration = Duration::from_secs(5);

pub struct Host {
    pub ctx: Context,
    pub pd: ProtectionDomain,
    pub scq: CompletionQueue,
    pub rcq: CompletionQueue,
    pub qp: QueuePair,
}

impl Host {
    pub fn new() -> Host {
        Host::with_cq_depths(256, 256)
    }

    /// A host whose send and receive CQs hold `send` and `recv` entries.
    pub fn with_cq_depths(send: usize, recv: usize) -> Host {
        let ctx = Context::open().unwrap();
        let pd = ctx.alloc_pd();
        let scq = ctx.create_cq(send).unwrap();
        let rcq = ctx.create_cq(recv).unwrap();
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: scq.clone(),
                recv_cq: rcq.clone(),
                max_send_wr: 64,
                max_recv_wr: 64,
            })
            .unwrap();
        Host {
            ctx,
            pd,
            scq,
            rcq,
            qp,
        }
    }

    pub fn mr(&self, len: usize) -> MemoryRegion {
        self.pd.reg_mr(len, Access::ALL).unwrap()
    }

    /// Connect this host's QP to `addr` (default MPA settings, timeout
    /// [`T`]); returns the peer's private data.
    pub fn connect(&self, addr: SocketAddr) -> Vec<u8> {
        cm::connect(
            &self.qp,
            addr,
            &ConnParam {
                timeout: T,
                ..Default::default()
            },
        )
        .unwrap()
    }

    pub fn post_recv(&self, wr_id: u64, mr: &MemoryRegion, off: usize, len: usize) {
        self.qp
            .post_recv(&RecvWr {
                wr_id,
                sgl: SgList::single(mr.sge(off, len)),
            })
            .unwrap();
    }

    pub fn send_wc(&self) -> WorkCompletion {
        wait_wc(&self.scq)
    }

    pub fn recv_wc(&self) -> WorkCompletion {
        wait_wc(&self.rcq)
    }

    /// Wait for an event matching `f`, skipping others.
    pub fn event(&self, f: impl Fn(&QpEvent) -> bool) -> QpEvent {
        let deadline = Instant::now() + T;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.qp.next_event(left) {
                Some(ev) if f(&ev) => return ev,
                Some(_) => {}
                None => panic!("timed out waiting for a QP event"),
            }
        }
    }
}

pub fn wait_wc(cq: &CompletionQueue) -> WorkCompletion {
    cq.wait_one(T)
        .unwrap()
        .expect("timed out waiting for a completion")
}

pub fn wr(wr_id: u64, opcode: WrOpcode, sges: &[iwarp::Sge]) -> SendWr {
    SendWr {
        wr_id,
        opcode,
        sgl: SgList::from_slice(sges).unwrap(),
        signaled: true,
        solicited: false,
    }
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_shr(13) as u8 ^ seed)
        .collect()
}

/// Accept one connection on `raw` as a bare MPA responder: read the MPA
/// Request (20 bytes, then the private data whose length is in bytes
/// 18..20), answer with an MPA rev 2 Reply (no CRC, no markers, RFC 6581
/// IRD = ORD = 1) and return the socket, read timeout [`T`]. For tests
/// whose peer must misbehave after connection setup.
pub fn raw_mpa_accept(raw: &std::net::TcpListener) -> std::net::TcpStream {
    use iwarp_proto::wire::mpa::{EnhancedParams, FrameKind, FrameRepr};
    use std::io::{Read, Write};
    let (mut s, _) = raw.accept().unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let mut hdr = [0u8; 20];
    s.read_exact(&mut hdr).unwrap();
    let mut pd = vec![0u8; usize::from(u16::from_be_bytes([hdr[18], hdr[19]]))];
    s.read_exact(&mut pd).unwrap();
    let reply = FrameRepr {
        kind: FrameKind::Reply,
        markers: false,
        crc: false,
        reject: false,
        revision: 2,
        enhanced: Some(EnhancedParams {
            ird: 1,
            ord: 1,
            ..Default::default()
        }),
        private_data: &[],
    }
    .to_vec();
    s.write_all(&reply).unwrap();
    s
}

pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Connect `client` to `server` through a listener with `server_mpa`.
/// `prep_server` runs on the server before it accepts (post receives).
/// Returns (client result, server result).
pub fn connect_with(
    client: &Host,
    server: &Host,
    client_param: &ConnParam,
    server_mpa: MpaConfig,
    server_pd: &[u8],
) -> (Result<Vec<u8>, CmError>, Result<Vec<u8>, CmError>) {
    let listener = Listener::bind(loopback(), server_mpa).unwrap();
    let addr = listener.local_addr();
    std::thread::scope(|s| {
        let srv = s.spawn(|| -> Result<Vec<u8>, CmError> {
            let req = listener.get_request(Some(T))?;
            let pd = req.private_data().to_vec();
            req.accept(
                &server.qp,
                &ConnParam {
                    private_data: server_pd.to_vec(),
                    ..Default::default()
                },
            )?;
            Ok(pd)
        });
        let c = cm::connect(&client.qp, addr, client_param);
        (c, srv.join().unwrap())
    })
}

/// A connected pair with the given MPA configuration on both sides.
/// `prep` runs on (client, server) before connecting.
pub fn pair_with(mpa: MpaConfig, prep: impl FnOnce(&Host, &Host)) -> (Host, Host) {
    let (client, server) = (Host::new(), Host::new());
    prep(&client, &server);
    let param = ConnParam {
        mpa: mpa.clone(),
        timeout: T,
        ..Default::default()
    };
    let (c, s) = connect_with(&client, &server, &param, mpa, b"");
    c.unwrap();
    s.unwrap();
    assert_eq!(client.event(|_| true), QpEvent::Established);
    assert_eq!(server.event(|_| true), QpEvent::Established);
    (client, server)
}

pub fn pair() -> (Host, Host) {
    pair_with(MpaConfig::default(), |_, _| {})
}
