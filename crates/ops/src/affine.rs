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

dispatch! {
    /// Warps `src` (`width`×`height`) by the inverse matrix `m` into `dst` (same size).
    ///
    /// Compiled for AVX2 too (`lanes::dispatch`), where SSE4.1's `roundss` rounds half to even
    /// and floors in one instruction instead of a library call per coordinate: the same values.
    pub(super) fn warp(
        src: &[u8],
        width: u32,
        height: u32,
        m: [f64; 6],
        interp: Interpolation,
        fill: WarpFill,
        dst: &mut [u8],
    ) {
        let (w, h) = (width as usize, height as usize);
        let (wf, hf) = (width as f32, height as f32);
        // theta^T / [0.5 w, 0.5 h], as `_affine_grid` rescales it, in f32.
        let m: [f32; 6] = m.map(|v| v as f32);
        let (hw, hh) = (0.5 * wf, 0.5 * hf);
        let r = [m[0] / hw, m[1] / hw, m[2] / hw, m[3] / hh, m[4] / hh, m[5] / hh];
        let x0 = (1.0 - wf) * 0.5;
        let y0 = (1.0 - hf) * 0.5;
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
            for x in 0..w {
                let xg = x0 + x as f32;
                // The base grid times theta, `x·r0 + y·r1 + r2`, computed exactly and rounded to f32
                // once (the products of two f32 are exact in f64). PyTorch computes it with a CPU
                // `bmm` whose rounding depends on the machine's kernels: with PyTorch 2.15, a plain
                // f32 sum on one development machine and `fma(y, r1, x·r0) + r2` on another (both
                // 2026-12-02, on every point of 40 random geometries). An ulp moves nearest-neighbour ties, and a histogram op
                // after a shear spreads them (36 dB against torchvision's 40 in `test_ops.py`'s
                // policy replays), so no single f32 order matches torchvision everywhere; the tests
                // give torchvision's `_affine_grid` this same arithmetic (`test_ops.py`, `exact_grid`).
                let gx = ((f64::from(xg) * f64::from(r[0]) + f64::from(yg) * f64::from(r[1])) + f64::from(r[2])) as f32;
                let gy = ((f64::from(xg) * f64::from(r[3]) + f64::from(yg) * f64::from(r[4])) + f64::from(r[5])) as f32;
                // grid_sample's unnormalisation with align_corners=False.
                let sx = ((gx + 1.0) * wf - 1.0) / 2.0;
                let sy = ((gy + 1.0) * hf - 1.0) / 2.0;
                let out = &mut dst[(y * w + x) * 3..][..3];
                match interp {
                    Interpolation::Nearest | Interpolation::Bicubic => {
                        let (ix, iy) = (sx.round_ties_even() as i64, sy.round_ties_even() as i64);
                        let ok = inside(ix, iy);
                        for (c, o) in out.iter_mut().enumerate() {
                            *o = match (ok, fill) {
                                (true, _) => sample(ix, iy, c) as u8,
                                (false, Some(f)) => f[c].round_ties_even() as u8,
                                (false, None) => 0,
                            };
                        }
                    }
                    Interpolation::Bilinear => {
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
        /// The AVX2 copy of `warp` writes the baseline copy's bytes.
        #[test]
        fn both_copies_of_the_warp_agree(
            (w, h, src) in (1u32..24, 1u32..24).prop_flat_map(|(w, h)| (Just(w), Just(h), proptest::collection::vec(any::<u8>(), (w * h * 3) as usize))),
            angle in -180.0f64..180.0,
            shear in (-30.0f64..30.0, -30.0f64..30.0),
            translate in (-10.0f64..10.0, -10.0f64..10.0),
            bilinear in any::<bool>(),
            fill in proptest::option::of(0.0f32..255.0),
        ) {
            let m = inverse_matrix((f64::from(w) * 0.5, f64::from(h) * 0.5), angle, translate, 1.0, shear);
            let interp = if bilinear { Interpolation::Bilinear } else { Interpolation::Nearest };
            let fill = fill.map(|v| [v, 255.0 - v, v * 0.5]);
            let (mut a, mut b) = (vec![0; src.len()], vec![0; src.len()]);
            warp(&src, w, h, m, interp, fill, &mut a);
            crate::lanes::on_baseline(|| warp(&src, w, h, m, interp, fill, &mut b));
            proptest::prop_assert_eq!(a, b);
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
