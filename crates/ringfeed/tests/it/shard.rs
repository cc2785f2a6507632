//! The packed format end to end: write, read back, verify, and damage.

use std::fs;
use std::path::Path;

use proptest::prelude::*;
use ringfeed_format::shard::{Dataset, VerifyOptions, WriterOptions, verify};

use crate::support::{Spec, dataset_files, small_options, small_specs, write_dataset};

fn read_all(dir: &Path) -> Vec<Spec> {
    let ds = Dataset::open(dir).unwrap();
    (0..ds.len())
        .map(|i| {
            let s = ds.sample_checked(i).unwrap();
            Spec {
                key: s.key.to_vec(),
                label: s.label,
                meta: s.meta.to_vec(),
                data: s.data.to_vec(),
            }
        })
        .collect()
}

fn spec_strategy() -> impl Strategy<Value = Spec> {
    (
        proptest::collection::vec(any::<u8>(), 0..40),
        -1i64..10,
        proptest::option::of(0u32..1000),
        proptest::collection::vec(any::<u8>(), 1..3000),
    )
        .prop_map(|(key, label, meta, data)| Spec {
            key,
            label,
            meta: meta.map(|m| format!("{{\"m\":{m}}}").into_bytes()).unwrap_or_default(),
            data,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    /// Whatever is pushed is read back byte for byte, with its key, label and metadata, and the
    /// result passes `verify`.
    #[test]
    fn round_trip(
        samples in proptest::collection::vec(spec_strategy(), 0..40),
        align_pow in 3u32..13,
        target in 1u64..20_000,
        with_classes in any::<bool>(),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ds");
        let classes: Vec<Vec<u8>> = if with_classes { (0..10).map(|c| format!("class{c}").into_bytes()).collect() } else { vec![] };
        let opts = WriterOptions { target_shard_bytes: target, record_align: 1 << align_pow };
        let summary = write_dataset(&dir, &samples, &classes, opts);
        prop_assert_eq!(summary.samples, samples.len() as u64);
        prop_assert_eq!(read_all(&dir), samples.clone());
        let report = verify(&dir, &VerifyOptions::default()).unwrap();
        prop_assert_eq!(report.samples, samples.len() as u64);
        let ds = Dataset::open(&dir).unwrap();
        prop_assert_eq!(ds.class_count() as usize, classes.len());
        for (c, name) in classes.iter().enumerate() {
            prop_assert_eq!(ds.class_name(c as u32).unwrap(), &name[..]);
        }
        // Every shard but the last stays within the target unless it holds a single record.
        for n in 0..ds.shard_count() {
            let (_, records, len) = ds.shard_info(n).unwrap();
            prop_assert!(len <= target || records == 1 || n + 1 == ds.shard_count());
        }
    }
}

#[test]
fn output_is_deterministic() {
    let tmp = tempfile::tempdir().unwrap();
    let (samples, classes) = small_specs();
    write_dataset(&tmp.path().join("a"), &samples, &classes, small_options());
    write_dataset(&tmp.path().join("b"), &samples, &classes, small_options());
    let a = dataset_files(&tmp.path().join("a"));
    let b = dataset_files(&tmp.path().join("b"));
    assert_eq!(a.len(), b.len());
    assert!(a.len() >= 3, "the small dataset should span several shards: {a:?}");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(fs::read(x).unwrap(), fs::read(y).unwrap(), "{} differs", x.display());
    }
}

/// Flipping any single bit of any file makes `verify` fail.
#[test]
fn verify_catches_a_flip_anywhere() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let (samples, classes) = small_specs();
    write_dataset(&dir, &samples, &classes, small_options());
    verify(&dir, &VerifyOptions::default()).unwrap();
    let mut checked = 0;
    for file in dataset_files(&dir) {
        let good = fs::read(&file).unwrap();
        for at in 0..good.len() {
            for bit in [0x01u8, 0x80] {
                let mut bad = good.clone();
                bad[at] ^= bit;
                fs::write(&file, &bad).unwrap();
                let r = verify(&dir, &VerifyOptions::default());
                assert!(
                    r.is_err(),
                    "flipping bit {bit:#x} of byte {at} of {} went unnoticed",
                    file.display()
                );
                checked += 1;
            }
        }
        fs::write(&file, &good).unwrap();
    }
    assert!(checked > 4000, "only {checked} flips tried");
    verify(&dir, &VerifyOptions::default()).unwrap();
}

/// Cutting any file at any length makes `verify` fail, and so does appending to one.
#[test]
fn verify_catches_truncation_anywhere() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let (samples, classes) = small_specs();
    write_dataset(&dir, &samples, &classes, small_options());
    for file in dataset_files(&dir) {
        let good = fs::read(&file).unwrap();
        for len in 0..good.len() {
            fs::write(&file, &good[..len]).unwrap();
            let err = verify(&dir, &VerifyOptions::default()).unwrap_err();
            assert!(
                matches!(err.kind(), "truncated" | "bad_magic" | "corrupt" | "checksum"),
                "cutting {} to {len} bytes gave {err}",
                file.display()
            );
        }
        let mut longer = good.clone();
        longer.extend_from_slice(&[0; 8]);
        fs::write(&file, &longer).unwrap();
        assert!(
            verify(&dir, &VerifyOptions::default()).is_err(),
            "appending to {} went unnoticed",
            file.display()
        );
        fs::write(&file, &good).unwrap();
    }
}

/// A missing shard file is an `io` error naming the file.
#[test]
fn missing_shard_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let (samples, classes) = small_specs();
    write_dataset(&dir, &samples, &classes, small_options());
    fs::remove_file(dir.join("shard-000001.rfs")).unwrap();
    let err = Dataset::open(&dir).unwrap_err();
    assert_eq!(err.kind(), "io");
    assert!(err.to_string().contains("shard-000001.rfs"), "{err}");
}

/// Reading past the end is an error, not a panic.
#[test]
fn out_of_range_sample() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let (samples, classes) = small_specs();
    write_dataset(&dir, &samples, &classes, small_options());
    let ds = Dataset::open(&dir).unwrap();
    let err = ds.sample(ds.len()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("sample 7 is out of range: {} has 7 samples", dir.display())
    );
}

/// The writer refuses labels the format cannot hold.
#[test]
fn writer_rejects_bad_labels() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = ringfeed_format::shard::DatasetWriter::create(tmp.path(), WriterOptions::default()).unwrap();
    w.push(b"a", 3, b"", b"x").unwrap();
    let err = w.finish(&[b"only".to_vec()], "{}").unwrap_err();
    assert!(err.to_string().contains("sample 0 has label 3"), "{err}");
}
