//! MPA connection setup (being written).
