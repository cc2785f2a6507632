//! ringfeed's orders: which sample (or token window) comes where, as pure functions of the seed,
//! the epoch and the dataset's shape.
//!
//! Nothing here reads a sample or touches a socket; the same arithmetic runs in the client's
//! tests against `proto/vectors/order/` and `proto/vectors/tokens/`, so an order can be checked
//! without a server.
//!
//! # Layout
//! - [`rng`]: the counter-based generator every random draw comes from (`SampleRng`).
//! - [`sampler`]: the order of samples: per-epoch permutation, rank partition, batches.
//! - [`buckets`]: the aspect-bucket order, every batch one bucket (control 1.10).
//! - [`blocks`]: the shard-blocks order, shuffled blocks of shards for slow storage.
//! - [`windows`]: token windows (`concat` and `pack` modes) over a token dataset.
//! - [`mix`]: exact weighted mixing of token datasets.

pub mod blocks;
pub mod buckets;
pub mod mix;
pub mod rng;
pub mod sampler;
pub mod windows;
