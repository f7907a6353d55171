//! Device selection without RDMA hardware: `soft` always opens, `auto`
//! falls back to `soft` when the host has no kernel RDMA device, and a
//! kernel device name that is not there fails with an error that names
//! the cause and the fix.

use iwarp::{Context, DeviceError, Error, Transport};

fn host_has_rdma_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

#[test]
fn soft_opens_by_name() {
    let ctx = Context::open_device("soft").unwrap();
    assert_eq!(ctx.device_name(), "soft");
    assert_eq!(ctx.transport(), Transport::SoftIwarp);
}

#[test]
fn open_defaults_to_soft() {
    // The test runner does not set IWARP_DEVICE; when a developer does,
    // Context::open follows it and this test has nothing to say.
    if std::env::var_os(iwarp::DEVICE_ENV).is_some() {
        return;
    }
    assert_eq!(Context::open().unwrap().device_name(), "soft");
}

#[test]
fn auto_falls_back_to_soft_without_a_kernel_device() {
    let ctx = Context::open_device("auto").unwrap();
    if host_has_rdma_device() && cfg!(feature = "rdma-core") {
        assert_ne!(ctx.device_name(), "soft");
    } else {
        assert_eq!(ctx.device_name(), "soft");
    }
}

#[test]
fn missing_kernel_device_says_how_to_fix_it() {
    if host_has_rdma_device() {
        return;
    }
    let e = Context::open_device("siw0").unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(
            e,
            Error::Device(DeviceError::NoRdma { .. } | DeviceError::FeatureOff { .. })
        ),
        "{e:?}"
    );
    assert!(text.contains("--device soft"), "{text}");
}

#[test]
fn bad_names_are_refused() {
    let e = Context::open_device("no such/device").unwrap_err();
    assert!(matches!(e, Error::Device(DeviceError::BadName(_))), "{e:?}");
}

#[test]
fn list_starts_with_soft() {
    let l = iwarp::list_devices();
    assert_eq!(l[0].name, "soft");
    if !cfg!(feature = "rdma-core") {
        assert_eq!(l.len(), 1);
    }
}
