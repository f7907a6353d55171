//! The `sockets` mode on 127.0.0.1: ccappd's version thread on an
//! iwarp-sockets listener, and `SocketsCheck` against it: published
//! versions are seen, a document outside the table is `NoSuchDocument`,
//! an unreachable module is an error, a malformed request is answered
//! with `ERROR(malformed)` and the stream closed, and a checker whose
//! module restarted reconnects.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ccache::check::{CheckError, VersionCheck};
use ccache::msgio::{read_msg, MsgError};
use ccache::sockets::{self, SocketsCheck};
use ccache::table::VersionTable;
use ccache_proto::ipc::{ErrorCode, Kind};
use iwarp::Context;

const T: Duration = Duration::from_secs(5);

fn start(docs: u32) -> (Arc<VersionTable>, SocketAddr) {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let table = Arc::new(VersionTable::new(&pd, docs, 1).unwrap());
    let addr =
        sockets::spawn_listener("127.0.0.1:0".parse().unwrap(), table.clone(), T, 64).unwrap();
    (table, addr)
}

#[test]
fn sockets_check_sees_published_versions() {
    let (table, addr) = start(4);
    let mut c = SocketsCheck::new(addr, T);
    assert_eq!(c.version(2), Ok(1));
    table.publish(2, 0x1_0000_0001);
    assert_eq!(c.version(2), Ok(0x1_0000_0001));
    for v in 2..200u64 {
        table.publish(3, v);
        assert_eq!(c.version(3), Ok(v));
    }
    assert_eq!(c.version(4), Err(CheckError::NoSuchDocument { doc: 4 }));
    // The stream is kept after a refusal.
    assert_eq!(c.version(0), Ok(1));
}

#[test]
fn unreachable_module_is_an_error() {
    // A port nobody listens on.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let mut c = SocketsCheck::new(addr, Duration::from_secs(2));
    assert!(matches!(c.version(0), Err(CheckError::Unreachable(_))));
}

#[test]
fn malformed_request_is_refused_and_closed() {
    let (_table, addr) = start(2);
    let mut s = iwarp_sockets::Stream::connect_with(addr, &sockets::options()).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    std::io::Write::write_all(&mut s, b"GET / HTTP/1.1\r\n").unwrap();
    let m = read_msg(&mut s).unwrap();
    assert_eq!(m.kind, Kind::Error);
    assert_eq!(ErrorCode::from(m.value), ErrorCode::Malformed);
    assert!(matches!(
        read_msg(&mut s),
        Err(MsgError::Closed | MsgError::Io(_))
    ));
}

#[test]
fn a_request_that_is_not_a_version_request_gets_an_error() {
    let (_table, addr) = start(2);
    let mut s = iwarp_sockets::Stream::connect_with(addr, &sockets::options()).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    ccache::msgio::write_msg(&mut s, &ccache_proto::ipc::Repr::new(Kind::ReadRequest, 1)).unwrap();
    let m = read_msg(&mut s).unwrap();
    assert_eq!(
        (m.kind, ErrorCode::from(m.value)),
        (Kind::Error, ErrorCode::NotARequest)
    );
}
