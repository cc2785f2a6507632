//! The crate's one integration-test binary: each module drives the library or the real
//! `ringfeed` binary end to end.

mod shard;
mod support;
mod vectors;
