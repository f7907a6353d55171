//! Making deferred accepts streams off the program's threads (issue 26,
//! item 1: one client must never stall the program).
//!
//! An accepted connection waits for its first use (`table`, "Accepts wait
//! for their first use"). The MPA exchange it then needs waits on the
//! remote peer: for the rest of the MPA Request (RFC 5044 §7.1: the
//! Request is the 16-byte key, 4 bytes of flags, revision and length,
//! then up to 512 bytes of private data), and, for an accept whose first
//! bytes had not arrived at `accept` (*undecided*), for those first bytes.
//! A client that sends the key and then nothing holds that wait for its
//! whole timeout. So no program thread ever waits for it here:
//!
//! - **The first use starts a job** ([`begin`]) and the descriptor number
//!   (and its copies) is replaced by a *placeholder*: one end of an
//!   `AF_UNIX` socket pair that shows neither readable nor writable, as a
//!   TCP socket in its handshake. A non-blocking call then gets `EAGAIN`;
//!   a blocking call waits for the job ([`settle`], on its own thread,
//!   like a blocking read waits for data), holding no lock.
//! - **One thread per process** (the *watcher*) drives every job: it
//!   polls each job's private copy of the TCP socket, with `SO_RCVLOWAT`
//!   set to the bytes the next decision needs (socket(7): poll reports
//!   readable only from that many bytes), so a client that stalls costs a
//!   slot in its poll set and a deadline, never a thread. Once the whole
//!   Request has arrived (`MSG_PEEK`), the exchange itself is local work
//!   (read those bytes, send the Reply, set up the queue pair) and runs
//!   there. An undecided job whose bytes turn out to be plain, or that
//!   gets none within `peek` of its accept, gives the numbers their TCP
//!   socket back.
//! - **The end of a job** puts the stream's readiness descriptor (or a
//!   closed connection, if the exchange failed) on the numbers, and closes
//!   our end of the placeholder, so a `poll`/`select` that was sleeping on
//!   the placeholder wakes up (`POLLHUP`) and looks again.
//! - **epoll**: a registration belongs to the open file, not to the number
//!   (epoll(7), "Questions and answers": a descriptor replaced by `dup2`
//!   leaves the registration on the old file), so the `epoll_ctl` calls the
//!   program makes on a number in this state are recorded ([`epoll_ctl`]),
//!   and each replacement deletes them before the `dup2` and adds them
//!   again, with the program's events and data, after it. An `EPOLLET`
//!   registration added on a ready file reports it once (epoll's insert
//!   polls the file).
//! - **Bounds**: at most [`Settings::max_pending`] MPA accepts wait for
//!   their first use or their exchange at once (`IWARP_PRELOAD_MAX_PENDING`);
//!   beyond, a new MPA client is closed at `accept` (its client falls back
//!   to plain TCP) and a warning says so; so is one past
//!   [`Settings::max_streams`] live streams, those waiting included
//!   (`IWARP_PRELOAD_MAX_STREAMS`, `crate::table::StreamSlot`). Threads:
//!   one per process here, and the provider's per stream.
//!
//! Numbers are claimed by a job (the claims below) and changed only while
//! claimed; `close`, `dup2` onto a number and `close_range` drop the claim
//! first ([`forget`]), so a job never replaces a descriptor the program has
//! closed and reused (issue 26, item 2).

mod config;
mod fds;
mod jobs;
mod state;

pub use config::{configure, set_reporter, settings, Reporter, Settings};
pub use fds::{
    copy_waiting, epoll_ctl, first_bytes, forget, hold_settles, is_settling, SettlesHeld,
};
pub use jobs::{begin, ensure_watcher, pending, room_for_one_more, settle};
