//! A logged-in control connection and the rdma-xfer session kept across
//! transfers on it (`XferSlot`: a new RADR only when the parameters
//! change).

use rdma_xfer::Transport;

use super::ftp::{set_congestion, Ftp};
use super::options::Options;
use super::url::Url;

/// Connect, log in and switch to binary (TYPE I).
pub fn session(url: &Url, o: &Options) -> Result<Ftp, String> {
    let mut f = Ftp::connect(&url.host, url.port, o.timeout)?;
    if let Some(cc) = &o.congestion {
        set_congestion(&f.out, cc)?;
    }
    f.set_allow_foreign_data_addr(o.allow_foreign_data_addr);
    f.login(&url.user, &url.password)?;
    f.expect("TYPE I", |c| c == 200)?;
    Ok(f)
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
}

impl XferSlot {
    /// The session for `o`: the cached one, a new one, or `None` when `o`
    /// asks for plain FTP or the server lacks the extension. `auto`
    /// settings are sized to the path ([`plan_for_path`]); a cached
    /// automatic session is replaced when the rate measured since asks for
    /// a window at least twice or at most half its own.
    pub(super) fn get(
        &mut self,
        f: &mut Ftp,
        o: &Options,
    ) -> Result<Option<&mut Box<dyn Transport>>, String> {
        if o.tcp || self.unsupported {
            return Ok(None);
        }
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
        if auto && (stale || self.measured.is_some()) {
            let (r, p) = plan_for_path(f, o, self.measured.take())?;
            if let (false, Some(old), Some(new)) = (stale, &self.plan, &p) {
                let (a, b) = (old.window(), new.window());
                stale = b >= 2 * a || 2 * b <= a;
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
            match f.radr(&ro, o.iodepth == 0)? {
                Some(x) => {
                    self.x = Some(x);
                    self.key = Some(key);
                    self.plan = plan;
                }
                None => {
                    self.unsupported = true;
                    tracing::warn!("the server does not support RADR; falling back to plain FTP");
                    if o.mem.is_none() {
                        eprintln!(
                            "rftp: server has no RDMA extension; using a plain FTP data connection"
                        );
                    }
                    return Ok(None);
                }
            }
        }
        let x = self.x.as_mut().expect("session set above");
        x.set_progress(o.progress.clone());
        Ok(Some(x))
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

pub(super) fn via(x: &dyn Transport) -> String {
    format!("{} x{}", x.mode(), x.config().streams)
}

/// Resolve the `auto` settings of `o` for the path behind `f`: with
/// streams and depth both pinned (or plain FTP) `o` is used as it is;
/// otherwise the control connection's RTT and the rate delivered by the
/// last transfer of this session (`measured`, bits/s) size the session
/// ([`rdma_xfer::tune::plan`]), and what is pinned stays pinned.
pub fn plan_for_path(
    f: &mut Ftp,
    o: &Options,
    measured: Option<f64>,
) -> Result<(Options, Option<rdma_xfer::tune::Plan>), String> {
    if o.tcp || (o.streams > 0 && o.iodepth > 0) {
        let mut o = o.clone();
        o.streams = o.streams.max(1);
        return Ok((o, None));
    }
    let rtt = f.rtt()?;
    let lim = rdma_xfer::tune::Limits::of_this_host(o.max_window);
    let mut lim = lim;
    if o.streams > 0 {
        lim.max_streams = o.streams;
    }
    let mut p = rdma_xfer::tune::plan(rtt, measured, o.block_size, &lim);
    let mut r = o.clone();
    if o.streams > 0 {
        p.streams = o.streams;
        p.why
            .push_str(&format!("; streams pinned at {}", o.streams));
    }
    r.streams = p.streams;
    if o.iodepth > 0 {
        p.iodepth = o.iodepth;
        p.why
            .push_str(&format!("; iodepth pinned at {}", o.iodepth));
    } else {
        r.iodepth = p.iodepth;
    }
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
