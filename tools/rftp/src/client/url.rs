//! `ftp://` URLs (RFC 1738 §3.2: user, password, host, port, path;
//! %-escapes decoded).

/// `ftp://[user[:password]@]host[:port]/path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub user: String,
    pub password: String,
    pub host: String,
    pub port: u16,
    pub path: String,
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Url {
    /// Parse an `ftp://` URL; no user means anonymous.
    pub fn parse(s: &str) -> Result<Url, String> {
        let rest = s
            .strip_prefix("ftp://")
            .ok_or_else(|| format!("{s}: only ftp:// URLs are supported"))?;
        let (auth_host, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (auth, hostport) = match auth_host.rfind('@') {
            Some(i) => (Some(&auth_host[..i]), &auth_host[i + 1..]),
            None => (None, auth_host),
        };
        let (user, password) = match auth {
            Some(a) => match a.split_once(':') {
                Some((u, p)) => (unescape(u), unescape(p)),
                None => (unescape(a), String::new()),
            },
            None => ("anonymous".to_string(), "rftp@".to_string()),
        };
        let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
            let (h, p) = h.split_once(']').ok_or("unclosed [ in URL host")?;
            (h.to_string(), p.strip_prefix(':').unwrap_or(""))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p),
                None => (hostport.to_string(), ""),
            }
        };
        let port = if port.is_empty() {
            21
        } else {
            port.parse().map_err(|_| format!("{s}: bad port {port}"))?
        };
        if host.is_empty() {
            return Err(format!("{s}: no host"));
        }
        Ok(Url {
            user,
            password,
            host,
            port,
            path: unescape(path),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn urls() {
        let u = Url::parse("ftp://bob:p%40ss@127.0.0.1:2121/dir/f.bin").unwrap();
        assert_eq!(
            u,
            Url {
                user: "bob".into(),
                password: "p@ss".into(),
                host: "127.0.0.1".into(),
                port: 2121,
                path: "/dir/f.bin".into()
            }
        );
        let u = Url::parse("ftp://host/x").unwrap();
        assert_eq!((u.user.as_str(), u.port), ("anonymous", 21));
        let u = Url::parse("ftp://[::1]:99/").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 99));
        assert!(Url::parse("http://x/").is_err());
        assert!(Url::parse("ftp://:1/").is_err());
    }
}
