//! The stack's one per-opcode header-length table (siw's `iwarp_pktinfo`),
//! [`Opcode::ulp_header_len`]. It reads the header lengths of DDP
//! (RFC 5041 §4), RDMAP (RFC 5040 §4.4) and the Terminate message (RFC
//! 5040 §4.8), so it lives beside those modules rather than in `rdmap`,
//! which `terminate` imports: no two header modules import each other.

use super::rdmap::{Opcode, READ_REQUEST_LEN};
use super::{ddp, terminate};

impl Opcode {
    /// Bytes of DDP plus fixed RDMAP header every message of this opcode
    /// starts with (as siw's `iwarp_pktinfo`, without the MPA length):
    /// Write/Read Response 14 (tagged DDP header, RFC 5041 §4.2), Sends 18
    /// (untagged DDP header, RFC 5041 §4.3), Read Request 18 + 28 (RFC
    /// 5040 §4.4), Terminate 18 + 4 (its control field, RFC 5040 §4.8;
    /// the optional copied headers follow). `None` for unknown opcodes.
    ///
    /// This is the stack's one per-opcode header-length table: the
    /// engine's receive path classifies FPDUs with it.
    pub fn ulp_header_len(self) -> Option<usize> {
        match self {
            Opcode::RdmaWrite | Opcode::ReadResponse => Some(ddp::TAGGED_HDR_LEN),
            Opcode::ReadRequest => Some(ddp::UNTAGGED_HDR_LEN + READ_REQUEST_LEN),
            Opcode::Terminate => Some(ddp::UNTAGGED_HDR_LEN + terminate::HDR_LEN),
            Opcode::Unknown(_) => None,
            _ => Some(ddp::UNTAGGED_HDR_LEN),
        }
    }
}
