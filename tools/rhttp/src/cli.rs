//! rhttp's command line: the options every command shares ([`Args`]), the
//! commands ([`Cmd`]) and the parsers of their values. Nothing here does
//! I/O; `main` reads it once and hands it on.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use iwarp::cm::{CongestionControl, Policy};

/// HTTP client that moves request and response bodies by RDMA (software
/// iWARP) to and from an Apache httpd running mod_rdma. The client listens
/// for the server's RDMA connection on the local address of its HTTP
/// connection; one RDMA connection serves all requests of one keep-alive
/// HTTP connection. Without an RDMA answer it falls back to plain HTTP.
#[derive(Parser, Debug)]
#[command(version, about)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
    /// Plain HTTP only (no RDMA header): the baseline.
    #[arg(long, global = true)]
    pub(crate) plain: bool,
    /// Largest body moved by RDMA (the advertised maxlen and the size of
    /// the receive buffer), e.g. 256M [default: 256M on soft, 32M on a
    /// kernel device, where registering the buffer pins all of it].
    #[arg(long, global = true, value_parser = parse_size)]
    pub(crate) max_len: Option<u64>,
    /// Bound on every network wait, in seconds.
    #[arg(long, global = true, default_value_t = 30)]
    pub(crate) timeout: u64,
    /// No progress bar.
    #[arg(short, long, global = true)]
    pub(crate) quiet: bool,
    /// MPA CRC32C on the RDMA connection (RFC 5044 §4.4): `required` (the
    /// default: a byte corrupted on the way, e.g. by a faulty middlebox,
    /// ends the transfer with an error instead of reaching the body; the
    /// server uses CRC because our MPA Reply enables it), `optional` (only
    /// if the server asks), or `off`.
    #[arg(long, global = true, value_enum, default_value_t = CrcArg::Required)]
    pub(crate) crc: CrcArg,
    /// RDMA device: soft (software iWARP over TCP), auto (a kernel RDMA
    /// device if there is one, else soft), or a kernel device as
    /// `ibv_devices` lists it (siw0, rxe0, mlx5_0). Default: the
    /// IWARP_DEVICE environment variable, else soft. (`--crc` applies to
    /// soft only: a kernel device's MPA follows its own settings.)
    #[arg(long, global = true, value_name = "NAME")]
    pub(crate) device: Option<String>,
    /// TCP congestion control of this client's connections (tcp(7)
    /// TCP_CONGESTION): reno, cubic, bbr, ... as
    /// /proc/sys/net/ipv4/tcp_available_congestion_control lists them.
    /// It governs what this client sends (uploads; the RDMA Read
    /// Responses of server-reads); what the server sends (GET bodies)
    /// follows the server's choice, mod_rdma's `RDMACongestion`.
    /// [default: the kernel's default]
    #[arg(long, global = true, value_name = "ALGO")]
    pub(crate) congestion: Option<CongestionControl>,
    /// https:// URLs: trust the CA certificate(s) (or the server's own
    /// certificate) in this PEM file instead of the system's
    /// (/etc/ssl/certs/ca-certificates.crt).
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) cacert: Option<PathBuf>,
    /// https:// URLs: do not check the server's certificate (curl -k). The
    /// connection is encrypted, but anyone on the path could pose as the
    /// server; RDMA bodies are still sealed under that TLS session.
    #[arg(short = 'k', long, global = true)]
    pub(crate) insecure: bool,
}

/// `--crc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum CrcArg {
    Required,
    Optional,
    Off,
}

impl From<CrcArg> for Policy {
    fn from(c: CrcArg) -> Policy {
        match c {
            CrcArg::Required => Policy::Required,
            CrcArg::Optional => Policy::Optional,
            CrcArg::Off => Policy::Off,
        }
    }
}

#[derive(Subcommand, Debug)]
pub(crate) enum Cmd {
    /// Fetch URLs over one keep-alive connection per host.
    Get {
        /// http:// or https:// URLs (all of one scheme). Over https the
        /// RDMA body is sealed under the TLS session (AES-256-GCM, the key
        /// from the TLS exporter; docs/MOD_RDMA.md, "HTTPS"); -r and -p
        /// take http:// only, and https fetches one request at a time.
        #[arg(required = true)]
        urls: Vec<String>,
        /// Recursive, like `wget -r`: fetch each URL, then what its pages
        /// link (`<a href>`, `<img src>`, `<link href>`, `<script src>`,
        /// `<iframe>`, ...) down to --level, breadth first, on the same
        /// host and port only (never another host), each URL once, over
        /// the same HTTP connection and its one RDMA connection; honours
        /// robots.txt; saves under -P DIR/HOST[:PORT]/PATH.
        #[arg(short, long)]
        recursive: bool,
        /// -r's depth: 1 is the pages and what they link; `inf` (or 0) no
        /// limit but --max-files [default: 5, as wget].
        #[arg(short = 'l', long, value_name = "N", value_parser = parse_level)]
        level: Option<Level>,
        /// Also fetch what each page needs to be shown (`<img src>`,
        /// `<link rel=stylesheet|icon>`, `<script src>`, ...), even past
        /// --level and, with --no-parent, outside the directory; without
        /// -r: the given pages and their requisites (`wget -p`).
        #[arg(short = 'p', long)]
        page_requisites: bool,
        /// Never go above the starting URLs' directories (`wget -np`).
        #[arg(long)]
        no_parent: bool,
        /// No HOST[:PORT] directory under -P (`wget -nH`).
        #[arg(long)]
        no_host_directories: bool,
        /// `-nH` (= --no-host-directories) and `-np` (= --no-parent), as
        /// wget spells them.
        #[arg(short = 'n', value_name = "H|p", value_parser = ["H", "p"])]
        no: Vec<String>,
        /// wget's `-e robots=off`: do not read or honour robots.txt (RFC
        /// 9309); `robots=on` is the default.
        #[arg(short = 'e', long, value_name = "robots=on|off", value_parser = parse_execute)]
        execute: Vec<bool>,
        /// -r/-p: queue at most this many URLs (a bound on a hostile
        /// server's pages: a million links, a link loop).
        #[arg(long, value_name = "N", default_value_t = 10_000,
              value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
        max_files: u64,
        /// Where -r and -p save (like wget's --directory-prefix).
        #[arg(short = 'P', long, default_value = ".", value_name = "DIR")]
        directory_prefix: PathBuf,
        /// Requests in flight on the HTTP connection (HTTP/1.1 pipelining;
        /// 1 = one at a time, at most 8): saves a round trip per object on a
        /// long path. Each server-writes request in flight has its own
        /// --max-len slot of the receive buffer (a mapping: unused pages
        /// cost nothing on the software device; a kernel device pins them).
        /// [default: 8 with -r, else 1]
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=8))]
        pipeline: Option<u64>,
        /// Print a summary at the end: requests, bodies moved by RDMA,
        /// bytes, HTTP and RDMA connections made, total time.
        #[arg(long)]
        stats: bool,
        /// Output file for each URL in order ("-" for stdout); URLs without
        /// one are saved under their last path segment.
        #[arg(short, long)]
        output: Vec<PathBuf>,
        /// Who moves the body.
        #[arg(long, value_enum, default_value_t = GetScheme::ServerWrites)]
        scheme: GetScheme,
        /// Test hook: with client-reads, print the advertised STag and wait
        /// this long before the RDMA Read.
        #[arg(long, hide = true, default_value_t = 0)]
        x_hold_ms: u64,
        /// Test hook: after sending a request that needs a new RDMA
        /// connection, wait until the server's connection waits in the
        /// listener (the server has stat'ed the file and waits in its
        /// connect), print a line, and accept it only after a line on
        /// standard input or its end (a test changes the file on the
        /// server meanwhile).
        #[arg(long, hide = true)]
        x_hold_accept: bool,
        /// Test hook: after this many GETs, close the RDMA connection (the
        /// HTTP connection stays open): the server must notice and connect
        /// again for the next request.
        #[arg(long, hide = true)]
        x_drop_rdma_after: Option<usize>,
        /// Test hook: before sending each RDMA request, print the RDMA
        /// listener's address and wait for a line on standard input (a
        /// test connects an impostor to the listener meanwhile).
        #[arg(long, hide = true)]
        x_pause_before_request: bool,
        /// Test hook: over https, flip one byte of each sealed RDMA body
        /// as received, before it is checked (the check must refuse it).
        #[arg(long, hide = true)]
        x_tamper_sealed: bool,
    },
    /// Upload FILE to URL with PUT (or POST).
    Put {
        file: PathBuf,
        url: String,
        /// Send the body with POST instead of PUT.
        #[arg(long)]
        post: bool,
        /// Who moves the body.
        #[arg(long, value_enum, default_value_t = PutScheme::ServerReads)]
        scheme: PutScheme,
        /// Save the response body here ("-" for stdout).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Test hook: with client-writes, answer the Nth BUF with ABORT.
        #[arg(long, hide = true)]
        x_abort_at_buf: Option<u32>,
        /// Test hook: with server-reads, advertise a wrong STag.
        #[arg(long, hide = true)]
        x_bad_stag: bool,
    },
    /// Test hook: fetch URL with client-reads, then try an RDMA Read of the
    /// given STag (default: the STag of that fetch, after DONE) on this
    /// connection. Exits 0 if the server refused the access.
    #[command(hide = true)]
    ProbeStag {
        url: String,
        #[arg(long, value_parser = parse_u64)]
        stag: Option<u64>,
        #[arg(long, value_parser = parse_u64)]
        to: Option<u64>,
        #[arg(long, default_value_t = 4096)]
        len: u32,
        /// Instead: before DONE, Read one byte more than the server granted.
        #[arg(long)]
        beyond: bool,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum GetScheme {
    ServerWrites,
    ClientReads,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum PutScheme {
    ServerReads,
    ClientWrites,
}

pub(crate) fn parse_u64(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("{s:?} is not a number"))
}

/// `--level`: the deepest level, `None` for no limit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Level(pub(crate) Option<u32>);

/// `--level`: a depth, or `inf`/0 for none (wget's `-l inf`, `-l 0`).
pub(crate) fn parse_level(s: &str) -> Result<Level, String> {
    if s.eq_ignore_ascii_case("inf") {
        return Ok(Level(None));
    }
    match s.parse::<u32>() {
        Ok(0) => Ok(Level(None)),
        Ok(n) => Ok(Level(Some(n))),
        Err(_) => Err(format!("{s:?} is not a depth (a number, or inf)")),
    }
}

/// `-e robots=on|off`, the one wgetrc command rhttp knows.
pub(crate) fn parse_execute(s: &str) -> Result<bool, String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: -e takes robots=on or robots=off"))?;
    if !k.trim().eq_ignore_ascii_case("robots") {
        return Err(format!("{s:?}: rhttp's -e knows only robots=on|off"));
    }
    match v.trim().to_ascii_lowercase().as_str() {
        "on" | "1" | "yes" => Ok(true),
        "off" | "0" | "no" => Ok(false),
        _ => Err(format!("{s:?}: robots= takes on or off")),
    }
}

/// `--max-len`: a size as every tool writes it (crates/iwarp-conf), not 0.
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    match iwarp_conf::parse_size(s)? {
        0 => Err(format!(
            "{s:?}: --max-len must be above 0, e.g. 64K or 256M"
        )),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn max_len_takes_the_shared_size_forms_and_refuses_zero() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert!(parse_size("0")
            .unwrap_err()
            .contains("--max-len must be above 0"));
        assert!(parse_size("1.5M").unwrap_err().contains("invalid size"));
    }
}
