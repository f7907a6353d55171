//! A small HTTP/1.1 client: one keep-alive connection, requests with
//! extra headers, responses with Content-Length, chunked or
//! read-to-close bodies.
//!
//! The response parser ([`read_head_from`], [`read_body_from`]) works on
//! any [`BufRead`], so it is fuzzed on byte slices
//! (`fuzz/fuzz_targets/rhttp_response.rs`). It treats the server as
//! untrusted: bounded lines, heads, header counts and interim responses
//! (a server that sends without end gets an error, not our memory), and
//! the message framing of RFC 9112 §6.3 with its ambiguities refused
//! (differing Content-Length values, a malformed one, whitespace before a
//! field's colon), since a client that frames a response differently from
//! the server it talks through reads the wrong bytes as the next response.

use std::cell::RefCell;
use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

/// `http://host[:port]/path` (`https://` URLs through [`Url::parse_any`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub host: String,
    pub port: u16,
    pub path: String,
}

impl Url {
    /// Parse an `http://` URL.
    pub fn parse(s: &str) -> Result<Url, String> {
        let rest = s
            .strip_prefix("http://")
            .ok_or_else(|| format!("{s:?}: only http:// URLs are supported"))?;
        Self::parse_rest(s, rest, 80)
    }

    /// Parse an `http://` or `https://` URL; true for https (default port
    /// 443).
    pub fn parse_any(s: &str) -> Result<(Url, bool), String> {
        match s.strip_prefix("https://") {
            Some(rest) => Ok((Self::parse_rest(s, rest, 443)?, true)),
            None => Ok((
                Self::parse(s)
                    .map_err(|_| format!("{s:?}: only http:// and https:// URLs are supported"))?,
                false,
            )),
        }
    }

    fn parse_rest(s: &str, rest: &str, default_port: u16) -> Result<Url, String> {
        let (hostport, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if hostport.is_empty() {
            return Err(format!("{s:?}: the URL has no host"));
        }
        let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
            let (h, p) = h
                .split_once(']')
                .ok_or_else(|| format!("{s:?}: unclosed '[' in the host"))?;
            (h.to_string(), p.strip_prefix(':').unwrap_or(""))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p),
                None => (hostport.to_string(), ""),
            }
        };
        let port = if port.is_empty() {
            default_port
        } else {
            port.parse::<u16>()
                .map_err(|_| format!("{s:?}: bad port {port:?}"))?
        };
        Ok(Url {
            host,
            port,
            path: path.to_string(),
        })
    }

    /// The `Host:` header value.
    pub fn host_header(&self) -> String {
        let h = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == 80 {
            h
        } else {
            format!("{h}:{}", self.port)
        }
    }

    /// The last path segment, for a default output file name.
    pub fn file_name(&self) -> String {
        let p = self.path.split('?').next().unwrap_or("");
        match p.rsplit('/').next() {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => "index.html".to_string(),
        }
    }
}

/// A response's status line and headers.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub reason: String,
    pub headers: Vec<(String, String)>,
    /// HTTP/1.0 response or `Connection: close`.
    pub close: bool,
}

impl Response {
    /// The first header of that name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// How the body of this response is delimited (RFC 9112 §6.3), for a
    /// request that was not HEAD.
    pub fn framing(&self) -> io::Result<Framing> {
        // §6.3 (1): 1xx, 204 and 304 have no body.
        if (100..200).contains(&self.status) || self.status == 204 || self.status == 304 {
            return Ok(Framing::Empty);
        }
        // §6.3 (3): Transfer-Encoding overrides Content-Length; chunked
        // must be the final coding, otherwise the body runs to the close
        // (§6.3 (4), for a response).
        let te: Vec<&str> = self
            .headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("Transfer-Encoding"))
            .flat_map(|(_, v)| v.split(','))
            .map(|c| c.trim())
            .filter(|c| !c.is_empty())
            .collect();
        if let Some(last) = te.last() {
            return Ok(if last.eq_ignore_ascii_case("chunked") {
                Framing::Chunked
            } else {
                Framing::UntilClose
            });
        }
        // §6.3 (5): several Content-Length values that differ, or one that
        // is not 1*DIGIT, are an unrecoverable error.
        let mut len = None;
        for (_, v) in self
            .headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("Content-Length"))
        {
            let n = parse_digits(v)
                .ok_or_else(|| invalid(format!("bad Content-Length {v:?} in the response")))?;
            if len.is_some_and(|l| l != n) {
                return Err(invalid(format!(
                    "the response carries two different Content-Length values ({} and {n})",
                    len.unwrap_or(0)
                )));
            }
            len = Some(n);
        }
        Ok(match len {
            Some(n) => Framing::Length(n),
            None => Framing::UntilClose,
        })
    }
}

/// How a response body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (1xx, 204, 304, a HEAD request).
    Empty,
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// `Content-Length` bytes.
    Length(u64),
    /// Until the server closes the connection.
    UntilClose,
}

/// `1*DIGIT` (no sign, no spaces inside) as a u64.
fn parse_digits(v: &str) -> Option<u64> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

impl fmt::Display for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status, self.reason)
    }
}

/// The byte stream of an HTTP connection: plain TCP, or TLS over it.
#[derive(Debug)]
pub enum Stream {
    Plain(TcpStream),
    Tls {
        /// In a cell so that [`Conn::answer_ready`] can take in TLS
        /// records while the connection is only shared (polled).
        tls: Box<RefCell<StreamOwned<ClientConnection, TcpStream>>>,
        /// The same socket (a dup), for polling and socket options.
        sock: TcpStream,
    },
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls { tls, .. } => tls.get_mut().read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls { tls, .. } => tls.get_mut().write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls { tls, .. } => tls.get_mut().flush(),
        }
    }
}

/// The Debian/Ubuntu system trust store (ca-certificates).
pub const SYSTEM_CA_FILE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The TLS client configuration of `https://` URLs: rustls with the ring
/// provider, TLS 1.2 and 1.3, ALPN `http/1.1`. Trust: the PEM
/// certificates of `cacert`, else [`SYSTEM_CA_FILE`]; `insecure` checks no
/// certificate at all (curl's `-k`; the session is still encrypted, but
/// anyone on the path could be the server).
pub fn tls_config(cacert: Option<&Path>, insecure: bool) -> Result<Arc<ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS set-up: {e}"))?;
    let mut config = if insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
            .with_no_client_auth()
    } else {
        let path = cacert.unwrap_or(Path::new(SYSTEM_CA_FILE));
        let fix = if cacert.is_some() {
            "Fix: give --cacert a PEM file of the server's certificate or its CA"
        } else {
            "Fix: install ca-certificates, or give --cacert FILE (PEM), or --insecure"
        };
        let mut roots = RootCertStore::empty();
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .map_err(|e| {
                format!(
                    "reading CA certificates from {}: {e}. {fix}",
                    path.display()
                )
            })?
            .collect::<Result<_, _>>()
            .map_err(|e| format!("parsing CA certificates in {}: {e}. {fix}", path.display()))?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(format!(
                "{} holds no usable CA certificate. {fix}",
                path.display()
            ));
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// `--insecure`: accepts any certificate, but still checks that the
/// handshake's signatures are made by the certificate's key (so the TLS
/// session is a session with whoever holds it).
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// One HTTP connection.
#[derive(Debug)]
pub struct Conn {
    reader: BufReader<Stream>,
    pub peer: SocketAddr,
    pub local: SocketAddr,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

impl Conn {
    /// Connect to the URL's host and port; with `tls`, then make the TLS
    /// handshake (SNI: the URL's host name; an IP literal is checked
    /// against the certificate's IP addresses and sends no SNI, RFC 6066
    /// §3), so a certificate problem is reported here.
    pub fn connect_tls(url: &Url, timeout: Duration, tls: Arc<ClientConfig>) -> io::Result<Conn> {
        let Conn {
            reader,
            peer,
            local,
        } = Self::connect(url, timeout)?;
        let name = ServerName::try_from(url.host.clone()).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{:?} is not a TLS server name: {e}", url.host),
            )
        })?;
        let conn = ClientConnection::new(tls, name).map_err(io::Error::other)?;
        // Nothing was read yet, so the buffer is empty.
        let Stream::Plain(sock) = reader.into_inner() else {
            unreachable!("connect makes plain streams")
        };
        let dup = sock.try_clone()?;
        let mut t = StreamOwned::new(conn, sock);
        while t.conn.is_handshaking() {
            t.conn.complete_io(&mut t.sock).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("TLS handshake with {}: {e}", url.host_header()),
                )
            })?;
        }
        let stream = Stream::Tls {
            tls: Box::new(RefCell::new(t)),
            sock: dup,
        };
        Ok(Conn {
            reader: BufReader::with_capacity(64 * 1024, stream),
            peer,
            local,
        })
    }

    /// Whether this connection is TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self.reader.get_ref(), Stream::Tls { .. })
    }

    /// The socket became readable: is that the answer? Plain HTTP: yes.
    /// TLS: only if the records that came hold response bytes (or the
    /// stream ended or failed, which a read then reports); TLS 1.3 servers
    /// send NewSessionTicket messages after the handshake, which make the
    /// socket readable with no answer in them, and a client that took
    /// them for its answer would stop serving the RDMA connection the
    /// server is opening and block in its read. Call only after poll(2)
    /// said readable (one read(2), which then does not block).
    pub fn answer_ready(&self) -> bool {
        let Stream::Tls { tls, .. } = self.reader.get_ref() else {
            return true;
        };
        let mut t = tls.borrow_mut();
        let t = &mut *t;
        match t.conn.read_tls(&mut t.sock) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return true,
        }
        match t.conn.process_new_packets() {
            Ok(st) => st.plaintext_bytes_to_read() > 0 || st.peer_has_closed(),
            Err(_) => true,
        }
    }

    /// The TLS session's exporter (RFC 8446 §7.5, RFC 5705) with a
    /// context, into `out`.
    pub fn export_keying_material(
        &self,
        out: &mut [u8],
        label: &[u8],
        context: &[u8],
    ) -> io::Result<()> {
        match self.reader.get_ref() {
            Stream::Tls { tls, .. } => tls
                .borrow()
                .conn
                .export_keying_material(out, label, Some(context))
                .map(|_| ())
                .map_err(io::Error::other),
            Stream::Plain(_) => Err(io::Error::other("not a TLS connection: no exporter")),
        }
    }

    /// Connect to the URL's host and port.
    pub fn connect(url: &Url, timeout: Duration) -> io::Result<Conn> {
        let addrs: Vec<SocketAddr> = (url.host.as_str(), url.port).to_socket_addrs()?.collect();
        let mut last = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    s.set_read_timeout(Some(timeout))?;
                    s.set_write_timeout(Some(timeout))?;
                    let peer = s.peer_addr()?;
                    let local = s.local_addr()?;
                    return Ok(Conn {
                        reader: BufReader::with_capacity(64 * 1024, Stream::Plain(s)),
                        peer,
                        local,
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "the host name has no address")
        }))
    }

    /// The socket (for polling).
    pub fn stream(&self) -> &TcpStream {
        match self.reader.get_ref() {
            Stream::Plain(s) => s,
            Stream::Tls { sock, .. } => sock,
        }
    }

    /// True if response bytes are already buffered: in our buffer, or
    /// (TLS) decrypted in the TLS connection, where polling the socket
    /// would not see them (rustls' `wants_read` is false then; also after
    /// the server's close_notify, whose end of stream a read reports).
    pub fn has_buffered(&self) -> bool {
        !self.reader.buffer().is_empty()
            || matches!(self.reader.get_ref(), Stream::Tls { tls, .. } if !tls.borrow().conn.wants_read())
    }

    /// Send a request head (and `body`, if any).
    pub fn send_request(
        &mut self,
        method: &str,
        url: &Url,
        headers: &[(&str, String)],
        body: Option<&[u8]>,
    ) -> io::Result<()> {
        let mut req = format!(
            "{method} {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: rhttp/{}\r\n",
            url.path,
            url.host_header(),
            env!("CARGO_PKG_VERSION")
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        let s = self.reader.get_mut();
        s.write_all(req.as_bytes())?;
        if let Some(b) = body {
            s.write_all(b)?;
        }
        s.flush()
    }

    /// Write raw body bytes after [`send_request`](Self::send_request).
    pub fn write_body(&mut self, data: &[u8]) -> io::Result<()> {
        self.reader.get_mut().write_all(data)
    }

    /// Read a response's status line and headers (skipping 1xx); see
    /// [`read_head_from`].
    pub fn read_head(&mut self) -> io::Result<Response> {
        read_head_from(&mut self.reader)
    }

    /// Read the response body into `sink`, calling `progress` with the
    /// byte count so far; see [`read_body_from`].
    pub fn read_body(
        &mut self,
        resp: &Response,
        head_request: bool,
        sink: &mut dyn Write,
        progress: &mut dyn FnMut(u64),
    ) -> io::Result<u64> {
        read_body_from(&mut self.reader, resp, head_request, sink, progress)
    }
}

/// Longest line of a response head or of the chunk framing.
pub const MAX_LINE: usize = 16 * 1024;
/// Most bytes in one response head (status line and fields) or in one
/// chunked body's trailer section.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in one response head.
pub const MAX_FIELDS: usize = 128;
/// Most interim (1xx) responses before the final one.
pub const MAX_INTERIM: usize = 16;

/// Read one line (at most [`MAX_LINE`] bytes and what is left of
/// `budget`, which it reduces), without its CRLF or LF.
fn read_line_from<R: BufRead>(r: &mut R, budget: &mut usize) -> io::Result<String> {
    let limit = MAX_LINE.min(*budget);
    let mut line = Vec::new();
    let n = (&mut *r).take(limit as u64).read_until(b'\n', &mut line)?;
    *budget -= n;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the server closed the connection",
        ));
    }
    if line.last() != Some(&b'\n') {
        if n < limit {
            // read_until stopped short of the limit: end of stream.
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the server closed the connection after {n} bytes of a response line"),
            ));
        }
        return Err(invalid(if limit == MAX_LINE {
            "response line longer than 16 KiB".to_string()
        } else {
            format!("response head longer than {} KiB", MAX_HEAD / 1024)
        }));
    }
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    String::from_utf8(line).map_err(|_| invalid("response header is not UTF-8".into()))
}

/// Read header field lines up to the empty line (RFC 9112 §5), within
/// `budget` bytes and [`MAX_FIELDS`] fields.
fn read_fields<R: BufRead>(r: &mut R, budget: &mut usize) -> io::Result<Vec<(String, String)>> {
    let mut fields: Vec<(String, String)> = Vec::new();
    loop {
        let l = read_line_from(r, budget)?;
        if l.is_empty() {
            return Ok(fields);
        }
        if l.starts_with([' ', '\t']) {
            // RFC 9112 §5.2: a user agent replaces an obs-fold by SP.
            let (_, v) = fields
                .last_mut()
                .ok_or_else(|| invalid(format!("response head starts with a folded line {l:?}")))?;
            v.push(' ');
            v.push_str(l.trim_matches([' ', '\t']));
            continue;
        }
        let (k, v) = l
            .split_once(':')
            .ok_or_else(|| invalid(format!("response header line without a colon: {l:?}")))?;
        // RFC 9112 §5.1: no whitespace between the field name and the
        // colon; a name is a token.
        if k.is_empty() || !k.bytes().all(is_tchar) {
            return Err(invalid(format!("bad response header name {k:?}")));
        }
        if fields.len() == MAX_FIELDS {
            return Err(invalid(format!(
                "more than {MAX_FIELDS} header fields in the response"
            )));
        }
        fields.push((k.to_string(), v.trim_matches([' ', '\t']).to_string()));
    }
}

/// RFC 9110 §5.6.2 tchar.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Read a response's status line and headers, skipping interim (1xx)
/// responses (at most [`MAX_INTERIM`]).
pub fn read_head_from<R: BufRead>(r: &mut R) -> io::Result<Response> {
    for _ in 0..=MAX_INTERIM {
        let mut budget = MAX_HEAD;
        let status_line = read_line_from(r, &mut budget)?;
        // RFC 9112 §4: HTTP-version SP 3DIGIT SP [ reason-phrase ].
        let mut it = status_line.splitn(3, ' ');
        let version = it.next().unwrap_or("");
        if !matches!(version, "HTTP/1.0" | "HTTP/1.1") {
            return Err(invalid(format!("not an HTTP response: {status_line:?}")));
        }
        let code = it.next().unwrap_or("");
        let status = match code.as_bytes() {
            [a, b, c] if [a, b, c].iter().all(|d| d.is_ascii_digit()) => code
                .parse::<u16>()
                .map_err(|_| invalid(format!("bad status line {status_line:?}")))?,
            _ => return Err(invalid(format!("bad status line {status_line:?}"))),
        };
        // RFC 9110 §15: a status code is 100..=599.
        if !(100..600).contains(&status) {
            return Err(invalid(format!("bad status line {status_line:?}")));
        }
        let reason = it.next().unwrap_or("").to_string();
        let headers = read_fields(r, &mut budget)?;
        if (100..200).contains(&status) {
            continue;
        }
        let mut close = version == "HTTP/1.0";
        for (k, v) in &headers {
            if k.eq_ignore_ascii_case("Connection") {
                let v = v.to_ascii_lowercase();
                if v.contains("close") {
                    close = true;
                } else if v.contains("keep-alive") {
                    close = false;
                }
            }
        }
        let resp = Response {
            status,
            reason,
            headers,
            close,
        };
        // An ambiguous framing is an error now, before anything is read
        // as a body.
        resp.framing()?;
        return Ok(resp);
    }
    Err(invalid(format!(
        "more than {MAX_INTERIM} interim (1xx) responses"
    )))
}

/// Read the body of `resp` from `r` into `sink`, calling `progress` with
/// the byte count so far; `head_request`: the request was HEAD (no body).
pub fn read_body_from<R: BufRead>(
    r: &mut R,
    resp: &Response,
    head_request: bool,
    sink: &mut dyn Write,
    progress: &mut dyn FnMut(u64),
) -> io::Result<u64> {
    let framing = if head_request {
        Framing::Empty
    } else {
        resp.framing()?
    };
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    match framing {
        Framing::Empty => Ok(0),
        Framing::Chunked => loop {
            // RFC 9112 §7.1: chunk-size [ chunk-ext ] CRLF.
            let mut budget = MAX_LINE;
            let line = read_line_from(r, &mut budget)?;
            let size_str = line
                .split(';')
                .next()
                .unwrap_or("")
                .trim_end_matches([' ', '\t']);
            if size_str.is_empty() || !size_str.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid(format!("bad chunk size line {line:?}")));
            }
            let size = u64::from_str_radix(size_str, 16)
                .map_err(|_| invalid(format!("chunk size {size_str:?} out of range")))?;
            if size == 0 {
                // The trailer section ends with an empty line.
                let mut budget = MAX_HEAD;
                read_fields(r, &mut budget)?;
                return Ok(total);
            }
            let mut left = size;
            while left > 0 {
                let want = left.min(buf.len() as u64) as usize;
                let n = r.read(&mut buf[..want])?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the connection inside a chunk",
                    ));
                }
                sink.write_all(&buf[..n])?;
                left -= n as u64;
                total += n as u64;
                progress(total);
            }
            let mut budget = MAX_LINE;
            if !read_line_from(r, &mut budget)?.is_empty() {
                return Err(invalid("chunk not followed by CRLF".into()));
            }
        },
        Framing::Length(len) => {
            while total < len {
                let want = (len - total).min(buf.len() as u64) as usize;
                let n = r.read(&mut buf[..want])?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "the server closed the connection after {total} of {len} body bytes"
                        ),
                    ));
                }
                sink.write_all(&buf[..n])?;
                total += n as u64;
                progress(total);
            }
            Ok(total)
        }
        Framing::UntilClose => loop {
            let n = r.read(&mut buf)?;
            if n == 0 {
                return Ok(total);
            }
            sink.write_all(&buf[..n])?;
            total += n as u64;
            progress(total);
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn url_parsing() {
        let u = Url::parse("http://127.0.0.1:8080/a/b.bin").unwrap();
        assert_eq!(
            u,
            Url {
                host: "127.0.0.1".into(),
                port: 8080,
                path: "/a/b.bin".into()
            }
        );
        assert_eq!(u.file_name(), "b.bin");
        assert_eq!(u.host_header(), "127.0.0.1:8080");
        let u = Url::parse("http://[::1]/").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 80));
        assert_eq!(u.host_header(), "[::1]");
        assert_eq!(u.file_name(), "index.html");
        assert!(Url::parse("https://x/").is_err());
        let (u, tls) = Url::parse_any("https://example.org/a").unwrap();
        assert!(tls);
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("example.org", 443, "/a")
        );
        let (u, tls) = Url::parse_any("https://[::1]:8443").unwrap();
        assert!(tls);
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("::1", 8443, "/")
        );
        assert!(!Url::parse_any("http://x/").unwrap().1);
        assert!(Url::parse_any("ftp://x/").is_err());
        assert!(Url::parse("http://x:99999/").is_err());
        assert!(Url::parse("http:///x").is_err());
    }

    fn serve(bytes: &'static [u8]) -> Url {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut b = [0u8; 4096];
            let _ = s.read(&mut b);
            s.write_all(bytes).unwrap();
        });
        Url::parse(&format!("http://127.0.0.1:{port}/x")).unwrap()
    }

    fn fetch(bytes: &'static [u8]) -> io::Result<(Response, Vec<u8>)> {
        let url = serve(bytes);
        let mut c = Conn::connect(&url, Duration::from_secs(5))?;
        c.send_request("GET", &url, &[], None)?;
        let r = c.read_head()?;
        let mut body = Vec::new();
        c.read_body(&r, false, &mut body, &mut |_| {})?;
        Ok((r, body))
    }

    #[test]
    fn content_length_body() {
        let (r, b) =
            fetch(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nRDMA: x\r\n\r\nhelloEXTRA").unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.header("rdma"), Some("x"));
        assert!(!r.close);
        assert_eq!(b, b"hello");
    }

    #[test]
    fn chunked_body_and_continue() {
        let (r, b) = fetch(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.status, 201);
        assert_eq!(b, b"abcde");
    }

    /// Head and body of `bytes` as the parser reads them from a slice.
    fn parse(bytes: &[u8]) -> io::Result<(Response, Vec<u8>)> {
        let mut r = bytes;
        let resp = read_head_from(&mut r)?;
        let mut body = Vec::new();
        read_body_from(&mut r, &resp, false, &mut body, &mut |_| {})?;
        Ok((resp, body))
    }

    fn refused(bytes: &[u8], why: &str) {
        let e = parse(bytes).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(e.to_string().contains(why), "{e}");
    }

    #[test]
    fn framing_ambiguities_are_refused() {
        // RFC 9112 §6.3 (5): differing Content-Length values; one that is
        // not 1*DIGIT.
        refused(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
            "two different Content-Length",
        );
        refused(
            b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello",
            "bad Content-Length",
        );
        refused(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
            "bad Content-Length",
        );
        // The same value twice is one length.
        let (_, b) =
            parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\nhello")
                .unwrap();
        assert_eq!(b, b"hello");
        // RFC 9112 §5.1: whitespace before the colon.
        refused(
            b"HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\nhello",
            "bad response header name",
        );
        refused(
            b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
            "without a colon",
        );
        // RFC 9112 §4: three digits.
        refused(b"HTTP/1.1 +20 OK\r\n\r\n", "bad status line");
        refused(b"HTTP/1.1 2000 OK\r\n\r\n", "bad status line");
        refused(b"HTTP/1.1 004 OK\r\n\r\n", "bad status line");
        refused(b"HTTP/1.1 600 OK\r\n\r\n", "bad status line");
        refused(b"HTTP/2 200 OK\r\n\r\n", "not an HTTP response");
        // RFC 9112 §7.1: chunk-size = 1*HEXDIG.
        refused(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n+3\r\nabc\r\n0\r\n\r\n",
            "bad chunk size",
        );
        refused(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\n",
            "out of range",
        );
    }

    #[test]
    fn transfer_coding_decides_the_framing() {
        // chunked last: chunked, whatever Content-Length says (§6.3 (3)).
        let (r, b) = parse(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3 ; x=y\r\nabc\r\n0\r\nT: v\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.framing().unwrap(), Framing::Chunked);
        assert_eq!(b, b"abc");
        // chunked not last: to the close (§6.3 (4)).
        let (r, b) =
            parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nraw").unwrap();
        assert_eq!(r.framing().unwrap(), Framing::UntilClose);
        assert_eq!(b, b"raw");
        let (r, b) = parse(b"HTTP/1.1 204 No Content\r\nContent-Length: 3\r\n\r\nabc").unwrap();
        assert_eq!((r.framing().unwrap(), b.len()), (Framing::Empty, 0));
        // An obs-fold continues the previous field (RFC 9112 §5.2).
        let (r, _) =
            parse(b"HTTP/1.1 200 OK\r\nX-A: one\r\n  two\r\nContent-Length: 0\r\n\r\n").unwrap();
        assert_eq!(r.header("x-a"), Some("one two"));
    }

    #[test]
    fn a_server_that_never_ends_its_head_is_refused() {
        let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..=MAX_FIELDS {
            many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        refused(&many, "header fields");
        let mut big = b"HTTP/1.1 200 OK\r\n".to_vec();
        for _ in 0..10 {
            big.extend_from_slice(format!("X: {}\r\n", "v".repeat(10_000)).as_bytes());
        }
        refused(&big, "response head longer than 64 KiB");
        let interim = b"HTTP/1.1 100 Continue\r\n\r\n".repeat(MAX_INTERIM + 1);
        refused(&interim, "interim (1xx) responses");
        let mut ok = b"HTTP/1.1 103 Early Hints\r\n\r\n".repeat(MAX_INTERIM);
        ok.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        assert_eq!(parse(&ok).unwrap().1, b"ok");
    }

    #[test]
    fn read_to_close_and_truncation() {
        let (r, b) = fetch(b"HTTP/1.0 200 OK\r\n\r\nall of it").unwrap();
        assert!(r.close);
        assert_eq!(b, b"all of it");
        let e = fetch(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let e = fetch(b"SSH-2.0-x\r\n\r\n").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        // Cut in the middle of the status line: an end of stream, not an
        // overlong line.
        let e = fetch(b"HTTP/1.1 2").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(
            e.to_string()
                .contains("closed the connection after 10 bytes"),
            "{e}"
        );
    }
}
