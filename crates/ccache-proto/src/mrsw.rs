//! The multiple-reader-single-writer protocol of the seed's Table 1.
//!
//! Per document the module keeps a **read queue** (the readers reading it
//! now), at most one **running update**, and an **update queue**: a FIFO of
//! waiting updaters and of the readers that arrived while an update was
//! queued or running. The rules, one per row of Table 1:
//!
//! | Message in | Condition | Effect | Message out |
//! |---|---|---|---|
//! | `READ_REQUEST` | no update queued or running | reader joins the read queue | `READ_PROCEED` (version) |
//! | `READ_REQUEST` | an update queued or running | reader waits in the update queue | — |
//! | `READ_DONE` | reader in the read queue | leaves it; if it drains and an update heads the queue, that update starts | (`UPDATE_PROCEED` to it) |
//! | `UPDATE_REQUEST` | read queue empty, nothing running or queued | update starts | `UPDATE_PROCEED` (version) |
//! | `UPDATE_REQUEST` | otherwise | updater waits in the update queue | — |
//! | `UPDATE_DONE` | sender runs the update | version + 1, published; the readers at the head of the update queue join the read queue; a next update starts once they are done | `UPDATE_COMMITTED` (new version), `READ_PROCEED` (new version) to each released reader |
//! | `VERSION_REQUEST` | — | — | `VERSION_REPLY` (version) |
//!
//! Anything else (a message only the module sends, an unknown document, a
//! `READ_DONE` without a read, an `UPDATE_DONE` by someone not updating, a
//! second request while one is open) is refused with an [`MrswError`] and
//! changes nothing; the driver answers it with an `ERROR` message.
//!
//! The update queue is FIFO, so neither side starves: readers behind an
//! update wait for it, and an update waits only for the readers in the
//! read queue when it reached the head. Every message is about one
//! document; a client may hold reads of several documents at once.
//!
//! The state machine is sans-IO: [`Mrsw::handle`] returns [`Action`]s, and
//! the driver performs them **in order**: a `Publish` (store the new
//! version in the version table) always comes before the messages that
//! release readers of that version.

use std::collections::{BTreeSet, VecDeque};
use std::fmt;

use crate::ipc::{ErrorCode, Kind, Repr};

/// Who sent a message: the driver's name for an IPC connection.
pub type ClientId = u64;

/// What the driver must do, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Send `msg` to client `to`.
    Send {
        /// Recipient.
        to: ClientId,
        /// Message.
        msg: Repr,
    },
    /// Store `version` as document `doc`'s current version (the version
    /// table slot), before any following `Send`.
    Publish {
        /// Document.
        doc: u32,
        /// New version.
        version: u64,
    },
}

/// A refused message; the state is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MrswError {
    /// The document number is outside the table.
    NoSuchDocument {
        /// Asked for.
        doc: u32,
        /// Documents in the table.
        docs: u32,
    },
    /// `READ_DONE` from a client that is not reading the document.
    NotReading {
        /// Document.
        doc: u32,
    },
    /// `UPDATE_DONE` from a client that is not running its update.
    NotUpdating {
        /// Document.
        doc: u32,
    },
    /// A request from a client that already has one open on the document.
    AlreadyOpen {
        /// Document.
        doc: u32,
    },
    /// A message that only the module sends.
    NotARequest(Kind),
}

impl MrswError {
    /// The code sent back in the `ERROR` message.
    pub fn code(&self) -> ErrorCode {
        match self {
            MrswError::NoSuchDocument { .. } => ErrorCode::NoSuchDocument,
            MrswError::NotReading { .. }
            | MrswError::NotUpdating { .. }
            | MrswError::AlreadyOpen { .. } => ErrorCode::OutOfOrder,
            MrswError::NotARequest(_) => ErrorCode::NotARequest,
        }
    }
}

impl fmt::Display for MrswError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MrswError::NoSuchDocument { doc, docs } => write!(
                f,
                "document {doc} is outside the version table of {docs} documents (raise ccappd --docs)"
            ),
            MrswError::NotReading { doc } => {
                write!(f, "READ_DONE for document {doc} without a READ_PROCEED")
            }
            MrswError::NotUpdating { doc } => {
                write!(f, "UPDATE_DONE for document {doc} without an UPDATE_PROCEED")
            }
            MrswError::AlreadyOpen { doc } => write!(
                f,
                "a second request for document {doc} while one is open (finish it with READ_DONE/UPDATE_DONE first)"
            ),
            MrswError::NotARequest(k) => write!(f, "{} is sent by the module, not to it", k.name()),
        }
    }
}

impl std::error::Error for MrswError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waiter {
    Read(ClientId),
    Update(ClientId),
}

impl Waiter {
    fn client(self) -> ClientId {
        match self {
            Waiter::Read(c) | Waiter::Update(c) => c,
        }
    }
}

#[derive(Debug, Default, Clone)]
struct Doc {
    version: u64,
    readers: BTreeSet<ClientId>,
    writer: Option<ClientId>,
    waiting: VecDeque<Waiter>,
}

impl Doc {
    fn has_open(&self, c: ClientId) -> bool {
        self.readers.contains(&c)
            || self.writer == Some(c)
            || self.waiting.iter().any(|w| w.client() == c)
    }
}

/// The Table 1 state of every document.
#[derive(Debug, Clone)]
pub struct Mrsw {
    docs: Vec<Doc>,
}

impl Mrsw {
    /// `docs` documents, all at version `initial`.
    pub fn new(docs: u32, initial: u64) -> Mrsw {
        Mrsw {
            docs: (0..docs)
                .map(|_| Doc {
                    version: initial,
                    ..Doc::default()
                })
                .collect(),
        }
    }

    /// Number of documents.
    pub fn docs(&self) -> u32 {
        self.docs.len() as u32
    }

    /// A document's current version.
    pub fn version(&self, doc: u32) -> Option<u64> {
        self.docs.get(doc as usize).map(|d| d.version)
    }

    /// Readers in the document's read queue.
    pub fn readers(&self, doc: u32) -> usize {
        self.docs.get(doc as usize).map_or(0, |d| d.readers.len())
    }

    /// Is an update running on the document?
    pub fn updating(&self, doc: u32) -> bool {
        self.docs
            .get(doc as usize)
            .is_some_and(|d| d.writer.is_some())
    }

    /// Clients waiting in the document's update queue.
    pub fn waiting(&self, doc: u32) -> usize {
        self.docs.get(doc as usize).map_or(0, |d| d.waiting.len())
    }

    fn doc_mut(&mut self, doc: u32) -> Result<&mut Doc, MrswError> {
        let docs = self.docs.len() as u32;
        self.docs
            .get_mut(doc as usize)
            .ok_or(MrswError::NoSuchDocument { doc, docs })
    }

    /// One message from `from`. On error nothing changed.
    pub fn handle(&mut self, from: ClientId, msg: Repr) -> Result<Vec<Action>, MrswError> {
        let id = msg.doc;
        let d = self.doc_mut(id)?;
        let mut out = Vec::new();
        match msg.kind {
            Kind::ReadRequest => {
                if d.has_open(from) {
                    return Err(MrswError::AlreadyOpen { doc: id });
                }
                if d.writer.is_none() && d.waiting.is_empty() {
                    d.readers.insert(from);
                    out.push(send(from, Kind::ReadProceed, id, d.version));
                } else {
                    d.waiting.push_back(Waiter::Read(from));
                }
            }
            Kind::ReadDone => {
                if !d.readers.remove(&from) {
                    return Err(MrswError::NotReading { doc: id });
                }
                advance(id, d, &mut out);
            }
            Kind::UpdateRequest => {
                if d.has_open(from) {
                    return Err(MrswError::AlreadyOpen { doc: id });
                }
                d.waiting.push_back(Waiter::Update(from));
                advance(id, d, &mut out);
            }
            Kind::UpdateDone => {
                if d.writer != Some(from) {
                    return Err(MrswError::NotUpdating { doc: id });
                }
                commit(id, d, &mut out);
                out.push(send(from, Kind::UpdateCommitted, id, d.version));
                advance(id, d, &mut out);
            }
            Kind::VersionRequest => out.push(send(from, Kind::VersionReply, id, d.version)),
            k => return Err(MrswError::NotARequest(k)),
        }
        Ok(out)
    }

    /// The client's connection is gone: drop its reads and queued
    /// requests. An update it was running is committed (version + 1): the
    /// document may have changed, so caches must not keep the old copy.
    pub fn disconnect(&mut self, client: ClientId) -> Vec<Action> {
        let mut out = Vec::new();
        for (i, d) in self.docs.iter_mut().enumerate() {
            let id = i as u32;
            let had = d.readers.remove(&client);
            let before = d.waiting.len();
            d.waiting.retain(|w| w.client() != client);
            let mut changed = had || before != d.waiting.len();
            if d.writer == Some(client) {
                commit(id, d, &mut out);
                changed = true;
            }
            if changed {
                advance(id, d, &mut out);
            }
        }
        out
    }
}

fn send(to: ClientId, kind: Kind, doc: u32, value: u64) -> Action {
    Action::Send {
        to,
        msg: Repr::with_value(kind, doc, value),
    }
}

fn commit(id: u32, d: &mut Doc, out: &mut Vec<Action>) {
    d.writer = None;
    d.version = d.version.wrapping_add(1);
    out.push(Action::Publish {
        doc: id,
        version: d.version,
    });
}

/// Start whatever may start: readers at the head of the update queue join
/// the read queue while no update runs; an update at the head starts once
/// the read queue is empty.
fn advance(id: u32, d: &mut Doc, out: &mut Vec<Action>) {
    while d.writer.is_none() {
        match d.waiting.front().copied() {
            Some(Waiter::Read(c)) => {
                d.waiting.pop_front();
                d.readers.insert(c);
                out.push(send(c, Kind::ReadProceed, id, d.version));
            }
            Some(Waiter::Update(c)) if d.readers.is_empty() => {
                d.waiting.pop_front();
                d.writer = Some(c);
                out.push(send(c, Kind::UpdateProceed, id, d.version));
            }
            _ => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(kind: Kind, doc: u32) -> Repr {
        Repr::new(kind, doc)
    }
    fn to(c: ClientId, kind: Kind, doc: u32, v: u64) -> Action {
        send(c, kind, doc, v)
    }

    // Row: READ_REQUEST with no update → READ_PROCEED, reader in the queue.
    #[test]
    fn read_request_proceeds() {
        let mut m = Mrsw::new(2, 5);
        let out = m.handle(1, req(Kind::ReadRequest, 1)).unwrap();
        assert_eq!(out, vec![to(1, Kind::ReadProceed, 1, 5)]);
        assert_eq!(m.readers(1), 1);
        // Many readers at once.
        assert_eq!(
            m.handle(2, req(Kind::ReadRequest, 1)).unwrap(),
            vec![to(2, Kind::ReadProceed, 1, 5)]
        );
        assert_eq!(m.readers(1), 2);
    }

    // Row: READ_DONE leaves the read queue.
    #[test]
    fn read_done_leaves() {
        let mut m = Mrsw::new(1, 0);
        m.handle(1, req(Kind::ReadRequest, 0)).unwrap();
        assert_eq!(m.handle(1, req(Kind::ReadDone, 0)).unwrap(), vec![]);
        assert_eq!(m.readers(0), 0);
    }

    // Row: UPDATE_REQUEST with an empty read queue → UPDATE_PROCEED.
    #[test]
    fn update_request_proceeds_when_idle() {
        let mut m = Mrsw::new(1, 3);
        assert_eq!(
            m.handle(9, req(Kind::UpdateRequest, 0)).unwrap(),
            vec![to(9, Kind::UpdateProceed, 0, 3)]
        );
        assert!(m.updating(0));
    }

    // Row: UPDATE_REQUEST waits until the read queue drains; READ_DONE of
    // the last reader starts it.
    #[test]
    fn update_waits_for_readers() {
        let mut m = Mrsw::new(1, 0);
        m.handle(1, req(Kind::ReadRequest, 0)).unwrap();
        m.handle(2, req(Kind::ReadRequest, 0)).unwrap();
        assert_eq!(m.handle(9, req(Kind::UpdateRequest, 0)).unwrap(), vec![]);
        assert!(!m.updating(0));
        assert_eq!(m.handle(1, req(Kind::ReadDone, 0)).unwrap(), vec![]);
        assert_eq!(
            m.handle(2, req(Kind::ReadDone, 0)).unwrap(),
            vec![to(9, Kind::UpdateProceed, 0, 0)]
        );
    }

    // Row: READ_REQUEST while an update is queued (not yet running) waits.
    #[test]
    fn reader_waits_behind_queued_update() {
        let mut m = Mrsw::new(1, 0);
        m.handle(1, req(Kind::ReadRequest, 0)).unwrap();
        m.handle(9, req(Kind::UpdateRequest, 0)).unwrap();
        assert_eq!(m.handle(2, req(Kind::ReadRequest, 0)).unwrap(), vec![]);
        assert_eq!(m.waiting(0), 2);
        assert_eq!(
            m.handle(1, req(Kind::ReadDone, 0)).unwrap(),
            vec![to(9, Kind::UpdateProceed, 0, 0)]
        );
        // Row: UPDATE_DONE bumps, publishes, then releases the waiting reader
        // at the new version.
        assert_eq!(
            m.handle(9, req(Kind::UpdateDone, 0)).unwrap(),
            vec![
                Action::Publish { doc: 0, version: 1 },
                to(9, Kind::UpdateCommitted, 0, 1),
                to(2, Kind::ReadProceed, 0, 1),
            ]
        );
        assert_eq!(m.version(0), Some(1));
        assert_eq!(m.readers(0), 1);
    }

    // Row: READ_REQUEST while an update runs waits in the update queue.
    #[test]
    fn reader_waits_behind_running_update() {
        let mut m = Mrsw::new(1, 0);
        m.handle(9, req(Kind::UpdateRequest, 0)).unwrap();
        assert_eq!(m.handle(1, req(Kind::ReadRequest, 0)).unwrap(), vec![]);
        assert_eq!(m.handle(2, req(Kind::ReadRequest, 0)).unwrap(), vec![]);
        let out = m.handle(9, req(Kind::UpdateDone, 0)).unwrap();
        assert_eq!(out[0], Action::Publish { doc: 0, version: 1 });
        assert_eq!(
            out[2..],
            [
                to(1, Kind::ReadProceed, 0, 1),
                to(2, Kind::ReadProceed, 0, 1)
            ]
        );
    }

    // Two updates: the second waits for the first and for the readers
    // released between them (FIFO, nobody starves).
    #[test]
    fn updates_queue_fifo() {
        let mut m = Mrsw::new(1, 0);
        m.handle(8, req(Kind::UpdateRequest, 0)).unwrap();
        m.handle(1, req(Kind::ReadRequest, 0)).unwrap();
        assert_eq!(m.handle(9, req(Kind::UpdateRequest, 0)).unwrap(), vec![]);
        m.handle(2, req(Kind::ReadRequest, 0)).unwrap();
        let out = m.handle(8, req(Kind::UpdateDone, 0)).unwrap();
        // Reader 1 proceeds at version 1; update 9 waits for it; reader 2
        // waits behind update 9.
        assert_eq!(out.len(), 3);
        assert_eq!(out[2], to(1, Kind::ReadProceed, 0, 1));
        assert!(!m.updating(0));
        assert_eq!(
            m.handle(1, req(Kind::ReadDone, 0)).unwrap(),
            vec![to(9, Kind::UpdateProceed, 0, 1)]
        );
        let out = m.handle(9, req(Kind::UpdateDone, 0)).unwrap();
        assert_eq!(out[2], to(2, Kind::ReadProceed, 0, 2));
    }

    // Documents are independent.
    #[test]
    fn documents_independent() {
        let mut m = Mrsw::new(2, 0);
        m.handle(9, req(Kind::UpdateRequest, 0)).unwrap();
        assert_eq!(
            m.handle(1, req(Kind::ReadRequest, 1)).unwrap(),
            vec![to(1, Kind::ReadProceed, 1, 0)]
        );
    }

    #[test]
    fn version_request_answers() {
        let mut m = Mrsw::new(1, 42);
        assert_eq!(
            m.handle(3, req(Kind::VersionRequest, 0)).unwrap(),
            vec![to(3, Kind::VersionReply, 0, 42)]
        );
    }

    #[test]
    fn refusals_change_nothing() {
        let mut m = Mrsw::new(2, 0);
        assert_eq!(
            m.handle(1, req(Kind::ReadRequest, 2)),
            Err(MrswError::NoSuchDocument { doc: 2, docs: 2 })
        );
        assert_eq!(
            m.handle(1, req(Kind::ReadDone, 0)),
            Err(MrswError::NotReading { doc: 0 })
        );
        assert_eq!(
            m.handle(1, req(Kind::UpdateDone, 0)),
            Err(MrswError::NotUpdating { doc: 0 })
        );
        m.handle(1, req(Kind::ReadRequest, 0)).unwrap();
        assert_eq!(
            m.handle(1, req(Kind::ReadRequest, 0)),
            Err(MrswError::AlreadyOpen { doc: 0 })
        );
        assert_eq!(
            m.handle(1, req(Kind::UpdateRequest, 0)),
            Err(MrswError::AlreadyOpen { doc: 0 })
        );
        // Another client's UPDATE_DONE does not end a running update.
        m.handle(1, req(Kind::ReadDone, 0)).unwrap();
        m.handle(9, req(Kind::UpdateRequest, 0)).unwrap();
        assert_eq!(
            m.handle(8, req(Kind::UpdateDone, 0)),
            Err(MrswError::NotUpdating { doc: 0 })
        );
        for k in [
            Kind::ReadProceed,
            Kind::UpdateProceed,
            Kind::UpdateCommitted,
            Kind::VersionReply,
            Kind::Error,
        ] {
            assert_eq!(m.handle(1, req(k, 0)), Err(MrswError::NotARequest(k)));
        }
        assert_eq!(m.version(0), Some(0));
        assert!(m.updating(0));
        assert_eq!(
            MrswError::NotARequest(Kind::Error).code(),
            ErrorCode::NotARequest
        );
    }

    #[test]
    fn disconnect_of_reader_starts_waiting_update() {
        let mut m = Mrsw::new(1, 0);
        m.handle(1, req(Kind::ReadRequest, 0)).unwrap();
        m.handle(9, req(Kind::UpdateRequest, 0)).unwrap();
        assert_eq!(m.disconnect(1), vec![to(9, Kind::UpdateProceed, 0, 0)]);
    }

    #[test]
    fn disconnect_of_writer_commits_and_releases() {
        let mut m = Mrsw::new(1, 0);
        m.handle(9, req(Kind::UpdateRequest, 0)).unwrap();
        m.handle(1, req(Kind::ReadRequest, 0)).unwrap();
        assert_eq!(
            m.disconnect(9),
            vec![
                Action::Publish { doc: 0, version: 1 },
                to(1, Kind::ReadProceed, 0, 1)
            ]
        );
        // A waiting client that leaves is forgotten.
        m.handle(7, req(Kind::UpdateRequest, 0)).unwrap();
        m.handle(2, req(Kind::ReadRequest, 0)).unwrap();
        assert_eq!(m.waiting(0), 2);
        assert_eq!(m.disconnect(2), vec![]);
        assert_eq!(m.waiting(0), 1);
    }
}

#[cfg(test)]
mod interleavings {
    //! Property test: random interleavings of readers and updaters over
    //! documents modelled as byte arrays that an updater writes one byte
    //! per step. No reader ever observes a half-written document, and
    //! every request is eventually served.
    use super::*;
    use proptest::prelude::*;

    const DOCS: usize = 2;
    const LEN: usize = 4;
    const CLIENTS: usize = 5;

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum St {
        Idle,
        WaitRead(u32),
        Reading(u32, u64),
        WaitUpdate(u32),
        Updating(u32, usize),
    }

    struct World {
        m: Mrsw,
        content: [[u8; LEN]; DOCS],
        st: [St; CLIENTS],
        served: usize,
    }

    impl World {
        fn apply(&mut self, out: Vec<Action>) -> Result<(), TestCaseError> {
            for a in out {
                match a {
                    Action::Publish { doc, version } => {
                        let c = self.content[doc as usize];
                        // The update wrote every byte before it was published.
                        prop_assert!(c.iter().all(|&b| u64::from(b) == version % 256));
                    }
                    Action::Send { to, msg } => {
                        let c = to as usize;
                        let d = msg.doc as usize;
                        match (self.st[c], msg.kind) {
                            (St::WaitRead(x), Kind::ReadProceed) if x == msg.doc => {
                                self.st[c] = St::Reading(msg.doc, msg.value);
                                self.check_read(c)?;
                            }
                            (St::WaitUpdate(x), Kind::UpdateProceed) if x == msg.doc => {
                                // Exclusive: nobody else reads or writes it.
                                for (o, s) in self.st.iter().enumerate() {
                                    if o != c {
                                        prop_assert!(
                                            !matches!(s, St::Reading(y, _) | St::Updating(y, _) if *y as usize == d)
                                        );
                                    }
                                }
                                self.st[c] = St::Updating(msg.doc, 0);
                            }
                            (St::Updating(x, LEN), Kind::UpdateCommitted) if x == msg.doc => {
                                self.st[c] = St::Idle;
                                self.served += 1;
                            }
                            (s, k) => prop_assert!(false, "client {c} in {s:?} got {k:?}"),
                        }
                    }
                }
            }
            Ok(())
        }

        fn check_read(&self, c: usize) -> Result<(), TestCaseError> {
            if let St::Reading(d, v) = self.st[c] {
                let bytes = self.content[d as usize];
                prop_assert!(
                    bytes.iter().all(|&b| u64::from(b) == v % 256),
                    "reader {c} saw half-written document {d}: {bytes:?} at version {v}"
                );
                prop_assert_eq!(self.m.version(d), Some(v));
            }
            Ok(())
        }

        fn step(&mut self, c: usize, choice: u8) -> Result<(), TestCaseError> {
            let doc = u32::from(choice) % DOCS as u32;
            match self.st[c] {
                St::Idle => {
                    let (k, s) = if choice & 0x80 == 0 {
                        (Kind::ReadRequest, St::WaitRead(doc))
                    } else {
                        (Kind::UpdateRequest, St::WaitUpdate(doc))
                    };
                    self.st[c] = s;
                    let out = self.m.handle(c as u64, Repr::new(k, doc)).unwrap();
                    self.apply(out)?;
                }
                St::Reading(d, _) => {
                    // Look at the document again, or finish.
                    self.check_read(c)?;
                    if choice & 1 == 0 {
                        self.st[c] = St::Idle;
                        self.served += 1;
                        let out = self
                            .m
                            .handle(c as u64, Repr::new(Kind::ReadDone, d))
                            .unwrap();
                        self.apply(out)?;
                    }
                }
                St::Updating(d, i) if i < LEN => {
                    // One byte of the new content per step.
                    let v = self.m.version(d).unwrap() + 1;
                    self.content[d as usize][i] = (v % 256) as u8;
                    self.st[c] = St::Updating(d, i + 1);
                }
                St::Updating(d, _) => {
                    let out = self
                        .m
                        .handle(c as u64, Repr::new(Kind::UpdateDone, d))
                        .unwrap();
                    self.apply(out)?;
                }
                St::WaitRead(_) | St::WaitUpdate(_) => {}
            }
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn no_reader_sees_a_half_written_document(
            ops in proptest::collection::vec((0..CLIENTS, any::<u8>()), 0..300)
        ) {
            let mut w = World {
                m: Mrsw::new(DOCS as u32, 0),
                content: [[0; LEN]; DOCS],
                st: [St::Idle; CLIENTS],
                served: 0,
            };
            for (c, choice) in ops {
                w.step(c, choice)?;
            }
            // Drain: everyone finishes what is open (choice 1: readers end,
            // updaters keep writing), so nothing is stuck forever.
            for _ in 0..(CLIENTS * (LEN + 2) * 4) {
                for c in 0..CLIENTS {
                    if !matches!(w.st[c], St::Idle) {
                        w.step(c, 0)?;
                    }
                }
            }
            prop_assert!(w.st.iter().all(|s| *s == St::Idle), "stuck: {:?}", w.st);
            for d in 0..DOCS as u32 {
                prop_assert_eq!(w.m.readers(d), 0);
                prop_assert_eq!(w.m.waiting(d), 0);
                prop_assert!(!w.m.updating(d));
            }
        }
    }
}
