//! Memory-region table: every `MemError` of `MemoryAccess::check` and the
//! copy paths (siw `siw_check_mem` semantics).

use iwarp::{Access, Context, Error, MemError};

#[test]
fn reg_mr_is_zeroed_page_aligned_and_keys_match() {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let mr = pd.reg_mr(10_000, Access::ALL).unwrap();
    assert_eq!(mr.len(), 10_000);
    assert_eq!(mr.addr() % 4096, 0, "page aligned");
    assert_eq!(mr.lkey(), mr.rkey(), "lkey == rkey as in siw");
    assert_ne!(mr.lkey() >> 8, 0, "STag index 0 is never used");
    assert!(mr.to_vec().iter().all(|&b| b == 0));
    mr.write_at(100, b"hello");
    let mut buf = [0u8; 5];
    mr.read_at(100, &mut buf);
    assert_eq!(&buf, b"hello");
    mr.fill(0xab);
    assert!(mr.to_vec().iter().all(|&b| b == 0xab));
    let sge = mr.sge(8, 16);
    assert_eq!(
        (sge.addr, sge.length, sge.lkey),
        (mr.addr() + 8, 16, mr.lkey())
    );
}

#[test]
fn registration_errors() {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    assert!(matches!(pd.reg_mr(0, Access::ALL), Err(Error::ZeroLength)));
    let e = pd.reg_mr(64, Access::REMOTE_WRITE).unwrap_err();
    assert!(matches!(e, Error::InvalidAccess { .. }));
    assert!(e.to_string().contains("LOCAL_WRITE"), "{e}");
    // SAFETY: a null pointer is refused before anything is touched.
    let e = unsafe { pd.reg_mr_raw(std::ptr::null_mut(), 16, Access::ALL) }.unwrap_err();
    assert!(matches!(e, Error::BadAddress));
    assert!(matches!(ctx.create_cq(0), Err(Error::ZeroDepth)));
}

#[test]
#[should_panic(expected = "outside memory region")]
fn sge_out_of_range_panics() {
    let ctx = Context::open().unwrap();
    let mr = ctx.alloc_pd().reg_mr(64, Access::ALL).unwrap();
    let _ = mr.sge(60, 8);
}

#[test]
fn check_accepts_valid_access() {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let mr = pd.reg_mr(4096, Access::ALL).unwrap();
    let m = ctx.memory_access();
    m.check(mr.rkey(), mr.addr(), 4096, pd.id(), Access::REMOTE_WRITE)
        .unwrap();
    m.check(mr.rkey(), mr.addr() + 4095, 1, pd.id(), Access::REMOTE_READ)
        .unwrap();
    m.check(mr.rkey(), mr.addr() + 4096, 0, pd.id(), Access::REMOTE_READ)
        .unwrap();
}

#[test]
fn invalid_stag_unregistered_and_after_dereg() {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let m = ctx.memory_access();
    assert_eq!(
        m.check(0, 0, 0, pd.id(), Access::NONE),
        Err(MemError::InvalidStag)
    );
    assert_eq!(
        m.check(0x1234_5600, 0, 1, pd.id(), Access::NONE),
        Err(MemError::InvalidStag)
    );
    let mr = pd.reg_mr(64, Access::ALL).unwrap();
    let (stag, addr) = (mr.rkey(), mr.addr());
    drop(mr);
    assert_eq!(
        m.check(stag, addr, 8, pd.id(), Access::REMOTE_READ),
        Err(MemError::InvalidStag)
    );
    assert_eq!(m.write(stag, addr, b"x"), Err(MemError::InvalidStag));
}

#[test]
fn stale_stag_after_many_re_registrations() {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let m = ctx.memory_access();
    let old = pd.reg_mr(64, Access::ALL).unwrap();
    let (stag, addr) = (old.rkey(), old.addr());
    drop(old);
    // Re-register one region again and again (more than the 256 keys of a
    // slot): the stale STag must never name a live region.
    let mut live = None;
    for _ in 0..1000 {
        drop(live.take());
        let mr = pd.reg_mr(64, Access::ALL).unwrap();
        assert_ne!(mr.rkey(), stag, "a stale STag became valid again");
        let err = m
            .check(stag, mr.addr(), 8, pd.id(), Access::REMOTE_READ)
            .unwrap_err();
        assert!(
            matches!(err, MemError::InvalidStag | MemError::KeyMismatch),
            "{err:?}"
        );
        live = Some(mr);
    }
    assert!(m.write(stag, addr, b"x").is_err());
    let mr = live.unwrap();
    m.check(mr.rkey(), mr.addr(), 8, pd.id(), Access::REMOTE_READ)
        .unwrap();
}

#[test]
fn guessed_key_mismatch() {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let mr = pd.reg_mr(64, Access::ALL).unwrap();
    let m = ctx.memory_access();
    for delta in 1..=255u32 {
        let guess = (mr.rkey() & !0xff) | ((mr.rkey() + delta) & 0xff);
        assert_eq!(
            m.check(guess, mr.addr(), 8, pd.id(), Access::REMOTE_READ),
            Err(MemError::KeyMismatch)
        );
    }
}

#[test]
fn pd_mismatch() {
    let ctx = Context::open().unwrap();
    let (pd1, pd2) = (ctx.alloc_pd(), ctx.alloc_pd());
    assert_ne!(pd1.id(), pd2.id());
    let mr = pd1.reg_mr(64, Access::ALL).unwrap();
    let m = ctx.memory_access();
    assert_eq!(
        m.check(mr.rkey(), mr.addr(), 8, pd2.id(), Access::REMOTE_WRITE),
        Err(MemError::PdMismatch)
    );
    assert_eq!(m.invalidate(mr.rkey(), pd2.id()), Err(MemError::PdMismatch));
    assert!(mr.is_valid());
}

#[test]
fn access_rights() {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let m = ctx.memory_access();
    let ro = pd.reg_mr(64, Access::REMOTE_READ).unwrap();
    assert_eq!(
        m.check(ro.rkey(), ro.addr(), 8, pd.id(), Access::REMOTE_WRITE),
        Err(MemError::AccessRights)
    );
    assert_eq!(
        m.check(ro.rkey(), ro.addr(), 8, pd.id(), Access::LOCAL_WRITE),
        Err(MemError::AccessRights)
    );
    m.check(ro.rkey(), ro.addr(), 8, pd.id(), Access::REMOTE_READ)
        .unwrap();
    m.check(ro.rkey(), ro.addr(), 8, pd.id(), Access::NONE)
        .unwrap();
    let wo = pd
        .reg_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    assert_eq!(
        m.check(wo.rkey(), wo.addr(), 8, pd.id(), Access::REMOTE_READ),
        Err(MemError::AccessRights)
    );
}

#[test]
fn bounds_including_overflow() {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let mr = pd.reg_mr(4096, Access::ALL).unwrap();
    let m = ctx.memory_access();
    let (k, a, p) = (mr.rkey(), mr.addr(), pd.id());
    let need = Access::REMOTE_READ;
    assert_eq!(
        m.check(k, a + 4096, 1, p, need),
        Err(MemError::Bounds),
        "one past the end"
    );
    assert_eq!(
        m.check(k, a + 4090, 7, p, need),
        Err(MemError::Bounds),
        "straddles the end"
    );
    assert_eq!(
        m.check(k, a - 1, 2, p, need),
        Err(MemError::Bounds),
        "before the start"
    );
    assert_eq!(
        m.check(k, u64::MAX, 1, p, need),
        Err(MemError::Bounds),
        "at u64::MAX"
    );
    assert_eq!(
        m.check(k, u64::MAX - 2, u32::MAX, p, need),
        Err(MemError::Bounds),
        "wraps around"
    );
    assert_eq!(m.check(k, a, u32::MAX, p, need), Err(MemError::Bounds));
    assert_eq!(m.write(k, u64::MAX, b"ab"), Err(MemError::Bounds));
    assert_eq!(m.write(k, a + 4095, b"ab"), Err(MemError::Bounds));
    let mut seen = 0;
    assert_eq!(
        m.visit(k, a + 4000, 200, &mut |b| seen += b.len()),
        Err(MemError::Bounds)
    );
    assert_eq!(seen, 0);
}

#[test]
fn write_visit_and_invalidate() {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let mr = pd.reg_mr(256, Access::ALL).unwrap();
    let m = ctx.memory_access();
    m.write(mr.rkey(), mr.addr() + 10, b"payload").unwrap();
    let mut got = Vec::new();
    m.visit(mr.rkey(), mr.addr() + 10, 7, &mut |b| {
        got.extend_from_slice(b)
    })
    .unwrap();
    assert_eq!(got, b"payload");
    let mut buf = [0u8; 7];
    mr.read_at(10, &mut buf);
    assert_eq!(&buf, b"payload");

    m.invalidate(mr.rkey(), pd.id()).unwrap();
    assert!(!mr.is_valid());
    assert_eq!(
        m.check(mr.rkey(), mr.addr(), 8, pd.id(), Access::REMOTE_READ),
        Err(MemError::InvalidStag)
    );
    assert_eq!(
        m.write(mr.rkey(), mr.addr(), b"x"),
        Err(MemError::InvalidStag)
    );
    assert_eq!(m.invalidate(mr.rkey(), pd.id()), Err(MemError::InvalidStag));
}

/// A peer's Send with Invalidate may only name a remote STag: a local-only
/// region (never advertised, its key guessable) stays valid, refused with
/// `AccessRights` (which the engine turns into the "cannot invalidate"
/// Terminate).
#[test]
fn remote_invalidate_of_a_local_only_region_is_refused() {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let m = ctx.memory_access();
    let local = pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    assert_eq!(
        m.invalidate(local.lkey(), pd.id()),
        Err(MemError::AccessRights)
    );
    assert!(local.is_valid());
    for rights in [
        Access::REMOTE_READ,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    ] {
        let r = pd.reg_mr(64, rights).unwrap();
        m.invalidate(r.rkey(), pd.id()).unwrap();
        assert!(!r.is_valid(), "{rights:?}");
    }
}

#[test]
fn reg_mr_raw_uses_caller_memory() {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let mut backing = vec![7u8; 128];
    // SAFETY: `backing` outlives `mr` (dropped first at the end of scope
    // order below) and is not accessed while registered except via `mr`.
    let mr = unsafe { pd.reg_mr_raw(backing.as_mut_ptr(), backing.len(), Access::ALL) }.unwrap();
    assert_eq!(mr.addr(), backing.as_ptr() as u64);
    ctx.memory_access()
        .write(mr.rkey(), mr.addr() + 1, b"xy")
        .unwrap();
    assert_eq!(&mr.to_vec()[..4], &[7, b'x', b'y', 7]);
    drop(mr);
    assert_eq!(&backing[..4], &[7, b'x', b'y', 7]);
}

#[test]
fn many_regions_distinct_stags() {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let mrs: Vec<_> = (0..300)
        .map(|_| pd.reg_mr(16, Access::ALL).unwrap())
        .collect();
    let mut stags: Vec<u32> = mrs.iter().map(|m| m.rkey()).collect();
    stags.sort_unstable();
    stags.dedup();
    assert_eq!(stags.len(), 300);
}

#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Context>();
    check::<iwarp::ProtectionDomain>();
    check::<iwarp::MemoryRegion>();
    check::<iwarp::CompletionQueue>();
    check::<iwarp::QueuePair>();
    check::<iwarp::cm::Listener>();
    check::<iwarp::cm::ConnRequest>();
}

#[test]
fn write_to_fd_writes_the_region_bytes() {
    use std::io::{Read, Seek};
    use std::os::fd::AsFd;
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let mr = pd.reg_mr(300_000, Access::ALL).unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 256) as u8).collect();
    mr.write_at(0, &data);
    let path = std::env::temp_dir().join(format!("iwarp-mr-fd-{}", std::process::id()));
    let mut f = std::fs::File::options()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let _ = std::fs::remove_file(&path);
    let (mut off, end) = (1000usize, 250_000usize);
    while off < end {
        let n = mr.write_to_fd(off, end - off, f.as_fd()).unwrap();
        assert!(n > 0);
        off += n;
    }
    f.rewind().unwrap();
    let mut got = Vec::new();
    f.read_to_end(&mut got).unwrap();
    assert_eq!(got, data[1000..250_000]);
    // A descriptor that cannot be written reports the error.
    let ro = std::fs::File::open("/dev/null").unwrap();
    let e = mr.write_to_fd(0, 10, ro.as_fd()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(9), "EBADF: {e}");
}

#[test]
#[should_panic(expected = "outside memory region")]
fn write_to_fd_out_of_range_panics() {
    use std::os::fd::AsFd;
    let ctx = Context::open().unwrap();
    let mr = ctx.alloc_pd().reg_mr(4096, Access::ALL).unwrap();
    let null = std::fs::File::options()
        .write(true)
        .open("/dev/null")
        .unwrap();
    let _ = mr.write_to_fd(4000, 200, null.as_fd());
}

#[test]
fn no_stale_stag_is_valid_again_in_200k_re_registrations_of_a_pool() {
    // An application that keeps a pool of 64 live regions and re-registers
    // them round robin, 200,000 times: every STag the loop ever freed must
    // be refused by the check remote Reads and Writes go through, both
    // while the loop runs (no new STag equals a stale one, so none of the
    // stale STags names a live region) and at the end (each stale STag
    // checked against the table). With keys stepping by one and a freed
    // index reused at once (siw's scheme) the first repeat comes after 256
    // re-registrations of a slot; with random keys alone after about 16.
    const POOL: usize = 64;
    const CYCLES: usize = 200_000;
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let m = ctx.memory_access();
    let mut pool: Vec<_> = (0..POOL)
        .map(|_| pd.reg_mr(64, Access::ALL).unwrap())
        .collect();
    let mut seen: std::collections::HashSet<u32> = pool.iter().map(|r| r.rkey()).collect();
    let mut stale = Vec::with_capacity(CYCLES);
    for i in 0..CYCLES {
        let slot = i % POOL;
        let old = std::mem::replace(&mut pool[slot], pd.reg_mr(64, Access::ALL).unwrap());
        stale.push((old.rkey(), old.addr()));
        drop(old);
        let new = &pool[slot];
        assert!(
            seen.insert(new.rkey()),
            "cycle {i}: STag {:#x} was handed out before, so a stale copy of it is valid again",
            new.rkey()
        );
    }
    for &(stag, addr) in &stale {
        let err = m
            .check(stag, addr, 8, pd.id(), Access::REMOTE_WRITE)
            .unwrap_err();
        assert!(
            matches!(err, MemError::InvalidStag | MemError::KeyMismatch),
            "stale STag {stag:#x}: {err:?}"
        );
        assert!(m.write(stag, addr, b"x").is_err());
    }
    for r in &pool {
        m.check(r.rkey(), r.addr(), 8, pd.id(), Access::REMOTE_WRITE)
            .unwrap();
    }
}
