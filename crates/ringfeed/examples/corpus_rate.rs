//! Per-core rates on a real image folder, for the speed benchmarks: libjpeg-turbo decode only
//! (the physical limit of a decode pipeline), and ringfeed's full RandomResizedCrop(224) + flip
//! into a batch buffer, with N threads each taking every N-th file.
//!
//! ```text
//! cargo run --release -p ringfeed --example corpus_rate -- DIR [MODES] [THREADS] [PASSES] [REPS]
//! ```
//!
//! `MODES` is one mode or a comma-separated list; the modes are run one after the other, `REPS`
//! times round-robin (so that drift of a noisy machine hits every mode alike):
//!
//! - `decode`: full libjpeg-turbo decode to RGB;
//! - `rrc`: `Processor` with default [`Options`] (what the server runs);
//! - `rrc-full`: the reference path, every image decoded whole (`region_decode: false`);
//! - `rrc-dct`: DCT-domain downscaling allowed (`dct_scaling: true`, default headroom 2);
//!   `rrc-dct1`: the same with `dct_headroom: 1` (scale whenever the box is `d` times the output);
//!   `rrc-dct-rs`, `rrc-dct1-rs`: the same on the packed files (below);
//! - `rrc-fastup`, `rrc-fastdct`: libjpeg-turbo's `TJPARAM_FASTUPSAMPLE` / `TJPARAM_FASTDCT`;
//! - `pixels`: what a decoded-pixel sample (protocol 1.11) costs: `rrc`'s draws and the decode of
//!   the rectangle the crop reads, copied out as packed rows, without the resize; `pixels-rs`
//!   the same on the packed files (below), as the server serves them;
//! - `rrc-noflip` / `rrc-flip`: the same crops as `rrc`, never / always flipped;
//! - `decode-rs`, `rrc-rs`, `rrc-rs-nocut`: `decode` / `rrc` / `rrc` without restart cuts, on
//!   the files as `ringfeed pack` stores them: rewritten losslessly with restart markers
//!   (`Decoder::add_restarts`, every `$RESTART_MCUS` MCUs, default `RESTART_TARGET_MCUS`),
//!   done before the clock starts. The pixels are the same as the originals'.
//!
//! `DIR psnr MODES` instead compares the output of each `rrc*` mode with `rrc-full` (the exact
//! reference, a full decode), image by image over the same crops and flips, and prints the
//! PSNR of the pooled error, the worst image and the number of images that differ at all.
//!
//! Files are read into memory first, so the rate is CPU work only. Each thread warms up on its
//! first 32 files before the clock starts. Prints one JSON object per (rep, mode), with the
//! number of Rust heap allocations per image counted by a global allocator (libjpeg-turbo's
//! own `malloc`s are not seen; use `valgrind` for those), then with several reps one summary
//! object per mode with the median rate.

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ringfeed_decode::{Decoder, Limits, RESTART_TARGET_MCUS};
use ringfeed_ops::{Layout, Options, Processor, Trace, Transform};
use ringfeed_order::rng::SampleRng;

/// The system allocator, counting calls that hand out memory.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: AllocLayout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: AllocLayout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: AllocLayout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

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

/// The processor options and flip probability of an `rrc*` mode.
fn rrc_mode(mode: &str) -> Option<(Options, f64)> {
    let base = Options::default();
    Some(match mode {
        "rrc" => (base, 0.5),
        "rrc-full" => (
            Options {
                region_decode: false,
                ..base
            },
            0.5,
        ),
        "rrc-dct" | "rrc-dct-rs" => (
            Options {
                dct_scaling: true,
                ..base
            },
            0.5,
        ),
        "rrc-dct1" | "rrc-dct1-rs" => (
            Options {
                dct_scaling: true,
                dct_headroom: 1,
                ..base
            },
            0.5,
        ),
        "rrc-fastup" => (
            Options {
                fast_upsample: true,
                ..base
            },
            0.5,
        ),
        "rrc-fastdct" => (Options { fast_dct: true, ..base }, 0.5),
        "pixels" | "pixels-rs" => (base, 0.5),
        "rrc-noflip" => (base, 0.0),
        "rrc-flip" => (base, 1.0),
        "rrc-rs" => (base, 0.5),
        "rrc-rs-nocut" => (
            Options {
                restart_cuts: false,
                ..base
            },
            0.5,
        ),
        _ => return None,
    })
}

/// Whether `mode` runs on the files as `ringfeed pack` stores them (`decode-rs`, `rrc-rs`,
/// `rrc-rs-nocut`, `pixels-rs`, `rrc-dct-rs`, `rrc-dct1-rs`).
fn on_packed_files(mode: &str) -> bool {
    mode.ends_with("-rs") || mode.contains("-rs-")
}

/// One timed run of `mode`; returns (images, seconds, allocations).
fn run(files: &[Vec<u8>], mode: &str, threads: usize, passes: usize) -> (usize, f64, u64) {
    let rrc = rrc_mode(mode);
    if !mode.starts_with("decode") && rrc.is_none() {
        panic!("unknown mode {mode:?}");
    }
    let barrier = std::sync::Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|k| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut n = 0usize;
                    let mut buf = Vec::new();
                    let mut out = vec![0u8; 224 * 224 * 3];
                    let mut decoder = Decoder::new(Limits::default()).expect("decoder");
                    let (options, flip) = rrc.unwrap_or((Options::default(), 0.5));
                    let mut processor = Processor::with_options(Limits::default(), options).expect("processor");
                    let t = Transform::RandomResizedCrop {
                        size: (224, 224),
                        scale: (0.08, 1.0),
                        ratio: (0.75, 4.0 / 3.0),
                        flip,
                    };
                    let pipeline = t.to_pipeline();
                    let mut sink = ringfeed_ops::BufferSink::for_pipeline(&pipeline);
                    let mut one = |pass: usize, i: usize, data: &[u8]| {
                        if rrc.is_none() {
                            decoder.decode_rgb8(data, &mut buf).is_ok()
                        } else if mode.starts_with("pixels") {
                            // What a decoded-pixel sample (protocol 1.11) costs the server: its
                            // draws, and the decode of the rectangle its crop reads.
                            let rng = SampleRng::new(0, pass as u64, i as u64);
                            let Ok(Some(plan)) =
                                processor.plan_pixels(data, &pipeline, rng, 0, false, &mut sink, &mut Trace::off())
                            else {
                                return false;
                            };
                            buf.resize(plan.rect.width as usize * plan.rect.height as usize * 3, 0);
                            processor.decode_pixels(data, &plan, &mut buf).is_ok()
                        } else {
                            let mut rng = SampleRng::new(0, pass as u64, i as u64);
                            processor.process(data, &t, &mut rng, Layout::Nhwc, &mut out).is_ok()
                        }
                    };
                    for (i, data) in files.iter().enumerate().skip(k).step_by(threads).take(32) {
                        one(usize::MAX, i, data);
                    }
                    barrier.wait();
                    for pass in 0..passes {
                        for (i, data) in files.iter().enumerate().skip(k).step_by(threads) {
                            n += usize::from(one(pass, i, data));
                        }
                    }
                    n
                })
            })
            .collect();
        barrier.wait();
        let (start, allocs) = (Instant::now(), ALLOCS.load(Ordering::Relaxed));
        let done: usize = handles.into_iter().map(|h| h.join().expect("worker")).sum();
        (
            done,
            start.elapsed().as_secs_f64(),
            ALLOCS.load(Ordering::Relaxed) - allocs,
        )
    })
}

/// PSNR of each mode's output against `rrc-full`, over every file.
fn psnr(files: &[Vec<u8>], modes: &[String]) {
    let t = Transform::random_resized_crop((224, 224));
    let (reference, _) = rrc_mode("rrc-full").expect("reference mode");
    let mut exact = Processor::with_options(Limits::default(), reference).expect("processor");
    let mut want = vec![0u8; t.output_len()];
    let mut got = vec![0u8; t.output_len()];
    for mode in modes {
        let (options, _) = rrc_mode(mode).unwrap_or_else(|| panic!("unknown mode {mode:?}"));
        let mut p = Processor::with_options(Limits::default(), options).expect("processor");
        let (mut se, mut n, mut worst, mut differ) = (0.0f64, 0usize, f64::INFINITY, 0usize);
        for (i, data) in files.iter().enumerate() {
            let a = exact.process(data, &t, &mut SampleRng::new(0, 0, i as u64), Layout::Nhwc, &mut want);
            let b = p.process(data, &t, &mut SampleRng::new(0, 0, i as u64), Layout::Nhwc, &mut got);
            if a.is_err() || b.is_err() {
                continue;
            }
            let e: f64 = want
                .iter()
                .zip(&got)
                .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
                .sum();
            se += e;
            n += want.len();
            if e > 0.0 {
                differ += 1;
                worst = worst.min(10.0 * (255.0f64.powi(2) * want.len() as f64 / e).log10());
            }
        }
        let pooled = if se == 0.0 {
            f64::INFINITY
        } else {
            10.0 * (255.0f64.powi(2) * n as f64 / se).log10()
        };
        println!(
            "{}",
            serde_json::json!({"psnr_vs": "rrc-full", "mode": mode, "pooled_db": pooled.min(999.0),
                "worst_image_db": worst.min(999.0), "images_differing": differ, "files": files.len()})
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(
        args.get(1)
            .expect("usage: corpus_rate DIR [MODES] [THREADS] [PASSES] [REPS]"),
    );
    let modes: Vec<String> = args
        .get(2)
        .map_or("rrc", String::as_str)
        .split(',')
        .map(str::to_owned)
        .collect();
    let is_psnr = args.get(2).is_some_and(|m| m == "psnr");
    let number = |i: usize, default: usize, what: &str| -> usize {
        match args.get(i) {
            Some(v) if !is_psnr => v.parse().expect(what),
            _ => default,
        }
    };
    let threads = number(3, 1, "THREADS");
    let passes = number(4, 2, "PASSES");
    let reps = number(5, 1, "REPS");
    let mut paths = Vec::new();
    images(&dir, &mut paths);
    let files: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).expect("readable file")).collect();
    if modes == ["psnr"] {
        let compare: Vec<String> = args
            .get(3)
            .map_or("rrc,rrc-dct,rrc-dct1,rrc-fastup,rrc-fastdct", String::as_str)
            .split(',')
            .map(str::to_owned)
            .collect();
        return psnr(&files, &compare);
    }
    let restarted: Vec<Vec<u8>> = if modes.iter().any(|m| on_packed_files(m)) {
        let target = std::env::var("RESTART_MCUS").map_or(RESTART_TARGET_MCUS, |v| v.parse().expect("RESTART_MCUS"));
        // On every core: each rewrite is verified by two full decodes.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let chunk = files.len().div_ceil(cores).max(1);
        let out: Vec<Vec<u8>> = std::thread::scope(|s| {
            let parts: Vec<_> = files
                .chunks(chunk)
                .map(|part| {
                    s.spawn(move || {
                        let mut decoder = Decoder::new(Limits::default()).expect("decoder");
                        part.iter()
                            .map(|f| {
                                let mut out = Vec::new();
                                match decoder.add_restarts(f, target, &mut out) {
                                    Ok(Some(_)) => out,
                                    _ => f.clone(),
                                }
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            parts.into_iter().flat_map(|h| h.join().expect("rewrite")).collect()
        });
        let before: usize = files.iter().map(Vec::len).sum();
        let after: usize = out.iter().map(Vec::len).sum();
        let rewritten = files.iter().zip(&out).filter(|(a, b)| a != b).count();
        println!(
            "{}",
            serde_json::json!({"restart_target_mcus": target, "rewritten": rewritten, "files": files.len(),
                "bytes_before": before, "bytes_after": after})
        );
        out
    } else {
        Vec::new()
    };
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    for rep in 0..reps {
        for (m, mode) in modes.iter().enumerate() {
            let input = if on_packed_files(mode) { &restarted } else { &files };
            let (done, secs, allocs) = run(input, mode, threads, passes);
            let rate = done as f64 / secs;
            rates[m].push(rate);
            println!(
                "{}",
                serde_json::json!({"mode": mode, "rep": rep, "threads": threads, "images": done, "seconds": secs,
                    "img_per_s": rate, "allocs_per_image": allocs as f64 / done.max(1) as f64, "files": files.len()})
            );
        }
    }
    if reps > 1 {
        for (mode, r) in modes.iter().zip(&mut rates) {
            r.sort_by(f64::total_cmp);
            let median = r[r.len() / 2];
            println!(
                "{}",
                serde_json::json!({"summary": mode, "threads": threads, "median_img_per_s": median,
                    "min": r[0], "max": r[r.len() - 1], "reps": reps})
            );
        }
    }
}
