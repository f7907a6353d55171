//! Logging: `tracing` events to stderr, filtered by `RUST_LOG`
//! (`tracing-subscriber`'s env-filter syntax, e.g. `RUST_LOG=iwarp=debug`).

use tracing_subscriber::EnvFilter;

/// Install the subscriber. Without `RUST_LOG`, `debug` picks the level:
/// 0 = warnings, 1 (`-d`) = debug, 2 or more (`-dd`) = trace.
pub fn init(debug: u8) {
    let default = match debug {
        0 => "warn",
        1 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // A second init (tests calling into the library twice) is harmless.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
