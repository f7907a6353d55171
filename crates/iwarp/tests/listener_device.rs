//! `iwarp::cm::Listener::bind` follows `IWARP_DEVICE` the way
//! `Context::open` does (its own test binary: it sets the variable).
//! Without a kernel RDMA device, asking for one fails at bind with an
//! error that names the fix; `soft`, `auto` and unset listen on TCP.

use iwarp::cm::{CmError, Listener, MpaConfig};

fn host_has_rdma_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

#[test]
fn listener_follows_iwarp_device() {
    if host_has_rdma_device() {
        return;
    }
    let any = "127.0.0.1:0".parse().unwrap();
    std::env::remove_var(iwarp::DEVICE_ENV);
    assert_eq!(
        Listener::bind(any, MpaConfig::default())
            .unwrap()
            .device_name(),
        "soft"
    );
    for v in ["soft", "auto"] {
        std::env::set_var(iwarp::DEVICE_ENV, v);
        let l = Listener::bind(any, MpaConfig::default()).unwrap();
        assert_eq!(l.device_name(), "soft", "IWARP_DEVICE={v}");
    }
    std::env::set_var(iwarp::DEVICE_ENV, "siw0");
    let e = Listener::bind(any, MpaConfig::default()).unwrap_err();
    assert!(matches!(e, CmError::Device { .. }), "{e:?}");
    assert!(e.to_string().contains("--device soft"), "{e}");
    std::env::set_var(iwarp::DEVICE_ENV, "bad/name");
    let e = Listener::bind(any, MpaConfig::default()).unwrap_err();
    assert!(e.to_string().contains("invalid device name"), "{e}");
    std::env::remove_var(iwarp::DEVICE_ENV);
}
