//! ringfeed's formats: the Rust side of the specs in `proto/`, as plain types with their
//! encoders, readers and verifiers.
//!
//! This is the bottom of the workspace: it decides nothing about threads, sockets or policy, and
//! every other crate may import it. A change to a format starts in `proto/` (and
//! `proto/CHANGES.md`), then lands here and in the client's `ringfeed.formats` / `ringfeed.wire`,
//! both checked against the same vectors under `proto/vectors/`.
//!
//! # Layout
//! - [`shard`]: the packed shard format (`proto/shard.md`): layout, writer, reader, verifier.
//! - [`tokens`]: the token dataset format (`proto/tokens.md`): writer, reader, verifier, packing
//!   files, and Megatron / flat token files read in place.
//! - [`ring`]: the shared-memory ring's layout and dtype codes (`proto/ring.md`).
//! - [`control`]: the control protocol (`proto/control.md`): framing, messages, the `snapshot`
//!   observers get.
//! - [`targets`]: a sample's detection and segmentation targets as plain data (1.10).
//! - [`fault`]: SIGBUS on a mapped file that changed on disk becomes an error naming the file.

pub mod control;
pub mod fault;
pub mod ring;
pub mod shard;
pub mod targets;
pub mod tokens;
