//! `ringfeed serve`: the sidecar's runtime, which joins sources, the decode pool and the ring.
//!
//! A connection ([`stream`]) opens a dataset through [`shared`], plans its epoch, and hands
//! batches to the [`pool`], whose threads write samples straight into the ring [`segment`]; the
//! [`tune`]r reads the [`stats`] every interval and sets each stream's threads, depth and GPU
//! share; [`observe`] shows the same numbers to `ringfeed top` and Prometheus.
//!
//! # Layout (each module imports only those listed after it)
//! - [`server`]: accepting clients, peer checks, shutdown.
//! - [`observe`]: `ringfeed top` and the Prometheus endpoint of `serve --metrics`.
//! - [`stream`]: one client connection: handshake, `open`, the slot state machine, `ready` in
//!   order.
//! - [`images`]: opening an image stream: its source, pipeline and ring fields.
//! - [`tokens`]: opening a token stream, and filling its slots.
//! - [`opening`]: listing image folders and manifests once for every stream that waits for them.
//! - [`shared`]: what every connection shares: the pool, the open sources, the remote hub.
//! - [`tune`]: the autotuner setting each stream's threads, prefetch depth and GPU share.
//! - [`pool`]: the decode threads every stream shares, writing samples into FILLING slots.
//! - [`buckets`]: 1.10 aspect-ratio buckets: each sample's size from its header, its bucket.
//! - [`fields`]: 1.9 sample fields (text, tokens, metadata): checked at open, encoded per sample.
//! - [`targets`]: 1.10 detection and segmentation targets: `open.targets` checked at open, each
//!   sample's read, checked and encoded into `boxes`, `box_labels`, `box_count`, `mask`.
//! - [`stats`]: what the server measures per stream.
//! - [`segment`]: the ring's memfd segment: created, sealed, mapped, pre-faulted.
//! - [`socket`]: the listening socket.

pub mod buckets;
pub mod fields;
mod images;
pub mod observe;
pub mod opening;
pub mod pool;
pub mod segment;
pub mod server;
pub mod shared;
pub mod socket;
pub mod stats;
pub mod stream;
pub mod targets;
pub mod tokens;
pub mod tune;
mod wire;

/// What a build without the `parquet` feature answers to a Parquet dataset `what`.
#[cfg(not(feature = "parquet"))]
pub fn parquet_not_built(what: &str) -> String {
    format!(
        "{what}: this ringfeed was built without Parquet datasets (the `parquet` feature); use a build \
         with default features (`cargo build --release -p ringfeed`, or the wheel)"
    )
}

/// What a build without the `remote` feature answers to `what` (a dataset, a command line
/// argument) on object storage: the server's open error and the binary's, in one wording.
#[cfg(not(feature = "remote"))]
pub fn remote_not_built(what: &str) -> String {
    format!(
        "{what}: this ringfeed was built without object storage (the `remote` feature); use a build \
         with default features (`cargo build --release -p ringfeed`, or the wheel)"
    )
}
