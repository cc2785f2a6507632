//! Fuzzes the packed dataset reader and verifier with arbitrary index and shard bytes.
//!
//! The input is split into an index file and up to two shard files. A valid dataset is a
//! good seed (`proto/vectors/shard/v1-basic`, joined by `fuzz/seed.sh`), so mutations start from
//! real structures. Whatever the bytes, opening, reading every sample and verifying must return
//! `Ok` or `Err`, never panic, hang or read out of bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringfeed::shard::{Dataset, VerifyOptions, verify_dataset};

/// Separates the files inside one fuzz input.
const SEPARATOR: &[u8] = b"\n--ringfeed-fuzz-file--\n";

fn split(data: &[u8]) -> Vec<&[u8]> {
    let mut parts = Vec::new();
    let mut rest = data;
    while let Some(at) = rest.windows(SEPARATOR.len()).position(|w| w == SEPARATOR) {
        parts.push(&rest[..at]);
        rest = &rest[at + SEPARATOR.len()..];
    }
    parts.push(rest);
    parts
}

fuzz_target!(|data: &[u8]| {
    let parts = split(data);
    let index = parts[0].to_vec();
    let shards: Vec<Vec<u8>> = parts[1..].iter().map(|p| p.to_vec()).collect();
    let lookup = |name: &str| -> Option<Vec<u8>> {
        let n: usize = name.strip_prefix("shard-")?.strip_suffix(".rfs")?.parse().ok()?;
        shards.get(n).cloned()
    };
    let Ok(ds) = Dataset::from_memory(index, &lookup) else { return };
    // Bound the work per input: a header may claim billions of samples.
    for i in 0..ds.len().min(4096) {
        if let Ok(s) = ds.sample(i) {
            std::hint::black_box(s.data.len());
        }
        let _ = ds.sample_checked(i);
    }
    if ds.len() <= 4096 {
        let _ = verify_dataset(&ds, &VerifyOptions::default());
    }
});
