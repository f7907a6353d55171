//! Fuzz target: rhttp's HTTP/1.1 response parser (`rhttp::http`), on what
//! a hostile server sends: a response head, then its body as the framing
//! says. Nothing may panic; a parsed head has a final status of 200..=599
//! and a framing without ambiguity; the body never holds more bytes than
//! the input, a Content-Length body has exactly that length, and the
//! progress callback counts up to the body's size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rhttp::http::{read_body_from, read_head_from, Framing, MAX_FIELDS};

fuzz_target!(|data: &[u8]| {
    let mut r = data;
    let Ok(resp) = read_head_from(&mut r) else {
        return;
    };
    assert!((200..600).contains(&resp.status), "{}", resp.status);
    assert!(resp.headers.len() <= MAX_FIELDS);
    let framing = resp.framing().expect("read_head_from checked the framing");
    let mut body = Vec::new();
    let mut last = 0u64;
    let got = read_body_from(&mut r, &resp, false, &mut body, &mut |n| {
        assert!(n > last, "progress goes up");
        last = n;
    });
    assert!(body.len() <= data.len());
    if let Ok(n) = got {
        assert_eq!(n, body.len() as u64);
        if n > 0 {
            assert_eq!(last, n);
        }
        match framing {
            Framing::Length(len) => assert_eq!(n, len),
            Framing::Empty => assert_eq!(n, 0),
            Framing::Chunked | Framing::UntilClose => {}
        }
    }
});
