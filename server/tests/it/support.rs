//! Shared test helpers: seeded data, small datasets, running the binary.

use std::path::{Path, PathBuf};

use ringfeed::shard::{DatasetWriter, WriteSummary, WriterOptions};

/// One sample as the tests describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub key: Vec<u8>,
    pub label: i64,
    pub meta: Vec<u8>,
    pub data: Vec<u8>,
}

/// splitmix64: a tiny seeded generator, so test data is the same on every run and platform.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Writes `samples` as a dataset in a new directory `dir`.
pub fn write_dataset(dir: &Path, samples: &[Spec], classes: &[Vec<u8>], opts: WriterOptions) -> WriteSummary {
    std::fs::create_dir_all(dir).unwrap();
    let mut w = DatasetWriter::create(dir, opts).unwrap();
    for s in samples {
        w.push(&s.key, s.label, &s.meta, &s.data).unwrap();
    }
    w.finish(classes, r#"{"format":"ringfeed-packed","source_kind":"test"}"#)
        .unwrap()
}

/// A small dataset with two shards, classes, metadata and a non-UTF-8 key.
pub fn small_specs() -> (Vec<Spec>, Vec<Vec<u8>>) {
    let mut rng = Rng(7);
    let classes = vec![
        b"cat".to_vec(),
        b"dog".to_vec(),
        "\u{e9}l\u{e9}phant".as_bytes().to_vec(),
    ];
    let mut samples = Vec::new();
    for i in 0..7u64 {
        let len = 1 + (rng.next() % 300) as usize;
        samples.push(Spec {
            key: if i == 3 {
                b"dog/\xff\xfe.jpg".to_vec()
            } else {
                format!("c{}/{i:03}.jpg", i % 3).into_bytes()
            },
            label: if i == 5 { -1 } else { (i % 3) as i64 },
            meta: if i % 2 == 0 {
                format!("{{\"row\":{i}}}").into_bytes()
            } else {
                Vec::new()
            },
            data: rng.bytes(len),
        });
    }
    (samples, classes)
}

/// Options that give `small_specs` two or three shards and visible padding.
pub fn small_options() -> WriterOptions {
    WriterOptions {
        target_shard_bytes: 1200,
        record_align: 64,
    }
}

/// Every file of a dataset directory, sorted by name.
pub fn dataset_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
}

/// Path of the built `ringfeed` binary.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ringfeed"))
}
