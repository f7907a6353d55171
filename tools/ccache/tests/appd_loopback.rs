//! The module's servers over real sockets on 127.0.0.1: RDMA and TCP
//! version checks see published versions, a slot outside the region is an
//! error (remote access error completion) and the checker recovers, the
//! IPC server runs Table 1 and survives malformed messages.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::Duration;

use ccache::appd::{self, IpcState, UpdaterCfg};
use ccache::check::{CheckError, RdmaCheck, TcpCheck, VersionCheck};
use ccache::listen::{Endpoint, ListenCfg};
use ccache::msgio::{read_msg, write_msg};
use ccache::table::VersionTable;
use ccache_proto::auth::LABEL_VERSION_TABLE;
use ccache_proto::ipc::{ErrorCode, Kind, Repr};
use iwarp::cm::{MpaConfig, Policy};
use iwarp::{Context, WcStatus};

const T: Duration = Duration::from_secs(5);

struct Appd {
    table: Arc<VersionTable>,
    rdma: std::net::SocketAddr,
    tcp: std::net::SocketAddr,
    ipc: std::path::PathBuf,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start(docs: u32) -> Appd {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16).unwrap();
    let table = Arc::new(VersionTable::new(&pd, docs, 1).unwrap());
    let mpa = MpaConfig {
        crc: Policy::Off,
        ..MpaConfig::default()
    };
    let rl = Endpoint::bind(&ctx, "127.0.0.1:0".parse().unwrap(), mpa).unwrap();
    let rdma = rl.local_addr().unwrap();
    let t = table.clone();
    let cfg = ListenCfg::new("version table", LABEL_VERSION_TABLE, Vec::new());
    std::thread::spawn(move || appd::serve_rdma(rl, pd, cq, t, cfg, Default::default()));
    let vl = TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp = vl.local_addr().unwrap();
    let t = table.clone();
    std::thread::spawn(move || appd::serve_versions(vl, t, T));
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ccache-test-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ipc = dir.join("ipc.sock");
    let il = UnixListener::bind(&ipc).unwrap();
    let st = Arc::new(IpcState::new(table.clone(), 1));
    std::thread::spawn(move || appd::serve_ipc(il, st, T));
    Appd {
        table,
        rdma,
        tcp,
        ipc,
        _dir: TempDir(dir),
    }
}

#[test]
fn rdma_and_tcp_checks_see_published_versions() {
    let a = start(4);
    let mut r = RdmaCheck::new(a.rdma, T);
    let mut t = TcpCheck::new(a.tcp, T);
    assert_eq!(r.version(2), Ok(1));
    assert_eq!(t.version(2), Ok(1));
    a.table.publish(2, 0x1_0000_0001);
    assert_eq!(r.version(2), Ok(0x1_0000_0001));
    assert_eq!(t.version(2), Ok(0x1_0000_0001));
    assert_eq!(r.version(3), Ok(1));
    // Outside the table: refused locally (RDMA) or by the version thread.
    assert_eq!(r.version(4), Err(CheckError::NoSuchDocument { doc: 4 }));
    assert_eq!(t.version(4), Err(CheckError::NoSuchDocument { doc: 4 }));
    assert_eq!(r.advert().unwrap().slots, 4);
}

#[test]
fn slot_outside_region_is_a_remote_access_error_then_recovery() {
    let a = start(2);
    let mut r = RdmaCheck::new(a.rdma, T);
    assert_eq!(r.version(1), Ok(1));
    // The Read goes out; the module's stack refuses it (bounds) with a
    // Terminate; the Read completes with a remote access error.
    assert_eq!(
        r.read_slot_unchecked(2),
        Err(CheckError::Completion(WcStatus::RemAccessErr))
    );
    assert_eq!(
        r.read_slot_unchecked(1_000_000),
        Err(CheckError::Completion(WcStatus::RemAccessErr))
    );
    // The next check connects again and reads the right value.
    a.table.publish(1, 7);
    assert_eq!(r.version(1), Ok(7));
}

#[test]
fn checks_fail_cleanly_without_a_module() {
    // Nobody listens on these ports (bound then dropped).
    let free = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut r = RdmaCheck::new(free, Duration::from_millis(500));
    assert!(matches!(r.version(0), Err(CheckError::Unreachable(_))));
    let mut t = TcpCheck::new(free, Duration::from_millis(500));
    assert!(matches!(t.version(0), Err(CheckError::Unreachable(_))));
}

#[test]
fn rdma_reads_while_updating_never_see_a_bad_value() {
    let a = start(1);
    let table = a.table.clone();
    let writer = std::thread::spawn(move || {
        for v in 2..20_000u64 {
            table.publish(0, v);
        }
    });
    let mut r = RdmaCheck::new(a.rdma, T);
    let mut last = 0;
    let mut reads = 0;
    while !writer.is_finished() || reads < 100 {
        let v = r.version(0).expect("read during updates");
        assert!((1..20_000).contains(&v), "impossible version {v}");
        assert!(v >= last, "version went back from {last} to {v}");
        last = v;
        reads += 1;
        if reads > 200_000 {
            break;
        }
    }
    writer.join().unwrap();
    assert_eq!(r.version(0), Ok(19_999));
}

fn ipc(a: &Appd) -> UnixStream {
    let s = UnixStream::connect(&a.ipc).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s
}

#[test]
fn ipc_table1_over_the_socket() {
    let a = start(2);
    let mut reader = ipc(&a);
    let mut updater = ipc(&a);
    write_msg(&mut reader, &Repr::new(Kind::ReadRequest, 1)).unwrap();
    assert_eq!(
        read_msg(&mut reader).unwrap(),
        Repr::with_value(Kind::ReadProceed, 1, 1)
    );
    write_msg(&mut updater, &Repr::new(Kind::UpdateRequest, 1)).unwrap();
    // The update waits for the reader: nothing arrives yet.
    updater
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    assert!(read_msg(&mut updater).is_err());
    updater.set_read_timeout(Some(T)).unwrap();
    write_msg(&mut reader, &Repr::new(Kind::ReadDone, 1)).unwrap();
    assert_eq!(
        read_msg(&mut updater).unwrap(),
        Repr::with_value(Kind::UpdateProceed, 1, 1)
    );
    write_msg(&mut updater, &Repr::new(Kind::UpdateDone, 1)).unwrap();
    assert_eq!(
        read_msg(&mut updater).unwrap(),
        Repr::with_value(Kind::UpdateCommitted, 1, 2)
    );
    assert_eq!(a.table.get(1), Some(Ok(2)));
    // Refusals are answered with ERROR and the connection stays usable.
    write_msg(&mut reader, &Repr::new(Kind::ReadDone, 1)).unwrap();
    assert_eq!(
        read_msg(&mut reader).unwrap(),
        Repr::with_value(Kind::Error, 1, ErrorCode::OutOfOrder.into())
    );
    write_msg(&mut reader, &Repr::new(Kind::ReadRequest, 9)).unwrap();
    assert_eq!(
        read_msg(&mut reader).unwrap(),
        Repr::with_value(Kind::Error, 9, ErrorCode::NoSuchDocument.into())
    );
    write_msg(&mut reader, &Repr::new(Kind::VersionRequest, 1)).unwrap();
    assert_eq!(
        read_msg(&mut reader).unwrap(),
        Repr::with_value(Kind::VersionReply, 1, 2)
    );
}

#[test]
fn malformed_ipc_gets_error_and_close_and_releases_reads() {
    let a = start(1);
    let mut bad = ipc(&a);
    write_msg(&mut bad, &Repr::new(Kind::ReadRequest, 0)).unwrap();
    assert_eq!(read_msg(&mut bad).unwrap().kind, Kind::ReadProceed);
    bad.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    assert_eq!(
        read_msg(&mut bad).unwrap(),
        Repr::with_value(Kind::Error, 0, ErrorCode::Malformed.into())
    );
    let mut rest = Vec::new();
    assert_eq!(bad.read_to_end(&mut rest).unwrap(), 0, "closed after ERROR");
    // Its read was released: an update proceeds at once.
    let mut updater = ipc(&a);
    write_msg(&mut updater, &Repr::new(Kind::UpdateRequest, 0)).unwrap();
    assert_eq!(read_msg(&mut updater).unwrap().kind, Kind::UpdateProceed);
    // A truncated message followed by close does not hurt either.
    let mut half = ipc(&a);
    half.write_all(&[0x43, 0x43, 1]).unwrap();
    drop(half);
    write_msg(&mut updater, &Repr::new(Kind::UpdateDone, 0)).unwrap();
    assert_eq!(read_msg(&mut updater).unwrap().value, 2);
}

#[test]
fn update_thread_rewrites_files_and_bumps_versions() {
    let a = start(3);
    let root = a.ipc.parent().unwrap().join("docs");
    appd::init_docs(&root, 3, 1, 100).unwrap();
    let cfg = UpdaterCfg {
        ipc: a.ipc.clone(),
        docroot: root.clone(),
        docs: 3,
        doc_size: 100,
        rate: 1000.0,
        steps: 3,
        log: None,
        timeout: T,
        count: None,
        select: ccache::appd::Select::Uniform,
    };
    let mut s = ipc(&a);
    assert_eq!(appd::update_once(&mut s, &cfg, 2).unwrap(), 2);
    assert_eq!(appd::update_once(&mut s, &cfg, 2).unwrap(), 3);
    assert_eq!(
        std::fs::read(appd::doc_path(&root, 2)).unwrap(),
        appd::doc_body(2, 3, 100)
    );
    assert_eq!(a.table.get(2), Some(Ok(3)));
    assert_eq!(a.table.get(0), Some(Ok(1)));
    // A document of another size (workloads mix 200 B - 1 MB) keeps its
    // size: all of it is the new version, none of the old one is left.
    std::fs::write(appd::doc_path(&root, 1), appd::doc_body(1, 1, 5000)).unwrap();
    assert_eq!(appd::update_once(&mut s, &cfg, 1).unwrap(), 2);
    assert_eq!(
        std::fs::read(appd::doc_path(&root, 1)).unwrap(),
        appd::doc_body(1, 2, 5000)
    );
}
