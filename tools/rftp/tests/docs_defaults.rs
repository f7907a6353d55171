//! docs/RFTP.md documents rftpd's configuration with an example block and
//! names defaults in its prose; these tests keep the code's defaults equal
//! to what is written there. The block is parsed as a real config (so a
//! documented key the code does not know fails too), and every setting
//! that is not an example value (root, users, ...) must equal
//! `ServerConfig::default()`.

use rftp::reply::{MAX_REPLY_BYTES, MAX_REPLY_LINE};
use rftp::server::{
    ServerConfig, DEFAULT_LOGIN_TIMEOUT_SECS, DEFAULT_SESSION_MEM_BUDGET,
    DEFAULT_SESSION_MEM_PER_USER, PRE_LOGIN_MAX_BYTES,
};

const DOC: &str = include_str!("../../../docs/RFTP.md");

/// The first ```toml block after the `## rftpd` heading.
fn documented_config() -> ServerConfig {
    let rftpd = DOC
        .split_once("\n## rftpd")
        .expect("docs/RFTP.md has ## rftpd")
        .1;
    let block = rftpd
        .split_once("```toml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("a ```toml block under ## rftpd")
        .0;
    toml::from_str(block).unwrap_or_else(|e| panic!("the documented config does not load: {e}"))
}

#[test]
fn the_documented_config_block_shows_the_defaults() {
    let doc = documented_config();
    let def = ServerConfig::default();
    macro_rules! same {
        ($($f:ident),*) => {$(
            assert_eq!(
                doc.$f, def.$f,
                concat!("docs/RFTP.md shows ", stringify!($f), " = {:?}, the code's default is {:?}"),
                doc.$f, def.$f
            );
        )*};
    }
    same!(
        listen,
        max_connections,
        max_per_ip,
        idle_timeout_secs,
        login_timeout_secs,
        data_timeout_secs,
        login_fail_limit,
        login_fail_window_secs,
        login_fail_delay_ms,
        rdma,
        max_streams,
        block_size,
        iodepth,
        max_iodepth,
        crc,
        max_mem_bytes,
        session_mem_budget_bytes,
        hash_algorithms,
        session_mem_per_user_bytes,
        rdma_bind_peer,
        rdma_port
    );
    // Example values, not defaults: root, anonymous, device,
    // rdma_advertise, users.
    assert!(doc.anonymous && !def.anonymous);
    assert_eq!(doc.device.as_deref(), Some("siw0"));
    assert_eq!(def.device, None);
    assert!(doc.rdma_advertise.is_some() && def.rdma_advertise.is_none());
}

#[test]
fn the_numbers_in_the_prose_are_the_constants() {
    assert_eq!(DEFAULT_SESSION_MEM_BUDGET, 1 << 30);
    assert_eq!(ServerConfig::default().session_mem_budget_bytes, 1 << 30);
    assert!(DOC.contains("`session_mem_budget_bytes` (1 GiB)"));
    assert_eq!(DEFAULT_SESSION_MEM_PER_USER, 256 << 20);
    assert_eq!(
        ServerConfig::default().session_mem_per_user_bytes,
        256 << 20
    );
    assert!(DOC.contains("`session_mem_per_user_bytes` (256 MiB"));
    // The share holds two sessions of the largest default size.
    let d = ServerConfig::default();
    let largest = 2 * u64::from(d.max_streams) * u64::from(d.iodepth) * u64::from(d.block_size);
    assert_eq!(largest, 128 << 20);
    assert!(DOC.contains("128 MiB at the default"));
    assert_eq!(DEFAULT_SESSION_MEM_PER_USER, 2 * largest);
    assert_eq!(DEFAULT_LOGIN_TIMEOUT_SECS, 30);
    assert!(DOC.contains("`login_timeout_secs` (30 s)"));
    assert_eq!(PRE_LOGIN_MAX_BYTES, 16 << 10);
    assert!(DOC.contains("at most 16 KiB in all"));
    assert!(DOC.contains("Sent more than 16384 bytes"));
    assert_eq!(MAX_REPLY_LINE, 8 << 10);
    assert!(DOC.contains("longer than 8 KiB (`MAX_REPLY_LINE`)"));
    assert_eq!(MAX_REPLY_BYTES, 256 << 10);
    assert!(DOC.contains("256 KiB (`MAX_REPLY_BYTES`)"));
}
