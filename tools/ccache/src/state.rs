//! The proxy's cache and its cache state (adaptive push-pull).
//!
//! [`CacheState`] holds the cached documents (version, body) and, per
//! document, its last access time, access count and size; it publishes
//! the most-recently-accessed list into a state region (format:
//! [`ccache_proto::state`]) that the application module reads by RDMA Read
//! (the region is a registered memory region with `REMOTE_READ`) or over
//! the push channel. It also counts what Figure 12 needs:
//!
//! - **misses**: requests for a document the table knows that found it
//!   absent, or cached at another version than the current one, and had
//!   to fetch it;
//! - **wasted updates**: pushed copies that were replaced (by a newer push
//!   or a fetch) or evicted before any request was served from them.
//!
//! The cache never serves a copy whose version differs from the version
//! the request's check returned, and a copy is only ever replaced by a
//! **newer** one, whether it came from a fetch or a push; so a push that
//! races with an update can neither make the proxy serve an older version
//! nor hide a newer copy.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ccache_proto::push::PushStatus;
use ccache_proto::state::{self, Entry, Snapshot};
use iwarp::MemoryRegion;

/// Microseconds since the epoch, from a monotonic clock: the wall clock
/// read once, plus the time elapsed since (a wall clock stepped back by
/// NTP would reorder the recently-accessed list and the LRU choice).
fn now_us() -> u64 {
    static START: OnceLock<(Instant, u64)> = OnceLock::new();
    let (t0, wall0) = START.get_or_init(|| {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        (Instant::now(), wall)
    });
    wall0 + t0.elapsed().as_micros() as u64
}

#[derive(Debug)]
struct Doc {
    version: u64,
    content_type: Option<String>,
    body: Arc<Vec<u8>>,
    freq: u32,
    last_access_us: u64,
    /// Stored by a push and not served since.
    pushed_unread: bool,
}

#[derive(Debug, Default)]
struct Inner {
    docs: HashMap<u32, Doc>,
    /// Sum of the cached bodies' lengths.
    bytes: usize,
    generation: u64,
    dirty: bool,
    /// The last published region (what `STATE_REQUEST` is answered with).
    published: Vec<u8>,
}

/// Counters, all since start.
#[derive(Debug, Default)]
pub struct Stats {
    /// Document requests checked and looked up.
    pub requests: AtomicU64,
    /// Served from cache at the current version.
    pub hits: AtomicU64,
    /// ... of which from a pushed copy (the first hit on it).
    pub pushed_hits: AtomicU64,
    /// Not cached: fetched.
    pub misses_absent: AtomicU64,
    /// Cached at another version: fetched.
    pub misses_stale: AtomicU64,
    /// Pushes received (well-formed).
    pub pushes: AtomicU64,
    /// ... stored.
    pub pushes_stored: AtomicU64,
    /// ... ignored: this version or a newer one was cached.
    pub pushes_not_newer: AtomicU64,
    /// ... ignored: the document was not cached.
    pub pushes_not_cached: AtomicU64,
    /// Pushed copies replaced or evicted before any hit on them.
    pub wasted: AtomicU64,
    /// Documents evicted (cache full).
    pub evictions: AtomicU64,
    /// Snapshots published.
    pub publishes: AtomicU64,
    /// Backend fetches of documents started (one per single flight).
    pub fetches: AtomicU64,
    /// Misses that joined a fetch already in flight instead of starting
    /// their own.
    pub fetches_joined: AtomicU64,
}

/// The cache, its state region and its counters.
#[derive(Debug)]
pub struct CacheState {
    inner: Mutex<Inner>,
    /// Most documents cached (0: no limit).
    max_docs: usize,
    /// Most body bytes cached (0: no limit).
    max_bytes: usize,
    /// Entries in the state region.
    list_len: u32,
    region: Mutex<Option<MemoryRegion>>,
    /// Counters.
    pub stats: Stats,
}

/// A hit: the body and its content type.
pub type Hit = (Arc<Vec<u8>>, Option<String>);

impl CacheState {
    /// A cache of at most `max_docs` documents (0: no limit) whose state
    /// region lists up to `list_len` documents.
    pub fn new(max_docs: usize, list_len: u32) -> CacheState {
        CacheState::with_limits(max_docs, 0, list_len)
    }

    /// A cache of at most `max_docs` documents and `max_bytes` bytes of
    /// bodies (0: no limit), least recently accessed evicted first; a body
    /// larger than `max_bytes` is never stored.
    pub fn with_limits(max_docs: usize, max_bytes: usize, list_len: u32) -> CacheState {
        let list_len = list_len.clamp(1, state::MAX_CAPACITY);
        let s = CacheState {
            inner: Mutex::new(Inner::default()),
            max_docs,
            max_bytes,
            list_len,
            region: Mutex::new(None),
            stats: Stats::default(),
        };
        s.publish();
        s
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes of the state region.
    pub fn region_len(&self) -> usize {
        state::region_len(self.list_len)
    }

    /// Publish into `mr` from now on (a registered region of at least
    /// [`CacheState::region_len`] bytes with `REMOTE_READ`).
    pub fn attach_region(&self, mr: MemoryRegion) {
        assert!(mr.len() >= self.region_len(), "state region too small");
        let bytes = self.lock().published.clone();
        mr.write_at(0, &bytes);
        *self.region.lock().unwrap_or_else(|p| p.into_inner()) = Some(mr);
    }

    /// A request for `doc` whose current version is `current`: the cached
    /// copy if it is at exactly that version. Records the access and
    /// counts the hit or miss.
    pub fn lookup(&self, doc: u32, current: u64) -> Option<Hit> {
        let st = &self.stats;
        st.requests.fetch_add(1, Ordering::Relaxed);
        let mut g = self.lock();
        g.dirty = true;
        let Some(d) = g.docs.get_mut(&doc) else {
            st.misses_absent.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        d.freq = d.freq.saturating_add(1);
        d.last_access_us = now_us();
        if d.version != current {
            st.misses_stale.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        st.hits.fetch_add(1, Ordering::Relaxed);
        if std::mem::take(&mut d.pushed_unread) {
            st.pushed_hits.fetch_add(1, Ordering::Relaxed);
        }
        Some((d.body.clone(), d.content_type.clone()))
    }

    /// Whether a body of `len` bytes may be cached at all.
    fn fits(&self, len: usize) -> bool {
        self.max_bytes == 0 || len <= self.max_bytes
    }

    /// Evict least recently accessed documents (never `keep`) until one
    /// more document of `incoming` bytes fits both bounds.
    fn evict_for(&self, g: &mut Inner, incoming: usize, keep: Option<u32>) {
        loop {
            let count = g.docs.len() - usize::from(keep.is_some_and(|k| g.docs.contains_key(&k)));
            let over_docs = self.max_docs != 0 && count >= self.max_docs;
            let over_bytes = self.max_bytes != 0 && g.bytes + incoming > self.max_bytes;
            if !over_docs && !over_bytes {
                return;
            }
            let lru = g
                .docs
                .iter()
                .filter(|(&n, _)| Some(n) != keep)
                .min_by_key(|(_, d)| d.last_access_us)
                .map(|(&n, _)| n);
            let Some(d) = lru.and_then(|n| g.docs.remove(&n)) else {
                return;
            };
            g.bytes -= d.body.len();
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
            if d.pushed_unread {
                self.stats.wasted.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Bytes of bodies cached now.
    pub fn cached_bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Keep a fetched copy read under `version`, unless this version or a
    /// newer one is cached. Returns whether it was stored.
    pub fn store_fetched(
        &self,
        doc: u32,
        version: u64,
        content_type: Option<String>,
        body: Arc<Vec<u8>>,
    ) -> bool {
        let mut g = self.lock();
        g.dirty = true;
        if !self.fits(body.len()) {
            return false;
        }
        if let Some(d) = g.docs.get(&doc) {
            if d.version >= version {
                return false;
            }
            let old = d.body.len();
            g.bytes -= old;
            self.evict_for(&mut g, body.len(), Some(doc));
            g.bytes += body.len();
            let d = g.docs.get_mut(&doc).expect("kept by evict_for");
            if d.pushed_unread {
                self.stats.wasted.fetch_add(1, Ordering::Relaxed);
            }
            d.version = version;
            d.content_type = content_type;
            d.body = body;
            d.pushed_unread = false;
            return true;
        }
        self.evict_for(&mut g, body.len(), None);
        g.bytes += body.len();
        g.docs.insert(
            doc,
            Doc {
                version,
                content_type,
                body,
                freq: 1,
                last_access_us: now_us(),
                pushed_unread: false,
            },
        );
        true
    }

    /// A pushed copy of `doc` at `version`: stored only if the document is
    /// cached at an older version. A push is not an access.
    pub fn store_pushed(&self, doc: u32, version: u64, body: Vec<u8>) -> PushStatus {
        let st = &self.stats;
        st.pushes.fetch_add(1, Ordering::Relaxed);
        let mut g = self.lock();
        let Some(d) = g.docs.get(&doc) else {
            st.pushes_not_cached.fetch_add(1, Ordering::Relaxed);
            return PushStatus::NotCached;
        };
        if d.version >= version {
            st.pushes_not_newer.fetch_add(1, Ordering::Relaxed);
            return PushStatus::NotNewer;
        }
        if !self.fits(body.len()) {
            // Larger than the whole cache may be: not kept (the next
            // request fetches it, and does not keep it either).
            st.pushes_not_cached.fetch_add(1, Ordering::Relaxed);
            return PushStatus::NotCached;
        }
        let old = d.body.len();
        g.bytes -= old;
        self.evict_for(&mut g, body.len(), Some(doc));
        g.bytes += body.len();
        let d = g.docs.get_mut(&doc).expect("kept by evict_for");
        if d.pushed_unread {
            st.wasted.fetch_add(1, Ordering::Relaxed);
        }
        d.version = version;
        d.body = Arc::new(body);
        d.pushed_unread = true;
        g.dirty = true;
        st.pushes_stored.fetch_add(1, Ordering::Relaxed);
        PushStatus::Stored
    }

    /// The cached version of `doc`, if any.
    pub fn cached_version(&self, doc: u32) -> Option<u64> {
        self.lock().docs.get(&doc).map(|d| d.version)
    }

    /// Write a new snapshot if anything changed since the last one: into
    /// the registered region (entries, trailer, header, in that order; see
    /// [`ccache_proto::state`]) and into the copy served over TCP.
    pub fn publish(&self) {
        let mut g = self.lock();
        if !g.dirty && !g.published.is_empty() {
            return;
        }
        g.generation += 1;
        let mut entries: Vec<Entry> = g
            .docs
            .iter()
            .map(|(&doc, d)| Entry {
                doc,
                freq: d.freq,
                last_access_us: d.last_access_us,
                version: d.version,
                weight: u32::try_from(d.body.len()).unwrap_or(u32::MAX),
            })
            .collect();
        entries.sort_unstable_by(|a, b| {
            b.last_access_us
                .cmp(&a.last_access_us)
                .then(a.doc.cmp(&b.doc))
        });
        entries.truncate(self.list_len as usize);
        let snap = Snapshot {
            generation: g.generation,
            published_us: now_us(),
            capacity: self.list_len,
            entries,
        };
        // Stores into the region happen under the state lock, so two
        // publishes never interleave.
        if let Some(mr) = self
            .region
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            for (at, bytes) in snap.writes() {
                mr.write_at(at, &bytes);
            }
        }
        g.published = snap.to_bytes();
        g.dirty = false;
        self.stats.publishes.fetch_add(1, Ordering::Relaxed);
    }

    /// The last published region's bytes.
    pub fn region_bytes(&self) -> Vec<u8> {
        self.lock().published.clone()
    }

    /// Publish every `interval` on a thread of its own, for the life of the
    /// process.
    pub fn spawn_publisher(self: &Arc<Self>, interval: Duration) {
        let s = self.clone();
        std::thread::Builder::new()
            .name("ccproxy-state".into())
            .spawn(move || loop {
                std::thread::sleep(interval);
                s.publish();
            })
            .expect("spawning the state publisher");
    }

    /// The counters as a JSON object (one line).
    pub fn stats_json(&self) -> String {
        let s = &self.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (cached, pushed_pending, bytes) = {
            let g = self.lock();
            (
                g.docs.len(),
                g.docs.values().filter(|d| d.pushed_unread).count(),
                g.bytes,
            )
        };
        format!(
            concat!(
                "{{\"requests\":{},\"hits\":{},\"pushed_hits\":{},\"misses\":{},",
                "\"misses_absent\":{},\"misses_stale\":{},\"pushes\":{},\"pushes_stored\":{},",
                "\"pushes_not_newer\":{},\"pushes_not_cached\":{},\"wasted_updates\":{},",
                "\"pushed_pending\":{},\"evictions\":{},\"cached_docs\":{},\"cached_bytes\":{},",
                "\"fetches\":{},\"fetches_joined\":{},\"publishes\":{}}}"
            ),
            l(&s.requests),
            l(&s.hits),
            l(&s.pushed_hits),
            l(&s.misses_absent) + l(&s.misses_stale),
            l(&s.misses_absent),
            l(&s.misses_stale),
            l(&s.pushes),
            l(&s.pushes_stored),
            l(&s.pushes_not_newer),
            l(&s.pushes_not_cached),
            l(&s.wasted),
            pushed_pending,
            l(&s.evictions),
            cached,
            bytes,
            l(&s.fetches),
            l(&s.fetches_joined),
            l(&s.publishes),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(s: &str) -> Arc<Vec<u8>> {
        Arc::new(s.as_bytes().to_vec())
    }
    fn get(s: &CacheState, k: fn(&Stats) -> &AtomicU64) -> u64 {
        k(&s.stats).load(Ordering::Relaxed)
    }

    #[test]
    fn hits_misses_and_versions() {
        let c = CacheState::new(0, 8);
        assert!(c.lookup(1, 5).is_none());
        assert!(c.store_fetched(1, 5, None, body("v5")));
        assert_eq!(c.lookup(1, 5).unwrap().0.as_slice(), b"v5");
        assert!(
            c.lookup(1, 6).is_none(),
            "a copy at another version is a miss"
        );
        // An older fetch does not replace a newer copy.
        assert!(!c.store_fetched(1, 4, None, body("v4")));
        assert_eq!(c.cached_version(1), Some(5));
        assert_eq!(get(&c, |s| &s.misses_absent), 1);
        assert_eq!(get(&c, |s| &s.misses_stale), 1);
        assert_eq!(get(&c, |s| &s.hits), 1);
    }

    #[test]
    fn push_is_stored_only_if_newer_and_cached() {
        let c = CacheState::new(0, 8);
        assert_eq!(c.store_pushed(1, 5, b"x".to_vec()), PushStatus::NotCached);
        c.store_fetched(1, 5, Some("text/plain".into()), body("v5"));
        assert_eq!(c.store_pushed(1, 5, b"y".to_vec()), PushStatus::NotNewer);
        assert_eq!(c.store_pushed(1, 4, b"y".to_vec()), PushStatus::NotNewer);
        assert_eq!(c.lookup(1, 5).unwrap().0.as_slice(), b"v5");
        assert_eq!(c.store_pushed(1, 6, b"v6".to_vec()), PushStatus::Stored);
        // The pushed copy keeps the content type of the fetched one.
        let (b, ct) = c.lookup(1, 6).unwrap();
        assert_eq!(
            (b.as_slice(), ct.as_deref()),
            (&b"v6"[..], Some("text/plain"))
        );
        assert_eq!(get(&c, |s| &s.pushed_hits), 1);
        assert_eq!(get(&c, |s| &s.wasted), 0);
    }

    #[test]
    fn race_push_of_older_version_after_newer_fetch() {
        // An update to v7 commits; the proxy's request sees v7 and fetches
        // it; then the push of v6 (from the update before) arrives late.
        // The proxy must keep v7 and serve v7.
        let c = CacheState::new(0, 8);
        c.store_fetched(1, 5, None, body("v5"));
        assert!(c.lookup(1, 7).is_none());
        assert!(c.store_fetched(1, 7, None, body("v7")));
        assert_eq!(c.store_pushed(1, 6, b"v6".to_vec()), PushStatus::NotNewer);
        assert_eq!(c.lookup(1, 7).unwrap().0.as_slice(), b"v7");
        // And the other order: the push of v8 lands, then a slow fetch
        // that read v7 returns: v8 stays.
        assert_eq!(c.store_pushed(1, 8, b"v8".to_vec()), PushStatus::Stored);
        assert!(!c.store_fetched(1, 7, None, body("v7")));
        assert_eq!(c.lookup(1, 8).unwrap().0.as_slice(), b"v8");
        // A request that checked v7 (before the v8 commit) misses rather
        // than being served v8's body under v7's name, or v8 under v7.
        assert!(c.lookup(1, 7).is_none());
    }

    #[test]
    fn concurrent_pushes_and_fetches_never_go_back() {
        // Threads store random versions by push and by fetch; the cached
        // version only grows, and each body always matches its version.
        let c = Arc::new(CacheState::new(0, 8));
        c.store_fetched(0, 0, None, body("0"));
        let hs: Vec<_> = (0..4u64)
            .map(|t| {
                let c = c.clone();
                std::thread::spawn(move || {
                    let mut x = t + 1;
                    let mut last = 0;
                    for _ in 0..5000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let v = x % 1000;
                        if t % 2 == 0 {
                            c.store_pushed(0, v, v.to_string().into_bytes());
                        } else {
                            c.store_fetched(0, v, None, Arc::new(v.to_string().into_bytes()));
                        }
                        let now = c.cached_version(0).unwrap();
                        assert!(now >= last, "version went back from {last} to {now}");
                        last = now;
                        if let Some((b, _)) = c.lookup(0, now) {
                            let got: u64 = std::str::from_utf8(&b).unwrap().parse().unwrap();
                            assert_eq!(got, now, "body of {got} under version {now}");
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let v = c.cached_version(0).unwrap();
        assert_eq!(
            c.lookup(0, v).unwrap().0.as_slice(),
            v.to_string().as_bytes()
        );
    }

    #[test]
    fn wasted_updates_and_eviction() {
        let c = CacheState::new(2, 8);
        c.store_fetched(1, 1, None, body("a"));
        std::thread::sleep(Duration::from_millis(2));
        c.store_fetched(2, 1, None, body("b"));
        // Push replaced by a push before any hit: one wasted.
        c.store_pushed(1, 2, b"a2".to_vec());
        c.store_pushed(1, 3, b"a3".to_vec());
        assert_eq!(get(&c, |s| &s.wasted), 1);
        // Push replaced by a fetch: wasted.
        c.store_fetched(1, 4, None, body("a4"));
        assert_eq!(get(&c, |s| &s.wasted), 2);
        // Push then hit: not wasted. (The sleep makes this access of doc 1
        // later than doc 2's store by more than the microsecond clock's
        // step: with equal stamps the LRU choice below was a coin toss,
        // which failed one CI run.)
        c.store_pushed(1, 5, b"a5".to_vec());
        std::thread::sleep(Duration::from_millis(2));
        assert!(c.lookup(1, 5).is_some());
        c.store_fetched(1, 6, None, body("a6"));
        assert_eq!(get(&c, |s| &s.wasted), 2);
        // Doc 2 (pushed, unread) is the least recently accessed: a third
        // document evicts it, and the push is wasted.
        c.store_pushed(2, 2, b"b2".to_vec());
        c.store_fetched(3, 1, None, body("c"));
        assert_eq!(c.cached_version(2), None);
        assert_eq!(get(&c, |s| &s.evictions), 1);
        assert_eq!(get(&c, |s| &s.wasted), 3);
        let j = c.stats_json();
        assert!(j.contains("\"wasted_updates\":3"), "{j}");
        assert!(j.contains("\"evictions\":1"), "{j}");
    }

    #[test]
    fn published_list_is_most_recent_first() {
        let c = CacheState::new(0, 2);
        for d in [5u32, 6, 7] {
            c.store_fetched(d, 1, None, body("x"));
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(c.lookup(5, 1).is_some());
        c.publish();
        let s = Snapshot::parse(&c.region_bytes()).unwrap();
        let docs: Vec<u32> = s.entries.iter().map(|e| e.doc).collect();
        assert_eq!(docs, vec![5, 7], "list cut at its capacity, MRU first");
        assert_eq!(s.entries[0].freq, 2);
        assert_eq!(s.entries[0].weight, 1);
        let g = s.generation;
        c.publish();
        assert_eq!(
            Snapshot::parse(&c.region_bytes()).unwrap().generation,
            g,
            "nothing changed: no new generation"
        );
    }
}
