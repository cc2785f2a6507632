//! Open time and memory of a packed dataset with 1,000,000 samples.
//!
//! `cargo bench -p ringfeed-benches --bench open_1m [-- --samples N --shards S --out DIR]`
//!
//! Writes a synthetic dataset (64-byte records, so the bench measures the format, not the disk),
//! then re-runs itself in a fresh process that only opens the dataset and reads 1,000 random
//! samples, and reports the open time and the resident memory that added, as JSON on stdout:
//! private (anonymous) memory, and resident pages of the mapped files (page cache shared with
//! every other process, touched around each shard's header and footer).
//! The claim under test: open is O(shards), not O(samples), and costs constant private memory.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use ringfeed_benches::Rss;
use ringfeed_format::shard::{Dataset, DatasetWriter, WriterOptions};

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| default.to_owned())
}

fn measure(dir: &std::path::Path) {
    let rss0 = Rss::now();
    let t = Instant::now();
    let ds = Dataset::open(dir).expect("open");
    let open_s = t.elapsed().as_secs_f64();
    let rss1 = Rss::now();
    let t = Instant::now();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut bytes = 0usize;
    for _ in 0..1000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        bytes += ds.sample_checked(x % ds.len()).expect("sample").data.len();
    }
    let read_s = t.elapsed().as_secs_f64();
    let rss2 = Rss::now();
    println!(
        "{}",
        serde_json::json!({
            "samples": ds.len(),
            "shards": ds.shard_count(),
            "open_seconds": open_s,
            "anon_kib_added_by_open": rss1.anon.saturating_sub(rss0.anon),
            "file_kib_mapped_by_open": rss1.file.saturating_sub(rss0.file),
            "random_reads": 1000,
            "random_read_seconds": read_s,
            "anon_kib_added_after_reads": rss2.anon.saturating_sub(rss0.anon),
            "file_kib_mapped_after_reads": rss2.file.saturating_sub(rss0.file),
            "peak_rss_kib": rss2.peak,
            "bytes_read": bytes,
        })
    );
}

fn main() {
    let default_out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-open-1m");
    let out = PathBuf::from(arg("--out", default_out.to_str().expect("utf-8 target dir")));
    if std::env::var_os("RINGFEED_BENCH_MEASURE").is_some() {
        measure(&out);
        return;
    }
    let samples: u64 = arg("--samples", "1000000").parse().expect("--samples N");
    let shards: u64 = arg("--shards", "500").parse().expect("--shards S");
    let record = 64u64;
    if !out.join("index.rfi").exists() {
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).expect("create output dir");
        let t = Instant::now();
        let per_shard = samples.div_ceil(shards);
        let opts = WriterOptions {
            // Sized so each shard holds `per_shard` 64-byte records (plus table and header).
            target_shard_bytes: 64 + per_shard * (record + 16) + 64 + 8,
            record_align: 8,
        };
        let mut w = DatasetWriter::create(&out, opts).expect("writer");
        let mut data = [0u8; 64];
        for i in 0..samples {
            data[..8].copy_from_slice(&i.to_le_bytes());
            let key = format!("train/n{:08}/{i:08}.JPEG", i % 1000);
            w.push(key.as_bytes(), (i % 1000) as i64, b"", &data).expect("push");
        }
        let classes: Vec<Vec<u8>> = (0..1000).map(|c| format!("n{c:08}").into_bytes()).collect();
        let s = w
            .finish(&classes, r#"{"format":"ringfeed-packed","source_kind":"synthetic"}"#)
            .expect("finish");
        eprintln!(
            "wrote {} samples in {} shards ({} bytes) in {:.1} s",
            s.samples,
            s.shards,
            s.bytes,
            t.elapsed().as_secs_f64()
        );
    }
    let exe = std::env::current_exe().expect("current exe");
    let status = Command::new(exe)
        .args(["--out", out.to_str().expect("utf-8 path")])
        .env("RINGFEED_BENCH_MEASURE", "1")
        .status()
        .expect("run the measuring process");
    assert!(status.success());
}
