//! Shared test helpers: seeded data, small datasets, running the binary.

use std::path::{Path, PathBuf};

use ringfeed_format::shard::{DatasetWriter, WriteSummary, WriterOptions};
// The seeded pictures and encoders live in the workspace's one test-data crate.
pub use ringfeed_testkit::{Rng, cmyk_jpeg, gray_jpeg, jpeg, png, png_claiming, png16};

/// One sample as the tests describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub key: Vec<u8>,
    pub label: i64,
    pub meta: Vec<u8>,
    pub data: Vec<u8>,
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

/// Writes `files` (relative path, bytes) under `root`.
pub fn write_tree(root: &Path, files: &[(&str, Vec<u8>)]) {
    for (rel, data) in files {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
}

/// Whether this run regenerates the committed vectors (`RINGFEED_BLESS=1`).
pub fn blessing() -> bool {
    std::env::var_os("RINGFEED_BLESS").is_some_and(|v| v == "1")
}

/// Writes `content` to `path` in bless mode, then checks the committed file equals it.
pub fn pinned(path: &Path, content: &[u8]) {
    if blessing() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    let committed =
        std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}; run this test with RINGFEED_BLESS=1", path.display()));
    assert!(
        committed == content,
        "{} is stale; if the change is deliberate, rerun this test with RINGFEED_BLESS=1 and commit the file",
        path.display()
    );
}
