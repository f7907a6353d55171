//! Verbs and CM API (being written).
