//! Tone ops on packed RGB8 images, in place, with torchvision v2's uint8 semantics
//! (`transforms/v2/functional/_color.py`); all but autocontrast are exact integer maps.
//!
//! - invert: `255 - x`; solarize: `x >= threshold ? 255 - x : x`; posterize: keep the top
//!   `bits` bits.
//! - autocontrast: per channel, `(x - min) / ((max - min) / 255)` truncated, in `f32`; a flat
//!   channel is kept.
//! - equalize: per channel, Pillow's lookup table as torchvision builds it:
//!   `step = (n - count of the last non-empty bin) // 255`, `lut[0] = 0`,
//!   `lut[k] = min(255, (cdf[k - 1] + step // 2) // step)`; a channel with `step == 0` is kept.

/// `invert(x)`.
pub(super) fn invert(px: &mut [u8]) {
    for c in px.iter_mut() {
        *c = 255 - *c;
    }
}

/// `solarize(x, threshold)`. torch compares the uint8 image with the threshold in `f32`
/// (a policy's `255 * 0.33333334` is 85.0 there, so 85 is inverted).
pub(super) fn solarize(px: &mut [u8], threshold: f64) {
    let threshold = threshold as f32;
    // A table: the comparison in `f32` per byte cost more than the lookup.
    let lut: [u8; 256] = std::array::from_fn(|x| {
        let x = x as u8;
        if f32::from(x) >= threshold { 255 - x } else { x }
    });
    for c in px.iter_mut() {
        *c = lut[usize::from(*c)];
    }
}

/// `posterize`'s mask: the top `bits` bits (all of them from 8 on).
pub(super) fn posterize_mask(bits: u8) -> u8 {
    if bits >= 8 {
        255
    } else {
        (((1u16 << bits) - 1) << (8 - bits)) as u8
    }
}

/// `posterize(x, bits)`.
pub(super) fn posterize(px: &mut [u8], bits: u8) {
    if bits >= 8 {
        return;
    }
    let mask = posterize_mask(bits);
    for c in px.iter_mut() {
        *c &= mask;
    }
}

/// `autocontrast(x)`.
pub(super) fn autocontrast(px: &mut [u8]) {
    let mut lo = [255u8; 3];
    let mut hi = [0u8; 3];
    for p in px.chunks_exact(3) {
        for c in 0..3 {
            lo[c] = lo[c].min(p[c]);
            hi[c] = hi[c].max(p[c]);
        }
    }
    let mut min = [0f32; 3];
    let mut inv = [1f32; 3];
    for c in 0..3 {
        if hi[c] != lo[c] {
            min[c] = f32::from(lo[c]);
            inv[c] = (f32::from(hi[c]) - f32::from(lo[c])) * (1.0 / 255.0);
        }
    }
    // Each channel's result depends on its byte alone: one table per channel.
    let luts: [[u8; 256]; 3] =
        std::array::from_fn(|c| std::array::from_fn(|x| ((x as f32 - min[c]) / inv[c]).clamp(0.0, 255.0) as u8));
    for p in px.chunks_exact_mut(3) {
        for c in 0..3 {
            p[c] = luts[c][usize::from(p[c])];
        }
    }
}

/// `equalize(x)`.
pub(super) fn equalize(px: &mut [u8]) {
    let n = (px.len() / 3) as u64;
    let mut hist = [[0u64; 256]; 3];
    for p in px.chunks_exact(3) {
        for c in 0..3 {
            hist[c][p[c] as usize] += 1;
        }
    }
    let mut luts = [[0u8; 256]; 3];
    let mut keep = [false; 3];
    for c in 0..3 {
        let h = &hist[c];
        let last = h.iter().rposition(|&v| v > 0).unwrap_or(0);
        let step = (n - h[last]) / 255;
        if step == 0 {
            keep[c] = true;
            continue;
        }
        let mut cdf = 0u64;
        for k in 1..256 {
            cdf += h[k - 1];
            luts[c][k] = ((cdf + step / 2) / step).min(255) as u8;
        }
    }
    for p in px.chunks_exact_mut(3) {
        for c in 0..3 {
            if !keep[c] {
                p[c] = luts[c][p[c] as usize];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_maps() {
        let mut px = vec![0, 127, 128, 255, 200, 9];
        solarize(&mut px, 128.0);
        assert_eq!(px, [0, 127, 127, 0, 55, 9]);
        posterize(&mut px, 2);
        assert_eq!(px, [0, 64, 64, 0, 0, 0]);
        invert(&mut px);
        assert_eq!(px, [255, 191, 191, 255, 255, 255]);
        let mut px = vec![7, 8, 9];
        posterize(&mut px, 0);
        assert_eq!(px, [0, 0, 0]);
    }

    #[test]
    fn autocontrast_stretches_each_channel_and_keeps_flat_ones() {
        let mut px = vec![10, 5, 7, 20, 5, 9];
        autocontrast(&mut px);
        // torchvision gives 254 too: 10 / (10 · (1 / 255)) is 254.99998 in f32.
        assert_eq!(px, [0, 5, 0, 254, 5, 254]);
    }

    #[test]
    fn equalize_of_a_flat_image_is_the_identity() {
        let mut px = vec![77; 300];
        equalize(&mut px);
        assert_eq!(px, vec![77; 300]);
        // Two levels of 600 pixels each: step = 600 // 255 = 2; lut[10] = (0 + 1) // 2 = 0,
        // lut[20] = min(255, (600 + 1) // 2).
        let mut px: Vec<u8> = (0..3600).map(|i| if i % 6 < 3 { 10 } else { 20 }).collect();
        equalize(&mut px);
        assert_eq!(&px[..6], &[0, 0, 0, 255, 255, 255]);
        // Too few pixels off the top bin (step 0): kept, as Pillow does.
        let mut px: Vec<u8> = (0..600).map(|i| if i % 6 < 3 { 10 } else { 20 }).collect();
        equalize(&mut px);
        assert_eq!(&px[..6], &[10, 10, 10, 20, 20, 20]);
    }
}
