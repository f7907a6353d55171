//! The link finder's work on a hostile page, bounded by counting heap
//! allocations (not by timing): `rhttp get -r` runs every link of a page
//! it does not trust through `normalize_percent` (RFC 3986 §6.2.2) and
//! `decode_refs`. A link of thousands of bytes that all need encoding
//! once cost one allocation per byte (a `format!` per `%XX`), and every
//! link five copies for the character references, `&` or not; the fuzz
//! target `rhttp_links` spent most of its time there. The counts below
//! are per call, not per byte.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use rhttp::links::{extract, normalize_percent};

/// The system allocator, counting the allocations the current thread
/// makes while `COUNTING` is set (other test threads are not counted).
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is passed to `System` unchanged; the counters are
// const-initialized thread-locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: the caller's contract is `System::alloc`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is `System::dealloc`'s.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump();
        // SAFETY: the caller's contract is `System::realloc`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn bump() {
    // try_with: the thread-locals may be gone while a thread exits.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        }
    });
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Allocations (and reallocations) `f` makes on this thread.
fn allocations<T>(f: impl FnOnce() -> T) -> (usize, T) {
    COUNT.with(|c| c.set(0));
    COUNTING.with(|on| on.set(true));
    let out = f();
    COUNTING.with(|on| on.set(false));
    (COUNT.with(Cell::get), out)
}

#[test]
fn encoding_a_long_link_allocates_per_call_not_per_byte() {
    // 5120 bytes that must all be encoded (space, '"', non-ASCII, a bare
    // '%'), and 3072 encoded ones that stay encoded ("%2F" is '/').
    let raw: String = " \"\u{e9}%".repeat(1024);
    let (n, out) = allocations(|| normalize_percent(&raw, false));
    assert_eq!(out.len(), 3 * raw.len(), "every byte as %XX");
    assert!(out.starts_with("%20%22%C3%A9%25"), "{}", &out[..15]);
    assert!(n <= 4, "{n} allocations to encode {} bytes", raw.len());
    let enc = "%2f".repeat(1024);
    let (n, out) = allocations(|| normalize_percent(&enc, true));
    assert_eq!(out, "%2F".repeat(1024));
    assert!(n <= 4, "{n} allocations for {} encoded bytes", enc.len());
}

#[test]
fn links_without_references_are_not_copied_per_reference() {
    // 256 links, none with a '&': about three allocations each (the
    // trimmed value, the collected copy, the vector's growth), where the
    // five reference replacements made seven or more.
    let page = "<a href=\"/a/b/c.html\">x</a>".repeat(256);
    let (n, links) = allocations(|| extract(page.as_bytes()));
    assert_eq!(links.len(), 256);
    assert!(links.iter().all(|l| l == "/a/b/c.html"));
    assert!(n <= 3 * 256, "{n} allocations for 256 links");
    // References still decode.
    let links = extract(b"<a href=\"/q?a=1&amp;b=&quot;2&quot;\">");
    assert_eq!(links, ["/q?a=1&b=\"2\""]);
}
