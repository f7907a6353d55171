//! Fuzz target: rdma-xfer's TCP-mode frame header, as the sink's readers
//! decode it from the network. Nothing may panic; a block is never longer
//! than the negotiated block size (nor empty), and every frame the sink
//! accepts encodes back to the bytes it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_xfer::tcp::{decode_frame, encode_frame, FrameHead, FRAME_HDR};

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 + FRAME_HDR {
        return;
    }
    let bs = u32::from_be_bytes([data[0], data[1], data[2], data[3]]);
    let mut h = [0u8; FRAME_HDR];
    h.copy_from_slice(&data[4..4 + FRAME_HDR]);
    match decode_frame(&h, bs) {
        FrameHead::Block { len, seq } => {
            assert!(len > 0 && len <= bs);
            assert_eq!(encode_frame(FrameHead::Block { len, seq }), h);
        }
        f @ FrameHead::End { .. } => {
            // len is ignored on End: compare what the sink reads.
            assert_eq!(&encode_frame(f)[8..], &h[8..]);
        }
        f @ FrameHead::Abort { .. } => assert_eq!(&encode_frame(f)[..8], &h[..8]),
        FrameHead::Bad { kind, len } => {
            assert!(kind != 1 || len == 0 || len > bs);
        }
    }
});
