//! The size a re-encode targets, and the antialiased downscale that gets there.
//!
//! `fit` never upscales and keeps the aspect ratio to the nearest pixel: the long side becomes
//! `max_side`, the short side is rounded (and at least 1). The downscale is
//! [`crate::resample`]: a triangle filter whose support grows with the scale factor, like
//! Pillow's `resize(.., BILINEAR)` and torchvision's `antialias=True`. It is integer
//! fixed-point arithmetic, so the same input gives the same bytes on every run and every CPU.

use super::CodecError;
use crate::resample::Rect;
use crate::resample::{Resampler, SampleBox, Source, Target};

/// The output size for a `width`×`height` source and a `max_side` (at least 1).
pub(super) fn fit(width: u32, height: u32, max_side: u32) -> (u32, u32) {
    let long = width.max(height);
    if long <= max_side {
        return (width, height);
    }
    // round(short * max_side / long), in u64 to avoid overflow.
    let scale = |short: u32| -> u32 {
        let v = (u64::from(short) * u64::from(max_side) + u64::from(long) / 2) / u64::from(long);
        (v as u32).clamp(1, max_side)
    };
    if width >= height {
        (max_side, scale(height))
    } else {
        (scale(width), max_side)
    }
}

/// Downscales the packed RGB8 `src` (`from`) into `dst` (resized to `to`).
pub(super) fn bilinear(
    resampler: &mut Resampler,
    src: &[u8],
    from: (u32, u32),
    dst: &mut Vec<u8>,
    to: (u32, u32),
) -> Result<(), CodecError> {
    dst.resize(to.0 as usize * to.1 as usize * 3, 0);
    let source = Source {
        pixels: src,
        width: from.0,
        height: from.1,
        bounds: Rect::full(from.0, from.1),
    };
    let sample = SampleBox {
        left: 0.0,
        top: 0.0,
        width: f64::from(from.0),
        height: f64::from(from.1),
    };
    let target = Target {
        pixels: dst,
        width: to.0,
        height: to.1,
        rect: Rect::full(to.0, to.1),
    };
    resampler
        .resample(source, sample, target)
        .map_err(|e| CodecError::Resize {
            from,
            to,
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_keeps_aspect_and_never_upscales() {
        assert_eq!(fit(100, 50, 200), (100, 50));
        assert_eq!(fit(100, 50, 100), (100, 50));
        assert_eq!(fit(100, 50, 10), (10, 5));
        assert_eq!(fit(50, 100, 10), (5, 10));
        assert_eq!(fit(1000, 3, 10), (10, 1)); // rounds 0.03 up to the 1-pixel minimum
        assert_eq!(fit(640, 481, 256), (256, 192)); // 192.4
        assert_eq!(fit(640, 483, 256), (256, 193)); // 193.2
        assert_eq!(fit(u32::MAX, u32::MAX - 1, 7), (7, 7));
        assert_eq!(fit(5, 5, 1), (1, 1));
    }

    /// `len` bytes of xorshift64 noise from the state `x`.
    fn noise(len: u32, x: &mut u64) -> Vec<u8> {
        (0..len)
            .map(|_| {
                *x ^= *x << 13;
                *x ^= *x >> 7;
                *x ^= *x << 17;
                *x as u8
            })
            .collect()
    }

    #[test]
    fn bilinear_averages_a_flat_image_to_itself() {
        let src = vec![77u8; 40 * 30 * 3];
        let mut dst = Vec::new();
        bilinear(&mut Resampler::new(), &src, (40, 30), &mut dst, (8, 6)).unwrap();
        assert_eq!(dst.len(), 8 * 6 * 3);
        assert!(dst.iter().all(|&b| b == 77));
    }

    /// The re-encode's downscale is fir's `Convolution(Bilinear)`, bit for bit (the packer's
    /// output did not change when fir was replaced).
    #[test]
    fn bilinear_is_fir_bit_for_bit() {
        use fast_image_resize::images::{Image, ImageRef};
        use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut resampler = Resampler::new();
        for (from, to) in [((173, 91), (64, 34)), ((640, 481), (256, 192)), ((1000, 3), (10, 1))] {
            let src = noise(from.0 * from.1 * 3, &mut x);
            let mut ours = Vec::new();
            bilinear(&mut resampler, &src, from, &mut ours, to).unwrap();
            let image = ImageRef::new(from.0, from.1, &src, PixelType::U8x3).unwrap();
            let mut fir = Image::new(to.0, to.1, PixelType::U8x3);
            let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
            Resizer::new().resize(&image, &mut fir, &options).unwrap();
            assert!(ours == fir.buffer(), "{from:?} -> {to:?}");
        }
    }

    /// The resampler picks a build of its kernels by CPU; every build must give the same
    /// bytes, or re-encoded files would depend on the CPU that packed them.
    #[test]
    fn bilinear_is_identical_for_every_cpu_extension() {
        let (from, to) = ((173, 91), (64, 34));
        let src = noise(from.0 * from.1 * 3, &mut 0x2545_F491_4F6C_DD1Du64);
        let mut outputs = crate::resample::every_isa().into_iter().map(|(name, mut r)| {
            let mut dst = Vec::new();
            bilinear(&mut r, &src, from, &mut dst, to).unwrap();
            (name, dst)
        });
        let (_, portable) = outputs.next().expect("the portable build");
        for (name, dst) in outputs {
            assert!(dst == portable, "{name} differs from the portable build");
        }
    }
}
