//! Each per-image op at 224×224, as the server runs it (`Processor::run`): the op after a crop
//! of a decoded 224×224 image, beside the crop alone (`ops/crop_only`), so an op's own cost is
//! its time minus that baseline. The source is an uncompressed PPM, so decoding is a copy and
//! the op dominates. Probabilities are 1 and ranges degenerate where that makes the op run every
//! time; the policies draw as they would in training.
//!
//! `cargo bench -p ringfeed-benches --bench ops`; results under `benches/results/`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ringfeed_decode::Limits;
use ringfeed_ops::{BufferSink, Layout, Pipeline, Processor, Trace};
use ringfeed_order::rng::SampleRng;
use serde_json::{Value, json};

/// A 224×224 PPM of the benches' picture.
fn ppm() -> Vec<u8> {
    let mut out = b"P6\n224 224\n255\n".to_vec();
    out.extend_from_slice(&ringfeed_benches::photo_224());
    out
}

fn ops() -> Vec<(&'static str, Value)> {
    vec![
        ("crop_only", json!(null)),
        ("horizontal_flip", json!({"op": "horizontal_flip", "p": 1.0})),
        ("vertical_flip", json!({"op": "vertical_flip", "p": 1.0})),
        ("brightness", json!({"op": "color_jitter", "brightness": [1.3, 1.3]})),
        ("contrast", json!({"op": "color_jitter", "contrast": [1.3, 1.3]})),
        ("saturation", json!({"op": "color_jitter", "saturation": [1.3, 1.3]})),
        ("hue", json!({"op": "color_jitter", "hue": [0.1, 0.1]})),
        (
            "color_jitter",
            json!({"op": "color_jitter", "brightness": [0.6, 1.4], "contrast": [0.6, 1.4], "saturation": [0.6, 1.4], "hue": [-0.1, 0.1]}),
        ),
        ("grayscale", json!({"op": "grayscale", "p": 1.0})),
        (
            "gaussian_blur_k9",
            json!({"op": "gaussian_blur", "kernel_size": [9], "sigma": [1.0, 1.0]}),
        ),
        // torchvision's GaussianBlur(23) with its default sigma range, drawn per image.
        (
            "gaussian_blur_k23",
            json!({"op": "gaussian_blur", "kernel_size": [23], "sigma": [0.1, 2.0]}),
        ),
        ("solarize", json!({"op": "solarize", "threshold": 128, "p": 1.0})),
        ("posterize", json!({"op": "posterize", "bits": 4, "p": 1.0})),
        ("autocontrast", json!({"op": "autocontrast", "p": 1.0})),
        ("equalize", json!({"op": "equalize", "p": 1.0})),
        (
            "adjust_sharpness",
            json!({"op": "adjust_sharpness", "sharpness_factor": 2.0, "p": 1.0}),
        ),
        ("invert", json!({"op": "invert", "p": 1.0})),
        (
            "rotate_nearest",
            json!({"op": "rand_augment", "num_ops": 1, "magnitude": 20}),
        ),
        ("trivial_augment_wide", json!({"op": "trivial_augment_wide"})),
        ("rand_augment", json!({"op": "rand_augment"})),
        ("auto_augment", json!({"op": "auto_augment"})),
        ("resize_to_160", json!({"op": "resize", "size": [160, 160]})),
        (
            "random_crop_pad",
            json!({"op": "random_crop", "size": [224, 224], "padding": [16]}),
        ),
    ]
}

fn benches(c: &mut Criterion) {
    let data = ppm();
    let mut p = Processor::new(Limits::default()).expect("processor");
    let mut g = c.benchmark_group("ops");
    g.throughput(Throughput::Elements(1));
    for (name, op) in ops() {
        let mut list = vec![json!({"op": "center_crop", "size": [224, 224]})];
        if !op.is_null() {
            list.push(op);
        }
        // A resize to 160 must still end in the declared size: it does (exact size).
        let pipeline = Pipeline::parse(&json!({"views": [{"ops": list}]})).expect("pipeline");
        let mut sink = BufferSink::for_pipeline(&pipeline);
        let mut index = 0u64;
        g.bench_function(name, |b| {
            b.iter(|| {
                index += 1;
                p.run(
                    &data,
                    &pipeline,
                    SampleRng::new(0, 0, index),
                    Layout::Nhwc,
                    &mut sink,
                    &mut Trace::off(),
                )
                .expect("runs")
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = ops_benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(2)).warm_up_time(std::time::Duration::from_millis(500));
    targets = benches
}
criterion_main!(ops_benches);
