//! The connection defaults users read in the docs are the ones the code
//! has: docs/C_API.md states the silent-peer limit and the liveness probe
//! (off, because not every RNIC answers a zero-length Read outside
//! connection setup), docs/ARCHITECTURE.md says the probe is off by
//! default. A change to either side without the other fails here.

use iwarp::cm::{ConnParam, DEFAULT_PEER_TIMEOUT, DEFAULT_PROBE_INTERVAL};
use std::time::Duration;

fn doc(name: &str) -> String {
    let path = format!("{}/../../docs/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The text right after `key` up to the next `;` or `)`, with Markdown
/// line breaks folded.
fn stated(text: &str, key: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let at = flat
        .find(key)
        .unwrap_or_else(|| panic!("the docs no longer state {key}"));
    let rest = &flat[at + key.len()..];
    let end = rest.find([';', ')']).unwrap_or(rest.len());
    rest[..end].trim().to_string()
}

#[test]
fn the_c_api_doc_states_the_code_defaults_for_a_silent_peer() {
    let c_api = doc("C_API.md");
    let peer = stated(&c_api, "`iwarp_conn_param.peer_timeout_ms`,");
    assert_eq!(
        peer,
        format!("default {}", DEFAULT_PEER_TIMEOUT.as_millis()),
        "docs/C_API.md and DEFAULT_PEER_TIMEOUT disagree"
    );
    let probe = stated(&c_api, "`probe_interval_ms`,");
    assert_eq!(DEFAULT_PROBE_INTERVAL, Duration::ZERO);
    assert_eq!(
        probe, "default off",
        "docs/C_API.md and DEFAULT_PROBE_INTERVAL disagree"
    );
}

#[test]
fn the_architecture_doc_says_the_probe_is_off_by_default() {
    let arch = doc("ARCHITECTURE.md");
    let flat = arch.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("the probe (off by default"),
        "docs/ARCHITECTURE.md no longer says the probe is off by default"
    );
    assert!(DEFAULT_PROBE_INTERVAL.is_zero());
}

#[test]
fn connection_parameters_default_to_the_documented_constants() {
    let p = ConnParam::default();
    assert_eq!(p.peer_timeout, DEFAULT_PEER_TIMEOUT);
    assert_eq!(p.probe_interval, DEFAULT_PROBE_INTERVAL);
    // docs/C_API.md: "`iwarp_conn_param.timeout_ms` of 0 means the
    // default, 5000 ms".
    let c_api = doc("C_API.md");
    let flat = c_api.split_whitespace().collect::<Vec<_>>().join(" ");
    let said = format!(
        "`iwarp_conn_param.timeout_ms` of 0 means the default, {} ms",
        p.timeout.as_millis()
    );
    assert!(flat.contains(&said), "docs/C_API.md does not say: {said}");
}
