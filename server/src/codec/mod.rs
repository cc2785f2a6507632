//! Image probing, decoding and re-encoding (placeholder; see the codec work item).
