//! The current photometric kernels, public (with the `reference` feature) so the benches can time
//! them against `reference`'s scalar ones in the same run. Same signatures as `reference`.

/// `adjust_brightness(x, f)` on packed RGB8 pixels.
pub fn brightness(px: &mut [u8], f: f64) {
    crate::color::brightness(px, f);
}

/// `adjust_contrast(x, f)` on packed RGB8 pixels.
pub fn contrast(px: &mut [u8], f: f64) {
    crate::color::contrast(px, f);
}

/// `adjust_saturation(x, f)` on packed RGB8 pixels.
pub fn saturation(px: &mut [u8], f: f64) {
    crate::color::saturation(px, f);
}

/// `adjust_hue(x, f)` on packed RGB8 pixels, `f` in `-0.5..=0.5`.
pub fn hue(px: &mut [u8], f: f64) {
    crate::color::hue(px, f);
}

/// `adjust_sharpness(x, f)` on a `width`×`height` packed RGB8 image; `scratch` is reused.
pub fn sharpness(px: &mut [u8], width: usize, height: usize, f: f64, scratch: &mut Vec<u8>) {
    crate::color::sharpness(px, width, height, f, scratch);
}

/// `gaussian_blur(x, kernel, sigma)` on a `width`×`height` packed RGB8 image; the vectors are
/// reused scratch.
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
    crate::blur::gaussian_blur(px, width, height, kernel, sigma, tmp, kx, ky);
}
