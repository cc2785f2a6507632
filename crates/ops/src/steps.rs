//! The per-image ops after a view's geometric prefix, as concrete steps: what an op drew, made
//! into operations with their parameters (brightness 1.286, then hue -0.05, then a warp by this
//! matrix). The CPU path lowers each such op ([`lower`]) and runs its steps at once
//! ([`Processor::exec`](super::Processor)); hybrid decode (control 1.8) lowers a GPU sample's whole
//! tail the same way and hands the steps to the client as `gpu_ops` records ([`Step::record`]),
//! so a sample's draws are the same wherever its pixels are made.
//!
//! Draws, in torchvision's order, from the image's generator (the same calls the ops made when
//! they drew and applied in one go: no draw depends on pixels, only on the image's size, which
//! these ops keep):
//! - flips: a coin; ColorJitter: `randperm(4)`, then a factor per member present;
//!   GaussianBlur: sigma; the tone ops, grayscale and sharpness: a coin;
//! - the policies (`policy`): an augmentation and its magnitude, per op of the policy;
//! - `random_apply`: a coin, then its ops; `random_choice`: a uniform pick, then that op.

use ringfeed_format::ring::gpu_ops::{self, Kind, Record};
use ringfeed_order::rng::SampleRng;

use super::affine;
use super::policy::{self, Aug};
use super::spec::{Interpolation, Op, WarpFill};
use super::trace::Trace;

/// A pixel permutation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remap {
    /// Mirror left to right.
    FlipX,
    /// Mirror top to bottom.
    FlipY,
    /// `torch.rot90` once (counter-clockwise; square images).
    Rot90,
    /// Twice.
    Rot180,
    /// Three times (square images).
    Rot270,
}

impl Remap {
    /// `(ax, bx, cx, ay, by, cy)`: output `(x, y)` reads source `(ax·x + bx·y + cx, ay·x + by·y + cy)`.
    pub fn coefficients(self, (w, h): (u32, u32)) -> [i64; 6] {
        let (w1, h1) = (i64::from(w) - 1, i64::from(h) - 1);
        match self {
            Remap::FlipX => [-1, 0, w1, 0, 1, 0],
            Remap::FlipY => [1, 0, 0, 0, -1, h1],
            Remap::Rot180 => [-1, 0, w1, 0, -1, h1],
            Remap::Rot90 => [0, -1, w1, 1, 0, 0],
            Remap::Rot270 => [0, 1, 0, -1, 0, h1],
        }
    }
}

/// One concrete operation on one image, keeping its size. Factors are the ops' `f64` values; the
/// kernels (CPU and GPU) compute in `f32` from them as ring.md's `gpu_ops` table says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    Remap(Remap),
    Brightness(f64),
    Contrast(f64),
    Saturation(f64),
    Hue(f64),
    Grayscale,
    Solarize(f64),
    Posterize(u8),
    Invert,
    Autocontrast,
    Equalize,
    Sharpness(f64),
    Blur {
        kernel: (u32, u32),
        sigma: f64,
    },
    /// A warp by the inverse matrix `matrix` (torchvision's `_get_inverse_affine_matrix`);
    /// bicubic samples as nearest (torchvision's tensor `affine` does).
    Affine {
        matrix: [f64; 6],
        interp: Interpolation,
        fill: WarpFill,
    },
}

impl Step {
    /// The `gpu_ops` record of this step on an image of `(width, height)` (ring.md).
    pub fn record(&self, size: (u32, u32)) -> Record {
        let f = |v: f64| v as f32;
        match *self {
            Step::Remap(r) => Record::new(Kind::Remap, 0, &r.coefficients(size).map(|v| v as f32)),
            Step::Brightness(v) => Record::new(Kind::Blend, gpu_ops::blend::BRIGHTNESS, &[f(v), 0.0]),
            Step::Contrast(v) => Record::new(Kind::Blend, gpu_ops::blend::CONTRAST, &[f(v), f(1.0 - v)]),
            Step::Saturation(v) => Record::new(Kind::Blend, gpu_ops::blend::SATURATION, &[f(v), f(1.0 - v)]),
            Step::Hue(v) => Record::new(Kind::Hue, 0, &[f(v)]),
            Step::Grayscale => Record::new(Kind::Grayscale, 0, &[]),
            Step::Solarize(t) => Record::new(Kind::Solarize, 0, &[f(t)]),
            Step::Posterize(bits) => Record::new(Kind::Posterize, 0, &[f32::from(super::tone::posterize_mask(bits))]),
            Step::Invert => Record::new(Kind::Invert, 0, &[]),
            Step::Autocontrast => Record::new(Kind::Autocontrast, 0, &[]),
            Step::Equalize => Record::new(Kind::Equalize, 0, &[]),
            Step::Sharpness(v) => Record::new(Kind::Sharpness, 0, &[f(1.0 - v)]),
            Step::Blur {
                kernel: (kx, ky),
                sigma,
            } => {
                // Kernel sides are odd and at most the view's (4096): both fit 16 bits.
                Record::new(Kind::Blur, (kx | ky << 16) as i32, &[f(sigma), f(sigma)])
            }
            Step::Affine { matrix, interp, fill } => {
                let (r, _, _) = affine::grid(size.0, size.1, matrix);
                let arg = match interp {
                    Interpolation::Bilinear => gpu_ops::affine::BILINEAR,
                    Interpolation::Nearest | Interpolation::Bicubic => gpu_ops::affine::NEAREST,
                };
                let (on, c) = fill.map_or((0.0, [0.0; 3]), |c| (1.0, c));
                let p = [r[0], r[1], r[2], r[3], r[4], r[5], on, c[0], c[1], c[2]];
                Record::new(Kind::Affine, arg, &p)
            }
        }
    }
}

/// Whether `op` keeps the image's size and lowers to steps (every op of a container does).
pub fn lowers(op: &Op) -> bool {
    match op {
        Op::RandomApply { ops, .. } | Op::RandomChoice { ops, .. } => ops.iter().all(lowers),
        Op::CenterCrop { .. }
        | Op::RandomCrop { .. }
        | Op::RandomResizedCrop { .. }
        | Op::Resize { .. }
        | Op::RandomIouCrop { .. }
        | Op::RandomZoomOut { .. }
        | Op::ScaleJitter { .. } => false,
        Op::HorizontalFlip { .. }
        | Op::VerticalFlip { .. }
        | Op::ColorJitter { .. }
        | Op::Grayscale { .. }
        | Op::GaussianBlur { .. }
        | Op::Solarize { .. }
        | Op::Posterize { .. }
        | Op::Autocontrast { .. }
        | Op::Equalize { .. }
        | Op::Invert { .. }
        | Op::AdjustSharpness { .. }
        | Op::TrivialAugmentWide { .. }
        | Op::RandAugment { .. }
        | Op::AutoAugment { .. } => true,
    }
}

/// The most steps `op` can lower to (0 for an op that does not lower).
pub fn max_steps(op: &Op) -> u32 {
    match op {
        Op::RandomApply { ops, .. } => ops.iter().map(max_steps).sum(),
        Op::RandomChoice { ops, .. } => ops.iter().map(max_steps).max().unwrap_or(0),
        Op::ColorJitter {
            brightness,
            contrast,
            saturation,
            hue,
        } => [brightness, contrast, saturation, hue]
            .iter()
            .filter(|r| r.is_some())
            .count() as u32,
        Op::RandAugment { num_ops, .. } => *num_ops,
        Op::AutoAugment { policy, .. } => policy::auto_policies(*policy)
            .iter()
            .map(|s| s.len() as u32)
            .max()
            .unwrap_or(0),
        op if lowers(op) => 1,
        _ => 0,
    }
}

/// torchvision's `if torch.rand(1) < p` for `op`, recorded as `apply`.
pub(super) fn coin(op: &Op, p: f64, rng: &mut SampleRng, trace: &mut Trace) -> bool {
    let on = rng.uniform(0.0, 1.0) < p;
    trace.record(op, || [("apply", on.into())]);
    on
}

/// `random_choice`'s pick among `cumulative` (the running sums of its weights), recorded.
pub(super) fn choice(op: &Op, cumulative: &[f64], rng: &mut SampleRng, trace: &mut Trace) -> usize {
    let u = rng.uniform(0.0, 1.0);
    let k = cumulative.iter().position(|&c| u < c).unwrap_or(cumulative.len() - 1);
    trace.record(op, || [("choice", k.into())]);
    k
}

/// Draws what `op` does to an image of `(w, h)` and appends its steps to `out`. `op` must
/// [`lowers`].
pub(super) fn lower(op: &Op, (w, h): (u32, u32), rng: &mut SampleRng, trace: &mut Trace, out: &mut Vec<Step>) {
    match *op {
        Op::HorizontalFlip { p } | Op::VerticalFlip { p } => {
            let on = rng.uniform(0.0, 1.0) < p;
            trace.record(op, || [("flip", on.into())]);
            if on {
                let r = if matches!(op, Op::HorizontalFlip { .. }) {
                    Remap::FlipX
                } else {
                    Remap::FlipY
                };
                out.push(Step::Remap(r));
            }
        }
        Op::ColorJitter {
            brightness,
            contrast,
            saturation,
            hue,
        } => {
            let order = perm4(rng);
            let draw = |rng: &mut SampleRng, r: Option<(f64, f64)>| r.map(|(lo, hi)| rng.uniform(lo, hi));
            let f = [
                draw(rng, brightness),
                draw(rng, contrast),
                draw(rng, saturation),
                draw(rng, hue),
            ];
            trace.record(op, || {
                [
                    ("order", order.iter().map(|&i| u32::from(i)).collect::<Vec<_>>().into()),
                    ("brightness", f[0].into()),
                    ("contrast", f[1].into()),
                    ("saturation", f[2].into()),
                    ("hue", f[3].into()),
                ]
            });
            for i in order {
                if let Some(v) = f[i as usize] {
                    out.push(match i {
                        0 => Step::Brightness(v),
                        1 => Step::Contrast(v),
                        2 => Step::Saturation(v),
                        _ => Step::Hue(v),
                    });
                }
            }
        }
        Op::GaussianBlur { kernel, sigma } => {
            let s = rng.uniform(sigma.0, sigma.1);
            trace.record(op, || [("sigma", s.into())]);
            out.push(Step::Blur { kernel, sigma: s });
        }
        Op::Grayscale { p } => push_if(coin(op, p, rng, trace), Step::Grayscale, out),
        Op::Solarize { threshold, p } => push_if(coin(op, p, rng, trace), Step::Solarize(threshold), out),
        Op::Posterize { bits, p } => push_if(coin(op, p, rng, trace), Step::Posterize(bits), out),
        Op::Autocontrast { p } => push_if(coin(op, p, rng, trace), Step::Autocontrast, out),
        Op::Equalize { p } => push_if(coin(op, p, rng, trace), Step::Equalize, out),
        Op::Invert { p } => push_if(coin(op, p, rng, trace), Step::Invert, out),
        Op::AdjustSharpness { factor, p } => push_if(coin(op, p, rng, trace), Step::Sharpness(factor), out),
        Op::TrivialAugmentWide {
            bins,
            interpolation,
            fill,
        } => {
            let aug = policy::OPS14[rng.below(14) as usize];
            let m = draw_magnitude(policy::Space::Wide, aug, bins, None, (w, h), rng);
            trace.record(op, || [("aug", aug.name().into()), ("magnitude", m.into())]);
            augment(aug, m.unwrap_or(0.0), (w, h), interpolation, fill, out);
        }
        Op::RandAugment {
            num_ops,
            magnitude,
            bins,
            interpolation,
            fill,
        } => {
            for _ in 0..num_ops {
                let aug = policy::OPS14[rng.below(14) as usize];
                let m = draw_magnitude(policy::Space::Standard, aug, bins, Some(magnitude), (w, h), rng);
                trace.record(op, || [("aug", aug.name().into()), ("magnitude", m.into())]);
                augment(aug, m.unwrap_or(0.0), (w, h), interpolation, fill, out);
            }
        }
        Op::AutoAugment {
            policy: which,
            interpolation,
            fill,
        } => {
            let subs = policy::auto_policies(which);
            let k = rng.below(subs.len() as u64) as usize;
            for &(aug, p, bin) in &subs[k] {
                // torchvision: `if not torch.rand(()) <= p: continue`.
                if rng.uniform(0.0, 1.0) > p {
                    trace.record(op, || {
                        [
                            ("policy", k.into()),
                            ("aug", aug.name().into()),
                            ("apply", false.into()),
                        ]
                    });
                    continue;
                }
                let m = match bin {
                    Some(b) => draw_magnitude(policy::Space::Standard, aug, 10, Some(b), (w, h), rng),
                    None => None,
                };
                trace.record(op, || {
                    [
                        ("policy", k.into()),
                        ("aug", aug.name().into()),
                        ("apply", true.into()),
                        ("magnitude", m.into()),
                    ]
                });
                augment(aug, m.unwrap_or(0.0), (w, h), interpolation, fill, out);
            }
        }
        Op::RandomApply { p, ref ops } => {
            if coin(op, p, rng, trace) {
                for o in ops {
                    lower(o, (w, h), rng, trace, out);
                }
            }
        }
        Op::RandomChoice {
            ref ops,
            ref cumulative,
        } => {
            let k = choice(op, cumulative, rng, trace);
            lower(&ops[k], (w, h), rng, trace, out);
        }
        // The sized ops, which `lowers` refuses.
        _ => {
            unreachable!("{} changes the image's size: it does not lower to steps", op.name())
        }
    }
}

fn push_if(on: bool, step: Step, out: &mut Vec<Step>) {
    if on {
        out.push(step);
    }
}

/// torch's `randperm(4)`: a uniform permutation (Fisher–Yates from the top).
fn perm4(rng: &mut SampleRng) -> [u8; 4] {
    let mut p = [0u8, 1, 2, 3];
    for i in (1..4).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        p.swap(i, j);
    }
    p
}

/// A policy op's magnitude: bin `fixed` or one drawn uniformly, then the sign for a signed op
/// (`uniform <= 0.5` negates). `None` for ops without magnitudes (no draws).
fn draw_magnitude(
    space: policy::Space,
    aug: Aug,
    bins: u32,
    fixed: Option<u32>,
    (w, h): (u32, u32),
    rng: &mut SampleRng,
) -> Option<f64> {
    policy::magnitude(space, aug, bins, 0, w, h)?;
    let bin = fixed.unwrap_or_else(|| rng.below(u64::from(bins)) as u32);
    let mut m = policy::magnitude(space, aug, bins, bin, w, h)?;
    if aug.signed() && rng.uniform(0.0, 1.0) <= 0.5 {
        m = -m;
    }
    Some(m)
}

/// torchvision's `_apply_image_or_video_transform` for one policy augmentation, as steps.
fn augment(aug: Aug, m: f64, (w, h): (u32, u32), interp: Interpolation, fill: WarpFill, out: &mut Vec<Step>) {
    let (wf, hf) = (f64::from(w), f64::from(h));
    let warp = |matrix: [f64; 6]| Step::Affine { matrix, interp, fill };
    let step = match aug {
        Aug::Identity => return,
        Aug::ShearX | Aug::ShearY => {
            // center=[0, 0]: torchvision's centre offset is then `-size / 2`.
            let deg = m.atan().to_degrees();
            let shear = if aug == Aug::ShearX { (deg, 0.0) } else { (0.0, deg) };
            warp(affine::inverse_matrix(
                (-wf * 0.5, -hf * 0.5),
                0.0,
                (0.0, 0.0),
                1.0,
                shear,
            ))
        }
        Aug::TranslateX | Aug::TranslateY => {
            let t = m.trunc();
            let tr = if aug == Aug::TranslateX { (t, 0.0) } else { (0.0, t) };
            warp(affine::inverse_matrix((0.0, 0.0), 0.0, tr, 1.0, (0.0, 0.0)))
        }
        Aug::Rotate => {
            let angle = m.rem_euclid(360.0);
            // torchvision rotates by 180 (and by 90/270 when square) with rot90, exactly.
            if angle == 0.0 {
                return;
            } else if angle == 180.0 {
                Step::Remap(Remap::Rot180)
            } else if w == h && angle == 90.0 {
                Step::Remap(Remap::Rot90)
            } else if w == h && angle == 270.0 {
                Step::Remap(Remap::Rot270)
            } else {
                warp(affine::inverse_matrix((0.0, 0.0), -angle, (0.0, 0.0), 1.0, (0.0, 0.0)))
            }
        }
        Aug::Brightness => Step::Brightness(1.0 + m),
        Aug::Color => Step::Saturation(1.0 + m),
        Aug::Contrast => Step::Contrast(1.0 + m),
        Aug::Sharpness => Step::Sharpness(1.0 + m),
        Aug::Posterize => Step::Posterize(m as u8),
        Aug::Solarize => Step::Solarize(255.0 * m),
        Aug::AutoContrast => Step::Autocontrast,
        Aug::Equalize => Step::Equalize,
        Aug::Invert => Step::Invert,
    };
    out.push(step);
}
