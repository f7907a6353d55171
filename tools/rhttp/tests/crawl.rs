//! `rhttp get -r` against an in-process plain HTTP server that makes up
//! its site (`--plain`: the crawl is the same code whichever way the
//! bodies move; the RDMA side of a crawl is checked against Apache with
//! mod_rdma by scripts/test-rhttp-recursive.sh). The server logs every
//! request and counts connections, so each test checks what rhttp asked
//! for, not only what it saved:
//!
//! - a page of a million links: at most `--max-files` fetched, said so;
//! - link loops (two pages linking each other under several spellings,
//!   and a path that grows forever): each URL once, the depth ends it;
//! - robots.txt honoured, and ignored with `-e robots=off`;
//! - wget's layout (`-P DIR/HOST:PORT/path`, `-nH`), `--no-parent`,
//!   `-l`, `-p`, and one HTTP connection for the whole crawl.
//!
//! Every wait is bounded: the server's sockets have timeouts, and rhttp
//! runs with `--timeout 10` under a 60 s limit of its own.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A page: (content type, body); `None` is a 404.
type Page = Option<(&'static str, Vec<u8>)>;
/// A site: path -> page.
type SiteFn = dyn Fn(&str) -> Page + Send + Sync;
type Site = Arc<SiteFn>;

struct Server {
    port: u16,
    /// Every request path, in order.
    log: Arc<Mutex<Vec<String>>>,
    conns: Arc<Mutex<usize>>,
}

fn serve(site: Site) -> Server {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let log = Arc::new(Mutex::new(Vec::new()));
    let conns = Arc::new(Mutex::new(0));
    let (log2, conns2) = (log.clone(), conns.clone());
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            *conns2.lock().unwrap() += 1;
            let (site, log) = (site.clone(), log2.clone());
            std::thread::spawn(move || serve_conn(s, &*site, &log));
        }
    });
    Server { port, log, conns }
}

fn serve_conn(s: TcpStream, site: &SiteFn, log: &Mutex<Vec<String>>) {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h.trim_end().is_empty() {
                break;
            }
        }
        log.lock().unwrap().push(path.clone());
        let (status, ctype, body) = match site(&path) {
            Some((t, b)) => ("200 OK", t, b),
            None => (
                "404 Not Found",
                "text/html",
                b"<p>no such page</p>".to_vec(),
            ),
        };
        let mut msg = format!(
            "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        msg.extend_from_slice(&body);
        // One write: head and body in two would meet Nagle and the
        // client's delayed ACK (40 ms a request).
        if w.write_all(&msg).is_err() {
            return;
        }
    }
}

struct Run {
    ok: bool,
    stderr: String,
    secs: f64,
}

/// `rhttp --plain -q --timeout 10 get -r ARGS... -P DIR URL`, bounded by
/// 60 s.
fn rhttp(dir: &Path, port: u16, path: &str, args: &[&str]) -> Run {
    let t = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rhttp"))
        .args(["--plain", "-q", "--timeout", "10", "get"])
        .args(args)
        .arg("-P")
        .arg(dir)
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("rhttp did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run {
        ok: status.success(),
        stderr: reader.join().unwrap(),
        secs: t.elapsed().as_secs_f64(),
    }
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rhttp-crawl-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn files_under(d: &Path) -> Vec<String> {
    fn walk(base: &Path, d: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
    let mut v = Vec::new();
    walk(d, d, &mut v);
    v.sort();
    v
}

fn html(s: &str) -> Page {
    Some(("text/html; charset=utf-8", s.as_bytes().to_vec()))
}

#[test]
fn a_million_links_stop_at_max_files() {
    // The page: a million distinct links (12 MB); every link a 1-byte file.
    let page: Arc<Vec<u8>> = Arc::new({
        let mut p = Vec::with_capacity(14_000_000);
        for i in 0..1_000_000 {
            p.extend_from_slice(format!("<a href=f{i}>").as_bytes());
        }
        p
    });
    let srv = serve(Arc::new(move |p: &str| match p {
        "/" => Some(("text/html", page.to_vec())),
        "/robots.txt" => None,
        _ => Some(("application/octet-stream", b"x".to_vec())),
    }));
    let d = tmp("million");
    let r = rhttp(&d, srv.port, "/", &["-r", "-nH", "--max-files", "50"]);
    eprintln!("{}", r.stderr);
    assert!(r.ok);
    let log = srv.log.lock().unwrap().clone();
    assert_eq!(log.len(), 51, "robots.txt, the page and 49 links: {log:?}");
    assert_eq!(files_under(&d).len(), 50);
    assert!(r
        .stderr
        .contains("--max-files 50 reached: 999951 more links"));
    assert!(r.stderr.contains("Downloaded: 50 files"));
    assert_eq!(*srv.conns.lock().unwrap(), 1, "one HTTP connection");
    eprintln!("crawl of the million-link page: {:.2} s", r.secs);
}

#[test]
fn link_loops_end() {
    // a.html and b.html link each other under several spellings; /x/
    // links x/ below itself forever.
    let srv = serve(Arc::new(|p: &str| match p {
        "/a.html" => html(
            r#"<a href="b.html">b</a><a href="./b.html#top">b</a><a href="/%62.html">b</a><a href="/A.html#x">other case, other file</a><a href="x/">x</a>"#,
        ),
        "/b.html" => {
            html(r#"<a href="a.html">a</a><a href="/./a.html">a</a><a href="%61.html">a</a>"#)
        }
        p if p.starts_with("/x/") && p.ends_with('/') => {
            html(r#"<a href="x/">deeper</a><a href="../">up</a>"#)
        }
        _ => None,
    }));
    let d = tmp("loops");
    let r = rhttp(&d, srv.port, "/a.html", &["-r", "-l", "4", "-nH"]);
    eprintln!("{}", r.stderr);
    assert!(!r.ok, "404s on the way: exit status 1 (wget: 8)");
    assert!(r.stderr.contains("Downloaded: 6 files"), "{}", r.stderr);
    let log = srv.log.lock().unwrap().clone();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for p in &log {
        *counts.entry(p.as_str()).or_default() += 1;
    }
    assert!(counts.values().all(|&n| n == 1), "each URL once: {log:?}");
    // Depth 0 a.html; 1 b.html, /x/; 2 /x/x/ (and /, a 404); 3 /x/x/x/; 4 /x/x/x/x/.
    assert!(log.contains(&"/x/x/x/x/".to_string()), "{log:?}");
    assert!(
        !log.contains(&"/x/x/x/x/x/".to_string()),
        "-l 4 ends the growing loop: {log:?}"
    );
    assert_eq!(log.iter().filter(|p| p.starts_with("/x/")).count(), 4);
    // The 404 for / is not kept.
    assert!(!d.join("index.html").exists());
    assert!(d.join("x/x/x/x/index.html").exists());
    // -l inf: --max-files ends it.
    srv.log.lock().unwrap().clear();
    let d = tmp("loops-inf");
    let r = rhttp(
        &d,
        srv.port,
        "/x/",
        &[
            "-r",
            "-l",
            "inf",
            "--max-files",
            "30",
            "-nH",
            "-e",
            "robots=off",
        ],
    );
    assert!(r.stderr.contains("--max-files 30 reached"), "{}", r.stderr);
    let log = srv.log.lock().unwrap().clone();
    assert_eq!(log.len(), 30, "{log:?}");
    // 29 of /x/.../ and / (a 404, not kept).
    assert_eq!(files_under(&d).len(), 29);
}

#[test]
fn robots_txt_is_honoured_unless_turned_off() {
    let srv = serve(Arc::new(|p: &str| match p {
        "/robots.txt" => Some((
            "text/plain",
            b"User-agent: *\nDisallow: /private/\n\nUser-agent: rhttp\nDisallow: /secret\n"
                .to_vec(),
        )),
        "/" => html(
            r#"<a href="/private/a.html">p</a><a href="/secret.html">s</a><a href="/pub.html">ok</a>"#,
        ),
        "/pub.html" | "/private/a.html" | "/secret.html" => html("<p>page</p>"),
        _ => None,
    }));
    let d = tmp("robots");
    let r = rhttp(&d, srv.port, "/", &["-r", "-nH"]);
    assert!(r.ok, "{}", r.stderr);
    assert!(
        r.stderr.contains("1 disallowed by robots.txt"),
        "{}",
        r.stderr
    );
    let log = srv.log.lock().unwrap().clone();
    // rhttp's own group applies (not *'s): /secret* is out, /private/ is not.
    assert_eq!(log, ["/robots.txt", "/", "/private/a.html", "/pub.html"]);
    srv.log.lock().unwrap().clear();
    let d = tmp("robots-off");
    let r = rhttp(&d, srv.port, "/", &["-r", "-nH", "-e", "robots=off"]);
    assert!(r.ok, "{}", r.stderr);
    let log = srv.log.lock().unwrap().clone();
    assert_eq!(log, ["/", "/private/a.html", "/secret.html", "/pub.html"]);
}

#[test]
fn layout_depth_no_parent_and_requisites_as_wget() {
    let srv = serve(Arc::new(|p: &str| match p {
        "/d/" => html(
            r#"<link rel=stylesheet href="/css/s.css"><a href="../up.html">up</a><a href="p1.html">1</a><img src="i%20one.png">"#,
        ),
        "/d/p1.html" => html(r#"<a href="p2.html">2</a><img src="/img/deep.png">"#),
        "/d/p2.html" => html("<p>deepest</p>"),
        "/up.html" => html("<p>up</p>"),
        "/css/s.css" => Some(("text/css", b"p{}".to_vec())),
        "/d/i%20one.png" | "/img/deep.png" => Some(("image/png", b"PNG".to_vec())),
        _ => None,
    }));
    let host = format!("127.0.0.1:{}", srv.port);
    // Host directory, -l 1, --no-parent: /up.html and /css/s.css are above /d/.
    let d = tmp("layout");
    let r = rhttp(&d, srv.port, "/d/", &["-r", "-l", "1", "-np"]);
    assert!(r.ok, "{}", r.stderr);
    assert_eq!(
        files_under(&d),
        [
            format!("{host}/d/i one.png"),
            format!("{host}/d/index.html"),
            format!("{host}/d/p1.html")
        ]
    );
    assert!(
        r.stderr.contains("2 above the start (--no-parent)"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("Downloaded: 3 files"), "{}", r.stderr);
    // -p: the requisites come, past -l 1 (deep.png) and above /d/ (s.css).
    let d = tmp("layout-p");
    let r = rhttp(
        &d,
        srv.port,
        "/d/",
        &["-r", "-l", "1", "--no-parent", "-p", "-nH"],
    );
    assert!(r.ok, "{}", r.stderr);
    assert_eq!(
        files_under(&d),
        [
            "css/s.css",
            "d/i one.png",
            "d/index.html",
            "d/p1.html",
            "img/deep.png"
        ]
    );
    // -p alone: the page and its requisites.
    let d = tmp("layout-p-only");
    let r = rhttp(&d, srv.port, "/d/p1.html", &["-p", "--no-host-directories"]);
    assert!(r.ok, "{}", r.stderr);
    assert_eq!(files_under(&d), ["d/p1.html", "img/deep.png"]);
    assert_eq!(*srv.conns.lock().unwrap(), 3, "one HTTP connection per run");
}
