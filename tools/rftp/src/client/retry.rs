//! The retry policy of `get_retrying` and `put_retrying`: which failures
//! are worth a new connection ([`transient`]), how long to wait before
//! each retry ([`backoff`]), and the one loop that applies them
//! ([`retrying`]). Each caller supplies its attempt and what it reports
//! before a retry (a download says where it resumes, an upload what the
//! server will be asked).

use std::time::Duration;

use super::options::Summary;

/// Whether a failed transfer may succeed on a new connection: the path or
/// the server went away or silent (reset, timeout, a lost session, 421 /
/// 425 / 426, RFC 959 §4.2: "transient negative completion"). A checksum
/// mismatch, a local file error or a permanent 5xx reply is not retried.
pub fn transient(e: &str) -> bool {
    let permanent = [
        "mismatch",
        "creating ",
        "opening ",
        "renaming ",
        "local I/O error",
        "invalid transfer configuration",
    ];
    if permanent.iter().any(|p| e.contains(p)) {
        return false;
    }
    let transient = [
        "connection",
        "Connection",
        "timed out",
        "no reply",
        "Broken pipe",
        "went silent",
        "stopped responding",
        "vanished",
        "unreachable",
        ": 421 ",
        ": 425 ",
        ": 426 ",
        "replied 421",
        "replied 425",
        "replied 426",
        "session setup failed",
    ];
    transient.iter().any(|p| e.contains(p))
}

/// The wait before retry `n` (1-based): 1 s, doubling, at most 30 s.
pub fn backoff(n: u32) -> Duration {
    Duration::from_secs(1u64 << n.saturating_sub(1).min(5)).min(Duration::from_secs(30))
}

/// Run `attempt(n)` for `n` = 0, 1, … until it succeeds, fails for a
/// reason that is not [`transient`], or `retries` retries are spent.
/// Before retry `n` (1-based) `announce(n, error, wait)` reports it and
/// `sleep(wait)` waits [`backoff`]`(n)`. The summary of a success carries
/// the retries it took; the last error, once retries were made, says how
/// many.
pub(super) fn retrying(
    retries: u32,
    mut attempt: impl FnMut(u32) -> Result<Summary, String>,
    mut announce: impl FnMut(u32, &str, Duration),
    sleep: impl Fn(Duration),
) -> Result<Summary, String> {
    let mut n = 0;
    loop {
        let e = match attempt(n) {
            Ok(mut s) => {
                s.retries = n;
                return Ok(s);
            }
            Err(e) => e,
        };
        if n >= retries || !transient(&e) {
            if n > 0 {
                return Err(format!(
                    "{e} (after {n} retr{})",
                    if n == 1 { "y" } else { "ies" }
                ));
            }
            return Err(e);
        }
        n += 1;
        let wait = backoff(n);
        announce(n, &e, wait);
        sleep(wait);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn summary() -> Summary {
        Summary {
            bytes: 1,
            resumed_from: 0,
            rehashed: None,
            elapsed: Duration::ZERO,
            via: String::new(),
            checksum: None,
            retries: 0,
        }
    }

    #[test]
    fn backoff_doubles_from_one_second_up_to_thirty() {
        let secs: Vec<u64> = (1..=8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30, 30]);
    }

    #[test]
    fn retries_transient_failures_then_reports_the_count() {
        let waits = RefCell::new(Vec::new());
        let mut said = Vec::new();
        let s = retrying(
            3,
            |n| match n {
                0 | 1 => Err("connection reset by peer".to_string()),
                _ => Ok(summary()),
            },
            |n, e, w| said.push((n, e.to_string(), w)),
            |w| waits.borrow_mut().push(w),
        )
        .unwrap();
        assert_eq!(s.retries, 2);
        assert_eq!(said.len(), 2);
        assert_eq!(said[1].0, 2);
        assert_eq!(
            *waits.borrow(),
            [Duration::from_secs(1), Duration::from_secs(2)]
        );
    }

    #[test]
    fn gives_up_after_the_retries_and_on_a_permanent_failure() {
        let mut tries = 0;
        let e = retrying(
            2,
            |_| {
                tries += 1;
                Err("control connection: timed out".to_string())
            },
            |_, _, _| {},
            |_| {},
        )
        .unwrap_err();
        assert_eq!(tries, 3);
        assert!(e.ends_with("(after 2 retries)"), "{e}");
        let mut tries = 0;
        let e = retrying(
            5,
            |_| {
                tries += 1;
                Err("checksum mismatch".to_string())
            },
            |_, _, _| {},
            |_| {},
        )
        .unwrap_err();
        assert_eq!((tries, e.as_str()), (1, "checksum mismatch"));
    }
}
