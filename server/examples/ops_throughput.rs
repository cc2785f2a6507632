//! Single-thread throughput of `ops::Processor` on generated JPEGs: the region-decode fast path
//! against the full-decode path, NHWC against NCHW, and DCT scaling on large sources.
//!
//! ```text
//! cargo run --release -p ringfeed --example ops_throughput [-- IMAGES]
//! ```
//!
//! The pictures are smooth gradients, hard-edged discs and Gaussian-ish noise, encoded by
//! libjpeg-turbo at quality 90, 4:2:0, about 3.5 bits per pixel (an entropy-heavy corpus, like
//! `shared/research/deps.md`'s). Each configuration runs three times over all images; the
//! median is printed.

use std::time::Instant;

use ringfeed::codec::Limits;
use ringfeed::ops::{Layout, Options, Processor, SampleRng, Transform};

/// splitmix64, for the picture generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

fn picture(w: usize, h: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    let waves: Vec<[f32; 4]> = (0..6)
        .map(|_| {
            [
                rng.unit() * 0.08,
                rng.unit() * 0.08,
                rng.unit() * 6.3,
                (rng.next() % 3) as f32,
            ]
        })
        .collect();
    let discs: Vec<[f32; 6]> = (0..10)
        .map(|_| {
            [
                rng.unit() * w as f32,
                rng.unit() * h as f32,
                5.0 + rng.unit() * (w.min(h) as f32 / 3.0),
                rng.unit() * 255.0,
                rng.unit() * 255.0,
                rng.unit() * 255.0,
            ]
        })
        .collect();
    let mut px = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            let (fx, fy) = (x as f32, y as f32);
            let mut c = [128.0f32; 3];
            for wv in &waves {
                c[wv[3] as usize] += 40.0 * (wv[0] * fx + wv[1] * fy + wv[2]).sin();
            }
            for d in &discs {
                if (fx - d[0]).powi(2) + (fy - d[1]).powi(2) < d[2] * d[2] {
                    c = [d[3], d[4], d[5]];
                }
            }
            for v in c {
                // Sum of four uniforms: roughly Gaussian, sd about 9.
                let n: f32 = (0..4).map(|_| rng.unit() - 0.5).sum::<f32>() * 30.0;
                px.push((v + n).clamp(0.0, 255.0) as u8);
            }
        }
    }
    px
}

fn jpeg(w: usize, h: usize, seed: u64) -> Vec<u8> {
    let px = picture(w, h, seed);
    let img = turbojpeg::Image {
        pixels: &px[..],
        width: w,
        pitch: w * 3,
        height: h,
        format: turbojpeg::PixelFormat::RGB,
    };
    turbojpeg::compress(img, 90, turbojpeg::Subsamp::Sub2x2)
        .unwrap()
        .to_vec()
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
