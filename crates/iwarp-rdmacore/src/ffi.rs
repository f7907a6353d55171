//! The FFI edge of the rdma-core provider: libibverbs.so.1 and
//! librdmacm.so.1, loaded at run time with `dlopen(3)`.
//!
//! Nothing here links against rdma-core, so a build on a host without the
//! libraries (or their `-dev` packages) works, and the provider is simply
//! reported as absent at run time ([`lib`] returns the reason).
//!
//! The structures are the stable ABI of `libibverbs.so.1` / `librdmacm.so.1`
//! (rdma-core `libibverbs/verbs.h`, `librdmacm/rdma_cma.h`): only the
//! prefixes and fields this provider reads or fills are declared, with
//! padding where the layout needs it. `tests::layout_matches_c_headers`
//! compiles a C program against the installed headers (when
//! `libibverbs-dev` is present) and compares every offset, size and
//! constant used here.
//!
//! The three verbs on the fast path (`ibv_post_send`, `ibv_post_recv`,
//! `ibv_poll_cq`) are `static inline` in `verbs.h`: they call through
//! `ibv_context::ops`, so they are called here the same way.
// The binding table declares the whole enums it takes values from.
#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

// ---- libibverbs (verbs.h) -------------------------------------------------

pub const IBV_TRANSPORT_IB: c_int = 0;
pub const IBV_TRANSPORT_IWARP: c_int = 1;

pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

pub const IBV_QPT_RC: c_int = 2;

pub const IBV_QPS_INIT: c_int = 1;
pub const IBV_QPS_RTR: c_int = 2;
pub const IBV_QPS_RTS: c_int = 3;
pub const IBV_QPS_SQD: c_int = 4;
pub const IBV_QPS_SQE: c_int = 5;
pub const IBV_QPS_ERR: c_int = 6;

pub const IBV_QP_STATE: c_int = 1;
pub const IBV_QP_ACCESS_FLAGS: c_int = 8;
pub const IBV_QP_PKEY_INDEX: c_int = 16;
pub const IBV_QP_PORT: c_int = 32;

pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
pub const IBV_ACCESS_REMOTE_READ: c_int = 4;

pub const IBV_WR_RDMA_WRITE: c_int = 0;
pub const IBV_WR_SEND: c_int = 2;
pub const IBV_WR_RDMA_READ: c_int = 4;
pub const IBV_WR_SEND_WITH_INV: c_int = 9;

pub const IBV_SEND_SIGNALED: u32 = 2;
pub const IBV_SEND_SOLICITED: u32 = 4;

pub const IBV_WC_SEND: c_int = 0;
pub const IBV_WC_RDMA_WRITE: c_int = 1;
pub const IBV_WC_RDMA_READ: c_int = 2;
pub const IBV_WC_RECV: c_int = 128;
pub const IBV_WC_RECV_RDMA_WITH_IMM: c_int = 129;

pub const IBV_WC_WITH_INV: u32 = 8;

/// `enum ibv_wc_status`, in order (0..=21).
pub const IBV_WC_SUCCESS: c_int = 0;
pub const IBV_WC_LOC_LEN_ERR: c_int = 1;
pub const IBV_WC_LOC_QP_OP_ERR: c_int = 2;
pub const IBV_WC_LOC_EEC_OP_ERR: c_int = 3;
pub const IBV_WC_LOC_PROT_ERR: c_int = 4;
pub const IBV_WC_WR_FLUSH_ERR: c_int = 5;
pub const IBV_WC_MW_BIND_ERR: c_int = 6;
pub const IBV_WC_BAD_RESP_ERR: c_int = 7;
pub const IBV_WC_LOC_ACCESS_ERR: c_int = 8;
pub const IBV_WC_REM_INV_REQ_ERR: c_int = 9;
pub const IBV_WC_REM_ACCESS_ERR: c_int = 10;
pub const IBV_WC_REM_OP_ERR: c_int = 11;
pub const IBV_WC_RETRY_EXC_ERR: c_int = 12;
pub const IBV_WC_RNR_RETRY_EXC_ERR: c_int = 13;
pub const IBV_WC_LOC_RDD_VIOL_ERR: c_int = 14;
pub const IBV_WC_REM_INV_RD_REQ_ERR: c_int = 15;
pub const IBV_WC_REM_ABORT_ERR: c_int = 16;
pub const IBV_WC_INV_EECN_ERR: c_int = 17;
pub const IBV_WC_INV_EEC_STATE_ERR: c_int = 18;
pub const IBV_WC_FATAL_ERR: c_int = 19;
pub const IBV_WC_RESP_TIMEOUT_ERR: c_int = 20;
pub const IBV_WC_GENERAL_ERR: c_int = 21;

/// `struct ibv_device` (complete).
#[repr(C)]
pub struct ibv_device {
    pub _ops: [*mut c_void; 2],
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; 64],
    pub dev_name: [c_char; 64],
    pub dev_path: [c_char; 256],
    pub ibdev_path: [c_char; 256],
}

pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

/// `struct ibv_context_ops` (complete: 32 function pointers; the ones we
/// call are named, the others are padding).
#[repr(C)]
pub struct ibv_context_ops {
    pub _before_poll_cq: [*mut c_void; 11],
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    pub _before_post_send: [*mut c_void; 12],
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub _after_post_recv: [*mut c_void; 5],
}

/// `struct ibv_context` (prefix: the device and the ops table).
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
}

/// `struct ibv_device_attr` (complete).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: u32,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_port_attr` (complete as of rdma-core 44), followed by spare
/// room in case a newer library writes more.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_port_attr {
    pub state: c_int,
    pub max_mtu: c_int,
    pub active_mtu: c_int,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
    pub _spare: [u8; 64],
}

/// `struct ibv_pd` (prefix).
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr` (complete).
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_comp_channel` (prefix).
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
}

/// `struct ibv_cq` (prefix).
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
}

/// `struct ibv_qp` (prefix).
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_int,
    pub qp_type: c_int,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// The `rdma` member of `ibv_send_wr::wr` (the union is 32 bytes: its
/// largest member is `atomic`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_send_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
    pub _pad: u32,
    pub _rest_of_union: [u64; 2],
}

/// `struct ibv_send_wr` (complete; the unions we do not use are padding).
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_int,
    pub send_flags: u32,
    /// `imm_data` / `invalidate_rkey`.
    pub invalidate_rkey: u32,
    pub rdma: ibv_send_wr_rdma,
    pub qp_type_xrc: u32,
    pub _pad: u32,
    pub _bind_mw_tso: [u64; 6],
}

/// `struct ibv_recv_wr` (complete).
#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_wc` (complete).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_int,
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` / `invalidated_rkey`.
    pub invalidated_rkey: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr` (complete).
#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

/// `struct ibv_qp_attr` (complete; the address vectors are opaque: this
/// provider never fills them, rdma_cm does).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_attr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_int,
    pub cap: ibv_qp_cap,
    pub ah_attr: [u64; 4],
    pub alt_ah_attr: [u64; 4],
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

impl ibv_qp_attr {
    pub fn zeroed() -> ibv_qp_attr {
        ibv_qp_attr {
            qp_state: 0,
            cur_qp_state: 0,
            path_mtu: 0,
            path_mig_state: 0,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: 0,
            cap: ibv_qp_cap::default(),
            ah_attr: [0; 4],
            alt_ah_attr: [0; 4],
            pkey_index: 0,
            alt_pkey_index: 0,
            en_sqd_async_notify: 0,
            sq_draining: 0,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 0,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            alt_port_num: 0,
            alt_timeout: 0,
            rate_limit: 0,
        }
    }
}

// ---- librdmacm (rdma_cma.h) -----------------------------------------------

pub const RDMA_PS_TCP: c_int = 0x0106;

pub const RDMA_CM_EVENT_ADDR_RESOLVED: c_int = 0;
pub const RDMA_CM_EVENT_ROUTE_RESOLVED: c_int = 2;
pub const RDMA_CM_EVENT_CONNECT_REQUEST: c_int = 4;
pub const RDMA_CM_EVENT_ESTABLISHED: c_int = 9;
pub const RDMA_CM_EVENT_DISCONNECTED: c_int = 10;
pub const RDMA_CM_EVENT_DEVICE_REMOVAL: c_int = 11;
pub const RDMA_CM_EVENT_TIMEWAIT_EXIT: c_int = 15;

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// `struct rdma_cm_id` (prefix: up to the addresses of `route.addr`,
/// which rdma_cma.h's inline `rdma_get_local_addr` / `rdma_get_peer_addr`
/// return).
#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub src_addr: libc::sockaddr_storage,
    pub dst_addr: libc::sockaddr_storage,
}

/// `struct rdma_conn_param` (complete).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_cm_event` (prefix: the `conn` member of the `param` union).
#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: c_int,
    pub status: c_int,
    pub conn: rdma_conn_param,
}

// ---- the loaded libraries -------------------------------------------------

macro_rules! fns {
    ($name:ident { $($f:ident : fn($($a:ty),*) -> $r:ty;)* }) => {
        /// Entry points resolved with `dlsym`.
        #[allow(clippy::type_complexity)]
        pub struct $name {
            $(pub $f: unsafe extern "C" fn($($a),*) -> $r,)*
        }
        impl $name {
            fn load(handle: *mut c_void, lib: &str) -> Result<$name, String> {
                Ok($name {
                    $($f: {
                        let sym = concat!(stringify!($f), "\0");
                        // SAFETY: `handle` came from a successful dlopen and is
                        // never closed; `sym` is NUL-terminated.
                        let p = unsafe { libc::dlsym(handle, sym.as_ptr().cast()) };
                        if p.is_null() {
                            return Err(format!("{lib} has no symbol {}: install a current rdma-core (Debian: libibverbs1, librdmacm1)", stringify!($f)));
                        }
                        // SAFETY: the symbol is the C function declared in
                        // verbs.h / rdma_cma.h with exactly this signature;
                        // function and data pointers have one size on Linux.
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($a),*) -> $r>(p) }
                    },)*
                })
            }
        }
    };
}

fns!(Verbs {
    ibv_get_device_list: fn(*mut c_int) -> *mut *mut ibv_device;
    ibv_free_device_list: fn(*mut *mut ibv_device) -> ();
    ibv_query_device: fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
    ibv_query_port: fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
    ibv_alloc_pd: fn(*mut ibv_context) -> *mut ibv_pd;
    ibv_dealloc_pd: fn(*mut ibv_pd) -> c_int;
    ibv_reg_mr: fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
    ibv_dereg_mr: fn(*mut ibv_mr) -> c_int;
    ibv_create_comp_channel: fn(*mut ibv_context) -> *mut ibv_comp_channel;
    ibv_destroy_comp_channel: fn(*mut ibv_comp_channel) -> c_int;
    ibv_create_cq: fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq;
    ibv_destroy_cq: fn(*mut ibv_cq) -> c_int;
    ibv_get_cq_event: fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
    ibv_ack_cq_events: fn(*mut ibv_cq, u32) -> ();
    ibv_create_qp: fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
    ibv_modify_qp: fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
    ibv_destroy_qp: fn(*mut ibv_qp) -> c_int;
});

fns!(Cm {
    rdma_get_devices: fn(*mut c_int) -> *mut *mut ibv_context;
    rdma_free_devices: fn(*mut *mut ibv_context) -> ();
    rdma_create_event_channel: fn() -> *mut rdma_event_channel;
    rdma_destroy_event_channel: fn(*mut rdma_event_channel) -> ();
    rdma_create_id: fn(*mut rdma_event_channel, *mut *mut rdma_cm_id, *mut c_void, c_int) -> c_int;
    rdma_destroy_id: fn(*mut rdma_cm_id) -> c_int;
    rdma_migrate_id: fn(*mut rdma_cm_id, *mut rdma_event_channel) -> c_int;
    rdma_bind_addr: fn(*mut rdma_cm_id, *mut libc::sockaddr) -> c_int;
    rdma_listen: fn(*mut rdma_cm_id, c_int) -> c_int;
    rdma_resolve_addr: fn(*mut rdma_cm_id, *mut libc::sockaddr, *mut libc::sockaddr, c_int) -> c_int;
    rdma_resolve_route: fn(*mut rdma_cm_id, c_int) -> c_int;
    rdma_connect: fn(*mut rdma_cm_id, *mut rdma_conn_param) -> c_int;
    rdma_accept: fn(*mut rdma_cm_id, *mut rdma_conn_param) -> c_int;
    rdma_reject: fn(*mut rdma_cm_id, *const c_void, u8) -> c_int;
    rdma_disconnect: fn(*mut rdma_cm_id) -> c_int;
    rdma_get_cm_event: fn(*mut rdma_event_channel, *mut *mut rdma_cm_event) -> c_int;
    rdma_ack_cm_event: fn(*mut rdma_cm_event) -> c_int;
    rdma_event_str: fn(c_int) -> *const c_char;
});

/// Both libraries, loaded once per process.
pub struct Lib {
    pub verbs: Verbs,
    pub cm: Cm,
}

fn dlopen(name: &CStr) -> Result<*mut c_void, String> {
    // SAFETY: `name` is NUL-terminated; RTLD_NOW resolves everything now,
    // so a missing symbol fails here and not at a later call.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a thread-local NUL-terminated string or null.
        let why = unsafe { libc::dlerror() };
        let why = if why.is_null() {
            String::from("unknown error")
        } else {
            // SAFETY: non-null, NUL-terminated (above).
            unsafe { CStr::from_ptr(why) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(format!(
            "cannot load {}: {why}; install rdma-core (Debian: apt-get install libibverbs1 librdmacm1 ibverbs-providers) or use the software device (--device soft)",
            name.to_string_lossy()
        ));
    }
    Ok(h)
}

/// The libraries, or why they are unavailable (the text names the fix).
/// `IWARP_RDMA_CORE=off` in the environment makes them unavailable on
/// purpose (to test the fallback).
pub fn lib() -> Result<&'static Lib, &'static str> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        // Unset in a privileged process (iwarp_proto::env).
        if iwarp_proto::env::var("IWARP_RDMA_CORE").is_ok_and(|v| v == "off" || v == "0") {
            return Err(String::from(
                "rdma-core disabled by IWARP_RDMA_CORE=off: unset it to use kernel RDMA devices",
            ));
        }
        let v = dlopen(c"libibverbs.so.1")?;
        let c = dlopen(c"librdmacm.so.1")?;
        Ok(Lib {
            verbs: Verbs::load(v, "libibverbs.so.1")?,
            cm: Cm::load(c, "librdmacm.so.1")?,
        })
    })
    .as_ref()
    .map_err(String::as_str)
}

/// A NUL-terminated C string in a fixed array, as a Rust string.
pub fn cstr_field(field: &[c_char]) -> String {
    let bytes: Vec<u8> = field
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Compiles a C program against the installed rdma-core headers and
    /// compares its offsets, sizes and constants with the declarations
    /// above. Skipped (with a note) when the headers or a C compiler are
    /// missing.
    #[test]
    fn layout_matches_c_headers() {
        if !std::path::Path::new("/usr/include/infiniband/verbs.h").exists()
            || !std::path::Path::new("/usr/include/rdma/rdma_cma.h").exists()
        {
            eprintln!("skipped: no libibverbs-dev / librdmacm-dev headers");
            return;
        }
        let checks: Vec<(&str, usize)> = vec![
            ("sizeof(struct ibv_device)", size_of::<ibv_device>()),
            (
                "offsetof(struct ibv_device, transport_type)",
                offset_of!(ibv_device, transport_type),
            ),
            (
                "offsetof(struct ibv_device, name)",
                offset_of!(ibv_device, name),
            ),
            (
                "sizeof(struct ibv_context_ops)",
                size_of::<ibv_context_ops>(),
            ),
            (
                "offsetof(struct ibv_context_ops, poll_cq)",
                offset_of!(ibv_context_ops, poll_cq),
            ),
            (
                "offsetof(struct ibv_context_ops, req_notify_cq)",
                offset_of!(ibv_context_ops, req_notify_cq),
            ),
            (
                "offsetof(struct ibv_context_ops, post_send)",
                offset_of!(ibv_context_ops, post_send),
            ),
            (
                "offsetof(struct ibv_context_ops, post_recv)",
                offset_of!(ibv_context_ops, post_recv),
            ),
            (
                "offsetof(struct ibv_context, ops)",
                offset_of!(ibv_context, ops),
            ),
            (
                "offsetof(struct ibv_context, num_comp_vectors)",
                offset_of!(ibv_context, num_comp_vectors),
            ),
            (
                "sizeof(struct ibv_device_attr)",
                size_of::<ibv_device_attr>(),
            ),
            (
                "offsetof(struct ibv_device_attr, max_sge)",
                offset_of!(ibv_device_attr, max_sge),
            ),
            (
                "offsetof(struct ibv_device_attr, max_qp_rd_atom)",
                offset_of!(ibv_device_attr, max_qp_rd_atom),
            ),
            (
                "offsetof(struct ibv_device_attr, max_qp_init_rd_atom)",
                offset_of!(ibv_device_attr, max_qp_init_rd_atom),
            ),
            (
                "offsetof(struct ibv_device_attr, phys_port_cnt)",
                offset_of!(ibv_device_attr, phys_port_cnt),
            ),
            (
                "sizeof(struct ibv_port_attr)",
                size_of::<ibv_port_attr>() - 64,
            ),
            (
                "offsetof(struct ibv_port_attr, link_layer)",
                offset_of!(ibv_port_attr, link_layer),
            ),
            (
                "offsetof(struct ibv_port_attr, active_mtu)",
                offset_of!(ibv_port_attr, active_mtu),
            ),
            ("offsetof(struct ibv_mr, lkey)", offset_of!(ibv_mr, lkey)),
            ("offsetof(struct ibv_mr, rkey)", offset_of!(ibv_mr, rkey)),
            (
                "offsetof(struct ibv_comp_channel, fd)",
                offset_of!(ibv_comp_channel, fd),
            ),
            (
                "offsetof(struct ibv_qp, qp_num)",
                offset_of!(ibv_qp, qp_num),
            ),
            ("offsetof(struct ibv_qp, state)", offset_of!(ibv_qp, state)),
            ("sizeof(struct ibv_sge)", size_of::<ibv_sge>()),
            ("sizeof(struct ibv_send_wr)", size_of::<ibv_send_wr>()),
            (
                "offsetof(struct ibv_send_wr, send_flags)",
                offset_of!(ibv_send_wr, send_flags),
            ),
            (
                "offsetof(struct ibv_send_wr, invalidate_rkey)",
                offset_of!(ibv_send_wr, invalidate_rkey),
            ),
            (
                "offsetof(struct ibv_send_wr, wr.rdma.remote_addr)",
                offset_of!(ibv_send_wr, rdma),
            ),
            (
                "offsetof(struct ibv_send_wr, wr.rdma.rkey)",
                offset_of!(ibv_send_wr, rdma) + offset_of!(ibv_send_wr_rdma, rkey),
            ),
            (
                "offsetof(struct ibv_send_wr, qp_type)",
                offset_of!(ibv_send_wr, qp_type_xrc),
            ),
            ("sizeof(struct ibv_recv_wr)", size_of::<ibv_recv_wr>()),
            ("sizeof(struct ibv_wc)", size_of::<ibv_wc>()),
            (
                "offsetof(struct ibv_wc, byte_len)",
                offset_of!(ibv_wc, byte_len),
            ),
            (
                "offsetof(struct ibv_wc, invalidated_rkey)",
                offset_of!(ibv_wc, invalidated_rkey),
            ),
            (
                "offsetof(struct ibv_wc, wc_flags)",
                offset_of!(ibv_wc, wc_flags),
            ),
            (
                "sizeof(struct ibv_qp_init_attr)",
                size_of::<ibv_qp_init_attr>(),
            ),
            (
                "offsetof(struct ibv_qp_init_attr, qp_type)",
                offset_of!(ibv_qp_init_attr, qp_type),
            ),
            ("sizeof(struct ibv_qp_attr)", size_of::<ibv_qp_attr>()),
            (
                "offsetof(struct ibv_qp_attr, ah_attr)",
                offset_of!(ibv_qp_attr, ah_attr),
            ),
            (
                "offsetof(struct ibv_qp_attr, pkey_index)",
                offset_of!(ibv_qp_attr, pkey_index),
            ),
            (
                "offsetof(struct ibv_qp_attr, port_num)",
                offset_of!(ibv_qp_attr, port_num),
            ),
            (
                "offsetof(struct ibv_qp_attr, rate_limit)",
                offset_of!(ibv_qp_attr, rate_limit),
            ),
            (
                "offsetof(struct rdma_cm_id, qp)",
                offset_of!(rdma_cm_id, qp),
            ),
            (
                "offsetof(struct rdma_cm_id, route.addr.src_storage)",
                offset_of!(rdma_cm_id, src_addr),
            ),
            (
                "offsetof(struct rdma_cm_id, route.addr.dst_storage)",
                offset_of!(rdma_cm_id, dst_addr),
            ),
            (
                "sizeof(struct rdma_conn_param)",
                size_of::<rdma_conn_param>(),
            ),
            (
                "offsetof(struct rdma_conn_param, qp_num)",
                offset_of!(rdma_conn_param, qp_num),
            ),
            (
                "offsetof(struct rdma_cm_event, event)",
                offset_of!(rdma_cm_event, event),
            ),
            (
                "offsetof(struct rdma_cm_event, param.conn)",
                offset_of!(rdma_cm_event, conn),
            ),
            ("IBV_TRANSPORT_IWARP", IBV_TRANSPORT_IWARP as usize),
            ("IBV_LINK_LAYER_ETHERNET", IBV_LINK_LAYER_ETHERNET as usize),
            ("IBV_QPT_RC", IBV_QPT_RC as usize),
            ("IBV_QPS_INIT", IBV_QPS_INIT as usize),
            ("IBV_QPS_ERR", IBV_QPS_ERR as usize),
            ("IBV_QP_PORT", IBV_QP_PORT as usize),
            ("IBV_QP_PKEY_INDEX", IBV_QP_PKEY_INDEX as usize),
            ("IBV_QP_ACCESS_FLAGS", IBV_QP_ACCESS_FLAGS as usize),
            ("IBV_WR_RDMA_READ", IBV_WR_RDMA_READ as usize),
            ("IBV_WR_SEND_WITH_INV", IBV_WR_SEND_WITH_INV as usize),
            ("IBV_SEND_SOLICITED", IBV_SEND_SOLICITED as usize),
            ("IBV_WC_RECV", IBV_WC_RECV as usize),
            ("IBV_WC_WITH_INV", IBV_WC_WITH_INV as usize),
            ("IBV_WC_REM_ACCESS_ERR", IBV_WC_REM_ACCESS_ERR as usize),
            (
                "IBV_WC_RNR_RETRY_EXC_ERR",
                IBV_WC_RNR_RETRY_EXC_ERR as usize,
            ),
            ("IBV_WC_GENERAL_ERR", IBV_WC_GENERAL_ERR as usize),
            ("RDMA_PS_TCP", RDMA_PS_TCP as usize),
            (
                "RDMA_CM_EVENT_CONNECT_REQUEST",
                RDMA_CM_EVENT_CONNECT_REQUEST as usize,
            ),
            (
                "RDMA_CM_EVENT_ESTABLISHED",
                RDMA_CM_EVENT_ESTABLISHED as usize,
            ),
            (
                "RDMA_CM_EVENT_DEVICE_REMOVAL",
                RDMA_CM_EVENT_DEVICE_REMOVAL as usize,
            ),
            (
                "RDMA_CM_EVENT_TIMEWAIT_EXIT",
                RDMA_CM_EVENT_TIMEWAIT_EXIT as usize,
            ),
        ];
        let dir = std::env::temp_dir().join(format!("iwarp-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut src = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\nint main(void) {\n",
        );
        for (expr, _) in &checks {
            src.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
        }
        src.push_str("  return 0;\n}\n");
        std::fs::write(dir.join("l.c"), src).unwrap();
        let cc = std::process::Command::new("cc")
            .arg("-o")
            .arg(dir.join("l"))
            .arg(dir.join("l.c"))
            .status();
        match cc {
            Ok(s) if s.success() => {}
            _ => {
                eprintln!("skipped: no working C compiler");
                return;
            }
        }
        let out = std::process::Command::new(dir.join("l")).output().unwrap();
        let got: Vec<usize> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        let mut bad = Vec::new();
        for ((expr, ours), c) in checks.iter().zip(&got) {
            if ours != c {
                bad.push(format!("{expr}: C says {c}, Rust says {ours}"));
            }
        }
        assert!(bad.is_empty(), "layout mismatches:\n{}", bad.join("\n"));
    }
}
