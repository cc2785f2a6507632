//! The crate's one integration-test binary: each module drives the library or the real
//! `ringfeed` binary end to end.

#![allow(unreachable_pub)] // helpers are `pub` for the sibling modules of this one binary

mod cli;
mod codec;
mod in_place;
mod lmdb;
mod ops;
mod order;
mod pack;
mod remote;
mod remote_tokens;
mod serve;
mod shard;
mod storage;
mod support;
mod token_order;
mod token_vectors;
mod tokens;
mod vectors;
mod webdataset;
mod wire_vectors;
