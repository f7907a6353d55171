//! # rhttp: the client side of mod_rdma's HTTP-over-RDMA protocol
//!
//! The wire protocol is specified in `docs/MOD_RDMA.md`. It has two parts:
//!
//! - [`header`]: the `RDMA:` HTTP header (request and response forms), in
//!   the grammar of the mod_rdma paper's Figure 1:
//!   `RDMA: server-writes, ip=127.0.0.1, port=4791, stag=0x1234, to=0x7f00, maxlen=1048576`.
//! - [`ctrl`]: the fixed 32-byte control messages (BUF, DONE, ABORT) that
//!   travel as RDMAP Sends on the RDMA connection.
//!
//! [`http`] is the small HTTP/1.1 client (keep-alive, Content-Length and
//! chunked bodies) that the `rhttp` binary drives; [`links`] finds the
//! objects a page links for `rhttp get -r` and normalizes URLs,
//! [`robots`] reads robots.txt (RFC 9309), and [`crawl`] decides what a
//! recursive fetch follows (depth, page requisites, no-parent, robots,
//! the visited set and `--max-files`), all without I/O. [`seal`] is the
//! format of RDMA bodies sealed under a TLS session (HTTPS).
#![deny(unsafe_code)]

pub mod crawl;
pub mod ctrl;
pub mod header;
pub mod http;
pub mod links;
pub mod robots;
pub mod seal;

/// The test vectors shared with mod_rdma's C codecs
/// (`testdata/rdma-vectors/`; format in its README.md).
#[cfg(test)]
pub(crate) mod vectors {
    /// Run `check(expected, input)` on every vector of `file` (blank lines
    /// and `#` comments skipped) and fail naming each vector it rejects.
    pub fn run(file: &str, mut check: impl FnMut(&str, &str) -> Result<(), String>) {
        let path = format!(
            "{}/../../testdata/rdma-vectors/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap();
        let mut count = 0;
        let mut failed = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            count += 1;
            let (want, input) = line.split_once(" |").expect("a \" |\" in every vector");
            if let Err(why) = check(want, input) {
                failed.push(format!("{file}:{}: {why}\n     input: {input}", n + 1));
            }
        }
        assert!(count > 0);
        assert!(
            failed.is_empty(),
            "{} of {count} vectors failed:\n{}",
            failed.len(),
            failed.join("\n")
        );
    }
}
