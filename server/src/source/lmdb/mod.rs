//! LMDB read in place (placeholder).

/// Errors reading an LMDB source.
#[derive(Debug, thiserror::Error)]
pub enum LmdbError {
    /// Placeholder.
    #[error("placeholder")]
    Placeholder,
}
