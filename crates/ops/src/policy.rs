//! The automatic augmentation policies, torchvision v2's `_auto_augment.py`: TrivialAugmentWide,
//! RandAugment and AutoAugment, with their augmentation spaces, magnitude bins and draw order.
//!
//! Draws, as torchvision makes them (our generator in place of torch's):
//! - TrivialAugmentWide: an op uniform over its 14; for an op with magnitudes, a bin uniform over
//!   `num_magnitude_bins`; for a signed op, a sign (`uniform < = 0.5` negates).
//! - RandAugment: `num_ops` times an op uniform over its 14 (Identity included), at the fixed
//!   `magnitude` bin, and a sign for a signed op.
//! - AutoAugment: a sub-policy uniform over the 25; each of its two ops applies when
//!   `uniform <= p`, at its bin of 10, with a sign for a signed op.
//!
//! Magnitudes are `torch.linspace` values in `f32`, as torchvision reads them.

use super::spec::AutoPolicy;

/// An augmentation of the policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Aug {
    /// Nothing.
    Identity,
    /// Shear along x by `degrees(atan(m))`.
    ShearX,
    /// Shear along y.
    ShearY,
    /// Translate by `int(m)` pixels along x.
    TranslateX,
    /// Along y.
    TranslateY,
    /// Rotate by `m` degrees.
    Rotate,
    /// `adjust_brightness(1 + m)`.
    Brightness,
    /// `adjust_saturation(1 + m)`.
    Color,
    /// `adjust_contrast(1 + m)`.
    Contrast,
    /// `adjust_sharpness(1 + m)`.
    Sharpness,
    /// `posterize(int(m))`.
    Posterize,
    /// `solarize(255 · m)`.
    Solarize,
    /// `autocontrast`.
    AutoContrast,
    /// `equalize`.
    Equalize,
    /// `invert`.
    Invert,
}

impl Aug {
    /// torchvision's key for the op.
    pub(super) fn name(self) -> &'static str {
        match self {
            Aug::Identity => "Identity",
            Aug::ShearX => "ShearX",
            Aug::ShearY => "ShearY",
            Aug::TranslateX => "TranslateX",
            Aug::TranslateY => "TranslateY",
            Aug::Rotate => "Rotate",
            Aug::Brightness => "Brightness",
            Aug::Color => "Color",
            Aug::Contrast => "Contrast",
            Aug::Sharpness => "Sharpness",
            Aug::Posterize => "Posterize",
            Aug::Solarize => "Solarize",
            Aug::AutoContrast => "AutoContrast",
            Aug::Equalize => "Equalize",
            Aug::Invert => "Invert",
        }
    }

    /// Whether the magnitude's sign is drawn.
    pub(super) fn signed(self) -> bool {
        matches!(
            self,
            Aug::ShearX
                | Aug::ShearY
                | Aug::TranslateX
                | Aug::TranslateY
                | Aug::Rotate
                | Aug::Brightness
                | Aug::Color
                | Aug::Contrast
                | Aug::Sharpness
        )
    }
}

/// The space of a policy: which ops, and their magnitude ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Space {
    /// TrivialAugmentWide's.
    Wide,
    /// RandAugment's and AutoAugment's.
    Standard,
}

/// The ops of TrivialAugmentWide and RandAugment, in torchvision's dictionary order.
pub(super) const OPS14: [Aug; 14] = [
    Aug::Identity,
    Aug::ShearX,
    Aug::ShearY,
    Aug::TranslateX,
    Aug::TranslateY,
    Aug::Rotate,
    Aug::Brightness,
    Aug::Color,
    Aug::Contrast,
    Aug::Sharpness,
    Aug::Posterize,
    Aug::Solarize,
    Aug::AutoContrast,
    Aug::Equalize,
];

/// `torch.linspace(start, end, steps)[i]` in `f32`.
pub(super) fn linspace(start: f32, end: f32, steps: u32, i: u32) -> f32 {
    if steps <= 1 {
        return start;
    }
    let step = (end - start) / (steps - 1) as f32;
    if i < steps / 2 {
        start + step * i as f32
    } else {
        end - step * (steps - 1 - i) as f32
    }
}

/// The magnitude of `aug` at bin `i` of `bins`, for an image `width`×`height`; `None` for ops
/// without magnitudes.
pub(super) fn magnitude(space: Space, aug: Aug, bins: u32, i: u32, width: u32, height: u32) -> Option<f64> {
    let wide = space == Space::Wide;
    let lin = |end: f32| Some(f64::from(linspace(0.0, end, bins, i)));
    match aug {
        Aug::Identity | Aug::AutoContrast | Aug::Equalize | Aug::Invert => None,
        Aug::ShearX | Aug::ShearY => lin(if wide { 0.99 } else { 0.3 }),
        Aug::TranslateX => lin(if wide { 32.0 } else { 150.0 / 331.0 * width as f32 }),
        Aug::TranslateY => lin(if wide { 32.0 } else { 150.0 / 331.0 * height as f32 }),
        Aug::Rotate => lin(if wide { 135.0 } else { 30.0 }),
        Aug::Brightness | Aug::Color | Aug::Contrast | Aug::Sharpness => lin(if wide { 0.99 } else { 0.9 }),
        Aug::Posterize => {
            // (8 - arange(bins) / ((bins - 1) / k)).round().int(), in f32.
            let k = if wide { 6.0f32 } else { 4.0 };
            let v = 8.0f32 - i as f32 / ((bins - 1) as f32 / k);
            Some(f64::from(v.round_ties_even()))
        }
        Aug::Solarize => Some(f64::from(linspace(1.0, 0.0, bins, i))),
    }
}

/// A sub-policy step of AutoAugment: the op, its probability and its bin of 10.
pub(super) type Step = (Aug, f64, Option<u32>);

/// AutoAugment's sub-policies.
pub(super) fn auto_policies(p: AutoPolicy) -> &'static [[Step; 2]] {
    use Aug::*;
    match p {
        AutoPolicy::Imagenet => &[
            [(Posterize, 0.4, Some(8)), (Rotate, 0.6, Some(9))],
            [(Solarize, 0.6, Some(5)), (AutoContrast, 0.6, None)],
            [(Equalize, 0.8, None), (Equalize, 0.6, None)],
            [(Posterize, 0.6, Some(7)), (Posterize, 0.6, Some(6))],
            [(Equalize, 0.4, None), (Solarize, 0.2, Some(4))],
            [(Equalize, 0.4, None), (Rotate, 0.8, Some(8))],
            [(Solarize, 0.6, Some(3)), (Equalize, 0.6, None)],
            [(Posterize, 0.8, Some(5)), (Equalize, 1.0, None)],
            [(Rotate, 0.2, Some(3)), (Solarize, 0.6, Some(8))],
            [(Equalize, 0.6, None), (Posterize, 0.4, Some(6))],
            [(Rotate, 0.8, Some(8)), (Color, 0.4, Some(0))],
            [(Rotate, 0.4, Some(9)), (Equalize, 0.6, None)],
            [(Equalize, 0.0, None), (Equalize, 0.8, None)],
            [(Invert, 0.6, None), (Equalize, 1.0, None)],
            [(Color, 0.6, Some(4)), (Contrast, 1.0, Some(8))],
            [(Rotate, 0.8, Some(8)), (Color, 1.0, Some(2))],
            [(Color, 0.8, Some(8)), (Solarize, 0.8, Some(7))],
            [(Sharpness, 0.4, Some(7)), (Invert, 0.6, None)],
            [(ShearX, 0.6, Some(5)), (Equalize, 1.0, None)],
            [(Color, 0.4, Some(0)), (Equalize, 0.6, None)],
            [(Equalize, 0.4, None), (Solarize, 0.2, Some(4))],
            [(Solarize, 0.6, Some(5)), (AutoContrast, 0.6, None)],
            [(Invert, 0.6, None), (Equalize, 1.0, None)],
            [(Color, 0.6, Some(4)), (Contrast, 1.0, Some(8))],
            [(Equalize, 0.8, None), (Equalize, 0.6, None)],
        ],
        AutoPolicy::Cifar10 => &[
            [(Invert, 0.1, None), (Contrast, 0.2, Some(6))],
            [(Rotate, 0.7, Some(2)), (TranslateX, 0.3, Some(9))],
            [(Sharpness, 0.8, Some(1)), (Sharpness, 0.9, Some(3))],
            [(ShearY, 0.5, Some(8)), (TranslateY, 0.7, Some(9))],
            [(AutoContrast, 0.5, None), (Equalize, 0.9, None)],
            [(ShearY, 0.2, Some(7)), (Posterize, 0.3, Some(7))],
            [(Color, 0.4, Some(3)), (Brightness, 0.6, Some(7))],
            [(Sharpness, 0.3, Some(9)), (Brightness, 0.7, Some(9))],
            [(Equalize, 0.6, None), (Equalize, 0.5, None)],
            [(Contrast, 0.6, Some(7)), (Sharpness, 0.6, Some(5))],
            [(Color, 0.7, Some(7)), (TranslateX, 0.5, Some(8))],
            [(Equalize, 0.3, None), (AutoContrast, 0.4, None)],
            [(TranslateY, 0.4, Some(3)), (Sharpness, 0.2, Some(6))],
            [(Brightness, 0.9, Some(6)), (Color, 0.2, Some(8))],
            [(Solarize, 0.5, Some(2)), (Invert, 0.0, None)],
            [(Equalize, 0.2, None), (AutoContrast, 0.6, None)],
            [(Equalize, 0.2, None), (Equalize, 0.6, None)],
            [(Color, 0.9, Some(9)), (Equalize, 0.6, None)],
            [(AutoContrast, 0.8, None), (Solarize, 0.2, Some(8))],
            [(Brightness, 0.1, Some(3)), (Color, 0.7, Some(0))],
            [(Solarize, 0.4, Some(5)), (AutoContrast, 0.9, None)],
            [(TranslateY, 0.9, Some(9)), (TranslateY, 0.7, Some(9))],
            [(AutoContrast, 0.9, None), (Solarize, 0.8, Some(3))],
            [(Equalize, 0.8, None), (Invert, 0.1, None)],
            [(TranslateY, 0.7, Some(9)), (AutoContrast, 0.9, None)],
        ],
        AutoPolicy::Svhn => &[
            [(ShearX, 0.9, Some(4)), (Invert, 0.2, None)],
            [(ShearY, 0.9, Some(8)), (Invert, 0.7, None)],
            [(Equalize, 0.6, None), (Solarize, 0.6, Some(6))],
            [(Invert, 0.9, None), (Equalize, 0.6, None)],
            [(Equalize, 0.6, None), (Rotate, 0.9, Some(3))],
            [(ShearX, 0.9, Some(4)), (AutoContrast, 0.8, None)],
            [(ShearY, 0.9, Some(8)), (Invert, 0.4, None)],
            [(ShearY, 0.9, Some(5)), (Solarize, 0.2, Some(6))],
            [(Invert, 0.9, None), (AutoContrast, 0.8, None)],
            [(Equalize, 0.6, None), (Rotate, 0.9, Some(3))],
            [(ShearX, 0.9, Some(4)), (Solarize, 0.3, Some(3))],
            [(ShearY, 0.8, Some(8)), (Invert, 0.7, None)],
            [(Equalize, 0.9, None), (TranslateY, 0.6, Some(6))],
            [(Invert, 0.9, None), (Equalize, 0.6, None)],
            [(Contrast, 0.3, Some(3)), (Rotate, 0.8, Some(4))],
            [(Invert, 0.8, None), (TranslateY, 0.0, Some(2))],
            [(ShearY, 0.7, Some(6)), (Solarize, 0.4, Some(8))],
            [(Invert, 0.6, None), (Rotate, 0.8, Some(4))],
            [(ShearY, 0.3, Some(7)), (TranslateX, 0.9, Some(3))],
            [(ShearX, 0.1, Some(6)), (Invert, 0.6, None)],
            [(Solarize, 0.7, Some(2)), (TranslateY, 0.6, Some(7))],
            [(ShearY, 0.8, Some(4)), (Invert, 0.8, None)],
            [(ShearX, 0.7, Some(9)), (TranslateY, 0.8, Some(3))],
            [(ShearY, 0.8, Some(5)), (AutoContrast, 0.7, None)],
            [(ShearX, 0.7, Some(2)), (Invert, 0.1, None)],
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magnitudes_match_torchvision() {
        // torch.linspace(0.0, 0.99, 31)[30] == 0.99; [15] == 0.495.
        assert!((linspace(0.0, 0.99, 31, 30) - 0.99).abs() < 1e-7);
        assert!((linspace(0.0, 0.99, 31, 15) - 0.495).abs() < 1e-6);
        // TrivialAugmentWide posterize: 8 - i / 5 rounded: bin 0 -> 8, 30 -> 2, 13 -> round(5.4) = 5.
        let post = |i| magnitude(Space::Wide, Aug::Posterize, 31, i, 1, 1).unwrap();
        assert_eq!((post(0), post(30), post(13)), (8.0, 2.0, 5.0));
        // RandAugment magnitude 9 of 31: rotate 9 degrees, solarize threshold 1 - 0.3.
        assert!((magnitude(Space::Standard, Aug::Rotate, 31, 9, 1, 1).unwrap() - 9.0).abs() < 1e-5);
        assert!((magnitude(Space::Standard, Aug::Solarize, 31, 9, 1, 1).unwrap() - 0.7).abs() < 1e-6);
        assert_eq!(magnitude(Space::Wide, Aug::Equalize, 31, 3, 1, 1), None);
        let t = magnitude(Space::Standard, Aug::TranslateX, 31, 30, 331, 10).unwrap();
        assert!((t - 150.0).abs() < 1e-3);
    }

    #[test]
    fn every_policy_has_25_sub_policies() {
        for p in [AutoPolicy::Imagenet, AutoPolicy::Cifar10, AutoPolicy::Svhn] {
            assert_eq!(auto_policies(p).len(), 25);
        }
    }
}
