//! The settings of this run that every part reads, each chosen once in
//! `main` (or, for TLS, at the first `get`): the TLS configuration, the
//! RDMA device, the TCP congestion control, and the default `--max-len`
//! that follows from the device.

use std::io;
use std::os::fd::AsRawFd;

use iwarp::cm::CongestionControl;
use iwarp::Context;

use crate::cli::Args;

/// What every fallible step returns: the error is a message naming the
/// cause and the fix, printed by `main`.
pub(crate) type Res<T> = Result<T, String>;

/// The TLS configuration when the URLs are https:// (set once in `get`).
pub(crate) static TLS: std::sync::OnceLock<std::sync::Arc<rustls::ClientConfig>> =
    std::sync::OnceLock::new();

/// "https" when the URLs are https://, else "http" (for messages).
pub(crate) fn url_scheme() -> &'static str {
    if TLS.get().is_some() {
        "https"
    } else {
        "http"
    }
}

/// `--congestion`, set once in `main`.
pub(crate) static CONGESTION: std::sync::OnceLock<Option<CongestionControl>> =
    std::sync::OnceLock::new();

pub(crate) fn congestion() -> Option<&'static CongestionControl> {
    CONGESTION.get().and_then(Option::as_ref)
}

/// `--max-len` when not given: the software provider registers an
/// anonymous mapping without touching it, so a large buffer costs nothing
/// until used; a kernel device pins every page at `ibv_reg_mr` (measured on
/// siw0 in the 1.5 GiB siw-vm guest: 256 MiB failed with ENOMEM).
pub(crate) const DEFAULT_MAX_LEN_SOFT: u64 = 256 << 20;
pub(crate) const DEFAULT_MAX_LEN_KERNEL: u64 = 32 << 20;

pub(crate) fn max_len(a: &Args) -> u64 {
    a.max_len.unwrap_or_else(|| match open_device() {
        Ok(ctx) if ctx.device_name() != "soft" => DEFAULT_MAX_LEN_KERNEL,
        _ => DEFAULT_MAX_LEN_SOFT,
    })
}

/// `--device`, set once in `main`.
pub(crate) static DEVICE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

pub(crate) fn open_device() -> Result<Context, iwarp::Error> {
    match DEVICE.get().and_then(Option::as_deref) {
        Some(d) => Context::open_device(d),
        None => Context::open(),
    }
}

/// Set TCP_CONGESTION (tcp(7)) on a connected socket; the kernel switches
/// the connection's algorithm at once. ENOENT: the kernel lacks it.
pub(crate) fn set_tcp_congestion(
    sock: &std::net::TcpStream,
    cc: &CongestionControl,
) -> io::Result<()> {
    let name = cc.as_str().as_bytes();
    // SAFETY: a live socket; optval points to `name.len()` readable bytes.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        let e = io::Error::last_os_error();
        Err(match e.raw_os_error() {
            Some(libc::ENOENT) => io::Error::new(
                e.kind(),
                format!(
                    "{e}: the kernel has no such algorithm (see \
                     /proc/sys/net/ipv4/tcp_available_congestion_control; modprobe tcp_{cc})"
                ),
            ),
            Some(libc::EPERM) => io::Error::new(
                e.kind(),
                format!(
                    "{e}: unprivileged processes may choose only what \
                     /proc/sys/net/ipv4/tcp_allowed_congestion_control lists"
                ),
            ),
            _ => e,
        })
    }
}
