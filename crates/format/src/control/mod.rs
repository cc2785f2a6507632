//! The control protocol (`proto/control.md` is the normative text): framing, messages, and the
//! socket a server listens on.
//!
//! Frames are a u32 little-endian length and a compact JSON object with a `type`; the bulk data
//! never crosses the socket. This module is the single Rust truth for the protocol version, the
//! frame limit and the message shapes; `proto/vectors/control/` pins them for both languages.

pub mod dataset_id;
pub mod frame;
pub mod message;
pub mod snapshot;

pub use dataset_id::DatasetId;
pub use frame::{FrameError, MAX_FRAME, decode_frame, encode_frame};
pub use message::{
    ClientMessage, ErrorCode, LmdbRequest, MetaFieldRequest, MixEntry, OpenRequest, ParquetRequest, REMOTE_SCHEME,
    REMOTE_SCHEMES, SampleKindRequest, ServerMessage, TargetsRequest, TextFieldRequest, TokenOptions, TransformRequest,
    WdsRequest, names_object_storage, object_storage_scheme,
};
pub use snapshot::{RemoteSnapshot, ServerSnapshot, SlotCounts, Snapshot, StageTimes, StreamSnapshot};

/// Protocol version spoken by this server, `(major, minor)`.
pub const PROTOCOL: (u16, u16) = (1, 11);
