//! The pipeline a stream runs (`proto/control.md`, "Pipelines"): views of ops, parsed from the
//! `open` message's JSON, validated with messages that name the op and the member, and with
//! every view's output shape declared before any data flows.
//!
//! Parsing is by hand over [`serde_json::Value`] rather than by derive: a bad member must be
//! named by its path (`pipeline.views[0].ops[2].brightness`) and its op, which is what a user
//! needs to find the line of their `Compose([...])` that is wrong.

use serde_json::{Map, Value};

use super::MAX_SIZE;

/// Most views in a pipeline, and most outputs of one view (`count`).
pub const MAX_VIEWS: usize = 16;
/// Most outputs of one sample over all views (DINO: 2 + 8 + headroom).
pub const MAX_OUTPUTS: u32 = 64;
/// Deepest nesting of `random_apply` / `random_choice`.
const MAX_DEPTH: usize = 4;
/// Longest view name: the ring's field names hold 16 bytes, and a view may add `_erase`.
pub const MAX_VIEW_NAME: usize = 10;

/// How a geometric op samples between pixels (torchvision's `InterpolationMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Interpolation {
    /// `NEAREST`: the source pixel under the output pixel's centre (PyTorch's `nearest`).
    Nearest,
    /// `BILINEAR`.
    Bilinear,
    /// `BICUBIC`.
    Bicubic,
}

impl Interpolation {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "nearest" => Some(Interpolation::Nearest),
            "bilinear" => Some(Interpolation::Bilinear),
            "bicubic" => Some(Interpolation::Bicubic),
            _ => None,
        }
    }
}

/// The resampling of a resize: interpolation and antialiasing (torchvision's
/// `antialias=True`, the default, widens the filter when downscaling; it does nothing for
/// `nearest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Resampling {
    /// The interpolation.
    pub interpolation: Interpolation,
    /// Whether the filter widens when downscaling.
    pub antialias: bool,
}

impl Default for Resampling {
    fn default() -> Self {
        Resampling {
            interpolation: Interpolation::Bilinear,
            antialias: true,
        }
    }
}

/// `Resize`'s size: the shorter side, or exactly `(height, width)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResizeTo {
    /// The shorter side becomes this; the longer keeps the aspect ratio (truncated).
    Shorter(u32),
    /// Exactly `(height, width)`.
    Exact(u32, u32),
}

/// AutoAugment's learned policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AutoPolicy {
    /// `AutoAugmentPolicy.IMAGENET`.
    Imagenet,
    /// `AutoAugmentPolicy.CIFAR10`.
    Cifar10,
    /// `AutoAugmentPolicy.SVHN`.
    Svhn,
}

/// The fill of an affine warp's uncovered pixels: torchvision's `fill=None` (the sampler's
/// zero padding, blended as it samples) differs from `fill=0` (a mask) for bilinear warps.
pub type WarpFill = Option<[f32; 3]>;

/// What RandomErasing writes into its box (applied by the client, after normalisation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EraseValue {
    /// One value per channel (a single value is repeated).
    Constant([f32; 3]),
    /// Standard normal noise.
    Random,
}

/// One op of a view (control.md, "Pipelines", the op table). Probabilities are in `0..=1`.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `RandomResizedCrop(size, scale, ratio, interpolation, antialias)`.
    RandomResizedCrop {
        /// `(height, width)`.
        size: (u32, u32),
        /// Bounds of the crop's area fraction.
        scale: (f64, f64),
        /// Bounds of its aspect ratio (width / height), sampled log-uniformly.
        ratio: (f64, f64),
        /// How the crop is resized.
        resampling: Resampling,
    },
    /// `Resize(size, interpolation, max_size, antialias)`.
    Resize {
        /// The target.
        size: ResizeTo,
        /// With [`ResizeTo::Shorter`]: the longer side is at most this.
        max_size: Option<u32>,
        /// How the image is resized.
        resampling: Resampling,
    },
    /// `CenterCrop(size)`: zero padding where the crop is larger.
    CenterCrop {
        /// `(height, width)`.
        size: (u32, u32),
    },
    /// `RandomCrop(size, padding, pad_if_needed, fill, padding_mode="constant")`.
    RandomCrop {
        /// `(height, width)`.
        size: (u32, u32),
        /// `(left, top, right, bottom)`.
        padding: [u32; 4],
        /// Pad a side that is shorter than the crop.
        pad_if_needed: bool,
        /// The padding's colour.
        fill: [u8; 3],
    },
    /// `RandomHorizontalFlip(p)`.
    HorizontalFlip {
        /// Probability.
        p: f64,
    },
    /// `RandomVerticalFlip(p)`.
    VerticalFlip {
        /// Probability.
        p: f64,
    },
    /// `ColorJitter`: factor ranges, `None` where the adjustment is off; a random order per
    /// sample.
    ColorJitter {
        /// Brightness factor range, `0 <= lo <= hi`.
        brightness: Option<(f64, f64)>,
        /// Contrast factor range.
        contrast: Option<(f64, f64)>,
        /// Saturation factor range.
        saturation: Option<(f64, f64)>,
        /// Hue shift range, in `-0.5..=0.5` of the colour circle.
        hue: Option<(f64, f64)>,
    },
    /// `RandomGrayscale(p)`: three equal channels.
    Grayscale {
        /// Probability.
        p: f64,
    },
    /// `GaussianBlur(kernel_size, sigma)`: a sigma uniform in the range per sample.
    GaussianBlur {
        /// Kernel size `(x, y)`, odd.
        kernel: (u32, u32),
        /// Sigma range, `0 < lo <= hi`.
        sigma: (f64, f64),
    },
    /// `RandomSolarize(threshold, p)`.
    Solarize {
        /// Pixels `>= threshold` are inverted.
        threshold: f64,
        /// Probability.
        p: f64,
    },
    /// `RandomPosterize(bits, p)`.
    Posterize {
        /// Bits kept, `0..=8`.
        bits: u8,
        /// Probability.
        p: f64,
    },
    /// `RandomAutocontrast(p)`.
    Autocontrast {
        /// Probability.
        p: f64,
    },
    /// `RandomEqualize(p)`.
    Equalize {
        /// Probability.
        p: f64,
    },
    /// `RandomAdjustSharpness(sharpness_factor, p)`.
    AdjustSharpness {
        /// `>= 0`; 1 is the identity.
        factor: f64,
        /// Probability.
        p: f64,
    },
    /// `RandomInvert(p)`.
    Invert {
        /// Probability.
        p: f64,
    },
    /// `TrivialAugmentWide(num_magnitude_bins, interpolation, fill)`.
    TrivialAugmentWide {
        /// Magnitude bins, `>= 2`.
        bins: u32,
        /// Interpolation of the geometric ops (`nearest` or `bilinear`).
        interpolation: Interpolation,
        /// Their fill.
        fill: WarpFill,
    },
    /// `RandAugment(num_ops, magnitude, num_magnitude_bins, interpolation, fill)`.
    RandAugment {
        /// Ops applied in sequence.
        num_ops: u32,
        /// The magnitude bin, `< bins`.
        magnitude: u32,
        /// Magnitude bins, `>= 2`.
        bins: u32,
        /// Interpolation of the geometric ops.
        interpolation: Interpolation,
        /// Their fill.
        fill: WarpFill,
    },
    /// `AutoAugment(policy, interpolation, fill)`.
    AutoAugment {
        /// The policy.
        policy: AutoPolicy,
        /// Interpolation of the geometric ops.
        interpolation: Interpolation,
        /// Their fill.
        fill: WarpFill,
    },
    /// `RandomApply(ops, p)`: all of `ops`, in order, with probability `p`.
    RandomApply {
        /// Probability.
        p: f64,
        /// The ops.
        ops: Vec<Op>,
    },
    /// `RandomChoice(ops, p)`: one of `ops`.
    RandomChoice {
        /// The choices.
        ops: Vec<Op>,
        /// Cumulative probabilities, normalised: the last is 1.
        cumulative: Vec<f64>,
    },
    /// `RandomIoUCrop(min_scale, max_scale, min_aspect_ratio, max_aspect_ratio,
    /// sampler_options, trials)` (1.10): a crop whose draws depend on the sample's boxes.
    RandomIouCrop {
        /// `(min_scale, max_scale)`, `0 < min <= max <= 1`: each side's fraction.
        scale: (f64, f64),
        /// `(min_aspect_ratio, max_aspect_ratio)` of the crop (width / height).
        aspect: (f64, f64),
        /// The minimal IoUs drawn from; a value `>= 1` leaves the image as it is.
        options: Vec<f64>,
        /// Tries per drawn option.
        trials: u32,
    },
    /// `RandomZoomOut(fill, side_range, p)` (1.10): the image placed in a larger canvas.
    RandomZoomOut {
        /// The canvas's colour.
        fill: [u8; 3],
        /// Bounds of the canvas's side as a multiple of the image's, `1 <= min <= max`.
        side_range: (f64, f64),
        /// Probability.
        p: f64,
    },
    /// `ScaleJitter(target_size, scale_range, interpolation, antialias)` (1.10).
    ScaleJitter {
        /// `(height, width)`: the image is scaled by `min(height / h, width / w)` times a
        /// factor drawn from `scale`.
        target: (u32, u32),
        /// Bounds of that factor.
        scale: (f64, f64),
        /// How the image is resized.
        resampling: Resampling,
    },
}

impl Op {
    /// The op's name in the protocol.
    pub fn name(&self) -> &'static str {
        match self {
            Op::RandomResizedCrop { .. } => "random_resized_crop",
            Op::Resize { .. } => "resize",
            Op::CenterCrop { .. } => "center_crop",
            Op::RandomCrop { .. } => "random_crop",
            Op::HorizontalFlip { .. } => "horizontal_flip",
            Op::VerticalFlip { .. } => "vertical_flip",
            Op::ColorJitter { .. } => "color_jitter",
            Op::Grayscale { .. } => "grayscale",
            Op::GaussianBlur { .. } => "gaussian_blur",
            Op::Solarize { .. } => "solarize",
            Op::Posterize { .. } => "posterize",
            Op::Autocontrast { .. } => "autocontrast",
            Op::Equalize { .. } => "equalize",
            Op::AdjustSharpness { .. } => "adjust_sharpness",
            Op::Invert { .. } => "invert",
            Op::TrivialAugmentWide { .. } => "trivial_augment_wide",
            Op::RandAugment { .. } => "rand_augment",
            Op::AutoAugment { .. } => "auto_augment",
            Op::RandomApply { .. } => "random_apply",
            Op::RandomChoice { .. } => "random_choice",
            Op::RandomIouCrop { .. } => "random_iou_crop",
            Op::RandomZoomOut { .. } => "random_zoom_out",
            Op::ScaleJitter { .. } => "scale_jitter",
        }
    }

    /// The output size for an input of `size` (`None`: depends on the image).
    fn out_size(&self, size: Option<(u32, u32)>) -> Option<(u32, u32)> {
        match self {
            Op::RandomResizedCrop { size, .. } | Op::CenterCrop { size } | Op::RandomCrop { size, .. } => Some(*size),
            Op::Resize { size, .. } => match size {
                ResizeTo::Exact(h, w) => Some((*h, *w)),
                ResizeTo::Shorter(_) => None,
            },
            Op::RandomIouCrop { .. } | Op::RandomZoomOut { .. } | Op::ScaleJitter { .. } => None,
            _ => size,
        }
    }
}

/// Erasing as the client applies it; the server draws the box (control.md, "Pipelines").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Erasing {
    /// Probability.
    pub p: f64,
    /// Area fraction bounds.
    pub scale: (f64, f64),
    /// Aspect ratio bounds (log-uniform).
    pub ratio: (f64, f64),
    /// What fills the box.
    pub value: EraseValue,
}

/// One view: a named output field of `count` images, each from the same op list with its own
/// random numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    /// The field's name.
    pub name: String,
    /// Images per sample, `1..`; more than one adds a leading dimension to the field.
    pub count: u32,
    /// The per-sample ops (run by the server).
    pub ops: Vec<Op>,
    /// Output `(height, width)`.
    pub size: (u32, u32),
    /// `normalize`'s mean and std, applied by the client (validated here).
    pub normalize: Option<([f64; 3], [f64; 3])>,
    /// `random_erasing` ops after it, whose boxes the server draws per image.
    pub erasing: Vec<Erasing>,
    /// 1.10: `aspect_buckets`, the view's first op: each batch is one bucket, each image resized
    /// to cover it and cropped to it (`crate::buckets`) before `ops`; `size` is then the
    /// largest bucket's.
    pub buckets: Option<AspectBuckets>,
}

/// A stream's pipeline.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Pipeline {
    /// In the order of the request; the first is the legacy `image` field's.
    pub views: Vec<View>,
}

impl Pipeline {
    /// Images per sample over all views.
    pub fn outputs(&self) -> u32 {
        self.views.iter().map(|v| v.count).sum()
    }

    /// Whether an op draws against the sample's boxes (`random_iou_crop`, also inside a
    /// container): such a pipeline needs `open.targets.boxes` (control.md, 1.10).
    pub fn needs_boxes(&self) -> bool {
        fn any(ops: &[Op]) -> bool {
            ops.iter().any(|op| match op {
                Op::RandomIouCrop { .. } => true,
                Op::RandomApply { ops, .. } | Op::RandomChoice { ops, .. } => any(ops),
                _ => false,
            })
        }
        self.views.iter().any(|v| any(&v.ops))
    }

    /// The one-view pipeline named `image` that runs `ops`, ending in `size`.
    pub fn single(ops: Vec<Op>) -> Result<Pipeline, PipelineError> {
        let size = check_ops(&ops, "pipeline.views[0].ops")?;
        let size = size.ok_or_else(|| ends_unsized("pipeline.views[0]"))?;
        Ok(Pipeline {
            views: vec![View {
                name: "image".into(),
                count: 1,
                ops,
                size,
                normalize: None,
                erasing: Vec::new(),
                buckets: None,
            }],
        })
    }

    /// Parses and validates the `pipeline` member of an `open`.
    pub fn parse(value: &Value) -> Result<Pipeline, PipelineError> {
        let obj = value
            .as_object()
            .ok_or_else(|| PipelineError::invalid("pipeline", "must be an object with a member \"views\""))?;
        let views = obj
            .get("views")
            .and_then(Value::as_array)
            .ok_or_else(|| PipelineError::invalid("pipeline.views", "must be an array of views"))?;
        if views.is_empty() || views.len() > MAX_VIEWS {
            return Err(PipelineError::invalid(
                "pipeline.views",
                format!("must hold 1..={MAX_VIEWS} views, got {}", views.len()),
            ));
        }
        let mut out = Vec::with_capacity(views.len());
        for (i, v) in views.iter().enumerate() {
            let at = format!("pipeline.views[{i}]");
            let view = parse_view(v, &at)?;
            if out.iter().any(|o: &View| o.name == view.name) {
                return Err(PipelineError::invalid(
                    format!("{at}.name"),
                    format!("{:?} names two views", view.name),
                ));
            }
            out.push(view);
        }
        let p = Pipeline { views: out };
        if p.outputs() > MAX_OUTPUTS {
            return Err(PipelineError::invalid(
                "pipeline",
                format!(
                    "{} images per sample over all views, more than {MAX_OUTPUTS}",
                    p.outputs()
                ),
            ));
        }
        Ok(p)
    }
}

fn ends_unsized(at: &str) -> PipelineError {
    PipelineError::Unsized { at: at.to_owned() }
}

/// Why a `pipeline` is refused: where in the request (`pipeline.views[0].ops[2]`, with the op's
/// name where there is one) and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PipelineError {
    /// A member of an op is missing or has a bad value.
    #[error("{at}.{member} ({op}): {problem}")]
    Member {
        at: String,
        member: String,
        op: String,
        problem: String,
    },
    /// An op has a member it does not know: a typo must not silently fall back to a default.
    #[error("{at}.{member} ({op}): unknown member (known: {known})")]
    UnknownMember {
        at: String,
        member: String,
        op: String,
        known: String,
    },
    /// An op name the protocol does not know ([`KNOWN_OPS`]).
    #[error("{at}: unknown op {name:?} (known: {})", KNOWN_OPS.join(", "))]
    UnknownOp { at: String, name: String },
    /// A view's output size depends on the image.
    #[error(
        "{at}: the pipeline's output size depends on the image; end it with a crop or a resize to (height, width), as torchvision batches need"
    )]
    Unsized { at: String },
    /// Any other problem of the pipeline, a view or an op at `at`.
    #[error("{at}: {problem}")]
    Invalid { at: String, problem: String },
}

impl PipelineError {
    fn invalid(at: impl Into<String>, problem: impl Into<String>) -> Self {
        PipelineError::Invalid {
            at: at.into(),
            problem: problem.into(),
        }
    }
}

fn parse_view(v: &Value, at: &str) -> Result<View, PipelineError> {
    let obj = v
        .as_object()
        .ok_or_else(|| PipelineError::invalid(at, "must be an object"))?;
    let name = match obj.get("name") {
        None => "image".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(PipelineError::invalid(format!("{at}.name"), "must be a string")),
    };
    if name.is_empty()
        || name.len() > MAX_VIEW_NAME
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        || name.as_bytes()[0].is_ascii_digit()
    {
        return Err(PipelineError::invalid(
            format!("{at}.name"),
            format!("{name:?} must be 1..={MAX_VIEW_NAME} characters of a-z, 0-9 and _, not starting with a digit"),
        ));
    }
    if ["label", "index", "crop"].contains(&name.as_str()) {
        return Err(PipelineError::invalid(
            format!("{at}.name"),
            format!("{name:?} is a field the server always names otherwise"),
        ));
    }
    let count = match obj.get("count") {
        None => 1,
        Some(c) => c
            .as_u64()
            .filter(|c| (1..=u64::from(MAX_OUTPUTS)).contains(c))
            .ok_or_else(|| {
                PipelineError::invalid(
                    format!("{at}.count"),
                    format!("must be an integer in 1..={MAX_OUTPUTS}, got {c}"),
                )
            })? as u32,
    };
    let ops_v = obj
        .get("ops")
        .and_then(Value::as_array)
        .ok_or_else(|| PipelineError::invalid(format!("{at}.ops"), "must be an array of ops"))?;
    let mut ops = Vec::new();
    let mut normalize = None;
    let mut erasing = Vec::new();
    let mut buckets = None;
    for (j, o) in ops_v.iter().enumerate() {
        let oat = format!("{at}.ops[{j}]");
        let (name, m) = op_object(o, &oat)?;
        match name {
            "aspect_buckets" if j == 0 => buckets = Some(parse_buckets(m, &oat)?),
            "aspect_buckets" => {
                return Err(PipelineError::invalid(
                    format!("{oat} (aspect_buckets)"),
                    "must be the view's first op",
                ));
            }
            "normalize" => {
                if normalize.is_some() {
                    return Err(PipelineError::invalid(
                        format!("{oat} (normalize)"),
                        "a view normalises once",
                    ));
                }
                if !erasing.is_empty() {
                    return Err(PipelineError::invalid(
                        format!("{oat} (normalize)"),
                        "must come before random_erasing (torchvision's recipes erase after normalising)",
                    ));
                }
                let f = Fields::new(m, &oat, name);
                let mean = f.triple("mean", None)?;
                let std = f.triple("std", None)?;
                if std.iter().any(|s| *s <= 0.0) {
                    return Err(f.err("std", &format!("must be positive, got {std:?}")));
                }
                f.done(&["mean", "std"])?;
                normalize = Some((mean, std));
            }
            "random_erasing" => erasing.push(parse_erasing(m, &oat)?),
            _ => {
                if normalize.is_some() || !erasing.is_empty() {
                    return Err(PipelineError::invalid(
                        format!("{oat} ({name})"),
                        "per-image ops come before normalize and random_erasing, which the client applies to the batch",
                    ));
                }
                ops.push(parse_op(name, m, &oat, 0)?);
            }
        }
    }
    let size = match &buckets {
        None => check_ops(&ops, &format!("{at}.ops"))?.ok_or_else(|| ends_unsized(at))?,
        Some(b) => {
            // The batch's size is its bucket's: what follows must keep it.
            for (j, op) in ops.iter().enumerate() {
                if !same_size_op(op) {
                    return Err(PipelineError::invalid(
                        format!("{at}.ops[{}] ({})", j + 1, op.name()),
                        "changes the image's size after aspect_buckets, whose bucket is the batch's size; only ops that keep the size (colour ops, flips, policies) may follow it",
                    ));
                }
            }
            check_ops_from(&ops, Some(b.largest()), &format!("{at}.ops"))?;
            if count != 1 {
                return Err(PipelineError::invalid(
                    format!("{at}.count"),
                    format!("must be 1 with aspect_buckets, got {count}"),
                ));
            }
            b.largest()
        }
    };
    Ok(View {
        name,
        count,
        ops,
        size,
        normalize,
        erasing,
        buckets,
    })
}

/// The output size of `ops` applied in order to an image of unknown size, checking that every
/// `random_apply`/`random_choice` keeps a size its neighbours can rely on.
fn check_ops(ops: &[Op], at: &str) -> Result<Option<(u32, u32)>, PipelineError> {
    let mut size = None;
    for (j, op) in ops.iter().enumerate() {
        size = check_op(op, size, &format!("{at}[{j}]"))?;
    }
    Ok(size)
}

fn check_op(op: &Op, size: Option<(u32, u32)>, at: &str) -> Result<Option<(u32, u32)>, PipelineError> {
    match op {
        Op::RandomApply { ops, .. } => {
            let inner = check_ops_from(ops, size, &format!("{at}.ops"))?;
            if inner != size {
                return Err(PipelineError::invalid(
                    format!("{at} (random_apply)"),
                    format!(
                        "its ops change the image's size ({} to {}), so the output size would depend on the draw; apply size-changing ops outside it",
                        show(size),
                        show(inner)
                    ),
                ));
            }
            Ok(size)
        }
        Op::RandomChoice { ops, .. } => {
            let mut out = None;
            for (k, o) in ops.iter().enumerate() {
                let s = check_op(o, size, &format!("{at}.ops[{k}]"))?;
                if k == 0 {
                    out = s;
                } else if s != out || s.is_none() && size.is_none() && !same_size_op(o) {
                    return Err(PipelineError::invalid(
                        format!("{at} (random_choice)"),
                        format!(
                            "its choices give different sizes ({} and {}); every choice must give the same",
                            show(out),
                            show(s)
                        ),
                    ));
                }
            }
            Ok(out)
        }
        other => Ok(other.out_size(size)),
    }
}

fn check_ops_from(ops: &[Op], mut size: Option<(u32, u32)>, at: &str) -> Result<Option<(u32, u32)>, PipelineError> {
    for (j, op) in ops.iter().enumerate() {
        let before = size;
        size = check_op(op, size, &format!("{at}[{j}]"))?;
        // An unknown size stays "the same unknown size" only through ops that keep it.
        if before.is_none() && size.is_none() && !same_size_op(op) {
            return Err(PipelineError::invalid(
                format!("{at}[{j}] ({})", op.name()),
                "resizes an image whose size depends on the draw inside a random op; resize outside it",
            ));
        }
    }
    Ok(size)
}

/// Ops whose output has their input's size.
fn same_size_op(op: &Op) -> bool {
    match op {
        Op::RandomResizedCrop { .. } | Op::Resize { .. } | Op::CenterCrop { .. } | Op::RandomCrop { .. } => false,
        Op::RandomApply { ops, .. } | Op::RandomChoice { ops, .. } => ops.iter().all(same_size_op),
        _ => true,
    }
}

fn show(s: Option<(u32, u32)>) -> String {
    match s {
        Some((h, w)) => format!("{h}x{w}"),
        None => "the image's own".to_owned(),
    }
}

fn op_object<'a>(o: &'a Value, at: &str) -> Result<(&'a str, &'a Map<String, Value>), PipelineError> {
    let m = o
        .as_object()
        .ok_or_else(|| PipelineError::invalid(at, "must be an object with a string member \"op\""))?;
    let name = m
        .get("op")
        .and_then(Value::as_str)
        .ok_or_else(|| PipelineError::invalid(at, "must have a string member \"op\""))?;
    Ok((name, m))
}

/// Reads the members of one op, naming the op and the member in every error.
struct Fields<'a> {
    m: &'a Map<String, Value>,
    at: &'a str,
    op: &'a str,
}

impl<'a> Fields<'a> {
    fn new(m: &'a Map<String, Value>, at: &'a str, op: &'a str) -> Self {
        Fields { m, at, op }
    }

    fn err(&self, member: &str, what: &str) -> PipelineError {
        PipelineError::Member {
            at: self.at.to_owned(),
            member: member.to_owned(),
            op: self.op.to_owned(),
            problem: what.to_owned(),
        }
    }

    fn get(&self, k: &str) -> Option<&'a Value> {
        self.m.get(k).filter(|v| !v.is_null())
    }

    /// Unknown members are errors: a typo must not silently fall back to a default.
    fn done(&self, known: &[&str]) -> Result<(), PipelineError> {
        for k in self.m.keys() {
            if k != "op" && !known.contains(&k.as_str()) {
                return Err(PipelineError::UnknownMember {
                    at: self.at.to_owned(),
                    member: k.clone(),
                    op: self.op.to_owned(),
                    known: known.join(", "),
                });
            }
        }
        Ok(())
    }

    fn num(&self, k: &str, default: Option<f64>) -> Result<f64, PipelineError> {
        match self.get(k) {
            None => default.ok_or_else(|| self.err(k, "is required")),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .ok_or_else(|| self.err(k, &format!("must be a finite number, got {v}"))),
        }
    }

    fn prob(&self, k: &str, default: f64) -> Result<f64, PipelineError> {
        let p = self.num(k, Some(default))?;
        if !(0.0..=1.0).contains(&p) {
            return Err(self.err(k, &format!("must be a probability in [0, 1], got {p}")));
        }
        Ok(p)
    }

    fn uint(&self, k: &str, default: Option<u32>, range: std::ops::RangeInclusive<u32>) -> Result<u32, PipelineError> {
        match self.get(k) {
            None => default.ok_or_else(|| self.err(k, "is required")),
            Some(v) => v
                .as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .filter(|x| range.contains(x))
                .ok_or_else(|| {
                    self.err(
                        k,
                        &format!("must be an integer in {}..={}, got {v}", range.start(), range.end()),
                    )
                }),
        }
    }

    fn boolean(&self, k: &str, default: bool) -> Result<bool, PipelineError> {
        match self.get(k) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.err(k, &format!("must be true or false, got {v}"))),
        }
    }

    fn nums(&self, k: &str) -> Result<Option<Vec<f64>>, PipelineError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| x.as_f64().filter(|x| x.is_finite()))
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| self.err(k, "must be an array of finite numbers")),
            Some(v) => Err(self.err(k, &format!("must be an array of numbers, got {v}"))),
        }
    }

    /// A `[lo, hi]` pair with `lo <= hi` inside `bounds`.
    fn pair(
        &self,
        k: &str,
        default: Option<(f64, f64)>,
        bounds: (f64, f64),
    ) -> Result<Option<(f64, f64)>, PipelineError> {
        let Some(v) = self.nums(k)? else {
            return Ok(default);
        };
        if v.len() != 2 || !(bounds.0 <= v[0] && v[0] <= v[1] && v[1] <= bounds.1) {
            return Err(self.err(
                k,
                &format!(
                    "must be [min, max] with {} <= min <= max <= {}, got {v:?}",
                    bounds.0, bounds.1
                ),
            ));
        }
        Ok(Some((v[0], v[1])))
    }

    /// A pair of positive bounds `0 < lo <= hi (<= upper)`.
    fn positive_pair(&self, k: &str, default: (f64, f64), upper: f64) -> Result<(f64, f64), PipelineError> {
        let Some(v) = self.nums(k)? else {
            return Ok(default);
        };
        if v.len() != 2 || !(0.0 < v[0] && v[0] <= v[1] && v[1] <= upper) {
            return Err(self.err(
                k,
                &format!("must be [min, max] with 0 < min <= max <= {upper}, got {v:?}"),
            ));
        }
        Ok((v[0], v[1]))
    }

    fn triple(&self, k: &str, default: Option<[f64; 3]>) -> Result<[f64; 3], PipelineError> {
        match self.nums(k)? {
            None => default.ok_or_else(|| self.err(k, "is required")),
            Some(v) if v.len() == 1 => Ok([v[0]; 3]),
            Some(v) if v.len() == 3 => Ok([v[0], v[1], v[2]]),
            Some(v) => Err(self.err(k, &format!("must hold 1 or 3 numbers (one per channel), got {v:?}"))),
        }
    }

    fn size(&self, k: &str) -> Result<(u32, u32), PipelineError> {
        let v = self.nums(k)?.ok_or_else(|| self.err(k, "is required"))?;
        let ok = |x: f64| x.fract() == 0.0 && (1.0..=f64::from(MAX_SIZE)).contains(&x);
        match v.as_slice() {
            [s] if ok(*s) => Ok((*s as u32, *s as u32)),
            [h, w] if ok(*h) && ok(*w) => Ok((*h as u32, *w as u32)),
            _ => Err(self.err(
                k,
                &format!("must be [height, width] (or [side]) of integers in 1..={MAX_SIZE}, got {v:?}"),
            )),
        }
    }

    fn resampling(&self, default_interp: Interpolation) -> Result<Resampling, PipelineError> {
        Ok(Resampling {
            interpolation: self.interpolation(default_interp, true)?,
            antialias: self.boolean("antialias", true)?,
        })
    }

    fn interpolation(&self, default: Interpolation, cubic: bool) -> Result<Interpolation, PipelineError> {
        match self.get("interpolation") {
            None => Ok(default),
            Some(Value::String(s)) => match Interpolation::parse(s) {
                Some(Interpolation::Bicubic) if !cubic => Err(self.err(
                    "interpolation",
                    "must be \"nearest\" or \"bilinear\" (torchvision's affine ops have no bicubic for tensors)",
                )),
                Some(i) => Ok(i),
                None => Err(self.err(
                    "interpolation",
                    &format!("must be \"nearest\", \"bilinear\" or \"bicubic\", got {s:?}"),
                )),
            },
            Some(v) => Err(self.err("interpolation", &format!("must be a string, got {v}"))),
        }
    }

    fn fill_u8(&self, k: &str) -> Result<[u8; 3], PipelineError> {
        let f = self.triple(k, Some([0.0; 3]))?;
        if f.iter().any(|x| !(0.0..=255.0).contains(x) || x.fract() != 0.0) {
            return Err(self.err(k, &format!("must be integers in 0..=255, got {f:?}")));
        }
        Ok([f[0] as u8, f[1] as u8, f[2] as u8])
    }

    fn warp_fill(&self) -> Result<WarpFill, PipelineError> {
        if self.get("fill").is_none() {
            return Ok(None);
        }
        let f = self.triple("fill", None)?;
        if f.iter().any(|x| !(0.0..=255.0).contains(x)) {
            return Err(self.err("fill", &format!("must be in 0..=255, got {f:?}")));
        }
        Ok(Some([f[0] as f32, f[1] as f32, f[2] as f32]))
    }

    fn ops(&self, k: &str, depth: usize) -> Result<Vec<Op>, PipelineError> {
        let a = self
            .get(k)
            .and_then(Value::as_array)
            .ok_or_else(|| self.err(k, "must be an array of ops"))?;
        if a.is_empty() {
            return Err(self.err(k, "must hold at least one op"));
        }
        if depth >= MAX_DEPTH {
            return Err(self.err(k, &format!("nests deeper than {MAX_DEPTH} levels")));
        }
        a.iter()
            .enumerate()
            .map(|(j, o)| {
                let at = format!("{}.{k}[{j}]", self.at);
                let (name, m) = op_object(o, &at)?;
                if name == "normalize" || name == "random_erasing" {
                    return Err(PipelineError::invalid(
                        format!("{at} ({name})"),
                        format!(
                            "applied by the client to the whole batch, so it cannot be inside {}",
                            self.op
                        ),
                    ));
                }
                parse_op(name, m, &at, depth + 1)
            })
            .collect()
    }
}

fn parse_op(name: &str, m: &Map<String, Value>, at: &str, depth: usize) -> Result<Op, PipelineError> {
    let f = Fields::new(m, at, name);
    let op = match name {
        "random_resized_crop" => {
            let op = Op::RandomResizedCrop {
                size: f.size("size")?,
                scale: f.positive_pair("scale", (0.08, 1.0), 1.0)?,
                ratio: f.positive_pair("ratio", (3.0 / 4.0, 4.0 / 3.0), f64::MAX)?,
                resampling: f.resampling(Interpolation::Bilinear)?,
            };
            f.done(&["size", "scale", "ratio", "interpolation", "antialias"])?;
            op
        }
        "resize" => parse_resize(&f)?,
        "center_crop" => {
            let op = Op::CenterCrop { size: f.size("size")? };
            f.done(&["size"])?;
            op
        }
        "random_crop" => parse_random_crop(&f)?,
        "horizontal_flip" | "vertical_flip" => {
            let p = f.prob("p", 0.5)?;
            f.done(&["p"])?;
            if name == "horizontal_flip" {
                Op::HorizontalFlip { p }
            } else {
                Op::VerticalFlip { p }
            }
        }
        "color_jitter" => {
            let factor = (0.0, f64::MAX);
            let op = Op::ColorJitter {
                brightness: f.pair("brightness", None, factor)?,
                contrast: f.pair("contrast", None, factor)?,
                saturation: f.pair("saturation", None, factor)?,
                hue: f.pair("hue", None, (-0.5, 0.5))?,
            };
            f.done(&["brightness", "contrast", "saturation", "hue"])?;
            op
        }
        "grayscale" => {
            let op = Op::Grayscale { p: f.prob("p", 0.1)? };
            f.done(&["p"])?;
            op
        }
        "gaussian_blur" => parse_gaussian_blur(&f)?,
        "solarize" => {
            let threshold = f.num("threshold", None)?;
            if !(0.0..=255.0).contains(&threshold) {
                return Err(f.err("threshold", &format!("must be in 0..=255, got {threshold}")));
            }
            let op = Op::Solarize {
                threshold,
                p: f.prob("p", 0.5)?,
            };
            f.done(&["threshold", "p"])?;
            op
        }
        "posterize" => {
            let op = Op::Posterize {
                bits: f.uint("bits", None, 0..=8)? as u8,
                p: f.prob("p", 0.5)?,
            };
            f.done(&["bits", "p"])?;
            op
        }
        "autocontrast" | "equalize" | "invert" => {
            let p = f.prob("p", 0.5)?;
            f.done(&["p"])?;
            match name {
                "autocontrast" => Op::Autocontrast { p },
                "equalize" => Op::Equalize { p },
                _ => Op::Invert { p },
            }
        }
        "adjust_sharpness" => {
            let factor = f.num("sharpness_factor", None)?;
            if factor < 0.0 {
                return Err(f.err("sharpness_factor", &format!("must be non-negative, got {factor}")));
            }
            let op = Op::AdjustSharpness {
                factor,
                p: f.prob("p", 0.5)?,
            };
            f.done(&["sharpness_factor", "p"])?;
            op
        }
        "trivial_augment_wide" => {
            let op = Op::TrivialAugmentWide {
                bins: f.uint("num_magnitude_bins", Some(31), 2..=1024)?,
                interpolation: f.interpolation(Interpolation::Nearest, false)?,
                fill: f.warp_fill()?,
            };
            f.done(&["num_magnitude_bins", "interpolation", "fill"])?;
            op
        }
        "rand_augment" => {
            let bins = f.uint("num_magnitude_bins", Some(31), 2..=1024)?;
            let op = Op::RandAugment {
                num_ops: f.uint("num_ops", Some(2), 0..=16)?,
                magnitude: f.uint("magnitude", Some(9), 0..=bins - 1)?,
                bins,
                interpolation: f.interpolation(Interpolation::Nearest, false)?,
                fill: f.warp_fill()?,
            };
            f.done(&["num_ops", "magnitude", "num_magnitude_bins", "interpolation", "fill"])?;
            op
        }
        "auto_augment" => parse_auto_augment(&f)?,
        "random_apply" => {
            let op = Op::RandomApply {
                p: f.prob("p", 0.5)?,
                ops: f.ops("ops", depth)?,
            };
            f.done(&["p", "ops"])?;
            op
        }
        "random_choice" => parse_random_choice(&f, depth)?,
        "random_iou_crop" => parse_random_iou_crop(&f)?,
        "random_zoom_out" => {
            let side_range = f.positive_pair("side_range", (1.0, 4.0), 64.0)?;
            if side_range.0 < 1.0 {
                return Err(f.err(
                    "side_range",
                    &format!("must be [min, max] with 1 <= min <= max <= 64, got {side_range:?}"),
                ));
            }
            let op = Op::RandomZoomOut {
                fill: f.fill_u8("fill")?,
                side_range,
                p: f.prob("p", 0.5)?,
            };
            f.done(&["fill", "side_range", "p"])?;
            op
        }
        "scale_jitter" => {
            let op = Op::ScaleJitter {
                target: f.size("target_size")?,
                scale: f.positive_pair("scale_range", (0.1, 2.0), 64.0)?,
                resampling: f.resampling(Interpolation::Bilinear)?,
            };
            f.done(&["target_size", "scale_range", "interpolation", "antialias"])?;
            op
        }
        other => {
            return Err(PipelineError::UnknownOp {
                at: at.to_owned(),
                name: other.to_owned(),
            });
        }
    };
    Ok(op)
}

/// `resize`: the shorter side (capped by `max_size`) or an exact (height, width).
fn parse_resize(f: &Fields<'_>) -> Result<Op, PipelineError> {
    let v = f.nums("size")?.ok_or_else(|| f.err("size", "is required"))?;
    let ok = |x: f64| x.fract() == 0.0 && (1.0..=f64::from(MAX_SIZE)).contains(&x);
    let size = match v.as_slice() {
        [s] if ok(*s) => ResizeTo::Shorter(*s as u32),
        [h, w] if ok(*h) && ok(*w) => ResizeTo::Exact(*h as u32, *w as u32),
        _ => {
            return Err(f.err(
                "size",
                &format!(
                    "must be [side] (the shorter side, as torchvision's Resize(int)) or [height, width], integers in 1..={MAX_SIZE}, got {v:?}"
                ),
            ));
        }
    };
    let max_size = match f.get("max_size") {
        None => None,
        Some(_) => Some(f.uint("max_size", None, 1..=MAX_SIZE)?),
    };
    match (size, max_size) {
        (ResizeTo::Exact(..), Some(_)) => {
            return Err(f.err(
                "max_size",
                "applies only when size is the shorter side ([side]), as in torchvision",
            ));
        }
        (ResizeTo::Shorter(s), Some(m)) if m <= s => {
            return Err(f.err(
                "max_size",
                &format!("must be greater than the shorter side {s}, got {m}"),
            ));
        }
        _ => {}
    }
    let op = Op::Resize {
        size,
        max_size,
        resampling: f.resampling(Interpolation::Bilinear)?,
    };
    f.done(&["size", "max_size", "interpolation", "antialias"])?;
    Ok(op)
}

/// `random_crop`: torchvision's padding forms, constant padding only.
fn parse_random_crop(f: &Fields<'_>) -> Result<Op, PipelineError> {
    let padding = match f.nums("padding")? {
        None => [0; 4],
        Some(v) => {
            let ok = v
                .iter()
                .all(|x| x.fract() == 0.0 && (0.0..=f64::from(MAX_SIZE)).contains(x));
            match v.as_slice() {
                [a] if ok => [*a as u32; 4],
                [x, y] if ok => [*x as u32, *y as u32, *x as u32, *y as u32],
                [l, t, r, b] if ok => [*l as u32, *t as u32, *r as u32, *b as u32],
                _ => {
                    return Err(f.err(
                        "padding",
                        &format!(
                            "must be [all], [left/right, top/bottom] or [left, top, right, bottom] of integers in 0..={MAX_SIZE}, got {v:?}"
                        ),
                    ));
                }
            }
        }
    };
    if let Some(mode) = f.get("padding_mode")
        && mode.as_str() != Some("constant")
    {
        return Err(f.err(
            "padding_mode",
            &format!("only \"constant\" is supported (a deliberate difference from torchvision), got {mode}"),
        ));
    }
    let op = Op::RandomCrop {
        size: f.size("size")?,
        padding,
        pad_if_needed: f.boolean("pad_if_needed", false)?,
        fill: f.fill_u8("fill")?,
    };
    f.done(&["size", "padding", "pad_if_needed", "fill", "padding_mode"])?;
    Ok(op)
}

/// `gaussian_blur`: an odd kernel, square or not, and the range sigma is drawn from.
fn parse_gaussian_blur(f: &Fields<'_>) -> Result<Op, PipelineError> {
    let v = f
        .nums("kernel_size")?
        .ok_or_else(|| f.err("kernel_size", "is required"))?;
    let odd = |x: f64| x.fract() == 0.0 && (1.0..=255.0).contains(&x) && (x as u32) % 2 == 1;
    let kernel = match v.as_slice() {
        [k] if odd(*k) => (*k as u32, *k as u32),
        [x, y] if odd(*x) && odd(*y) => (*x as u32, *y as u32),
        _ => {
            return Err(f.err(
                "kernel_size",
                &format!("must be [k] or [kx, ky] of odd integers in 1..=255, got {v:?}"),
            ));
        }
    };
    let op = Op::GaussianBlur {
        kernel,
        sigma: f.positive_pair("sigma", (0.1, 2.0), f64::MAX)?,
    };
    f.done(&["kernel_size", "sigma"])?;
    Ok(op)
}

/// `auto_augment`: one of torchvision's three policies.
fn parse_auto_augment(f: &Fields<'_>) -> Result<Op, PipelineError> {
    let policy = match f.get("policy").map(|v| v.as_str()) {
        None | Some(Some("imagenet")) => AutoPolicy::Imagenet,
        Some(Some("cifar10")) => AutoPolicy::Cifar10,
        Some(Some("svhn")) => AutoPolicy::Svhn,
        Some(_) => {
            return Err(f.err("policy", "must be \"imagenet\", \"cifar10\" or \"svhn\""));
        }
    };
    let op = Op::AutoAugment {
        policy,
        interpolation: f.interpolation(Interpolation::Nearest, false)?,
        fill: f.warp_fill()?,
    };
    f.done(&["policy", "interpolation", "fill"])?;
    Ok(op)
}

/// `random_choice`: its ops and their weights, kept as a cumulative distribution.
fn parse_random_choice(f: &Fields<'_>, depth: usize) -> Result<Op, PipelineError> {
    let ops = f.ops("ops", depth)?;
    let p = match f.nums("p")? {
        None => vec![1.0; ops.len()],
        Some(p) => p,
    };
    if p.len() != ops.len() || p.iter().any(|x| *x < 0.0) || p.iter().sum::<f64>() <= 0.0 {
        return Err(f.err(
            "p",
            &format!(
                "must hold one non-negative weight per op ({}), not all zero, got {p:?}",
                ops.len()
            ),
        ));
    }
    let total: f64 = p.iter().sum();
    let mut acc = 0.0;
    let mut cumulative: Vec<f64> = p
        .iter()
        .map(|x| {
            acc += x / total;
            acc
        })
        .collect();
    if let Some(last) = cumulative.last_mut() {
        *last = 1.0;
    }
    f.done(&["ops", "p"])?;
    Ok(Op::RandomChoice { ops, cumulative })
}

/// `random_iou_crop`: torchvision's members, as separate bounds.
fn parse_random_iou_crop(f: &Fields<'_>) -> Result<Op, PipelineError> {
    let num = |k: &str, default: f64| f.num(k, Some(default));
    let scale = (num("min_scale", 0.3)?, num("max_scale", 1.0)?);
    if !(0.0 < scale.0 && scale.0 <= scale.1 && scale.1 <= 1.0) {
        return Err(f.err(
            "min_scale",
            &format!("min_scale and max_scale must satisfy 0 < min_scale <= max_scale <= 1, got {scale:?}"),
        ));
    }
    let aspect = (num("min_aspect_ratio", 0.5)?, num("max_aspect_ratio", 2.0)?);
    if !(0.0 < aspect.0 && aspect.0 <= aspect.1 && aspect.1.is_finite()) {
        return Err(f.err(
            "min_aspect_ratio",
            &format!("min_aspect_ratio and max_aspect_ratio must satisfy 0 < min <= max (finite), got {aspect:?}"),
        ));
    }
    let options = f
        .nums("sampler_options")?
        .unwrap_or_else(|| vec![0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0]);
    if options.is_empty() || options.len() > 64 || options.iter().any(|v| !(v.is_finite() && *v >= 0.0)) {
        return Err(f.err(
            "sampler_options",
            &format!("must hold 1..=64 minimal IoUs >= 0 (1 or more: leave the image as it is), got {options:?}"),
        ));
    }
    let op = Op::RandomIouCrop {
        scale,
        aspect,
        options,
        trials: f.uint("trials", Some(40), 1..=1000)?,
    };
    f.done(&[
        "min_scale",
        "max_scale",
        "min_aspect_ratio",
        "max_aspect_ratio",
        "sampler_options",
        "trials",
    ])?;
    Ok(op)
}

/// 1.10: the `aspect_buckets` op: the first op of a view, which then ends in the bucket's size
/// (`crate::buckets` has the rules).
#[derive(Debug, Clone, PartialEq)]
pub struct AspectBuckets {
    /// The target area, `h·w ≤ area`.
    pub area: u64,
    /// Bounds of a bucket's `w/h`.
    pub min_ratio: f64,
    pub max_ratio: f64,
    /// Buckets' sides are multiples of this (it divides 4096).
    pub step: u32,
    pub crop: crate::buckets::BucketCrop,
    /// The covering resize's filter.
    pub resampling: Resampling,
    /// The buckets, `(h, w)`, by number.
    pub sizes: Vec<(u32, u32)>,
}

impl AspectBuckets {
    /// The bucket of the largest area (the ring's slots are sized for it); the first such.
    pub fn largest(&self) -> (u32, u32) {
        let mut best = self.sizes[0];
        for &s in &self.sizes {
            if u64::from(s.0) * u64::from(s.1) > u64::from(best.0) * u64::from(best.1) {
                best = s;
            }
        }
        best
    }
}

/// 1.10: the `aspect_buckets` op's members, checked (control.md, "Aspect-ratio buckets (1.10)").
fn parse_buckets(m: &Map<String, Value>, at: &str) -> Result<AspectBuckets, PipelineError> {
    use crate::buckets::BucketCrop;
    let f = Fields::new(m, at, "aspect_buckets");
    let max_area = u64::from(MAX_SIZE) * u64::from(MAX_SIZE);
    let area = match f.get("area") {
        None => 1024 * 1024,
        Some(v) => v.as_u64().filter(|a| (1..=max_area).contains(a)).ok_or_else(|| {
            f.err(
                "area",
                &format!("must be an integer in 1..={max_area} (sides are at most {MAX_SIZE}), got {v}"),
            )
        })?,
    };
    let min_ratio = f.num("min_ratio", Some(0.5))?;
    let max_ratio = f.num("max_ratio", Some(2.0))?;
    if min_ratio <= 0.0 {
        return Err(f.err("min_ratio", &format!("must be positive, got {min_ratio}")));
    }
    if min_ratio > max_ratio {
        return Err(f.err("min_ratio", &format!("{min_ratio} is above max_ratio {max_ratio}")));
    }
    let step = f.uint("step", Some(64), 1..=MAX_SIZE)?;
    if !MAX_SIZE.is_multiple_of(step) {
        return Err(f.err(
            "step",
            &format!("{step} does not divide {MAX_SIZE}; use a power of two such as 8, 32 or 64"),
        ));
    }
    let crop = match f.get("crop") {
        None => BucketCrop::Random,
        Some(Value::String(s)) if s == "random" => BucketCrop::Random,
        Some(Value::String(s)) if s == "center" => BucketCrop::Center,
        Some(v) => return Err(f.err("crop", &format!("must be \"random\" or \"center\", got {v}"))),
    };
    let resampling = f.resampling(Interpolation::Bilinear)?;
    f.done(&[
        "area",
        "min_ratio",
        "max_ratio",
        "step",
        "crop",
        "interpolation",
        "antialias",
    ])?;
    let sizes = crate::buckets::sizes_of(area, min_ratio, max_ratio, step);
    if sizes.is_empty() {
        return Err(f.err(
            "area",
            &format!(
                "no bucket of sides that are multiples of step {step} (at most {MAX_SIZE}) has an area up to {area} and a ratio in [{min_ratio}, {max_ratio}]; widen the ratios or change area or step"
            ),
        ));
    }
    Ok(AspectBuckets {
        area,
        min_ratio,
        max_ratio,
        step,
        crop,
        resampling,
        sizes,
    })
}

/// Every op name the protocol knows, in control.md's order.
pub const KNOWN_OPS: &[&str] = &[
    "random_resized_crop",
    "resize",
    "center_crop",
    "random_crop",
    "horizontal_flip",
    "vertical_flip",
    "color_jitter",
    "grayscale",
    "gaussian_blur",
    "solarize",
    "posterize",
    "autocontrast",
    "equalize",
    "adjust_sharpness",
    "invert",
    "trivial_augment_wide",
    "rand_augment",
    "auto_augment",
    "random_apply",
    "random_choice",
    "random_iou_crop",
    "random_zoom_out",
    "scale_jitter",
    "normalize",
    "random_erasing",
    "aspect_buckets",
];

fn parse_erasing(m: &Map<String, Value>, at: &str) -> Result<Erasing, PipelineError> {
    let f = Fields::new(m, at, "random_erasing");
    let scale = f.positive_pair("scale", (0.02, 0.33), 1.0)?;
    let ratio = f.positive_pair("ratio", (0.3, 3.3), f64::MAX)?;
    let value = match f.get("value") {
        None => EraseValue::Constant([0.0; 3]),
        Some(Value::String(s)) if s == "random" => EraseValue::Random,
        Some(_) => {
            let v = f.triple("value", None)?;
            EraseValue::Constant([v[0] as f32, v[1] as f32, v[2] as f32])
        }
    };
    let e = Erasing {
        p: f.prob("p", 0.5)?,
        scale,
        ratio,
        value,
    };
    f.done(&["p", "scale", "ratio", "value"])?;
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(v: Value) -> String {
        Pipeline::parse(&v).unwrap_err().to_string()
    }

    #[test]
    fn a_recipe_parses_with_its_shapes() {
        let p = Pipeline::parse(&json!({"views": [{"ops": [
            {"op": "random_resized_crop", "size": [176, 176]},
            {"op": "horizontal_flip"},
            {"op": "trivial_augment_wide"},
            {"op": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
            {"op": "random_erasing", "p": 0.1}
        ]}]}))
        .unwrap();
        let v = &p.views[0];
        assert_eq!((v.name.as_str(), v.count, v.size), ("image", 1, (176, 176)));
        assert_eq!(v.ops.len(), 3);
        assert!(v.normalize.is_some());
        assert_eq!(v.erasing.len(), 1);
    }

    #[test]
    fn only_random_iou_crop_needs_boxes() {
        let p = |ops: Value| Pipeline::parse(&json!({"views": [{"ops": ops}]})).unwrap();
        assert!(p(json!([{"op": "random_iou_crop"}, {"op": "resize", "size": [8, 8]}])).needs_boxes());
        assert!(!p(json!([{"op": "random_zoom_out"}, {"op": "resize", "size": [8, 8]}])).needs_boxes());
        assert!(
            !p(json!([{"op": "center_crop", "size": [8]}, {"op": "random_apply", "ops": [{"op": "invert"}]}]))
                .needs_boxes()
        );
    }

    #[test]
    fn detection_ops_need_a_fixed_size_op_after_them() {
        for op in [
            json!({"op": "random_iou_crop"}),
            json!({"op": "random_zoom_out"}),
            json!({"op": "scale_jitter", "target_size": [64, 48]}),
        ] {
            let e = err(json!({"views": [{"ops": [{"op": "center_crop", "size": [8]}, op.clone()]}]}));
            assert!(e.contains("depends on the image"), "{e}");
            let p = Pipeline::parse(&json!({"views": [{"ops": [op, {"op": "resize", "size": [8, 9]}]}]})).unwrap();
            assert_eq!(p.views[0].size, (8, 9));
        }
    }

    #[test]
    fn resize_then_center_crop_is_fixed_and_resize_alone_is_not() {
        let ok = Pipeline::parse(&json!({"views": [{"ops": [
            {"op": "resize", "size": [256]}, {"op": "center_crop", "size": [224]}]}]}))
        .unwrap();
        assert_eq!(ok.views[0].size, (224, 224));
        let e = err(json!({"views": [{"ops": [{"op": "resize", "size": [256]}]}]}));
        assert!(e.contains("depends on the image"), "{e}");
    }

    #[test]
    fn aspect_buckets_parse_and_refuse_naming_the_member() {
        let view = |ops: serde_json::Value| json!({"views": [{"ops": ops}]});
        let ok = Pipeline::parse(&view(json!([
            {"op": "aspect_buckets", "area": 4096, "step": 16, "crop": "center"},
            {"op": "horizontal_flip"}, {"op": "color_jitter", "brightness": [0.5, 1.5]}
        ])))
        .unwrap();
        let v = &ok.views[0];
        let b = v.buckets.as_ref().unwrap();
        assert_eq!(v.size, b.largest());
        assert_eq!(v.ops.len(), 2);
        assert!(b.sizes.contains(&(64, 64)));
        let cases = [
            (
                json!([{"op": "aspect_buckets", "min_ratio": 2, "max_ratio": 1}]),
                "ops[0].min_ratio (aspect_buckets)",
            ),
            (
                json!([{"op": "aspect_buckets", "step": 48}]),
                "ops[0].step (aspect_buckets)",
            ),
            (
                json!([{"op": "aspect_buckets", "area": 4097u64 * 4097}]),
                "ops[0].area (aspect_buckets)",
            ),
            (
                json!([{"op": "aspect_buckets", "crop": "left"}]),
                "ops[0].crop (aspect_buckets)",
            ),
            (
                json!([{"op": "aspect_buckets", "sizes": 1}]),
                "ops[0].sizes (aspect_buckets): unknown member",
            ),
            (
                json!([{"op": "aspect_buckets", "area": 64, "step": 64}]),
                "ops[0].area (aspect_buckets): no bucket",
            ),
            (
                json!([{"op": "aspect_buckets"}, {"op": "horizontal_flip"}, {"op": "center_crop", "size": [8]}]),
                "ops[2] (center_crop): changes the image's size after aspect_buckets",
            ),
            (
                json!([{"op": "horizontal_flip"}, {"op": "aspect_buckets"}]),
                "ops[1] (aspect_buckets): must be the view's first op",
            ),
        ];
        for (ops, want) in cases {
            let e = Pipeline::parse(&view(ops.clone())).unwrap_err().to_string();
            assert!(e.contains(want), "{ops}: {e}");
        }
        let two = json!({"views": [{"count": 2, "ops": [{"op": "aspect_buckets"}]}]});
        let e = Pipeline::parse(&two).unwrap_err().to_string();
        assert!(e.contains("count: must be 1 with aspect_buckets"), "{e}");
    }

    #[test]
    fn errors_name_the_op_and_member() {
        let cases = [
            (
                json!({"op": "color_jitter", "brightness": [1.5, 0.5]}),
                "ops[0].brightness (color_jitter)",
            ),
            (
                json!({"op": "random_resized_crop", "size": [0]}),
                "ops[0].size (random_resized_crop)",
            ),
            (json!({"op": "posterize", "bits": 9}), "ops[0].bits (posterize)"),
            (json!({"op": "horizontal_flip", "p": 2}), "ops[0].p (horizontal_flip)"),
            (
                json!({"op": "horizontal_flip", "q": 0.5}),
                "ops[0].q (horizontal_flip): unknown member",
            ),
            (
                json!({"op": "gaussian_blur", "kernel_size": [4]}),
                "ops[0].kernel_size (gaussian_blur)",
            ),
            (
                json!({"op": "rand_augment", "magnitude": 31}),
                "ops[0].magnitude (rand_augment)",
            ),
            (json!({"op": "twirl"}), "ops[0]: unknown op \"twirl\""),
            (
                json!({"op": "random_crop", "size": [32], "padding_mode": "reflect"}),
                "padding_mode (random_crop)",
            ),
            (
                json!({"op": "random_iou_crop", "min_scale": 0.5, "max_scale": 1.5}),
                "ops[0].min_scale (random_iou_crop)",
            ),
            (
                json!({"op": "random_iou_crop", "sampler_options": []}),
                "ops[0].sampler_options (random_iou_crop)",
            ),
            (
                json!({"op": "random_zoom_out", "side_range": [0.5, 2]}),
                "ops[0].side_range (random_zoom_out)",
            ),
            (
                json!({"op": "scale_jitter"}),
                "ops[0].target_size (scale_jitter): is required",
            ),
        ];
        for (op, want) in cases {
            let e = err(json!({"views": [{"ops": [op, {"op": "center_crop", "size": [8]}]}]}));
            assert!(e.contains(want), "{e} lacks {want}");
        }
    }

    #[test]
    fn random_ops_must_keep_the_size() {
        let e = err(json!({"views": [{"ops": [
            {"op": "center_crop", "size": [64]},
            {"op": "random_apply", "ops": [{"op": "center_crop", "size": [32]}]}]}]}));
        assert!(e.contains("random_apply"), "{e}");
        let e = err(json!({"views": [{"ops": [
            {"op": "center_crop", "size": [64]},
            {"op": "random_choice", "ops": [{"op": "center_crop", "size": [32]}, {"op": "invert"}]}]}]}));
        assert!(e.contains("random_choice"), "{e}");
        let ok = Pipeline::parse(&json!({"views": [{"ops": [
            {"op": "random_choice", "ops": [{"op": "center_crop", "size": [32]}, {"op": "random_resized_crop", "size": [32]}]},
            {"op": "random_apply", "ops": [{"op": "invert"}, {"op": "grayscale"}], "p": 0.3}]}]}))
        .unwrap();
        assert_eq!(ok.views[0].size, (32, 32));
    }

    #[test]
    fn views_are_named_uniquely_and_counted() {
        let p = Pipeline::parse(&json!({"views": [
            {"name": "global", "count": 2, "ops": [{"op": "random_resized_crop", "size": [224]}]},
            {"name": "local", "count": 8, "ops": [{"op": "random_resized_crop", "size": [96]}]}]}))
        .unwrap();
        assert_eq!(p.outputs(), 10);
        let e = err(json!({"views": [
            {"name": "a", "ops": [{"op": "center_crop", "size": [8]}]},
            {"name": "a", "ops": [{"op": "center_crop", "size": [8]}]}]}));
        assert!(e.contains("names two views"), "{e}");
        let e = err(json!({"views": [{"name": "label", "ops": [{"op": "center_crop", "size": [8]}]}]}));
        assert!(e.contains("views[0].name"), "{e}");
        let e = err(json!({"views": [{"ops": [{"op": "center_crop", "size": [8]},
            {"op": "random_erasing"}, {"op": "invert"}]}]}));
        assert!(e.contains("before normalize and random_erasing"), "{e}");
    }
}
