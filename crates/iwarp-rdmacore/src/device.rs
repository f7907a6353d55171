//! The kernel device of the rdma-core provider: librdmacm's device list,
//! opening one (`rdma_get_devices`), and what it reports about itself
//! (`ibv_query_device`, `ibv_query_port`).
//!
//! A `iwarp::Context` on a kernel device holds one [`Device`]:
//! an `ibv_context` of librdmacm's list, so that queue pairs created on it
//! can be connected by rdma_cm (which refuses a QP of another context).

use std::ffi::c_int;
use std::fmt;
use std::sync::{Arc, Weak};

use crate::ffi::{self, Lib};
use iwarp_verbs::device_info::{no_device_reason, DeviceAttr, DeviceError, DeviceInfo, Transport};
use iwarp_verbs::Error;

/// The kernel devices librdmacm knows (name and transport).
pub fn list() -> Result<Vec<DeviceInfo>, String> {
    let lib = ffi::lib().map_err(str::to_string)?;
    let mut n: c_int = 0;
    // SAFETY: ibv_get_device_list writes the count and returns a
    // NULL-terminated array (or NULL with errno set), freed below.
    let list = unsafe { (lib.verbs.ibv_get_device_list)(&mut n) };
    if list.is_null() {
        return Err(format!(
            "ibv_get_device_list failed ({}): {}",
            std::io::Error::last_os_error(),
            no_device_reason()
        ));
    }
    let mut out = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: `i < n`, the entries are valid device pointers until
        // ibv_free_device_list.
        let dev = unsafe { &**list.add(i) };
        out.push(DeviceInfo {
            name: ffi::cstr_field(&dev.name),
            transport: transport_of(dev.transport_type, None),
            provider: "rdma-core",
        });
    }
    // SAFETY: the list came from ibv_get_device_list and is freed once.
    unsafe { (lib.verbs.ibv_free_device_list)(list) };
    Ok(out)
}

fn transport_of(transport_type: c_int, link_layer: Option<u8>) -> Transport {
    match (transport_type, link_layer) {
        (ffi::IBV_TRANSPORT_IWARP, _) => Transport::Iwarp,
        (ffi::IBV_TRANSPORT_IB, Some(ffi::IBV_LINK_LAYER_ETHERNET)) => Transport::Roce,
        (ffi::IBV_TRANSPORT_IB, _) => Transport::InfiniBand,
        (t, _) => Transport::Other(t),
    }
}

/// An open kernel device.
pub(crate) struct Device {
    pub(crate) lib: &'static Lib,
    pub(crate) ctx: *mut ffi::ibv_context,
    pub(crate) attr: DeviceAttr,
    /// The `Arc` this device lives in, for the seam's `&self` calls that
    /// hand the device on (a PD, a CQ).
    me: Weak<Device>,
}

// SAFETY: `ctx` is owned by librdmacm for the life of the process (never
// closed) and libibverbs verbs are thread-safe.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device").field("attr", &self.attr).finish()
    }
}

fn mtu_bytes(ibv_mtu: c_int) -> u32 {
    match ibv_mtu {
        1..=5 => 128 << ibv_mtu,
        _ => 0,
    }
}

impl Device {
    /// Open `name` among librdmacm's devices.
    pub(crate) fn open(name: &str) -> Result<Arc<Device>, DeviceError> {
        let lib = ffi::lib().map_err(|why| DeviceError::NoRdma {
            name: name.to_string(),
            why: why.to_string(),
        })?;
        let mut n: c_int = 0;
        // SAFETY: rdma_get_devices returns librdmacm's NULL-terminated
        // array of open contexts; the contexts stay open (librdmacm owns
        // them) after the array is freed.
        let list = unsafe { (lib.cm.rdma_get_devices)(&mut n) };
        if list.is_null() {
            return Err(DeviceError::NoRdma {
                name: name.to_string(),
                why: no_device_reason(),
            });
        }
        let mut found = None;
        let mut names = Vec::new();
        for i in 0..n.max(0) as usize {
            // SAFETY: `i < n`; each entry is an open context whose
            // `device` points at its ibv_device.
            let ctx = unsafe { *list.add(i) };
            // SAFETY: as above.
            let dname = ffi::cstr_field(unsafe { &(*(*ctx).device).name });
            if dname == name {
                found = Some(ctx);
            }
            names.push(dname);
        }
        // SAFETY: the array came from rdma_get_devices; freed once.
        unsafe { (lib.cm.rdma_free_devices)(list) };
        let ctx = match found {
            Some(c) => c,
            None if names.is_empty() => {
                return Err(DeviceError::NoRdma {
                    name: name.to_string(),
                    why: no_device_reason(),
                })
            }
            None => {
                return Err(DeviceError::NoSuchDevice {
                    name: name.to_string(),
                    available: names,
                })
            }
        };
        let attr = query(lib, ctx, name).map_err(|why| DeviceError::Open {
            name: name.to_string(),
            why,
        })?;
        tracing::info!(?attr, "opened rdma-core device");
        Ok(Arc::new_cyclic(|me| Device {
            lib,
            ctx,
            attr,
            me: me.clone(),
        }))
    }

    /// Another handle on this device.
    pub(crate) fn arc(&self) -> Arc<Device> {
        // Every Device is made by `open`, inside an Arc that outlives any
        // `&self` borrowed from it.
        self.me
            .upgrade()
            .expect("a Device lives in the Arc `open` made")
    }
}

fn query(lib: &Lib, ctx: *mut ffi::ibv_context, name: &str) -> Result<DeviceAttr, String> {
    // SAFETY: all-zero is a valid value of these plain C structs.
    let mut da: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: `ctx` is open; `da` is a writable ibv_device_attr.
    let rc = unsafe { (lib.verbs.ibv_query_device)(ctx, &mut da) };
    if rc != 0 {
        return Err(format!(
            "ibv_query_device: {}",
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    // SAFETY: as above.
    let mut pa: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: `ctx` is open; `pa` has room for the whole struct and more.
    let rc = unsafe { (lib.verbs.ibv_query_port)(ctx, 1, &mut pa) };
    if rc != 0 {
        return Err(format!(
            "ibv_query_port(1): {}",
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    // SAFETY: `ctx` is open, its device pointer is valid.
    let tt = unsafe { (*(*ctx).device).transport_type };
    let transport = transport_of(tt, Some(pa.link_layer));
    Ok(DeviceAttr {
        name: name.to_string(),
        transport,
        fw_ver: ffi::cstr_field(&da.fw_ver),
        max_qp_wr: da.max_qp_wr.max(0) as u32,
        max_sge: da.max_sge.max(0) as u32,
        max_cqe: da.max_cqe.max(0) as u32,
        max_mr_size: da.max_mr_size,
        max_qp_rd_atom: da.max_qp_rd_atom.max(0) as u32,
        max_qp_init_rd_atom: da.max_qp_init_rd_atom.max(0) as u32,
        active_mtu: mtu_bytes(pa.active_mtu),
        port_active: pa.state == 4,
        has_write_imm_and_rnr: !transport.is_iwarp(),
    })
}

/// An rdma-core call `op` failed; `errno` says why.
pub(super) fn os_err(op: &'static str) -> Error {
    Error::RdmaCore {
        op,
        why: std::io::Error::last_os_error().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_and_mtu_map_from_ibv_values() {
        assert_eq!(
            transport_of(ffi::IBV_TRANSPORT_IWARP, None),
            Transport::Iwarp
        );
        assert_eq!(
            transport_of(ffi::IBV_TRANSPORT_IB, Some(ffi::IBV_LINK_LAYER_ETHERNET)),
            Transport::Roce
        );
        assert_eq!(
            transport_of(ffi::IBV_TRANSPORT_IB, Some(ffi::IBV_LINK_LAYER_INFINIBAND)),
            Transport::InfiniBand
        );
        assert_eq!(mtu_bytes(3), 1024);
    }
}
