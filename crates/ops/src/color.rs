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

/// `_blend` with `b` given per pixel by `other(i)` (the pixel's index).
#[inline(always)]
fn blend_with(px: &mut [u8], ratio: f64, other: impl Fn(usize) -> f32) {
    let r = ratio as f32;
    let s = (1.0 - ratio) as f32;
    for (i, p) in px.chunks_exact_mut(3).enumerate() {
        let o = other(i);
        for c in p.iter_mut() {
            *c = (f32::from(*c) * r + o * s).clamp(0.0, 255.0) as u8;
        }
    }
}

/// torchvision's luma in `f32`, `r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114)`.
#[inline(always)]
fn luma(p: &[u8]) -> f32 {
    f32::from(p[0]) * 0.2989 + f32::from(p[1]) * 0.587 + f32::from(p[2]) * 0.114
}

/// `adjust_brightness(x, f)`.
pub(super) fn brightness(px: &mut [u8], f: f64) {
    let f = f as f32;
    for c in px.iter_mut() {
        *c = (f32::from(*c) * f).clamp(0.0, 255.0) as u8;
    }
}

/// `adjust_saturation(x, f)`.
pub(super) fn saturation(px: &mut [u8], f: f64) {
    let r = f as f32;
    let s = (1.0 - f) as f32;
    for p in px.chunks_exact_mut(3) {
        let g = luma(p).floor() * s;
        for c in p.iter_mut() {
            *c = (f32::from(*c) * r + g).clamp(0.0, 255.0) as u8;
        }
    }
}

/// `adjust_contrast(x, f)`.
pub(super) fn contrast(px: &mut [u8], f: f64) {
    let n = px.len() / 3;
    if n == 0 {
        return;
    }
    let sum: f64 = px.chunks_exact(3).map(|p| f64::from(luma(p).floor())).sum();
    let mean = (sum / n as f64) as f32;
    blend_with(px, f, |_| mean);
}

/// `rgb_to_grayscale(x, num_output_channels=3)`.
pub(super) fn grayscale(px: &mut [u8]) {
    for p in px.chunks_exact_mut(3) {
        let l = luma(p) as u8;
        p.fill(l);
    }
}

/// `adjust_hue(x, f)`, `f` in `-0.5..=0.5`.
pub(super) fn hue(px: &mut [u8], f: f64) {
    let f = f as f32;
    let unit = 1.0f32 / 255.0;
    for p in px.chunks_exact_mut(3) {
        let [r, g, b] = [p[0], p[1], p[2]].map(|v| f32::from(v) * unit);
        let maxc = r.max(g).max(b);
        let minc = r.min(g).min(b);
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
        let h = ((hr + hg + hb) * (1.0 / 6.0) + 1.0) % 1.0;
        // `h.add_(f).remainder_(1.0)`: Python's modulo, non-negative.
        let h = (h + f).rem_euclid(1.0);
        let v = maxc;
        let h6 = h * 6.0;
        let i = h6.floor();
        let fr = h6 - i;
        let i = (i as i32).rem_euclid(6);
        let sxf = s * fr;
        let q = ((1.0 - sxf) * v).clamp(0.0, 1.0);
        let t = ((sxf + (1.0 - s)) * v).clamp(0.0, 1.0);
        let pp = ((1.0 - s) * v).clamp(0.0, 1.0);
        let (r, g, b) = match i {
            0 => (v, t, pp),
            1 => (q, v, pp),
            2 => (pp, v, t),
            3 => (pp, q, v),
            4 => (t, pp, v),
            _ => (v, pp, q),
        };
        let to = |x: f32| (x * (255.0 + 1.0 - 1e-3)) as u8;
        p[0] = to(r);
        p[1] = to(g);
        p[2] = to(b);
    }
}

/// `adjust_sharpness(x, f)` on a `width`×`height` image; `scratch` holds a copy of the input.
pub(super) fn sharpness(px: &mut [u8], width: usize, height: usize, f: f64, scratch: &mut Vec<u8>) {
    if width <= 2 || height <= 2 {
        return;
    }
    scratch.clear();
    scratch.extend_from_slice(px);
    let src = &scratch[..];
    let alpha = (1.0 - f) as f32;
    let (a, b) = (1.0f32 / 13.0, 5.0f32 / 13.0);
    let row = width * 3;
    for y in 1..height - 1 {
        for x in 1..width - 1 {
            for c in 0..3 {
                let at = |dy: usize, dx: usize| f32::from(src[(y + dy - 1) * row + (x + dx - 1) * 3 + c]);
                let s = at(0, 0) * a
                    + at(0, 1) * a
                    + at(0, 2) * a
                    + at(1, 0) * a
                    + at(1, 1) * b
                    + at(1, 2) * a
                    + at(2, 0) * a
                    + at(2, 1) * a
                    + at(2, 2) * a;
                let blurred = s.round_ties_even();
                let v = at(1, 1);
                px[y * row + x * 3 + c] = (v + alpha * (blurred - v)).clamp(0.0, 255.0) as u8;
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
}
