//! The shared-memory ring (`proto/ring.md` is the normative text).
//!
//! This module is the single Rust truth for the segment layout: magics, versions, structure
//! sizes, field offsets and dtype codes. [`layout`] encodes and decodes the fixed structures;
//! [`Segment`] creates the memfd, maps it, pre-faults it and hands out raw slot pointers to the
//! decode threads.
//!
//! Invariants:
//! - A segment is sized once and sealed against resizing, so a mapping of it never shrinks under
//!   a reader (no SIGBUS from a truncated memfd).
//! - The server writes a slot only while it is FILLING (ring.md rule 1); the stream that owns the
//!   segment tracks slot states, and this module only provides the memory.

pub mod gpu_ops;
pub mod layout;

pub use layout::{DType, FieldDesc, FieldSpec, RingLayout, SegmentHeader, SlotHeader};
