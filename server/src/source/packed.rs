//! Packed shards as a [`Source`](super::Source) (placeholder).

/// Placeholder.
#[derive(Debug)]
pub struct PackedSource;
