//! Aspect-ratio buckets (control.md, "Aspect-ratio buckets (1.10)"): the bucket list, which
//! bucket an image of a given size goes to, and the covering resize; the op itself is
//! `spec::AspectBuckets`, whose `head` (in the crate root) makes an image's resize and crop.
//!
//! Everything here works on sizes alone, so the server assigns buckets from image headers,
//! before any pixel is decoded. The rules, exactly:
//! - **Buckets.** For every height `h = k·step ≤ 4096` (`k ≥ 1`), the width
//!   `w = ⌊area / (h·step)⌋·step` (the widest multiple of `step` with `h·w ≤ area`); the pair
//!   `(h, w)` and its transpose `(w, h)` are buckets when both sides are in `step ..= 4096` and
//!   `min_ratio ≤ width/height ≤ max_ratio` (so the list is symmetric where the bounds are, as
//!   SDXL's is). Without repeats, sorted by ratio `width/height` ascending, equal ratios by height
//!   descending; a bucket's number is its place in that list.
//! - **Nearest bucket.** An image of (EXIF-oriented) `W×H` goes to the bucket `b` that minimises
//!   `|ln(W/H) − ln(w_b/h_b)|` (in `f64`); on a tie, the lower number (the taller bucket).
//! - **Cover.** With `W·h ≥ w·H` (the image is at least as wide as the bucket) the image is
//!   resized to `(h, ⌊W·h/H⌋)`, otherwise to `(⌊H·w/W⌋, w)`: both sides at least the bucket's.
//!   This is torchvision's `Resize((nh, nw), interpolation, antialias)`.
//! - **Crop.** `random`: `RandomCrop((h, w))` on the resized image (top, then left, as
//!   `RandomCrop.make_params` draws them); `center`: `CenterCrop((h, w))`. The offsets, in the
//!   resized image, are the sample's `crop_top_left`.

use crate::MAX_SIZE;

/// Where a bucket's crop is taken from the covering resize.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BucketCrop {
    /// `RandomCrop`: offsets drawn from the image's generator.
    Random,
    /// `CenterCrop`.
    Center,
}

/// The buckets of `(area, min_ratio, max_ratio, step)`, `(h, w)` in bucket order (module docs).
/// Empty when none fits.
pub fn sizes_of(area: u64, min_ratio: f64, max_ratio: f64, step: u32) -> Vec<(u32, u32)> {
    let s = u64::from(step.max(1));
    let max = u64::from(MAX_SIZE);
    let mut out: Vec<(u32, u32)> = Vec::new();
    let mut h = max / s * s;
    while h >= s {
        let w = area / (h * s) * s;
        for (bh, bw) in [(h, w), (w, h)] {
            let ratio = bw as f64 / bh as f64;
            let sides = (s..=max).contains(&bh) && (s..=max).contains(&bw);
            if sides && ratio >= min_ratio && ratio <= max_ratio {
                out.push((bh as u32, bw as u32));
            }
        }
        h -= s;
    }
    // Ratio ascending (exact: cross products), then height descending.
    out.sort_by(|a, b| {
        (u64::from(a.1) * u64::from(b.0))
            .cmp(&(u64::from(b.1) * u64::from(a.0)))
            .then(b.0.cmp(&a.0))
    });
    out.dedup();
    out
}

/// The number of the bucket nearest to a `width`×`height` image's aspect ratio (module docs);
/// `sizes` is not empty.
pub fn nearest(sizes: &[(u32, u32)], width: u32, height: u32) -> u32 {
    let r = (f64::from(width.max(1)) / f64::from(height.max(1))).ln();
    let mut best = 0u32;
    let mut best_d = f64::INFINITY;
    for (k, &(h, w)) in sizes.iter().enumerate() {
        let d = (r - (f64::from(w) / f64::from(h)).ln()).abs();
        if d < best_d {
            best_d = d;
            best = k as u32;
        }
    }
    best
}

/// The covering resize of a `width`×`height` image for bucket `(h, w)`: `(nh, nw)`, both at
/// least the bucket's (module docs).
pub fn cover((h, w): (u32, u32), width: u32, height: u32) -> (u32, u32) {
    let (iw, ih) = (u64::from(width.max(1)), u64::from(height.max(1)));
    let (h, w) = (u64::from(h), u64::from(w));
    let (nh, nw) = if iw * h >= w * ih {
        (h, (iw * h / ih).max(w))
    } else {
        ((ih * w / iw).max(h), w)
    };
    (nh.min(u64::from(u32::MAX)) as u32, nw.min(u64::from(u32::MAX)) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdxl_buckets_are_in_the_list() {
        let sizes = sizes_of(1024 * 1024, 0.5, 2.0, 64);
        for b in [
            (1024, 1024),
            (1152, 896),
            (896, 1152),
            (1216, 832),
            (832, 1216),
            (1344, 768),
            (768, 1344),
        ] {
            assert!(sizes.contains(&b), "{b:?} missing from {sizes:?}");
        }
        assert!(
            sizes.windows(2).all(|p| p[0].1 * p[1].0 <= p[1].1 * p[0].0),
            "ascending ratio"
        );
        assert!(
            sizes
                .iter()
                .all(|&(h, w)| h * w <= 1024 * 1024 && h % 64 == 0 && w % 64 == 0)
        );
    }

    #[test]
    fn nearest_and_cover() {
        let sizes = vec![(128, 64), (64, 64), (64, 128)];
        assert_eq!(nearest(&sizes, 100, 190), 0);
        assert_eq!(nearest(&sizes, 100, 100), 1);
        assert_eq!(nearest(&sizes, 300, 100), 2);
        assert_eq!(cover((64, 128), 300, 100), (64, 192));
        assert_eq!(cover((64, 128), 150, 100), (85, 128));
        assert_eq!(cover((64, 64), 64, 64), (64, 64));
    }
}
