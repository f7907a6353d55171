//! rftp's configuration file (`rftp --config FILE`) and its environment
//! overrides, read through the loader every tool shares
//! ([`iwarp_conf::load`]).
//!
//! Precedence, highest first: **flags > environment > file > defaults**.
//! A variable `RFTP_SET_KEY=value` replaces the file's `key`
//! (`RFTP_SET_STREAMS=8`, `RFTP_SET_CHECKSUM=blake3`); rftpd's are
//! `RFTPD_SET_KEY` ([`crate::server::ServerConfig::load`]). The `_SET_`
//! keeps them apart from the variables the tools and their tests already
//! read (`RFTPD_CONFINE_FALLBACK`, `RFTP_BIG`, ...), since a misspelt
//! `RFTP_SET_` variable is refused rather than ignored.
//!
//! Every value is checked here, when the file is read, so that a bad one
//! is reported with where it comes from (`FILE:LINE` or the variable),
//! its key and the fix, before anything connects.

use std::ffi::OsString;
use std::path::Path;

use serde::de::{Deserializer, Error as _};
use serde::Deserialize;

use crate::checksum::Choice;

/// The prefix of rftp's environment overrides: `RFTP_SET_KEY=value`.
pub const RFTP_ENV_PREFIX: &str = "RFTP_SET";

/// The prefix of rftpd's environment overrides: `RFTPD_SET_KEY=value`.
pub const RFTPD_ENV_PREFIX: &str = "RFTPD_SET";

/// rftp's settings from its configuration file and the environment; each
/// is the default of the flag of the same name (docs/RFTP.md, `rftp
/// --help`). Unset: the flag's own default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientConfig {
    /// `--streams`: a number (1 or more) or `"auto"`.
    pub streams: Option<Knob>,
    /// `--block-size`: bytes, or text such as `"1M"`.
    #[serde(default, deserialize_with = "block_size")]
    pub block_size: Option<u32>,
    /// `--iodepth`: a number (1 or more) or `"auto"`.
    pub iodepth: Option<Knob>,
    /// `--max-window`: bytes, or text such as `"64M"`.
    #[serde(default, deserialize_with = "iwarp_conf::de::opt_size")]
    pub max_window: Option<u64>,
    /// `--retry`.
    pub retry: Option<u32>,
    /// `--congestion`.
    pub congestion: Option<String>,
    /// The login when the URL has none.
    pub user: Option<String>,
    /// The password of `user`.
    pub password: Option<String>,
    /// `--timeout`, in seconds.
    pub timeout_secs: Option<u64>,
    /// `--crc`.
    pub crc: Option<bool>,
    /// `--checksum`: `auto` or an algorithm.
    #[serde(default, deserialize_with = "checksum")]
    pub checksum: Option<Choice>,
    /// `--device`.
    pub device: Option<String>,
    /// `--allow-foreign-data-addr`.
    pub allow_foreign_data_addr: Option<bool>,
}

impl ClientConfig {
    /// Reads `path` (none: the environment only) with the process's
    /// `RFTP_SET_*` variables over it.
    pub fn load(path: Option<&Path>) -> Result<ClientConfig, String> {
        Self::load_from(path, std::env::vars_os())
    }

    /// [`ClientConfig::load`] with the environment given (tests).
    pub fn load_from(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Result<ClientConfig, String> {
        iwarp_conf::load_from(path, RFTP_ENV_PREFIX, env)
    }
}

/// A setting that is a number or `auto` (in the config file: `8` or
/// `"auto"`; in the environment: `8` or `auto`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Knob {
    /// A number, 1 or more (checked when read).
    N(u32),
    /// `auto`, or a number written as text (a flag's value).
    Word(String),
}

impl Knob {
    /// The number, or 0 for auto; `what` names the setting in the error.
    pub fn value(&self, what: &str) -> Result<u32, String> {
        match self {
            Knob::N(0) => Err(format!("{what} must be at least 1, or auto")),
            Knob::N(n) => Ok(*n),
            Knob::Word(w) if w.eq_ignore_ascii_case("auto") => Ok(0),
            Knob::Word(w) => match w.parse::<u32>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!("{what} {w:?}: give a number (1 or more) or auto")),
            },
        }
    }
}

impl<'de> Deserialize<'de> for Knob {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Knob, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u32),
            Word(String),
        }
        let k = match Raw::deserialize(d) {
            Ok(Raw::N(n)) => Knob::N(n),
            Ok(Raw::Word(w)) => Knob::Word(w),
            Err(_) => {
                return Err(D::Error::custom(format!(
                    "expected a number or auto (fix: {KNOB_FIX})"
                )))
            }
        };
        k.value("the value")
            .map_err(|e| D::Error::custom(format!("{e} (fix: {KNOB_FIX})")))?;
        Ok(k)
    }
}

const KNOB_FIX: &str = "give a number, 1 or more, or \"auto\"";

fn block_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    let n = iwarp_conf::de::size(d)?;
    u32::try_from(n).map(Some).map_err(|_| {
        D::Error::custom(format!(
            "block size {n} is over 4 GiB (fix: give a block size such as 1M)"
        ))
    })
}

fn checksum<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Choice>, D::Error> {
    let s = String::deserialize(d)?;
    s.parse()
        .map(Some)
        .map_err(|e: String| D::Error::custom(format!("{e} (fix: give one of those names)")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::Algo;

    fn env(v: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        v.iter().map(|(k, v)| (k.into(), v.into())).collect()
    }

    fn load(text: &str, vars: &[(&str, &str)]) -> Result<ClientConfig, String> {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("rftp.toml");
        std::fs::write(&f, text).unwrap();
        ClientConfig::load_from(Some(&f), env(vars))
            .map_err(|e| e.replace(&f.display().to_string(), "FILE"))
    }

    const FILE: &str = "streams = 8\nblock_size = \"256K\"\niodepth = \"auto\"\n\
                        max_window = \"64M\"\nretry = 3\nuser = \"ann\"\nchecksum = \"sha256\"\n";

    #[test]
    fn every_key_is_read_and_the_environment_overrides_it() {
        let c = load(FILE, &[]).unwrap();
        assert_eq!(c.streams, Some(Knob::N(8)));
        assert_eq!(c.block_size, Some(256 << 10));
        assert_eq!(c.iodepth, Some(Knob::Word("auto".into())));
        assert_eq!(c.max_window, Some(64 << 20));
        assert_eq!(c.retry, Some(3));
        assert_eq!(c.checksum, Some(Choice::Only(Algo::Sha256)));
        let c = load(
            FILE,
            &[
                ("RFTP_SET_STREAMS", "auto"),
                ("RFTP_SET_BLOCK_SIZE", "1M"),
                ("RFTP_SET_MAX_WINDOW", "4096"),
                ("RFTP_SET_CHECKSUM", "blake3"),
                ("RFTP_SET_CRC", "true"),
                ("RFTP_SET_DEVICE", "soft"),
                ("RFTPD_SET_MAX_STREAMS", "1"), // rftpd's, not rftp's
                ("RFTP_BIG", "1"),              // a test's, not a setting
            ],
        )
        .unwrap();
        assert_eq!(c.streams, Some(Knob::Word("auto".into())));
        assert_eq!(c.block_size, Some(1 << 20));
        assert_eq!(c.max_window, Some(4096));
        assert_eq!(c.checksum, Some(Choice::Only(Algo::Blake3)));
        assert_eq!((c.crc, c.device.as_deref()), (Some(true), Some("soft")));
        assert_eq!(c.retry, Some(3), "what the variables leave is the file's");
        assert_eq!(c.user.as_deref(), Some("ann"));
        // No file: the variables over the defaults.
        let c: ClientConfig =
            ClientConfig::load_from(None, env(&[("RFTP_SET_RETRY", "2")])).unwrap();
        assert_eq!((c.retry, c.streams), (Some(2), None));
    }

    #[test]
    fn a_bad_key_or_value_names_its_line_or_variable_and_the_fix() {
        let e = load("streams = 8\n\nstreems = 4\n", &[]).unwrap_err();
        assert!(e.starts_with("FILE:3: key `streems`: unknown field"), "{e}");
        assert!(e.contains("correct its spelling"), "{e}");
        let e = load(FILE, &[("RFTP_SET_STREEMS", "4")]).unwrap_err();
        assert!(
            e.starts_with("environment RFTP_SET_STREEMS=\"4\": key `streems`: unknown field"),
            "{e}"
        );
        for (text, line, key, fix) in [
            ("streams = 0\n", 1, "streams", "1 or more, or \"auto\""),
            ("x = 1\n", 1, "x", "correct its spelling"),
            (
                "\niodepth = \"lots\"\n",
                2,
                "iodepth",
                "1 or more, or \"auto\"",
            ),
            ("block_size = \"1.5M\"\n", 1, "block_size", "such as 64M"),
            ("block_size = \"8G\"\n", 1, "block_size", "such as 1M"),
            ("checksum = \"md5\"\n", 1, "checksum", "one of those names"),
            ("retry = \"3\"\n", 1, "retry", "expected type"),
        ] {
            let e = load(text, &[]).unwrap_err();
            assert!(e.starts_with(&format!("FILE:{line}: key `{key}`:")), "{e}");
            assert!(e.contains(fix), "{e}");
        }
        let e = load("", &[("RFTP_SET_STREAMS", "0")]).unwrap_err();
        assert!(
            e.starts_with("environment RFTP_SET_STREAMS=\"0\": key `streams`:"),
            "{e}"
        );
        assert!(e.contains("or unset RFTP_SET_STREAMS"), "{e}");
    }
}
