//! Hostile clients of ccappd's IPC and version servers (issue 26, item 4):
//! a client that never reads its replies delays nobody else; a client
//! that holds a read while staying busy loses it after the hold limit; a
//! peer whose uid/gid is not allowed is refused; the connection limits
//! hold, and connections cost no thread each.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccache::access::Allow;
use ccache::appd::{self, IpcCfg, IpcState};
use ccache::msgio::{read_msg, write_msg};
use ccache::table::VersionTable;
use ccache_proto::ipc::{ErrorCode, Kind, Repr};
use iwarp::Context;

const T: Duration = Duration::from_secs(10);

struct Server {
    ipc: std::path::PathBuf,
    state: Arc<IpcState>,
    dir: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start(cfg: IpcCfg) -> Server {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let table = Arc::new(VersionTable::new(&pd, 8, 1).unwrap());
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ccache-hostile-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ipc = dir.join("ipc.sock");
    let il = UnixListener::bind(&ipc).unwrap();
    let state = Arc::new(IpcState::new(table, 1));
    let st = state.clone();
    std::thread::spawn(move || {
        let _pd = pd;
        appd::serve_ipc_with(il, st, cfg)
    });
    Server { ipc, state, dir }
}

fn connect(s: &Server) -> UnixStream {
    let c = UnixStream::connect(&s.ipc).unwrap();
    c.set_read_timeout(Some(T)).unwrap();
    c.set_write_timeout(Some(T)).unwrap();
    c
}

fn ask(c: &mut UnixStream, kind: Kind, doc: u32) -> Repr {
    write_msg(c, &Repr::new(kind, doc)).unwrap();
    read_msg(c).unwrap()
}

/// Whether the server closed `c` within `T` (reading what it still sent).
fn closed_by_server(c: &mut UnixStream) -> bool {
    let start = Instant::now();
    let mut b = [0u8; 4096];
    while start.elapsed() < T {
        match c.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false, // timed out
        }
    }
    false
}

/// A client sends requests as fast as it can and never reads a reply.
/// Before the fix, ccappd wrote replies under the Table 1 lock with a 2 s
/// timeout, so once that client's socket buffer was full every other
/// client (every Apache reader) waited about 2 s. Now it only fills its
/// own queue, is dropped, and the others' round trips stay short.
#[test]
fn a_client_that_never_reads_delays_nobody_else() {
    let s = start(IpcCfg::new(T));
    let mut h = connect(&s);
    let hw = h.try_clone().unwrap();
    hw.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
    let flood = std::thread::spawn(move || {
        let mut hw = hw;
        let m = Repr::new(Kind::VersionRequest, 0).to_bytes();
        let mut sent = 0u64;
        while sent < 200_000 && hw.write_all(&m).is_ok() {
            sent += 1;
        }
        sent
    });
    let mut g = connect(&s);
    let start = Instant::now();
    let mut worst = Duration::ZERO;
    let mut rounds = 0;
    while start.elapsed() < Duration::from_secs(4) {
        let t = Instant::now();
        let p = ask(&mut g, Kind::ReadRequest, 1);
        assert_eq!(p.kind, Kind::ReadProceed, "{p}");
        write_msg(&mut g, &Repr::new(Kind::ReadDone, 1)).unwrap();
        worst = worst.max(t.elapsed());
        rounds += 1;
    }
    let sent = flood.join().unwrap();
    eprintln!("{rounds} read round trips, worst {worst:?}; the flooder sent {sent} requests");
    assert!(
        worst < Duration::from_secs(1),
        "a reader waited {worst:?} behind a client that does not read"
    );
    assert!(closed_by_server(&mut h), "the flooder was not dropped");
    assert!(s.state.dropped.load(std::sync::atomic::Ordering::Relaxed) >= 1);
}

/// A client takes a read and stays busy (never idle) without READ_DONE:
/// after the hold limit it is dropped and the waiting update proceeds.
#[test]
fn a_busy_holder_loses_its_read_after_the_hold_limit() {
    let s = start(IpcCfg {
        hold: Duration::from_secs(1),
        ..IpcCfg::new(T)
    });
    let mut h = connect(&s);
    assert_eq!(ask(&mut h, Kind::ReadRequest, 2).kind, Kind::ReadProceed);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let st = stop.clone();
    let mut hb = h.try_clone().unwrap();
    let busy = std::thread::spawn(move || {
        // Keep the connection busy: a version request every 100 ms.
        while !st.load(std::sync::atomic::Ordering::Relaxed) {
            if write_msg(&mut hb, &Repr::new(Kind::VersionRequest, 2)).is_err() {
                return;
            }
            if read_msg(&mut hb).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let mut u = connect(&s);
    let t = Instant::now();
    let m = ask(&mut u, Kind::UpdateRequest, 2);
    assert_eq!(m.kind, Kind::UpdateProceed, "{m}");
    let waited = t.elapsed();
    assert!(
        waited < Duration::from_secs(5),
        "the update waited {waited:?}"
    );
    write_msg(&mut u, &Repr::new(Kind::UpdateDone, 2)).unwrap();
    assert_eq!(read_msg(&mut u).unwrap().kind, Kind::UpdateCommitted);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    busy.join().unwrap();
    assert!(closed_by_server(&mut h), "the holder was not dropped");
}

/// SO_PEERCRED: with an allow-list that excludes this process's uid and
/// gid, the connection gets ERROR(not permitted) and is closed; nothing it
/// sends is served.
#[test]
fn a_peer_outside_the_allow_list_is_refused() {
    let s = start(IpcCfg {
        allow: Allow {
            uids: vec![],
            gids: vec![],
        },
        ..IpcCfg::new(T)
    });
    let mut c = connect(&s);
    let _ = write_msg(&mut c, &Repr::new(Kind::ReadRequest, 1));
    let m = read_msg(&mut c).unwrap();
    assert_eq!(m.kind, Kind::Error, "{m}");
    assert_eq!(ErrorCode::from(m.value), ErrorCode::NotPermitted);
    assert!(closed_by_server(&mut c));
    // The owner's allow-list admits this process.
    let s = start(IpcCfg::new(T));
    let mut c = connect(&s);
    assert_eq!(ask(&mut c, Kind::ReadRequest, 1).kind, Kind::ReadProceed);
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// At most `max_conns` connections; one more is answered ERROR(busy) and
/// closed; a freed slot serves again. Open connections cost no thread.
#[test]
fn the_connection_limit_holds_and_connections_cost_no_thread() {
    let s = start(IpcCfg {
        max_conns: 200,
        ..IpcCfg::new(T)
    });
    let before = threads();
    let mut open: Vec<UnixStream> = (0..200).map(|_| connect(&s)).collect();
    for c in open.iter_mut() {
        assert_eq!(ask(c, Kind::VersionRequest, 0).kind, Kind::VersionReply);
    }
    let grew = threads().saturating_sub(before);
    assert!(grew < 50, "200 connections added {grew} threads");
    let mut extra = connect(&s);
    let m = read_msg(&mut extra).unwrap();
    assert_eq!(m.kind, Kind::Error, "{m}");
    assert_eq!(ErrorCode::from(m.value), ErrorCode::Busy);
    assert!(closed_by_server(&mut extra));
    drop(open.pop());
    // The server frees the slot when it sees the close: wait for that
    // (bounded), then a new connection is served.
    let start = Instant::now();
    loop {
        let mut c = connect(&s);
        write_msg(&mut c, &Repr::new(Kind::VersionRequest, 0)).unwrap();
        match read_msg(&mut c) {
            Ok(m) if m.kind == Kind::VersionReply => break,
            Ok(m) if m.kind == Kind::Error => {}
            r => panic!("unexpected {r:?}"),
        }
        assert!(start.elapsed() < T, "the freed slot never served again");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The TCP version server: at most `max_conns` connections, one more is
/// answered ERROR(busy) and closed.
#[test]
fn the_version_server_limits_connections() {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let table = Arc::new(VersionTable::new(&pd, 4, 1).unwrap());
    let vl = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = vl.local_addr().unwrap();
    std::thread::spawn(move || appd::serve_versions_with(vl, table, T, 3));
    let before = threads();
    let mut open: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut c = TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(T)).unwrap();
            write_msg(&mut c, &Repr::new(Kind::VersionRequest, 1)).unwrap();
            assert_eq!(read_msg(&mut c).unwrap().kind, Kind::VersionReply);
            c
        })
        .collect();
    assert!(threads() <= before + 2);
    let mut extra = TcpStream::connect(addr).unwrap();
    extra.set_read_timeout(Some(T)).unwrap();
    let m = read_msg(&mut extra).unwrap();
    assert_eq!(ErrorCode::from(m.value), ErrorCode::Busy, "{m}");
    open.clear();
}
