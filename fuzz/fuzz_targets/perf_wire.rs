//! Fuzz target: iwarp-perf's wire formats (`iwarp_perf::params`, its own
//! request and reply blocks, carried in MPA private data or as the first
//! bytes of a raw-TCP baseline connection; `iwarp_perf::perftest_wire`,
//! perftest's control messages). The first byte picks the decoder, the
//! rest is the peer's bytes. Nothing may panic; what decodes stays within
//! the protocol's ranges, encodes again, and decodes to the same value.
#![no_main]

use iwarp_perf::params::{decode_reply, decode_request, encode_reply, encode_request};
use iwarp_perf::perftest_wire::{self as pw, BwReport, Dest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, b)) = data.split_first() else {
        return;
    };
    match which % 6 {
        0 => {
            let Ok(r) = decode_request(b) else { return };
            let p = &r.params;
            assert!(
                p.check_wire().is_ok(),
                "a decoded request fits the wire: {r:?}"
            );
            assert!(r.qp_index < p.qps, "QP index within the count: {r:?}");
            assert!(!p.timeout.is_zero(), "a decoded timeout is never zero");
            let again = encode_request(&r);
            assert_eq!(again.len(), iwarp_perf::params::REQUEST_LEN);
            assert_eq!(
                decode_request(&again).expect("an encoded request decodes"),
                r
            );
        }
        1 => {
            let Ok(r) = decode_reply(b) else { return };
            let again = encode_reply(&r);
            assert_eq!(again.len(), iwarp_perf::params::REPLY_LEN);
            assert_eq!(decode_reply(&again).expect("an encoded reply decodes"), r);
            // A reply is never taken for a request.
            assert!(decode_request(&again).is_err());
        }
        2 => {
            let Ok(d) = Dest::decode(b) else { return };
            let again = d.encode();
            // Every byte but the 4 bytes of padding before the address.
            assert_eq!(&again[..20], &b[..20]);
            assert_eq!(&again[24..], &b[24..]);
            assert_eq!(Dest::decode(&again).expect("an encoded dest decodes"), d);
        }
        3 => {
            let Ok((s, v)) = pw::decode_version(b) else {
                return;
            };
            assert!(s.len() <= pw::VERSION_LEN && !s.contains('\0'), "{s:?}");
            if s.len() < pw::VERSION_LEN {
                let (s2, v2) = pw::decode_version(&pw::encode_version(&s))
                    .expect("an encoded version decodes");
                assert_eq!(s2, s);
                assert_eq!(v2.to_bits(), v.to_bits());
            }
        }
        4 => {
            if let Ok(v) = pw::decode_u32(b, "fuzz") {
                assert_eq!(pw::decode_u32(&pw::encode_u32(v), "fuzz"), Ok(v));
            }
            if let Ok(mtu) = pw::decode_mtu(b) {
                assert!([256, 512, 1024, 2048, 4096].contains(&mtu), "MTU {mtu}");
                assert_eq!(pw::decode_mtu(&pw::encode_mtu(mtu)), Ok(mtu));
            }
        }
        _ => {
            // A report arrives as parts: the first byte picks 8-byte parts
            // (even) or parts of 1 to 11 bytes (odd).
            let parts: Vec<Vec<u8>> = match b.split_first() {
                Some((&cut, rest)) if cut % 2 == 0 => rest.chunks(8).map(<[u8]>::to_vec).collect(),
                Some((&cut, rest)) => rest
                    .chunks(usize::from(cut % 11) + 1)
                    .map(<[u8]>::to_vec)
                    .collect(),
                None => Vec::new(),
            };
            let Ok(r) = BwReport::decode(&parts) else {
                return;
            };
            let again: Vec<Vec<u8>> = r.encode().iter().map(|p| p.to_vec()).collect();
            assert_eq!(again, parts, "a report encodes to the bytes it came from");
            let r2 = BwReport::decode(&again).expect("an encoded report decodes");
            assert_eq!(
                (
                    r2.size,
                    r2.iters,
                    r2.bw_peak.to_bits(),
                    r2.bw_avg.to_bits(),
                    r2.msg_rate.to_bits()
                ),
                (
                    r.size,
                    r.iters,
                    r.bw_peak.to_bits(),
                    r.bw_avg.to_bits(),
                    r.msg_rate.to_bits()
                )
            );
        }
    }
});
