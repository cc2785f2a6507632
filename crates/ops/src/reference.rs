//! The scalar kernels of the photometric ops as they were before the vectorised ones in `color`
//! and `blur` replaced them (git 0bb9a96): one pixel and one channel at a time, every step in
//! `f32` as written in torchvision's uint8 kernels. Kept as the exactness oracle (the tests
//! check the new kernels give these bytes, bit for bit) and, with the `reference` feature, for
//! the benches' old-against-new ratio in one run. Not used by the processor. The affine warp
//! is the one before its nearest-neighbour path was split in two loops.

use crate::spec::{Interpolation, WarpFill};

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
pub fn brightness(px: &mut [u8], f: f64) {
    let f = f as f32;
    for c in px.iter_mut() {
        *c = (f32::from(*c) * f).clamp(0.0, 255.0) as u8;
    }
}

/// `adjust_saturation(x, f)`.
pub fn saturation(px: &mut [u8], f: f64) {
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
pub fn contrast(px: &mut [u8], f: f64) {
    let n = px.len() / 3;
    if n == 0 {
        return;
    }
    let sum: f64 = px.chunks_exact(3).map(|p| f64::from(luma(p).floor())).sum();
    let mean = (sum / n as f64) as f32;
    blend_with(px, f, |_| mean);
}

/// `adjust_hue(x, f)`, `f` in `-0.5..=0.5`.
pub fn hue(px: &mut [u8], f: f64) {
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
pub fn sharpness(px: &mut [u8], width: usize, height: usize, f: f64, scratch: &mut Vec<u8>) {
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

/// Blurs the `width`×`height` image `px` in place; `tmp` and the kernels are scratch.
#[allow(clippy::too_many_arguments)]
pub fn gaussian_blur(
    px: &mut [u8],
    width: usize,
    height: usize,
    kernel: (u32, u32),
    sigma: (f64, f64),
    tmp: &mut Vec<f32>,
    kx: &mut Vec<f32>,
    ky: &mut Vec<f32>,
) {
    if width == 0 || height == 0 {
        return;
    }
    crate::blur::kernel1d(kernel.0, sigma.0, kx);
    crate::blur::kernel1d(kernel.1, sigma.1, ky);
    let (w, h) = (width as i64, height as i64);
    let (rx, ry) = (i64::from(kernel.0 / 2), i64::from(kernel.1 / 2));
    tmp.clear();
    tmp.resize(px.len(), 0.0);
    // Horizontal pass into `tmp`.
    for y in 0..height {
        let row = &px[y * width * 3..(y + 1) * width * 3];
        for x in 0..w {
            let mut acc = [0f32; 3];
            for (j, kv) in kx.iter().enumerate() {
                let sx = crate::blur::reflect(x + j as i64 - rx, w);
                for c in 0..3 {
                    acc[c] += f32::from(row[sx * 3 + c]) * kv;
                }
            }
            let at = (y * width + x as usize) * 3;
            tmp[at..at + 3].copy_from_slice(&acc);
        }
    }
    // Vertical pass back into `px`.
    for y in 0..h {
        for x in 0..width {
            let mut acc = [0f32; 3];
            for (j, kv) in ky.iter().enumerate() {
                let sy = crate::blur::reflect(y + j as i64 - ry, h);
                let at = (sy * width + x) * 3;
                for c in 0..3 {
                    acc[c] += tmp[at + c] * kv;
                }
            }
            let at = (y as usize * width + x) * 3;
            for c in 0..3 {
                px[at + c] = acc[c].round_ties_even().clamp(0.0, 255.0) as u8;
            }
        }
    }
}

/// Warps `src` (`width`×`height`) by the inverse matrix `m` into `dst` (same size).
pub fn warp(src: &[u8], width: u32, height: u32, m: [f64; 6], interp: Interpolation, fill: WarpFill, dst: &mut [u8]) {
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
