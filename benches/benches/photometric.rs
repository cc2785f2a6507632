//! The photometric kernels on a 224×224 RGB image, each op's current kernel (`/new`) against the
//! scalar code it replaced (`/old`, `ringfeed_ops::reference`), one after the other in the same
//! run, so their ratio does not depend on how busy the machine was between two runs.
//!
//! Each iteration copies the picture into the working image (the `copy` row is that alone) and
//! applies the op with the next of 64 draws, made as torchvision's transforms make them:
//! ColorJitter(0.4, 0.4, 0.4, 0.1) (four factors in a random order), a factor of the same
//! ranges for each adjustment alone, GaussianBlur(23) with sigma in (0.1, 2.0) (torchvision's
//! default), GaussianBlur(9, 1.0) as the `ops` bench runs it, and adjust_sharpness(2.0).
//!
//! `cargo bench -p ringfeed-benches --bench photometric [-- FILTER]`; results under
//! `benches/results/`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ringfeed_ops::{kernels, reference};
use ringfeed_order::rng::SampleRng;

const SIZE: usize = 224;

/// One implementation of the kernels: `reference`'s or `kernels`'.
struct Kernels {
    brightness: fn(&mut [u8], f64),
    contrast: fn(&mut [u8], f64),
    saturation: fn(&mut [u8], f64),
    hue: fn(&mut [u8], f64),
    sharpness: fn(&mut [u8], usize, usize, f64, &mut Vec<u8>),
    #[allow(clippy::type_complexity)]
    blur: fn(&mut [u8], usize, usize, (u32, u32), (f64, f64), &mut Vec<f32>, &mut Vec<f32>, &mut Vec<f32>),
}

const OLD: Kernels = Kernels {
    brightness: reference::brightness,
    contrast: reference::contrast,
    saturation: reference::saturation,
    hue: reference::hue,
    sharpness: reference::sharpness,
    blur: reference::gaussian_blur,
};

const NEW: Kernels = Kernels {
    brightness: kernels::brightness,
    contrast: kernels::contrast,
    saturation: kernels::saturation,
    hue: kernels::hue,
    sharpness: kernels::sharpness,
    blur: kernels::gaussian_blur,
};

/// One image's draws.
#[derive(Clone, Copy)]
struct Draw {
    /// ColorJitter's order of (brightness, contrast, saturation, hue).
    order: [usize; 4],
    /// The factors in that order of names: three in (0.6, 1.4), hue in (-0.1, 0.1).
    factor: [f64; 4],
    /// GaussianBlur(23)'s sigma.
    sigma: f64,
}

fn draws() -> Vec<Draw> {
    (0..64)
        .map(|i| {
            let mut rng = SampleRng::new(7, 0, i);
            let mut order = [0, 1, 2, 3];
            for k in (1..4).rev() {
                order.swap(k, rng.below(k as u64 + 1) as usize);
            }
            let factor = [
                rng.uniform(0.6, 1.4),
                rng.uniform(0.6, 1.4),
                rng.uniform(0.6, 1.4),
                rng.uniform(-0.1, 0.1),
            ];
            Draw {
                order,
                factor,
                sigma: rng.uniform(0.1, 2.0),
            }
        })
        .collect()
}

/// Working buffers, reused across iterations as the processor reuses its own.
#[derive(Default)]
struct Scratch {
    bytes: Vec<u8>,
    floats: Vec<f32>,
    kx: Vec<f32>,
    ky: Vec<f32>,
}

type Op = fn(&Kernels, &mut [u8], &Draw, &mut Scratch);

fn ops() -> Vec<(&'static str, Op)> {
    vec![
        ("copy", |_, _, _, _| {}),
        ("brightness", |k, px, d, _| (k.brightness)(px, d.factor[0])),
        ("contrast", |k, px, d, _| (k.contrast)(px, d.factor[1])),
        ("saturation", |k, px, d, _| (k.saturation)(px, d.factor[2])),
        ("hue", |k, px, d, _| (k.hue)(px, d.factor[3])),
        ("color_jitter", |k, px, d, _| {
            let fns = [k.brightness, k.contrast, k.saturation, k.hue];
            for i in d.order {
                fns[i](px, d.factor[i]);
            }
        }),
        ("gaussian_blur_k23", |k, px, d, s| {
            (k.blur)(
                px,
                SIZE,
                SIZE,
                (23, 23),
                (d.sigma, d.sigma),
                &mut s.floats,
                &mut s.kx,
                &mut s.ky,
            )
        }),
        ("gaussian_blur_k9", |k, px, _, s| {
            (k.blur)(px, SIZE, SIZE, (9, 9), (1.0, 1.0), &mut s.floats, &mut s.kx, &mut s.ky)
        }),
        ("sharpness", |k, px, _, s| {
            (k.sharpness)(px, SIZE, SIZE, 2.0, &mut s.bytes)
        }),
    ]
}

fn benches(c: &mut Criterion) {
    let photo = ringfeed_benches::photo_224();
    let draws = draws();
    let mut g = c.benchmark_group("photometric");
    g.throughput(Throughput::Elements(1));
    for (name, op) in ops() {
        for (which, kernels) in [("old", &OLD), ("new", &NEW)] {
            let mut px = photo.clone();
            let mut scratch = Scratch::default();
            let mut i = 0usize;
            g.bench_function(format!("{name}/{which}"), |b| {
                b.iter(|| {
                    px.copy_from_slice(&photo);
                    op(kernels, &mut px, &draws[i % draws.len()], &mut scratch);
                    i += 1;
                    std::hint::black_box(&px);
                })
            });
            if name == "copy" {
                break;
            }
        }
    }
    g.finish();
}

criterion_group! {
    name = photometric_benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(3)).warm_up_time(std::time::Duration::from_millis(500));
    targets = benches
}
criterion_main!(photometric_benches);
