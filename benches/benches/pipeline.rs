//! Criterion micro-benchmarks of the hot path, one stage at a time, on generated 500x375 JPEGs
//! (4:2:0, quality 90, photographic-like noise):
//!
//! - `decode/full`: libjpeg-turbo decode of the whole image to RGB (the per-core limit);
//! - `decode/region`: decode of a 60 %-area crop only (`tj3SetCroppingRegion`);
//! - `decode/region_packed`: the same crop of the same images as `ringfeed pack` stores them
//!   (rewritten with restart markers, same pixels): only the segments covering it are decoded;
//! - `decode/crc32c_check`: the record checksum `check_crc` verifies per sample (on by default);
//! - `resize/crop_to_224`: our resampler (`ringfeed_decode::resample`) on a 387x290 crop box of a decoded
//!   image to 224x224, antialiased bilinear; `resize/crop_to_224_fir`: the same through
//!   fast_image_resize 6.1 (the baseline it replaced; same bytes). Likewise at other scales:
//!   `resize/upscale_to_224` (120x100), `resize/whole_to_224` (the whole 500x375 image) and
//!   `resize/large_crop_to_224` (1000x750 of a 2000x1500 image), each with its `_fir` twin;
//! - `transform/rrc224`: the whole per-sample path (`ops::Processor`, RandomResizedCrop + flip);
//!   `transform/rrc224_packed`: the same on the images as packed;
//! - `transform/ta_wide224_packed`: the full recipe's server share on the packed images,
//!   RandomResizedCrop + flip + TrivialAugmentWide (`Processor::run`; a new epoch per iteration,
//!   so each image draws another augmentation);
//! - `transform/rrc224_large_{exact,dct}`: the same on 2000x1500 sources, exact and with DCT scaling
//!   (`Options::dct_scaling`, default headroom 2), the only sources where it can engage;
//! - `ring/handoff`: writing a batch of 256 224x224x3 samples and the slot header into a
//!   pre-faulted ring slot (what the hand-off costs beyond the decode).
//!
//! `cargo bench -p ringfeed-benches --bench pipeline`

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use fast_image_resize as fr;
use ringfeed_decode::resample::{Resampler, SampleBox, Source, Target};
use ringfeed_decode::{Decoder, Limits, Rect};
use ringfeed_format::ring::{DType, FieldSpec, RingLayout, SlotHeader};
use ringfeed_ops::{BufferSink, Layout, Options, Pipeline, Processor, Trace, Transform};
use ringfeed_order::rng::SampleRng;
use ringfeed_serve::segment::Segment;

const W: usize = 500;
const H: usize = 375;

/// Seeded JPEGs with gradients, shapes and noise (about 3 bits per pixel).
fn corpus(n: u64) -> Vec<Vec<u8>> {
    corpus_sized(n, W, H)
}

/// [`corpus`] at another size (the disc stays where it is): `ringfeed_testkit::photo_jpeg`.
fn corpus_sized(n: u64, w: usize, h: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|seed| ringfeed_testkit::photo_jpeg(w, h, seed, turbojpeg::Subsamp::Sub2x2))
        .collect()
}

/// Benchmarks `name` (our resampler) and `{name}_fir` (fast_image_resize, the baseline it
/// replaced): `sample` of the packed RGB8 `(pixels, width, height)` to 224x224. Their bytes are
/// equal (checked here once).
fn resize_pair(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    (pixels, width, height): (&[u8], u32, u32),
    sample: SampleBox,
) {
    let mut resampler = Resampler::new();
    let mut ours = vec![0u8; 224 * 224 * 3];
    let mut ours_once = |ours: &mut [u8]| {
        let src = Source {
            pixels,
            width,
            height,
            bounds: Rect::full(width, height),
        };
        let dst = Target {
            pixels: ours,
            width: 224,
            height: 224,
            rect: Rect::full(224, 224),
        };
        resampler.resample(src, sample, dst).expect("resamples");
    };
    let src = fr::images::ImageRef::new(width, height, pixels, fr::PixelType::U8x3).expect("source view");
    let mut dst = fr::images::Image::new(224, 224, fr::PixelType::U8x3);
    let mut resizer = fr::Resizer::new();
    let opts = fr::ResizeOptions::new()
        .resize_alg(fr::ResizeAlg::Convolution(fr::FilterType::Bilinear))
        .crop(sample.left, sample.top, sample.width, sample.height);
    ours_once(&mut ours);
    resizer.resize(&src, &mut dst, &opts).expect("resizes");
    assert!(dst.buffer() == &ours[..], "{name}: ours and fir differ");
    g.bench_function(name, |b| b.iter(|| ours_once(&mut ours)));
    g.bench_function(format!("{name}_fir"), |b| {
        b.iter(|| resizer.resize(&src, &mut dst, &opts).expect("resizes"))
    });
}

fn benches(c: &mut Criterion) {
    let files = corpus(16);
    let n = files.len() as u64;

    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Elements(n));
    let mut decoder = Decoder::new(Limits::default()).expect("decoder");
    let mut buf = Vec::new();
    g.bench_function("full", |b| {
        b.iter(|| {
            for f in &files {
                decoder.decode_rgb8(f, &mut buf).expect("decodes");
            }
        })
    });
    let crop = Rect {
        left: 60,
        top: 45,
        width: 387,
        height: 290,
    };
    g.bench_function("region", |b| {
        b.iter(|| {
            for f in &files {
                decoder.decode_region_rgb8(f, crop, 1, &mut buf).expect("decodes");
            }
        })
    });
    let packed: Vec<Vec<u8>> = files
        .iter()
        .map(|f| {
            let mut out = Vec::new();
            let rewritten = decoder
                .add_restarts(f, ringfeed_decode::RESTART_TARGET_MCUS, &mut out)
                .expect("decodes");
            assert!(rewritten.is_some(), "a baseline JPEG is rewritten");
            out
        })
        .collect();
    g.bench_function("region_packed", |b| {
        b.iter(|| {
            for f in &packed {
                decoder.decode_region_rgb8(f, crop, 1, &mut buf).expect("decodes");
            }
        })
    });
    // What `check_crc` (on by default) adds per sample: CRC-32C of the record, in the same run
    // as the decode it accompanies.
    g.bench_function("crc32c_check", |b| {
        b.iter(|| files.iter().map(|f| crc32c::crc32c(f)).fold(0u32, |a, c| a ^ c))
    });
    g.finish();

    let mut g = c.benchmark_group("resize");
    g.throughput(Throughput::Elements(1));
    let decoded = {
        let mut v = Vec::new();
        decoder.decode_rgb8(&files[0], &mut v).expect("decodes");
        v
    };
    // The benchmark's crop, then other scales: an upscale, a whole image, and a 4.5x downscale
    // of a large source.
    let box_of = |left: f64, top: f64, width: f64, height: f64| SampleBox {
        left,
        top,
        width,
        height,
    };
    let source = (decoded.as_slice(), W as u32, H as u32);
    resize_pair(&mut g, "crop_to_224", source, box_of(60.0, 45.0, 387.0, 290.0));
    resize_pair(&mut g, "upscale_to_224", source, box_of(200.0, 150.0, 120.0, 100.0));
    resize_pair(&mut g, "whole_to_224", source, box_of(0.0, 0.0, W as f64, H as f64));
    let large = {
        let mut v = Vec::new();
        decoder
            .decode_rgb8(&corpus_sized(1, 2000, 1500)[0], &mut v)
            .expect("decodes");
        v
    };
    resize_pair(
        &mut g,
        "large_crop_to_224",
        (large.as_slice(), 2000, 1500),
        box_of(400.0, 300.0, 1000.0, 750.0),
    );
    g.finish();

    let mut g = c.benchmark_group("transform");
    g.throughput(Throughput::Elements(n));
    let mut processor = Processor::new(Limits::default()).expect("processor");
    let t = Transform::RandomResizedCrop {
        size: (224, 224),
        scale: (0.08, 1.0),
        ratio: (0.75, 4.0 / 3.0),
        flip: 0.5,
    };
    let mut out = vec![0u8; 224 * 224 * 3];
    let mut epoch = 0u64;
    g.bench_function("rrc224", |b| {
        b.iter(|| {
            epoch += 1;
            for (i, f) in files.iter().enumerate() {
                let mut rng = SampleRng::new(0, epoch, i as u64);
                processor
                    .process(f, &t, &mut rng, Layout::Nhwc, &mut out)
                    .expect("transforms");
            }
        })
    });
    let mut epoch = 0u64;
    g.bench_function("rrc224_packed", |b| {
        b.iter(|| {
            epoch += 1;
            for (i, f) in packed.iter().enumerate() {
                let mut rng = SampleRng::new(0, epoch, i as u64);
                processor
                    .process(f, &t, &mut rng, Layout::Nhwc, &mut out)
                    .expect("transforms");
            }
        })
    });
    // The full recipe's server share: RandomResizedCrop(224) + flip + TrivialAugmentWide, as
    // `ringfeed.Compose` sends it (Normalize and RandomErasing run in the client).
    let pipeline = Pipeline::parse(&serde_json::json!({"views": [{"ops": [
        {"op": "random_resized_crop", "size": [224, 224]},
        {"op": "horizontal_flip", "p": 0.5},
        {"op": "trivial_augment_wide"},
    ]}]}))
    .expect("pipeline");
    let mut sink = BufferSink::for_pipeline(&pipeline);
    let mut epoch = 0u64;
    g.bench_function("ta_wide224_packed", |b| {
        b.iter(|| {
            epoch += 1;
            for (i, f) in packed.iter().enumerate() {
                processor
                    .run(
                        f,
                        &pipeline,
                        SampleRng::new(0, epoch, i as u64),
                        Layout::Nhwc,
                        &mut sink,
                        &mut Trace::off(),
                    )
                    .expect("runs");
            }
        })
    });
    let large = corpus_sized(4, 2000, 1500);
    for (name, dct_scaling) in [("rrc224_large_exact", false), ("rrc224_large_dct", true)] {
        let options = Options {
            dct_scaling,
            ..Options::default()
        };
        let mut processor = Processor::with_options(Limits::default(), options).expect("processor");
        let mut epoch = 0u64;
        g.throughput(Throughput::Elements(large.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                epoch += 1;
                for (i, f) in large.iter().enumerate() {
                    let mut rng = SampleRng::new(0, epoch, i as u64);
                    processor
                        .process(f, &t, &mut rng, Layout::Nhwc, &mut out)
                        .expect("transforms");
                }
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("ring");
    g.throughput(Throughput::Elements(256));
    let fields = [
        FieldSpec {
            name: "image".into(),
            dtype: DType::U8,
            shape: vec![224, 224, 3],
        },
        FieldSpec {
            name: "label".into(),
            dtype: DType::I64,
            shape: vec![],
        },
    ];
    let segment = Segment::create(RingLayout::new(&fields, 256, 2).expect("layout"), "bench").expect("segment");
    let image = segment.layout().field("image").expect("image field").clone();
    let sample = vec![7u8; 224 * 224 * 3];
    g.bench_function("handoff", |b| {
        b.iter(|| {
            for j in 0..256u64 {
                let dst = segment.slot_ptr(1, image.offset + j * image.sample_bytes, image.sample_bytes);
                // SAFETY: slot 1 belongs to this benchmark alone; `dst` is valid for one sample.
                unsafe { std::ptr::copy_nonoverlapping(sample.as_ptr(), dst, sample.len()) };
            }
            let h = SlotHeader {
                seq: 1,
                run: 1,
                epoch: 0,
                batch: 0,
                count: 256,
                skipped: 0,
                height: 0,
                width: 0,
            };
            // SAFETY: as above, nothing else uses slot 1.
            unsafe { segment.write_slot_header(1, &h) };
        })
    });
    g.finish();
}

criterion_group! {
    name = pipeline;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(4));
    targets = benches
}
criterion_main!(pipeline);
