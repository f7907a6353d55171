//! Command dispatch (RFC 959 §5.3.1, RFC 2389 FEAT/OPTS, RFC 3659
//! SIZE/MDTM/REST) and the login and directory commands.

use std::fs;
use std::io;
use std::path::Path;
use std::time::Duration;

use super::session::{io_reply, r, Reply, Session};
use super::state::lock;
use crate::checksum::Algo;
use crate::util;

impl Session {
    pub(super) fn dispatch(&mut self, verb: &str, arg: &str) -> io::Result<Option<Reply>> {
        let open = matches!(
            verb,
            "USER" | "PASS" | "FEAT" | "SYST" | "NOOP" | "OPTS" | "QUIT"
        );
        if !open {
            if let Some(rep) = self.need_login() {
                // Unknown commands are still 500 before login.
                return Ok(Some(if known(verb) {
                    rep
                } else {
                    r(500, format!("Unknown command {verb:.32}."))
                }));
            }
        }
        let rep = match verb {
            "USER" => self.user_cmd(arg),
            "PASS" => self.pass_cmd(arg),
            "SYST" => r(215, "UNIX Type: L8"),
            "NOOP" => r(200, "OK."),
            "FEAT" => self.feat(),
            "OPTS" => self.opts(arg),
            "PWD" | "XPWD" => r(
                257,
                format!(
                    "\"{}\" is the current directory.",
                    self.cwd.replace('"', "\"\"")
                ),
            ),
            "CWD" | "XCWD" => self.cwd_cmd(arg),
            "CDUP" | "XCUP" => self.cwd_cmd(".."),
            "TYPE" => match arg.to_ascii_uppercase().as_str() {
                "I" | "L 8" | "L8" => r(200, "Type set to I."),
                "A" | "A N" => r(200, "Type set to A (transfers are binary)."),
                _ => r(504, "Type not supported."),
            },
            "MODE" => match arg.to_ascii_uppercase().as_str() {
                "S" => r(200, "Mode set to S."),
                _ => r(504, "Only stream mode is supported."),
            },
            "STRU" => match arg.to_ascii_uppercase().as_str() {
                "F" => r(200, "Structure set to F."),
                _ => r(504, "Only file structure is supported."),
            },
            "ALLO" => r(202, "No storage allocation necessary."),
            "ABOR" => r(226, "No transfer to abort."),
            "PASV" => self.pasv(false),
            "EPSV" => {
                if arg.eq_ignore_ascii_case("ALL") {
                    r(200, "EPSV ALL accepted.")
                } else {
                    self.pasv(true)
                }
            }
            "PORT" => self.port(arg, false),
            "EPRT" => self.port(arg, true),
            "REST" => match arg.trim().parse::<u64>() {
                Ok(n) => {
                    self.rest = n;
                    r(350, format!("Restarting at {n}. Send RETR, STOR or RRTR."))
                }
                Err(_) => r(501, "REST needs a byte offset."),
            },
            "SIZE" => match self.path(arg) {
                Ok((_, p)) => match self.find(&p).and_then(|f| fs::metadata(f.path())) {
                    Ok(m) if m.is_file() => r(213, m.len().to_string()),
                    Ok(_) => r(550, format!("{arg}: not a plain file.")),
                    Err(e) => io_reply(&e, arg),
                },
                Err(e) => e,
            },
            "MDTM" => match self.path(arg) {
                Ok((_, p)) => match self
                    .find(&p)
                    .and_then(|f| fs::metadata(f.path()))
                    .and_then(|m| m.modified())
                {
                    Ok(t) => r(213, util::mdtm(t)),
                    Err(e) => io_reply(&e, arg),
                },
                Err(e) => e,
            },
            "HASH" => self.hash(arg),
            "LIST" | "NLST" | "MLSD" => return self.listing(verb, arg),
            "RETR" => return self.retr(arg),
            "STOR" => return self.stor(arg),
            "DELE" => self.modify(arg, |p| fs::remove_file(p), 250, "Deleted."),
            "RMD" | "XRMD" => self.modify(arg, |p| fs::remove_dir(p), 250, "Directory removed."),
            "MKD" | "XMKD" => match self.need_write().map_or_else(|| self.path(arg), Err) {
                Ok((v, p)) => match self.entry(&p).and_then(|e| fs::create_dir(e.path())) {
                    Ok(()) => r(257, format!("\"{}\" created.", v.replace('"', "\"\""))),
                    Err(e) => io_reply(&e, arg),
                },
                Err(e) => e,
            },
            "RNFR" => match self.need_write().map_or_else(|| self.path(arg), Err) {
                Ok((_, p))
                    if self
                        .entry(&p)
                        .and_then(|e| fs::symlink_metadata(e.path()))
                        .is_ok() =>
                {
                    self.rnfr = Some(p);
                    return Ok(Some(r(350, "Ready for RNTO.")));
                }
                Ok(_) => r(550, format!("{arg}: no such file or directory.")),
                Err(e) => e,
            },
            "RNTO" => match (
                self.rnfr.take(),
                self.need_write().map_or_else(|| self.path(arg), Err),
            ) {
                (None, _) => r(503, "RNFR first."),
                (Some(from), Ok((_, to))) => match self
                    .entry(&from)
                    .and_then(|f| self.entry(&to).map(|t| (f, t)))
                    .and_then(|(f, t)| fs::rename(f.path(), t.path()))
                {
                    Ok(()) => r(250, "Renamed."),
                    Err(e) => io_reply(&e, arg),
                },
                (_, Err(e)) => e,
            },
            "RADR" => return self.radr(arg),
            "RSTR" => return self.rstr(arg),
            "RRTR" => return self.rrtr(arg),
            "" => r(500, "Empty command."),
            _ => r(500, format!("Unknown command {verb:.32}.")),
        };
        Ok(Some(rep))
    }

    pub(super) fn user_cmd(&mut self, arg: &str) -> Reply {
        if self.srv.locked_out(self.peer.ip()) {
            return r(421, "Too many failed logins; try again later.");
        }
        if arg.is_empty() {
            return r(501, "USER needs a name.");
        }
        self.user = None;
        self.pending_user = Some(arg.to_string());
        r(331, "Password required.")
    }

    pub(super) fn pass_cmd(&mut self, arg: &str) -> Reply {
        let ip = self.peer.ip();
        if self.srv.locked_out(ip) {
            return r(421, "Too many failed logins; try again later.");
        }
        let Some(user) = self.pending_user.take() else {
            return r(503, "Send USER first.");
        };
        match self.srv.check_password(&user, arg) {
            Some(write) => {
                tracing::info!(peer = %self.peer, %user, write, "login");
                lock(&self.srv.fails).by_ip.remove(&ip);
                self.user = Some(user);
                self.writable = write;
                r(230, "Logged in.")
            }
            None => {
                tracing::warn!(peer = %self.peer, %user, "failed login");
                self.srv.record_failure(ip);
                std::thread::sleep(Duration::from_millis(self.srv.cfg.login_fail_delay_ms));
                if self.srv.locked_out(ip) {
                    r(421, "Too many failed logins; try again later.")
                } else {
                    r(530, "Login incorrect.")
                }
            }
        }
    }

    pub(super) fn feat(&self) -> Reply {
        let mut f = vec![
            "Extensions supported:",
            "EPRT",
            "EPSV",
            "MDTM",
            "SIZE",
            "REST STREAM",
            "MLST type*;size*;modify*;",
            "UTF8",
        ];
        let hash = format!(
            "HASH {}",
            self.srv
                .hashes
                .iter()
                .map(|a| {
                    let star = if *a == self.hash_algo { "*" } else { "" };
                    format!("{a}{star}")
                })
                .collect::<Vec<_>>()
                .join(";")
        );
        f.push(&hash);
        if self.srv.cfg.rdma {
            f.extend(["RADR", "RSTR", "RRTR"]);
        }
        let mut text: String = f.iter().map(|l| format!("{l}\n")).collect();
        text.push_str("End");
        r(211, text)
    }

    pub(super) fn opts(&mut self, arg: &str) -> Reply {
        let up = arg.to_ascii_uppercase();
        let mut it = up.split_whitespace();
        match (it.next(), it.next(), it.next()) {
            (Some("UTF8"), Some("ON") | None, _) => r(200, "UTF8 is always on."),
            (Some("HASH"), None, _) => r(200, self.hash_algo.wire_name()),
            // draft-bryan-ftpext-hash §4: 200 and the algorithm selected;
            // one the server does not offer gets 501 and the selection
            // stays; the reply names what is offered, so the client can
            // choose again.
            (Some("HASH"), Some(a), _) => match a.parse::<Algo>() {
                Ok(algo) if self.srv.hashes.contains(&algo) => {
                    self.hash_algo = algo;
                    self.hash_during = true;
                    r(200, algo.wire_name())
                }
                _ => r(
                    501,
                    format!(
                        "Unknown algorithm {a:.32}, current selection not changed; this server \
                         offers {} (FEAT HASH).",
                        Algo::list(&self.srv.hashes)
                    ),
                ),
            },
            (Some("MLST"), _, _) => r(200, "MLST OPTS type;size;modify;"),
            (Some("RDMA"), Some("MEM"), Some(v)) if self.srv.cfg.rdma => {
                if self.user.is_none() {
                    return r(530, "Please log in first.");
                }
                self.mem = v == "ON";
                r(
                    200,
                    format!(
                        "Memory-to-memory mode {}.",
                        if self.mem { "on" } else { "off" }
                    ),
                )
            }
            // rftp put --retry (docs/RFTP.md): keep a cut-off upload's
            // in-order prefix as the target, to resume with REST.
            (Some("UPLOAD"), Some("KEEP"), Some(v @ ("ON" | "OFF"))) => {
                if self.user.is_none() {
                    return r(530, "Please log in first.");
                }
                self.keep_partial = v == "ON";
                r(
                    200,
                    if self.keep_partial {
                        "An upload cut off keeps what arrived (resume it with REST)."
                    } else {
                        "An upload cut off is discarded."
                    },
                )
            }
            _ => r(501, "Option not understood."),
        }
    }

    pub(super) fn cwd_cmd(&mut self, arg: &str) -> Reply {
        match self.path(if arg.is_empty() { "/" } else { arg }) {
            Ok((v, p)) if self.find(&p).is_ok_and(|f| f.path().is_dir()) => {
                self.cwd = v;
                r(250, format!("Directory changed to {}.", self.cwd))
            }
            Ok(_) => r(550, format!("{arg}: no such directory.")),
            Err(e) => e,
        }
    }

    pub(super) fn modify(
        &mut self,
        arg: &str,
        f: impl Fn(&Path) -> io::Result<()>,
        code: u32,
        ok: &str,
    ) -> Reply {
        match self.need_write().map_or_else(|| self.path(arg), Err) {
            Ok((v, p)) => {
                if v == "/" {
                    return r(550, "The root cannot be changed.");
                }
                match self.entry(&p).and_then(|e| f(&e.path())) {
                    Ok(()) => r(code, ok),
                    Err(e) => io_reply(&e, arg),
                }
            }
            Err(e) => e,
        }
    }
}

pub(super) fn known(verb: &str) -> bool {
    matches!(
        verb,
        "CWD"
            | "XCWD"
            | "CDUP"
            | "XCUP"
            | "PWD"
            | "XPWD"
            | "LIST"
            | "NLST"
            | "MLSD"
            | "RETR"
            | "STOR"
            | "DELE"
            | "MKD"
            | "XMKD"
            | "RMD"
            | "XRMD"
            | "RNFR"
            | "RNTO"
            | "TYPE"
            | "MODE"
            | "STRU"
            | "PORT"
            | "PASV"
            | "EPRT"
            | "EPSV"
            | "SIZE"
            | "MDTM"
            | "REST"
            | "HASH"
            | "RADR"
            | "RSTR"
            | "RRTR"
            | "ALLO"
            | "ABOR"
    )
}
