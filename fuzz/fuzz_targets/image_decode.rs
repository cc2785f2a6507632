//! Fuzz target: see `ringfeed_fuzz::image_decode` (fuzz/src/lib.rs) for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringfeed_fuzz::image_decode(data));
