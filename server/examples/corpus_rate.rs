//! Per-core rates on a real image folder, for the speed benchmarks: libjpeg-turbo decode only
//! (the physical limit of a decode pipeline), and ringfeed's full RandomResizedCrop(224) + flip
//! into a batch buffer, with N threads each taking every N-th file.
//!
//! ```text
//! cargo run --release -p ringfeed --example corpus_rate -- DIR [decode|rrc] [THREADS] [PASSES]
//! ```
//!
//! Files are read into memory first, so the rate is CPU work only. Prints one JSON object.

use std::path::{Path, PathBuf};
use std::time::Instant;

use ringfeed::codec::{Decoder, Limits};
use ringfeed::ops::{Layout, Processor, SampleRng, Transform};

fn images(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("readable directory")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            images(&p, out);
        } else if p
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("jpg") || e.eq_ignore_ascii_case("jpeg"))
        {
            out.push(p);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(
        args.get(1)
            .expect("usage: corpus_rate DIR [decode|rrc] [THREADS] [PASSES]"),
    );
    let mode = args.get(2).map_or("rrc", String::as_str).to_owned();
    let threads: usize = args.get(3).map_or(1, |t| t.parse().expect("THREADS"));
    let passes: usize = args.get(4).map_or(2, |t| t.parse().expect("PASSES"));
    let mut paths = Vec::new();
    images(&dir, &mut paths);
    let files: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).expect("readable file")).collect();
    let t = Transform::RandomResizedCrop {
        size: (224, 224),
        scale: (0.08, 1.0),
        ratio: (0.75, 4.0 / 3.0),
        flip: 0.5,
    };
    let start = Instant::now();
    let done: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|k| {
                let (files, mode, t) = (&files, &mode, &t);
                s.spawn(move || {
                    let mut n = 0usize;
                    let mut buf = Vec::new();
                    let mut out = vec![0u8; 224 * 224 * 3];
                    let mut decoder = Decoder::new(Limits::default()).expect("decoder");
                    let mut processor = Processor::new(Limits::default()).expect("processor");
                    for pass in 0..passes {
                        for (i, data) in files.iter().enumerate().skip(k).step_by(threads) {
                            let ok = if mode == "decode" {
                                decoder.decode_rgb8(data, &mut buf).is_ok()
                            } else {
                                let mut rng = SampleRng::new(0, pass as u64, i as u64);
                                processor.process(data, t, &mut rng, Layout::Nhwc, &mut out).is_ok()
                            };
                            n += usize::from(ok);
                        }
                    }
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("worker")).sum()
    });
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({"mode": mode, "threads": threads, "images": done, "seconds": secs, "img_per_s": done as f64 / secs, "files": files.len()})
    );
}
