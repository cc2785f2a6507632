//! ringfeed: a data-loading sidecar that keeps GPUs fed.
//!
//! The library holds everything; the `ringfeed` binary only parses flags and calls in here, so
//! tests drive the same code the CLI runs.
//!
//! Data flows from the top of this list to the bottom: offline packing first, then serving (a
//! sample's way from a mapped file into a ring slot), then what watches and steers it.
//!
//! # Layout
//! - [`pack`]: the offline packer: image folders, manifests and LMDBs in, packed shards out.
//! - [`progress`]: progress bars and plain progress lines for long commands.
//! - [`inspect`]: human summaries of a packed dataset or an LMDB.
//! - [`shard`]: the packed shard format v1 (`proto/shard.md`): layout, writer, reader, verifier.
//! - [`source`]: random access to encoded samples: packed shards ([`source::PackedSource`]), an
//!   LMDB, image folders and manifests, or WebDataset tars ([`source::wds`]), the last three
//!   read in place.
//! - [`remote`]: packed datasets on S3-compatible storage, through a bounded local cache of
//!   checked shards, fetched ahead of the order.
//! - [`tokens`]: the token dataset format v1 (`proto/tokens.md`): writer, reader, verifier, and
//!   Megatron / flat token files read in place.
//! - [`fault`]: SIGBUS on a mapped file that changed on disk becomes an error naming the file.
//! - [`codec`]: image probing, decoding with explicit resource limits, and JPEG re-encoding.
//! - [`ops`]: per-sample transforms (RandomResizedCrop, Resize + CenterCrop, Resize) decoded
//!   by region and written straight into the caller's output buffer.
//! - [`resample`]: the antialiased bilinear resampler behind [`ops`] and re-encoding, which
//!   allocates nothing once warm.
//! - [`order`]: the epoch's permutation: global, or shuffled blocks of shards for slow storage.
//! - [`sampler`]: the order of samples: per-epoch permutation, rank partition, batches.
//! - [`ring`]: the shared-memory ring (`proto/ring.md`): layout, dtype codes, the memfd segment.
//! - [`pool`]: the decode threads every stream shares, writing samples into FILLING slots.
//! - [`control`]: the socket protocol (`proto/control.md`): framing, messages, the listener.
//! - [`stream`]: one client connection: handshake, `open`, the slot state machine, `ready` in order.
//! - [`serve`]: `ringfeed serve`, the sidecar: accepting clients, peer checks, shutdown.
//! - [`stats`]: what the server measures per stream, and the `snapshot` observers get.
//! - [`tune`]: the autotuner setting each stream's threads and prefetch depth from the loop's wait.
//! - [`observe`]: `ringfeed top` and the Prometheus endpoint of `serve --metrics`.

pub mod codec;
pub mod control;
pub mod fault;
pub mod inspect;
pub mod observe;
pub mod opening;
pub mod ops;
pub mod order;
pub mod pack;
pub mod pool;
pub mod progress;
pub mod remote;
pub mod resample;
pub mod ring;
pub mod sampler;
pub mod serve;
pub mod shard;
pub mod source;
pub mod stats;
pub mod stream;
pub mod tokens;
pub mod tune;
