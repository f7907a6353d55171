//! One HTTP connection plus its RDMA side ([`Session`]), and the choice
//! of session for a URL's host.

use std::sync::atomic::Ordering;
use std::time::Duration;

use iwarp::cm::Policy;
use rhttp::http::{Conn, Url};

use crate::cli::Args;
use crate::rdma::Rdma;
use crate::settings::{congestion, set_tcp_congestion, Res, TLS};
use crate::stats::HTTP_CONNS;

/// One HTTP connection plus its RDMA side.
pub(crate) struct Session {
    pub(crate) url0: Url,
    pub(crate) http: Conn,
    pub(crate) rdma: Option<Rdma>,
    pub(crate) args_timeout: Duration,
    pub(crate) crc: Policy,
}

impl Session {
    pub(crate) fn open(url: &Url, timeout: Duration, crc: Policy) -> Res<Session> {
        let http = match TLS.get() {
            Some(tls) => Conn::connect_tls(url, timeout, tls.clone()),
            None => Conn::connect(url, timeout),
        }
        .map_err(|e| {
            format!(
                "connecting to {}:{}: {e}; is the server running?",
                url.host, url.port
            )
        })?;
        HTTP_CONNS.fetch_add(1, Ordering::Relaxed);
        if let Some(cc) = congestion() {
            set_tcp_congestion(http.stream(), cc)
                .map_err(|e| format!("--congestion {cc} on the HTTP connection: {e}"))?;
        }
        Ok(Session {
            url0: url.clone(),
            http,
            rdma: None,
            args_timeout: timeout,
            crc,
        })
    }

    pub(crate) fn rdma(&mut self) -> Res<&mut Rdma> {
        if self.rdma.is_none() {
            self.rdma = Some(Rdma::new(&self.http, self.args_timeout, self.crc)?);
        }
        Ok(self.rdma.as_mut().expect("just set"))
    }

    pub(crate) fn reopen_if(&mut self, close: bool) -> Res<()> {
        if close {
            let url = self.url0.clone();
            *self = Session::open(&url, self.args_timeout, self.crc)?;
        }
        Ok(())
    }
}

/// Open the session for `url`'s host, unless the current one is for it.
pub(crate) fn session_for<'s>(
    session: &'s mut Option<Session>,
    url: &Url,
    a: &Args,
) -> Res<&'s mut Session> {
    if session
        .as_ref()
        .is_some_and(|s| s.url0.host != url.host || s.url0.port != url.port)
    {
        *session = None;
    }
    if session.is_none() {
        *session = Some(Session::open(
            url,
            Duration::from_secs(a.timeout),
            a.crc.into(),
        )?);
    }
    Ok(session.as_mut().expect("just set"))
}
