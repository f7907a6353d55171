//! A logged-in control connection and the rdma-xfer session kept across
//! transfers on it (`XferSlot`: a new RADR only when the parameters
//! change).

use std::time::Duration;

use rdma_xfer::Transport;

use super::ftp::{radr_connect, radr_line, set_congestion, tcp_info_rtt, Ftp, RadrTarget};
use super::options::Options;
use super::url::Url;

/// Connect, log in and switch to binary (TYPE I).
pub fn session(url: &Url, o: &Options) -> Result<Ftp, String> {
    session_then(url, o, &[])
}

/// [`session`], with `then` (commands whose replies the caller reads
/// next, e.g. `SIZE`) sent ahead with the login when the server pipelines:
/// against rftpd, FEAT, USER, PASS, TYPE I and `then` cost one round trip.
pub(super) fn session_then(url: &Url, o: &Options, then: &[String]) -> Result<Ftp, String> {
    session_with(url, o, then, None)
}

/// [`session_then`]; with `slot`, against a server that pipelines, the
/// RADR of the slot's first transfer goes in the login batch too
/// ([`XferSlot::radr_with_login`]): the session's connections then open
/// a round trip earlier.
pub(super) fn session_with(
    url: &Url,
    o: &Options,
    then: &[String],
    slot: Option<&mut XferSlot>,
) -> Result<Ftp, String> {
    let mut f = Ftp::connect(&url.host, url.port, o.timeout)?;
    if let Some(cc) = &o.congestion {
        set_congestion(&f.out, cc)?;
    }
    f.set_allow_foreign_data_addr(o.allow_foreign_data_addr);
    let mut batch = vec!["TYPE I".to_string()];
    batch.extend(then.iter().cloned());
    if let Some(slot) = slot {
        batch.extend(slot.radr_with_login(&mut f, o)?);
    }
    f.login_with(&url.user, &url.password, &batch)?;
    f.expect("TYPE I", |c| c == 200)?;
    Ok(f)
}

/// What [`XferSlot`] decided for a transfer: the session key, whether a
/// new RADR is needed, and the resolved options and plan for it.
#[derive(Debug)]
struct Decision {
    key: String,
    stale: bool,
    resolved: Option<(Options, Option<rdma_xfer::tune::Plan>)>,
}

/// The extension's transfer session of one control connection, kept
/// across transfers (the server keeps its end until the session fails or
/// the next `RADR`). A new `RADR` is sent only when the parameters change.
#[derive(Debug, Default)]
pub struct XferSlot {
    x: Option<Box<dyn Transport>>,
    /// The RADR line (and CRC setting) the session was made with.
    key: Option<String>,
    /// The server answered RADR with 500/502/504.
    unsupported: bool,
    /// The automatic plan the session was made with, if any.
    plan: Option<rdma_xfer::tune::Plan>,
    /// The rate (bits/s) the last long enough transfer delivered: the next
    /// automatic plan starts from it.
    measured: Option<f64>,
    /// The control connection's RTT, measured (one NOOP) for the first
    /// automatic plan and reused by the next ones.
    rtt: Option<Duration>,
    /// A decision made ahead ([`XferSlot::radr_ahead`]) for the next `get`.
    prepared: Option<Decision>,
    /// The RADR line sent with the login ([`XferSlot::radr_with_login`]),
    /// until its reply is read.
    early_line: Option<String>,
    /// Where that RADR's reply says the session connects: the next `get`
    /// connects there instead of sending a RADR.
    early_target: Option<RadrTarget>,
}

impl XferSlot {
    /// The session for `o`: the cached one, a new one, or `None` when `o`
    /// asks for plain FTP or the server lacks the extension. `auto`
    /// settings are sized to the path and to the transfer's `size` when
    /// known ([`plan_for_path`]); a cached automatic session is replaced
    /// when the rate measured since, or a larger transfer, asks for a
    /// window at least twice its own, or the rate for at most half of it
    /// (a transfer that fits the cached window keeps it: no new RADR).
    pub(super) fn get(
        &mut self,
        f: &mut Ftp,
        o: &Options,
        size: Option<u64>,
    ) -> Result<Option<&mut Box<dyn Transport>>, String> {
        if o.tcp || self.unsupported {
            self.prepared = None;
            return Ok(None);
        }
        let Decision {
            key,
            stale,
            resolved,
        } = match self.prepared.take() {
            Some(d) => d,
            None => self.decide(f, o, size)?,
        };
        if stale {
            self.x = None;
            self.key = None;
            let (ro, plan) = match resolved {
                Some((r, p)) => (r, p),
                None => {
                    let mut r = o.clone();
                    r.streams = r.streams.max(1);
                    (r, None)
                }
            };
            let autotune = o.iodepth == 0;
            let made = match self.early_target.take() {
                Some(to) => Some(radr_connect(to, &ro, autotune)?),
                None => f.radr(&ro, autotune)?,
            };
            match made {
                Some(x) => {
                    self.x = Some(x);
                    self.key = Some(key);
                    self.plan = plan;
                }
                None => {
                    self.unsupported = true;
                    no_extension(o);
                    return Ok(None);
                }
            }
        }
        let x = self.x.as_mut().expect("session set above");
        x.set_progress(o.progress.clone());
        Ok(Some(x))
    }

    /// Whether the transfer needs a new session (and its plan): the
    /// cached one is kept when the parameters and the plan allow it.
    fn decide(&mut self, f: &mut Ftp, o: &Options, size: Option<u64>) -> Result<Decision, String> {
        let key = format!(
            "{} {} {} {} {}",
            o.streams,
            o.block_size,
            o.effective_iodepth(),
            o.xfer_mode,
            o.crc
        );
        let auto = o.streams == 0 || o.iodepth == 0;
        let mut stale = self.x.is_none() || self.key.as_deref() != Some(key.as_str());
        let mut resolved = None;
        if auto && (stale || self.measured.is_some() || size.is_some()) {
            let rtt = match self.rtt {
                Some(r) => r,
                None => {
                    let r = f.rtt()?;
                    self.rtt = Some(r);
                    r
                }
            };
            let (r, p) = plan_for_path(f, o, self.measured.take(), size, Some(rtt))?;
            if let (false, Some(old), Some(new)) = (stale, &self.plan, &p) {
                let (a, b) = (old.window(), new.window());
                let fits = size.is_some_and(|n| n <= a);
                stale = b >= 2 * a || (2 * b <= a && !fits);
                if stale {
                    tracing::info!(
                        old = a,
                        new = b,
                        "auto sizing: a new session for the measured rate"
                    );
                }
            }
            if stale {
                resolved = Some((r, p));
            }
        }
        Ok(Decision {
            key,
            stale,
            resolved,
        })
    }

    /// Whether a transfer may go through the extension (the server has
    /// not refused RADR on this connection).
    pub(super) fn may_use_rdma(&self) -> bool {
        !self.unsupported
    }

    /// Decide now what the next [`XferSlot::get`] for `o` and `size` will
    /// do, and return the RADR line it will send, if any, so the caller
    /// can pipeline it with the transfer command ([`Ftp::send_ahead`]).
    pub(super) fn radr_ahead(
        &mut self,
        f: &mut Ftp,
        o: &Options,
        size: Option<u64>,
    ) -> Result<Option<String>, String> {
        if let Some(line) = self.early_line.take() {
            // The RADR went with the login; its reply came with theirs.
            match f.radr_reply(&line) {
                Ok(Some(to)) => {
                    self.early_target = Some(to);
                    return Ok(None);
                }
                Ok(None) => {
                    self.unsupported = true;
                    self.prepared = None;
                    no_extension(o);
                    return Ok(None);
                }
                // E.g. 452, the server's memory budget: ask again below,
                // sized to the file this time (the batch carries it).
                Err(e) => tracing::info!(%e, "the RADR sent with the login failed; asking again"),
            }
        }
        self.prepared = None;
        if o.tcp || self.unsupported {
            return Ok(None);
        }
        let d = self.decide(f, o, size)?;
        let line = d.stale.then(|| match &d.resolved {
            Some((r, _)) => radr_line(r),
            None => {
                let mut r = o.clone();
                r.streams = r.streams.max(1);
                radr_line(&r)
            }
        });
        self.prepared = Some(d);
        Ok(line)
    }

    /// The RADR line of the slot's first transfer, to go in the login
    /// batch of a server that pipelines (rftpd), or `None`. It is sized
    /// to the path (the RTT of the TCP handshake, TCP_INFO) but not to
    /// the file, whose SIZE reply comes in the same batch: a small file
    /// gets the path's session, not one fitted to it. Its reply is read by
    /// the next [`XferSlot::radr_ahead`] (before the transfer's batch;
    /// if it failed, that one asks again, sized to the file), and the
    /// next [`XferSlot::get`] connects to it. RFC 959 §4.2: replies come
    /// in command order, so the RADR's reply follows the login's, and a
    /// refused login makes it fail (530) harmlessly.
    pub(super) fn radr_with_login(
        &mut self,
        f: &mut Ftp,
        o: &Options,
    ) -> Result<Option<String>, String> {
        if !f.pipelining() || o.tcp || o.mem.is_some() || self.unsupported {
            return Ok(None);
        }
        // Without a kernel sample the plan would cost a timed NOOP.
        let Some(rtt) = tcp_info_rtt(&f.out) else {
            return Ok(None);
        };
        if o.streams == 0 || o.iodepth == 0 {
            self.rtt = Some(rtt);
        }
        let line = self.radr_ahead(f, o, None)?;
        self.early_line.clone_from(&line);
        Ok(line)
    }

    /// A transfer of this session moved `st`: remember its rate for the
    /// next automatic plan if it was long enough to say something (at
    /// least twice the pool, so past the start).
    pub(super) fn note(&mut self, st: &rdma_xfer::Stats) {
        let Some(x) = &self.x else { return };
        let c = x.config();
        let pool = u64::from(c.pool_depth()) * u64::from(c.block_size);
        if st.bytes >= 2 * pool && self.plan.is_some() {
            self.measured = Some(st.bits_per_sec());
        }
    }

    /// The automatic plan of the current session, if it has one.
    pub fn plan(&self) -> Option<&rdma_xfer::tune::Plan> {
        self.plan.as_ref()
    }

    /// The process is about to exit: leave the session's connections for
    /// the kernel to close instead of closing them here. A close here
    /// waits for the server's FIN on every connection (iwarp-soft's
    /// graceful close, bounded by its `FIN_WAIT`), a round trip after the
    /// last reply that tells the client nothing: the transfer is complete
    /// and judged (the 226, and the HASH compared) before this is called.
    /// At exit the kernel sends each connection's FIN itself (TCP goes on
    /// for a closed socket, RFC 9293 §3.6); rftpd ends the session on that
    /// FIN or on QUIT, whichever it reads first. Only for a process that
    /// exits next: the session's threads and memory are not freed.
    pub fn leave_to_exit(&mut self) {
        if let Some(x) = self.x.take() {
            std::mem::forget(x);
        }
        self.key = None;
        self.plan = None;
    }

    /// Forget the session (after a failed transfer both ends drop it).
    pub fn reset(&mut self) {
        self.x = None;
        self.key = None;
        self.plan = None;
    }

    /// "rdma x8" for the current session, if any.
    pub fn describe(&self) -> Option<String> {
        self.x.as_deref().map(via)
    }
}

/// Say that the server has no RDMA extension and plain FTP is used.
fn no_extension(o: &Options) {
    tracing::warn!("the server does not support RADR; falling back to plain FTP");
    if o.mem.is_none() {
        eprintln!("rftp: server has no RDMA extension; using a plain FTP data connection");
    }
}

pub(super) fn via(x: &dyn Transport) -> String {
    format!("{} x{}", x.mode(), x.config().streams)
}

/// Resolve the `auto` settings of `o` for the path behind `f`: with
/// streams and depth both pinned (or plain FTP) `o` is used as it is;
/// otherwise the path's RTT (`rtt`, or measured now on the control
/// connection), the rate delivered by the last transfer of this session
/// (`measured`, bits/s) and the transfer's `size` when known size the
/// session ([`plan_sized`]), and what is pinned stays pinned.
pub fn plan_for_path(
    f: &mut Ftp,
    o: &Options,
    measured: Option<f64>,
    size: Option<u64>,
    rtt: Option<Duration>,
) -> Result<(Options, Option<rdma_xfer::tune::Plan>), String> {
    if o.tcp || (o.streams > 0 && o.iodepth > 0) {
        let mut o = o.clone();
        o.streams = o.streams.max(1);
        return Ok((o, None));
    }
    let rtt = match rtt {
        Some(r) => r,
        None => f.rtt()?,
    };
    let lim = rdma_xfer::tune::Limits::of_this_host(o.max_window);
    let (r, p) = plan_sized(rtt, measured, size, o, lim);
    tracing::info!(
        streams = p.streams,
        iodepth = p.iodepth,
        block_size = p.block_size,
        why = %p.why,
        "auto sizing"
    );
    if o.explain {
        eprintln!(
            "rftp: auto: {} stream(s) x {} blocks x {} KiB: {}",
            p.streams,
            p.iodepth,
            p.block_size / 1024,
            p.why
        );
    }
    Ok((r, Some(p)))
}

/// The automatic plan for a path of `rtt` (and `measured` bits/s, if a
/// transfer measured it) with the host's limits `lim`, fitted to a
/// transfer of `size` bytes when it is known ([`rdma_xfer::tune::plan_for`]:
/// a 200 KB file does not open 8 streams), and `o` with it applied. What
/// `o` pins (streams or iodepth) stays pinned.
pub fn plan_sized(
    rtt: Duration,
    measured: Option<f64>,
    size: Option<u64>,
    o: &Options,
    mut lim: rdma_xfer::tune::Limits,
) -> (Options, rdma_xfer::tune::Plan) {
    if o.streams > 0 {
        lim.max_streams = o.streams;
    }
    let mut p = rdma_xfer::tune::plan_for(rtt, measured, o.block_size, size, &lim);
    let mut r = o.clone();
    if o.streams > 0 {
        p.streams = o.streams;
        p.why
            .push_str(&format!("; streams pinned at {}", o.streams));
    }
    r.streams = p.streams;
    if size.is_some() {
        // fit_to_size may shrink the block for a file smaller than one.
        r.block_size = p.block_size;
    }
    if o.iodepth > 0 {
        p.iodepth = o.iodepth;
        p.why
            .push_str(&format!("; iodepth pinned at {}", o.iodepth));
    } else {
        r.iodepth = p.iodepth;
    }
    (r, p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_xfer::tune::{Limits, DEFAULT_MAX_WINDOW, MAX_AUTO_STREAMS};

    /// Debian's default socket limits (tcp_wmem 4 MiB, tcp_rmem 6 MiB,
    /// tcp_adv_win_scale 1): 3 MiB in flight per connection.
    fn lim() -> Limits {
        Limits {
            max_window: DEFAULT_MAX_WINDOW,
            per_conn: rdma_xfer::tune::per_connection_cap(4 << 20, 6 << 20, 1),
            max_streams: MAX_AUTO_STREAMS,
        }
    }

    /// issue 27: a get or put of a known size is sized to the file as well
    /// as to the path. The seed's sizes at 10 and 50 ms: a 200 KB or 1 MB
    /// file gets one stream whose window holds the whole file; a larger
    /// file never gets more than the unsized plan, and 100 MB at 50 ms is
    /// large enough for the whole unsized plan. Run with --nocapture for
    /// the table.
    #[test]
    fn plan_is_fitted_to_the_transfer_size() {
        let o = Options::default();
        for ms in [10u64, 50] {
            let rtt = Duration::from_millis(ms);
            let (_, whole) = plan_sized(rtt, None, None, &o, lim());
            println!(
                "{ms} ms unsized: {} x {} x {} KiB",
                whole.streams,
                whole.iodepth,
                whole.block_size >> 10
            );
            for size in [200_000u64, 1_000_000, 10_000_000, 100_000_000] {
                let (r, p) = plan_sized(rtt, None, Some(size), &o, lim());
                println!(
                    "{ms} ms {size:>9} B: {} x {} x {} KiB ({})",
                    p.streams,
                    p.iodepth,
                    p.block_size >> 10,
                    p.why
                );
                assert_eq!(
                    (r.streams, r.iodepth, r.block_size),
                    (p.streams, p.iodepth, p.block_size)
                );
                assert!(p.streams <= whole.streams && p.window() <= whole.window().max(size));
                if size <= 1_000_000 {
                    assert_eq!(p.streams, 1, "{size} B at {ms} ms: {}", p.why);
                    assert!(p.window() >= size, "{size} B at {ms} ms: {}", p.why);
                }
            }
            let (_, big) = plan_sized(rtt, None, Some(100_000_000), &o, lim());
            if ms == 50 {
                assert_eq!(big.streams, whole.streams, "{}", big.why);
            }
        }
        // What the user pins stays pinned, whatever the size.
        let pinned = Options {
            streams: 4,
            ..Options::default()
        };
        let (r, p) = plan_sized(
            Duration::from_millis(50),
            None,
            Some(200_000),
            &pinned,
            lim(),
        );
        assert_eq!((r.streams, p.streams), (4, 4), "{}", p.why);
    }
}
