//! Fuzzes the packed dataset reader and verifier with arbitrary index and shard bytes.
//!
//! The input is split into an index file and up to two shard files. A valid dataset is a
//! good seed (`proto/vectors/shard/v1-basic`, joined by `fuzz/seed.sh`), so mutations start from
//! real structures. Whatever the bytes, opening, reading every sample and verifying must return
//! `Ok` or `Err`, never panic, hang or read out of bounds. The body is `ringfeed_fuzz::shard_reader`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringfeed_fuzz::shard_reader(data));
