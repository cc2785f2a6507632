//! No heap allocation per sample on the hot path once warm (`ops` module docs): a counting
//! global allocator around `Processor::process`, for every transform and layout.
//!
//! A binary of its own (not a module of `tests/it`), so that the counting allocator slows no
//! other test down. It counts the calling thread's allocations only, so the test harness's
//! threads do not disturb it. libjpeg-turbo's own `malloc`s (about ten small tables per image,
//! out of reach through the TurboJPEG API) are not Rust allocations and are not seen here.

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::cell::Cell;

use ringfeed_decode::Limits;
use ringfeed_ops::{Layout, Processor, Transform};
use ringfeed_order::rng::SampleRng;

/// The system allocator, counting the calls that hand out memory, per thread.
struct Counting;

thread_local! {
    /// Allocations of this thread (a `const` thread-local without a destructor: reading it
    /// never allocates).
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: during thread teardown the slot may be gone; those calls do not matter.
    let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
}

fn allocations() -> u64 {
    ALLOCS.with(Cell::get)
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; counting
// touches only a thread-local `Cell` and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        count();
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: AllocLayout) -> *mut u8 {
        count();
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: AllocLayout, new_size: usize) -> *mut u8 {
        count();
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

#[test]
fn process_allocates_nothing_once_warm() {
    use ringfeed_testkit::photo_jpeg;
    use turbojpeg::Subsamp;
    // As `ringfeed pack` stores them: restart markers every 2 MCUs, so a region decode cuts
    // out only the segments it needs (`codec/restart.rs`).
    let packed = |data: Vec<u8>| {
        let mut out = Vec::new();
        let mut d = ringfeed_decode::Decoder::new(Limits::default()).expect("decoder");
        d.add_restarts(&data, 2, &mut out).expect("decodes").expect("rewritten");
        out
    };
    let files = [
        photo_jpeg(640, 480, 1, Subsamp::Sub2x2),
        photo_jpeg(500, 375, 2, Subsamp::Sub2x2),
        packed(photo_jpeg(500, 375, 6, Subsamp::Sub2x2)),
        photo_jpeg(375, 500, 3, Subsamp::None),
        packed(photo_jpeg(375, 500, 7, Subsamp::None)),
        photo_jpeg(301, 233, 4, Subsamp::Sub2x1),
        photo_jpeg(97, 61, 5, Subsamp::Gray),
    ];
    let transforms = [
        Transform::random_resized_crop((224, 224)),
        Transform::CenterCrop {
            size: (224, 224),
            resize: 256,
        },
        Transform::Resize { size: (224, 224) },
    ];
    let layouts = [Layout::Nhwc, Layout::Nchw];
    let mut p = Processor::new(Limits::default()).expect("processor");
    let mut out = vec![0u8; 224 * 224 * 3];
    let mut run = |p: &mut Processor, data: &[u8], t: &Transform, layout: Layout, epoch: u64, index: u64| {
        p.process(data, t, &mut SampleRng::new(0, epoch, index), layout, &mut out)
            .expect("processes");
    };
    // Warm-up: every image whole (Resize: the largest region, and the largest restart cut),
    // and every transform and layout once.
    let before = allocations();
    for (i, data) in files.iter().enumerate() {
        for t in &transforms {
            for layout in layouts {
                run(&mut p, data, t, layout, u64::MAX, i as u64);
            }
        }
    }
    let warm_up = allocations() - before;
    // Then many samples: other images (some with restart markers), other crops, flips, both
    // layouts.
    let before = allocations();
    let mut samples = 0;
    for epoch in 0..8 {
        for (i, data) in files.iter().enumerate() {
            for t in &transforms {
                for layout in layouts {
                    run(&mut p, data, t, layout, epoch, i as u64);
                    samples += 1;
                }
            }
        }
    }
    let after = allocations() - before;
    eprintln!("warm-up: {warm_up} allocations; then {samples} samples: {after}");
    assert!(warm_up > 0, "the counting allocator counts nothing");
    assert_eq!(after, 0, "{after} heap allocations in {samples} samples once warm");
}

/// The same for op pipelines: every kind of per-image op (colour, tone, blur, the policies'
/// warps, a second resize), two views of several images, and erasing boxes.
#[test]
fn pipelines_allocate_nothing_once_warm() {
    use ringfeed_ops::{BufferSink, Pipeline, Trace};
    use ringfeed_testkit::photo_jpeg;
    use turbojpeg::Subsamp;
    let packed = |data: Vec<u8>| {
        let mut out = Vec::new();
        let mut d = ringfeed_decode::Decoder::new(Limits::default()).expect("decoder");
        d.add_restarts(&data, 2, &mut out).expect("decodes").expect("rewritten");
        out
    };
    let files = [
        photo_jpeg(640, 480, 1, Subsamp::Sub2x2),
        packed(photo_jpeg(500, 375, 6, Subsamp::Sub2x2)),
        photo_jpeg(375, 500, 3, Subsamp::None),
        photo_jpeg(97, 61, 5, Subsamp::Gray),
    ];
    let spec = serde_json::json!({"views": [
        {"name": "global", "count": 2, "ops": [
            {"op": "random_resized_crop", "size": [96, 96], "interpolation": "bicubic"},
            {"op": "horizontal_flip"},
            {"op": "color_jitter", "brightness": [0.6, 1.4], "contrast": [0.6, 1.4], "saturation": [0.6, 1.4], "hue": [-0.1, 0.1]},
            {"op": "grayscale", "p": 0.2},
            {"op": "gaussian_blur", "kernel_size": [9], "sigma": [0.1, 2.0]},
            {"op": "trivial_augment_wide"},
            {"op": "rand_augment", "num_ops": 2, "magnitude": 9, "interpolation": "bilinear", "fill": [128]},
            {"op": "auto_augment"},
            {"op": "random_choice", "ops": [{"op": "equalize"}, {"op": "autocontrast"}, {"op": "adjust_sharpness", "sharpness_factor": 2}]},
            {"op": "normalize", "mean": [0.5], "std": [0.5]},
            {"op": "random_erasing", "p": 0.9}]},
        {"name": "local", "count": 3, "ops": [
            {"op": "resize", "size": [80]},
            {"op": "random_crop", "size": [64, 64], "padding": [4], "pad_if_needed": true},
            {"op": "solarize", "threshold": 128},
            {"op": "posterize", "bits": 4},
            {"op": "invert"},
            {"op": "resize", "size": [48, 40], "interpolation": "nearest"},
            {"op": "vertical_flip"}]}]});
    let pipeline = Pipeline::parse(&spec).expect("pipeline");
    let mut p = Processor::new(Limits::default()).expect("processor");
    let mut sink = BufferSink::for_pipeline(&pipeline);
    let mut trace = Trace::off();
    let mut run = |p: &mut Processor, data: &[u8], layout: Layout, epoch: u64, index: u64| {
        p.run(
            data,
            &pipeline,
            SampleRng::new(0, epoch, index),
            layout,
            &mut sink,
            &mut trace,
        )
        .expect("runs");
    };
    let layouts = [Layout::Nhwc, Layout::Nchw];
    // Warm-up: enough draws that every policy op, size and branch has run at least once.
    let before = allocations();
    for epoch in 0..40 {
        for (i, data) in files.iter().enumerate() {
            for layout in layouts {
                run(&mut p, data, layout, 1000 + epoch, i as u64);
            }
        }
    }
    let warm_up = allocations() - before;
    let before = allocations();
    let mut samples = 0;
    for epoch in 0..6 {
        for (i, data) in files.iter().enumerate() {
            for layout in layouts {
                run(&mut p, data, layout, epoch, i as u64);
                samples += 1;
            }
        }
    }
    let after = allocations() - before;
    eprintln!("pipelines: warm-up {warm_up} allocations; then {samples} samples: {after}");
    assert!(warm_up > 0, "the counting allocator counts nothing");
    assert_eq!(after, 0, "{after} heap allocations in {samples} samples once warm");
}
