//! Command-line pieces shared by `iwarp-ping` and `iwarp-demo`.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use clap::ValueEnum;
use iwarp_proto::handshake::{MpaConfig, Policy, Rtr};

/// An MPA feature policy on the command line (RFC 5044 §7.1 C and M flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// Insist on the feature; refuse a peer that does not use it.
    #[value(alias = "on")]
    Required,
    /// Use the feature if the peer asks for it.
    Optional,
    /// Never use the feature; refuse a peer that insists on it.
    Off,
}

impl From<PolicyArg> for Policy {
    fn from(p: PolicyArg) -> Policy {
        match p {
            PolicyArg::Required => Policy::Required,
            PolicyArg::Optional => Policy::Optional,
            PolicyArg::Off => Policy::Off,
        }
    }
}

impl std::fmt::Display for PolicyArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PolicyArg::Required => "required",
            PolicyArg::Optional => "optional",
            PolicyArg::Off => "off",
        })
    }
}

/// The RFC 6581 ready-to-receive message to request (peer-to-peer mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RtrArg {
    /// A zero-length RDMA Write (what siw prefers).
    Write,
    /// A zero-length RDMA Read.
    Read,
}

impl From<RtrArg> for Rtr {
    fn from(r: RtrArg) -> Rtr {
        match r {
            RtrArg::Write => Rtr::ZeroLengthWrite,
            RtrArg::Read => Rtr::ZeroLengthRead,
        }
    }
}

/// The MPA configuration for the given CRC and marker policies; everything
/// else (revision 2, IRD/ORD, no RTR) as the stack's default, which is what
/// siw negotiates with rping.
pub fn mpa_config(crc: PolicyArg, markers: PolicyArg) -> MpaConfig {
    MpaConfig {
        crc: crc.into(),
        markers: markers.into(),
        ..MpaConfig::default()
    }
}

/// The device `--device` chose for this process (unset: `IWARP_DEVICE`,
/// else `soft`).
static DEVICE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// `--device NAME`: use `NAME` (`soft`, `auto`, or a kernel RDMA device
/// such as `siw0`) for every context and listener of this process. Opens
/// it once to fail at start with the reason and the fix; returns the name
/// of the device actually opened (what `auto` picked).
pub fn set_device(name: &str) -> Result<String, String> {
    let ctx = iwarp::Context::open_device(name).map_err(|e| format!("--device {name}: {e}"))?;
    let _ = DEVICE.set(name.to_string());
    Ok(ctx.device_name().to_string())
}

/// Open the device of this process: `--device` if given, else
/// `IWARP_DEVICE`, else `soft`.
pub fn open_context() -> Result<iwarp::Context, iwarp::Error> {
    match DEVICE.get() {
        Some(d) => iwarp::Context::open_device(d),
        None => iwarp::Context::open(),
    }
}

/// Resolve `host` (a name or an address) and `port` to one socket address,
/// preferring IPv4 like rping's default.
pub fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host:?}: {e} - invalid hostname or IP address"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("{host:?} resolves to no address"))
}

/// Parse a timeout in seconds (fractions allowed, > 0).
pub fn parse_secs(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(v > 0.0 && v <= 86_400.0) {
        return Err(format!("{s} s is out of range (0 < timeout <= 86400)"));
    }
    Ok(Duration::from_secs_f64(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_numeric_addresses() {
        assert_eq!(
            resolve("127.0.0.1", 7174).unwrap(),
            "127.0.0.1:7174".parse().unwrap()
        );
        assert_eq!(resolve("::1", 1).unwrap(), "[::1]:1".parse().unwrap());
        assert!(resolve("no such host.invalid", 1).is_err());
    }

    #[test]
    fn device_errors_name_the_fix() {
        let has_rdma = std::fs::read_dir("/sys/class/infiniband")
            .map(|mut d| d.next().is_some())
            .unwrap_or(false);
        if !has_rdma {
            let e = set_device("siw0").unwrap_err();
            assert!(
                e.contains("--device siw0") && e.contains("--device soft"),
                "{e}"
            );
        }
        let e = set_device("no/such").unwrap_err();
        assert!(e.contains("invalid device name"), "{e}");
        assert_eq!(set_device("soft").unwrap(), "soft");
        assert_eq!(open_context().unwrap().device_name(), "soft");
    }

    #[test]
    fn parses_timeouts() {
        assert_eq!(parse_secs("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_secs("0").is_err());
        assert!(parse_secs("-3").is_err());
        assert!(parse_secs("x").is_err());
    }
}
