//! A small HTTP/1.1 client: one keep-alive connection, requests with
//! extra headers, responses with Content-Length, chunked or
//! read-to-close bodies.

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// `http://host[:port]/path` (only plain http).
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
            80
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

    fn content_length(&self) -> io::Result<Option<u64>> {
        match self.header("Content-Length") {
            None => Ok(None),
            Some(v) => v.trim().parse::<u64>().map(Some).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad Content-Length {v:?} in the response"),
                )
            }),
        }
    }

    fn chunked(&self) -> bool {
        self.header("Transfer-Encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    }
}

impl fmt::Display for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status, self.reason)
    }
}

/// One HTTP connection.
#[derive(Debug)]
pub struct Conn {
    reader: BufReader<TcpStream>,
    pub peer: SocketAddr,
    pub local: SocketAddr,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

impl Conn {
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
                        reader: BufReader::with_capacity(64 * 1024, s),
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
        self.reader.get_ref()
    }

    /// True if response bytes are already buffered.
    pub fn has_buffered(&self) -> bool {
        !self.reader.buffer().is_empty()
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

    fn read_line(&mut self) -> io::Result<String> {
        let mut line = Vec::new();
        let n = (&mut self.reader)
            .take(16 * 1024)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ));
        }
        if line.last() != Some(&b'\n') {
            if n < 16 * 1024 {
                // read_until stopped short of the limit: end of stream.
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the server closed the connection after {n} bytes of a response line"),
                ));
            }
            return Err(invalid("response line longer than 16 KiB".into()));
        }
        while matches!(line.last(), Some(b'\n' | b'\r')) {
            line.pop();
        }
        String::from_utf8(line).map_err(|_| invalid("response header is not UTF-8".into()))
    }

    /// Read a response's status line and headers (skipping 1xx).
    pub fn read_head(&mut self) -> io::Result<Response> {
        loop {
            let status_line = self.read_line()?;
            let mut it = status_line.splitn(3, ' ');
            let version = it.next().unwrap_or("");
            if !version.starts_with("HTTP/1.") {
                return Err(invalid(format!("not an HTTP response: {status_line:?}")));
            }
            let status = it
                .next()
                .and_then(|s| s.parse::<u16>().ok())
                .ok_or_else(|| invalid(format!("bad status line {status_line:?}")))?;
            let reason = it.next().unwrap_or("").to_string();
            let mut headers = Vec::new();
            loop {
                let l = self.read_line()?;
                if l.is_empty() {
                    break;
                }
                if let Some((k, v)) = l.split_once(':') {
                    headers.push((k.trim().to_string(), v.trim().to_string()));
                }
            }
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
            return Ok(Response {
                status,
                reason,
                headers,
                close,
            });
        }
    }

    /// Read the response body into `sink`, calling `progress` with the
    /// byte count so far. `head_request` responses have no body.
    pub fn read_body(
        &mut self,
        resp: &Response,
        head_request: bool,
        sink: &mut dyn Write,
        progress: &mut dyn FnMut(u64),
    ) -> io::Result<u64> {
        if head_request || resp.status == 204 || resp.status == 304 {
            return Ok(0);
        }
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0u64;
        if resp.chunked() {
            loop {
                let line = self.read_line()?;
                let size_str = line.split(';').next().unwrap_or("").trim();
                let size = u64::from_str_radix(size_str, 16)
                    .map_err(|_| invalid(format!("bad chunk size line {line:?}")))?;
                if size == 0 {
                    // Trailers end with an empty line.
                    while !self.read_line()?.is_empty() {}
                    return Ok(total);
                }
                let mut left = size;
                while left > 0 {
                    let want = left.min(buf.len() as u64) as usize;
                    let n = self.reader.read(&mut buf[..want])?;
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
                if !self.read_line()?.is_empty() {
                    return Err(invalid("chunk not followed by CRLF".into()));
                }
            }
        }
        match resp.content_length()? {
            Some(len) => {
                while total < len {
                    let want = (len - total).min(buf.len() as u64) as usize;
                    let n = self.reader.read(&mut buf[..want])?;
                    if n == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("the server closed the connection after {total} of {len} body bytes"),
                        ));
                    }
                    sink.write_all(&buf[..n])?;
                    total += n as u64;
                    progress(total);
                }
                Ok(total)
            }
            None => loop {
                let n = self.reader.read(&mut buf)?;
                if n == 0 {
                    return Ok(total);
                }
                sink.write_all(&buf[..n])?;
                total += n as u64;
                progress(total);
            },
        }
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
