//! Sizes in bytes: `4096`, `512K`, `64M`, `1G`, `2T`, with an optional `B`
//! or `iB` after the suffix (`64MB`, `1GiB`). Suffixes are binary (K =
//! 1024) and case-insensitive, as in dd(1) and rsync's `--max-size`.

/// Parses a size such as `4096`, `512K`, `64M`, `1GiB` or `2T` into bytes.
///
/// Surrounding white space is ignored, and so is white space between the
/// number and its suffix (`64 M`). The error names the input and shows
/// the accepted forms: a fraction (`1.5M`), a sign, an unknown suffix, an
/// empty string and a size beyond `u64` are all refused.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    // Only ASCII suffixes match, so cutting one byte stays on a char
    // boundary.
    let (num, shift) = match t.as_bytes().last() {
        Some(b'k' | b'K') => (&t[..t.len() - 1], 10),
        Some(b'm' | b'M') => (&t[..t.len() - 1], 20),
        Some(b'g' | b'G') => (&t[..t.len() - 1], 30),
        Some(b't' | b'T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(|| format!("invalid size {s:?}: use e.g. 4096, 512K, 64M, 1G"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn plain_numbers() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size(" 4096\n"), Ok(4096));
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn suffixes_are_binary_and_case_insensitive() {
        for (s, n) in [
            ("1k", 1u64 << 10),
            ("512K", 512 << 10),
            ("64m", 64 << 20),
            ("64M", 64 << 20),
            ("1g", 1 << 30),
            ("1G", 1 << 30),
            ("2t", 2 << 40),
            ("2T", 2 << 40),
            ("64MB", 64 << 20),
            ("64MiB", 64 << 20),
            ("1GiB", 1 << 30),
            ("4096B", 4096),
            ("64 M", 64 << 20),
        ] {
            assert_eq!(parse_size(s), Ok(n), "{s}");
        }
    }

    #[test]
    fn bad_input_is_refused_with_the_forms() {
        for s in [
            "", " ", "K", "MiB", "B", "x", "1.5M", "-1", "+-1", "1X", "1KK", "1 2", "M1", "1é",
            "½M",
        ] {
            let e = parse_size(s).expect_err(s);
            assert!(e.contains(&format!("{s:?}")), "{e}");
            assert!(e.contains("512K, 64M, 1G"), "{e}");
        }
    }

    #[test]
    fn overflow_is_refused_not_wrapped() {
        assert!(parse_size("16777216T").is_err()); // 2^24 * 2^40 = 2^64
        assert_eq!(parse_size("16777215T"), Ok(16777215 << 40));
        assert!(parse_size("18446744073709551616").is_err());
    }
}
