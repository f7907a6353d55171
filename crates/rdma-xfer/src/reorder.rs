//! The sink's reorder stage: blocks arrive out of order across streams and
//! leave in sequence.
//!
//! The stage holds at most `window` items: an item more than `window - 1`
//! places after the next one expected is refused. A peer that never sends
//! an early block therefore cannot make the sink hold an unbounded number
//! of later ones; the transports keep their readers inside the window
//! ([`Window`]) so that an honest peer never meets the limit.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Why [`Reorder::insert`] refused an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertError {
    /// The sequence number was delivered already or is waiting already.
    Duplicate(u64),
    /// The sequence number lies beyond the window: `seq >= next + window`.
    BeyondWindow { seq: u64, next: u64, window: u64 },
}

impl fmt::Display for InsertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            InsertError::Duplicate(seq) => write!(f, "block {seq} arrived twice"),
            InsertError::BeyondWindow { seq, next, window } => write!(
                f,
                "block {seq} arrived while block {next} is still missing, \
                 beyond the reorder window of {window} blocks"
            ),
        }
    }
}

/// Holds out-of-order items until the next expected sequence number
/// arrives.
#[derive(Debug)]
pub struct Reorder<T> {
    next: u64,
    window: u64,
    pending: BTreeMap<u64, T>,
}

impl<T> Reorder<T> {
    /// A stage that holds at most `window` items (at least 1).
    pub fn with_window(window: u64) -> Reorder<T> {
        Reorder {
            next: 0,
            window: window.max(1),
            pending: BTreeMap::new(),
        }
    }

    /// Add item `seq`. Refuses a sequence number already delivered or
    /// already waiting, and one beyond the window (both are protocol
    /// violations by the peer).
    pub fn insert(&mut self, seq: u64, item: T) -> Result<(), InsertError> {
        if seq < self.next || self.pending.contains_key(&seq) {
            return Err(InsertError::Duplicate(seq));
        }
        if seq - self.next >= self.window {
            return Err(InsertError::BeyondWindow {
                seq,
                next: self.next,
                window: self.window,
            });
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

    /// The window this stage was made with.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Start over at sequence 0, returning what was waiting.
    pub fn reset(&mut self) -> Vec<T> {
        self.next = 0;
        std::mem::take(&mut self.pending).into_values().collect()
    }
}

/// Keeps the reader threads of a multi-stream sink inside a reorder window.
///
/// A reader that has read the header of block `seq` calls [`Window::admit`]
/// before it reads (and allocates) the payload; it returns once
/// `seq < delivered + width`. The reader of the block the sink waits for is
/// never held back, so an honest peer cannot deadlock; a reader held back
/// stops reading its stream, and TCP pushes back on the sender.
#[derive(Debug)]
pub struct Window {
    width: u64,
    state: Mutex<(u64, bool)>,
    moved: Condvar,
}

/// Why [`Window::admit`] gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmitError {
    /// [`Window::close`] was called: the transfer is over.
    Closed,
    /// The block stayed outside the window for the whole timeout.
    TimedOut { seq: u64, delivered: u64 },
}

impl Window {
    /// A window of `width` blocks (at least 1).
    pub fn new(width: u64) -> Window {
        Window {
            width: width.max(1),
            state: Mutex::new((0, false)),
            moved: Condvar::new(),
        }
    }

    /// The width in blocks.
    pub fn width(&self) -> u64 {
        self.width
    }

    /// Wait until block `seq` is inside the window, the window is closed,
    /// or `timeout` passes.
    pub fn admit(&self, seq: u64, timeout: Duration) -> Result<(), AdmitError> {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let (delivered, closed) = *st;
            if closed {
                return Err(AdmitError::Closed);
            }
            if seq < delivered.saturating_add(self.width) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(AdmitError::TimedOut { seq, delivered });
            }
            st = self
                .moved
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The sink has delivered every block before `delivered`.
    pub fn advance(&self, delivered: u64) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if delivered > st.0 {
            st.0 = delivered;
            self.moved.notify_all();
        }
    }

    /// Release every waiting reader with [`AdmitError::Closed`].
    pub fn close(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.1 = true;
        self.moved.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn delivers_in_order_and_refuses_duplicates() {
        let mut r = Reorder::with_window(16);
        r.insert(2, 'c').unwrap();
        r.insert(1, 'b').unwrap();
        assert_eq!(r.pop(), None);
        assert_eq!(r.insert(2, 'x'), Err(InsertError::Duplicate(2)));
        r.insert(0, 'a').unwrap();
        let got: Vec<char> = std::iter::from_fn(|| r.pop()).collect();
        assert_eq!(got, ['a', 'b', 'c']);
        assert_eq!(r.insert(1, 'y'), Err(InsertError::Duplicate(1)));
        assert_eq!(r.delivered(), 3);
        assert_eq!(r.waiting(), 0);
    }

    #[test]
    fn refuses_items_beyond_the_window() {
        let mut r = Reorder::with_window(4);
        for seq in 1..4 {
            r.insert(seq, seq).unwrap();
        }
        let e = r.insert(4, 4).unwrap_err();
        assert_eq!(
            e,
            InsertError::BeyondWindow {
                seq: 4,
                next: 0,
                window: 4
            }
        );
        assert!(e.to_string().contains("block 0 is still missing"), "{e}");
        assert_eq!(r.waiting(), 3, "nothing beyond the window is held");
        // A huge sequence number is refused without overflow.
        assert!(matches!(
            r.insert(u64::MAX, 0),
            Err(InsertError::BeyondWindow { .. })
        ));
        // Once block 0 arrives the window moves on.
        r.insert(0, 0).unwrap();
        assert_eq!(std::iter::from_fn(|| r.pop()).count(), 4);
        r.insert(7, 7).unwrap();
        assert_eq!(r.window(), 4);
    }

    #[test]
    fn window_holds_a_reader_until_the_sink_catches_up() {
        let w = Arc::new(Window::new(2));
        assert_eq!(w.admit(1, Duration::ZERO), Ok(()));
        assert_eq!(
            w.admit(2, Duration::from_millis(20)),
            Err(AdmitError::TimedOut {
                seq: 2,
                delivered: 0
            })
        );
        let w2 = Arc::clone(&w);
        let waiter = std::thread::spawn(move || w2.admit(5, Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        w.advance(4);
        assert_eq!(waiter.join().unwrap(), Ok(()));
        let w3 = Arc::clone(&w);
        let waiter = std::thread::spawn(move || w3.admit(100, Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        w.close();
        assert_eq!(waiter.join().unwrap(), Err(AdmitError::Closed));
    }
}
