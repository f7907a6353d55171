//! Fuzz target: rdma-xfer control messages (Hello, grants, BlockDone,
//! End, Abort, ...). Nothing may panic; what parses re-emits within the
//! declared length and parses back to the same message and credits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_xfer::msg::Msg;

fuzz_target!(|data: &[u8]| {
    let Ok((m, credits)) = Msg::parse(data) else {
        return;
    };
    let mut buf = vec![0u8; m.buffer_len()];
    let n = m.emit(credits, &mut buf);
    assert_eq!(n, m.buffer_len());
    let (again, c2) = Msg::parse(&buf[..n]).expect("an emitted message parses");
    assert_eq!((again, c2), (m, credits));
});
