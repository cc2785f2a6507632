//! The packed shard format v1 (placeholder).

/// Errors reading or verifying packed shards.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// Placeholder.
    #[error("placeholder")]
    Placeholder,
}
