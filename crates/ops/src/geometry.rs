//! Where each transform samples the source image: torchvision's arithmetic, ported exactly
//! (Python's `round` is round-half-to-even, `int()` truncates), with our generator in place of
//! torch's.

use super::spec::ResizeTo;
use ringfeed_order::rng::SampleRng;

/// Python's `round(x)` for a float: ties go to the even integer.
#[inline]
pub(super) fn round_py(x: f64) -> f64 {
    x.round_ties_even()
}

/// torchvision's `RandomResizedCrop.get_params` (v1 and v2 alike) on a `width`×`height` image,
/// with random numbers from `rng`. Returns `(top, left, height, width)` of the crop.
///
/// Up to ten tries: an area fraction uniform in `scale`, a log-uniform aspect ratio in
/// `ratio`, `w = round(sqrt(area * ar))`, `h = round(sqrt(area / ar))`; the first that fits
/// draws `top` uniform in `0..=height - h`, then `left` in `0..=width - w`. If none fits: the
/// largest centred crop whose aspect ratio is clamped into `ratio`. Draw order and arithmetic
/// follow torchvision, so the distribution is the same; only the generator differs.
///
/// Where torchvision would return an empty crop (an extreme `ratio` on a thin image) the side
/// is clamped to one pixel; a zero-sized image gives an empty crop. Never panics.
pub fn random_resized_crop_params(
    width: u32,
    height: u32,
    scale: (f64, f64),
    ratio: (f64, f64),
    rng: &mut SampleRng,
) -> (u32, u32, u32, u32) {
    if width == 0 || height == 0 {
        return (0, 0, height, width);
    }
    let (fw, fh) = (f64::from(width), f64::from(height));
    let area = fw * fh;
    let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target_area = area * rng.uniform(scale.0, scale.1);
        let aspect_ratio = rng.uniform(log_lo, log_hi).exp();
        let w = round_py((target_area * aspect_ratio).sqrt());
        let h = round_py((target_area / aspect_ratio).sqrt());
        // Compared as floats first: NaN and huge values fail here instead of wrapping.
        if 0.0 < w && w <= fw && 0.0 < h && h <= fh {
            let (w, h) = (w as u32, h as u32);
            let top = rng.below(u64::from(height - h) + 1) as u32;
            let left = rng.below(u64::from(width - w) + 1) as u32;
            return (top, left, h, w);
        }
    }
    // Fallback to a central crop.
    let in_ratio = fw / fh;
    let (min_ratio, max_ratio) = (ratio.0.min(ratio.1), ratio.0.max(ratio.1));
    let (w, h) = if in_ratio < min_ratio {
        (width, clamp_side(round_py(fw / min_ratio), height))
    } else if in_ratio > max_ratio {
        (clamp_side(round_py(fh * max_ratio), width), height)
    } else {
        (width, height)
    };
    ((height - h) / 2, (width - w) / 2, h, w)
}

/// `v` as a side length in `1..=limit` (`limit >= 1`); NaN gives `limit`.
fn clamp_side(v: f64, limit: u32) -> u32 {
    if v.is_nan() {
        limit
    } else {
        v.clamp(1.0, f64::from(limit)) as u32
    }
}

/// torchvision's `Resize(s)` output size for a `width`×`height` image: the shorter side
/// becomes `s`, the longer `int(s * long / short)` (truncated). Returns `(width, height)`.
pub fn resize_shorter(width: u32, height: u32, s: u32) -> (u32, u32) {
    let (short, long) = if width <= height {
        (width, height)
    } else {
        (height, width)
    };
    if short == 0 {
        return (width, height);
    }
    // `s * long` is exact in f64 and the division is correctly rounded, as in Python.
    let new_long = (f64::from(s) * f64::from(long) / f64::from(short)) as u32;
    if width <= height { (s, new_long) } else { (new_long, s) }
}

/// torchvision's `Resize(size, max_size)` output size for a `width`×`height` image (its
/// `_compute_resized_output_size`): the shorter side to `s` and the longer truncated, then, if
/// the longer exceeds `max_size`, the longer to `max_size` and the shorter
/// `int(max_size * short / long)`; or exactly `(h, w)`. Never 0. Returns `(width, height)`.
pub fn resize_target(width: u32, height: u32, size: ResizeTo, max_size: Option<u32>) -> (u32, u32) {
    match size {
        ResizeTo::Exact(h, w) => (w, h),
        ResizeTo::Shorter(s) => {
            let (mut w, mut h) = resize_shorter(width, height, s);
            if let Some(m) = max_size {
                let (short, long) = if width <= height { (w, h) } else { (h, w) };
                if long > m {
                    let new_short = (f64::from(m) * f64::from(short) / f64::from(long)) as u32;
                    (w, h) = if width <= height {
                        (new_short, m)
                    } else {
                        (m, new_short)
                    };
                }
            }
            (w.max(1), h.max(1))
        }
    }
}

/// Rounds of RandomIoUCrop's outer loop before it gives up and leaves the image as it is:
/// torchvision loops until an option `>= 1` is drawn or a crop fits, forever when neither can
/// happen (a deliberate difference: a sample never hangs a worker).
const IOU_ROUNDS: u32 = 1000;

/// torchvision v2's `RandomIoUCrop.make_params` on a `w`×`h` image with `boxes` (xyxy, `f32`):
/// `(top, left, height, width)` of the crop, or `None` to leave the image as it is (an option
/// `>= 1` was drawn; no boxes, where torchvision draws until it draws such an option; or
/// [`IOU_ROUNDS`] rounds without a crop). Per round: an option uniform over `options`; then up
/// to `trials` tries of two factors in `scale` (`new_w = int(w · r0)`, `new_h = int(h · r1)`,
/// in `f32` as torch's), kept when the aspect ratio is in `aspect`, then two more draws place
/// the crop (`left = int((w - new_w) · r0)`), kept when it is not empty, some box's centre lies
/// strictly inside it, and the best IoU of those boxes with it reaches the option.
pub(super) fn random_iou_crop_params(
    (w, h): (u32, u32),
    boxes: &[[f32; 4]],
    (scale, aspect, options, trials): ((f64, f64), (f64, f64), &[f64], u32),
    rng: &mut SampleRng,
) -> Option<(i64, i64, u32, u32)> {
    if boxes.is_empty() || options.is_empty() {
        return None;
    }
    let (s0, ds) = (scale.0 as f32, (scale.1 - scale.0) as f32);
    let (wf, hf) = (w as f32, h as f32);
    for _ in 0..IOU_ROUNDS {
        let min_iou = options[rng.below(options.len() as u64) as usize];
        if min_iou >= 1.0 {
            return None;
        }
        for _ in 0..trials {
            let r0 = s0 + ds * rng.uniform(0.0, 1.0) as f32;
            let r1 = s0 + ds * rng.uniform(0.0, 1.0) as f32;
            let (new_w, new_h) = ((wf * r0) as i64, (hf * r1) as i64);
            if new_h == 0 {
                // torchvision would divide by zero here; no crop of no rows can be kept.
                continue;
            }
            let ar = new_w as f64 / new_h as f64;
            if !(aspect.0 <= ar && ar <= aspect.1) {
                continue;
            }
            let u0 = rng.uniform(0.0, 1.0) as f32;
            let u1 = rng.uniform(0.0, 1.0) as f32;
            let left = ((i64::from(w) - new_w) as f32 * u0) as i64;
            let top = ((i64::from(h) - new_h) as f32 * u1) as i64;
            let (right, bottom) = (left + new_w, top + new_h);
            if left == right || top == bottom {
                continue;
            }
            let c = [left as f32, top as f32, right as f32, bottom as f32];
            let mut any = false;
            let mut best = f32::NEG_INFINITY;
            for b in boxes.iter().filter(|b| centred_in(b, &c)) {
                any = true;
                best = best.max(iou(b, &c));
            }
            if !any || f64::from(best) < min_iou {
                continue;
            }
            return Some((top, left, new_h as u32, new_w as u32));
        }
    }
    None
}

/// Whether the centre of box `b` lies strictly inside the crop `c` (both xyxy), torchvision's
/// `is_within_crop_area`.
pub(super) fn centred_in(b: &[f32; 4], c: &[f32; 4]) -> bool {
    let (cx, cy) = (0.5 * (b[0] + b[2]), 0.5 * (b[1] + b[3]));
    c[0] < cx && cx < c[2] && c[1] < cy && cy < c[3]
}

/// torchvision's `box_iou` of two xyxy boxes, in `f32`.
fn iou(a: &[f32; 4], b: &[f32; 4]) -> f32 {
    let area = |x: &[f32; 4]| (x[2] - x[0]) * (x[3] - x[1]);
    let iw = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let ih = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = iw * ih;
    inter / (area(a) + area(b) - inter)
}

/// torchvision v2's `RandomZoomOut.make_params` on a `w`×`h` image (after its coin): a factor
/// `r` in `side_range` (`f32`), the canvas `int(w · r)`×`int(h · r)`, and the image's place in
/// it, `left = int((canvas_w - w) · u)`. Returns `[left, top, right, bottom]` padding.
pub(super) fn random_zoom_out_padding((w, h): (u32, u32), side_range: (f64, f64), rng: &mut SampleRng) -> [u32; 4] {
    let r = side_range.0 as f32 + rng.uniform(0.0, 1.0) as f32 * (side_range.1 - side_range.0) as f32;
    let cw = ((w as f32 * r) as u32).max(w);
    let ch = ((h as f32 * r) as u32).max(h);
    let u0 = rng.uniform(0.0, 1.0) as f32;
    let u1 = rng.uniform(0.0, 1.0) as f32;
    let left = ((cw - w) as f32 * u0) as u32;
    let top = ((ch - h) as f32 * u1) as u32;
    [left, top, cw - w - left, ch - h - top]
}

/// torchvision v2's `ScaleJitter.make_params` on a `w`×`h` image: a factor in `scale` (`f32`),
/// `r = min(target_h / h, target_w / w) · factor`, the size `int(w · r)`×`int(h · r)` (at least
/// one pixel). Returns `(width, height)`.
pub(super) fn scale_jitter_size(
    (w, h): (u32, u32),
    (th, tw): (u32, u32),
    scale: (f64, f64),
    rng: &mut SampleRng,
) -> (u32, u32) {
    let factor = scale.0 as f32 + rng.uniform(0.0, 1.0) as f32 * (scale.1 - scale.0) as f32;
    let base = (f64::from(th) / f64::from(h)).min(f64::from(tw) / f64::from(w));
    let r = base as f32 * factor;
    (((w as f32 * r) as u32).max(1), ((h as f32 * r) as u32).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_rounding() {
        assert_eq!(round_py(0.5), 0.0);
        assert_eq!(round_py(1.5), 2.0);
        assert_eq!(round_py(2.5), 2.0);
        assert_eq!(round_py(2.5000001), 3.0);
    }

    #[test]
    fn resize_shorter_matches_torchvision() {
        // torchvision.transforms.v2.functional._geometry._compute_resized_output_size
        assert_eq!(resize_shorter(500, 375, 256), (341, 256)); // int(256 * 500 / 375) = 341
        assert_eq!(resize_shorter(375, 500, 256), (256, 341));
        assert_eq!(resize_shorter(256, 256, 224), (224, 224));
        assert_eq!(resize_shorter(640, 427, 256), (383, 256)); // 383.7 truncated
        assert_eq!(resize_shorter(3, 1000, 4096), (4096, 1365333));
    }

    #[test]
    fn max_size_caps_the_longer_side() {
        let s = ResizeTo::Shorter(256);
        assert_eq!(resize_target(500, 375, s, None), (341, 256));
        // 341 > 300: longer 300, shorter int(300 * 256 / 341) = 225.
        assert_eq!(resize_target(500, 375, s, Some(300)), (300, 225));
        assert_eq!(resize_target(375, 500, s, Some(300)), (225, 300));
        assert_eq!(resize_target(375, 500, ResizeTo::Exact(10, 20), None), (20, 10));
        assert_eq!(resize_target(1, 5000, ResizeTo::Shorter(1), Some(2)), (1, 2));
    }

    #[test]
    fn fallback_clamps_the_aspect_ratio() {
        // scale so small the tries never fit is impossible; force the fallback with a ratio
        // range the image cannot meet: a 1000x10 strip and ratio 1..=2.
        let mut rng = SampleRng::new(0, 0, 0);
        let (top, left, h, w) = random_resized_crop_params(1000, 10, (0.9, 1.0), (1.0, 2.0), &mut rng);
        assert_eq!((top, left, h, w), (0, 490, 10, 20));
        // Tall strip: w = width, h = round(w / min_ratio).
        let (top, left, h, w) = random_resized_crop_params(10, 1000, (0.9, 1.0), (0.5, 2.0), &mut rng);
        assert_eq!((top, left, h, w), (490, 0, 20, 10));
        // Degenerate ratios never give an empty crop.
        let (_, _, h, w) = random_resized_crop_params(1, 5, (0.9, 1.0), (1000.0, 1000.0), &mut rng);
        assert_eq!((h, w), (1, 1));
        let (_, _, h, w) = random_resized_crop_params(5, 1, (0.9, 1.0), (1e-3, 1e-3), &mut rng);
        assert_eq!((h, w), (1, 1));
        assert_eq!(
            random_resized_crop_params(0, 7, (0.1, 1.0), (1.0, 1.0), &mut rng),
            (0, 0, 7, 0)
        );
    }

    #[test]
    fn params_always_fit() {
        let mut rng = SampleRng::new(3, 1, 4);
        for (w, h) in [(1, 1), (1, 9), (9, 1), (500, 375), (17, 4000), (4000, 17), (2, 3)] {
            for _ in 0..2000 {
                let (t, l, ch, cw) = random_resized_crop_params(w, h, (0.08, 1.0), (0.75, 4.0 / 3.0), &mut rng);
                assert!(
                    ch >= 1 && cw >= 1 && t + ch <= h && l + cw <= w,
                    "{w}x{h}: {t} {l} {ch} {cw}"
                );
            }
        }
        // Nonsense numbers still give a valid crop.
        for scale in [(f64::NAN, 1.0), (0.5, f64::INFINITY), (-1.0, 0.0)] {
            for ratio in [(f64::NAN, 1.0), (0.0, f64::INFINITY), (1e300, 1e300)] {
                let (t, l, ch, cw) = random_resized_crop_params(50, 40, scale, ratio, &mut rng);
                assert!(ch >= 1 && cw >= 1 && t + ch <= 40 && l + cw <= 50);
            }
        }
    }

    #[test]
    fn iou_crops_keep_a_centred_box_of_enough_overlap() {
        let mut rng = SampleRng::new(4, 0, 0);
        let boxes = [[10.0f32, 10.0, 30.0, 40.0], [60.0, 5.0, 90.0, 20.0]];
        let params = ((0.3, 1.0), (0.5, 2.0), &[0.5][..], 40);
        let mut found = 0;
        for _ in 0..200 {
            let Some((t, l, h, w)) = random_iou_crop_params((100, 50), &boxes, params, &mut rng) else {
                continue;
            };
            found += 1;
            assert!(t >= 0 && l >= 0 && t + i64::from(h) <= 50 && l + i64::from(w) <= 100);
            let c = [l as f32, t as f32, (l + i64::from(w)) as f32, (t + i64::from(h)) as f32];
            assert!(boxes.iter().any(|b| centred_in(b, &c) && iou(b, &c) >= 0.5), "{c:?}");
        }
        assert!(found > 150, "{found}");
        // No boxes, or an option of 1 or more: the image as it is.
        assert_eq!(random_iou_crop_params((100, 50), &[], params, &mut rng), None);
        let keep = ((0.3, 1.0), (0.5, 2.0), &[1.0][..], 40);
        assert_eq!(random_iou_crop_params((100, 50), &boxes, keep, &mut rng), None);
        // An impossible overlap gives up instead of looping forever.
        let never = ((0.9, 0.9), (0.5, 2.0), &[0.99][..], 2);
        assert_eq!(random_iou_crop_params((100, 50), &boxes, never, &mut rng), None);
    }

    #[test]
    fn zoom_out_and_scale_jitter_sizes() {
        let mut rng = SampleRng::new(1, 0, 0);
        for _ in 0..500 {
            let [l, t, r, b] = random_zoom_out_padding((40, 30), (1.0, 4.0), &mut rng);
            let (cw, ch) = (40 + l + r, 30 + t + b);
            assert!((40..=160).contains(&cw) && (30..=120).contains(&ch));
            // One factor for both sides: the canvas keeps the aspect ratio (up to truncation).
            assert!((f64::from(cw) / 40.0 - f64::from(ch) / 30.0).abs() < 0.05);
            let (w, h) = scale_jitter_size((400, 300), (60, 100), (0.5, 2.0), &mut rng);
            // min(60 / 300, 100 / 400) = 0.2, times 0.5..2.
            assert!((40..=160).contains(&w) && (30..=120).contains(&h), "{w}x{h}");
        }
    }
}
