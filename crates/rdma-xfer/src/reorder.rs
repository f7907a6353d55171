//! The sink's reorder stage: blocks arrive out of order across streams and
//! leave in sequence.

use std::collections::BTreeMap;

/// Holds out-of-order items until the next expected sequence number
/// arrives.
#[derive(Debug)]
pub struct Reorder<T> {
    next: u64,
    pending: BTreeMap<u64, T>,
}

impl<T> Default for Reorder<T> {
    fn default() -> Self {
        Reorder {
            next: 0,
            pending: BTreeMap::new(),
        }
    }
}

impl<T> Reorder<T> {
    /// Add item `seq`. Refuses a sequence number already delivered or
    /// already waiting (a protocol violation by the peer).
    pub fn insert(&mut self, seq: u64, item: T) -> Result<(), u64> {
        if seq < self.next || self.pending.contains_key(&seq) {
            return Err(seq);
        }
        self.pending.insert(seq, item);
        Ok(())
    }

    /// The next item in sequence, if it has arrived.
    pub fn pop(&mut self) -> Option<T> {
        let item = self.pending.remove(&self.next)?;
        self.next += 1;
        Some(item)
    }

    /// Items delivered so far (= the next sequence number expected).
    pub fn delivered(&self) -> u64 {
        self.next
    }

    /// Items waiting for an earlier one.
    pub fn waiting(&self) -> usize {
        self.pending.len()
    }

    /// Start over at sequence 0, returning what was waiting.
    pub fn reset(&mut self) -> Vec<T> {
        self.next = 0;
        std::mem::take(&mut self.pending).into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivers_in_order_and_refuses_duplicates() {
        let mut r = Reorder::default();
        r.insert(2, 'c').unwrap();
        r.insert(1, 'b').unwrap();
        assert_eq!(r.pop(), None);
        assert_eq!(r.insert(2, 'x'), Err(2));
        r.insert(0, 'a').unwrap();
        let got: Vec<char> = std::iter::from_fn(|| r.pop()).collect();
        assert_eq!(got, ['a', 'b', 'c']);
        assert_eq!(r.insert(1, 'y'), Err(1));
        assert_eq!(r.delivered(), 3);
        assert_eq!(r.waiting(), 0);
    }
}
