//! Connection management (librdmacm names): connect, listen, get a
//! request, accept, reject.
//!
//! The MPA exchange of RFC 5044 §7 (with RFC 6581 revision 2) runs inside
//! these calls, bounded by `iwarp_conn_param.timeout_ms`; on success the QP
//! is in RTS and its driver threads run.
//!
//! `iwarp_conn_param.congestion` picks the connection's TCP congestion
//! control (`TCP_CONGESTION`, tcp(7)): set with
//! `iwarp_conn_param_set_congestion`, read back with
//! `iwarp_query_qp_congestion`.

use std::ffi::{c_char, CStr};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use iwarp_rs::cm::{
    self, CmError, CongestionControl, ConnParam, ConnRequest, Listener, MpaConfig, Policy,
};

use crate::boundary::{free, give, guard, guard_or, handle, out_ptr};
use crate::consts::{IWARP_MAX_PRIVATE_DATA, IWARP_TIMEOUT_INFINITE};
use crate::error::{copy_cstr, iwarp_result, FfiError};
use crate::verbs::iwarp_qp;

/// A listening endpoint (`rdma_listen`).
pub struct iwarp_listener {
    l: Listener,
}

/// An incoming connection request (`RDMA_CM_EVENT_CONNECT_REQUEST`),
/// already validated against the listener's MPA policy. Consumed by
/// `iwarp_accept`, `iwarp_reject` or `iwarp_conn_request_destroy`.
pub struct iwarp_conn_request {
    req: ConnRequest,
}

/// MPA negotiation policy for CRC and markers (`iwarp_conn_param.crc`,
/// `iwarp_conn_param.markers`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum iwarp_mpa_policy {
    /// Never; refuse a peer that asks.
    IWARP_MPA_OFF = 0,
    /// Do not ask, but go along with a peer that does (the default).
    IWARP_MPA_OPTIONAL = 1,
    /// Ask for it; refuse a peer that does not agree.
    IWARP_MPA_REQUIRED = 2,
}

/// Parameters of a connect, listen or accept (`struct rdma_conn_param`).
/// Initialize with `iwarp_conn_param_init`, then change what you need.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct iwarp_conn_param {
    /// Private data for the MPA Request (connect) or Reply (accept); not
    /// used by listen. May be NULL when `private_data_len` is 0. At most
    /// `IWARP_MAX_PRIVATE_DATA` bytes (508 with MPA revision 2).
    pub private_data: *const u8,
    /// Length of `private_data`.
    pub private_data_len: usize,
    /// CRC32C policy: an `iwarp_mpa_policy`. For accept, the listener's
    /// policy governs.
    pub crc: i32,
    /// Marker policy: an `iwarp_mpa_policy`. For accept, the listener's
    /// policy governs.
    pub markers: i32,
    /// Inbound RDMA Reads served at once (RFC 6581 IRD; default 16).
    pub ird: u16,
    /// Outbound RDMA Reads outstanding at once (RFC 6581 ORD; default 16).
    pub ord: u16,
    /// Bound on the whole connect (TCP connect plus MPA exchange) or
    /// accept; 0 means the default, 5000 ms.
    pub timeout_ms: u32,
    /// How long a peer that owes an answer (our queued data
    /// unacknowledged, RDMA Read Responses, a liveness probe) may stay
    /// silent before the connection is given up: outstanding work flushes
    /// with `IWARP_WC_WR_FLUSH_ERR` and `IWARP_EVENT_PEER_TIMEOUT` is
    /// reported. Also the socket's `TCP_USER_TIMEOUT`. 0 means the
    /// default, 30000 ms; `IWARP_LIVENESS_OFF` turns it off.
    pub peer_timeout_ms: u32,
    /// Silence after which a zero-length RDMA Read asks the peer for a
    /// sign of life (an idle connection through a path that stopped
    /// forwarding is then noticed within `probe_interval_ms +
    /// peer_timeout_ms`). 0 means the default, which is off (not every
    /// RNIC answers a zero-length Read outside connection setup; 10000 is
    /// a sensible value for siw and this stack); `IWARP_LIVENESS_OFF` is
    /// off too.
    pub probe_interval_ms: u32,
    /// The TCP congestion-control algorithm of the connection
    /// (`TCP_CONGESTION`, tcp(7)), NUL-terminated: "reno", "cubic",
    /// "bbr", ... (the kernel lists its own in
    /// /proc/sys/net/ipv4/tcp_available_congestion_control). Empty (the
    /// default) keeps the kernel's default. Set it with
    /// `iwarp_conn_param_set_congestion`, which checks the name. Connect
    /// sets it before the TCP connect; listen sets it on the listening
    /// socket (accepted connections inherit it); accept sets it on the
    /// accepted connection before the MPA Reply. An algorithm the kernel
    /// lacks fails the call with `IWARP_ERR_UNSUPPORTED`, as does any
    /// name on a kernel RDMA device (its TCP is the kernel's).
    pub congestion: [c_char; IWARP_CONGESTION_MAX],
}

/// Size of `iwarp_conn_param.congestion` and of the buffer
/// `iwarp_query_qp_congestion` needs: the kernel's `TCP_CA_NAME_MAX`, so
/// names of at most 15 bytes plus the NUL.
pub const IWARP_CONGESTION_MAX: usize = 16;
const _: () = assert!(IWARP_CONGESTION_MAX == cm::TCP_CA_NAME_MAX_LEN + 1);

/// `iwarp_conn_param.peer_timeout_ms` / `probe_interval_ms`: off.
pub const IWARP_LIVENESS_OFF: u32 = u32::MAX;

const DEFAULT_TIMEOUT_MS: u32 = 5000;

fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(IWARP_LIVENESS_OFF - 1)
}

/// A liveness setting from C: 0 the default, `IWARP_LIVENESS_OFF` off.
fn liveness_from_c(ms: u32, default: Duration) -> Duration {
    match ms {
        0 => default,
        IWARP_LIVENESS_OFF => Duration::ZERO,
        ms => Duration::from_millis(u64::from(ms)),
    }
}

fn policy_from_c(v: i32, what: &str) -> Result<Policy, FfiError> {
    match v {
        0 => Ok(Policy::Off),
        1 => Ok(Policy::Optional),
        2 => Ok(Policy::Required),
        other => Err(FfiError::invalid(format!(
            "{what} policy {other} unknown: use IWARP_MPA_OFF (0), IWARP_MPA_OPTIONAL (1) or IWARP_MPA_REQUIRED (2)"
        ))),
    }
}

fn check_private_data_len(len: usize) -> Result<(), FfiError> {
    if len > IWARP_MAX_PRIVATE_DATA {
        return Err(FfiError::invalid(format!(
            "{len} bytes of private data: MPA carries at most {IWARP_MAX_PRIVATE_DATA} (RFC 5044 §7.1), 508 with revision 2; send the rest after connecting"
        )));
    }
    Ok(())
}

/// Copy `len` bytes of caller private data.
///
/// # Safety
/// `data` is NULL or valid for reads of `len` bytes.
unsafe fn private_data_from_c(data: *const u8, len: usize) -> Result<Vec<u8>, FfiError> {
    check_private_data_len(len)?;
    if len == 0 {
        return Ok(Vec::new());
    }
    if data.is_null() {
        return Err(FfiError::null("private_data"));
    }
    // SAFETY: non-NULL and valid for `len` reads (caller).
    Ok(unsafe { std::slice::from_raw_parts(data, len) }.to_vec())
}

/// Convert a C parameter block; NULL means the defaults.
///
/// # Safety
/// `p` is NULL or points to an `iwarp_conn_param` whose `private_data` is
/// NULL or valid for `private_data_len` reads.
unsafe fn conn_param_from_c(p: *const iwarp_conn_param) -> Result<ConnParam, FfiError> {
    // SAFETY: NULL or valid (caller).
    let Some(p) = (unsafe { p.as_ref() }) else {
        return Ok(ConnParam::default());
    };
    // SAFETY: forwarded from the caller.
    let private_data = unsafe { private_data_from_c(p.private_data, p.private_data_len) }?;
    let mpa = MpaConfig {
        crc: policy_from_c(p.crc, "CRC")?,
        markers: policy_from_c(p.markers, "marker")?,
        ird: p.ird,
        ord: p.ord,
        ..MpaConfig::default()
    };
    let ms = if p.timeout_ms == 0 {
        DEFAULT_TIMEOUT_MS
    } else {
        p.timeout_ms
    };
    let congestion = congestion_from_c(&p.congestion)?;
    Ok(ConnParam {
        private_data,
        mpa,
        timeout: Duration::from_millis(u64::from(ms)),
        peer_timeout: liveness_from_c(p.peer_timeout_ms, cm::DEFAULT_PEER_TIMEOUT),
        probe_interval: liveness_from_c(p.probe_interval_ms, cm::DEFAULT_PROBE_INTERVAL),
        congestion,
        ..ConnParam::default()
    })
}

/// The algorithm in `iwarp_conn_param.congestion`: `None` when empty.
fn congestion_from_c(
    field: &[c_char; IWARP_CONGESTION_MAX],
) -> Result<Option<CongestionControl>, FfiError> {
    let bytes: Vec<u8> = field.iter().map(|&c| c as u8).collect();
    let Some(end) = bytes.iter().position(|&b| b == 0) else {
        return Err(FfiError::invalid(
            "iwarp_conn_param.congestion is not NUL-terminated: names have at most 15 bytes (TCP_CA_NAME_MAX - 1); set it with iwarp_conn_param_set_congestion",
        ));
    };
    if end == 0 {
        return Ok(None);
    }
    let name = std::str::from_utf8(&bytes[..end])
        .map_err(|_| FfiError::invalid("iwarp_conn_param.congestion is not ASCII"))?;
    name.parse()
        .map(Some)
        .map_err(|e: cm::BadCongestionName| FfiError::invalid(e.to_string()))
}

/// Resolve `host` (an IPv4 or IPv6 literal, optionally in brackets, or a
/// name) and `port` to socket addresses, in resolver order.
///
/// # Safety
/// `host` is NULL or a NUL-terminated string.
unsafe fn resolve(host: *const c_char, port: u16) -> Result<Vec<SocketAddr>, FfiError> {
    if host.is_null() {
        return Err(FfiError::null("host"));
    }
    // SAFETY: non-NULL and NUL-terminated (caller).
    let host = unsafe { CStr::from_ptr(host) };
    let host = host.to_str().map_err(|_| {
        FfiError::invalid("host is not valid UTF-8: pass an IP address or a host name")
    })?;
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let addrs: Vec<SocketAddr> = (bare, port)
        .to_socket_addrs()
        .map_err(|e| {
            FfiError::new(
                iwarp_result::IWARP_ERR_IO,
                format!("cannot resolve host \"{host}\": {e}; pass an IP address or check DNS"),
            )
        })?
        .collect();
    if addrs.is_empty() {
        return Err(FfiError::new(
            iwarp_result::IWARP_ERR_IO,
            format!("host \"{host}\" has no addresses"),
        ));
    }
    Ok(addrs)
}

/// Fill `*p` with the defaults: no private data, CRC and markers
/// `IWARP_MPA_OPTIONAL`, IRD = ORD = 16, timeout 5000 ms, peer timeout
/// 30000 ms, probe interval off, congestion control the kernel's
/// default. NULL is a no-op.
///
/// # Safety
/// `p` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn iwarp_conn_param_init(p: *mut iwarp_conn_param) {
    guard_or("iwarp_conn_param_init", (), || {
        if p.is_null() {
            return Err(FfiError::null("p"));
        }
        let d = MpaConfig::default();
        let v = iwarp_conn_param {
            private_data: std::ptr::null(),
            private_data_len: 0,
            crc: iwarp_mpa_policy::IWARP_MPA_OPTIONAL as i32,
            markers: iwarp_mpa_policy::IWARP_MPA_OPTIONAL as i32,
            ird: d.ird,
            ord: d.ord,
            timeout_ms: DEFAULT_TIMEOUT_MS,
            peer_timeout_ms: millis(cm::DEFAULT_PEER_TIMEOUT),
            probe_interval_ms: millis(cm::DEFAULT_PROBE_INTERVAL),
            congestion: [0; IWARP_CONGESTION_MAX],
        };
        // SAFETY: non-NULL and writable (caller).
        unsafe { p.write(v) };
        Ok(())
    })
}

/// Set `p->congestion` to the TCP congestion-control algorithm `name`
/// ("reno", "cubic", "bbr", ...; NULL or "" for the kernel's default).
/// The name is checked here (at most 15 bytes, the kernel's
/// `TCP_CA_NAME_MAX` - 1, of letters, digits, '_', '-', '.'):
/// `IWARP_ERR_INVALID_ARG` otherwise, and `p` is left alone. Whether the
/// kernel has the algorithm is known only when the parameters are used
/// (`iwarp_connect`, `iwarp_listen`, `iwarp_accept`:
/// `IWARP_ERR_UNSUPPORTED`).
///
/// # Safety
/// `p` is NULL or valid for reads and writes; `name` is NULL or
/// NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn iwarp_conn_param_set_congestion(
    p: *mut iwarp_conn_param,
    name: *const c_char,
) -> iwarp_result {
    guard("iwarp_conn_param_set_congestion", || {
        // SAFETY: NULL or valid for reads and writes (caller).
        let p = unsafe { p.as_mut() }.ok_or_else(|| FfiError::null("p"))?;
        let mut field = [0 as c_char; IWARP_CONGESTION_MAX];
        if !name.is_null() {
            // SAFETY: non-NULL and NUL-terminated (caller).
            let name = unsafe { CStr::from_ptr(name) };
            let text = name.to_str().map_err(|_| {
                FfiError::invalid("congestion-control name is not ASCII: use reno, cubic, bbr, ...")
            })?;
            if !text.is_empty() {
                let cc: CongestionControl = text
                    .parse()
                    .map_err(|e: cm::BadCongestionName| FfiError::invalid(e.to_string()))?;
                for (d, b) in field.iter_mut().zip(cc.as_str().bytes()) {
                    *d = b as c_char;
                }
            }
        }
        p.congestion = field;
        Ok(())
    })
}

/// Write the TCP congestion-control algorithm `qp`'s connection uses
/// (getsockopt `TCP_CONGESTION`: the one asked for, or the kernel's
/// default) into `buf` as a NUL-terminated string, truncated to `len - 1`
/// bytes (`IWARP_CONGESTION_MAX` bytes always suffice). For logs.
///
/// Errors: `IWARP_ERR_QP_STATE` (not connected yet),
/// `IWARP_ERR_UNSUPPORTED` (a QP of a kernel RDMA device),
/// `IWARP_ERR_INVALID_ARG` (`len` is 0).
///
/// # Safety
/// `qp` is NULL or a live handle; `buf` is NULL or valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn iwarp_query_qp_congestion(
    qp: *const iwarp_qp,
    buf: *mut c_char,
    len: usize,
) -> iwarp_result {
    guard("iwarp_query_qp_congestion", || {
        // SAFETY: NULL or a live handle (caller).
        let qp = unsafe { handle(qp, "qp") }?;
        if buf.is_null() {
            return Err(FfiError::null("buf"));
        }
        if len == 0 {
            return Err(FfiError::invalid(
                "len is 0: pass a buffer of IWARP_CONGESTION_MAX bytes",
            ));
        }
        let name = cm::tcp_congestion(&qp.qp)?;
        // SAFETY: non-NULL and valid for `len` bytes (caller).
        unsafe { copy_cstr(&name, buf, len) };
        Ok(())
    })
}

/// Store `data` into the caller's (`buf`, `*len`) pair with snprintf-like
/// semantics: copy what fits, report the full length.
///
/// # Safety
/// `len` is NULL or valid for reads and writes; `buf` is NULL or valid for
/// `*len` bytes.
unsafe fn give_private_data(data: &[u8], buf: *mut u8, len: *mut usize) {
    if len.is_null() {
        return;
    }
    // SAFETY: non-NULL, readable and writable (caller).
    let cap = unsafe { len.read() };
    if !buf.is_null() {
        let n = cap.min(data.len());
        // SAFETY: `buf` is valid for `cap >= n` bytes (caller); `data` is
        // our own allocation, so the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf, n) };
    }
    // SAFETY: as above.
    unsafe { len.write(data.len()) };
}

/// Connect `qp` (in state INIT) to a listener at `host`:`port`
/// (`rdma_resolve_addr` + `rdma_connect` in one call; IPv4 or IPv6
/// literals, or a host name whose addresses are tried in order). `param`
/// may be NULL for the defaults. Blocks until the MPA exchange finished or
/// `param->timeout_ms` passed. On success the QP is in RTS.
///
/// The private data of the peer's MPA Reply (or of its Reject, with
/// `IWARP_ERR_REJECTED`) is copied to `peer_private_data`: on input
/// `*peer_private_data_len` is its capacity, on output the full length of
/// the peer's data (if that is larger than the capacity, the data was
/// truncated). Both may be NULL to discard it.
///
/// Errors: `IWARP_ERR_REFUSED` (nobody listens), `IWARP_ERR_TIMEOUT`,
/// `IWARP_ERR_REJECTED`, `IWARP_ERR_MPA`, `IWARP_ERR_QP_STATE` (QP not
/// fresh), `IWARP_ERR_INVALID_ARG` (private data over 512 bytes, bad
/// policy value, bad congestion-control name), `IWARP_ERR_UNSUPPORTED`
/// (the kernel lacks `param->congestion`, or `qp` is of a kernel RDMA
/// device and `param->congestion` is set), `IWARP_ERR_IO`.
///
/// # Safety
/// `qp` is NULL or a live handle; `host` is NULL or NUL-terminated;
/// `param` is NULL or valid (with its `private_data`);
/// `peer_private_data_len` is NULL or valid for reads and writes; and
/// `peer_private_data` is NULL or valid for `*peer_private_data_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn iwarp_connect(
    qp: *mut iwarp_qp,
    host: *const c_char,
    port: u16,
    param: *const iwarp_conn_param,
    peer_private_data: *mut u8,
    peer_private_data_len: *mut usize,
) -> iwarp_result {
    guard("iwarp_connect", || {
        // SAFETY: NULL or a live handle (caller).
        let qp = unsafe { handle(qp, "qp") }?;
        // SAFETY: NULL or valid (caller).
        let param = unsafe { conn_param_from_c(param) }?;
        // SAFETY: NULL or NUL-terminated (caller).
        let addrs = unsafe { resolve(host, port) }?;
        let mut last = None;
        for (i, addr) in addrs.iter().enumerate() {
            match cm::connect(&qp.qp, *addr, &param) {
                Ok(data) => {
                    // SAFETY: see the function's contract.
                    unsafe { give_private_data(&data, peer_private_data, peer_private_data_len) };
                    return Ok(());
                }
                Err(CmError::Rejected { addr, private_data }) => {
                    // SAFETY: see the function's contract.
                    unsafe {
                        give_private_data(&private_data, peer_private_data, peer_private_data_len)
                    };
                    return Err(CmError::Rejected { addr, private_data }.into());
                }
                // Try the host's next address, as a TCP client would.
                Err(e @ (CmError::Refused { .. } | CmError::Connect { .. }))
                    if i + 1 < addrs.len() =>
                {
                    last = Some(e)
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(last.map(FfiError::from).unwrap_or_else(|| {
            FfiError::new(iwarp_result::IWARP_ERR_IO, "no address to connect to")
        }))
    })
}

/// Listen on `host`:`port` (`rdma_listen`; port 0 picks a free port, see
/// `iwarp_listener_port`; "0.0.0.0" or "::" for all addresses). The CRC,
/// marker and IRD/ORD settings of `param` (NULL: defaults) are the policy
/// every incoming request is negotiated against; its `congestion` is set
/// on the listening socket, so accepted connections inherit it
/// (`IWARP_ERR_UNSUPPORTED` if the kernel lacks it); its private data and
/// timeout are not used.
///
/// # Safety
/// `host` is NULL or NUL-terminated; `param` is NULL or valid; `out` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn iwarp_listen(
    host: *const c_char,
    port: u16,
    param: *const iwarp_conn_param,
    out: *mut *mut iwarp_listener,
) -> iwarp_result {
    guard("iwarp_listen", || {
        // SAFETY: NULL or writable (caller).
        unsafe { out_ptr(out, "out") }?;
        // SAFETY: NULL or valid (caller).
        let param = unsafe { conn_param_from_c(param) }?;
        // SAFETY: NULL or NUL-terminated (caller).
        let addr = unsafe { resolve(host, port) }?[0];
        let l = Listener::bind(addr, param.mpa)?;
        if let Some(cc) = &param.congestion {
            l.set_congestion(cc)?;
        }
        // SAFETY: checked by out_ptr.
        unsafe { give(out, iwarp_listener { l }) };
        Ok(())
    })
}

/// Listen on `host`:`port` through the device `ctx` runs on, as
/// `iwarp_listen` does for the device `iwarp_open_device` picks: a TCP
/// listener for "soft", an rdma_cm listener for a kernel device (`host`
/// must then be an address of that device's interface, or the wildcard).
/// Accept its requests onto QPs of the same device.
///
/// # Safety
/// `ctx` is NULL or a live device handle; `host` is NULL or
/// NUL-terminated; `param` is NULL or valid; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn iwarp_listen_on(
    ctx: *const crate::verbs::iwarp_context,
    host: *const c_char,
    port: u16,
    param: *const iwarp_conn_param,
    out: *mut *mut iwarp_listener,
) -> iwarp_result {
    guard("iwarp_listen_on", || {
        // SAFETY: NULL or a live handle (caller).
        let c = unsafe { handle(ctx, "ctx") }?;
        // SAFETY: NULL or writable (caller).
        unsafe { out_ptr(out, "out") }?;
        // SAFETY: NULL or valid (caller).
        let param = unsafe { conn_param_from_c(param) }?;
        // SAFETY: NULL or NUL-terminated (caller).
        let addr = unsafe { resolve(host, port) }?[0];
        let l = Listener::bind_on(&c.ctx, addr, param.mpa)?;
        if let Some(cc) = &param.congestion {
            l.set_congestion(cc)?;
        }
        // SAFETY: checked by out_ptr.
        unsafe { give(out, iwarp_listener { l }) };
        Ok(())
    })
}

/// The port the listener is bound to (0 if `l` is NULL).
///
/// # Safety
/// `l` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn iwarp_listener_port(l: *const iwarp_listener) -> u16 {
    guard_or("iwarp_listener_port", 0, || {
        // SAFETY: NULL or a live handle (caller).
        Ok(unsafe { handle(l, "l") }?.l.local_addr().port())
    })
}

/// Stop listening and free the listener. Requests already returned by
/// `iwarp_get_request` stay valid. NULL is a no-op.
///
/// # Safety
/// `l` is NULL or a live handle, not used again.
#[no_mangle]
pub unsafe extern "C" fn iwarp_listener_close(l: *mut iwarp_listener) {
    // SAFETY: forwarded from the caller.
    unsafe { free("iwarp_listener_close", l) }
}

/// Wait up to `timeout_ms` (or `IWARP_TIMEOUT_INFINITE`) for the next
/// connection request (`rdma_get_request`): accept a TCP connection and
/// read and validate its MPA Request. A request that is malformed or
/// incompatible with the listener's policy is refused on the wire and
/// reported as `IWARP_ERR_MPA` (call again for the next one).
///
/// # Safety
/// `l` is NULL or a live handle; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn iwarp_get_request(
    l: *mut iwarp_listener,
    timeout_ms: u32,
    out: *mut *mut iwarp_conn_request,
) -> iwarp_result {
    guard("iwarp_get_request", || {
        // SAFETY: NULL or writable (caller).
        unsafe { out_ptr(out, "out") }?;
        // SAFETY: NULL or a live handle (caller).
        let l = unsafe { handle(l, "l") }?;
        let timeout = (timeout_ms != IWARP_TIMEOUT_INFINITE)
            .then(|| Duration::from_millis(u64::from(timeout_ms)));
        let req = l.l.get_request(timeout)?;
        // SAFETY: checked by out_ptr.
        unsafe { give(out, iwarp_conn_request { req }) };
        Ok(())
    })
}

/// The private data of the peer's MPA Request: stores a pointer to it in
/// `*data` (valid until the request is consumed) and returns its length.
/// Returns 0 (and stores NULL) if `r` or `data` is NULL.
///
/// # Safety
/// `r` is NULL or a live handle; `data` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn iwarp_conn_request_private_data(
    r: *const iwarp_conn_request,
    data: *mut *const u8,
) -> usize {
    guard_or("iwarp_conn_request_private_data", 0, || {
        if data.is_null() {
            return Err(FfiError::null("data"));
        }
        // SAFETY: non-NULL and writable (caller).
        unsafe { data.write(std::ptr::null()) };
        // SAFETY: NULL or a live handle (caller).
        let r = unsafe { handle(r, "r") }?;
        let pd = r.req.private_data();
        // SAFETY: non-NULL and writable (caller); the bytes live as long as
        // the request.
        unsafe { data.write(pd.as_ptr()) };
        Ok(pd.len())
    })
}

/// Write the requester's address as `ip:port` (`[ip6]:port` for IPv6) into
/// `buf` (NUL-terminated, truncated to `len - 1` characters) and return its
/// full length without the NUL (`snprintf` semantics). Returns 0 if `r` is
/// NULL.
///
/// # Safety
/// `r` is NULL or a live handle; `buf` is NULL or valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn iwarp_conn_request_peer(
    r: *const iwarp_conn_request,
    buf: *mut c_char,
    len: usize,
) -> usize {
    guard_or("iwarp_conn_request_peer", 0, || {
        // SAFETY: NULL or a live handle (caller).
        let r = unsafe { handle(r, "r") }?;
        let text = r.req.peer_addr().to_string();
        // SAFETY: NULL or valid for `len` bytes (caller).
        Ok(unsafe { copy_cstr(&text, buf, len) })
    })
}

/// Take ownership of a request handle.
///
/// # Safety
/// `r` is NULL or a live handle that is not used again.
unsafe fn take_request(r: *mut iwarp_conn_request) -> Result<ConnRequest, FfiError> {
    if r.is_null() {
        return Err(FfiError::null("r"));
    }
    // SAFETY: from `Box::into_raw` in iwarp_get_request, consumed once.
    Ok(unsafe { Box::from_raw(r) }.req)
}

/// Accept the request onto `qp` (`rdma_accept`; `qp` in state INIT, with
/// its receives already posted: the peer may send at once): send the MPA
/// Reply with `param->private_data` and start the QP. The listener's policy
/// governs the negotiation; of `param` (NULL: defaults) only the private
/// data, the timeout and `congestion` (overriding what the connection
/// inherited from the listener; if the kernel lacks it the request is
/// rejected and the call fails with `IWARP_ERR_UNSUPPORTED`) are used.
/// Always consumes `r`, also on failure (the connection is then closed).
///
/// # Safety
/// `r` is NULL or a live handle, not used again; `qp` is NULL or a live
/// handle; `param` is NULL or valid (with its `private_data`).
#[no_mangle]
pub unsafe extern "C" fn iwarp_accept(
    r: *mut iwarp_conn_request,
    qp: *mut iwarp_qp,
    param: *const iwarp_conn_param,
) -> iwarp_result {
    guard("iwarp_accept", || {
        // SAFETY: NULL or a live handle, consumed here (caller).
        let req = unsafe { take_request(r) }?;
        // SAFETY: NULL or a live handle (caller).
        let qp = unsafe { handle(qp, "qp") }?;
        // SAFETY: NULL or valid (caller).
        let param = unsafe { conn_param_from_c(param) }?;
        req.accept(&qp.qp, &param)?;
        Ok(())
    })
}

/// Reject the request (`rdma_reject`): send an MPA Reject carrying
/// `private_data` (at most 512 bytes; may be NULL when `len` is 0) and
/// close the connection. Always consumes `r`.
///
/// # Safety
/// `r` is NULL or a live handle, not used again; `private_data` is NULL or
/// valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn iwarp_reject(
    r: *mut iwarp_conn_request,
    private_data: *const u8,
    len: usize,
) -> iwarp_result {
    guard("iwarp_reject", || {
        // SAFETY: NULL or a live handle, consumed here (caller).
        let req = unsafe { take_request(r) }?;
        // SAFETY: NULL or valid for `len` bytes (caller).
        let data = unsafe { private_data_from_c(private_data, len) }?;
        req.reject(&data)?;
        Ok(())
    })
}

/// Drop a request without answering it: the TCP connection is closed (the
/// peer sees its connect fail). NULL is a no-op.
///
/// # Safety
/// `r` is NULL or a live handle, not used again.
#[no_mangle]
pub unsafe extern "C" fn iwarp_conn_request_destroy(r: *mut iwarp_conn_request) {
    // SAFETY: forwarded from the caller.
    unsafe { free("iwarp_conn_request_destroy", r) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::last_error;
    use crate::verbs::*;
    use iwarp_result::*;
    use std::ptr::{null, null_mut};

    #[test]
    fn conn_param_defaults_and_checks() {
        let mut p = std::mem::MaybeUninit::<iwarp_conn_param>::uninit();
        // SAFETY: `p` is writable; init fills every field.
        let mut p = unsafe {
            iwarp_conn_param_init(p.as_mut_ptr());
            p.assume_init()
        };
        assert_eq!((p.crc, p.markers, p.ird, p.ord), (1, 1, 16, 16));
        assert_eq!(p.timeout_ms, 5000);
        assert_eq!((p.peer_timeout_ms, p.probe_interval_ms), (30_000, 0));
        // 0 is the default, IWARP_LIVENESS_OFF is off, anything else as given.
        for (ms, want) in [
            (0, cm::DEFAULT_PEER_TIMEOUT),
            (IWARP_LIVENESS_OFF, Duration::ZERO),
            (1500, Duration::from_millis(1500)),
        ] {
            let q = iwarp_conn_param {
                peer_timeout_ms: ms,
                probe_interval_ms: ms,
                ..p
            };
            // SAFETY: no private data.
            let c = unsafe { conn_param_from_c(&q) }.unwrap();
            assert_eq!(c.peer_timeout, want);
            let probe = if ms == 0 {
                cm::DEFAULT_PROBE_INTERVAL
            } else {
                want
            };
            assert_eq!(c.probe_interval, probe);
        }
        let big = [0u8; 513];
        p.private_data = big.as_ptr();
        p.private_data_len = big.len();
        // SAFETY: `big` is valid for 513 bytes.
        let e = unsafe { conn_param_from_c(&p) }.unwrap_err();
        assert_eq!(e.code, IWARP_ERR_INVALID_ARG);
        p.private_data_len = 0;
        p.markers = 3;
        // SAFETY: as above.
        assert_eq!(
            unsafe { conn_param_from_c(&p) }.unwrap_err().code,
            IWARP_ERR_INVALID_ARG
        );
        // SAFETY: NULL means the defaults.
        assert!(unsafe { conn_param_from_c(null()) }.is_ok());
    }

    #[test]
    fn congestion_setter_checks_names() {
        let mut p = std::mem::MaybeUninit::<iwarp_conn_param>::uninit();
        // SAFETY (whole test): `p` is writable and initialized by init;
        // names are NUL-terminated literals.
        unsafe {
            iwarp_conn_param_init(p.as_mut_ptr());
            let mut p = p.assume_init();
            assert!(conn_param_from_c(&p).unwrap().congestion.is_none());
            assert_eq!(
                iwarp_conn_param_set_congestion(&mut p, c"reno".as_ptr()),
                IWARP_OK
            );
            let c = conn_param_from_c(&p).unwrap().congestion.unwrap();
            assert_eq!(c.as_str(), "reno");
            // 15 bytes fit, 16 do not, and a refused name leaves `p` alone.
            assert_eq!(
                iwarp_conn_param_set_congestion(&mut p, c"abcdefghijklmno".as_ptr()),
                IWARP_OK
            );
            assert_eq!(
                iwarp_conn_param_set_congestion(&mut p, c"abcdefghijklmnop".as_ptr()),
                IWARP_ERR_INVALID_ARG
            );
            assert!(last_error().contains("15 bytes"), "{}", last_error());
            let c = conn_param_from_c(&p).unwrap().congestion.unwrap();
            assert_eq!(c.as_str(), "abcdefghijklmno");
            // NULL and "" go back to the kernel's default.
            assert_eq!(iwarp_conn_param_set_congestion(&mut p, null()), IWARP_OK);
            assert!(conn_param_from_c(&p).unwrap().congestion.is_none());
            // A field filled by hand without its NUL is refused at use.
            p.congestion = [b'a' as c_char; IWARP_CONGESTION_MAX];
            assert_eq!(
                conn_param_from_c(&p).unwrap_err().code,
                IWARP_ERR_INVALID_ARG
            );
            assert_eq!(
                iwarp_conn_param_set_congestion(null_mut(), c"reno".as_ptr()),
                IWARP_ERR_NULL_ARG
            );
        }
    }

    #[test]
    fn null_arguments_of_the_cm_calls() {
        // SAFETY (whole test): pointers are NULL or point to live locals.
        unsafe {
            assert_eq!(
                iwarp_connect(
                    null_mut(),
                    c"127.0.0.1".as_ptr(),
                    1,
                    null(),
                    null_mut(),
                    null_mut()
                ),
                IWARP_ERR_NULL_ARG
            );
            let mut l = null_mut();
            assert_eq!(iwarp_listen(null(), 0, null(), &mut l), IWARP_ERR_NULL_ARG);
            assert!(last_error().contains("`host` is NULL"));
            assert_eq!(
                iwarp_accept(null_mut(), null_mut(), null()),
                IWARP_ERR_NULL_ARG
            );
            assert_eq!(iwarp_reject(null_mut(), null(), 0), IWARP_ERR_NULL_ARG);
            let mut r = null_mut();
            assert_eq!(iwarp_get_request(null_mut(), 0, &mut r), IWARP_ERR_NULL_ARG);
            assert_eq!(iwarp_listener_port(null()), 0);
            let mut d = null();
            assert_eq!(iwarp_conn_request_private_data(null(), &mut d), 0);
            iwarp_listener_close(null_mut());
            iwarp_conn_request_destroy(null_mut());
        }
    }

    #[test]
    fn refused_connect_and_request_timeout() {
        // SAFETY (whole test): handles come from the create calls and are
        // freed once; other pointers point to live locals.
        unsafe {
            let mut l = null_mut();
            assert_eq!(iwarp_listen(c"[::1]".as_ptr(), 0, null(), &mut l), IWARP_OK);
            let mut r = null_mut();
            assert_eq!(iwarp_get_request(l, 10, &mut r), IWARP_ERR_TIMEOUT);
            let mut ctx = null_mut();
            let mut pd = null_mut();
            let mut cq = null_mut();
            let mut qp = null_mut();
            assert_eq!(iwarp_open_device(&mut ctx), IWARP_OK);
            assert_eq!(iwarp_alloc_pd(ctx, &mut pd), IWARP_OK);
            assert_eq!(iwarp_create_cq(ctx, 4, &mut cq), IWARP_OK);
            assert_eq!(iwarp_create_qp(pd, cq, cq, 2, 2, &mut qp), IWARP_OK);
            // Take a port, free it: nobody listens there.
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            assert_eq!(
                iwarp_connect(
                    qp,
                    c"127.0.0.1".as_ptr(),
                    port,
                    null(),
                    null_mut(),
                    null_mut()
                ),
                IWARP_ERR_REFUSED
            );
            assert!(last_error().starts_with("iwarp_connect: connection refused"));
            iwarp_destroy_qp(qp);
            iwarp_destroy_cq(cq);
            iwarp_dealloc_pd(pd);
            iwarp_close_device(ctx);
            iwarp_listener_close(l);
        }
    }
}
