//! Fuzz target: the `RDMA:` request header as rhttp (and mod_rdma, in C)
//! parse it. Nothing may panic; a header that parses prints in canonical
//! form and parses back to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rhttp::header::RdmaHeader;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(h) = RdmaHeader::parse(text) else {
        return;
    };
    let shown = h.to_string();
    let again = RdmaHeader::parse(&shown)
        .unwrap_or_else(|e| panic!("canonical form {shown:?} does not parse: {e}"));
    assert_eq!(again, h);
    let _ = h.validate_request();
});
