//! The tests' own small, blocking HTTP/1.x: a client ([`fetch`], HTTP/1.0,
//! one connection per request) and a request reader for the stand-in
//! application servers. Deliberately independent of ccproxy's hyper, so a
//! framing mistake on either side shows. Each test binary uses part of it.
#![allow(dead_code)]

use std::fmt;
use std::io::{self, BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Longest request or response head accepted.
pub const MAX_HEAD: usize = 16 * 1024;
/// Largest backend body accepted.
pub const MAX_BODY: usize = 64 * 1024 * 1024;

/// A request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Method, e.g. `GET`.
    pub method: String,
    /// Request target, e.g. `/doc/3`.
    pub target: String,
    /// Minor version: 1 for HTTP/1.1, 0 for HTTP/1.0.
    pub minor: u8,
    /// Header fields in order.
    pub headers: Vec<(String, String)>,
}

impl Request {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// Does the client want the connection kept open (RFC 9112 §9.3)?
    pub fn keep_alive(&self) -> bool {
        let conn = self.header("connection").unwrap_or("").to_ascii_lowercase();
        if self.minor >= 1 {
            !conn.split(',').any(|t| t.trim() == "close")
        } else {
            conn.split(',').any(|t| t.trim() == "keep-alive")
        }
    }
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// A request or response that could not be read.
#[derive(Debug)]
pub enum HttpError {
    /// Socket error or timeout.
    Io(io::Error),
    /// Not HTTP we accept; the text names the rule.
    Bad(&'static str),
    /// A request feature this proxy does not implement (answer 501).
    Unsupported(&'static str),
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::Io(e) => write!(f, "{e}"),
            HttpError::Bad(w) => write!(f, "malformed HTTP: {w}"),
            HttpError::Unsupported(w) => write!(f, "not implemented: {w}"),
        }
    }
}

impl std::error::Error for HttpError {}

impl From<io::Error> for HttpError {
    fn from(e: io::Error) -> HttpError {
        HttpError::Io(e)
    }
}

/// Read lines up to the blank line; `None` at a clean end of stream
/// before any byte.
fn read_head(r: &mut impl BufRead) -> Result<Option<Vec<String>>, HttpError> {
    let mut lines = Vec::new();
    let mut total = 0;
    loop {
        let mut line = Vec::new();
        let n = r
            .take((MAX_HEAD + 1 - total) as u64)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            return if lines.is_empty() && total == 0 {
                Ok(None)
            } else {
                Err(HttpError::Bad("connection closed inside the head"))
            };
        }
        total += n;
        if total > MAX_HEAD {
            return Err(HttpError::Bad("head longer than 16 KiB"));
        }
        if line.last() != Some(&b'\n') {
            return Err(HttpError::Bad("head line without an end"));
        }
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if line.is_empty() {
            if lines.is_empty() {
                // RFC 9112 §2.2: ignore empty lines before the request line.
                continue;
            }
            return Ok(Some(lines));
        }
        lines.push(String::from_utf8(line).map_err(|_| HttpError::Bad("head is not UTF-8"))?);
    }
}

fn parse_fields(lines: &[String]) -> Result<Vec<(String, String)>, HttpError> {
    lines
        .iter()
        .map(|l| {
            let (k, v) = l
                .split_once(':')
                .ok_or(HttpError::Bad("header line without ':'"))?;
            if k.is_empty() || k.ends_with(' ') || k.ends_with('\t') {
                return Err(HttpError::Bad("bad header name"));
            }
            Ok((k.to_string(), v.trim().to_string()))
        })
        .collect()
}

/// Read one request head and discard its body (if it has a
/// Content-Length). `Ok(None)`: the client closed between requests.
pub fn read_request(r: &mut impl BufRead) -> Result<Option<Request>, HttpError> {
    let Some(lines) = read_head(r)? else {
        return Ok(None);
    };
    let mut parts = lines[0].split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::Bad(
            "request line is not 'METHOD TARGET HTTP/1.x'",
        ));
    };
    let minor = match version {
        "HTTP/1.1" => 1,
        "HTTP/1.0" => 0,
        _ => return Err(HttpError::Bad("not HTTP/1.0 or HTTP/1.1")),
    };
    if method.is_empty() || !target.starts_with('/') {
        return Err(HttpError::Bad("request target must be an absolute path"));
    }
    let headers = parse_fields(&lines[1..])?;
    if header(&headers, "transfer-encoding").is_some() {
        return Err(HttpError::Unsupported(
            "request bodies with Transfer-Encoding",
        ));
    }
    if let Some(cl) = header(&headers, "content-length") {
        let n: u64 = cl
            .parse()
            .map_err(|_| HttpError::Bad("bad Content-Length"))?;
        if n > MAX_BODY as u64 {
            return Err(HttpError::Unsupported("request bodies over 64 MiB"));
        }
        io::copy(&mut r.take(n), &mut io::sink())?;
    }
    Ok(Some(Request {
        method: method.to_string(),
        target: target.to_string(),
        minor,
        headers,
    }))
}

/// The reason phrase of the status codes we send.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        _ => "Unknown",
    }
}

/// Write a response with a Content-Length (the body is left out for
/// HEAD, `head_only`).
pub fn write_response(
    w: &mut impl Write,
    status: u16,
    headers: &[(&str, String)],
    body: &[u8],
    head_only: bool,
    keep_alive: bool,
) -> io::Result<()> {
    let mut h = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (k, v) in headers {
        h.push_str(k);
        h.push_str(": ");
        h.push_str(v);
        h.push_str("\r\n");
    }
    h.push_str(&format!("Content-Length: {}\r\n", body.len()));
    h.push_str(if keep_alive {
        "Connection: keep-alive\r\n\r\n"
    } else {
        "Connection: close\r\n\r\n"
    });
    w.write_all(h.as_bytes())?;
    if !head_only {
        w.write_all(body)?;
    }
    w.flush()
}

/// A response from the application server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Header fields in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }
}

/// Parse a whole response as read until the server closed.
pub fn parse_response(raw: &[u8]) -> Result<Response, HttpError> {
    let mut r = raw;
    let lines = read_head(&mut r)?.ok_or(HttpError::Bad("empty response"))?;
    let mut parts = lines[0].splitn(3, ' ');
    let (Some(v), Some(code)) = (parts.next(), parts.next()) else {
        return Err(HttpError::Bad("status line is not 'HTTP/1.x CODE REASON'"));
    };
    if !v.starts_with("HTTP/1.") {
        return Err(HttpError::Bad("status line is not HTTP/1.x"));
    }
    let status: u16 = code
        .parse()
        .map_err(|_| HttpError::Bad("bad status code"))?;
    let headers = parse_fields(&lines[1..])?;
    if header(&headers, "transfer-encoding").is_some() {
        return Err(HttpError::Unsupported("chunked responses from the backend"));
    }
    let body = match header(&headers, "content-length") {
        Some(cl) => {
            let n: usize = cl
                .parse()
                .map_err(|_| HttpError::Bad("bad Content-Length"))?;
            if r.len() < n {
                return Err(HttpError::Bad("backend closed before the whole body"));
            }
            r[..n].to_vec()
        }
        None => r.to_vec(),
    };
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// GET `target` from the application server at `backend` with HTTP/1.0
/// and read the response to the end, every step bounded by `timeout`.
pub fn fetch(backend: SocketAddr, target: &str, timeout: Duration) -> Result<Response, HttpError> {
    let mut s = TcpStream::connect_timeout(&backend, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.set_nodelay(true)?;
    write!(
        s,
        "GET {target} HTTP/1.0\r\nHost: {backend}\r\nUser-Agent: ccproxy\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.take(MAX_BODY as u64 + MAX_HEAD as u64)
        .read_to_end(&mut raw)?;
    parse_response(&raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_keep_alive_and_body() {
        let raw = b"\r\nGET /doc/3 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET /doc/4 HTTP/1.0\r\n\r\n";
        let mut r = &raw[..];
        let a = read_request(&mut r).unwrap().unwrap();
        assert_eq!(
            (a.method.as_str(), a.target.as_str(), a.minor),
            ("GET", "/doc/3", 1)
        );
        assert!(a.keep_alive());
        assert_eq!(a.header("HOST"), Some("x"));
        let b = read_request(&mut r).unwrap().unwrap();
        assert_eq!(b.target, "/doc/4");
        assert!(!b.keep_alive());
        assert!(read_request(&mut r).unwrap().is_none());
    }

    #[test]
    fn bad_requests() {
        for raw in [
            &b"GET /x\r\n\r\n"[..],
            b"GET /x HTTP/2\r\n\r\n",
            b"GET x HTTP/1.1\r\n\r\n",
            b"GET /x HTTP/1.1\r\nNoColon\r\n\r\n",
            b"GET /x HTTP/1.1\r\nHost: x\r\n",
            b"GET /x HTTP/1.1\r\nContent-Length: z\r\n\r\n",
        ] {
            assert!(
                matches!(read_request(&mut &raw[..]), Err(HttpError::Bad(_))),
                "{raw:?}"
            );
        }
        assert!(matches!(
            read_request(&mut &b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"[..]),
            Err(HttpError::Unsupported(_))
        ));
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_HEAD));
        assert!(matches!(
            read_request(&mut long.as_bytes()),
            Err(HttpError::Bad(_))
        ));
    }

    #[test]
    fn responses() {
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\nX-CC-Doc-Version: 7\r\nContent-Length: 2\r\n\r\nhiXX",
        )
        .unwrap();
        assert_eq!(
            (r.status, r.header("x-cc-doc-version"), &r.body[..]),
            (200, Some("7"), &b"hi"[..])
        );
        let r = parse_response(b"HTTP/1.0 404 Not Found\r\n\r\nall of it").unwrap();
        assert_eq!(r.body, b"all of it");
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort").is_err());
        assert!(parse_response(b"").is_err());
        let mut out = Vec::new();
        write_response(&mut out, 200, &[("X-A", "1".into())], b"body", false, true).unwrap();
        assert_eq!(
            out,
            b"HTTP/1.1 200 OK\r\nX-A: 1\r\nContent-Length: 4\r\nConnection: keep-alive\r\n\r\nbody"
        );
    }
}
