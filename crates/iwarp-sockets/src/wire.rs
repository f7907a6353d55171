//! The rsockets wire formats, as librdmacm's `librdmacm/rsocket.c`
//! (linux-rdma/rdma-core) defines them for stream sockets.
//!
//! Three things travel between two rsockets:
//!
//! 1. **The message word** ([`MsgWord`], [`Message`]): 32 bits, the op code
//!    in bits 31..29 and a 29-bit value below (`rs_msg_set`, `rs_msg_op`,
//!    `rs_msg_data` in rsocket.c). On InfiniBand/RoCE it is the immediate
//!    data of an RDMA Write with Immediate, converted with `htonl` (big
//!    endian on the wire). iWARP has no Write with Immediate, so rsocket.c
//!    sets `RS_OPT_MSG_SEND` when `transport_type == IBV_TRANSPORT_IWARP`
//!    (`rs_create_ep`) and sends the word as the 4-byte payload of an inline
//!    Send. That payload is **the sender's host-order `uint32_t`, not
//!    converted**: `rs_post_msg` and `rs_post_write_msg` set
//!    `sge.addr = (uintptr_t) &msg; sge.length = sizeof msg;` with `msg` the
//!    value built by `rs_msg_set`, and the receiver, `rs_poll_cq`, reads it
//!    back with `msg = ((uint32_t *) (rs->rbuf + rs->rbuf_size))[rs_wr_data(wc.wr_id)];`
//!    — again no `ntohl` (only the immediate-data branch has
//!    `msg = ntohl(wc.imm_data)`). On the x86-64 and arm64 hosts rsocket
//!    runs on, that is **little endian**; [`MsgWord::to_send_payload`]
//!    takes the [`ByteOrder`] explicitly so the choice is visible.
//! 2. **The connection private data** ([`ConnData`]): `struct rs_conn_data`,
//!    40 bytes, sent by `rs_do_connect` in the MPA Request and by `raccept`
//!    in the MPA Reply. `rs_format_conn_data` converts every multi-byte
//!    field with `htons`/`htonl`/`htonll`, so it is **big endian**,
//!    whatever the host. The flag `RS_CONN_FLAG_NET` says whether the
//!    *sender's host* is big endian (`rs_host_is_net()`, i.e.
//!    `1 == htonl(1)`); it governs the byte order of the SGEs the peer will
//!    later RDMA-Write into the sender's memory (point 3), not the conn data.
//! 3. **SGEs written by RDMA Write** ([`Sge`], `struct rs_sge`: addr u64,
//!    key u32, length u32 — in that order): a receiver announces a freed
//!    half of its receive buffer by RDMA-Writing an `rs_sge` into the
//!    sender's *target SGL* (an array of `RS_SGL_SIZE` = 2 entries whose
//!    address and rkey are in the conn data). `rs_send_credits` writes it in
//!    its own host order, or byte-swapped (`bswap_64`/`bswap_32`) when
//!    `RS_OPT_SWAP_SGL` is set, which `rs_save_conn_data` sets when the
//!    peer's `RS_CONN_FLAG_NET` differs from the local host: the entry lands
//!    **in the owner's host order**. [`Sge::emit`] / [`Sge::parse`] take
//!    that order.
//!
//! ## No rdma_cm header in front on iWARP
//!
//! On InfiniBand the kernel's rdma_cm prepends its own `struct cma_hdr` to
//! the private data of a REQ, and for `AF_IB` addresses rsocket.c itself
//! reserves `sizeof(struct ib_connect_hdr)` in front of `rs_conn_data`
//! (`rs_conn_data_offset` returns it only when
//! `src_addr.sa_family == AF_IB`, else 0). On iWARP neither applies: the
//! kernel's `cma_connect_iw` (drivers/infiniband/core/cma.c) copies
//! `conn_param->private_data` / `private_data_len` unchanged into
//! `iw_cm_conn_param`, and the iWARP CM carries it as the MPA private data
//! (RFC 5044 §7.1; with enhanced setup, RFC 6581 §5 puts its own 4-byte
//! IRD/ORD block in front, which the MPA layer adds and strips). So the MPA
//! private data of an rsocket connection over iWARP **starts with `rs_conn_data`**
//! at offset 0 and is exactly [`CONN_DATA_LEN`] bytes long.
//!
//! ## What rsocket.c checks, and what we check
//!
//! rsocket.c checks only `version == 1` (`raccept`, `rs_do_connect`:
//! `ENOTSUP` otherwise) and never the length of the private data. We also
//! refuse a private data shorter than 40 bytes ([`WireError::Truncated`]).
//! Its receive path treats every op other than SGL, IOMAP_SGL, CTRL and
//! WRITE as data (the `default:` branch of `rs_poll_cq`), reserved ops
//! included; [`Message::parse`] refuses the reserved ops and unknown
//! control values instead, so that a malformed word ends the connection
//! rather than being delivered as data.

use core::fmt;

/// Bytes of a message word on the wire (`RS_MSG_SIZE`).
pub const MSG_SIZE: usize = 4;
/// The op code sits in bits 31..29 (`rs_msg_set`: `op << 29`).
pub const OP_SHIFT: u32 = 29;
/// The value occupies bits 28..0 (`rs_msg_data`: `imm_data & 0x1FFFFFFF`).
pub const DATA_MASK: u32 = 0x1FFF_FFFF;
/// The largest value a message word carries.
pub const DATA_MAX: u32 = DATA_MASK;
/// Version of `struct rs_conn_data` (`rs_format_conn_data`: `conn->version = 1`).
pub const CONN_DATA_VERSION: u8 = 1;
/// Bytes of `struct rs_conn_data` (8 bytes of header, two 16-byte `rs_sge`).
pub const CONN_DATA_LEN: usize = 40;
/// Bytes of `struct rs_sge` (addr u64, key u32, length u32).
pub const SGE_LEN: usize = 16;
/// Bytes of `struct rs_iomap` (offset u64, then an `rs_sge`).
pub const IOMAP_LEN: usize = 24;
/// Entries of the target SGL every rsocket advertises (`RS_SGL_SIZE`).
pub const SGL_SIZE: u32 = 2;

/// `RS_CONN_FLAG_NET`: the sender's host is big endian ("network order").
pub const CONN_FLAG_NET: u8 = 1 << 0;
/// `RS_CONN_FLAG_IOMAP`: `target_iomap_size` is meaningful; the iomap
/// follows the target SGL in the same registered region.
pub const CONN_FLAG_IOMAP: u8 = 1 << 1;
/// This library's own flag, not rsockets': "I post a receive for one
/// credit update per data message I may receive", which lets a peer that
/// follows the seed paper's basic design return a credit after every
/// message its reader consumes (`flow::Config::ack_each`). rsocket.c
/// never sets it and ignores it (`rs_save_conn_data` tests NET and IOMAP
/// only), so toward rsocket.c the basic design keeps the ring credits
/// alone. The top bit, far from the two rsockets uses.
pub const CONN_FLAG_ACK_EACH: u8 = 1 << 7;

/// A byte order, as rsockets uses two: the fixed big-endian conn data, and
/// the host order of whoever built a message word or owns an SGE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ByteOrder {
    /// Least significant byte first (x86-64, arm64 Linux).
    Little,
    /// Most significant byte first ("network order").
    Big,
}

impl ByteOrder {
    /// The order of the machine this code runs on.
    #[cfg(target_endian = "little")]
    pub const NATIVE: ByteOrder = ByteOrder::Little;
    /// The order of the machine this code runs on.
    #[cfg(target_endian = "big")]
    pub const NATIVE: ByteOrder = ByteOrder::Big;

    /// The order a peer declares with `RS_CONN_FLAG_NET` in its conn data.
    pub const fn from_net_flag(net: bool) -> ByteOrder {
        if net {
            ByteOrder::Big
        } else {
            ByteOrder::Little
        }
    }

    /// Whether this order sets `RS_CONN_FLAG_NET` (`rs_host_is_net()`).
    pub const fn is_net(self) -> bool {
        matches!(self, ByteOrder::Big)
    }

    fn u32_from(self, b: [u8; 4]) -> u32 {
        match self {
            ByteOrder::Little => u32::from_le_bytes(b),
            ByteOrder::Big => u32::from_be_bytes(b),
        }
    }

    fn u32_to(self, v: u32) -> [u8; 4] {
        match self {
            ByteOrder::Little => v.to_le_bytes(),
            ByteOrder::Big => v.to_be_bytes(),
        }
    }

    fn u64_from(self, b: [u8; 8]) -> u64 {
        match self {
            ByteOrder::Little => u64::from_le_bytes(b),
            ByteOrder::Big => u64::from_be_bytes(b),
        }
    }

    fn u64_to(self, v: u64) -> [u8; 8] {
        match self {
            ByteOrder::Little => v.to_le_bytes(),
            ByteOrder::Big => v.to_be_bytes(),
        }
    }
}

/// What is wrong with bytes or values handed to this module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than the format needs.
    Truncated {
        /// Which format.
        what: &'static str,
        /// Bytes it needs.
        need: usize,
        /// Bytes there were.
        got: usize,
    },
    /// `rs_conn_data.version` is not 1.
    UnsupportedVersion(u8),
    /// A value does not fit the 29 bits of a message word.
    ValueTooLarge(u32),
    /// A message word uses one of the reserved ops (1, 3, 5).
    ReservedOp(Op),
    /// An `RS_OP_CTRL` word with a value other than disconnect (0),
    /// keepalive (1) or shutdown (2).
    UnknownCtrl(u32),
    /// An `RS_OP_IOMAP_SGL` word with bits 28..16 set (reserved).
    IomapReservedBits(u32),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            WireError::Truncated { what, need, got } => write!(
                f,
                "{what} needs {need} bytes but only {got} arrived; the peer is not an rsocket \
                 (or a different protocol answered on this port): check that both ends run \
                 rsockets over the same transport"
            ),
            WireError::UnsupportedVersion(v) => write!(
                f,
                "rs_conn_data version {v} is not supported (only version 1 exists in \
                 librdmacm's rsocket.c); upgrade or downgrade the peer to a librdmacm that \
                 speaks version 1"
            ),
            WireError::ValueTooLarge(v) => write!(
                f,
                "value {v:#x} does not fit the 29 bits of an rsockets message word; split the \
                 transfer (rsocket.c never moves more than RS_MAX_TRANSFER = 65536 bytes per word)"
            ),
            WireError::ReservedOp(op) => write!(
                f,
                "message word uses reserved op {} ({op:?}), which no rsocket sends; the peer is \
                 corrupt or speaks another protocol: close the connection",
                op as u8
            ),
            WireError::UnknownCtrl(v) => write!(
                f,
                "control message value {v} is none of disconnect (0), keepalive (1), shutdown \
                 (2); the peer is corrupt or newer than this implementation: close the connection"
            ),
            WireError::IomapReservedBits(v) => write!(
                f,
                "RS_OP_IOMAP_SGL value {v:#x} sets reserved bits 28..16; the peer is corrupt: \
                 close the connection"
            ),
        }
    }
}

impl std::error::Error for WireError {}

/// Result of this module.
pub type Result<T> = core::result::Result<T, WireError>;

fn need(what: &'static str, need: usize, b: &[u8]) -> Result<()> {
    if b.len() < need {
        Err(WireError::Truncated {
            what,
            need,
            got: b.len(),
        })
    } else {
        Ok(())
    }
}

/// The op code of a message word (bits 31..29), the anonymous `enum` of
/// rsocket.c in its order. Three bits, so every value has a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Op {
    /// `RS_OP_DATA`: the preceding RDMA Write put `value` bytes into the
    /// receive buffer.
    Data = 0,
    /// `RS_OP_RSVD_DATA_MORE` (bit 29 "more data" of the header comment;
    /// never sent).
    RsvdDataMore = 1,
    /// `RS_OP_WRITE`: a direct write into an iomap (`riowrite`). The
    /// comment in rsocket.c: "opcode is not transmitted over the network";
    /// it only tags the local work request.
    Write = 2,
    /// `RS_OP_RSVD_DRA_MORE` (never sent).
    RsvdDraMore = 3,
    /// `RS_OP_SGL`: credit update; `value` is the new send limit
    /// (`rseq_no + rq_size`), possibly after an RDMA Write of an `rs_sge`
    /// into the target SGL.
    Sgl = 4,
    /// `RS_OP_RSVD` (never sent).
    Rsvd = 5,
    /// `RS_OP_IOMAP_SGL`: an `rs_iomap` entry was written; bits 15..0 are
    /// its index.
    IomapSgl = 6,
    /// `RS_OP_CTRL`: `value` is an [`Ctrl`] code.
    Ctrl = 7,
}

impl Op {
    /// The op of bits 2..0 of `bits` (higher bits ignored).
    pub const fn from_bits(bits: u8) -> Op {
        match bits & 7 {
            0 => Op::Data,
            1 => Op::RsvdDataMore,
            2 => Op::Write,
            3 => Op::RsvdDraMore,
            4 => Op::Sgl,
            5 => Op::Rsvd,
            6 => Op::IomapSgl,
            _ => Op::Ctrl,
        }
    }
}

/// The value of an `RS_OP_CTRL` word (the second anonymous `enum`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Ctrl {
    /// `RS_CTRL_DISCONNECT` (0): both directions are closed.
    Disconnect,
    /// `RS_CTRL_KEEPALIVE` (1). rsocket.c's keepalive thread never sends it
    /// as a message word: `tcp_svc_send_keepalive` posts a zero-length RDMA
    /// Write whose *work request id* carries it (see [`crate::flow`]).
    Keepalive,
    /// `RS_CTRL_SHUTDOWN` (2): the sender will send no more data.
    Shutdown,
}

impl Ctrl {
    /// The 29-bit value of this control code.
    pub const fn value(self) -> u32 {
        match self {
            Ctrl::Disconnect => 0,
            Ctrl::Keepalive => 1,
            Ctrl::Shutdown => 2,
        }
    }

    /// The control code of a value, if it is one rsocket.c defines.
    pub const fn from_value(v: u32) -> Option<Ctrl> {
        match v {
            0 => Some(Ctrl::Disconnect),
            1 => Some(Ctrl::Keepalive),
            2 => Some(Ctrl::Shutdown),
            _ => None,
        }
    }
}

/// A raw message word: any op, any 29-bit value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MsgWord(u32);

impl MsgWord {
    /// `rs_msg_set(op, value)`; refuses a value above 29 bits.
    pub fn new(op: Op, value: u32) -> Result<MsgWord> {
        if value > DATA_MAX {
            return Err(WireError::ValueTooLarge(value));
        }
        Ok(MsgWord(((op as u32) << OP_SHIFT) | value))
    }

    /// The word as a `u32` (as built by `rs_msg_set`).
    pub const fn from_u32(word: u32) -> MsgWord {
        MsgWord(word)
    }

    /// The word as a `u32`.
    pub const fn as_u32(self) -> u32 {
        self.0
    }

    /// `rs_msg_op`: bits 31..29.
    pub const fn op(self) -> Op {
        Op::from_bits((self.0 >> OP_SHIFT) as u8)
    }

    /// `rs_msg_data`: bits 28..0.
    pub const fn value(self) -> u32 {
        self.0 & DATA_MASK
    }

    /// The 4-byte Send payload that carries the word on iWARP
    /// (`RS_OPT_MSG_SEND`): the sender's host-order `uint32_t`, so `order`
    /// is the sender's order ([`ByteOrder::NATIVE`] for us).
    pub fn to_send_payload(self, order: ByteOrder) -> [u8; MSG_SIZE] {
        order.u32_to(self.0)
    }

    /// Reads the 4-byte Send payload of an iWARP rsocket; `order` is the
    /// sender's host order (rsocket.c reads it in its own host order, which
    /// is the same thing between hosts of one endianness).
    pub fn from_send_payload(payload: &[u8], order: ByteOrder) -> Result<MsgWord> {
        need("rsockets message (Send payload)", MSG_SIZE, payload)?;
        Ok(MsgWord(order.u32_from([
            payload[0], payload[1], payload[2], payload[3],
        ])))
    }

    /// The immediate data bytes on InfiniBand/RoCE (`wr.imm_data = htonl(msg)`):
    /// big endian. Not used on iWARP; here for completeness and tests.
    pub fn to_imm_bytes(self) -> [u8; MSG_SIZE] {
        self.0.to_be_bytes()
    }
}

/// A message word with a meaning: what [`Message::parse`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Message {
    /// `RS_OP_DATA`: `len` bytes were RDMA-Written just before.
    Data {
        /// Bytes written (rsocket.c: at most `RS_MAX_TRANSFER` = 65536).
        len: u32,
    },
    /// `RS_OP_WRITE` (never on the wire in rsocket.c; parsed so the state
    /// machine can name it).
    Write {
        /// Bytes written.
        len: u32,
    },
    /// `RS_OP_SGL`: the peer may send data messages until its count
    /// reaches `limit` (compared modulo 2^16: `rs_poll_cq` stores
    /// `(uint16_t) rs_msg_data(msg)` in `sseq_comp`). The value on the
    /// wire is `rseq_no + rq_size` computed in `int`, so it may exceed
    /// 0xFFFF.
    Sgl {
        /// The raw 29-bit value.
        limit: u32,
    },
    /// `RS_OP_IOMAP_SGL`: iomap entry `index` was written.
    IomapSgl {
        /// Bits 15..0.
        index: u16,
    },
    /// `RS_OP_CTRL`.
    Ctrl(Ctrl),
}

impl Message {
    /// Gives a raw word its meaning; refuses the reserved ops, unknown
    /// control values and iomap words with reserved bits.
    pub fn parse(word: MsgWord) -> Result<Message> {
        let v = word.value();
        match word.op() {
            Op::Data => Ok(Message::Data { len: v }),
            Op::Write => Ok(Message::Write { len: v }),
            Op::Sgl => Ok(Message::Sgl { limit: v }),
            Op::IomapSgl => {
                // rsocket.c header comment: "IOMAP_SGL bits [28-16]: reserved,
                // bits [15-0]: index".
                if v > 0xFFFF {
                    Err(WireError::IomapReservedBits(v))
                } else {
                    Ok(Message::IomapSgl { index: v as u16 })
                }
            }
            Op::Ctrl => Ctrl::from_value(v)
                .map(Message::Ctrl)
                .ok_or(WireError::UnknownCtrl(v)),
            op @ (Op::RsvdDataMore | Op::RsvdDraMore | Op::Rsvd) => Err(WireError::ReservedOp(op)),
        }
    }

    /// The word of this message; refuses lengths and limits above 29 bits.
    pub fn emit(self) -> Result<MsgWord> {
        match self {
            Message::Data { len } => MsgWord::new(Op::Data, len),
            Message::Write { len } => MsgWord::new(Op::Write, len),
            Message::Sgl { limit } => MsgWord::new(Op::Sgl, limit),
            Message::IomapSgl { index } => MsgWord::new(Op::IomapSgl, u32::from(index)),
            Message::Ctrl(c) => MsgWord::new(Op::Ctrl, c.value()),
        }
    }

    /// Reads an iWARP Send payload (see [`MsgWord::from_send_payload`]) and
    /// parses it.
    pub fn from_send_payload(payload: &[u8], order: ByteOrder) -> Result<Message> {
        Message::parse(MsgWord::from_send_payload(payload, order)?)
    }
}

/// `struct rs_sge`: a buffer (address, rkey, length), 16 bytes, in the
/// order its *owner* reads it in (see the module doc, point 3).
///
/// ```text
/// 0..8   addr
/// 8..12  key
/// 12..16 length
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sge {
    /// Remote address (`uint64_t addr`).
    pub addr: u64,
    /// Remote key (`uint32_t key`).
    pub key: u32,
    /// Length in bytes (`uint32_t length`).
    pub length: u32,
}

mod sge_field {
    pub const ADDR: core::ops::Range<usize> = 0..8;
    pub const KEY: core::ops::Range<usize> = 8..12;
    pub const LENGTH: core::ops::Range<usize> = 12..16;
}

impl Sge {
    /// Reads an SGE stored in `order`.
    pub fn parse(b: &[u8], order: ByteOrder) -> Result<Sge> {
        need("rs_sge", SGE_LEN, b)?;
        Ok(Sge {
            addr: order.u64_from(b[sge_field::ADDR].try_into().expect("8 bytes")),
            key: order.u32_from(b[sge_field::KEY].try_into().expect("4 bytes")),
            length: order.u32_from(b[sge_field::LENGTH].try_into().expect("4 bytes")),
        })
    }

    /// Writes the SGE in `order` into the first 16 bytes of `b`.
    pub fn emit(&self, b: &mut [u8], order: ByteOrder) -> Result<()> {
        need("rs_sge", SGE_LEN, b)?;
        b[sge_field::ADDR].copy_from_slice(&order.u64_to(self.addr));
        b[sge_field::KEY].copy_from_slice(&order.u32_to(self.key));
        b[sge_field::LENGTH].copy_from_slice(&order.u32_to(self.length));
        Ok(())
    }

    /// The 16 bytes of this SGE in `order`.
    pub fn to_bytes(&self, order: ByteOrder) -> [u8; SGE_LEN] {
        let mut b = [0; SGE_LEN];
        self.emit(&mut b, order).expect("16 bytes");
        b
    }
}

/// `struct rs_iomap`: an `offset` and an [`Sge`], 24 bytes, written by RDMA
/// Write (`rs_send_iomaps`) in the owner's order like [`Sge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Iomap {
    /// The offset `riomap` mapped the buffer at.
    pub offset: u64,
    /// The buffer.
    pub sge: Sge,
}

impl Iomap {
    /// Reads an iomap entry stored in `order`.
    pub fn parse(b: &[u8], order: ByteOrder) -> Result<Iomap> {
        need("rs_iomap", IOMAP_LEN, b)?;
        Ok(Iomap {
            offset: order.u64_from(b[0..8].try_into().expect("8 bytes")),
            sge: Sge::parse(&b[8..], order)?,
        })
    }

    /// Writes the entry in `order` into the first 24 bytes of `b`.
    pub fn emit(&self, b: &mut [u8], order: ByteOrder) -> Result<()> {
        need("rs_iomap", IOMAP_LEN, b)?;
        b[0..8].copy_from_slice(&order.u64_to(self.offset));
        self.sge.emit(&mut b[8..], order)
    }
}

/// `rs_value_to_scale(value, 8)`: how `target_iomap_size` fits a byte.
/// Up to 128 the value itself; above, bit 7 set and `value >> 8` below it
/// (so sizes above 128 are multiples of 256, rounded down).
pub const fn iomap_value_to_scale(value: u16) -> u8 {
    if value <= 128 {
        value as u8
    } else {
        0x80 | ((value >> 8) as u8 & 0x7f)
    }
}

/// `rs_scale_to_value(scale, 8)`: the inverse of [`iomap_value_to_scale`].
pub const fn iomap_scale_to_value(scale: u8) -> u16 {
    if scale <= 128 {
        scale as u16
    } else {
        ((scale & 0x7f) as u16) << 8
    }
}

mod conn_field {
    use core::ops::Range;
    pub const VERSION: usize = 0;
    pub const FLAGS: usize = 1;
    pub const CREDITS: Range<usize> = 2..4;
    pub const RESERVED: Range<usize> = 4..7;
    pub const TARGET_IOMAP_SIZE: usize = 7;
    pub const TARGET_SGL: Range<usize> = 8..24;
    pub const DATA_BUF: Range<usize> = 24..40;
}

/// A view of `struct rs_conn_data`, the connection private data (all
/// multi-byte fields big endian, `rs_format_conn_data`):
///
/// ```text
/// 0      version            1
/// 1      flags              RS_CONN_FLAG_NET (bit 0) | RS_CONN_FLAG_IOMAP (bit 1)
///                           (| CONN_FLAG_ACK_EACH (bit 7), ours alone)
/// 2..4   credits            htons(rq_size): data messages the peer may send
/// 4..7   reserved           0
/// 7      target_iomap_size  rs_value_to_scale(target_iomap_size, 8)
/// 8..16  target_sgl.addr    htonll: the target SGL array (RS_SGL_SIZE entries)
/// 16..20 target_sgl.key     htonl: its rkey
/// 20..24 target_sgl.length  htonl(RS_SGL_SIZE) = 2: entries, not bytes
/// 24..32 data_buf.addr      htonll: the receive buffer
/// 32..36 data_buf.key       htonl: its rkey
/// 36..40 data_buf.length    htonl(rbuf_size >> 1): the first half, the
///                           peer's initial target_sgl[0]
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnData<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ConnData<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> ConnData<T> {
        ConnData { buffer }
    }

    /// Wraps a buffer and checks it holds the 40 bytes. Longer private
    /// data is accepted (the bytes past 40 are not looked at, as in
    /// rsocket.c).
    pub fn new_checked(buffer: T) -> Result<ConnData<T>> {
        let v = ConnData::new_unchecked(buffer);
        v.check_len()?;
        Ok(v)
    }

    /// Checks the length; after `Ok` no accessor panics.
    pub fn check_len(&self) -> Result<()> {
        need(
            "rs_conn_data (connection private data)",
            CONN_DATA_LEN,
            self.buffer.as_ref(),
        )
    }

    /// Returns the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// `version`.
    pub fn version(&self) -> u8 {
        self.b()[conn_field::VERSION]
    }

    /// `flags`, all bits.
    pub fn flags(&self) -> u8 {
        self.b()[conn_field::FLAGS]
    }

    /// `credits` (big endian on the wire).
    pub fn credits(&self) -> u16 {
        u16::from_be_bytes(self.b()[conn_field::CREDITS].try_into().expect("2 bytes"))
    }

    /// `reserved[3]`.
    pub fn reserved(&self) -> [u8; 3] {
        self.b()[conn_field::RESERVED].try_into().expect("3 bytes")
    }

    /// `target_iomap_size` as sent (scaled, see [`iomap_scale_to_value`]).
    pub fn target_iomap_size_scaled(&self) -> u8 {
        self.b()[conn_field::TARGET_IOMAP_SIZE]
    }

    /// `target_sgl` (big endian on the wire).
    pub fn target_sgl(&self) -> Sge {
        Sge::parse(&self.b()[conn_field::TARGET_SGL], ByteOrder::Big).expect("checked length")
    }

    /// `data_buf` (big endian on the wire).
    pub fn data_buf(&self) -> Sge {
        Sge::parse(&self.b()[conn_field::DATA_BUF], ByteOrder::Big).expect("checked length")
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ConnData<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets `version`.
    pub fn set_version(&mut self, v: u8) {
        self.bm()[conn_field::VERSION] = v;
    }

    /// Sets `flags`.
    pub fn set_flags(&mut self, v: u8) {
        self.bm()[conn_field::FLAGS] = v;
    }

    /// Sets `credits`.
    pub fn set_credits(&mut self, v: u16) {
        self.bm()[conn_field::CREDITS].copy_from_slice(&v.to_be_bytes());
    }

    /// Zeroes `reserved` (`rs_format_conn_data` memsets it).
    pub fn clear_reserved(&mut self) {
        self.bm()[conn_field::RESERVED].fill(0);
    }

    /// Sets the scaled `target_iomap_size`.
    pub fn set_target_iomap_size_scaled(&mut self, v: u8) {
        self.bm()[conn_field::TARGET_IOMAP_SIZE] = v;
    }

    /// Sets `target_sgl`.
    pub fn set_target_sgl(&mut self, s: &Sge) {
        s.emit(&mut self.bm()[conn_field::TARGET_SGL], ByteOrder::Big)
            .expect("checked length");
    }

    /// Sets `data_buf`.
    pub fn set_data_buf(&mut self, s: &Sge) {
        s.emit(&mut self.bm()[conn_field::DATA_BUF], ByteOrder::Big)
            .expect("checked length");
    }
}

/// The meaning of an `rs_conn_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnDataRepr {
    /// The sender's host order (`RS_CONN_FLAG_NET`): the order in which it
    /// reads the SGEs written into its target SGL, and in which it builds
    /// its message words.
    pub order: ByteOrder,
    /// `RS_CONN_FLAG_IOMAP`: the iomap follows the target SGL.
    pub iomap: bool,
    /// Flag bits other than NET and IOMAP, kept as received.
    pub other_flags: u8,
    /// Data messages the peer may send before the first credit update
    /// (`credits`, the sender's `rq_size`).
    pub credits: u16,
    /// `target_iomap_size` decoded (`rs_scale_to_value`).
    pub target_iomap_size: u16,
    /// Where to RDMA-Write credit updates (`length` = entries, 2).
    pub target_sgl: Sge,
    /// The first half of the receive buffer.
    pub data_buf: Sge,
}

impl ConnDataRepr {
    /// Parses and validates (length, version).
    pub fn parse<T: AsRef<[u8]>>(v: &ConnData<T>) -> Result<ConnDataRepr> {
        v.check_len()?;
        if v.version() != CONN_DATA_VERSION {
            return Err(WireError::UnsupportedVersion(v.version()));
        }
        let flags = v.flags();
        Ok(ConnDataRepr {
            order: ByteOrder::from_net_flag(flags & CONN_FLAG_NET != 0),
            iomap: flags & CONN_FLAG_IOMAP != 0,
            other_flags: flags & !(CONN_FLAG_NET | CONN_FLAG_IOMAP),
            credits: v.credits(),
            target_iomap_size: iomap_scale_to_value(v.target_iomap_size_scaled()),
            target_sgl: v.target_sgl(),
            data_buf: v.data_buf(),
        })
    }

    /// Parses private data bytes.
    pub fn parse_bytes(b: &[u8]) -> Result<ConnDataRepr> {
        ConnDataRepr::parse(&ConnData::new_checked(b)?)
    }

    /// Bytes [`ConnDataRepr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        CONN_DATA_LEN
    }

    /// Writes the conn data (reserved bytes zero) into the first 40 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut ConnData<T>) -> Result<()> {
        v.check_len()?;
        v.set_version(CONN_DATA_VERSION);
        let mut flags = self.other_flags & !(CONN_FLAG_NET | CONN_FLAG_IOMAP);
        if self.order.is_net() {
            flags |= CONN_FLAG_NET;
        }
        if self.iomap {
            flags |= CONN_FLAG_IOMAP;
        }
        v.set_flags(flags);
        v.set_credits(self.credits);
        v.clear_reserved();
        v.set_target_iomap_size_scaled(iomap_value_to_scale(self.target_iomap_size));
        v.set_target_sgl(&self.target_sgl);
        v.set_data_buf(&self.data_buf);
        Ok(())
    }

    /// The 40 bytes of private data.
    pub fn to_bytes(&self) -> [u8; CONN_DATA_LEN] {
        let mut b = [0; CONN_DATA_LEN];
        self.emit(&mut ConnData::new_unchecked(&mut b[..]))
            .expect("40 bytes");
        b
    }
}

#[cfg(test)]
mod tests;
