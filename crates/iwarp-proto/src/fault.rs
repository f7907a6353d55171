//! Why a stream ends with a Terminate, and the one mapping from that cause
//! to the (layer, etype, ecode) triple on the wire.
//!
//! Every check that can end an RDMAP stream reports a [`Fault`]: the MPA
//! framing and handshake checks (RFC 5044, RFC 6581), the DDP header and
//! buffer checks (RFC 5041 §7), the RDMAP checks (RFC 5040 §7) and the two
//! memory-access checks, whose [`MemError`] is mapped differently for a
//! tagged sink (DDP layer, as siw's `siw_tagged_error`) and for an RDMA
//! Read source (RDMAP layer, as siw's `siw_rdmap_error`). [`term_code`] is
//! the only place that turns a cause into a [`TermCode`]; the engine, the
//! public deframer ([`crate::wire::mpa::FpduError::term_code`]) and the
//! handshake ([`crate::handshake::HandshakeError::term_code`]) all go
//! through it.
//!
//! The codes are those of the IANA RDDP registries (RFC 6580), which
//! collect RFC 5040 §7 (RDMAP, layer 0), RFC 5041 §7 (DDP, layer 1) and
//! RFC 5044 §8 with RFC 6581 §8 (MPA, layer 2).

use crate::mem::MemError;
use crate::wire::terminate::TermCode;

/// The cause of a Terminate this stack sends.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    // ---- MPA (LLP, layer 2): RFC 5044, RFC 6581 ----
    /// The CRC field of a received FPDU does not match (RFC 5044 §4.4).
    FpduCrc,
    /// The ULPDU length cannot frame the DDP segment it announces: shorter
    /// than its DDP/RDMAP header, a Read Request carrying payload, or a
    /// Terminate body over its bound (RFC 5044 §4.1). The framing is lost.
    UlpduLength,
    /// A marker's FPDU pointer does not point at the start of the FPDU it
    /// sits in (RFC 5044 §4.3).
    Marker,
    /// An invalid MPA Request or Reply frame (RFC 5044 §7.1).
    MpaRequestReply,
    /// The initiator's IRD cannot serve the responder's ORD (RFC 6581 §3).
    InsufficientIrd,
    /// No ready-to-receive message type both peers support (RFC 6581 §3).
    NoMatchingRtr,

    // ---- DDP (layer 1): RFC 5041 §7 ----
    /// A DDP version other than 1 (RFC 5041 §4).
    DdpVersion { tagged: bool },
    /// A tagged segment's sink (RDMA Write, Read Response) failed its
    /// check (RFC 5041 §5, §7).
    TaggedSink(MemError),
    /// An untagged segment names a queue the message type does not use
    /// (RFC 5041 §5, RFC 5040 §4.2).
    UntaggedQn,
    /// An untagged segment's MSN is not the expected one (RFC 5041 §5).
    UntaggedMsn,
    /// An untagged segment's message offset is not where the message
    /// stands (RFC 5041 §5).
    UntaggedMo,
    /// An untagged message arrived and no receive buffer is posted
    /// (RFC 5041 §5, RFC 5040 §5.3).
    UntaggedNoBuffer,
    /// An untagged message is longer than the posted buffer (RFC 5041 §5).
    UntaggedTooLong,
    /// A local error while placing received data: a posted receive buffer
    /// fails its check, or the driver placed bytes the engine did not ask
    /// for.
    DdpLocal,

    // ---- RDMAP (layer 0): RFC 5040 §7 ----
    /// An RDMAP version other than 1 (RFC 5040 §4.1).
    RdmapVersion,
    /// An opcode RFC 5040 does not define, used with the wrong DDP model,
    /// or a Read Response no Read Request asked for (RFC 5040 §4.2, §5.2).
    UnexpectedOpcode,
    /// More inbound RDMA Read Requests than our IRD (RFC 5040 §5.2,
    /// RFC 6581 §3).
    IrdExceeded,
    /// The source of an RDMA Read Request failed its check (RFC 5040 §5.2).
    ReadSource(MemError),
    /// A Send with Invalidate names an STag that cannot be invalidated
    /// (RFC 5040 §5.3, §6.10).
    CannotInvalidate,
    /// A local error on the send side: a work request's local buffer
    /// failed its check while being sent.
    RdmapLocal,
}

/// The Terminate code for `fault`: the one place a cause becomes a
/// (layer, etype, ecode) triple.
pub fn term_code(fault: Fault) -> TermCode {
    use Fault::*;
    use TermCode as T;
    match fault {
        // RFC 5044 §8, LLP error codes (etype 0).
        FpduCrc => T::MpaCrcError,
        // RFC 5044 §8 has no code of its own for a ULPDU length that
        // cannot frame the segment; the FPDU framing is lost, the "marker
        // and ULPDU length disagree" code 0x03 (siw LLP_ECODE_FPDU_START).
        UlpduLength => T::MpaInvalidUlpduLen,
        Marker => T::MpaMarkerError,
        MpaRequestReply => T::MpaInvalidReqRep,
        // RFC 6581 §8.
        InsufficientIrd => T::MpaInsufficientIrd,
        NoMatchingRtr => T::MpaNoMatchingRtr,

        // RFC 5041 §7: tagged (etype 1) and untagged (etype 2) buffer errors.
        DdpVersion { tagged: true } => T::DdpTaggedInvalidVersion,
        DdpVersion { tagged: false } => T::DdpUntaggedInvalidVersion,
        // siw_tagged_error. RFC 5041 §7 has no access-rights code; a
        // region the peer may not write is "invalid STag" for it.
        TaggedSink(MemError::InvalidStag | MemError::KeyMismatch | MemError::AccessRights) => {
            T::DdpTaggedInvalidStag
        }
        TaggedSink(MemError::PdMismatch) => T::DdpTaggedStagNotAssociated,
        TaggedSink(MemError::Bounds) => T::DdpTaggedBaseBounds,
        UntaggedQn => T::DdpUntaggedInvalidQn,
        UntaggedMsn => T::DdpUntaggedInvalidMsnRange,
        UntaggedMo => T::DdpUntaggedInvalidMo,
        UntaggedNoBuffer => T::DdpUntaggedNoBuffer,
        UntaggedTooLong => T::DdpUntaggedTooLong,
        // RFC 5041 §7: DDP local catastrophic error (etype 0, code 0x00).
        DdpLocal => T::DdpCatastrophic,

        // RFC 5040 §7: remote operation errors (etype 2).
        RdmapVersion => T::RdmapInvalidVersion,
        UnexpectedOpcode => T::RdmapUnexpectedOpcode,
        // As siw (siw_init_rresp): catastrophic, localized to the stream.
        IrdExceeded => T::RdmapCatastrophicStream,
        // RFC 5040 §7: remote protection errors (etype 1), siw_rdmap_error.
        ReadSource(MemError::InvalidStag | MemError::KeyMismatch) => T::RdmapInvalidStag,
        ReadSource(MemError::Bounds) => T::RdmapBaseBounds,
        ReadSource(MemError::AccessRights) => T::RdmapAccessRights,
        ReadSource(MemError::PdMismatch) => T::RdmapStagNotAssociated,
        CannotInvalidate => T::RdmapCannotInvalidate,
        // RFC 5040 §7: local catastrophic error (etype 0; the registry,
        // RFC 6580, leaves the code free: "0x0/0x0/ALL"). We send 0x00.
        RdmapLocal => T::RdmapLocalCatastrophicZero,
    }
}

impl Fault {
    /// The Terminate code for this cause ([`term_code`]).
    pub fn term_code(self) -> TermCode {
        term_code(self)
    }
}

impl core::fmt::Display for Fault {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.term_code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Fault::*;
    use MemError::*;

    /// Every cause, the triple it must go out with, and where the RFCs
    /// (as registered in RFC 6580) define that triple.
    #[rustfmt::skip]
    const TABLE: &[(Fault, (u8, u8, u8), &str)] = &[
        (FpduCrc,                  (2, 0, 0x02), "RFC 5044 §4.4, §8: CRC error"),
        (UlpduLength,              (2, 0, 0x03), "RFC 5044 §4.1, §8: FPDU start lost (marker/ULPDU length)"),
        (Marker,                   (2, 0, 0x03), "RFC 5044 §4.3, §8: marker and ULPDU length mismatch"),
        (MpaRequestReply,          (2, 0, 0x04), "RFC 5044 §7.1, §8: invalid MPA Request/Reply"),
        (InsufficientIrd,          (2, 0, 0x06), "RFC 6581 §8: insufficient IRD resources"),
        (NoMatchingRtr,            (2, 0, 0x07), "RFC 6581 §8: no matching RTR model"),
        (DdpVersion { tagged: true },  (1, 1, 0x04), "RFC 5041 §7: tagged buffer error, invalid DDP version"),
        (DdpVersion { tagged: false }, (1, 2, 0x06), "RFC 5041 §7: untagged buffer error, invalid DDP version"),
        (TaggedSink(InvalidStag),  (1, 1, 0x00), "RFC 5041 §7: tagged buffer error, invalid STag"),
        (TaggedSink(KeyMismatch),  (1, 1, 0x00), "RFC 5041 §7: tagged buffer error, invalid STag"),
        (TaggedSink(AccessRights), (1, 1, 0x00), "RFC 5041 §7: no access-rights code; invalid STag (siw)"),
        (TaggedSink(PdMismatch),   (1, 1, 0x02), "RFC 5041 §7: STag not associated with DDP stream"),
        (TaggedSink(Bounds),       (1, 1, 0x01), "RFC 5041 §7: base or bounds violation"),
        (UntaggedQn,               (1, 2, 0x01), "RFC 5041 §7: untagged buffer error, invalid QN"),
        (UntaggedMsn,              (1, 2, 0x03), "RFC 5041 §7: invalid MSN, MSN range is not valid"),
        (UntaggedMo,               (1, 2, 0x04), "RFC 5041 §7: invalid MO"),
        (UntaggedNoBuffer,         (1, 2, 0x02), "RFC 5041 §7: invalid MSN, no buffer available"),
        (UntaggedTooLong,          (1, 2, 0x05), "RFC 5041 §7: DDP message too long for available buffer"),
        (DdpLocal,                 (1, 0, 0x00), "RFC 5041 §7: local catastrophic"),
        (RdmapVersion,             (0, 2, 0x05), "RFC 5040 §7: remote operation error, invalid RDMAP version"),
        (UnexpectedOpcode,         (0, 2, 0x06), "RFC 5040 §7: remote operation error, unexpected opcode"),
        (IrdExceeded,              (0, 2, 0x07), "RFC 5040 §7: catastrophic error, localized to RDMAP stream"),
        (ReadSource(InvalidStag),  (0, 1, 0x00), "RFC 5040 §7: remote protection error, invalid STag"),
        (ReadSource(KeyMismatch),  (0, 1, 0x00), "RFC 5040 §7: remote protection error, invalid STag"),
        (ReadSource(Bounds),       (0, 1, 0x01), "RFC 5040 §7: base or bounds violation"),
        (ReadSource(AccessRights), (0, 1, 0x02), "RFC 5040 §7: access rights violation"),
        (ReadSource(PdMismatch),   (0, 1, 0x03), "RFC 5040 §7: STag not associated with RDMAP stream"),
        (CannotInvalidate,         (0, 1, 0x09), "RFC 5040 §7: STag cannot be invalidated"),
        (RdmapLocal,               (0, 0, 0x00), "RFC 5040 §7, RFC 6580: local catastrophic (code ALL)"),
    ];

    /// Fails to compile when a variant is added, so the table must grow.
    fn variant_index(f: Fault) -> usize {
        match f {
            FpduCrc => 0,
            UlpduLength => 1,
            Marker => 2,
            MpaRequestReply => 3,
            InsufficientIrd => 4,
            NoMatchingRtr => 5,
            DdpVersion { .. } => 6,
            TaggedSink(_) => 7,
            UntaggedQn => 8,
            UntaggedMsn => 9,
            UntaggedMo => 10,
            UntaggedNoBuffer => 11,
            UntaggedTooLong => 12,
            DdpLocal => 13,
            RdmapVersion => 14,
            UnexpectedOpcode => 15,
            IrdExceeded => 16,
            ReadSource(_) => 17,
            CannotInvalidate => 18,
            RdmapLocal => 19,
        }
    }

    #[test]
    fn every_fault_maps_to_its_rfc_code() {
        for &(fault, wire, rfc) in TABLE {
            let code = term_code(fault);
            assert_eq!(code.to_wire(), wire, "{fault:?}: {rfc}");
            assert_eq!(fault.term_code(), code);
            // Every code we send has a name (none goes out as Unknown).
            assert_eq!(
                crate::wire::terminate::TermCode::from_wire(wire.0, wire.1, wire.2),
                code
            );
            assert!(!matches!(code, TermCode::Unknown { .. }), "{fault:?}");
            assert!(!rfc.is_empty());
        }
        let mut seen = [false; 20];
        for &(f, ..) in TABLE {
            seen[variant_index(f)] = true;
        }
        assert!(
            seen.iter().all(|&s| s),
            "a Fault variant is missing from TABLE"
        );
        // Both memory checks: every MemError is listed.
        for e in [InvalidStag, KeyMismatch, PdMismatch, AccessRights, Bounds] {
            assert!(
                TABLE.iter().any(|t| t.0 == TaggedSink(e)),
                "TaggedSink({e:?})"
            );
            assert!(
                TABLE.iter().any(|t| t.0 == ReadSource(e)),
                "ReadSource({e:?})"
            );
        }
    }

    #[test]
    fn legacy_entry_points_use_the_mapping() {
        use crate::handshake::HandshakeError;
        use crate::wire::mpa::FpduError;
        for e in [InvalidStag, KeyMismatch, PdMismatch, AccessRights, Bounds] {
            assert_eq!(
                crate::engine::term_code_for_tagged(e),
                term_code(TaggedSink(e))
            );
            assert_eq!(
                crate::engine::term_code_for_read_source(e),
                term_code(ReadSource(e))
            );
        }
        assert_eq!(
            FpduError::LengthTooShort.term_code(),
            term_code(UlpduLength)
        );
        assert_eq!(
            FpduError::CrcMismatch {
                expected: 1,
                received: 2
            }
            .term_code(),
            term_code(FpduCrc)
        );
        assert_eq!(
            HandshakeError::BadKey.term_code(),
            Some(term_code(MpaRequestReply))
        );
        assert_eq!(
            HandshakeError::InsufficientIrd {
                ird: 1,
                peer_ord: 2
            }
            .term_code(),
            Some(term_code(InsufficientIrd))
        );
        assert_eq!(
            HandshakeError::NoMatchingRtr.term_code(),
            Some(term_code(NoMatchingRtr))
        );
        assert_eq!(HandshakeError::CrcPolicy("x").term_code(), None);
    }
}
