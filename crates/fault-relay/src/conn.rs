//! One relayed connection's two sockets, its reader threads (which stamp
//! each chunk with its arrival time) and the buffer sizes.

use std::io::{self, Read};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::spec::Dir;

/// Read size of the reader threads.
pub(crate) const CHUNK: usize = 64 << 10;
/// The writer joins queued chunks up to this many bytes before it writes.
pub(crate) const JOIN: usize = 256 << 10;
/// How often blocked readers and writers look whether the connection was
/// dropped.
pub(crate) const TICK: Duration = Duration::from_millis(50);

/// The two sockets of one relayed connection.
pub(crate) struct Conn {
    pub(crate) client: TcpStream,
    pub(crate) server: TcpStream,
    pub(crate) dead: AtomicBool,
    /// Directions whose writer has finished.
    pub(crate) done: AtomicUsize,
    pub(crate) id: String,
}

impl Conn {
    pub(crate) fn dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }
    /// Close both connections: with RST (SO_LINGER 0; the sockets close
    /// when the threads, which notice within a tick, let go of them) or
    /// with FIN at once.
    pub(crate) fn kill(&self, rst: bool) {
        if rst {
            for s in [&self.client, &self.server] {
                let l = libc::linger {
                    l_onoff: 1,
                    l_linger: 0,
                };
                // SAFETY: a valid socket descriptor and a linger struct of
                // the size passed.
                unsafe {
                    libc::setsockopt(
                        s.as_raw_fd(),
                        libc::SOL_SOCKET,
                        libc::SO_LINGER,
                        (&l as *const libc::linger).cast(),
                        std::mem::size_of::<libc::linger>() as libc::socklen_t,
                    );
                }
            }
        } else {
            let _ = self.client.shutdown(Shutdown::Both);
            let _ = self.server.shutdown(Shutdown::Both);
        }
        self.dead.store(true, Ordering::Relaxed);
    }
    pub(crate) fn side(&self, d: Dir) -> (&TcpStream, &TcpStream) {
        match d {
            Dir::Up => (&self.client, &self.server),
            _ => (&self.server, &self.client),
        }
    }
}

/// Read from `src`, stamp each chunk with its arrival time, queue it.
pub(crate) fn reader(conn: Arc<Conn>, d: Dir, tx: SyncSender<(Instant, Vec<u8>)>) {
    let (mut src, _) = conn.side(d);
    loop {
        if conn.dead() {
            break;
        }
        let mut buf = vec![0u8; CHUNK];
        match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                buf.truncate(n);
                if tx.send((Instant::now(), buf)).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted
                        | io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => {
                tracing::debug!(conn = %conn.id, ?d, %e, "relay read ended");
                // Pass a reset on as a reset, not as an end of stream.
                if e.kind() == io::ErrorKind::ConnectionReset {
                    conn.kill(true);
                }
                break;
            }
        }
    }
    // Dropping tx tells the writer: end of stream.
}

/// Blackholed connections, kept open until the process exits.
pub(crate) static HELD: std::sync::Mutex<Vec<Arc<Conn>>> = std::sync::Mutex::new(Vec::new());
