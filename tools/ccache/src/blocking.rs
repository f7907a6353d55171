//! The blocking front of a check: [`Blocking`] runs one
//! [`AsyncCheck`] (the one implementation of the checks) to its end on a
//! current-thread tokio runtime it owns. `crate::check::{RdmaCheck,
//! TcpCheck}` and `crate::sockets::SocketsCheck` are made of it.

use std::fmt;

use ccache_proto::slot::Advert;

use crate::acheck::AsyncCheck;
use crate::check_parts::CheckError;

/// A blocking front on one [`AsyncCheck`], the one implementation of the
/// checks: each call runs the check to its end on a current-thread tokio
/// runtime that this value owns (made at the first check), so a blocking
/// check takes no thread besides the caller's.
pub(crate) struct Blocking {
    // Declared first: the check's connections go before their runtime.
    check: AsyncCheck,
    rt: Option<tokio::runtime::Runtime>,
}

impl fmt::Debug for Blocking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blocking")
            .field("addr", &self.check.addr())
            .field("connected", &self.check.connected())
            .finish()
    }
}

impl Blocking {
    pub(crate) fn new(check: AsyncCheck) -> Blocking {
        Blocking { check, rt: None }
    }

    pub(crate) fn version(&mut self, doc: u32) -> Result<u64, CheckError> {
        drive(runtime(&mut self.rt)?, self.check.version(doc))
    }

    pub(crate) fn advert(&mut self) -> Result<Advert, CheckError> {
        drive(runtime(&mut self.rt)?, self.check.advert())
    }

    pub(crate) fn read_slot_unchecked(&mut self, doc: u32) -> Result<u64, CheckError> {
        drive(runtime(&mut self.rt)?, self.check.read_slot_unchecked(doc))
    }
}

/// Run `fut` to its end on `rt`. The RDMA and TCP checks of a blocking
/// check finish in their first poll (their waits are blocking calls), so
/// that poll is made directly, inside the runtime's context; only a check
/// that waits on the reactor (iWARP sockets) goes through `block_on`.
fn drive<T>(rt: &tokio::runtime::Runtime, fut: impl std::future::Future<Output = T>) -> T {
    use std::task::{Context, Poll, Waker};
    let mut fut = std::pin::pin!(fut);
    let first = {
        let _in = rt.enter();
        fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
    };
    match first {
        Poll::Ready(v) => v,
        // Polled again by block_on with its own waker, which replaces
        // the no-op one wherever the future registered it.
        Poll::Pending => rt.block_on(fut),
    }
}

/// The blocking check's runtime, made at its first use.
fn runtime(
    rt: &mut Option<tokio::runtime::Runtime>,
) -> Result<&tokio::runtime::Runtime, CheckError> {
    if rt.is_none() {
        let made = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                CheckError::Unreachable(format!(
                    "creating the check's event loop: {e} (out of file descriptors? raise ulimit -n)"
                ))
            })?;
        *rt = Some(made);
    }
    Ok(rt.as_ref().expect("made above"))
}
