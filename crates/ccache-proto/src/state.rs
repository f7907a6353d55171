//! The proxy's cache state region: what a proxy has cached and how hot it
//! is, laid out in a registered memory region that the application module
//! reads (one RDMA Read of the whole region, or the same bytes over TCP) to
//! decide where to push an updated document (adaptive push-pull).
//!
//! ## Layout (format 1, all fields big endian)
//!
//! ```text
//! header, 40 bytes at offset 0
//!  0      4    5    6          8          12        16                24               32            40
//! +------+----+----+----------+----------+---------+-----------------+----------------+-------------+
//! |"CCS1"| 1  | 0  | entry_len| capacity | count   | generation u64  | published (us) | check u64   |
//! +------+----+----+----------+----------+---------+-----------------+----------------+-------------+
//! entry i (i < capacity), 40 bytes at 40 + 40*i
//!  0      4      8                  16             24       28         32
//! +------+------+------------------+--------------+--------+----------+-------------+
//! | doc  | freq | last access (us) | version u64  | weight | reserved | check u64   |
//! +------+------+------------------+--------------+--------+----------+-------------+
//! trailer, 8 bytes at 40 + 40*capacity: generation u64
//! ```
//!
//! Entries `0 .. count` are the proxy's **most-recently-accessed list**:
//! entry 0 is the document accessed last. `freq` counts accesses since the
//! document entered the cache, `last access` is in microseconds since the
//! Unix epoch, `version` is the version of the cached copy, and `weight`
//! is the copy's size in bytes (what a push of it costs).
//!
//! ## Consistency (how a reader never takes a torn entry)
//!
//! The proxy rewrites the region while the module may be reading it, and
//! an RDMA Read in this stack is a `memcpy`-like copy with no ordering or
//! atomicity promised (see `docs/CACHE.md` on version slots). So every
//! part names the snapshot it belongs to: each publish takes the next
//! **generation**, and the header's and every entry's check word is a mix
//! of its own fields, its position and that generation. The writer stores
//! the entries, then the trailer, then the header. A reader accepts a copy
//! only if the header's check is right, the trailer's generation equals the
//! header's, and every entry's check is right **for that generation**; an
//! entry left from an older snapshot, or torn by a concurrent store, fails
//! its check, and the reader reads again. This is a seqlock whose
//! "sequence" is carried by every part instead of being read twice, so it
//! does not depend on the order in which the copy reads the bytes. A torn
//! mix passes only as a 2^-64 coincidence of a check word.

use std::fmt;

/// Header length.
pub const HEADER_LEN: usize = 40;
/// Entry length.
pub const ENTRY_LEN: usize = 40;
/// Trailer length.
pub const TRAILER_LEN: usize = 8;
/// The magic.
pub const MAGIC: [u8; 4] = *b"CCS1";
/// The format this crate reads and writes.
pub const FORMAT: u8 = 1;
/// Largest capacity a reader accepts (bounds what an untrusted header can
/// make it allocate: 1 Mi entries, 40 MiB).
pub const MAX_CAPACITY: u32 = 1 << 20;

/// Bytes of a region with room for `capacity` entries.
pub fn region_len(capacity: u32) -> usize {
    HEADER_LEN + ENTRY_LEN * capacity as usize + TRAILER_LEN
}

fn fold(h: u64, x: u64) -> u64 {
    // SplitMix64's finalizer over the running hash and the next word.
    let mut z = (h ^ x.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_add(0x6A09_E667_F3BC_C909);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn header_check(capacity: u32, count: u32, generation: u64, published_us: u64) -> u64 {
    [
        u64::from(capacity) << 32 | u64::from(count),
        generation,
        published_us,
    ]
    .iter()
    .fold(0x4343_5331, |h, &x| fold(h, x))
}

fn entry_check(e: &Entry, index: u32, generation: u64) -> u64 {
    [
        u64::from(index),
        generation,
        u64::from(e.doc) << 32 | u64::from(e.freq),
        e.last_access_us,
        e.version,
        u64::from(e.weight),
    ]
    .iter()
    .fold(0x4343_5345, |h, &x| fold(h, x))
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(w)
}

/// One cached document in the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Document number.
    pub doc: u32,
    /// Accesses since it was cached.
    pub freq: u32,
    /// Last access, microseconds since the Unix epoch.
    pub last_access_us: u64,
    /// Version of the cached copy.
    pub version: u64,
    /// Size of the cached copy in bytes (saturated at `u32::MAX`).
    pub weight: u32,
}

impl Entry {
    /// The 40 bytes of this entry at position `index` of generation
    /// `generation`.
    pub fn emit(&self, index: u32, generation: u64) -> [u8; ENTRY_LEN] {
        let mut b = [0u8; ENTRY_LEN];
        b[0..4].copy_from_slice(&self.doc.to_be_bytes());
        b[4..8].copy_from_slice(&self.freq.to_be_bytes());
        b[8..16].copy_from_slice(&self.last_access_us.to_be_bytes());
        b[16..24].copy_from_slice(&self.version.to_be_bytes());
        b[24..28].copy_from_slice(&self.weight.to_be_bytes());
        b[32..40].copy_from_slice(&entry_check(self, index, generation).to_be_bytes());
        b
    }

    /// Parse entry `index` of generation `generation`.
    pub fn parse(b: &[u8], index: u32, generation: u64) -> Result<Entry, StateError> {
        if b.len() < ENTRY_LEN {
            return Err(StateError::Truncated {
                len: b.len(),
                need: ENTRY_LEN,
            });
        }
        let e = Entry {
            doc: be32(b, 0),
            freq: be32(b, 4),
            last_access_us: be64(b, 8),
            version: be64(b, 16),
            weight: be32(b, 24),
        };
        if be32(b, 28) != 0 || be64(b, 32) != entry_check(&e, index, generation) {
            return Err(StateError::TornEntry { index });
        }
        Ok(e)
    }
}

/// Why a region's bytes were not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateError {
    /// Fewer bytes than the header (or the capacity it states) needs.
    Truncated {
        /// Bytes present.
        len: usize,
        /// Bytes needed.
        need: usize,
    },
    /// Not "CCS1": not a ccproxy state region.
    BadMagic([u8; 4]),
    /// A format other than [`FORMAT`].
    BadFormat(u8),
    /// An entry length other than [`ENTRY_LEN`].
    BadEntryLen(u16),
    /// A capacity above [`MAX_CAPACITY`], or a count above the capacity.
    BadCount {
        /// Entries in the list.
        count: u32,
        /// Room in the region.
        capacity: u32,
    },
    /// The header's check word is wrong (a concurrent store; read again).
    TornHeader,
    /// Trailer and header name different generations (a publish ran during
    /// the read; read again).
    GenerationMismatch {
        /// The header's.
        header: u64,
        /// The trailer's.
        trailer: u64,
    },
    /// An entry's check does not match the header's generation (left from
    /// another snapshot, or torn; read again).
    TornEntry {
        /// Its position.
        index: u32,
    },
}

impl StateError {
    /// Would reading the region again help (a publish overlapped the read)?
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StateError::TornHeader
                | StateError::GenerationMismatch { .. }
                | StateError::TornEntry { .. }
        )
    }
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateError::Truncated { len, need } => write!(
                f,
                "cache state region of {len} bytes, need {need}: the registration gave a wrong length"
            ),
            StateError::BadMagic(m) => write!(
                f,
                "cache state region starts {m:02x?}, not \"CCS1\": not a ccproxy state region (wrong address or rkey?)"
            ),
            StateError::BadFormat(v) => write!(
                f,
                "cache state format {v}, this build reads {FORMAT}: run matching ccproxy and ccappd"
            ),
            StateError::BadEntryLen(n) => write!(
                f,
                "cache state entries of {n} bytes, this build reads {ENTRY_LEN}: run matching ccproxy and ccappd"
            ),
            StateError::BadCount { count, capacity } => write!(
                f,
                "cache state lists {count} entries in a region of {capacity} (at most {MAX_CAPACITY}): corrupt region"
            ),
            StateError::TornHeader => f.write_str("cache state header check mismatch (read overlapped a publish; read again)"),
            StateError::GenerationMismatch { header, trailer } => write!(
                f,
                "cache state header is generation {header}, trailer {trailer} (read overlapped a publish; read again)"
            ),
            StateError::TornEntry { index } => write!(
                f,
                "cache state entry {index} is not of the header's generation (read overlapped a publish; read again)"
            ),
        }
    }
}

impl std::error::Error for StateError {}

/// A zero-copy view of a region.
#[derive(Debug, Clone, Copy)]
pub struct Region<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Region<T> {
    /// Wrap untrusted bytes: checks magic, format, entry length, count and
    /// that the buffer holds the stated capacity. After this no accessor
    /// panics. (Check words are checked by [`Region::entry`] and
    /// [`Snapshot::parse`].)
    pub fn new_checked(buffer: T) -> Result<Region<T>, StateError> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(StateError::Truncated {
                len: b.len(),
                need: HEADER_LEN,
            });
        }
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != MAGIC {
            return Err(StateError::BadMagic(magic));
        }
        if b[4] != FORMAT {
            return Err(StateError::BadFormat(b[4]));
        }
        let el = u16::from_be_bytes([b[6], b[7]]);
        if el as usize != ENTRY_LEN {
            return Err(StateError::BadEntryLen(el));
        }
        let (capacity, count) = (be32(b, 8), be32(b, 12));
        if capacity > MAX_CAPACITY || count > capacity {
            return Err(StateError::BadCount { count, capacity });
        }
        let need = region_len(capacity);
        if b.len() < need {
            return Err(StateError::Truncated { len: b.len(), need });
        }
        Ok(Region { buffer })
    }

    /// Room for this many entries.
    pub fn capacity(&self) -> u32 {
        be32(self.buffer.as_ref(), 8)
    }
    /// Entries in the list.
    pub fn count(&self) -> u32 {
        be32(self.buffer.as_ref(), 12)
    }
    /// The header's generation.
    pub fn generation(&self) -> u64 {
        be64(self.buffer.as_ref(), 16)
    }
    /// When the snapshot was published, microseconds since the epoch.
    pub fn published_us(&self) -> u64 {
        be64(self.buffer.as_ref(), 24)
    }
    /// The trailer's generation.
    pub fn trailer_generation(&self) -> u64 {
        be64(
            self.buffer.as_ref(),
            HEADER_LEN + ENTRY_LEN * self.capacity() as usize,
        )
    }
    /// Is the header's check word right?
    pub fn header_ok(&self) -> bool {
        be64(self.buffer.as_ref(), 32)
            == header_check(
                self.capacity(),
                self.count(),
                self.generation(),
                self.published_us(),
            )
    }
    /// Entry `index` (< count), checked against the header's generation.
    pub fn entry(&self, index: u32) -> Result<Entry, StateError> {
        if index >= self.count() {
            return Err(StateError::BadCount {
                count: index,
                capacity: self.count(),
            });
        }
        let at = HEADER_LEN + ENTRY_LEN * index as usize;
        Entry::parse(
            &self.buffer.as_ref()[at..at + ENTRY_LEN],
            index,
            self.generation(),
        )
    }
}

/// One consistent copy of a proxy's cache state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Publish number (strictly increasing per proxy run).
    pub generation: u64,
    /// Publish time, microseconds since the epoch.
    pub published_us: u64,
    /// Room in the region.
    pub capacity: u32,
    /// The most-recently-accessed list, most recent first (at most
    /// `capacity` entries).
    pub entries: Vec<Entry>,
}

impl Snapshot {
    /// Parse untrusted region bytes, accepting only a consistent snapshot
    /// (see the module docs). A transient error means "read again".
    pub fn parse(b: &[u8]) -> Result<Snapshot, StateError> {
        let r = Region::new_checked(b)?;
        if !r.header_ok() {
            return Err(StateError::TornHeader);
        }
        let (header, trailer) = (r.generation(), r.trailer_generation());
        if header != trailer {
            return Err(StateError::GenerationMismatch { header, trailer });
        }
        let entries = (0..r.count())
            .map(|i| r.entry(i))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Snapshot {
            generation: header,
            published_us: r.published_us(),
            capacity: r.capacity(),
            entries,
        })
    }

    /// The header's bytes.
    pub fn emit_header(&self) -> [u8; HEADER_LEN] {
        let count = self.entries.len().min(self.capacity as usize) as u32;
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = FORMAT;
        b[6..8].copy_from_slice(&(ENTRY_LEN as u16).to_be_bytes());
        b[8..12].copy_from_slice(&self.capacity.to_be_bytes());
        b[12..16].copy_from_slice(&count.to_be_bytes());
        b[16..24].copy_from_slice(&self.generation.to_be_bytes());
        b[24..32].copy_from_slice(&self.published_us.to_be_bytes());
        b[32..40].copy_from_slice(
            &header_check(self.capacity, count, self.generation, self.published_us).to_be_bytes(),
        );
        b
    }

    /// The writes that publish this snapshot into a region of its
    /// capacity, as `(offset, bytes)` **in the order they must be stored**:
    /// entries, then the trailer, then the header. Entries beyond
    /// `capacity` are dropped (the list is cut).
    pub fn writes(&self) -> Vec<(usize, Vec<u8>)> {
        let n = self.entries.len().min(self.capacity as usize);
        let mut body = Vec::with_capacity(ENTRY_LEN * n);
        for (i, e) in self.entries[..n].iter().enumerate() {
            body.extend_from_slice(&e.emit(i as u32, self.generation));
        }
        vec![
            (HEADER_LEN, body),
            (
                HEADER_LEN + ENTRY_LEN * self.capacity as usize,
                self.generation.to_be_bytes().to_vec(),
            ),
            (0, self.emit_header().to_vec()),
        ]
    }

    /// The whole region's bytes (unused entries zero).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; region_len(self.capacity)];
        for (at, w) in self.writes() {
            b[at..at + w.len()].copy_from_slice(&w);
        }
        b
    }

    /// The position of `doc` in the most-recently-accessed list.
    pub fn rank(&self, doc: u32) -> Option<(usize, &Entry)> {
        self.entries.iter().enumerate().find(|(_, e)| e.doc == doc)
    }
}

/// When the application module pushes an updated document to a proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Never push: proxies fetch on a miss or a stale copy.
    Pull,
    /// Push to every proxy that has the document cached.
    Push,
    /// Push only if the document is in the top `percent` % of the proxy's
    /// most-recently-accessed list (at least the first entry if
    /// `percent > 0`).
    Hybrid {
        /// 0..=100.
        percent: u8,
    },
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Pull => f.write_str("pull"),
            Policy::Push => f.write_str("push"),
            Policy::Hybrid { percent } => write!(f, "hybrid({percent}%)"),
        }
    }
}

/// What the policy decided for one proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Push it.
    Push {
        /// Its position in the list.
        rank: usize,
    },
    /// Policy `pull`.
    PullOnly,
    /// The proxy does not have the document.
    NotCached,
    /// The proxy already has this version or a newer one.
    UpToDate,
    /// Hybrid: cached, but below the cut.
    Cold {
        /// Its position in the list.
        rank: usize,
        /// Positions `< cutoff` are pushed.
        cutoff: usize,
    },
}

impl Policy {
    /// Positions `< cutoff` of a list of `len` are hot (hybrid).
    pub fn cutoff(percent: u8, len: usize) -> usize {
        if percent == 0 {
            return 0;
        }
        (len * usize::from(percent.min(100))).div_ceil(100).max(1)
    }

    /// Decide whether the proxy whose state is `snap` gets `doc` at
    /// `version`.
    pub fn decide(&self, snap: &Snapshot, doc: u32, version: u64) -> Decision {
        if *self == Policy::Pull {
            return Decision::PullOnly;
        }
        let Some((rank, e)) = snap.rank(doc) else {
            return Decision::NotCached;
        };
        if e.version >= version {
            return Decision::UpToDate;
        }
        match *self {
            Policy::Hybrid { percent } => {
                let cutoff = Policy::cutoff(percent, snap.entries.len());
                if rank < cutoff {
                    Decision::Push { rank }
                } else {
                    Decision::Cold { rank, cutoff }
                }
            }
            _ => Decision::Push { rank },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(doc: u32, version: u64) -> Entry {
        Entry {
            doc,
            freq: 3,
            last_access_us: 0x0102_0304_0506_0708,
            version,
            weight: 4096,
        }
    }

    #[test]
    fn byte_vector() {
        let s = Snapshot {
            generation: 2,
            published_us: 0x10,
            capacity: 2,
            entries: vec![e(7, 9)],
        };
        let b = s.to_bytes();
        assert_eq!(b.len(), 40 + 80 + 8);
        assert_eq!(
            &b[..32],
            &[
                b'C', b'C', b'S', b'1', 1, 0, 0, 40, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                2, 0, 0, 0, 0, 0, 0, 0, 0x10
            ]
        );
        assert_eq!(
            &b[40..72],
            &[
                0, 0, 0, 7, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0x10,
                0, 0, 0, 0, 0
            ]
        );
        // The unused entry is zero; the trailer is the generation.
        assert!(b[80..120].iter().all(|&x| x == 0));
        assert_eq!(&b[120..], &[0, 0, 0, 0, 0, 0, 0, 2]);
        assert_eq!(Snapshot::parse(&b), Ok(s.clone()));
        let r = Region::new_checked(&b[..]).unwrap();
        assert_eq!((r.capacity(), r.count(), r.generation()), (2, 1, 2));
        assert_eq!(r.entry(0), Ok(e(7, 9)));
        assert!(r.entry(1).is_err());
    }

    #[test]
    fn malformed_regions_are_refused() {
        let s = Snapshot {
            generation: 5,
            published_us: 1,
            capacity: 3,
            entries: vec![e(1, 1), e(2, 2)],
        };
        let good = s.to_bytes();
        let t = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = good.clone();
            f(&mut b);
            Snapshot::parse(&b)
        };
        assert_eq!(
            t(&|b| b.truncate(39)),
            Err(StateError::Truncated { len: 39, need: 40 })
        );
        assert_eq!(
            t(&|b| b.truncate(good.len() - 1)),
            Err(StateError::Truncated {
                len: good.len() - 1,
                need: good.len()
            })
        );
        assert_eq!(t(&|b| b[0] = b'X'), Err(StateError::BadMagic(*b"XCS1")));
        assert_eq!(t(&|b| b[4] = 2), Err(StateError::BadFormat(2)));
        assert_eq!(t(&|b| b[7] = 16), Err(StateError::BadEntryLen(16)));
        assert_eq!(
            t(&|b| b[15] = 4),
            Err(StateError::BadCount {
                count: 4,
                capacity: 3
            })
        );
        assert_eq!(
            t(&|b| b[8] = 0xff),
            Err(StateError::BadCount {
                count: 2,
                capacity: 0xff00_0003
            })
        );
        // Header fields changed without the check: torn header.
        assert_eq!(t(&|b| b[15] = 1), Err(StateError::TornHeader));
        let tl = good.len() - 1;
        assert_eq!(
            t(&|b| b[tl] = 6),
            Err(StateError::GenerationMismatch {
                header: 5,
                trailer: 6
            })
        );
        assert_eq!(
            t(&|b| b[40 + 40 + 3] ^= 1),
            Err(StateError::TornEntry { index: 1 })
        );
        // A nonzero reserved field.
        assert_eq!(
            t(&|b| b[40 + 29] = 1),
            Err(StateError::TornEntry { index: 0 })
        );
    }

    #[test]
    fn a_read_during_a_publish_is_refused() {
        // Generation 1 in the region; the writer stores generation 2's parts
        // in order, and a reader copies the region after each store (and
        // after each byte of the entries): it gets generation 1 or 2 whole,
        // or an error that says read again, never a mix.
        let g1 = Snapshot {
            generation: 1,
            published_us: 10,
            capacity: 4,
            entries: vec![e(1, 1), e(2, 1), e(3, 1)],
        };
        let g2 = Snapshot {
            generation: 2,
            published_us: 20,
            capacity: 4,
            entries: vec![e(3, 2), e(1, 1)],
        };
        let mut region = g1.to_bytes();
        let mut seen = Vec::new();
        for (at, w) in g2.writes() {
            for i in 0..w.len() {
                region[at + i] = w[i];
                match Snapshot::parse(&region) {
                    Ok(s) => {
                        assert!(s == g1 || s == g2, "a mixed snapshot passed: {s:?}");
                        seen.push(s.generation);
                    }
                    Err(e) => assert!(e.is_transient(), "{e}"),
                }
            }
        }
        assert_eq!(seen.first(), Some(&1));
        assert_eq!(seen.last(), Some(&2));
        assert_eq!(Snapshot::parse(&region), Ok(g2));
    }

    #[test]
    fn policies() {
        let s = Snapshot {
            generation: 1,
            published_us: 0,
            capacity: 10,
            entries: (0..10).map(|d| e(d, 5)).collect(),
        };
        assert_eq!(Policy::Pull.decide(&s, 0, 6), Decision::PullOnly);
        assert_eq!(Policy::Push.decide(&s, 9, 6), Decision::Push { rank: 9 });
        assert_eq!(Policy::Push.decide(&s, 10, 6), Decision::NotCached);
        assert_eq!(Policy::Push.decide(&s, 3, 5), Decision::UpToDate);
        assert_eq!(Policy::Push.decide(&s, 3, 4), Decision::UpToDate);
        let h = Policy::Hybrid { percent: 20 };
        assert_eq!(h.decide(&s, 1, 6), Decision::Push { rank: 1 });
        assert_eq!(h.decide(&s, 2, 6), Decision::Cold { rank: 2, cutoff: 2 });
        assert_eq!(Policy::cutoff(0, 10), 0);
        assert_eq!(Policy::cutoff(1, 10), 1);
        assert_eq!(Policy::cutoff(25, 10), 3);
        assert_eq!(Policy::cutoff(100, 10), 10);
        assert_eq!(Policy::cutoff(200, 10), 10);
        assert_eq!(
            Policy::Hybrid { percent: 0 }.decide(&s, 0, 6),
            Decision::Cold { rank: 0, cutoff: 0 }
        );
        assert_eq!(h.to_string(), "hybrid(20%)");
    }
}
