//! Field deserializers for configuration types (feature `toml`), so that a
//! value is written the same way in every tool's file and variables.
//!
//! ```
//! #[derive(serde::Deserialize)]
//! struct Conf {
//!     #[serde(deserialize_with = "iwarp_conf::de::size")]
//!     cache_bytes: u64,
//!     #[serde(default, deserialize_with = "iwarp_conf::de::opt_size")]
//!     max_window: Option<u64>,
//! }
//! let c: Conf = toml::from_str("cache_bytes = \"64M\"\nmax_window = 4096").unwrap();
//! assert_eq!((c.cache_bytes, c.max_window), (64 << 20, Some(4096)));
//! ```

use serde::de::{Deserialize, Deserializer, Error};

/// A size in bytes written as a number (`4096`) or as text with a suffix
/// (`"64M"`, `"1GiB"`: [`crate::parse_size`]). An environment variable's
/// value arrives as either (`PREFIX_KEY=4096` is a number, `=64M` text),
/// so a size field takes both.
pub fn size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Raw {
        N(u64),
        Text(String),
    }
    match Raw::deserialize(d) {
        Ok(Raw::N(n)) => Ok(n),
        Ok(Raw::Text(t)) => crate::parse_size(&t)
            .map_err(|e| D::Error::custom(format!("{e} (fix: give bytes, or a size such as 64M)"))),
        Err(_) => Err(D::Error::custom(
            "expected a size (fix: give bytes such as 4096 or text such as \"64M\", \"1GiB\")",
        )),
    }
}

/// [`size`] for an optional field (with `#[serde(default)]`).
pub fn opt_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    size(d).map(Some)
}
