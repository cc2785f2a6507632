//! Per-sample pipelines of ops, written straight into the caller's output buffers.
//!
//! For each sample the pool hands a [`Processor`] the encoded bytes, the stream's [`Pipeline`],
//! the sample's [`SampleRng`] and a [`Sink`] that gives the destination of each output image
//! inside a ring slot. The processor decodes once, runs every view's ops, and writes each image
//! in [`Layout::Nhwc`] or [`Layout::Nchw`].
//!
//! # Semantics (torchvision v2, uint8 tensors)
//! Every op follows torchvision's functional kernel and its transform's parameter sampler
//! (`proto/control.md`, "Pipelines", lists them and the deliberate differences); each op's own
//! module says what it computes. Random parameters are drawn in torchvision's order, from the
//! generator of the output image: output 0 (the first view's first image) uses the sample's
//! generator `SampleRng::new(seed, epoch, index)`, so a one-view pipeline draws exactly what the
//! fixed transforms of protocol 1.1 drew; output `j > 0` uses [`SampleRng::fork`]`(j)`, so the
//! images of a sample are independent of each other and of the order they are made in.
//! [`Transform`] is the 1.1 `transform` member, kept as the pipeline it means.
//!
//! # How a view runs
//! 1. **Plan** (`plan`): the geometric prefix (crops, flips, at most one resize) is walked on the
//!    image's size alone, drawing its parameters, and becomes a source window, a resample and a
//!    fill. Nothing is decoded yet.
//! 2. **Decode** once per sample: only the union of the rectangles the outputs read (a JPEG by
//!    region, with restart cuts where the file has markers).
//! 3. **Resample** each output's window from the decoded pixels, straight into its slot when no
//!    op follows; otherwise into a scratch image, then the remaining ops run on it in order
//!    (`color`, `tone`, `blur`, `affine`, `policy`; geometry again when a second resize comes).
//! 4. **Erasing boxes** are drawn last, per image, and handed to the sink; the client erases
//!    after normalising (torchvision's recipes erase normalised tensors).
//!
//! # Invariants
//! - **Output is a pure function of (bytes, pipeline, rng state, layout)**: the same inputs
//!   give the same bytes on any processor and thread, whatever it processed before.
//! - **Only what the crops need is decoded, and the pixels are a full decode's.** A JPEG is
//!   decoded by region (libjpeg-turbo's cropping region, see [`Decoder::decode_region_rgb8`])
//!   with a few pixels to spare around what the filter reads, so the output is bit-identical to
//!   the full-decode path (tested for every subsampling, grey, CMYK/YCCK, progressive,
//!   arithmetic and EXIF-oriented files). Every other format is decoded whole.
//!   [`Options::region_decode`] turns region decoding off (the reference path in tests);
//!   [`Options::dct_scaling`] trades exactness for speed on large sources.
//! - **A JPEG with restart markers is decoded only where the region is** (as `ringfeed pack`
//!   stores them): see `codec/restart.rs`; [`Options::restart_cuts`] turns it off.
//! - **No per-sample heap allocation in Rust once warm** (tested by `tests/alloc.rs`): decoded
//!   pixels, scratch images, plans and the resampler's tables are per-processor and keep their
//!   capacity. (libjpeg-turbo still `malloc`s about ten small tables per image of its own.)
//! - **No input panics**: any byte string gives `Ok` or an [`OpError`]; an output of the wrong
//!   length is an error, and on error the outputs hold unspecified bytes.
//!
//! # Layout
//! - `spec`: the pipeline's ops and views, parsed and validated, with their output shapes.
//! - `buckets`: 1.10's aspect-ratio buckets: the list, the nearest bucket, the covering resize
//!   (the op is `spec::AspectBuckets`; its per-image resize and crop, `head`, are here).
//! - `rng`: [`SampleRng`], the per-sample generator.
//! - `geometry`: torchvision's crop and resize arithmetic.
//! - `plan`: the geometric prefix fused into the decode.
//! - `image`: the scratch image and the moves between images (crop with fill, flips).
//! - `write`: the resample, flip and HWC → CHW transpose into a slot.
//! - `color`, `tone`, `blur`, `affine`: the per-image kernels.
//! - `lanes`: what the vectorised kernels share (block loops, rounding, the AVX2 dispatch).
//! - `reference` (tests, and the `reference` feature): the scalar kernels the vectorised ones
//!   replaced, their exactness oracle; `kernels` (the `reference` feature): the current ones,
//!   public for the benches' old-against-new comparison.
//! - `policy`: TrivialAugmentWide, RandAugment, AutoAugment.
//! - `trace`: a record of the drawn parameters, for `ringfeed ops` and the torchvision tests.
//! - `targets`: boxes and label maps moved through the geometry the ops recorded
//!   ([`Processor::run_targets`]).

mod affine;
mod blur;
pub mod buckets;
mod color;
mod geometry;
pub mod gpu;
mod image;
#[cfg(feature = "reference")]
pub mod kernels;
mod lanes;
mod plan;
mod policy;
#[cfg(any(test, feature = "reference"))]
pub mod reference;
pub mod spec;
pub mod steps;
mod targets;
mod tone;
mod trace;
mod write;

pub use geometry::{random_resized_crop_params, resize_shorter, resize_target};
pub use image::Image;
pub use ringfeed_format::targets::{LabelMap, Targets};
pub use spec::{Erasing, Op, Pipeline, PipelineError, View};
pub use targets::TargetOptions;
pub use trace::Trace;

use geometry::round_py;
use plan::Fused;
use ringfeed_decode::resample::{Filter, Kernel, Resampler};
use ringfeed_decode::{CodecError, Decoder, JpegTuning, Limits, Rect};
use ringfeed_order::rng::SampleRng;
use spec::{Interpolation, Resampling};
use steps::{Remap, Step};
use targets::{Follow, Geo};
use write::{BoxF, Dst, Src};

/// Largest output side, and largest `resize` (`proto/control.md`, "Transforms").
pub const MAX_SIZE: u32 = 4096;

/// Memory layout of one output image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// `[h][w][3]`, channels interleaved.
    Nhwc,
    /// `[3][h][w]`, one plane per channel.
    Nchw,
}

impl Layout {
    /// Parses the protocol's names, `"NHWC"` and `"NCHW"`.
    pub fn parse(name: &str) -> Result<Self, UnknownLayout> {
        match name {
            "NHWC" => Ok(Layout::Nhwc),
            "NCHW" => Ok(Layout::Nchw),
            other => Err(UnknownLayout(other.to_owned())),
        }
    }
}

/// A layout name that is neither `"NHWC"` nor `"NCHW"` ([`Layout::parse`]); holds the name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("layout: expected \"NHWC\" or \"NCHW\", got {0:?}")]
pub struct UnknownLayout(pub String);

/// A per-sample transform (`proto/control.md`, "Transforms"). Sizes are `(height, width)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Transform {
    /// `RandomResizedCrop(size, scale, ratio, antialias=True)` then
    /// `RandomHorizontalFlip(p=flip)`.
    RandomResizedCrop {
        /// Output `(height, width)`.
        size: (u32, u32),
        /// Range of the crop's area as a fraction of the image's.
        scale: (f64, f64),
        /// Range of the crop's aspect ratio (width / height), sampled log-uniformly.
        ratio: (f64, f64),
        /// Probability of a horizontal flip.
        flip: f64,
    },
    /// `Resize(resize)` (shorter side) then `CenterCrop(size)`.
    CenterCrop {
        /// Output `(height, width)`.
        size: (u32, u32),
        /// Length of the shorter side after resizing.
        resize: u32,
    },
    /// `Resize(size)`: stretch to exactly `(height, width)`.
    Resize {
        /// Output `(height, width)`.
        size: (u32, u32),
    },
}

impl Transform {
    /// `RandomResizedCrop` with torchvision's defaults (`scale = (0.08, 1)`,
    /// `ratio = (3/4, 4/3)`) and a flip half of the time.
    pub fn random_resized_crop(size: (u32, u32)) -> Self {
        Transform::RandomResizedCrop {
            size,
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
            flip: 0.5,
        }
    }

    /// Output `(height, width)`.
    pub fn size(&self) -> (u32, u32) {
        match *self {
            Transform::RandomResizedCrop { size, .. }
            | Transform::CenterCrop { size, .. }
            | Transform::Resize { size } => size,
        }
    }

    /// Bytes of one output image: `height * width * 3`.
    pub fn output_len(&self) -> usize {
        let (h, w) = self.size();
        h as usize * w as usize * 3
    }

    /// Checks the bounds of `proto/control.md`: sizes in `1..=4096`,
    /// `0 < scale[0] <= scale[1] <= 1`, `0 < ratio[0] <= ratio[1]` (finite),
    /// `0 <= flip <= 1`. The message names the member, as a `bad_request` must.
    pub fn validate(&self) -> Result<(), TransformError> {
        let (h, w) = self.size();
        if !(1..=MAX_SIZE).contains(&h) || !(1..=MAX_SIZE).contains(&w) {
            return Err(TransformError::Size { height: h, width: w });
        }
        match *self {
            Transform::RandomResizedCrop { scale, ratio, flip, .. } => {
                let (s0, s1) = scale;
                if !(s0 > 0.0 && s0 <= s1 && s1 <= 1.0) {
                    return Err(TransformError::Scale(s0, s1));
                }
                let (r0, r1) = ratio;
                if !(r0 > 0.0 && r0 <= r1 && r1.is_finite()) {
                    return Err(TransformError::Ratio(r0, r1));
                }
                if !(0.0..=1.0).contains(&flip) {
                    return Err(TransformError::Flip(flip));
                }
            }
            Transform::CenterCrop { resize, .. } => {
                if !(1..=MAX_SIZE).contains(&resize) {
                    return Err(TransformError::Resize(resize));
                }
            }
            Transform::Resize { .. } => {}
        }
        Ok(())
    }
}

/// A [`Transform`] outside the bounds of `proto/control.md` ([`Transform::validate`]); the
/// message names the member.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TransformError {
    /// A side of the output size is outside `1..=MAX_SIZE`.
    #[error("transform.size: each side must be in 1..={MAX_SIZE}, got [{height}, {width}]")]
    Size { height: u32, width: u32 },
    /// The scale range is not `0 < min <= max <= 1`.
    #[error("transform.scale: must satisfy 0 < scale[0] <= scale[1] <= 1, got [{0}, {1}]")]
    Scale(f64, f64),
    /// The ratio range is not `0 < min <= max`, finite.
    #[error("transform.ratio: must satisfy 0 < ratio[0] <= ratio[1] (finite), got [{0}, {1}]")]
    Ratio(f64, f64),
    /// The flip probability is outside `[0, 1]`.
    #[error("transform.flip: must be in [0, 1], got {0}")]
    Flip(f64),
    /// The shorter side to resize to is outside `1..=MAX_SIZE`.
    #[error("transform.resize: must be in 1..={MAX_SIZE}, got {0}")]
    Resize(u32),
}

/// The part of the decoded, EXIF-oriented image a sample was taken from (the ring's `crop`
/// field). Exact for RandomResizedCrop; for CenterCrop the sampled box rounded to whole pixels
/// (clipped to the image where the crop pads); for Resize the whole image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Crop {
    /// First row.
    pub top: u32,
    /// First column.
    pub left: u32,
    /// Rows.
    pub height: u32,
    /// Columns.
    pub width: u32,
    /// Whether the output was mirrored left to right.
    pub flipped: bool,
}

impl Crop {
    /// `[top, left, height, width, flipped]`, the ring's int32 `crop` field. Sides fit: images
    /// are at most 65,535 pixels on a side.
    pub fn to_i32s(&self) -> [i32; 5] {
        let i = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
        [
            i(self.top),
            i(self.left),
            i(self.height),
            i(self.width),
            i32::from(self.flipped),
        ]
    }
}

/// Why a sample could not be processed.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// The image could not be decoded.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// The destination is not `height * width * 3` bytes.
    #[error("output buffer holds {got} bytes; a {height}x{width}x3 image needs {expected}")]
    OutputLength {
        /// Bytes needed.
        expected: usize,
        /// Bytes given.
        got: usize,
        /// Output height.
        height: u32,
        /// Output width.
        width: u32,
    },
    /// The transform is out of bounds ([`Transform::validate`]).
    #[error(transparent)]
    Bounds(#[from] TransformError),
    /// A `random_crop` of `size` (height, width) does not fit the image, even padded.
    #[error(
        "random_crop: a {}x{} crop does not fit the {height}x{width} image with its padding; set pad_if_needed or pad more",
        size.0, size.1
    )]
    CropDoesNotFit {
        /// The crop's (height, width).
        size: (u32, u32),
        /// The image's height.
        height: u32,
        /// The image's width.
        width: u32,
    },
    /// Op `op` (or the pipeline's fused resize) would make an image of more pixels than
    /// `--max-pixels` allows.
    #[error(
        "{op}: the image would become {width}x{height}, more than the {max} pixels the server allows (--max-pixels); crop before resizing, or cap the longer side with max_size"
    )]
    TooManyPixels {
        /// The op's name, or "the pipeline".
        op: &'static str,
        /// The width it would make.
        width: u32,
        /// The height it would make.
        height: u32,
        /// The limit, in pixels.
        max: u64,
    },
    /// The resampler refused its arguments: a bug in our geometry, never the input's fault.
    #[error("internal resize error: {0}")]
    Resize(String),
    /// Targets were asked of a pipeline that makes more than one image per sample.
    #[error(
        "targets: boxes and masks follow a one-view pipeline of one image, but this one makes {outputs} images per sample; drop targets or use one view with count 1"
    )]
    TargetsOutputs {
        /// Images per sample.
        outputs: u32,
    },
    /// The label map's size is not the stored image's.
    #[error(
        "targets: the mask is {mask_width}x{mask_height} but the image is {width}x{height} (as stored, before EXIF orientation); masks must be the image's size"
    )]
    MaskSize {
        /// The mask's width.
        mask_width: u32,
        /// The mask's height.
        mask_height: u32,
        /// The stored image's width.
        width: u32,
        /// The stored image's height.
        height: u32,
    },
}

/// Knobs of a [`Processor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Decode only the rectangle a transform samples (JPEG). Default `true`; `false` decodes
    /// every image whole (the reference path).
    pub region_decode: bool,
    /// Let libjpeg-turbo downscale a JPEG by 1/2, 1/4 or 1/8 in the DCT domain when the sampled
    /// box is at least that many times the output in both dimensions. Default `false`: it is
    /// faster only for large sources, and its pixels differ from torchvision's (a different
    /// prefilter).
    pub dct_scaling: bool,
    /// With [`Options::dct_scaling`]: the downscale factor that must remain for the resampler
    /// after the DCT scaling, in both dimensions (at least 1). A denominator `d` is used only
    /// when the sampled box is at least `d * dct_headroom` times the output. Default 2: the
    /// antialiasing filter still averages over at least two decoded pixels per output pixel,
    /// so the DCT's own (box-like) downscale is only a prefilter.
    pub dct_headroom: u32,
    /// libjpeg-turbo's `TJPARAM_FASTUPSAMPLE` (see [`JpegTuning`]). Default `false`.
    pub fast_upsample: bool,
    /// libjpeg-turbo's `TJPARAM_FASTDCT` (see [`JpegTuning`]). Default `false`.
    pub fast_dct: bool,
    /// Decode only the restart segments that cover the region, for JPEGs with restart markers
    /// (see [`JpegTuning`]). Same pixels. Default `true`.
    pub restart_cuts: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            region_decode: true,
            dct_scaling: false,
            dct_headroom: 2,
            fast_upsample: false,
            fast_dct: false,
            restart_cuts: true,
        }
    }
}

impl Options {
    fn jpeg_tuning(&self) -> JpegTuning {
        JpegTuning {
            fast_upsample: self.fast_upsample,
            fast_dct: self.fast_dct,
            restart_cuts: self.restart_cuts,
        }
    }
}

impl Transform {
    /// The ops this 1.1 transform means (control.md, "Transforms").
    pub fn to_ops(&self) -> Vec<Op> {
        let bilinear = Resampling::default();
        match *self {
            Transform::RandomResizedCrop {
                size,
                scale,
                ratio,
                flip,
            } => vec![
                Op::RandomResizedCrop {
                    size,
                    scale,
                    ratio,
                    resampling: bilinear,
                },
                Op::HorizontalFlip { p: flip },
            ],
            Transform::CenterCrop { size, resize } => vec![
                Op::Resize {
                    size: spec::ResizeTo::Shorter(resize),
                    max_size: None,
                    resampling: bilinear,
                },
                Op::CenterCrop { size },
            ],
            Transform::Resize { size } => vec![Op::Resize {
                size: spec::ResizeTo::Exact(size.0, size.1),
                max_size: None,
                resampling: bilinear,
            }],
        }
    }

    /// The one-view pipeline of this transform.
    pub fn to_pipeline(&self) -> Pipeline {
        let (h, w) = self.size();
        Pipeline {
            views: vec![View {
                name: "image".into(),
                count: 1,
                ops: self.to_ops(),
                size: (h, w),
                normalize: None,
                erasing: Vec::new(),
                buckets: None,
            }],
        }
    }
}

impl spec::AspectBuckets {
    /// 1.10: the ops one image runs before the view's other ops, for bucket `(h, w)`: the
    /// covering resize (`buckets::cover`) and the crop. Also the crop's offsets `(top, left)` in
    /// the resized image, drawn from a copy of `rng` (the image's generator, before any draw)
    /// exactly as the crop op will draw them.
    pub fn head(&self, bucket: (u32, u32), width: u32, height: u32, rng: &SampleRng) -> ([Op; 2], (u32, u32)) {
        let (nh, nw) = buckets::cover(bucket, width, height);
        let resize = Op::Resize {
            size: spec::ResizeTo::Exact(nh, nw),
            max_size: None,
            resampling: self.resampling,
        };
        let (crop, offsets) = match self.crop {
            buckets::BucketCrop::Random => {
                let mut g = rng.clone();
                let (t, l) = plan::random_crop_offsets(nw, nh, bucket, [0; 4], false, &mut g)
                    .map_or((0, 0), |d| (d.top, d.left));
                let crop = Op::RandomCrop {
                    size: bucket,
                    padding: [0; 4],
                    pad_if_needed: false,
                    fill: [0; 3],
                };
                (crop, (t as u32, l as u32))
            }
            buckets::BucketCrop::Center => (
                Op::CenterCrop { size: bucket },
                (
                    plan::center_offset(nh, bucket.0) as u32,
                    plan::center_offset(nw, bucket.1) as u32,
                ),
            ),
        };
        ([resize, crop], offsets)
    }
}

/// Where a sample's outputs go.
pub trait Sink {
    /// The `height * width * 3` bytes of image `rep` of view `view`.
    fn image(&mut self, view: usize, rep: u32) -> &mut [u8];
    /// The erasing boxes drawn for that image, `[top, left, height, width]` per `random_erasing`
    /// op of the view (height 0: not erased).
    fn erase(&mut self, view: usize, rep: u32, boxes: &[[i32; 4]]) {
        let _ = (view, rep, boxes);
    }
}

/// One sink over plain byte buffers: output `j` (views in order, their images in order) is
/// `outs[j]`; erasing boxes are collected per output.
#[derive(Debug, Default)]
pub struct BufferSink {
    /// The images.
    pub outs: Vec<Vec<u8>>,
    /// Each image's erasing boxes.
    pub erase: Vec<Vec<[i32; 4]>>,
    /// Offsets of each view's first output in `outs`.
    starts: Vec<usize>,
}

impl BufferSink {
    /// Buffers for every output of `pipeline` in `layout`.
    pub fn for_pipeline(pipeline: &Pipeline) -> Self {
        let mut s = BufferSink::default();
        for v in &pipeline.views {
            s.starts.push(s.outs.len());
            for _ in 0..v.count {
                s.outs.push(vec![0; v.size.0 as usize * v.size.1 as usize * 3]);
                s.erase.push(Vec::new());
            }
        }
        s
    }
}

impl Sink for BufferSink {
    fn image(&mut self, view: usize, rep: u32) -> &mut [u8] {
        &mut self.outs[self.starts[view] + rep as usize]
    }

    fn erase(&mut self, view: usize, rep: u32, boxes: &[[i32; 4]]) {
        let e = &mut self.erase[self.starts[view] + rep as usize];
        e.clear();
        e.extend_from_slice(boxes);
    }
}

/// One per worker thread: a codec [`Decoder`] plus the scratch that keeps a sample free of
/// allocations once warm. `Send`, not `Sync`.
pub struct Processor {
    decoder: Decoder,
    resampler: Resampler,
    /// The decoded region (packed RGB8).
    pixels: Vec<u8>,
    /// An output staged in HWC order for an NCHW slot.
    hwc: Vec<u8>,
    /// The image the ops after the fused prefix work on, and its double buffer.
    img: Image,
    img2: Image,
    /// Float scratch (blur) and the blur's kernels.
    floats: Vec<f32>,
    kx: Vec<f32>,
    ky: Vec<f32>,
    /// Each output's plan and generator, for the current sample.
    plans: Vec<(usize, u32, Fused, SampleRng)>,
    /// Erasing boxes of the current image.
    boxes: Vec<[i32; 4]>,
    /// The steps of the op being applied, or of a GPU sample's tail (`plan_gpu`).
    steps: Vec<Step>,
    /// A GPU sample's jobs and tail steps, one per output (`plan_gpu`; kept for their capacity).
    gpu_jobs: Vec<gpu::GpuJob>,
    gpu_steps: Vec<Vec<Step>>,
    /// The geometry of output 0 and the targets it moves ([`Processor::run_targets`]).
    follow: Follow,
    /// The 1.1 transforms given to [`Processor::process`], as pipelines (a few: callers
    /// alternate between a train and an eval transform, and each would allocate anew).
    legacy: Vec<(Transform, Pipeline)>,
    options: Options,
    /// Nanoseconds the last sample spent decoding (the rest was the transform).
    decode_ns: u64,
}

impl std::fmt::Debug for Processor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Processor")
            .field("decoder", &self.decoder)
            .field("pixels_capacity", &self.pixels.capacity())
            .field("hwc_capacity", &self.hwc.capacity())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Pixels decoded around the rectangle an output reads, though the filter never reads them:
/// libjpeg-turbo upsamples subsampled chroma with a triangle filter that reads one chroma
/// sample (two pixels) beyond each pixel, and treats a region's edge as the image's edge. With
/// a margin of two pixels or more the crop's own pixels come out as in a full decode (measured:
/// bit-identical for 4:2:0 and 4:2:2, where without it edge pixels differed by up to 62
/// levels); four leaves room.
const REGION_MARGIN: u32 = 4;

/// The image's `(width, height)` once its EXIF orientation is applied (5–8 transpose it).
fn oriented(info: &ringfeed_decode::ImageInfo) -> (u32, u32) {
    if (5..=8).contains(&info.orientation) {
        (info.height, info.width)
    } else {
        (info.width, info.height)
    }
}

/// `r` grown by `m` pixels on every side, clipped to the `width`×`height` image.
fn pad_rect(r: Rect, m: u32, width: u32, height: u32) -> Rect {
    let left = r.left.saturating_sub(m);
    let top = r.top.saturating_sub(m);
    let right = (r.left + r.width).saturating_add(m).min(width);
    let bottom = (r.top + r.height).saturating_add(m).min(height);
    Rect {
        left,
        top,
        width: right.saturating_sub(left),
        height: bottom.saturating_sub(top),
    }
}

fn union(a: Rect, b: Rect) -> Rect {
    let left = a.left.min(b.left);
    let top = a.top.min(b.top);
    let right = (a.left + a.width).max(b.left + b.width);
    let bottom = (a.top + a.height).max(b.top + b.height);
    Rect {
        left,
        top,
        width: right - left,
        height: bottom - top,
    }
}

fn filter_of(r: Resampling) -> Filter {
    Filter {
        kernel: if r.interpolation == Interpolation::Bicubic {
            Kernel::Bicubic
        } else {
            Kernel::Bilinear
        },
        antialias: r.antialias,
    }
}

/// PyTorch's `interpolate(mode="nearest")` of the box `(ox, oy)` + `dst` of a base image that
/// is `src_size` scaled by `scale` (`(in / out)` per axis, in `f32`): output pixel `i` of the
/// base takes source pixel `min(floor(i · scale), in - 1)`. `src` holds the source window
/// `origin`..; the base's pixels `(ox + x, oy + y)` fill `dst.rect`.
fn nearest(src: &[u8], src_w: u32, origin: (u32, u32), pre: Rect, scale: (f32, f32), base0: (i64, i64), dst: Dst<'_>) {
    let row = dst.size.0 as usize * 3;
    for y in 0..dst.rect.height {
        let by = base0.1 + i64::from(y);
        let sy = ((by as f32 * scale.1).floor() as u32).min(pre.height - 1) + pre.top - origin.1;
        let line = &src[sy as usize * src_w as usize * 3..];
        let out = &mut dst.pixels[(dst.rect.top + y) as usize * row..];
        for x in 0..dst.rect.width {
            let bx = base0.0 + i64::from(x);
            let sx = ((bx as f32 * scale.0).floor() as u32).min(pre.width - 1) + pre.left - origin.0;
            let d = (dst.rect.left + x) as usize * 3;
            out[d..d + 3].copy_from_slice(&line[sx as usize * 3..sx as usize * 3 + 3]);
        }
    }
}

impl Processor {
    /// A processor decoding under `limits`, with default [`Options`].
    pub fn new(limits: Limits) -> Result<Self, CodecError> {
        Self::with_options(limits, Options::default())
    }

    /// A processor decoding under `limits`, with `options`.
    pub fn with_options(limits: Limits, options: Options) -> Result<Self, CodecError> {
        let mut decoder = Decoder::new(limits)?;
        decoder.set_jpeg_tuning(options.jpeg_tuning())?;
        Ok(Processor {
            decoder,
            resampler: Resampler::new(),
            pixels: Vec::new(),
            hwc: Vec::new(),
            img: Image::default(),
            img2: Image::default(),
            floats: Vec::new(),
            kx: Vec::new(),
            ky: Vec::new(),
            plans: Vec::new(),
            boxes: Vec::new(),
            steps: Vec::new(),
            gpu_jobs: Vec::new(),
            gpu_steps: Vec::new(),
            follow: Follow::default(),
            legacy: Vec::new(),
            decode_ns: 0,
            options,
        })
    }

    /// The options in force.
    pub fn options(&self) -> Options {
        self.options
    }

    /// Changes the options for the following samples. Fails only if libjpeg-turbo cannot
    /// allocate a handle.
    pub fn set_options(&mut self, options: Options) -> Result<(), CodecError> {
        self.decoder.set_jpeg_tuning(options.jpeg_tuning())?;
        self.options = options;
        Ok(())
    }

    /// The header of `data` (its format's probe, under the processor's limits): the stored
    /// image's size before EXIF orientation, read without decoding pixels.
    pub fn probe(&mut self, data: &[u8]) -> Result<ringfeed_decode::ImageInfo, CodecError> {
        self.decoder.probe(data)
    }

    /// Nanoseconds the last sample spent decoding (header probe excluded); the rest of its time
    /// was the ops. For the per-stage times of `snapshot`.
    pub fn last_decode_ns(&self) -> u64 {
        self.decode_ns
    }

    /// Decodes `data`, applies the 1.1 transform `t` with random numbers from `rng`, and writes
    /// the `height * width * 3` bytes of the result into `out` in `layout`. Returns the crop
    /// taken.
    pub fn process(
        &mut self,
        data: &[u8],
        t: &Transform,
        rng: &mut SampleRng,
        layout: Layout,
        out: &mut [u8],
    ) -> Result<Crop, OpError> {
        // The output's length is checked by `run`, against the view's declared size.
        t.validate()?;
        let k = match self.legacy.iter().position(|(old, _)| old == t) {
            Some(k) => k,
            None => {
                if self.legacy.len() >= 8 {
                    self.legacy.remove(0);
                }
                self.legacy.push((*t, t.to_pipeline()));
                self.legacy.len() - 1
            }
        };
        let pipeline = std::mem::take(&mut self.legacy[k].1);
        struct One<'a>(&'a mut [u8]);
        impl Sink for One<'_> {
            fn image(&mut self, _: usize, _: u32) -> &mut [u8] {
                self.0
            }
        }
        let result = self.run(data, &pipeline, rng.clone(), layout, &mut One(out), &mut Trace::off());
        self.legacy[k].1 = pipeline;
        result
    }

    /// Decodes `data` once and writes every output of `pipeline` into `sink` in `layout`,
    /// with random numbers from `rng` (the sample's generator; see the module docs). Returns
    /// the crop of output 0 (the ring's `crop` field).
    pub fn run(
        &mut self,
        data: &[u8],
        pipeline: &Pipeline,
        rng: SampleRng,
        layout: Layout,
        sink: &mut dyn Sink,
        trace: &mut Trace,
    ) -> Result<Crop, OpError> {
        self.follow.targets.clear();
        self.run_following(data, None, pipeline, rng, layout, sink, trace, false)
    }

    /// [`Processor::run`], and `targets` (the sample's boxes, labels and label map, in the
    /// pixels of the stored image: before EXIF orientation) moved with the image: afterwards they
    /// are in the output's pixels, sanitised by `options` (control.md, "Detection and
    /// segmentation targets (1.10)"; the module `targets`). The pipeline must make one image per
    /// sample ([`OpError::TargetsOutputs`]) and a mask must be the stored image's size
    /// ([`OpError::MaskSize`]). On error `targets` holds unspecified values.
    /// `probed` is `data`'s header when the caller probed it already ([`Processor::probe`] of the
    /// same bytes; `None`: probed here): the server probes a WebDataset sample's header for the
    /// size its instance masks are rasterised at and hands it on, so the header is read once.
    #[allow(clippy::too_many_arguments)]
    pub fn run_targets(
        &mut self,
        data: &[u8],
        probed: Option<ringfeed_decode::ImageInfo>,
        pipeline: &Pipeline,
        rng: SampleRng,
        layout: Layout,
        sink: &mut dyn Sink,
        trace: &mut Trace,
        targets: &mut Targets,
        options: &TargetOptions,
    ) -> Result<Crop, OpError> {
        let outputs: u32 = pipeline.views.iter().map(|v| v.count).sum();
        if outputs != 1 {
            return Err(OpError::TargetsOutputs { outputs });
        }
        std::mem::swap(&mut self.follow.targets, targets);
        self.follow.options = *options;
        let result = self.run_following(data, probed, pipeline, rng, layout, sink, trace, true);
        std::mem::swap(&mut self.follow.targets, targets);
        result
    }

    /// The body of [`Processor::run`]; with `follow`, output 0 records its geometry and the
    /// targets in `self.follow` are moved through it and sanitised. `probed` is `data`'s header
    /// when the caller probed it already.
    #[allow(clippy::too_many_arguments)]
    fn run_following(
        &mut self,
        data: &[u8],
        probed: Option<ringfeed_decode::ImageInfo>,
        pipeline: &Pipeline,
        rng: SampleRng,
        layout: Layout,
        sink: &mut dyn Sink,
        trace: &mut Trace,
        follow: bool,
    ) -> Result<Crop, OpError> {
        let info = match probed {
            Some(info) => info,
            None => self.decoder.probe(data)?,
        };
        let (width, height) = oriented(&info);
        if width == 0 || height == 0 {
            return Err(OpError::Codec(CodecError::Corrupt {
                format: info.format,
                reason: format!("empty image {width}x{height}"),
            }));
        }
        // Targets are in the stored image's pixels: orient them first, as the decoder orients
        // the pixels.
        self.follow.start(follow, (info.width, info.height));
        if follow {
            self.follow.check()?;
            if let Some(g) = Geo::orientation(info.orientation, (info.width, info.height)) {
                self.follow.push(g);
            }
        }

        // 1. Plan every output's geometric prefix; the union of what they read is decoded.
        self.plans.clear();
        let mut want: Option<Rect> = None;
        let mut j = 0u64;
        for (v, view) in pipeline.views.iter().enumerate() {
            for r in 0..view.count {
                let mut g = if j == 0 { rng.clone() } else { rng.fork(j) };
                let f = plan::plan(&view.ops, width, height, &mut g, trace, &mut self.follow);
                let reads = pad_rect(f.reads(), REGION_MARGIN, width, height);
                want = Some(want.map_or(reads, |w| union(w, reads)));
                self.plans.push((v, r, f, g));
                j += 1;
            }
        }
        let want = want.unwrap_or_else(|| Rect::full(width, height));

        // 2. Decode.
        let started = std::time::Instant::now();
        let (rect, denom) = if self.options.region_decode {
            let denom = match self.plans.as_slice() {
                [(_, _, f, _)] if self.options.dct_scaling => self.scale_denom(f),
                _ => 1,
            };
            let d = self.decoder.decode_region_into(data, want, denom, &mut self.pixels)?;
            (d.rect, d.scale_denom)
        } else {
            let d = self.decoder.decode_rgb8(data, &mut self.pixels)?;
            (Rect::full(d.width, d.height), 1)
        };
        self.decode_ns = started.elapsed().as_nanos() as u64;

        // 3. Each output.
        let mut crop0 = None;
        let plans = std::mem::take(&mut self.plans);
        let result = (|| -> Result<(), OpError> {
            for (v, r, f, g) in &plans {
                let view = &pipeline.views[*v];
                let mut g = g.clone();
                let c = self.output(view, f, &mut g, rect, denom, layout, sink.image(*v, *r), trace)?;
                if crop0.is_none() {
                    crop0 = Some(c);
                }
                // 4. Erasing boxes, on the final size.
                if !view.erasing.is_empty() {
                    self.boxes.clear();
                    for e in &view.erasing {
                        let b = erasing_box(e, view.size, &mut g);
                        trace.record_named("random_erasing", || {
                            [
                                ("top", b[0].into()),
                                ("left", b[1].into()),
                                ("height", b[2].into()),
                                ("width", b[3].into()),
                            ]
                        });
                        self.boxes.push(b);
                    }
                    sink.erase(*v, *r, &self.boxes);
                }
            }
            Ok(())
        })();
        self.plans = plans;
        result?;
        if follow {
            self.follow.finish()?;
        }
        Ok(crop0.unwrap_or(Crop {
            top: 0,
            left: 0,
            height,
            width,
            flipped: false,
        }))
    }

    /// The largest DCT scaling denominator (8, 4, 2) that keeps the sampled box at least
    /// `headroom` times as large as the output part it fills, or 1.
    fn scale_denom(&self, f: &Fused) -> u32 {
        let dst = f.dst();
        let (_, _, sw, sh) = f.sample();
        let headroom = self.options.dct_headroom.max(1);
        if f.resize.is_none() || f.resize.is_some_and(|(_, r)| r.interpolation == Interpolation::Nearest) {
            return 1;
        }
        [8, 4, 2]
            .into_iter()
            .find(|&d| {
                let d = f64::from(d) * f64::from(headroom);
                sw >= d * f64::from(dst.width) && sh >= d * f64::from(dst.height)
            })
            .unwrap_or(1)
    }

    /// Makes one output: the fused prefix from the decoded pixels (`rect` of the oriented
    /// image, at `1/denom`), the remaining ops, and the write into `out`.
    #[allow(clippy::too_many_arguments)]
    fn output(
        &mut self,
        view: &View,
        f: &Fused,
        rng: &mut SampleRng,
        rect: Rect,
        denom: u32,
        layout: Layout,
        out: &mut [u8],
        trace: &mut Trace,
    ) -> Result<Crop, OpError> {
        let (out_h, out_w) = view.size;
        let expected = out_h as usize * out_w as usize * 3;
        if out.len() != expected {
            return Err(OpError::OutputLength {
                expected,
                got: out.len(),
                height: out_h,
                width: out_w,
            });
        }
        let (fw, fh) = f.out_size();
        self.check_size(fw, fh, view.ops.get(f.consumed.saturating_sub(1)))?;
        let tail = &view.ops[f.consumed..];
        let direct = tail.is_empty() && (fw, fh) == (out_w, out_h);
        let mut img = std::mem::take(&mut self.img);
        let mut hwc = std::mem::take(&mut self.hwc);
        let result = (|| -> Result<Crop, OpError> {
            // Where the prefix writes: the slot itself (NHWC, nothing after), or scratch.
            let nchw = layout == Layout::Nchw;
            let target: &mut [u8] = if direct && !nchw {
                &mut *out
            } else if direct {
                hwc.resize(expected, 0);
                &mut hwc
            } else {
                img.reset(fw, fh);
                img.data_mut()
            };
            let crop = self.prefix(f, rect, denom, target, !(direct && nchw))?;
            if direct {
                if nchw {
                    write::hwc_to_chw(&hwc, out_w as usize, out_h as usize, f.flip_x, out);
                }
                return Ok(crop);
            }
            for op in tail {
                self.apply(op, &mut img, rng, trace)?;
            }
            if (img.width, img.height) != (out_w, out_h) {
                return Err(OpError::Resize(format!(
                    "the ops made a {}x{} image where the view declares {out_w}x{out_h}",
                    img.width, img.height
                )));
            }
            match layout {
                Layout::Nhwc => out.copy_from_slice(img.data()),
                Layout::Nchw => write::hwc_to_chw(img.data(), out_w as usize, out_h as usize, false, out),
            }
            Ok(crop)
        })();
        self.img = img;
        self.hwc = hwc;
        result
    }

    /// Writes the fused prefix's `(fw, fh)` image into `target`, flipped (left to right only
    /// when `flip_x`: a direct NCHW output is mirrored by its transpose instead).
    fn prefix(&mut self, f: &Fused, rect: Rect, denom: u32, target: &mut [u8], flip_x: bool) -> Result<Crop, OpError> {
        let (fw, fh) = f.out_size();
        let dst = f.dst();
        let full = Rect::full(fw, fh);
        if dst != full {
            image::fill_pixels(target, f.fill);
        }
        let df = f64::from(denom);
        let (sl, st, sw, sh) = f.sample();
        let crop = crop_of(f);
        if dst.width > 0 && dst.height > 0 {
            // `pre` (what the filter may read) relative to the decoded rectangle, at its scale.
            let b = f.pre;
            let left = (b.left / denom).max(rect.left);
            let top = (b.top / denom).max(rect.top);
            let right = (b.left + b.width).div_ceil(denom).min(rect.left + rect.width);
            let bottom = (b.top + b.height).div_ceil(denom).min(rect.top + rect.height);
            let bounds = Rect {
                left: left - rect.left,
                top: top - rect.top,
                width: right.saturating_sub(left),
                height: bottom.saturating_sub(top),
            };
            let pixels = &self.pixels[..rect.width as usize * rect.height as usize * 3];
            let nearest_resize = f.resize.is_some_and(|(_, r)| r.interpolation == Interpolation::Nearest);
            let d = Dst {
                pixels: target,
                size: (fw, fh),
                rect: dst,
            };
            if nearest_resize && denom == 1 {
                let ((rw, rh), _) = f.resize.expect("checked");
                let scale = (f.pre.width as f32 / rw as f32, f.pre.height as f32 / rh as f32);
                let d0 = (f.win.left + i64::from(dst.left), f.win.top + i64::from(dst.top));
                nearest(pixels, rect.width, (rect.left, rect.top), f.pre, scale, d0, d);
            } else {
                self.resampler
                    .set_filter(f.resize.map_or(Filter::BILINEAR, |(_, r)| filter_of(r)));
                let src = Src {
                    pixels,
                    size: (rect.width, rect.height),
                    bounds,
                };
                let sample = BoxF {
                    left: sl / df - f64::from(rect.left),
                    top: st / df - f64::from(rect.top),
                    width: sw / df,
                    height: sh / df,
                };
                write::resample(&mut self.resampler, src, sample, d)?;
            }
        }
        if f.flip_y {
            image::flip_vertical(target, fw as usize);
        }
        if f.flip_x && flip_x {
            write::flip_rows(target, fw as usize);
        }
        Ok(crop)
    }
}

/// The ring's `crop` of a fused prefix: the source box it samples, rounded as Python rounds,
/// inside `pre`.
fn crop_of(f: &Fused) -> Crop {
    let (sl, st, sw, sh) = f.sample();
    let round = |v: f64, limit: u32| (round_py(v).max(0.0) as u32).min(limit);
    let top = round(st, f.pre.top + f.pre.height - 1);
    let left = round(sl, f.pre.left + f.pre.width - 1);
    Crop {
        top,
        left,
        height: round(sh, f.pre.top + f.pre.height - top).max(1),
        width: round(sw, f.pre.left + f.pre.width - left).max(1),
        flipped: f.flip_x,
    }
}

/// torchvision v2 `RandomErasing.make_params` on an image of `(height, width)`, after the
/// probability check (`uniform >= p`: not erased): up to ten tries of an area fraction and a
/// log-uniform aspect ratio, `h = round(sqrt(area · ar))`, `w = round(sqrt(area / ar))`, kept
/// when `h < height and w < width`, then `top` and `left` uniform. `[top, left, h, w]`, `h = 0`
/// when not erased (also when no try fits, as torchvision returns the image unchanged).
fn erasing_box(e: &Erasing, (height, width): (u32, u32), rng: &mut SampleRng) -> [i32; 4] {
    if rng.uniform(0.0, 1.0) >= e.p {
        return [0; 4];
    }
    let area = f64::from(height) * f64::from(width);
    let (l0, l1) = (e.ratio.0.ln(), e.ratio.1.ln());
    for _ in 0..10 {
        let erase_area = area * rng.uniform(e.scale.0, e.scale.1);
        let ar = rng.uniform(l0, l1).exp();
        let h = round_py((erase_area * ar).sqrt());
        let w = round_py((erase_area / ar).sqrt());
        if !(h < f64::from(height) && w < f64::from(width)) {
            continue;
        }
        let (h, w) = (h as u32, w as u32);
        let top = rng.below(u64::from(height - h) + 1) as i32;
        let left = rng.below(u64::from(width - w) + 1) as i32;
        return [top, left, h as i32, w as i32];
    }
    [0; 4]
}

impl Processor {
    /// Runs one op on `img` (after the fused prefix): an op that keeps the image's size is
    /// lowered to its steps ([`steps::lower`], the draws) and they run at once
    /// ([`Processor::exec`]); the sized ops, and containers of them, here.
    fn apply(&mut self, op: &Op, img: &mut Image, rng: &mut SampleRng, trace: &mut Trace) -> Result<(), OpError> {
        if steps::lowers(op) {
            let mut todo = std::mem::take(&mut self.steps);
            todo.clear();
            steps::lower(op, (img.width, img.height), rng, trace, &mut todo);
            self.follow.push_steps(&todo, (img.width, img.height));
            for s in &todo {
                self.exec(s, img);
            }
            self.steps = todo;
            return Ok(());
        }
        let (w, h) = (img.width, img.height);
        match *op {
            Op::CenterCrop { size: (ch, cw) } => {
                let (l, t) = (plan::center_offset(w, cw), plan::center_offset(h, ch));
                trace.record(op, || [("top", t.into()), ("left", l.into())]);
                self.crop(img, (l, t), (cw, ch), [0; 3]);
            }
            Op::RandomCrop {
                size,
                padding,
                pad_if_needed,
                fill,
            } => {
                let c = plan::random_crop_offsets(w, h, size, padding, pad_if_needed, rng).ok_or(
                    OpError::CropDoesNotFit {
                        size,
                        height: h,
                        width: w,
                    },
                )?;
                let (t, l) = (c.top, c.left);
                trace.record(op, || [("top", t.into()), ("left", l.into())]);
                c.record((w, h), &mut self.follow);
                image::crop_into(img, l, t, size.1, size.0, fill, &mut self.img2);
                std::mem::swap(img, &mut self.img2);
            }
            Op::RandomResizedCrop {
                size: (oh, ow),
                scale,
                ratio,
                resampling,
            } => {
                let (t, l, ch, cw) = random_resized_crop_params(w, h, scale, ratio, rng);
                trace.record(op, || {
                    [
                        ("top", t.into()),
                        ("left", l.into()),
                        ("height", ch.into()),
                        ("width", cw.into()),
                    ]
                });
                let crop = Rect {
                    left: l,
                    top: t,
                    width: cw,
                    height: ch,
                };
                self.follow.push(Geo::Crop {
                    left: i64::from(l),
                    top: i64::from(t),
                    width: cw,
                    height: ch,
                });
                self.follow.push(Geo::Resize { width: ow, height: oh });
                self.resize_image(img, crop, (ow, oh), resampling)?;
            }
            Op::Resize {
                size,
                max_size,
                resampling,
            } => {
                let (rw, rh) = resize_target(w, h, size, max_size);
                trace.record(op, || [("height", rh.into()), ("width", rw.into())]);
                self.follow.push(Geo::Resize { width: rw, height: rh });
                self.resize_image(img, Rect::full(w, h), (rw, rh), resampling)?;
            }
            Op::RandomIouCrop {
                scale,
                aspect,
                ref options,
                trials,
            } => {
                // Its draws depend on the boxes on this image: the targets so far.
                let boxes = self.follow.flush();
                let drawn = geometry::random_iou_crop_params((w, h), boxes, (scale, aspect, options, trials), rng);
                let Some((t, l, ch, cw)) = drawn else {
                    trace.record(op, || [("apply", false.into())]);
                    return Ok(());
                };
                trace.record(op, || {
                    [
                        ("apply", true.into()),
                        ("top", t.into()),
                        ("left", l.into()),
                        ("height", ch.into()),
                        ("width", cw.into()),
                    ]
                });
                self.follow.push(Geo::KeepCentred {
                    left: l,
                    top: t,
                    right: l + i64::from(cw),
                    bottom: t + i64::from(ch),
                });
                self.crop(img, (l, t), (cw, ch), [0; 3]);
            }
            Op::RandomZoomOut { fill, side_range, p } => {
                if rng.uniform(0.0, 1.0) >= p {
                    trace.record(op, || [("apply", false.into())]);
                    return Ok(());
                }
                let pad = geometry::random_zoom_out_padding((w, h), side_range, rng);
                trace.record(op, || [("apply", true.into()), ("padding", pad.to_vec().into())]);
                let (cw, ch) = (w + pad[0] + pad[2], h + pad[1] + pad[3]);
                self.check_size(cw, ch, Some(op))?;
                self.crop(img, (-i64::from(pad[0]), -i64::from(pad[1])), (cw, ch), fill);
            }
            Op::ScaleJitter {
                target,
                scale,
                resampling,
            } => {
                let (rw, rh) = geometry::scale_jitter_size((w, h), target, scale, rng);
                trace.record(op, || [("height", rh.into()), ("width", rw.into())]);
                self.check_size(rw, rh, Some(op))?;
                self.follow.push(Geo::Resize { width: rw, height: rh });
                self.resize_image(img, Rect::full(w, h), (rw, rh), resampling)?;
            }
            // Containers with a sized op inside: the same draws as `steps::lower`'s.
            Op::RandomApply { p, ref ops } => {
                if steps::coin(op, p, rng, trace) {
                    for o in ops {
                        self.apply(o, img, rng, trace)?;
                    }
                }
            }
            Op::RandomChoice {
                ref ops,
                ref cumulative,
            } => {
                let k = steps::choice(op, cumulative, rng, trace);
                self.apply(&ops[k], img, rng, trace)?;
            }
            _ => unreachable!("{} lowers to steps", op.name()),
        }
        Ok(())
    }

    /// Crops the `w`×`h` window at `(left, top)` of `img` (outside it: `fill`), and records it.
    fn crop(&mut self, img: &mut Image, (left, top): (i64, i64), (w, h): (u32, u32), fill: [u8; 3]) {
        self.follow.push(Geo::Crop {
            left,
            top,
            width: w,
            height: h,
        });
        image::crop_into(img, left, top, w, h, fill, &mut self.img2);
        std::mem::swap(img, &mut self.img2);
    }

    /// Runs one step on `img` (it keeps its size).
    fn exec(&mut self, step: &Step, img: &mut Image) {
        let (w, h) = (img.width, img.height);
        match *step {
            Step::Remap(Remap::FlipX) => write::flip_rows(img.data_mut(), w as usize),
            Step::Remap(Remap::FlipY) => image::flip_vertical(img.data_mut(), w as usize),
            Step::Remap(r) => {
                // A rotation by quarters: each output pixel copies its source pixel.
                let c = r.coefficients((w, h));
                self.img2.reset(w, h);
                let (src, dst) = (img.data(), &mut self.img2.pixels);
                let (wu, hu) = (i64::from(w), i64::from(h));
                for y in 0..hu {
                    for x in 0..wu {
                        let (sx, sy) = (c[0] * x + c[1] * y + c[2], c[3] * x + c[4] * y + c[5]);
                        let (d, s) = (((y * wu + x) * 3) as usize, ((sy * wu + sx) * 3) as usize);
                        dst[d..d + 3].copy_from_slice(&src[s..s + 3]);
                    }
                }
                std::mem::swap(img, &mut self.img2);
            }
            Step::Brightness(v) => color::brightness(img.data_mut(), v),
            Step::Contrast(v) => color::contrast(img.data_mut(), v),
            Step::Saturation(v) => color::saturation(img.data_mut(), v),
            Step::Hue(v) => color::hue(img.data_mut(), v),
            Step::Grayscale => color::grayscale(img.data_mut()),
            Step::Solarize(t) => tone::solarize(img.data_mut(), t),
            Step::Posterize(bits) => tone::posterize(img.data_mut(), bits),
            Step::Invert => tone::invert(img.data_mut()),
            Step::Autocontrast => tone::autocontrast(img.data_mut()),
            Step::Equalize => tone::equalize(img.data_mut()),
            Step::Sharpness(v) => {
                let mut scratch = std::mem::take(&mut self.img2.pixels);
                color::sharpness(img.data_mut(), w as usize, h as usize, v, &mut scratch);
                self.img2.pixels = scratch;
            }
            Step::Blur { kernel, sigma } => blur::gaussian_blur(
                img.data_mut(),
                w as usize,
                h as usize,
                kernel,
                (sigma, sigma),
                &mut self.floats,
                &mut self.kx,
                &mut self.ky,
            ),
            Step::Affine { matrix, interp, fill } => {
                self.img2.reset(w, h);
                affine::warp(img.data(), w, h, matrix, interp, fill, self.img2.data_mut());
                std::mem::swap(img, &mut self.img2);
            }
        }
    }

    /// An intermediate image of `w`×`h` must stay within the decode limit (`--max-pixels`): a
    /// `resize` of the shorter side of a thin image could otherwise ask for gigapixels.
    fn check_size(&self, w: u32, h: u32, op: Option<&Op>) -> Result<(), OpError> {
        let max = self.decoder.limits().max_pixels;
        if u64::from(w) * u64::from(h) > max {
            return Err(OpError::TooManyPixels {
                op: op.map_or("the pipeline", Op::name),
                width: w,
                height: h,
                max,
            });
        }
        Ok(())
    }

    /// Resizes the window `crop` of `img` to `(w, h)`, reading only the window (torchvision's
    /// crop-then-resize), into `img`.
    fn resize_image(&mut self, img: &mut Image, crop: Rect, (w, h): (u32, u32), r: Resampling) -> Result<(), OpError> {
        self.check_size(w, h, None)?;
        self.img2.reset(w, h);
        let dst = Dst {
            pixels: self.img2.data_mut(),
            size: (w, h),
            rect: Rect::full(w, h),
        };
        if r.interpolation == Interpolation::Nearest {
            let scale = (crop.width as f32 / w as f32, crop.height as f32 / h as f32);
            nearest(img.data(), img.width, (0, 0), crop, scale, (0, 0), dst);
        } else {
            self.resampler.set_filter(filter_of(r));
            let src = Src {
                pixels: img.data(),
                size: (img.width, img.height),
                bounds: crop,
            };
            let sample = BoxF {
                left: f64::from(crop.left),
                top: f64::from(crop.top),
                width: f64::from(crop.width),
                height: f64::from(crop.height),
            };
            write::resample(&mut self.resampler, src, sample, dst)?;
        }
        std::mem::swap(img, &mut self.img2);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_names_the_member() {
        let ok = Transform::random_resized_crop((224, 224));
        assert_eq!(ok.validate(), Ok(()));
        let cases: [(Transform, &str); 9] = [
            (Transform::Resize { size: (0, 5) }, "transform.size"),
            (Transform::Resize { size: (5, 4097) }, "transform.size"),
            (
                Transform::CenterCrop {
                    size: (224, 224),
                    resize: 0,
                },
                "transform.resize",
            ),
            (
                Transform::RandomResizedCrop {
                    size: (224, 224),
                    scale: (0.0, 1.0),
                    ratio: (0.75, 1.33),
                    flip: 0.5,
                },
                "transform.scale",
            ),
            (
                Transform::RandomResizedCrop {
                    size: (224, 224),
                    scale: (0.5, 0.4),
                    ratio: (0.75, 1.33),
                    flip: 0.5,
                },
                "transform.scale",
            ),
            (
                Transform::RandomResizedCrop {
                    size: (224, 224),
                    scale: (0.5, 1.01),
                    ratio: (0.75, 1.33),
                    flip: 0.5,
                },
                "transform.scale",
            ),
            (
                Transform::RandomResizedCrop {
                    size: (224, 224),
                    scale: (0.5, 1.0),
                    ratio: (1.5, 1.33),
                    flip: 0.5,
                },
                "transform.ratio",
            ),
            (
                Transform::RandomResizedCrop {
                    size: (224, 224),
                    scale: (0.5, 1.0),
                    ratio: (0.75, f64::NAN),
                    flip: 0.5,
                },
                "transform.ratio",
            ),
            (
                Transform::RandomResizedCrop {
                    size: (224, 224),
                    scale: (0.5, 1.0),
                    ratio: (0.75, 1.33),
                    flip: 1.5,
                },
                "transform.flip",
            ),
        ];
        for (t, member) in cases {
            let msg = t.validate().unwrap_err().to_string();
            assert!(msg.starts_with(&format!("{member}: ")), "{t:?}: {msg}");
        }
        let edge = Transform::RandomResizedCrop {
            size: (1, 4096),
            scale: (1.0, 1.0),
            ratio: (1.0, 1.0),
            flip: 0.0,
        };
        assert_eq!(edge.validate(), Ok(()));
    }

    #[test]
    fn layout_names() {
        assert_eq!(Layout::parse("NHWC"), Ok(Layout::Nhwc));
        assert_eq!(Layout::parse("NCHW"), Ok(Layout::Nchw));
        assert!(Layout::parse("nchw").unwrap_err().to_string().starts_with("layout: "));
    }

    #[test]
    fn processor_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<Processor>();
    }
}
