//! The device of this run: `--device`, else `IWARP_DEVICE`, else `soft`,
//! chosen once at start ([`choose`]) and opened by every role
//! ([`open_context`]).

use std::sync::OnceLock;

/// The device `--device` / `IWARP_DEVICE` names (`soft` when neither).
static DEVICE: OnceLock<String> = OnceLock::new();

/// Set the device of this run (once, at start; a second call is ignored).
pub fn choose(name: String) {
    let _ = DEVICE.set(name);
}

/// The device chosen at start (`soft` before [`choose`]).
pub fn name() -> &'static str {
    DEVICE.get().map_or("soft", String::as_str)
}

/// Open the device of this run.
pub fn open_context() -> Result<iwarp::Context, String> {
    let name = name();
    iwarp::Context::open_device(name).map_err(|e| format!("opening device {name}: {e}"))
}
