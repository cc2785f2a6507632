//! No heap allocation per sample on the hot path once warm (`ops` module docs): a counting
//! global allocator around `Processor::process`, for every transform and layout.
//!
//! A binary of its own (not a module of `tests/it`), so that the counting allocator slows no
//! other test down. It counts the calling thread's allocations only, so the test harness's
//! threads do not disturb it. libjpeg-turbo's own `malloc`s (about ten small tables per image,
//! out of reach through the TurboJPEG API) are not Rust allocations and are not seen here.

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::cell::Cell;

use ringfeed::codec::Limits;
use ringfeed::ops::{Layout, Processor, SampleRng, Transform};

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
        let mut d = ringfeed::codec::Decoder::new(Limits::default()).expect("decoder");
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
