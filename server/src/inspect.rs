//! Dataset summaries (placeholder).
