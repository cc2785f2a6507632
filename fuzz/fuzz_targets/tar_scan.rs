//! Fuzz target: see `ringfeed_fuzz::tar_scan` (fuzz/src/lib.rs) for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringfeed_fuzz::tar_scan(data));
