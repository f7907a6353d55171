//! What all sessions of one rftpd share: the configuration, connection
//! counts per address, failed logins per address (the lockout), and the
//! session buffer memory budget with its reservations.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::config::ServerConfig;
use crate::checksum::Algo;
use crate::confine;
use crate::util::hex;

#[derive(Default)]
pub(super) struct Failures {
    pub(super) by_ip: HashMap<IpAddr, (u32, Instant)>,
}

pub(super) struct Server {
    pub(super) cfg: ServerConfig,
    pub(super) root: PathBuf,
    pub(super) conns: AtomicUsize,
    pub(super) per_ip: Mutex<HashMap<IpAddr, usize>>,
    pub(super) fails: Mutex<Failures>,
    /// Bytes reserved by live transfer sessions, in all
    /// (`session_mem_budget_bytes`) and per login
    /// (`session_mem_per_user_bytes`).
    pub(super) session_mem: Mutex<MemUse>,
    /// The root held open: every file operation resolves beneath it.
    pub(super) confined: confine::Root,
    /// The checksums HASH offers (`hash_algorithms`).
    pub(super) hashes: Vec<Algo>,
}

/// Session buffer memory in use.
#[derive(Debug, Default)]
pub(super) struct MemUse {
    pub(super) total: u64,
    pub(super) by_user: HashMap<String, u64>,
}

impl MemUse {
    pub(super) fn give_back(&mut self, user: &str, bytes: u64) {
        self.total = self.total.saturating_sub(bytes);
        if let Some(u) = self.by_user.get_mut(user) {
            *u = u.saturating_sub(bytes);
            if *u == 0 {
                self.by_user.remove(user);
            }
        }
    }
}

/// Why a session's memory could not be reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MemRefusal {
    /// The server-wide budget has only this much free.
    Server { free: u64 },
    /// The login already holds `held` of its share `share`.
    User { held: u64, share: u64 },
}

/// Buffer memory reserved for one transfer session of `user`; given back
/// on drop, however the session ends.
pub(super) struct MemReservation {
    pub(super) srv: Arc<Server>,
    pub(super) user: String,
    pub(super) bytes: u64,
}

impl MemReservation {
    /// Reserve `bytes` for `user`, or say which limit is in the way.
    pub(super) fn take(
        srv: &Arc<Server>,
        user: &str,
        bytes: u64,
    ) -> Result<MemReservation, MemRefusal> {
        let mut used = lock(&srv.session_mem);
        // The server-wide budget first: when it is what is short, that is
        // the limit to name.
        let free = srv.cfg.session_mem_budget_bytes.saturating_sub(used.total);
        if bytes > free {
            return Err(MemRefusal::Server { free });
        }
        let share = srv.cfg.session_mem_per_user_bytes;
        let held = used.by_user.get(user).copied().unwrap_or(0);
        if bytes > share.saturating_sub(held) {
            return Err(MemRefusal::User { held, share });
        }
        used.total += bytes;
        *used.by_user.entry(user.to_string()).or_insert(0) += bytes;
        Ok(MemReservation {
            srv: srv.clone(),
            user: user.to_string(),
            bytes,
        })
    }

    /// Keep only `bytes` (the negotiated session may be smaller).
    pub(super) fn shrink(&mut self, bytes: u64) {
        if bytes < self.bytes {
            lock(&self.srv.session_mem).give_back(&self.user, self.bytes - bytes);
            self.bytes = bytes;
        }
    }
}

impl Drop for MemReservation {
    fn drop(&mut self) {
        lock(&self.srv.session_mem).give_back(&self.user, self.bytes);
    }
}

/// The most buffer memory a session with `c` can register: a source and a
/// sink pool of `streams x iodepth` blocks each.
pub(super) fn session_bytes(c: &rdma_xfer::Config) -> u64 {
    2 * u64::from(c.pool_depth()) * u64::from(c.block_size)
}

pub(super) fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / f64::from(1 << 20))
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
impl Server {
    /// True while `ip` is locked out after too many failed logins.
    pub(super) fn locked_out(&self, ip: IpAddr) -> bool {
        let window = Duration::from_secs(self.cfg.login_fail_window_secs);
        let mut f = lock(&self.fails);
        match f.by_ip.get(&ip) {
            Some(&(n, first)) if first.elapsed() < window => n >= self.cfg.login_fail_limit,
            Some(_) => {
                f.by_ip.remove(&ip);
                false
            }
            None => false,
        }
    }

    pub(super) fn record_failure(&self, ip: IpAddr) {
        let window = Duration::from_secs(self.cfg.login_fail_window_secs);
        let mut f = lock(&self.fails);
        let e = f.by_ip.entry(ip).or_insert((0, Instant::now()));
        if e.1.elapsed() >= window {
            *e = (0, Instant::now());
        }
        e.0 += 1;
    }

    pub(super) fn check_password(&self, user: &str, pass: &str) -> Option<bool> {
        if self.cfg.anonymous && (user == "anonymous" || user == "ftp") {
            return Some(false);
        }
        let u = self.cfg.users.iter().find(|u| u.name == user)?;
        let ok = match (&u.password_sha256, &u.password) {
            (Some(h), _) => hex(&Sha256::digest(pass.as_bytes())).eq_ignore_ascii_case(h.trim()),
            (None, Some(p)) => p == pass,
            (None, None) => false,
        };
        ok.then_some(u.write)
    }
}
