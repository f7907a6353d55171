//! The verbs through their C entry points, without a peer.

use super::*;
use crate::error::{iwarp_result, last_error};
use iwarp_result::*;
use iwarp_rs::ProgressMode;
use std::ffi::c_char;
use std::ptr::{null, null_mut};
use std::time::Duration;

#[test]
fn open_device_named_and_listen_on() {
    let has_rdma = std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    // SAFETY (whole test): every pointer is NULL, a live local, a C
    // string literal, or a handle these calls returned.
    unsafe {
        let mut ctx = null_mut();
        assert_eq!(
            iwarp_open_device_named(c"soft".as_ptr(), null_mut()),
            IWARP_ERR_NULL_ARG
        );
        assert_eq!(
            iwarp_open_device_named(c"soft".as_ptr(), &mut ctx),
            IWARP_OK
        );
        let mut name = [0 as c_char; 16];
        assert_eq!(iwarp_device_name(ctx, name.as_mut_ptr(), name.len()), 4);
        assert_eq!(
            std::ffi::CStr::from_ptr(name.as_ptr()).to_str().unwrap(),
            "soft"
        );
        assert_eq!(iwarp_device_name(null(), name.as_mut_ptr(), name.len()), 0);
        let mut l = null_mut();
        assert_eq!(
            crate::cm::iwarp_listen_on(null(), c"127.0.0.1".as_ptr(), 0, null(), &mut l),
            IWARP_ERR_NULL_ARG
        );
        assert_eq!(
            crate::cm::iwarp_listen_on(ctx, c"127.0.0.1".as_ptr(), 0, null(), &mut l),
            IWARP_OK
        );
        assert_ne!(crate::cm::iwarp_listener_port(l), 0);
        crate::cm::iwarp_listener_close(l);
        iwarp_close_device(ctx);
        // NULL or "" is iwarp_open_device: IWARP_DEVICE, else soft.
        for n in [null(), c"".as_ptr()] {
            let mut c2 = null_mut();
            assert_eq!(iwarp_open_device_named(n, &mut c2), IWARP_OK);
            iwarp_close_device(c2);
        }
        let mut bad = std::ptr::dangling_mut::<iwarp_context>();
        assert_eq!(
            iwarp_open_device_named(c"no/such".as_ptr(), &mut bad),
            IWARP_ERR_INVALID_ARG
        );
        assert!(bad.is_null(), "a failed call resets *out");
        assert!(
            last_error().contains("invalid device name"),
            "{}",
            last_error()
        );
        if !has_rdma {
            assert_eq!(
                iwarp_open_device_named(c"siw0".as_ptr(), &mut bad),
                IWARP_ERR_INVALID_ARG
            );
            assert!(last_error().contains("--device soft"), "{}", last_error());
        }
    }
}

#[test]
#[allow(deprecated)] // iwarp_qp_drive & co. keep their NULL checks
fn null_handles_give_null_arg_and_a_message() {
    // SAFETY (whole test): every pointer is NULL or points to a live
    // local, which is what the functions' contracts allow.
    unsafe {
        assert_eq!(iwarp_open_device(null_mut()), IWARP_ERR_NULL_ARG);
        assert!(last_error().contains("iwarp_open_device: argument `out` is NULL"));
        let mut pd = std::ptr::dangling_mut::<iwarp_pd>();
        assert_eq!(iwarp_alloc_pd(null_mut(), &mut pd), IWARP_ERR_NULL_ARG);
        assert!(pd.is_null(), "a failed call resets *out");
        let sge = iwarp_sge::default();
        assert_eq!(
            iwarp_post_send(null_mut(), 1, 0, &sge, 1, 0, 0, 0, 0),
            IWARP_ERR_NULL_ARG
        );
        assert_eq!(
            iwarp_post_recv(null_mut(), 1, null(), 0),
            IWARP_ERR_NULL_ARG
        );
        let mut wc = iwarp_wc::default();
        assert_eq!(
            iwarp_poll_cq(null_mut(), 1, &mut wc),
            -(IWARP_ERR_NULL_ARG as i32)
        );
        assert_eq!(iwarp_wait_cq(null_mut(), 0, &mut wc), IWARP_ERR_NULL_ARG);
        assert_eq!(iwarp_cq_fd(null()), -1);
        assert_eq!(iwarp_cq_set_progress(null_mut(), 0, 0), IWARP_ERR_NULL_ARG);
        assert_eq!(iwarp_drive_fd(null()), -1);
        assert_eq!(iwarp_drive_progress(null()), IWARP_ERR_NULL_ARG);
        let mut d = null_mut();
        assert_eq!(iwarp_qp_drive(null(), &mut d), IWARP_ERR_NULL_ARG);
        assert!(d.is_null());
        iwarp_drive_release(null_mut());
        assert!(iwarp_mr_addr(null()).is_null());
        assert_eq!(iwarp_mr_lkey(null()), 0);
        assert_eq!(iwarp_query_qp_state(null()), -(IWARP_ERR_NULL_ARG as i32));
        assert_eq!(iwarp_disconnect(null_mut()), IWARP_ERR_NULL_ARG);
        // Free functions: NULL is a no-op.
        iwarp_close_device(null_mut());
        iwarp_dealloc_pd(null_mut());
        iwarp_dereg_mr(null_mut());
        iwarp_destroy_cq(null_mut());
        iwarp_destroy_qp(null_mut());
    }
}

#[test]
fn objects_and_argument_checks() {
    // SAFETY (whole test): handles come from the create calls and are
    // freed once at the end; other pointers point to live locals.
    unsafe {
        let mut ctx = null_mut();
        assert_eq!(iwarp_open_device(&mut ctx), IWARP_OK);
        let mut pd = null_mut();
        assert_eq!(iwarp_alloc_pd(ctx, &mut pd), IWARP_OK);
        let mut cq = null_mut();
        assert_eq!(iwarp_create_cq(ctx, 0, &mut cq), IWARP_ERR_INVALID_ARG);
        assert_eq!(iwarp_create_cq(ctx, 8, &mut cq), IWARP_OK);
        let mut qp = null_mut();
        assert_eq!(iwarp_create_qp(pd, cq, cq, 4, 4, &mut qp), IWARP_OK);
        let mut mr = null_mut();
        assert_eq!(
            iwarp_alloc_mr(pd, 100, 0x10, &mut mr),
            IWARP_ERR_INVALID_ARG
        );
        assert_eq!(iwarp_alloc_mr(pd, 100, 1, &mut mr), IWARP_OK);
        assert_eq!(iwarp_mr_length(mr), 100);
        assert_eq!(iwarp_mr_addr(mr) as usize % 4096, 0, "page-aligned");
        assert_ne!(iwarp_mr_lkey(mr), 0);
        let sge = iwarp_sge {
            addr: iwarp_mr_addr(mr) as u64,
            length: 100,
            lkey: iwarp_mr_lkey(mr),
        };
        assert_eq!(
            iwarp_post_send(qp, 1, 9, &sge, 1, 0, 0, 0, 0),
            IWARP_ERR_INVALID_ARG
        );
        assert!(last_error().contains("unknown opcode 9"));
        assert_eq!(iwarp_post_recv(qp, 1, &sge, 7), IWARP_ERR_INVALID_ARG);
        assert_eq!(iwarp_post_recv(qp, 1, &sge, 1), IWARP_OK);
        assert_eq!(
            iwarp_query_qp_state(qp),
            iwarp_qp_state::IWARP_QPS_INIT as i32
        );
        let mut wc = [iwarp_wc::default(); 4];
        assert_eq!(iwarp_poll_cq(cq, -1, wc.as_mut_ptr()), -2);
        assert_eq!(iwarp_poll_cq(cq, 4, null_mut()), -1);
        assert_eq!(iwarp_poll_cq(cq, 4, wc.as_mut_ptr()), 0);
        assert_eq!(iwarp_cq_set_progress(cq, 3, 0), IWARP_ERR_INVALID_ARG);
        assert!(last_error().contains("unknown progress mode 3"));
        assert_eq!(iwarp_cq_set_progress(cq, -1, 0), IWARP_ERR_INVALID_ARG);
        for mode in [
            iwarp_progress_mode::IWARP_PROGRESS_APP_DRIVEN,
            iwarp_progress_mode::IWARP_PROGRESS_BUSY_POLL,
            iwarp_progress_mode::IWARP_PROGRESS_THREADED,
        ] {
            assert_eq!(iwarp_cq_set_progress(cq, mode as i32, 10), IWARP_OK);
        }
        assert_eq!(
            (*cq).cq.progress_mode(),
            ProgressMode::Threaded {
                spin: Duration::from_micros(10)
            }
        );
        // Destroying the QP flushes the posted receive into the CQ,
        // which outlives the QP handle.
        iwarp_destroy_qp(qp);
        assert_eq!(iwarp_wait_cq(cq, 2000, wc.as_mut_ptr()), IWARP_OK);
        assert_eq!(wc[0].status, iwarp_wc_status::IWARP_WC_WR_FLUSH_ERR as i32);
        assert_eq!(wc[0].opcode, iwarp_wc_opcode::IWARP_WC_RECV as i32);
        assert_eq!(iwarp_wait_cq(cq, 10, wc.as_mut_ptr()), IWARP_ERR_TIMEOUT);
        // Any order of freeing is fine.
        iwarp_close_device(ctx);
        iwarp_dealloc_pd(pd);
        iwarp_destroy_cq(cq);
        iwarp_dereg_mr(mr);
    }
}
