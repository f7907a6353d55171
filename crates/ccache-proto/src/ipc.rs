//! The IPC message: one fixed 16-byte frame, all fields big endian.
//!
//! ```text
//!  0      2    3     4          8                        16
//! +------+----+-----+----------+------------------------+
//! | 'CC' | v1 | kind| document |  value (version / code) |
//! +------+----+-----+----------+------------------------+
//! ```
//!
//! The same frame carries the Table 1 messages between the application
//! server (or update thread) and the application module over a unix
//! socket, and the two-sided version request/reply over TCP. `value` is the
//! document version in `READ_PROCEED`, `UPDATE_PROCEED`,
//! `UPDATE_COMMITTED` and `VERSION_REPLY`, an [`ErrorCode`] in `ERROR`, and
//! zero otherwise (ignored on receipt).
//!
//! Untrusted input goes through [`Packet::new_checked`] (after which no
//! accessor can panic) and [`Repr::parse`], which refuses a wrong magic,
//! an unknown format version or an unknown kind with an [`IpcError`].

use std::fmt;

/// Length of every message.
pub const MSG_LEN: usize = 16;
/// The magic: ASCII "CC".
pub const MAGIC: u16 = 0x4343;
/// The format version this crate speaks.
pub const FORMAT_VERSION: u8 = 1;

mod field {
    use std::ops::Range;
    pub const MAGIC: Range<usize> = 0..2;
    pub const VERSION: usize = 2;
    pub const KIND: usize = 3;
    pub const DOC: Range<usize> = 4..8;
    pub const VALUE: Range<usize> = 8..16;
}

/// What a message means. Unknown codes are kept (`Unknown`) so a view can
/// show them; [`Repr::parse`] refuses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kind {
    /// Reader → module: I want to read the document.
    ReadRequest,
    /// Module → reader: go ahead; you are in the read queue (value: version).
    ReadProceed,
    /// Reader → module: I have finished reading.
    ReadDone,
    /// Updater → module: I want to rewrite the document.
    UpdateRequest,
    /// Module → updater: the read queue is empty, write now (value: the
    /// version before the update).
    UpdateProceed,
    /// Updater → module: the new content is in place.
    UpdateDone,
    /// Module → updater: the update is published (value: the new version).
    UpdateCommitted,
    /// Proxy → version thread: what is the document's version?
    VersionRequest,
    /// Version thread → proxy (value: the version).
    VersionReply,
    /// Update server → module: name a document some registered proxy has
    /// accessed recently (value: a random number the module picks with).
    PickAccessed,
    /// Module → update server: that document (`doc`; value: how many
    /// documents it picked from).
    Picked,
    /// Module → client: the request was refused (value: an [`ErrorCode`]).
    Error,
    /// A code this version does not know.
    Unknown(u8),
}

impl From<u8> for Kind {
    fn from(b: u8) -> Kind {
        match b {
            1 => Kind::ReadRequest,
            2 => Kind::ReadProceed,
            3 => Kind::ReadDone,
            4 => Kind::UpdateRequest,
            5 => Kind::UpdateProceed,
            6 => Kind::UpdateDone,
            7 => Kind::UpdateCommitted,
            8 => Kind::VersionRequest,
            9 => Kind::VersionReply,
            10 => Kind::PickAccessed,
            11 => Kind::Picked,
            15 => Kind::Error,
            other => Kind::Unknown(other),
        }
    }
}

impl From<Kind> for u8 {
    fn from(k: Kind) -> u8 {
        match k {
            Kind::ReadRequest => 1,
            Kind::ReadProceed => 2,
            Kind::ReadDone => 3,
            Kind::UpdateRequest => 4,
            Kind::UpdateProceed => 5,
            Kind::UpdateDone => 6,
            Kind::UpdateCommitted => 7,
            Kind::VersionRequest => 8,
            Kind::VersionReply => 9,
            Kind::PickAccessed => 10,
            Kind::Picked => 11,
            Kind::Error => 15,
            Kind::Unknown(b) => b,
        }
    }
}

impl Kind {
    /// Every kind this version knows, in code order (the generated C
    /// header `tools/ccache/apache/ccache_ipc.h` lists the same).
    pub const ALL: [Kind; 12] = [
        Kind::ReadRequest,
        Kind::ReadProceed,
        Kind::ReadDone,
        Kind::UpdateRequest,
        Kind::UpdateProceed,
        Kind::UpdateDone,
        Kind::UpdateCommitted,
        Kind::VersionRequest,
        Kind::VersionReply,
        Kind::PickAccessed,
        Kind::Picked,
        Kind::Error,
    ];

    /// The name used in the seed's Table 1 (and in logs).
    pub fn name(self) -> &'static str {
        match self {
            Kind::ReadRequest => "READ_REQUEST",
            Kind::ReadProceed => "READ_PROCEED",
            Kind::ReadDone => "READ_DONE",
            Kind::UpdateRequest => "UPDATE_REQUEST",
            Kind::UpdateProceed => "UPDATE_PROCEED",
            Kind::UpdateDone => "UPDATE_DONE",
            Kind::UpdateCommitted => "UPDATE_COMMITTED",
            Kind::VersionRequest => "VERSION_REQUEST",
            Kind::VersionReply => "VERSION_REPLY",
            Kind::PickAccessed => "PICK_ACCESSED",
            Kind::Picked => "PICKED",
            Kind::Error => "ERROR",
            Kind::Unknown(_) => "UNKNOWN",
        }
    }
}

/// Why a request was refused (the `value` of an `ERROR` message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The document number is outside the version table.
    NoSuchDocument,
    /// The message does not fit the sender's state (e.g. `READ_DONE`
    /// without a read, a second request while one is open).
    OutOfOrder,
    /// The message was malformed (magic, version or kind).
    Malformed,
    /// A message only the module sends arrived from a client.
    NotARequest,
    /// The module could not answer now (a version slot kept changing);
    /// ask again; also: the module serves its most connections
    /// (`ccappd --ipc-max-conns`), and this one is closed after it.
    Busy,
    /// The peer's credentials (`SO_PEERCRED`, unix(7)) are not among the
    /// uids/gids the module allows (`ccappd --ipc-allow-user/-group`); the
    /// connection is closed after it.
    NotPermitted,
    /// A code this version does not know.
    Unknown(u64),
}

impl From<u64> for ErrorCode {
    fn from(v: u64) -> ErrorCode {
        match v {
            1 => ErrorCode::NoSuchDocument,
            2 => ErrorCode::OutOfOrder,
            3 => ErrorCode::Malformed,
            4 => ErrorCode::NotARequest,
            5 => ErrorCode::Busy,
            6 => ErrorCode::NotPermitted,
            other => ErrorCode::Unknown(other),
        }
    }
}

impl ErrorCode {
    /// Every code this version knows, in code order.
    pub const ALL: [ErrorCode; 6] = [
        ErrorCode::NoSuchDocument,
        ErrorCode::OutOfOrder,
        ErrorCode::Malformed,
        ErrorCode::NotARequest,
        ErrorCode::Busy,
        ErrorCode::NotPermitted,
    ];

    /// The name in logs, the shared vectors and the C header.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::NoSuchDocument => "NO_SUCH_DOCUMENT",
            ErrorCode::OutOfOrder => "OUT_OF_ORDER",
            ErrorCode::Malformed => "MALFORMED",
            ErrorCode::NotARequest => "NOT_A_REQUEST",
            ErrorCode::Busy => "BUSY",
            ErrorCode::NotPermitted => "NOT_PERMITTED",
            ErrorCode::Unknown(_) => "UNKNOWN",
        }
    }
}

impl From<ErrorCode> for u64 {
    fn from(c: ErrorCode) -> u64 {
        match c {
            ErrorCode::NoSuchDocument => 1,
            ErrorCode::OutOfOrder => 2,
            ErrorCode::Malformed => 3,
            ErrorCode::NotARequest => 4,
            ErrorCode::Busy => 5,
            ErrorCode::NotPermitted => 6,
            ErrorCode::Unknown(v) => v,
        }
    }
}

/// A malformed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpcError {
    /// Fewer than [`MSG_LEN`] bytes.
    Truncated {
        /// Bytes present.
        len: usize,
    },
    /// The first two bytes are not "CC": the peer does not speak this
    /// protocol.
    BadMagic(u16),
    /// A format version other than [`FORMAT_VERSION`].
    BadVersion(u8),
    /// A kind code this version does not know.
    UnknownKind(u8),
}

impl fmt::Display for IpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpcError::Truncated { len } => write!(
                f,
                "IPC message truncated: {len} of {MSG_LEN} bytes (the peer closed mid-message)"
            ),
            IpcError::BadMagic(m) => write!(
                f,
                "IPC message has magic {m:#06x}, not 0x4343 (\"CC\"): the peer is not a ccache client"
            ),
            IpcError::BadVersion(v) => write!(
                f,
                "IPC format version {v}, this build speaks {FORMAT_VERSION}: run matching ccappd and client versions"
            ),
            IpcError::UnknownKind(k) => write!(f, "IPC message kind {k} is unknown"),
        }
    }
}

impl std::error::Error for IpcError {}

/// A view of one message over a buffer.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap without checking (accessors may panic on a short buffer).
    pub fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap untrusted input: after this, no accessor panics.
    pub fn new_checked(buffer: T) -> Result<Packet<T>, IpcError> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Is the buffer long enough for every field?
    pub fn check_len(&self) -> Result<(), IpcError> {
        let len = self.buffer.as_ref().len();
        if len < MSG_LEN {
            Err(IpcError::Truncated { len })
        } else {
            Ok(())
        }
    }

    /// The magic field.
    pub fn magic(&self) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[field::MAGIC.start], b[field::MAGIC.start + 1]])
    }

    /// The format version.
    pub fn format_version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    /// The kind.
    pub fn kind(&self) -> Kind {
        Kind::from(self.buffer.as_ref()[field::KIND])
    }

    /// The document number.
    pub fn doc(&self) -> u32 {
        let mut w = [0u8; 4];
        w.copy_from_slice(&self.buffer.as_ref()[field::DOC]);
        u32::from_be_bytes(w)
    }

    /// The value (version or error code).
    pub fn value(&self) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&self.buffer.as_ref()[field::VALUE]);
        u64::from_be_bytes(w)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the magic field.
    pub fn set_magic(&mut self, v: u16) {
        self.buffer.as_mut()[field::MAGIC].copy_from_slice(&v.to_be_bytes());
    }
    /// Set the format version.
    pub fn set_format_version(&mut self, v: u8) {
        self.buffer.as_mut()[field::VERSION] = v;
    }
    /// Set the kind.
    pub fn set_kind(&mut self, k: Kind) {
        self.buffer.as_mut()[field::KIND] = u8::from(k);
    }
    /// Set the document number.
    pub fn set_doc(&mut self, d: u32) {
        self.buffer.as_mut()[field::DOC].copy_from_slice(&d.to_be_bytes());
    }
    /// Set the value.
    pub fn set_value(&mut self, v: u64) {
        self.buffer.as_mut()[field::VALUE].copy_from_slice(&v.to_be_bytes());
    }
}

/// A parsed, valid message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// What it means (never `Unknown` after `parse`).
    pub kind: Kind,
    /// The document (version slot) it is about.
    pub doc: u32,
    /// Version or error code; see the module docs.
    pub value: u64,
}

impl Repr {
    /// A message with value zero.
    pub fn new(kind: Kind, doc: u32) -> Repr {
        Repr {
            kind,
            doc,
            value: 0,
        }
    }

    /// A message with a value.
    pub fn with_value(kind: Kind, doc: u32, value: u64) -> Repr {
        Repr { kind, doc, value }
    }

    /// Parse a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr, IpcError> {
        p.check_len()?;
        if p.magic() != MAGIC {
            return Err(IpcError::BadMagic(p.magic()));
        }
        if p.format_version() != FORMAT_VERSION {
            return Err(IpcError::BadVersion(p.format_version()));
        }
        if let Kind::Unknown(k) = p.kind() {
            return Err(IpcError::UnknownKind(k));
        }
        Ok(Repr {
            kind: p.kind(),
            doc: p.doc(),
            value: p.value(),
        })
    }

    /// Bytes `emit` writes.
    pub fn buffer_len(&self) -> usize {
        MSG_LEN
    }

    /// Write into a view of at least [`MSG_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_magic(MAGIC);
        p.set_format_version(FORMAT_VERSION);
        p.set_kind(self.kind);
        p.set_doc(self.doc);
        p.set_value(self.value);
    }

    /// The message as a byte array.
    pub fn to_bytes(&self) -> [u8; MSG_LEN] {
        let mut b = [0u8; MSG_LEN];
        self.emit(&mut Packet::new_unchecked(&mut b[..]));
        b
    }

    /// Parse untrusted bytes.
    pub fn from_bytes(b: &[u8]) -> Result<Repr, IpcError> {
        Repr::parse(&Packet::new_checked(b)?)
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(doc {}, {})", self.kind.name(), self.doc, self.value)
    }
}

// The C header of mod_ccache, generated from this file and checked.
#[cfg(test)]
#[path = "ipc_c_header.rs"]
mod c_header;

#[cfg(test)]
mod tests {
    use super::*;

    // READ_PROCEED for document 7 at version 0x0102030405060708.
    const PROCEED: [u8; 16] = [
        0x43, 0x43, 0x01, 0x02, 0x00, 0x00, 0x00, 0x07, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07,
        0x08,
    ];

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&PROCEED[..]).unwrap();
        assert_eq!(p.magic(), MAGIC);
        assert_eq!(p.format_version(), 1);
        assert_eq!(p.kind(), Kind::ReadProceed);
        assert_eq!(p.doc(), 7);
        assert_eq!(p.value(), 0x0102_0304_0506_0708);
        assert_eq!(
            Repr::parse(&p).unwrap(),
            Repr::with_value(Kind::ReadProceed, 7, 0x0102_0304_0506_0708)
        );
    }

    #[test]
    fn construct() {
        let r = Repr::with_value(Kind::ReadProceed, 7, 0x0102_0304_0506_0708);
        assert_eq!(r.buffer_len(), 16);
        assert_eq!(r.to_bytes(), PROCEED);
    }

    #[test]
    fn every_kind_round_trips() {
        // ALL is complete: every code that is not Unknown is in it.
        let known = (0..=255u8).filter(|&b| !matches!(Kind::from(b), Kind::Unknown(_)));
        assert!(known.map(Kind::from).eq(Kind::ALL));
        let known = (0..=255u64).filter(|&v| !matches!(ErrorCode::from(v), ErrorCode::Unknown(_)));
        assert!(known.map(ErrorCode::from).eq(ErrorCode::ALL));
        for k in Kind::ALL {
            let r = Repr::with_value(k, u32::MAX, u64::MAX);
            assert_eq!(Repr::from_bytes(&r.to_bytes()), Ok(r), "{k:?}");
        }
        for b in 0..=255u8 {
            assert_eq!(u8::from(Kind::from(b)), b);
        }
    }

    #[test]
    fn truncated() {
        assert_eq!(
            Packet::new_checked(&PROCEED[..15]).unwrap_err(),
            IpcError::Truncated { len: 15 }
        );
        assert_eq!(
            Repr::from_bytes(&[]).unwrap_err(),
            IpcError::Truncated { len: 0 }
        );
        // A view made unchecked still refuses to parse.
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&PROCEED[..3])).unwrap_err(),
            IpcError::Truncated { len: 3 }
        );
    }

    #[test]
    fn malformed() {
        let mut b = PROCEED;
        b[0] = b'G'; // "GET / HTTP/1.1" sent to the IPC socket
        b[1] = b'E';
        assert_eq!(Repr::from_bytes(&b), Err(IpcError::BadMagic(0x4745)));
        let mut b = PROCEED;
        b[2] = 2;
        assert_eq!(Repr::from_bytes(&b), Err(IpcError::BadVersion(2)));
        let mut b = PROCEED;
        b[3] = 0;
        assert_eq!(Repr::from_bytes(&b), Err(IpcError::UnknownKind(0)));
        b[3] = 200;
        assert_eq!(Repr::from_bytes(&b), Err(IpcError::UnknownKind(200)));
        // The view still shows an unknown kind.
        assert_eq!(Packet::new_unchecked(&b[..]).kind(), Kind::Unknown(200));
    }

    #[test]
    fn longer_buffer_uses_first_sixteen_bytes() {
        let mut b = PROCEED.to_vec();
        b.extend_from_slice(b"trailing");
        assert_eq!(Repr::from_bytes(&b).unwrap().doc, 7);
    }

    #[test]
    fn error_codes_round_trip() {
        for v in 0..10u64 {
            assert_eq!(u64::from(ErrorCode::from(v)), v);
        }
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(b in proptest::collection::vec(proptest::num::u8::ANY, 0..40)) {
            if let Ok(r) = Repr::from_bytes(&b) {
                proptest::prop_assert_eq!(&r.to_bytes()[..], &b[..16]);
            }
        }
    }
}
