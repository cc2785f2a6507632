//! Affine warps of packed RGB8 images at their own size (the auto-augment policies' shear,
//! translate and rotate), torchvision v2's tensor path: `_get_inverse_affine_matrix`, an
//! `affine_grid` over output pixel centres, and `grid_sample(align_corners=False,
//! padding_mode="zeros")` with nearest (round half to even) or bilinear sampling, in `f32`.
//!
//! Fill: `None` is torchvision's `fill=None`, the sampler's zero padding; `Some(f)` samples a
//! mask along, and pixels the mask does not cover become `f` (nearest: where the mask is under
//! 0.5; bilinear: `(v - f) · mask + f`). The result is rounded half to even.

use super::lanes::dispatch;
use super::spec::{Interpolation, WarpFill};

/// torchvision's `_get_inverse_affine_matrix(center, angle, translate, scale, shear)`, degrees.
pub(super) fn inverse_matrix(
    center: (f64, f64),
    angle: f64,
    translate: (f64, f64),
    scale: f64,
    shear: (f64, f64),
) -> [f64; 6] {
    let rot = angle.to_radians();
    let sx = shear.0.to_radians();
    let sy = shear.1.to_radians();
    let (cx, cy) = center;
    let (tx, ty) = translate;
    let a = (rot - sy).cos() / sy.cos();
    let b = -(a * sx.tan() + rot.sin());
    let c = (rot - sy).sin() / sy.cos();
    let d = rot.cos() - c * sx.tan();
    let mut m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0];
    m[2] += cx - m[0] * (cx + tx) - m[1] * (cy + ty);
    m[5] += cy - m[3] * (cx + tx) - m[4] * (cy + ty);
    m
}

/// `_affine_grid`'s scaled matrix `theta^T / [0.5 w, 0.5 h]` in `f32`, and the base grid's
/// first column and row, `(1 - w) / 2` and `(1 - h) / 2`.
pub(super) fn grid(width: u32, height: u32, m: [f64; 6]) -> ([f32; 6], f32, f32) {
    let (wf, hf) = (width as f32, height as f32);
    let m: [f32; 6] = m.map(|v| v as f32);
    let (hw, hh) = (0.5 * wf, 0.5 * hf);
    let r = [m[0] / hw, m[1] / hw, m[2] / hw, m[3] / hh, m[4] / hh, m[5] / hh];
    (r, (1.0 - wf) * 0.5, (1.0 - hf) * 0.5)
}

/// The source point of output pixel (`xg`, `yg`) of the base grid, in pixels, given
/// `yr = (yg·r1, yg·r4)` in `f64`.
#[inline(always)]
fn source(r: &[f32; 6], xg: f32, yr: (f64, f64), (wf, hf): (f32, f32)) -> (f32, f32) {
    // The base grid times theta, `x·r0 + y·r1 + r2`, computed exactly and rounded to f32
    // once (the products of two f32 are exact in f64). PyTorch computes it with a CPU
    // `bmm` whose rounding depends on the machine's kernels: with PyTorch 2.15, a plain
    // f32 sum on one development machine and `fma(y, r1, x·r0) + r2` on another (both
    // 2026-12-02, on every point of 40 random geometries). An ulp moves nearest-neighbour ties, and a histogram op
    // after a shear spreads them (36 dB against torchvision's 40 in `test_ops.py`'s
    // policy replays), so no single f32 order matches torchvision everywhere; the tests
    // give torchvision's `_affine_grid` this same arithmetic (`test_ops.py`, `exact_grid`).
    let gx = ((f64::from(xg) * f64::from(r[0]) + yr.0) + f64::from(r[2])) as f32;
    let gy = ((f64::from(xg) * f64::from(r[3]) + yr.1) + f64::from(r[5])) as f32;
    // grid_sample's unnormalisation with align_corners=False.
    (((gx + 1.0) * wf - 1.0) / 2.0, ((gy + 1.0) * hf - 1.0) / 2.0)
}

/// `x.round_ties_even() as i64` for the warp's coordinates, as an `i32`: the same index for
/// every `|x| < 2^30` and NaN (0), and one out of any image beyond, where the `i64` is out too.
#[inline(always)]
fn round_index(x: f32) -> i32 {
    const LIMIT: f32 = 1_073_741_824.0;
    let x = x.round_ties_even();
    // Selects: NaN becomes 0, as `NaN as i64` is.
    let x = if x.is_nan() { 0.0 } else { x };
    let x = if x > -LIMIT { x } else { -LIMIT };
    let x = if x < LIMIT { x } else { LIMIT };
    // SAFETY: `x` is in [-2^30, 2^30] and integral, so it converts to an i32 exactly.
    unsafe { x.to_int_unchecked::<i32>() }
}

/// Warps `src` (`width`×`height`) by the inverse matrix `m` into `dst` (same size).
pub(super) fn warp(
    src: &[u8],
    width: u32,
    height: u32,
    m: [f64; 6],
    interp: Interpolation,
    fill: WarpFill,
    dst: &mut [u8],
) {
    match interp {
        Interpolation::Nearest | Interpolation::Bicubic => {
            let fill = fill.map_or([0; 3], |f| f.map(|v| v.round_ties_even() as u8));
            warp_nearest(src, width, height, m, fill, dst);
        }
        Interpolation::Bilinear => warp_bilinear(src, width, height, m, fill, dst),
    }
}

/// A label map (`width`×`height`, one byte per pixel) warped by the inverse matrix `m` with
/// nearest sampling, pixels from outside becoming `fill`: `F.affine` on a `tv_tensors.Mask`
/// (always nearest), with the image warp's grid arithmetic, so a label moves with its pixel.
pub(super) fn warp_mask(src: &[u8], width: u32, height: u32, m: [f64; 6], fill: u8, dst: &mut [u8]) {
    let w = width as usize;
    let size = (width as f32, height as f32);
    let (r, x0, y0) = grid(width, height, m);
    for (y, out) in dst.chunks_exact_mut(w.max(1)).enumerate().take(height as usize) {
        let yg = y0 + y as f32;
        let yr = (f64::from(yg) * f64::from(r[1]), f64::from(yg) * f64::from(r[4]));
        for (x, o) in out.iter_mut().enumerate() {
            let (sx, sy) = source(&r, x0 + x as f32, yr, size);
            let (ix, iy) = (round_index(sx), round_index(sy));
            let inside = ix >= 0 && iy >= 0 && ix < width as i32 && iy < height as i32;
            *o = if inside {
                src[iy as usize * w + ix as usize]
            } else {
                fill
            };
        }
    }
}

dispatch! {
    /// [`warp`] with nearest sampling (`fill`: the bytes of pixels from outside). Each row in
    /// chunks, in two loops: the source pixels' coordinates (arithmetic the compiler vectorises;
    /// with AVX2, `vroundps` rounds half to even), then the copies.
    fn warp_nearest(src: &[u8], width: u32, height: u32, m: [f64; 6], fill: [u8; 3], dst: &mut [u8]) {
        const CHUNK: usize = 64;
        let (w, h) = (width as usize, height as usize);
        let size = (width as f32, height as f32);
        let (r, x0, y0) = grid(width, height, m);
        // Source column and row per output pixel of the chunk; column -1: outside.
        let (mut cols, mut rows) = ([0i32; CHUNK], [0i32; CHUNK]);
        for (y, out) in dst.chunks_exact_mut(w * 3).enumerate().take(h) {
            let yg = y0 + y as f32;
            let yr = (f64::from(yg) * f64::from(r[1]), f64::from(yg) * f64::from(r[4]));
            for (c, out) in out.chunks_mut(CHUNK * 3).enumerate() {
                let n = out.len() / 3;
                let first = (c * CHUNK) as i32;
                for (i, (col, row)) in cols[..n].iter_mut().zip(&mut rows[..n]).enumerate() {
                    // `x as f32` of an x below 2^24 (an i32 converts in one instruction).
                    let xg = x0 + (first + i as i32) as f32;
                    let (sx, sy) = source(&r, xg, yr, size);
                    let (ix, iy) = (round_index(sx), round_index(sy));
                    let inside = ix >= 0 && iy >= 0 && ix < width as i32 && iy < height as i32;
                    *col = if inside { ix } else { -1 };
                    *row = iy;
                }
                for ((o, &col), &row) in out.chunks_exact_mut(3).zip(&cols[..n]).zip(&rows[..n]) {
                    if col < 0 {
                        o.copy_from_slice(&fill);
                    } else {
                        let at = (row as usize * w + col as usize) * 3;
                        o.copy_from_slice(&src[at..at + 3]);
                    }
                }
            }
        }
    }
}

dispatch! {
    /// [`warp`] with bilinear sampling. Compiled for AVX2 too, where `floor` is one instruction
    /// instead of a library call.
    fn warp_bilinear(src: &[u8], width: u32, height: u32, m: [f64; 6], fill: WarpFill, dst: &mut [u8]) {
        let (w, h) = (width as usize, height as usize);
        let size = (width as f32, height as f32);
        let (r, x0, y0) = grid(width, height, m);
        let sample = |ix: i64, iy: i64, c: usize| -> f32 {
            if ix < 0 || iy < 0 || ix >= w as i64 || iy >= h as i64 {
                0.0
            } else {
                f32::from(src[(iy as usize * w + ix as usize) * 3 + c])
            }
        };
        let inside = |ix: i64, iy: i64| ix >= 0 && iy >= 0 && ix < w as i64 && iy < h as i64;
        for y in 0..h {
            let yg = y0 + y as f32;
            let yr = (f64::from(yg) * f64::from(r[1]), f64::from(yg) * f64::from(r[4]));
            for x in 0..w {
                let (sx, sy) = source(&r, x0 + x as f32, yr, size);
                let out = &mut dst[(y * w + x) * 3..][..3];
                let (fx, fy) = (sx.floor(), sy.floor());
                let (ix, iy) = (fx as i64, fy as i64);
                let (tx, ty) = (sx - fx, sy - fy);
                let wts = [(1.0 - tx) * (1.0 - ty), tx * (1.0 - ty), (1.0 - tx) * ty, tx * ty];
                let pts = [(ix, iy), (ix + 1, iy), (ix, iy + 1), (ix + 1, iy + 1)];
                let mask: f32 = pts
                    .iter()
                    .zip(wts)
                    .map(|(&(a, b), wt)| if inside(a, b) { wt } else { 0.0 })
                    .sum();
                for (c, o) in out.iter_mut().enumerate() {
                    let v: f32 = pts.iter().zip(wts).map(|(&(a, b), wt)| sample(a, b, c) * wt).sum();
                    let v = match fill {
                        Some(f) => (v - f[c]) * mask + f[c],
                        None => v,
                    };
                    *o = v.round_ties_even().clamp(0.0, 255.0) as u8;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{Just, Strategy, any};

    #[test]
    fn the_identity_warp_copies() {
        let src: Vec<u8> = (0..5 * 4 * 3).map(|v| v as u8).collect();
        let m = inverse_matrix((0.0, 0.0), 0.0, (0.0, 0.0), 1.0, (0.0, 0.0));
        for interp in [Interpolation::Nearest, Interpolation::Bilinear] {
            let mut dst = vec![0; src.len()];
            warp(&src, 5, 4, m, interp, None, &mut dst);
            assert_eq!(dst, src, "{interp:?}");
        }
    }

    proptest::proptest! {
        /// Both copies of `warp` (AVX2, baseline) write the scalar code's bytes.
        #[test]
        fn the_warp_gives_the_scalar_bytes(
            (w, h, src) in (1u32..90, 1u32..24).prop_flat_map(|(w, h)| (Just(w), Just(h), proptest::collection::vec(any::<u8>(), (w * h * 3) as usize))),
            angle in -180.0f64..180.0,
            shear in (-30.0f64..30.0, -30.0f64..30.0),
            translate in (-10.0f64..10.0, -10.0f64..10.0),
            bilinear in any::<bool>(),
            fill in proptest::option::of(0.0f32..255.0),
        ) {
            let m = inverse_matrix((f64::from(w) * 0.5, f64::from(h) * 0.5), angle, translate, 1.0, shear);
            let interp = if bilinear { Interpolation::Bilinear } else { Interpolation::Nearest };
            let fill = fill.map(|v| [v, 255.0 - v, v * 0.5]);
            let (mut a, mut b, mut c) = (vec![0; src.len()], vec![0; src.len()], vec![0; src.len()]);
            warp(&src, w, h, m, interp, fill, &mut a);
            crate::lanes::on_baseline(|| warp(&src, w, h, m, interp, fill, &mut b));
            crate::reference::warp(&src, w, h, m, interp, fill, &mut c);
            proptest::prop_assert_eq!(&a, &c);
            proptest::prop_assert_eq!(&b, &c);
        }
    }

    #[test]
    fn a_translation_shifts_and_fills() {
        let src: Vec<u8> = (1..=4 * 3).map(|v| v as u8).collect(); // 4x1
        let m = inverse_matrix((0.0, 0.0), 0.0, (1.0, 0.0), 1.0, (0.0, 0.0));
        let mut dst = vec![0; src.len()];
        warp(&src, 4, 1, m, Interpolation::Nearest, Some([9.0, 9.0, 9.0]), &mut dst);
        assert_eq!(dst, [9, 9, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    }
}
