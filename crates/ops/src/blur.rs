//! `gaussian_blur(x, kernel_size, sigma)` on packed RGB8 images, torchvision v2's semantics:
//! the 1-D kernel `softmax(-(x / sigma)^2)` over `x = linspace(-lim, lim, k)`,
//! `lim = (k - 1) / (2√2)`, the 2-D kernel their outer product, reflect padding, and the
//! result rounded half to even. Applied as two 1-D passes in `f32` (torchvision convolves with
//! the 2-D kernel; the sums differ in the last bits, and so can a rounding at .5).
//!
//! Each pass is a sum over the kernel's taps of whole rows scaled by a tap (the horizontal one
//! over a row padded by reflection once, at its two ends; the vertical one over reflected row
//! indices), so the inner loops run over contiguous bytes and vectorise. Each output still adds
//! its products in the taps' order from zero, as the scalar code (`reference`) did, so the bytes
//! are the same.

use crate::lanes::{dispatch, round_even, to_u8};

/// torchvision's `_get_gaussian_kernel1d`, in `f32`.
pub(super) fn kernel1d(k: u32, sigma: f64, out: &mut Vec<f32>) {
    out.clear();
    let lim = (f64::from(k) - 1.0) / (2.0 * std::f64::consts::SQRT_2);
    let lim = lim as f32;
    let s = sigma as f32;
    // torch.linspace(-lim, lim, k) in f32: the first half from the start, the rest from the end.
    let step = if k > 1 { (2.0 * lim) / (k as f32 - 1.0) } else { 0.0 };
    let half = k / 2;
    for i in 0..k {
        let x = if i < half {
            -lim + step * i as f32
        } else {
            lim - step * (k - 1 - i) as f32
        };
        let v = x / s;
        out.push(-(v * v));
    }
    let max = out.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in out.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in out.iter_mut() {
        *v /= sum;
    }
}

/// Reflects `i` into `0..n` (PyTorch's `reflect` padding: the edge pixel is not repeated).
#[inline]
pub(crate) fn reflect(i: i64, n: i64) -> usize {
    if n == 1 {
        return 0;
    }
    let period = 2 * (n - 1);
    let mut i = i.rem_euclid(period);
    if i >= n {
        i = period - i;
    }
    i as usize
}

/// Blurs the `width`×`height` image `px` in place; `tmp` and the kernels are scratch.
#[allow(clippy::too_many_arguments)]
pub(super) fn gaussian_blur(
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
    kernel1d(kernel.0, sigma.0, kx);
    kernel1d(kernel.1, sigma.1, ky);
    let row = width * 3;
    // `tmp`: the horizontal pass's image, one padded source row, one accumulator row.
    let padded = row + 6 * (kernel.0 as usize / 2);
    tmp.clear();
    tmp.resize(px.len() + padded + row, 0.0);
    let (pass, rest) = tmp.split_at_mut(px.len());
    let (pad, acc) = rest.split_at_mut(padded);
    passes(px, width, kx, ky, pass, pad, acc);
}

dispatch! {
    /// The two passes of [`gaussian_blur`] over `px` (`width` pixels a row), through `pass`.
    fn passes(px: &mut [u8], width: usize, kx: &[f32], ky: &[f32], pass: &mut [f32], pad: &mut [f32], acc: &mut [f32]) {
        let row = width * 3;
        let height = px.len() / row;
        let rx = kx.len() / 2;
        let ry = ky.len() as i64 / 2;
        let (w, h) = (width as i64, height as i64);
        // Horizontal: `pad` holds columns -rx..width+rx of the row; output byte j is
        // sum_k kx[k] * pad[j + 3k].
        for (src, out) in px.chunks_exact(row).zip(pass.chunks_exact_mut(row)) {
            for (x, p) in pad.chunks_exact_mut(3).enumerate() {
                if x == rx {
                    break;
                }
                let s = reflect(x as i64 - rx as i64, w) * 3;
                for c in 0..3 {
                    p[c] = f32::from(src[s + c]);
                }
            }
            for (p, &v) in pad[3 * rx..3 * rx + row].iter_mut().zip(src) {
                *p = f32::from(v);
            }
            for (x, p) in pad[3 * rx + row..].chunks_exact_mut(3).enumerate() {
                let s = reflect(w + x as i64, w) * 3;
                for c in 0..3 {
                    p[c] = f32::from(src[s + c]);
                }
            }
            out.fill(0.0);
            for (k, &kv) in kx.iter().enumerate() {
                for (o, &v) in out.iter_mut().zip(&pad[3 * k..3 * k + row]) {
                    *o += v * kv;
                }
            }
        }
        // Vertical: output row y is sum_k ky[k] * pass[reflect(y + k - ry)], then rounded.
        for (y, out) in px.chunks_exact_mut(row).enumerate() {
            acc.fill(0.0);
            for (k, &kv) in ky.iter().enumerate() {
                let s = reflect(y as i64 + k as i64 - ry, h) * row;
                for (a, &v) in acc.iter_mut().zip(&pass[s..s + row]) {
                    *a += v * kv;
                }
            }
            for (o, &a) in out.iter_mut().zip(acc.iter()) {
                *o = to_u8(round_even(a));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{Just, Strategy, any};

    #[test]
    fn kernels_sum_to_one_and_are_symmetric() {
        let mut k = Vec::new();
        kernel1d(9, 1.3, &mut k);
        assert_eq!(k.len(), 9);
        assert!((k.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        for i in 0..4 {
            assert!((k[i] - k[8 - i]).abs() < 1e-7);
        }
        kernel1d(1, 0.5, &mut k);
        assert_eq!(k, [1.0]);
    }

    #[test]
    fn reflect_does_not_repeat_the_edge() {
        let got: Vec<_> = (-3..6).map(|i| reflect(i, 4)).collect();
        assert_eq!(got, [3, 2, 1, 0, 1, 2, 3, 2, 1]);
    }

    proptest::proptest! {
        #[test]
        fn blur_gives_the_scalar_bytes(
            (w, h, px) in (1usize..30, 1usize..20).prop_flat_map(|(w, h)| (Just(w), Just(h), proptest::collection::vec(any::<u8>(), w * h * 3))),
            (kw, kh) in (0u32..12, 0u32..12),
            (sx, sy) in (0.1f64..4.0, 0.1f64..4.0),
        ) {
            // Odd kernels up to 23, wider than the image too (reflected more than once).
            let kernel = (2 * kw + 1, 2 * kh + 1);
            let (mut a, mut b, mut c) = (px.clone(), px.clone(), px);
            let (mut t, mut x, mut y) = (Vec::new(), Vec::new(), Vec::new());
            gaussian_blur(&mut a, w, h, kernel, (sx, sy), &mut t, &mut x, &mut y);
            crate::lanes::on_baseline(|| gaussian_blur(&mut b, w, h, kernel, (sx, sy), &mut t, &mut x, &mut y));
            crate::reference::gaussian_blur(&mut c, w, h, kernel, (sx, sy), &mut t, &mut x, &mut y);
            proptest::prop_assert_eq!(&a, &c);
            proptest::prop_assert_eq!(&b, &c);
        }
    }

    #[test]
    fn a_flat_image_stays_flat() {
        let mut px = vec![123u8; 5 * 4 * 3];
        let (mut t, mut a, mut b) = (Vec::new(), Vec::new(), Vec::new());
        gaussian_blur(&mut px, 5, 4, (5, 3), (2.0, 0.7), &mut t, &mut a, &mut b);
        assert!(px.iter().all(|&v| v == 123));
    }
}
