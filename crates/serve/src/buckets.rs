//! 1.10: aspect-ratio buckets (control.md, "Aspect-ratio buckets (1.10)"): each sample's size,
//! read from its image header without decoding, and the bucket it goes to.
//!
//! The sizes are probed once per open dataset, on a few threads, while the client gets
//! `opening` progress (`listed`: headers probed), and kept as long as a stream holds the
//! dataset, so later streams over it (another rank on the node, a reconnect) assign at once.
//! `images::assign_buckets` drives it. Sizes are EXIF-oriented: an image whose orientation swaps its sides (5–8) is `H×W`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use ringfeed_ops::spec::AspectBuckets;
use ringfeed_source::Source;

/// A bucketed stream's buckets: the op, every sample's oriented size and its bucket.
#[derive(Debug)]
pub struct Buckets {
    pub spec: AspectBuckets,
    /// `(width, height)` by dataset index, oriented; `(0, 0)` for a header that could not be
    /// read (under `on_error = skip`: the sample fails again when it is due, and is skipped).
    pub sizes: Arc<Vec<(u32, u32)>>,
    /// The bucket of each sample, by dataset index.
    pub of: Arc<Vec<u32>>,
}

impl Buckets {
    /// The bucket `(h, w)` of number `b`.
    pub fn size(&self, b: u32) -> (u32, u32) {
        self.spec.sizes[b as usize]
    }
}

/// Probed sizes of the open sources, by source (an entry goes when its source does).
pub type SizeCache = Mutex<Vec<(Weak<dyn Source>, Arc<Vec<(u32, u32)>>)>>;

/// The oriented size of every sample, a contiguous range per thread; `(0, 0)` where the
/// sample cannot be read or its header probed.
pub(crate) fn probe_on(
    source: &Arc<dyn Source>,
    limits: ringfeed_decode::Limits,
    threads: usize,
    done: &AtomicU64,
    cancel: &AtomicBool,
) -> Vec<(u32, u32)> {
    let n = source.len() as usize;
    let mut out = vec![(0u32, 0u32); n];
    let chunk = n.div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for part in out.chunks_mut(chunk).enumerate() {
            let (k, part) = part;
            scope.spawn(move || {
                let Ok(mut decoder) = ringfeed_decode::Decoder::new(limits) else {
                    return;
                };
                for (j, slot) in part.iter_mut().enumerate() {
                    if cancel.load(Ordering::Relaxed) {
                        return;
                    }
                    let index = (k * chunk + j) as u64;
                    let _ = source.with_sample(index, &mut |sample| {
                        if let Ok(info) = decoder.probe(sample.data) {
                            *slot = if (5..=8).contains(&info.orientation) {
                                (info.height, info.width)
                            } else {
                                (info.width, info.height)
                            };
                        }
                    });
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    out
}
