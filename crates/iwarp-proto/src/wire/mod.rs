//! Wire formats (being written).
