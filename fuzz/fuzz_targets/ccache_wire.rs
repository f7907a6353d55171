//! Fuzz target: the coherent cache's wire formats from `ccache-proto`,
//! all of which arrive from another process: the 16-byte IPC message, a
//! proxy's cache state region (read by RDMA Read or over the push
//! channel), the push channel's frame header and registration, and the
//! access token's formats (`auth`): the proof in MPA Request private data
//! and after a `REGISTER`, the refusal in MPA Reject private data, and the
//! masking of a registration's address and STag.
//! Nothing may panic; whatever parses emits back to the same meaning, and
//! the push policy decides on any parsed state without panicking.
#![no_main]

use ccache_proto::auth::{
    self, AuthError, ConnProof, Proof, Refusal, CONN_PROOF_LEN, MAC_LEN, PROOF_LEN, REFUSAL_LEN,
};
use ccache_proto::ipc::Repr;
use ccache_proto::push::{Header, Registration, REGISTRATION_LEN};
use ccache_proto::state::{Policy, Region, Snapshot};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = Repr::from_bytes(data) {
        assert_eq!(Repr::from_bytes(&r.to_bytes()), Ok(r));
    }
    if let Ok(h) = Header::parse(data) {
        assert_eq!(Header::parse(&h.emit()), Ok(h));
    }
    if let Ok(r) = Registration::parse(data) {
        assert_eq!(Registration::parse(&r.emit()), Ok(r));
    }
    if let Ok(v) = Region::new_checked(data) {
        let _ = (v.header_ok(), v.trailer_generation(), v.published_us());
        for i in 0..v.count().min(64) {
            let _ = v.entry(i);
        }
    }
    if let Ok(s) = Snapshot::parse(data) {
        assert_eq!(Snapshot::parse(&s.to_bytes()), Ok(s.clone()));
        let doc = data.last().copied().map_or(0, u32::from);
        for p in [Policy::Pull, Policy::Push, Policy::Hybrid { percent: 20 }] {
            let _ = p.decide(&s, doc, u64::MAX);
        }
    }
    auth_formats(data);
});

/// `ccache_proto::auth`: what a listener reads from a Request's private
/// data, what a client reads from a Reject's, and what ccappd does with a
/// `REGISTER` body (registration, then proof).
fn auth_formats(data: &[u8]) {
    // The proof: exactly the first PROOF_LEN bytes, re-emitted byte for
    // byte; refused only for being short or for its magic.
    match Proof::parse(data) {
        Ok(p) => assert_eq!(&p.emit()[..], &data[..PROOF_LEN]),
        Err(AuthError::Truncated { len, need }) => {
            assert!(len == data.len() && len < PROOF_LEN && need == PROOF_LEN)
        }
        Err(AuthError::BadMagic(m)) => {
            assert!(data.len() >= PROOF_LEN && m[..] == data[..4] && m != auth::PROOF_MAGIC)
        }
        Err(AuthError::Outdated) => panic!("Proof::parse is version 1 itself"),
    }
    if let Err(e) = Proof::parse(data) {
        let _ = e.to_string();
    }
    // The version-2 (connection) proof: the first CONN_PROOF_LEN bytes,
    // re-emitted; a version-1 magic is Outdated whatever the length.
    match ConnProof::parse(data) {
        Ok(p) => assert_eq!(&p.emit()[..], &data[..CONN_PROOF_LEN]),
        Err(AuthError::Outdated) => assert!(data[..4] == auth::PROOF_MAGIC),
        Err(AuthError::Truncated { len, need }) => {
            assert!(len == data.len() && len < CONN_PROOF_LEN && need == CONN_PROOF_LEN)
        }
        Err(AuthError::BadMagic(m)) => assert!(
            data.len() >= CONN_PROOF_LEN && m[..] == data[..4] && m != auth::CONN_PROOF_MAGIC
        ),
    }
    // The refusal: any code is kept (unknown ones too) and re-emitted.
    match Refusal::parse(data) {
        Some(r) => {
            assert_eq!(&r.emit()[..], &data[..REFUSAL_LEN]);
            assert!(!matches!(r, Refusal::Unknown(1..=4)));
            let _ = r.to_string();
        }
        None => assert!(data.len() < REFUSAL_LEN || data[..4] != auth::REFUSAL_MAGIC),
    }
    // A REGISTER body as ccappd splits it (push.rs accept_one): the
    // registration, then the version-2 proof (a version-1 one is
    // Outdated, an old proxy); the key is the next MAC_LEN bytes.
    let (reg, rest) = data.split_at(REGISTRATION_LEN.min(data.len()));
    match ConnProof::parse(rest) {
        Ok(p) => assert_eq!(&p.emit()[..], &rest[..CONN_PROOF_LEN]),
        Err(AuthError::Outdated) => assert!(rest[..4] == auth::PROOF_MAGIC),
        Err(_) => {}
    }
    if let (Ok(reg), Some(key)) = (<[u8; REGISTRATION_LEN]>::try_from(reg), rest.get(..MAC_LEN)) {
        let key: &[u8; MAC_LEN] = key.try_into().expect("MAC_LEN bytes");
        let mut masked = reg;
        auth::mask_registration(&mut masked, key);
        // Only the address (20..28) and the STag (28..32) change...
        assert_eq!(masked[..20], reg[..20]);
        assert_eq!(masked[32..], reg[32..]);
        // ...and masking again gives the registration back.
        let mut unmasked = masked;
        auth::mask_registration(&mut unmasked, key);
        assert_eq!(unmasked, reg);
        // Whatever the key, the family, port and length are unchanged.
        match (Registration::parse(&reg), Registration::parse(&masked)) {
            (Ok(a), Ok(b)) => assert!(a.rdma == b.rdma && a.len == b.len),
            (Err(a), Err(b)) => assert_eq!(a, b),
            (a, b) => panic!("masking changed the verdict: {a:?} -> {b:?}"),
        }
    }
}
