//! The `wr_id` of our send work requests: what each one was
//! ([`SendTag`]), kind in the top byte and value below, so a completion
//! tells the flow what finished.

use crate::flow::SendTag;
use crate::wire::Ctrl;

// wr_id of send work requests: kind in the top byte, value below.
const K_DATA_WRITE: u64 = 1;
const K_ZC_WRITE: u64 = 2;
const K_DATA_MSG: u64 = 3;
const K_SGL_WRITE: u64 = 4;
const K_SGL_MSG: u64 = 5;
const K_CTRL: u64 = 6;
const K_KEEPALIVE: u64 = 7;

pub(super) fn encode(tag: SendTag) -> u64 {
    let (k, v) = match tag {
        SendTag::DataWrite { len } => (K_DATA_WRITE, u64::from(len)),
        SendTag::ZcopyWrite { len } => (K_ZC_WRITE, u64::from(len)),
        SendTag::DataMsg => (K_DATA_MSG, 0),
        SendTag::SglWrite => (K_SGL_WRITE, 0),
        SendTag::SglMsg => (K_SGL_MSG, 0),
        SendTag::Ctrl(c) => (K_CTRL, u64::from(c.value())),
        SendTag::Keepalive => (K_KEEPALIVE, 0),
    };
    k << 56 | v
}

pub(super) fn decode(wr_id: u64) -> Option<SendTag> {
    let v = wr_id & ((1 << 56) - 1);
    Some(match wr_id >> 56 {
        K_DATA_WRITE => SendTag::DataWrite { len: v as u32 },
        K_ZC_WRITE => SendTag::ZcopyWrite { len: v as u32 },
        K_DATA_MSG => SendTag::DataMsg,
        K_SGL_WRITE => SendTag::SglWrite,
        K_SGL_MSG => SendTag::SglMsg,
        K_CTRL => SendTag::Ctrl(Ctrl::from_value(v as u32)?),
        K_KEEPALIVE => SendTag::Keepalive,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wr_ids_round_trip() {
        for tag in [
            SendTag::DataWrite { len: 65536 },
            SendTag::ZcopyWrite { len: u32::MAX },
            SendTag::DataMsg,
            SendTag::SglWrite,
            SendTag::SglMsg,
            SendTag::Ctrl(Ctrl::Disconnect),
            SendTag::Ctrl(Ctrl::Shutdown),
            SendTag::Ctrl(Ctrl::Keepalive),
            SendTag::Keepalive,
        ] {
            assert_eq!(decode(encode(tag)), Some(tag));
        }
        assert_eq!(decode(0), None);
        assert_eq!(decode(9 << 56), None);
    }
}
