//! Fuzz target: rhttp/mod_rdma control messages (32-byte BUF/DONE/ABORT).
//! Nothing may panic; a message that decodes encodes to the same bytes
//! except the reserved ones, and decodes again to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rhttp::ctrl::CtrlMsg;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = CtrlMsg::decode(data) else {
        return;
    };
    let b = m.encode();
    assert_eq!(b.len(), data.len());
    assert_eq!(&b[..6], &data[..6], "magic, version and type are kept");
    assert_eq!(&b[8..], &data[8..], "the fields are kept");
    assert_eq!(CtrlMsg::decode(&b).unwrap(), m);
});
