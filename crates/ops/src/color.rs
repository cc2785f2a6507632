//! Colour adjustments on packed RGB8 images, in place: torchvision v2's uint8 kernels
//! (`transforms/v2/functional/_color.py`), operation for operation in `f32` as torch computes
//! them, so the bytes agree (up to the order of a mean's summation).
//!
//! - `_blend(a, b, r) = trunc(clamp(a·r + b·(1 − r), 0, 255))`, in `f32`.
//! - brightness: `blend(x, 0, f)`; saturation: `blend(x, floor(gray), f)`; contrast:
//!   `blend(x, mean(floor(gray)), f)`; `gray = 0.2989 r + 0.587 g + 0.114 b`.
//! - hue: RGB → HSV (Pillow's formulas as torchvision writes them), `h = (h + f) mod 1`, back,
//!   then `trunc(v · 255.999)`.
//! - sharpness: `blend(x, round(3×3 [1 1 1; 1 5 1; 1 1 1] / 13 of x), f)` on the interior; the
//!   border rows and columns stay.
//! - grayscale: `trunc(gray)` in all three channels.
//!
//! The bytes are those of the scalar code these kernels replaced (`reference`, tested bit for
//! bit): the same `f32` steps in loops the compiler vectorises (`lanes`).

use crate::lanes::{dispatch, fmod1, round_even, to_u8, trunc};

/// torchvision's luma in `f32`, `r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114)`.
#[inline(always)]
fn luma(r: f32, g: f32, b: f32) -> f32 {
    r * 0.2989 + g * 0.587 + b * 0.114
}

/// `adjust_brightness(x, f)`: `blend(x, 0, f)`.
pub(super) fn brightness(px: &mut [u8], f: f64) {
    scale_add(px, f as f32, 0.0);
}

dispatch! {
    /// `trunc(clamp(x * r + add, 0, 255))` for every byte `x` of `px`: `_blend` with a constant
    /// second image (`add` = its value times `1 - ratio`, computed once as torch does per
    /// element; `+ 0.0` is exact).
    fn scale_add(px: &mut [u8], r: f32, add: f32) {
        for c in px.iter_mut() {
            *c = to_u8(f32::from(*c) * r + add);
        }
    }
}

/// `adjust_saturation(x, f)`.
pub(super) fn saturation(px: &mut [u8], f: f64) {
    saturation_lanes(px, f as f32, (1.0 - f) as f32);
}

dispatch! {
    /// [`saturation`] with `r = f` and `s = 1 - f` in `f32`.
    fn saturation_lanes(px: &mut [u8], r: f32, s: f32) {
        for p in px.chunks_exact_mut(3) {
            // A tuple, not `[..].map()`: the array's map kept this loop scalar.
            let (x0, x1, x2) = (f32::from(p[0]), f32::from(p[1]), f32::from(p[2]));
            // floor(luma) as a truncation: luma is in [0, 255).
            let g = f32::from(to_u8(luma(x0, x1, x2))) * s;
            p[0] = to_u8(x0 * r + g);
            p[1] = to_u8(x1 * r + g);
            p[2] = to_u8(x2 * r + g);
        }
    }
}

dispatch! {
    /// The sum of `floor(gray)` over the pixels of `px` (integers, so exact in any order).
    fn gray_sum(px: &[u8]) -> u64 {
        // u32 partial sums: 4096 pixels of at most 255.
        px.chunks(3 * 4096)
            .map(|part| {
                let s: u32 =
                    part.chunks_exact(3).map(|p| u32::from(to_u8(luma(f32::from(p[0]), f32::from(p[1]), f32::from(p[2]))))).sum();
                u64::from(s)
            })
            .sum()
    }
}

/// `adjust_contrast(x, f)`: `blend(x, mean(floor(gray)), f)`.
pub(super) fn contrast(px: &mut [u8], f: f64) {
    let n = px.len() / 3;
    if n == 0 {
        return;
    }
    let mean = (gray_sum(px) as f64 / n as f64) as f32;
    scale_add(px, f as f32, mean * (1.0 - f) as f32);
}

dispatch! {
    /// `rgb_to_grayscale(x, num_output_channels=3)`.
    pub(super) fn grayscale(px: &mut [u8]) {
        for p in px.chunks_exact_mut(3) {
            let l = to_u8(luma(f32::from(p[0]), f32::from(p[1]), f32::from(p[2])));
            p.fill(l);
        }
    }
}

/// `adjust_hue(x, f)`, `f` in `-0.5..=0.5`.
pub(super) fn hue(px: &mut [u8], f: f64) {
    debug_assert!((-0.5..=0.5).contains(&f), "hue factor {f}");
    hue_lanes(px, f as f32);
}

/// The larger of `a` and `b` (neither is NaN here): one `maxps`, where `f32::max` adds NaN checks.
#[inline(always)]
fn max(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

/// The smaller of `a` and `b` (neither is NaN here).
#[inline(always)]
fn min(a: f32, b: f32) -> f32 {
    if a < b { a } else { b }
}

dispatch! {
    /// [`hue`]: RGB → HSV → RGB as torchvision's `_rgb_to_hsv` and `_hsv_to_rgb` compute it in
    /// `f32`, every branch a select.
    fn hue_lanes(px: &mut [u8], f: f32) {
        let unit = 1.0f32 / 255.0;
        for p in px.chunks_exact_mut(3) {
            let (r, g, b) = (f32::from(p[0]) * unit, f32::from(p[1]) * unit, f32::from(p[2]) * unit);
            let maxc = max(max(r, g), b);
            let minc = min(min(r, g), b);
            let eqc = maxc == minc;
            let range = maxc - minc;
            let s = range / if eqc { 1.0 } else { maxc };
            let div = if eqc { 1.0 } else { range };
            let rc = (maxc - r) / div;
            let gc = (maxc - g) / div;
            let bc = (maxc - b) / div;
            let hr = if maxc == r { bc - gc } else { 0.0 };
            let hg = if maxc == g && maxc != r { 2.0 + rc - bc } else { 0.0 };
            let hb = if maxc != g && maxc != r { 4.0 + gc - rc } else { 0.0 };
            // `% 1.0` of a value in [5/6, 11/6].
            let h = fmod1((hr + hg + hb) * (1.0 / 6.0) + 1.0);
            // `h.add_(f).remainder_(1.0)`: Python's modulo, non-negative.
            let h = fmod1(h + f);
            let h = if h < 0.0 { h + 1.0 } else { h };
            let v = maxc;
            // floor(h6) as a truncation: h6 is in [0, 6]; sector 6 is sector 0. The sector stays
            // an f32 so that its selects share the lanes' width.
            let h6 = h * 6.0;
            let sector = trunc(h6);
            let fr = h6 - sector;
            let sector = if sector == 6.0 { 0.0 } else { sector };
            let sxf = s * fr;
            let q = ((1.0 - sxf) * v).clamp(0.0, 1.0);
            let t = ((sxf + (1.0 - s)) * v).clamp(0.0, 1.0);
            let pp = ((1.0 - s) * v).clamp(0.0, 1.0);
            // The sectors' (r, g, b): (v t p) (q v p) (p v t) (p q v) (t p v) (v p q).
            let is = |k: f32| sector == k;
            let ro = if is(0.0) || is(5.0) {
                v
            } else if is(1.0) {
                q
            } else if is(2.0) || is(3.0) {
                pp
            } else {
                t
            };
            let go = if is(0.0) {
                t
            } else if is(1.0) || is(2.0) {
                v
            } else if is(3.0) {
                q
            } else {
                pp
            };
            let bo = if is(0.0) || is(1.0) {
                pp
            } else if is(2.0) {
                t
            } else if is(3.0) || is(4.0) {
                v
            } else {
                q
            };
            let to = |x: f32| to_u8(x * (255.0 + 1.0 - 1e-3));
            p[0] = to(ro);
            p[1] = to(go);
            p[2] = to(bo);
        }
    }
}

/// `adjust_sharpness(x, f)` on a `width`×`height` image; `scratch` holds a copy of the input.
pub(super) fn sharpness(px: &mut [u8], width: usize, height: usize, f: f64, scratch: &mut Vec<u8>) {
    if width <= 2 || height <= 2 {
        return;
    }
    scratch.clear();
    scratch.extend_from_slice(px);
    sharpen(px, scratch, width * 3, (1.0 - f) as f32);
}

/// `round(S / 13)` of the kernel's integer sum `S` (at most 13 · 255), as torchvision's `f32`
/// convolution rounds it: `S / 13` is never within 1/26 of a half, far beyond either's `f32`
/// error, so both give the exact quotient's rounding (checked for every `S` in the tests).
#[inline(always)]
fn div13(sum: u16) -> f32 {
    round_even(f32::from(sum) * (1.0 / 13.0))
}

dispatch! {
    /// [`sharpness`] from the copy `src` into `px`, rows of `row` bytes: the interior pixels of
    /// each interior row, all three channels in one loop over the row's bytes (a pixel's
    /// neighbours are 3 bytes apart).
    fn sharpen(px: &mut [u8], src: &[u8], row: usize, alpha: f32) {
        let n = row - 6;
        for (y, out) in px.chunks_exact_mut(row).enumerate().skip(1).take(src.len() / row - 2) {
            let [up, mid, down] = [y - 1, y, y + 1].map(|r| &src[r * row..(r + 1) * row]);
            let out = &mut out[3..3 + n];
            let (u0, u1, u2) = (&up[..n], &up[3..3 + n], &up[6..6 + n]);
            let (m0, m1, m2) = (&mid[..n], &mid[3..3 + n], &mid[6..6 + n]);
            let (d0, d1, d2) = (&down[..n], &down[3..3 + n], &down[6..6 + n]);
            for i in 0..n {
                let w = |v: &[u8]| u16::from(v[i]);
                let sum = w(u0) + w(u1) + w(u2) + w(m0) + 5 * w(m1) + w(m2) + w(d0) + w(d1) + w(d2);
                let v = f32::from(m1[i]);
                out[i] = to_u8(v + alpha * (div13(sum) - v));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_factors_keep_the_pixels() {
        let orig: Vec<u8> = (0..=255u8).chain(0..=254).collect::<Vec<_>>()[..510].to_vec();
        for f in [brightness, saturation, contrast] {
            let mut px = orig.clone();
            f(&mut px, 1.0);
            assert_eq!(px, orig);
        }
        let mut px = orig.clone();
        hue(&mut px, 0.0);
        // HSV round trip: at most one level off (torchvision's own `adjust_hue(x, 0)` is too).
        assert!(px.iter().zip(&orig).all(|(a, b)| a.abs_diff(*b) <= 1));
    }

    #[test]
    fn brightness_truncates_and_clamps() {
        let mut px = vec![100, 200, 3];
        brightness(&mut px, 1.5);
        assert_eq!(px, [150, 255, 4]);
        saturation(&mut px, 0.0);
        let g = (150.0f32 * 0.2989 + 255.0 * 0.587 + 4.0 * 0.114).floor() as u8;
        assert_eq!(px, [g, g, g]);
    }

    #[test]
    fn hue_half_turn_swaps_complementary_colours() {
        let mut px = vec![255, 0, 0];
        hue(&mut px, 0.5);
        assert_eq!(px, [0, 255, 255]);
    }

    use crate::lanes::on_baseline;
    use crate::reference;
    use proptest::prelude::*;

    /// Images of 0 to 100 pixels, so the planar loops' partial blocks are covered.
    fn pixels() -> impl Strategy<Value = Vec<u8>> {
        (0usize..100).prop_flat_map(|n| proptest::collection::vec(any::<u8>(), n * 3))
    }

    proptest! {
        #[test]
        fn colour_ops_give_the_scalar_bytes(px in pixels(), f in 0.0f64..3.0, h in -0.5f64..=0.5) {
            type Op = fn(&mut [u8], f64);
            let ops: [(&str, Op, Op, f64); 4] = [
                ("brightness", brightness, reference::brightness, f),
                ("contrast", contrast, reference::contrast, f),
                ("saturation", saturation, reference::saturation, f),
                ("hue", hue, reference::hue, h),
            ];
            for (name, new, old, factor) in ops {
                let (mut a, mut b, mut c) = (px.clone(), px.clone(), px.clone());
                new(&mut a, factor);
                on_baseline(|| new(&mut b, factor));
                old(&mut c, factor);
                prop_assert_eq!(&a, &c, "{} {}", name, factor);
                prop_assert_eq!(&b, &c, "{} {} (baseline)", name, factor);
            }
        }

        #[test]
        fn sharpness_gives_the_scalar_bytes(
            (w, h, px) in (1usize..40, 1usize..30).prop_flat_map(|(w, h)| (Just(w), Just(h), proptest::collection::vec(any::<u8>(), w * h * 3))),
            f in 0.0f64..4.0,
        ) {
            let (mut a, mut b, mut c) = (px.clone(), px.clone(), px);
            let mut scratch = Vec::new();
            sharpness(&mut a, w, h, f, &mut scratch);
            on_baseline(|| sharpness(&mut b, w, h, f, &mut scratch));
            reference::sharpness(&mut c, w, h, f, &mut scratch);
            prop_assert_eq!(&a, &c);
            prop_assert_eq!(&b, &c);
        }
    }

    /// Every colour with red and green at every level and blue at six: `hue` against the scalar
    /// code at the ends, the middle and a few odd factors of the range. (The release-mode test
    /// `hue_is_the_scalar_code_for_every_colour` takes all 2^24 colours.)
    #[test]
    fn hue_gives_the_scalar_bytes_on_a_colour_grid() {
        let px: Vec<u8> = (0..=255u8)
            .flat_map(|r| (0..=255u8).flat_map(move |g| (0..=255u8).step_by(51).flat_map(move |b| [r, g, b])))
            .collect();
        for f in [-0.5, -0.1234, 0.0, 1.0 / 3.0, 0.5] {
            let (mut a, mut b, mut c) = (px.clone(), px.clone(), px.clone());
            hue(&mut a, f);
            on_baseline(|| hue(&mut b, f));
            reference::hue(&mut c, f);
            assert!(a == c, "hue {f}");
            assert!(b == c, "hue {f} (baseline)");
        }
    }

    /// All 2^24 colours for 13 hue factors against the scalar code; too slow unoptimised, so run
    /// `cargo test --release -p ringfeed-ops hue_is_the_scalar -- --ignored`.
    #[test]
    #[ignore = "all 2^24 colours: run in release mode"]
    fn hue_is_the_scalar_code_for_every_colour() {
        let px: Vec<u8> = (0..1u32 << 24)
            .flat_map(|c| [(c >> 16) as u8, (c >> 8) as u8, c as u8])
            .collect();
        let factors = [
            -0.5,
            -0.4999,
            -0.3,
            -0.25,
            -0.1,
            -1e-4,
            0.0,
            1e-7,
            0.05,
            0.1,
            1.0 / 3.0,
            0.4,
            0.5,
        ];
        for f in factors {
            let mut want = px.clone();
            reference::hue(&mut want, f);
            for baseline in [false, true] {
                let mut got = px.clone();
                if baseline {
                    on_baseline(|| hue(&mut got, f));
                } else {
                    hue(&mut got, f);
                }
                let diff = got.iter().zip(&want).position(|(x, y)| x != y);
                assert!(
                    diff.is_none(),
                    "hue {f} (baseline {baseline}): first difference at colour {:?}",
                    diff.map(|i| i / 3)
                );
            }
        }
    }

    #[test]
    fn div13_is_the_exact_rounding_of_every_kernel_sum() {
        for sum in 0..=13 * 255u16 {
            // round(S / 13) in integers; S / 13 is never a tie.
            let want = (2 * u32::from(sum) + 13) / 26;
            assert_eq!(div13(sum), want as f32, "{sum}");
        }
    }
}
