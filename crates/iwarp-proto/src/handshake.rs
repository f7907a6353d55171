//! MPA connection setup, sans-IO: RFC 5044 §7.1 (Request/Reply frames and
//! startup rules) with RFC 6581 (enhanced connection establishment: MPA
//! revision 2, IRD/ORD exchange, peer-to-peer RTR).
//!
//! # Call order
//!
//! Initiator (active side), after the TCP connection is up:
//! 1. send [`request`]`(cfg, pd)`;
//! 2. read 20 bytes, [`frame_len`] says how many more to read;
//! 3. [`parse_reply`]`(cfg, frame)` gives the [`Negotiated`] parameters (or
//!    `Rejected` / a policy error, after which the connection is closed; an
//!    error with a [`HandshakeError::term_code`] may first be reported to
//!    the peer with a Terminate);
//! 4. if `Negotiated::rtr` is `Some`, the first FPDU it sends is the RTR
//!    message of that type.
//!
//! Responder (passive side): read the Request with [`frame_len`], then
//! [`parse_request`]; the application decides, then either [`accept`]
//! (send the Reply; on `Err` send [`reject`] instead) or [`reject`]. With
//! `Negotiated::rtr` set the responder sends nothing until the RTR message
//! has arrived.
//!
//! # Negotiation rules
//!
//! - **Revision** (RFC 5044 §7.1.1, RFC 6581): revisions 1 and 2 are
//!   accepted. The Reply carries `min(request revision, own revision)`; an
//!   initiator refuses a Reply of a higher revision than it asked for.
//!   Revision 2 frames carry the E flag (0x10) and the 4-byte IRD/ORD block
//!   at the start of the private data (siw: flags `0x10`, rev 2).
//! - **CRC** (C flag, RFC 5044 §7.1.2): CRC is used in both directions if
//!   either side sets C; a responder must honour a Request with C set
//!   (siw: "CRC MUST be used if peer requests it"). [`Policy::Required`]
//!   sets C; [`Policy::Optional`] does not but follows the peer;
//!   [`Policy::Off`] refuses a peer that sets C.
//! - **Markers** (M flag, RFC 5044 §7.1.2): per direction. M in the Request
//!   asks the responder to put markers in the FPDUs it sends, M in the
//!   Reply asks the same of the initiator ([`Negotiated::markers_tx`] /
//!   [`Negotiated::markers_rx`]). `Required` sets M, `Optional` sends
//!   markers when asked, `Off` refuses a peer that asks (siw always
//!   refuses).
//! - **IRD/ORD** (RFC 6581): the Request carries the initiator's IRD and
//!   ORD. The responder answers `IRD = min(own IRD, initiator ORD)` and
//!   `ORD = min(own ORD, initiator IRD)`, so it never issues more RDMA
//!   Reads than the initiator can take. The initiator then uses
//!   `ORD = min(own ORD, responder IRD)` and `IRD = responder ORD`; a
//!   responder ORD above the initiator's advertised IRD is an "insufficient
//!   IRD" error (MPA Terminate code 0x06).
//! - **RTR / peer-to-peer** (RFC 6581): an initiator configured with
//!   `rtr: Some(_)` sets P2P and offers zero-length Write and Read (as siw
//!   does: `80 01 c0 01`), plus Send when that is its choice. The responder
//!   picks one offered type (its own `rtr` preference if offered, else
//!   Write, Read, Send in that order; if P2P comes with no type, Write, as
//!   siw does) and answers with P2P and that one bit. An initiator whose
//!   offer was not honoured fails with "no matching RTR" (code 0x07). With
//!   a revision 1 peer there is no RTR.

use core::fmt;

use crate::fault::Fault;
use crate::wire::mpa::{self, EnhancedParams, Frame, FrameKind, FrameRepr};
use crate::wire::terminate::TermCode;

/// A side's policy for CRC or markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Ask for it; refuse a peer that does not agree.
    Required,
    /// Do not ask, but go along with a peer that does.
    Optional,
    /// Never; refuse a peer that asks.
    Off,
}

impl Policy {
    /// The lower-case name used in messages ("required", "optional", "off").
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Required => "required",
            Policy::Optional => "optional",
            Policy::Off => "off",
        }
    }
}

/// Ready-to-receive message types of RFC 6581 peer-to-peer mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rtr {
    /// A zero-length RDMA Write (siw's preference).
    ZeroLengthWrite,
    /// A zero-length RDMA Read.
    ZeroLengthRead,
    /// A zero-length Send (needs a posted receive on the responder; siw
    /// does not support it).
    ZeroLengthSend,
}

/// Local MPA settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpaConfig {
    pub crc: Policy,
    pub markers: Policy,
    /// 1 (RFC 5044) or 2 (RFC 6581, default).
    pub revision: u8,
    /// Inbound RDMA Read depth offered (14 bits on the wire; clamped).
    pub ird: u16,
    /// Outbound RDMA Read depth wanted (14 bits on the wire; clamped).
    pub ord: u16,
    /// Peer-to-peer mode: `Some(preferred RTR type)`.
    pub rtr: Option<Rtr>,
}

impl Default for MpaConfig {
    /// Interoperates with a default siw: revision 2, CRC and markers
    /// optional (not requested; siw default requests neither), IRD = ORD =
    /// 16 advertised and negotiated down (siw's rping/perftest advertise
    /// 1/1), no peer-to-peer.
    fn default() -> Self {
        MpaConfig {
            crc: Policy::Optional,
            markers: Policy::Optional,
            revision: mpa::REVISION_2,
            ird: 16,
            ord: 16,
            rtr: None,
        }
    }
}

/// A parsed MPA Request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// M: the initiator wants markers on the FPDUs it receives.
    pub markers: bool,
    /// C: the initiator wants CRC.
    pub crc: bool,
    pub revision: u8,
    /// The RFC 6581 block (revision 2 with the E flag).
    pub enhanced: Option<EnhancedParams>,
    /// ULP private data (without the RFC 6581 block).
    pub private_data: Vec<u8>,
}

/// What both sides agreed on. The one description of a connection's MPA
/// terms: a connected queue pair reports it as is (`iwarp::ConnInfo`
/// holds it). The peer's private data travels beside it: in the
/// [`Request`] for the responder, as the second value of [`parse_reply`]
/// for the initiator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// CRC in both directions.
    pub crc: bool,
    /// This side inserts markers in the FPDUs it sends.
    pub markers_tx: bool,
    /// The peer inserts markers in the FPDUs this side receives.
    pub markers_rx: bool,
    /// Revision of the Reply.
    pub revision: u8,
    /// Inbound RDMA Reads the peer may have outstanding at this side.
    pub ird: u16,
    /// Outbound RDMA Reads this side may have outstanding.
    pub ord: u16,
    /// The RTR message: the initiator sends it, the responder waits for it.
    pub rtr: Option<Rtr>,
}

/// Why the setup failed. `Display` names the cause and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandshakeError {
    /// The key is not "MPA ID Req Frame" / "MPA ID Rep Frame" as expected.
    BadKey,
    /// A revision other than 1 or 2 (received, configured, or higher than
    /// requested).
    BadRevision(u8),
    /// Private data (with the RFC 6581 block) over 512 bytes.
    PrivateDataTooLong(usize),
    /// The responder set R.
    Rejected { private_data: Vec<u8> },
    /// CRC policies conflict; the string is the full message.
    CrcPolicy(&'static str),
    /// Marker policies conflict; the string is the full message.
    MarkerPolicy(&'static str),
    /// Fewer bytes than the frame needs.
    Truncated,
    /// The frame breaks a rule; the string names it.
    Malformed(&'static str),
    /// RFC 6581: the responder's ORD exceeds this side's IRD.
    InsufficientIrd { ird: u16, peer_ord: u16 },
    /// RFC 6581: peer-to-peer was requested but no offered RTR type was
    /// chosen.
    NoMatchingRtr,
}

impl HandshakeError {
    /// The MPA (LLP) Terminate code to report this error with, when one
    /// applies (RFC 5044 §8, RFC 6581). Policy conflicts are answered with
    /// a [`reject`] frame instead; a rejection needs no answer.
    pub fn term_code(&self) -> Option<TermCode> {
        self.fault().map(crate::fault::term_code)
    }

    /// The cause to report, when one applies (see [`HandshakeError::term_code`]).
    pub fn fault(&self) -> Option<Fault> {
        match self {
            HandshakeError::BadKey
            | HandshakeError::BadRevision(_)
            | HandshakeError::PrivateDataTooLong(_)
            | HandshakeError::Truncated
            | HandshakeError::Malformed(_) => Some(Fault::MpaRequestReply),
            HandshakeError::InsufficientIrd { .. } => Some(Fault::InsufficientIrd),
            HandshakeError::NoMatchingRtr => Some(Fault::NoMatchingRtr),
            HandshakeError::Rejected { .. }
            | HandshakeError::CrcPolicy(_)
            | HandshakeError::MarkerPolicy(_) => None,
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandshakeError::BadKey => write!(
                f,
                "MPA frame key is not the expected \"MPA ID Req Frame\"/\"MPA ID Rep Frame\": \
                 the peer is not speaking MPA here; check that the port is an iWARP listener \
                 and that the peer uses iWARP/MPA"
            ),
            HandshakeError::BadRevision(r) => write!(
                f,
                "MPA revision {r} is not supported (only 1 and 2, and a Reply may not exceed \
                 the requested revision); configure revision 1 (RFC 5044) or 2 (RFC 6581) \
                 on both sides"
            ),
            HandshakeError::PrivateDataTooLong(n) => write!(
                f,
                "MPA private data of {n} bytes exceeds the 512-byte limit of RFC 5044 \
                 (the 4-byte RFC 6581 IRD/ORD block counts); send at most 512 bytes, \
                 508 with revision 2 (Linux siw takes only 256)"
            ),
            HandshakeError::Rejected { private_data } => write!(
                f,
                "the peer rejected the MPA connection (R flag, {} bytes of private data); \
                 check its CRC/marker settings and why its application refused",
                private_data.len()
            ),
            HandshakeError::CrcPolicy(m) | HandshakeError::MarkerPolicy(m) => f.write_str(m),
            HandshakeError::Truncated => write!(
                f,
                "MPA frame truncated: fewer bytes than its header announces; \
                 read frame_len(header) bytes before parsing"
            ),
            HandshakeError::Malformed(m) => write!(f, "malformed MPA frame: {m}"),
            HandshakeError::InsufficientIrd { ird, peer_ord } => write!(
                f,
                "the responder's ORD {peer_ord} exceeds this side's IRD {ird} (RFC 6581); \
                 raise ird in MpaConfig or lower the peer's ORD"
            ),
            HandshakeError::NoMatchingRtr => write!(
                f,
                "peer-to-peer mode was requested but the responder chose no offered RTR \
                 message type (RFC 6581); set rtr to ZeroLengthWrite or ZeroLengthRead, \
                 or to None if the peer does not support peer-to-peer"
            ),
        }
    }
}

impl std::error::Error for HandshakeError {}

const CRC_REFUSED: &str =
    "peer requires MPA CRC but this side has crc=off; set crc=optional or required";
const CRC_NOT_GRANTED: &str = "this side has crc=required but the peer's Reply does not enable \
     MPA CRC; set crc=optional (or off), or enable CRC on the peer (siw: mpa_crc_required=1)";
const MARKERS_REFUSED: &str = "peer requires MPA markers on the FPDUs it receives but this side \
     has markers=off; set markers=optional or required";

fn check_revision(rev: u8) -> Result<u8, HandshakeError> {
    if rev == mpa::REVISION_1 || rev == mpa::REVISION_2 {
        Ok(rev)
    } else {
        Err(HandshakeError::BadRevision(rev))
    }
}

fn clamp14(v: u16) -> u16 {
    v.min(mpa::ENH_IRD_ORD_MASK)
}

fn check_pd_len(repr: &FrameRepr<'_>) -> Result<(), HandshakeError> {
    let n = repr.private_data_len();
    if n > mpa::MAX_PRIVATE_DATA_LEN {
        return Err(HandshakeError::PrivateDataTooLong(n));
    }
    Ok(())
}

/// Builds the MPA Request (RFC 5044 §7.1.1).
pub fn request(cfg: &MpaConfig, private_data: &[u8]) -> Result<Vec<u8>, HandshakeError> {
    let revision = check_revision(cfg.revision)?;
    let enhanced = (revision == mpa::REVISION_2).then(|| EnhancedParams {
        ird: clamp14(cfg.ird),
        ord: clamp14(cfg.ord),
        peer_to_peer: cfg.rtr.is_some(),
        rtr_zero_write: cfg.rtr.is_some(),
        rtr_zero_read: cfg.rtr.is_some(),
        rtr_zero_send: cfg.rtr == Some(Rtr::ZeroLengthSend),
    });
    let repr = FrameRepr {
        kind: FrameKind::Request,
        markers: cfg.markers == Policy::Required,
        crc: cfg.crc == Policy::Required,
        reject: false,
        revision,
        enhanced,
        private_data,
    };
    check_pd_len(&repr)?;
    Ok(repr.to_vec())
}

/// Total length of the frame whose first 20 bytes are `header`: checks
/// the key and the 512-byte limit (RFC 5044 §7.1.1).
pub fn frame_len(header: &[u8]) -> Result<usize, HandshakeError> {
    if header.len() < mpa::HEADER_LEN {
        return Err(HandshakeError::Truncated);
    }
    let f = Frame::new_unchecked(header);
    if f.kind().is_none() {
        return Err(HandshakeError::BadKey);
    }
    let n = f.private_data_len() as usize;
    if n > mpa::MAX_PRIVATE_DATA_LEN {
        return Err(HandshakeError::PrivateDataTooLong(n));
    }
    Ok(mpa::HEADER_LEN + n)
}

/// A checked frame: the view, the RFC 6581 block and the ULP private data.
type Parsed<'a> = (Frame<&'a [u8]>, Option<EnhancedParams>, &'a [u8]);

/// The common part of frame parsing: key, lengths, revision, and the RFC
/// 6581 block. Returns the view and the block/ULP-data split. A revision 1
/// frame's E flag is ignored (its private data is all ULP data), as siw
/// does.
fn parse_frame(frame: &[u8], kind: FrameKind) -> Result<Parsed<'_>, HandshakeError> {
    let total = frame_len(frame)?;
    let f = Frame::new_unchecked(frame);
    if f.kind() != Some(kind) {
        return Err(HandshakeError::BadKey);
    }
    if frame.len() < total {
        return Err(HandshakeError::Truncated);
    }
    let f = Frame::new_unchecked(&frame[..total]);
    check_revision(f.revision())?;
    let pd = &frame[mpa::HEADER_LEN..total];
    if f.revision() == mpa::REVISION_2 && f.enhanced() {
        if pd.len() < mpa::ENHANCED_BLOCK_LEN {
            return Err(HandshakeError::Malformed(
                "RFC 6581: E flag set but the private data is shorter than the IRD/ORD block",
            ));
        }
        Ok((
            f,
            Some(EnhancedParams::from_bytes(pd)),
            &pd[mpa::ENHANCED_BLOCK_LEN..],
        ))
    } else {
        Ok((f, None, pd))
    }
}

/// Parses an MPA Request (RFC 5044 §7.1.1). Bytes after the frame are not
/// looked at; an R flag in a Request is ignored.
pub fn parse_request(frame: &[u8]) -> Result<Request, HandshakeError> {
    let (f, enhanced, pd) = parse_frame(frame, FrameKind::Request)?;
    Ok(Request {
        markers: f.markers(),
        crc: f.crc(),
        revision: f.revision(),
        enhanced,
        private_data: pd.to_vec(),
    })
}

/// The responder's RTR choice among the types the initiator offered.
fn choose_rtr(offer: &EnhancedParams, preferred: Option<Rtr>) -> Rtr {
    let offered = |r: Rtr| match r {
        Rtr::ZeroLengthWrite => offer.rtr_zero_write,
        Rtr::ZeroLengthRead => offer.rtr_zero_read,
        Rtr::ZeroLengthSend => offer.rtr_zero_send,
    };
    if let Some(p) = preferred.filter(|&p| offered(p)) {
        return p;
    }
    [
        Rtr::ZeroLengthWrite,
        Rtr::ZeroLengthRead,
        Rtr::ZeroLengthSend,
    ]
    .into_iter()
    .find(|&r| offered(r))
    // P2P without any type: siw proposes a zero-length Write.
    .unwrap_or(Rtr::ZeroLengthWrite)
}

fn rtr_bits(p: &mut EnhancedParams, rtr: Rtr) {
    match rtr {
        Rtr::ZeroLengthWrite => p.rtr_zero_write = true,
        Rtr::ZeroLengthRead => p.rtr_zero_read = true,
        Rtr::ZeroLengthSend => p.rtr_zero_send = true,
    }
}

/// Accepts a Request: checks the policies (RFC 5044 §7.1.2), negotiates
/// IRD/ORD and RTR (RFC 6581) and builds the Reply. On `Err` the caller
/// sends [`reject`].
pub fn accept(
    cfg: &MpaConfig,
    req: &Request,
    private_data: &[u8],
) -> Result<(Vec<u8>, Negotiated), HandshakeError> {
    let own_rev = check_revision(cfg.revision)?;
    let revision = check_revision(req.revision)?.min(own_rev);

    // RFC 5044 §7.1.2: a Request with C set makes CRC mandatory.
    if req.crc && cfg.crc == Policy::Off {
        return Err(HandshakeError::CrcPolicy(CRC_REFUSED));
    }
    let crc = req.crc || cfg.crc == Policy::Required;

    // RFC 5044 §7.1.2: M in the Request asks for markers towards the
    // initiator.
    if req.markers && cfg.markers == Policy::Off {
        return Err(HandshakeError::MarkerPolicy(MARKERS_REFUSED));
    }
    let markers_rx = cfg.markers == Policy::Required;

    let (enhanced, ird, ord, rtr) = match req.enhanced {
        Some(offer) if revision == mpa::REVISION_2 => {
            let ird = clamp14(cfg.ird).min(offer.ord);
            let ord = clamp14(cfg.ord).min(offer.ird);
            let mut mine = EnhancedParams {
                ird,
                ord,
                ..Default::default()
            };
            let rtr = offer.peer_to_peer.then(|| choose_rtr(&offer, cfg.rtr));
            if let Some(r) = rtr {
                mine.peer_to_peer = true;
                rtr_bits(&mut mine, r);
            }
            (Some(mine), ird, ord, rtr)
        }
        _ => (None, cfg.ird, cfg.ord, None),
    };

    let repr = FrameRepr {
        kind: FrameKind::Reply,
        markers: markers_rx,
        crc,
        reject: false,
        revision,
        enhanced,
        private_data,
    };
    check_pd_len(&repr)?;
    Ok((
        repr.to_vec(),
        Negotiated {
            crc,
            markers_tx: req.markers,
            markers_rx,
            revision,
            ird,
            ord,
            rtr,
        },
    ))
}

/// A Reply with R set (RFC 5044 §7.1.1). It states this side's own
/// requirements in M and C, answers a revision 2 Request with a revision 2
/// frame carrying a zero IRD/ORD block (as siw does), and truncates the
/// private data to what fits.
pub fn reject(cfg: &MpaConfig, req: Option<&Request>, private_data: &[u8]) -> Vec<u8> {
    let own = check_revision(cfg.revision).unwrap_or(mpa::REVISION_1);
    let revision = req
        .and_then(|r| check_revision(r.revision).ok())
        .map_or(own, |r| r.min(own));
    let enhanced = req
        .filter(|r| r.enhanced.is_some() && revision == mpa::REVISION_2)
        .map(|_| EnhancedParams::default());
    let room = mpa::MAX_PRIVATE_DATA_LEN - enhanced.map_or(0, |_| mpa::ENHANCED_BLOCK_LEN);
    FrameRepr {
        kind: FrameKind::Reply,
        markers: cfg.markers == Policy::Required,
        crc: cfg.crc == Policy::Required,
        reject: true,
        revision,
        enhanced,
        private_data: &private_data[..private_data.len().min(room)],
    }
    .to_vec()
}

/// Parses the Reply to a Request built by [`request`]`(cfg, ..)`: the
/// negotiated terms and the responder's private data.
pub fn parse_reply(cfg: &MpaConfig, frame: &[u8]) -> Result<(Negotiated, Vec<u8>), HandshakeError> {
    let own_rev = check_revision(cfg.revision)?;
    let (f, enhanced, pd) = parse_frame(frame, FrameKind::Reply)?;
    if f.reject() {
        return Err(HandshakeError::Rejected {
            private_data: pd.to_vec(),
        });
    }
    let revision = f.revision();
    if revision > own_rev {
        return Err(HandshakeError::BadRevision(revision));
    }

    // RFC 5044 §7.1.2: CRC if either side sets C; the responder must echo
    // a C it received.
    if f.crc() && cfg.crc == Policy::Off {
        return Err(HandshakeError::CrcPolicy(CRC_REFUSED));
    }
    if !f.crc() && cfg.crc == Policy::Required {
        return Err(HandshakeError::CrcPolicy(CRC_NOT_GRANTED));
    }
    if f.markers() && cfg.markers == Policy::Off {
        return Err(HandshakeError::MarkerPolicy(MARKERS_REFUSED));
    }

    let (ird, ord, rtr) = if revision == mpa::REVISION_2 {
        // RFC 6581: a revision 2 responder answers a revision 2 Request
        // with the IRD/ORD block (siw fails the connection otherwise).
        let rep = enhanced.ok_or(HandshakeError::Malformed(
            "RFC 6581: revision 2 Reply without the E flag and IRD/ORD block",
        ))?;
        let my_ird = clamp14(cfg.ird);
        if rep.ord > my_ird {
            return Err(HandshakeError::InsufficientIrd {
                ird: my_ird,
                peer_ord: rep.ord,
            });
        }
        let rtr = match cfg.rtr {
            None => None,
            Some(pref) => {
                let offered_send = pref == Rtr::ZeroLengthSend;
                let chosen = [
                    (pref, true),
                    (Rtr::ZeroLengthWrite, true),
                    (Rtr::ZeroLengthRead, true),
                    (Rtr::ZeroLengthSend, offered_send),
                ]
                .into_iter()
                .find(|&(r, offered)| {
                    offered
                        && match r {
                            Rtr::ZeroLengthWrite => rep.rtr_zero_write,
                            Rtr::ZeroLengthRead => rep.rtr_zero_read,
                            Rtr::ZeroLengthSend => rep.rtr_zero_send && offered_send,
                        }
                })
                .map(|(r, _)| r);
                match chosen {
                    Some(r) if rep.peer_to_peer => Some(r),
                    _ => return Err(HandshakeError::NoMatchingRtr),
                }
            }
        };
        (rep.ord, clamp14(cfg.ord).min(rep.ird), rtr)
    } else {
        (cfg.ird, cfg.ord, None)
    };

    Ok((
        Negotiated {
            crc: f.crc() || cfg.crc == Policy::Required,
            markers_tx: f.markers(),
            markers_rx: cfg.markers == Policy::Required,
            revision,
            ird,
            ord,
            rtr,
        },
        pd.to_vec(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIW_DEFAULT_REQ: &[u8] = b"MPA ID Req Frame\x10\x02\x00\x04\x00\x01\x00\x01";
    const SIW_DEFAULT_REP: &[u8] = b"MPA ID Rep Frame\x10\x02\x00\x04\x00\x01\x00\x01";
    const SIW_P2P_REQ: &[u8] = b"MPA ID Req Frame\x10\x02\x00\x04\x80\x01\xc0\x01";

    fn siw_like() -> MpaConfig {
        MpaConfig {
            ird: 1,
            ord: 1,
            ..Default::default()
        }
    }

    #[test]
    fn request_matches_siw_bytes() {
        assert_eq!(request(&siw_like(), &[]).unwrap(), SIW_DEFAULT_REQ);
        let p2p = MpaConfig {
            rtr: Some(Rtr::ZeroLengthWrite),
            ..siw_like()
        };
        assert_eq!(request(&p2p, &[]).unwrap(), SIW_P2P_REQ);
    }

    #[test]
    fn accept_siw_request_like_siw() {
        let req = parse_request(SIW_DEFAULT_REQ).unwrap();
        let (reply, n) = accept(&MpaConfig::default(), &req, &[]).unwrap();
        assert_eq!(reply, SIW_DEFAULT_REP);
        assert_eq!((n.ird, n.ord, n.crc, n.rtr), (1, 1, false, None));
        let (back, pd) = parse_reply(&siw_like(), SIW_DEFAULT_REP).unwrap();
        assert!(pd.is_empty());
        assert_eq!((back.ird, back.ord), (1, 1));
    }

    #[test]
    fn messages_name_the_fix() {
        let e = HandshakeError::CrcPolicy(CRC_REFUSED).to_string();
        assert!(e.contains("crc=off") && e.contains("set crc=optional or required"));
    }
}
