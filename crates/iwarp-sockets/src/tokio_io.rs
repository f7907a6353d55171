//! An async wrapper for tokio (cargo feature `tokio`): [`AsyncStream`]
//! implements `AsyncRead` / `AsyncWrite`, [`AsyncListener`] accepts.
//!
//! It rests on the readiness descriptor ([`Stream`]'s `AsRawFd`), which
//! the library keeps readable when a read would not block and writable
//! when a write would not: tokio's reactor waits on it (edge-triggered
//! epoll sees every change, since each change is a real wake-up), and the
//! I/O itself is the stream's non-blocking calls. Connection setup (the
//! TCP connect and MPA exchange) runs on tokio's blocking pool.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::{Listener, Options, Stream};

/// The stream's readiness descriptor, for tokio's reactor (it is never
/// read or written through this type). It holds a handle to the stream,
/// which keeps the descriptor open.
#[derive(Debug)]
struct ReadyFd(Stream);

impl AsRawFd for ReadyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// An rsockets stream for tokio.
#[derive(Debug)]
pub struct AsyncStream {
    s: Stream,
    fd: AsyncFd<ReadyFd>,
}

impl AsyncStream {
    /// Wraps a connected stream (inside a tokio runtime).
    #[allow(unsafe_code)]
    pub fn new(s: Stream) -> io::Result<AsyncStream> {
        // SAFETY: the descriptor is the stream's readiness socket, owned by
        // the connection that `ReadyFd`'s handle keeps alive: it stays open
        // and names the same socket for as long as the AsyncFd (which owns
        // that handle) exists, and `as_raw_fd` always returns it.
        let fd = unsafe { AsyncFd::register(ReadyFd(s.clone())) }.map_err(|e| e.into_parts().1)?;
        Ok(AsyncStream { s, fd })
    }

    /// Connects with `opts` (setup on the blocking pool).
    pub async fn connect(addr: SocketAddr, opts: Options) -> io::Result<AsyncStream> {
        let s = tokio::task::spawn_blocking(move || Stream::connect_with(addr, &opts))
            .await
            .map_err(io::Error::other)??;
        AsyncStream::new(s)
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &Stream {
        &self.s
    }
}

impl AsyncRead for AsyncStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        loop {
            let mut guard = ready!(me.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|_| me.s.recv_nonblocking(unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for AsyncStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        loop {
            let mut guard = ready!(me.fd.poll_write_ready(cx))?;
            match guard.try_io(|_| me.s.send_nonblocking(buf)) {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Nothing waits for more data (see `Options::coalesce`).
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.s.shutdown(std::net::Shutdown::Write))
    }
}

/// A listener for tokio.
#[derive(Debug, Clone)]
pub struct AsyncListener {
    l: Arc<Listener>,
}

impl AsyncListener {
    /// Listens on `addr` with `opts`.
    pub fn bind(addr: SocketAddr, opts: &Options) -> io::Result<AsyncListener> {
        Ok(AsyncListener {
            l: Arc::new(Listener::bind_with(addr, opts)?),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.l.local_addr()
    }

    /// Accepts the next connection (on the blocking pool: the MPA exchange
    /// is blocking socket I/O).
    pub async fn accept(&self) -> io::Result<(AsyncStream, SocketAddr)> {
        let l = self.l.clone();
        let (s, peer) = tokio::task::spawn_blocking(move || l.accept())
            .await
            .map_err(io::Error::other)??;
        Ok((AsyncStream::new(s)?, peer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn async_echo_of_a_megabyte_with_odd_sizes() {
        let l = AsyncListener::bind("127.0.0.1:0".parse().unwrap(), &Options::default()).unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 7000];
            loop {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                s.write_all(&buf[..n]).await.unwrap();
            }
            s.shutdown().await.unwrap();
        });
        let mut c = AsyncStream::connect(addr, Options::default())
            .await
            .unwrap();
        let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 7 + i / 251) as u8).collect();
        let (mut r, mut w) = tokio::io::split(&mut c);
        let d = data.clone();
        let writer = async move {
            for chunk in d.chunks(3333) {
                w.write_all(chunk).await.unwrap();
            }
            w.shutdown().await.unwrap();
        };
        let reader = async move {
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            got
        };
        let ((), got) = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            tokio::join!(writer, reader)
        })
        .await
        .expect("echo finished in time");
        assert!(got == data, "echoed {} of {} bytes", got.len(), data.len());
        server.await.unwrap();
    }
}
