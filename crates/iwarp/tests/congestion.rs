//! Congestion control per connection (`TCP_CONGESTION`, tcp(7)) through
//! the CM: set before connect on the active side, inherited from the
//! listener or set per accepted connection on the passive side, read back
//! for logs, and an algorithm the kernel lacks refused with an error that
//! says where to look and how to load it.

mod common;

use std::net::SocketAddr;

use common::*;
use iwarp::cm::{self, CmError, CongestionControl, ConnParam, Listener};
use iwarp_proto::handshake::MpaConfig;

fn cc(name: &str) -> CongestionControl {
    name.parse().unwrap()
}

/// The kernel's default algorithm for new sockets (what a connection
/// without a choice uses).
fn kernel_default() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .unwrap()
        .trim()
        .to_owned()
}

/// An algorithm this kernel offers that is not `not`: reno is built into
/// every kernel, cubic into nearly every one.
fn other_than(not: &str) -> CongestionControl {
    let offered = cm::available_congestion_control();
    ["reno", "cubic", "bbr"]
        .into_iter()
        .find(|a| *a != not && offered.iter().any(|o| o == a))
        .map(cc)
        .expect("a second congestion-control algorithm")
}

/// What the client's connect returned, what the request reported
/// before the accept, and what the accept returned.
type Outcome = (
    Result<Vec<u8>, CmError>,
    Result<String, CmError>,
    Result<(), CmError>,
);

/// Accept one request on `listener` onto `server` with `server_param`
/// while `client` connects with `client_param`.
fn connect_through(
    listener: &Listener,
    client: &Host,
    server: &Host,
    client_param: &ConnParam,
    server_param: &ConnParam,
) -> Outcome {
    let addr: SocketAddr = listener.local_addr();
    std::thread::scope(|s| {
        let srv = s.spawn(|| {
            let req = listener.get_request(Some(T)).unwrap();
            let before = req.tcp_congestion();
            (before, req.accept(&server.qp, server_param))
        });
        let c = cm::connect(&client.qp, addr, client_param);
        let (before, accepted) = srv.join().unwrap();
        (c, before, accepted)
    })
}

fn param(congestion: Option<CongestionControl>) -> ConnParam {
    ConnParam {
        timeout: T,
        congestion,
        ..Default::default()
    }
}

#[test]
fn the_active_side_sets_its_algorithm_before_connect() {
    let (client, server) = (Host::new(), Host::new());
    let want = other_than(&kernel_default());
    let listener = Listener::bind(loopback(), MpaConfig::default()).unwrap();
    let (c, before, a) = connect_through(
        &listener,
        &client,
        &server,
        &param(Some(want.clone())),
        &param(None),
    );
    c.unwrap();
    a.unwrap();
    assert_eq!(cm::tcp_congestion(&client.qp).unwrap(), want.as_str());
    // The passive side was given nothing: the kernel's default.
    assert_eq!(before.unwrap(), kernel_default());
    assert_eq!(cm::tcp_congestion(&server.qp).unwrap(), kernel_default());
}

#[test]
fn accepted_connections_inherit_the_listener_algorithm_and_accept_overrides_it() {
    let want = other_than(&kernel_default());
    let listener = Listener::bind(loopback(), MpaConfig::default()).unwrap();
    listener.set_congestion(&want).unwrap();
    assert_eq!(listener.tcp_congestion().unwrap(), want.as_str());

    // Inherited: the accepted socket has it before accept does anything.
    let (client, server) = (Host::new(), Host::new());
    let (c, before, a) = connect_through(&listener, &client, &server, &param(None), &param(None));
    c.unwrap();
    a.unwrap();
    assert_eq!(before.unwrap(), want.as_str());
    assert_eq!(cm::tcp_congestion(&server.qp).unwrap(), want.as_str());
    assert_eq!(cm::tcp_congestion(&client.qp).unwrap(), kernel_default());

    // Per connection: accept's ConnParam wins over the listener's.
    let third = other_than(want.as_str());
    let (client, server) = (Host::new(), Host::new());
    let (c, before, a) = connect_through(
        &listener,
        &client,
        &server,
        &param(None),
        &param(Some(third.clone())),
    );
    c.unwrap();
    a.unwrap();
    assert_eq!(before.unwrap(), want.as_str());
    assert_eq!(cm::tcp_congestion(&server.qp).unwrap(), third.as_str());
}

#[test]
fn an_algorithm_the_kernel_lacks_fails_connect_with_the_fix() {
    let (client, server) = (Host::new(), Host::new());
    let listener = Listener::bind(loopback(), MpaConfig::default()).unwrap();
    let err = cm::connect(
        &client.qp,
        listener.local_addr(),
        &param(Some(cc("nosuch"))),
    )
    .unwrap_err();
    match &err {
        CmError::Congestion { name, source } => {
            assert_eq!(name, "nosuch");
            assert_eq!(source.raw_os_error(), Some(libc::ENOENT));
        }
        other => panic!("expected CmError::Congestion, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("/proc/sys/net/ipv4/tcp_available_congestion_control")
            && msg.contains("modprobe tcp_nosuch"),
        "{msg}"
    );
    // Nothing reached the listener (the option is set before connect),
    // and the queue pair is still free to connect.
    let (c, _, a) = connect_through(&listener, &client, &server, &param(None), &param(None));
    c.unwrap();
    a.unwrap();
}

#[test]
fn an_algorithm_the_kernel_lacks_rejects_on_accept() {
    let (client, server) = (Host::new(), Host::new());
    let listener = Listener::bind(loopback(), MpaConfig::default()).unwrap();
    let (c, _, a) = connect_through(
        &listener,
        &client,
        &server,
        &param(None),
        &param(Some(cc("nosuch"))),
    );
    assert!(
        matches!(&a, Err(CmError::Congestion { name, .. }) if name == "nosuch"),
        "{a:?}"
    );
    // The initiator hears an MPA Reject, not a silent close.
    assert!(matches!(c, Err(CmError::Rejected { .. })), "{c:?}");
    // And the listener refuses it too, with the same error.
    let e = listener.set_congestion(&cc("nosuch")).unwrap_err();
    assert!(matches!(e, CmError::Congestion { .. }), "{e:?}");
}

#[test]
fn names_are_checked_before_they_reach_the_kernel() {
    // TCP_CA_NAME_MAX is 16 with the NUL: 15 bytes fit, 16 would be cut
    // by setsockopt(2) to a different name.
    assert!(CongestionControl::new("abcdefghijklmno").is_ok());
    let long = CongestionControl::new("abcdefghijklmnop").unwrap_err();
    assert!(long.to_string().contains("15 bytes"), "{long}");
    assert!(CongestionControl::new("").is_err());
    assert!(CongestionControl::new("re no").is_err());
    assert!(CongestionControl::new("reno\0").is_err());
    assert_eq!(cc("bbr").to_string(), "bbr");
}

#[test]
fn a_live_connection_changes_its_algorithm() {
    let (client, server) = (Host::new(), Host::new());
    let listener = Listener::bind(loopback(), MpaConfig::default()).unwrap();
    let (c, _, a) = connect_through(&listener, &client, &server, &param(None), &param(None));
    c.unwrap();
    a.unwrap();
    let want = other_than(&kernel_default());
    cm::set_tcp_congestion(&client.qp, &want).unwrap();
    assert_eq!(cm::tcp_congestion(&client.qp).unwrap(), want.as_str());
    let e = cm::set_tcp_congestion(&client.qp, &cc("nosuch")).unwrap_err();
    assert!(matches!(e, CmError::Congestion { .. }), "{e:?}");
    assert_eq!(cm::tcp_congestion(&client.qp).unwrap(), want.as_str());
    let fresh = Host::new();
    assert!(matches!(
        cm::set_tcp_congestion(&fresh.qp, &want),
        Err(CmError::NotConnected)
    ));
}

#[test]
fn the_path_rtt_is_read_from_the_connection() {
    let (client, server) = (Host::new(), Host::new());
    let listener = Listener::bind(loopback(), MpaConfig::default()).unwrap();
    let (c, _, a) = connect_through(&listener, &client, &server, &param(None), &param(None));
    c.unwrap();
    a.unwrap();
    // The handshake gave the kernel a sample: loopback, well under 1 s.
    let rtt = cm::path_rtt(&client.qp).unwrap().expect("an RTT sample");
    assert!(rtt < std::time::Duration::from_secs(1), "{rtt:?}");
    assert!(matches!(
        cm::path_rtt(&Host::new().qp),
        Err(CmError::NotConnected)
    ));
}

#[test]
fn the_getter_needs_a_connection() {
    let h = Host::new();
    assert!(matches!(
        cm::tcp_congestion(&h.qp),
        Err(CmError::NotConnected)
    ));
}
