//! Single-thread throughput of `ops::Processor` on generated JPEGs: the region-decode fast path
//! against the full-decode path, NHWC against NCHW, and DCT scaling on large sources.
//!
//! ```text
//! cargo run --release -p ringfeed --example ops_throughput [-- IMAGES]
//! ```
//!
//! The pictures are `ringfeed_testkit::photo`'s (gradients, a hard-edged disc and noise),
//! encoded by libjpeg-turbo at quality 90, 4:2:0, about 3 bits per pixel (an entropy-heavy
//! corpus, like `shared/research/deps.md`'s). Each configuration runs three times over all images; the
//! median is printed.

use std::time::Instant;

use ringfeed_decode::Limits;
use ringfeed_ops::{Layout, Options, Processor, Transform};
use ringfeed_order::rng::SampleRng;

fn jpeg(w: usize, h: usize, seed: u64) -> Vec<u8> {
    ringfeed_testkit::photo_jpeg(w, h, seed, turbojpeg::Subsamp::Sub2x2)
}

/// A configuration: name, images, transform, layout, options.
type Row<'a> = (&'a str, &'a [Vec<u8>], &'a Transform, Layout, Options);

/// Median images per second over three passes.
fn measure(files: &[Vec<u8>], t: &Transform, layout: Layout, options: Options) -> f64 {
    let mut p = Processor::with_options(Limits::default(), options).unwrap();
    let mut out = vec![0u8; t.output_len()];
    let mut rates = Vec::new();
    for pass in 0..4 {
        let start = Instant::now();
        for (i, data) in files.iter().enumerate() {
            let mut rng = SampleRng::new(0, pass, i as u64);
            p.process(data, t, &mut rng, layout, &mut out).unwrap();
        }
        if pass > 0 {
            // The first pass warms buffers and caches.
            rates.push(files.len() as f64 / start.elapsed().as_secs_f64());
        }
    }
    rates.sort_by(f64::total_cmp);
    rates[1]
}

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(300);
    let small: Vec<Vec<u8>> = (0..n as u64).map(|i| jpeg(500, 375, i)).collect();
    let large: Vec<Vec<u8>> = (0..(n / 10).max(4) as u64).map(|i| jpeg(2000, 1500, i)).collect();
    let bpp = |files: &[Vec<u8>], px: f64| {
        files.iter().map(|f| f.len() as f64 * 8.0).sum::<f64>() / (files.len() as f64 * px)
    };
    println!(
        "corpus: {} JPEGs 500x375 ({:.2} bits/px), {} JPEGs 2000x1500 ({:.2} bits/px); single thread",
        small.len(),
        bpp(&small, 500.0 * 375.0),
        large.len(),
        bpp(&large, 2000.0 * 1500.0)
    );
    let rrc = Transform::random_resized_crop((224, 224));
    let center = Transform::CenterCrop {
        size: (224, 224),
        resize: 256,
    };
    let fast = Options::default();
    let full = Options {
        region_decode: false,
        ..Options::default()
    };
    let scaled = Options {
        dct_scaling: true,
        ..Options::default()
    };
    let rows: [Row<'_>; 10] = [
        (
            "500x375  RRC(224)   NHWC region decode",
            &small,
            &rrc,
            Layout::Nhwc,
            fast,
        ),
        (
            "500x375  RRC(224)   NHWC full decode  ",
            &small,
            &rrc,
            Layout::Nhwc,
            full,
        ),
        (
            "500x375  RRC(224)   NCHW region decode",
            &small,
            &rrc,
            Layout::Nchw,
            fast,
        ),
        (
            "500x375  Resize(256)+CenterCrop(224) region",
            &small,
            &center,
            Layout::Nhwc,
            fast,
        ),
        (
            "500x375  Resize(256)+CenterCrop(224) full  ",
            &small,
            &center,
            Layout::Nhwc,
            full,
        ),
        (
            "2000x1500 RRC(224)  region decode      ",
            &large,
            &rrc,
            Layout::Nhwc,
            fast,
        ),
        (
            "2000x1500 RRC(224)  region + DCT scaling",
            &large,
            &rrc,
            Layout::Nhwc,
            scaled,
        ),
        (
            "2000x1500 RRC(224)  full decode        ",
            &large,
            &rrc,
            Layout::Nhwc,
            full,
        ),
        (
            "2000x1500 Resize(256)+CenterCrop(224) region",
            &large,
            &center,
            Layout::Nhwc,
            fast,
        ),
        (
            "2000x1500 Resize(256)+CenterCrop(224) region + DCT",
            &large,
            &center,
            Layout::Nhwc,
            scaled,
        ),
    ];
    for (name, files, t, layout, options) in rows {
        let rate = measure(files, t, layout, options);
        println!("{name}: {rate:8.1} img/s  ({:.3} ms/img)", 1000.0 / rate);
    }
}
