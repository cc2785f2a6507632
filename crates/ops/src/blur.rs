//! `gaussian_blur(x, kernel_size, sigma)` on packed RGB8 images, torchvision v2's semantics:
//! the 1-D kernel `softmax(-(x / sigma)^2)` over `x = linspace(-lim, lim, k)`,
//! `lim = (k - 1) / (2√2)`, the 2-D kernel their outer product, reflect padding, and the
//! result rounded half to even. Applied as two 1-D passes in `f32` (torchvision convolves with
//! the 2-D kernel; the sums differ in the last bits, and so can a rounding at .5).

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
fn reflect(i: i64, n: i64) -> usize {
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
                let sx = reflect(x + j as i64 - rx, w);
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
                let sy = reflect(y + j as i64 - ry, h);
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_flat_image_stays_flat() {
        let mut px = vec![123u8; 5 * 4 * 3];
        let (mut t, mut a, mut b) = (Vec::new(), Vec::new(), Vec::new());
        gaussian_blur(&mut px, 5, 4, (5, 3), (2.0, 0.7), &mut t, &mut a, &mut b);
        assert!(px.iter().all(|&v| v == 123));
    }
}
