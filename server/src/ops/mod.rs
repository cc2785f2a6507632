//! Per-sample transforms, written straight into the caller's output buffer.
//!
//! For each sample the pipeline hands a [`Processor`] the encoded bytes, a [`Transform`], the
//! sample's [`SampleRng`] and a destination of exactly `h * w * 3` bytes inside a ring slot.
//! The processor decodes, crops, resizes and flips into it, in [`Layout::Nhwc`] or
//! [`Layout::Nchw`], and returns the [`Crop`] it took (the ring's `crop` field).
//!
//! # Semantics (torchvision v2, `antialias=True`)
//! - [`Transform::RandomResizedCrop`]: [`random_resized_crop_params`] on the decoded,
//!   EXIF-oriented image, then the crop alone resized to `size` (as `F.resized_crop`: crop
//!   first, so the filter never reads outside the crop), then a horizontal flip when
//!   `rng.uniform(0, 1) < flip`, drawn after the crop parameters.
//! - [`Transform::CenterCrop`]: `Resize(resize)` (shorter side to `resize`, the longer
//!   `int(resize * long / short)`) then `CenterCrop(size)` (offset
//!   `int(round((n - c) / 2.0))`, zero padding where the crop is larger). Both happen in one
//!   resample: the crop's box mapped back to source pixels, with the filter free to read
//!   around it as it would in the resized whole.
//! - [`Transform::Resize`]: stretch to exactly `size`.
//!
//! Resampling is [`crate::resample`]: Pillow's antialiased bilinear, which torchvision's uint8
//! `antialias=True` path also follows (and, bit for bit, fast_image_resize's
//! `Convolution(Bilinear)`, which it replaced).
//!
//! # Invariants
//! - **Output is a pure function of (bytes, transform, rng state, layout)**: the same inputs
//!   give the same bytes on any processor and thread, whatever it processed before.
//! - **Only what the crop needs is decoded, and the pixels are a full decode's.** A JPEG is
//!   decoded by region (libjpeg-turbo's cropping region, see
//!   [`Decoder::decode_region_rgb8`]) with a few pixels to spare around what the filter reads,
//!   so the output is bit-identical to the full-decode path (tested for every subsampling,
//!   grey, CMYK/YCCK, progressive, arithmetic and EXIF-oriented files). Every other format is
//!   decoded whole. [`Options::region_decode`] turns region decoding off (the reference path
//!   in tests); [`Options::dct_scaling`] trades exactness for speed on large sources.
//! - **A JPEG with restart markers is decoded only where the region is** (as `ringfeed pack`
//!   stores them): the segments between markers that cover the region are cut out as a JPEG of
//!   their own (`codec/restart.rs`), so not even the Huffman decoding happens outside it. The
//!   region's pixels are the same (tested with the full-decode comparisons above);
//!   [`Options::restart_cuts`] turns it off.
//! - **No per-sample heap allocation in Rust once warm** (tested by `tests/alloc.rs`): the
//!   decoded region, the NCHW staging image and the resampler's coefficient tables and rows are
//!   per-processor and keep their capacity. (libjpeg-turbo still `malloc`s about ten small
//!   tables per image of its own, out of our reach through the TurboJPEG API.)
//! - **No input panics**: any byte string gives `Ok` or an [`OpError`]; `out` of the wrong
//!   length is an error, and on error `out` holds unspecified bytes.
//!
//! # Layout
//! - `rng`: [`SampleRng`], the per-sample generator.
//! - `geometry`: torchvision's crop and resize arithmetic.
//! - `write`: the resample, flip and HWC → CHW transpose.

mod geometry;
mod rng;
mod write;

pub use geometry::{random_resized_crop_params, resize_shorter};
pub use rng::SampleRng;

use crate::codec::{CodecError, Decoder, JpegTuning, Limits, Rect};
use crate::resample::Resampler;
use geometry::{center_axis, round_py};
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
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "NHWC" => Ok(Layout::Nhwc),
            "NCHW" => Ok(Layout::Nchw),
            other => Err(format!("layout: expected \"NHWC\" or \"NCHW\", got {other:?}")),
        }
    }
}

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
    pub fn validate(&self) -> Result<(), String> {
        let (h, w) = self.size();
        if !(1..=MAX_SIZE).contains(&h) || !(1..=MAX_SIZE).contains(&w) {
            return Err(format!(
                "transform.size: each side must be in 1..={MAX_SIZE}, got [{h}, {w}]"
            ));
        }
        match *self {
            Transform::RandomResizedCrop { scale, ratio, flip, .. } => {
                let (s0, s1) = scale;
                if !(s0 > 0.0 && s0 <= s1 && s1 <= 1.0) {
                    return Err(format!(
                        "transform.scale: must satisfy 0 < scale[0] <= scale[1] <= 1, got [{s0}, {s1}]"
                    ));
                }
                let (r0, r1) = ratio;
                if !(r0 > 0.0 && r0 <= r1 && r1.is_finite()) {
                    return Err(format!(
                        "transform.ratio: must satisfy 0 < ratio[0] <= ratio[1] (finite), got [{r0}, {r1}]"
                    ));
                }
                if !(0.0..=1.0).contains(&flip) {
                    return Err(format!("transform.flip: must be in [0, 1], got {flip}"));
                }
            }
            Transform::CenterCrop { resize, .. } => {
                if !(1..=MAX_SIZE).contains(&resize) {
                    return Err(format!("transform.resize: must be in 1..={MAX_SIZE}, got {resize}"));
                }
            }
            Transform::Resize { .. } => {}
        }
        Ok(())
    }
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
    /// The transform is out of bounds ([`Transform::validate`]'s message).
    #[error("{0}")]
    Transform(String),
    /// The resampler refused its arguments: a bug in our geometry, never the input's fault.
    #[error("internal resize error: {0}")]
    Resize(String),
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

/// One per worker thread: a codec [`Decoder`] plus the scratch that keeps `process` free of
/// allocations once warm. `Send`, not `Sync`.
pub struct Processor {
    decoder: Decoder,
    resampler: Resampler,
    /// The decoded region (packed RGB8).
    pixels: Vec<u8>,
    /// The resampled image in HWC order, staged here for an NCHW output.
    hwc: Vec<u8>,
    options: Options,
    /// Nanoseconds the last `process` spent decoding (the rest was the transform).
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

/// Where one sample comes from and goes to, in the oriented full-size image.
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// The rectangle to decode.
    want: Rect,
    /// What the filter may read; `None`: all that was decoded.
    bounds: Option<Rect>,
    /// The sampled box.
    sample: BoxF,
    /// The part of the output it fills; the rest is zero.
    dst: Rect,
    crop: Crop,
}

impl Plan {
    fn new(t: &Transform, width: u32, height: u32, rng: &mut SampleRng) -> Plan {
        let (out_h, out_w) = t.size();
        let whole = Rect::full(width, height);
        let out = Rect::full(out_w, out_h);
        match *t {
            Transform::RandomResizedCrop { scale, ratio, flip, .. } => {
                let (top, left, h, w) = random_resized_crop_params(width, height, scale, ratio, rng);
                let flipped = rng.uniform(0.0, 1.0) < flip;
                let rect = Rect {
                    left,
                    top,
                    width: w,
                    height: h,
                };
                Plan {
                    want: pad_rect(rect, REGION_MARGIN, width, height),
                    bounds: Some(rect),
                    sample: box_of(rect),
                    dst: out,
                    crop: Crop {
                        top,
                        left,
                        height: h,
                        width: w,
                        flipped,
                    },
                }
            }
            Transform::CenterCrop { resize, .. } => {
                let (rw, rh) = resize_shorter(width, height, resize);
                let (x, y) = (center_axis(width, rw, out_w), center_axis(height, rh, out_h));
                let (left, w) = margin(x.src_start, x.src_len, x.dst_len, width);
                let (top, h) = margin(y.src_start, y.src_len, y.dst_len, height);
                let round = |v: f64, limit: u32| (round_py(v).max(0.0) as u32).min(limit);
                let crop_left = round(x.src_start, width - 1);
                let crop_top = round(y.src_start, height - 1);
                Plan {
                    want: Rect {
                        left,
                        top,
                        width: w,
                        height: h,
                    },
                    bounds: None,
                    sample: BoxF {
                        left: x.src_start,
                        top: y.src_start,
                        width: x.src_len,
                        height: y.src_len,
                    },
                    dst: Rect {
                        left: x.dst_start,
                        top: y.dst_start,
                        width: x.dst_len,
                        height: y.dst_len,
                    },
                    crop: Crop {
                        top: crop_top,
                        left: crop_left,
                        height: round(y.src_len, height - crop_top).max(1),
                        width: round(x.src_len, width - crop_left).max(1),
                        flipped: false,
                    },
                }
            }
            Transform::Resize { .. } => Plan {
                want: whole,
                bounds: None,
                sample: box_of(whole),
                dst: out,
                crop: Crop {
                    top: 0,
                    left: 0,
                    height,
                    width,
                    flipped: false,
                },
            },
        }
    }

    /// The largest DCT scaling denominator (8, 4, 2) that keeps the sampled box at least
    /// `headroom` times as large as the output part it fills, or 1.
    fn scale_denom(&self, headroom: u32) -> u32 {
        [8, 4, 2]
            .into_iter()
            .find(|&d| {
                let d = f64::from(d) * f64::from(headroom.max(1));
                self.sample.width >= d * f64::from(self.dst.width)
                    && self.sample.height >= d * f64::from(self.dst.height)
            })
            .unwrap_or(1)
    }
}

/// Pixels decoded around a RandomResizedCrop's rectangle, though the filter never reads them:
/// libjpeg-turbo upsamples subsampled chroma with a triangle filter that reads one chroma
/// sample (two pixels) beyond each pixel, and treats a region's edge as the image's edge. With
/// a margin of two pixels or more the crop's own pixels come out as in a full decode (measured:
/// bit-identical for 4:2:0 and 4:2:2, where without it edge pixels differed by up to 62
/// levels); four leaves room.
const REGION_MARGIN: u32 = 4;

/// `r` grown by `m` pixels on every side, clipped to the `width`×`height` image.
fn pad_rect(r: Rect, m: u32, width: u32, height: u32) -> Rect {
    let left = r.left.saturating_sub(m);
    let top = r.top.saturating_sub(m);
    let right = (r.left + r.width).saturating_add(m).min(width);
    let bottom = (r.top + r.height).saturating_add(m).min(height);
    Rect {
        left,
        top,
        width: right - left,
        height: bottom - top,
    }
}

fn box_of(r: Rect) -> BoxF {
    BoxF {
        left: f64::from(r.left),
        top: f64::from(r.top),
        width: f64::from(r.width),
        height: f64::from(r.height),
    }
}

/// The source interval a resample of `[start, start + len)` onto `out` pixels reads: the box
/// widened by the bilinear filter's radius (1 source pixel, times the downscale factor) plus
/// one pixel for rounding, clipped to `0..limit`. Returns `(first, count)`, `count >= 1`.
fn margin(start: f64, len: f64, out: u32, limit: u32) -> (u32, u32) {
    let radius = (len / f64::from(out.max(1))).max(1.0) + 1.0;
    let a = (start - radius).floor().clamp(0.0, f64::from(limit - 1)) as u32;
    let b = (start + len + radius).ceil().clamp(f64::from(a + 1), f64::from(limit)) as u32;
    (a, b - a)
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

    /// Decodes `data`, applies `t` with random numbers from `rng`, and writes the
    /// `height * width * 3` bytes of the result into `out` in `layout`. Returns the crop taken.
    /// Nanoseconds the last [`process`](Self::process) spent decoding (header probe excluded);
    /// the rest of its time was the transform. For the per-stage times of `snapshot`.
    pub fn last_decode_ns(&self) -> u64 {
        self.decode_ns
    }

    pub fn process(
        &mut self,
        data: &[u8],
        t: &Transform,
        rng: &mut SampleRng,
        layout: Layout,
        out: &mut [u8],
    ) -> Result<Crop, OpError> {
        t.validate().map_err(OpError::Transform)?;
        let (out_h, out_w) = t.size();
        let expected = t.output_len();
        if out.len() != expected {
            return Err(OpError::OutputLength {
                expected,
                got: out.len(),
                height: out_h,
                width: out_w,
            });
        }
        let info = self.decoder.probe(data)?;
        let (width, height) = if (5..=8).contains(&info.orientation) {
            (info.height, info.width)
        } else {
            (info.width, info.height)
        };
        if width == 0 || height == 0 {
            return Err(OpError::Codec(CodecError::Corrupt {
                format: info.format,
                reason: format!("empty image {width}x{height}"),
            }));
        }
        let plan = Plan::new(t, width, height, rng);

        // Decode: the plan's rectangle, or the whole image.
        let started = std::time::Instant::now();
        let (rect, denom) = if self.options.region_decode {
            let denom = if self.options.dct_scaling {
                plan.scale_denom(self.options.dct_headroom)
            } else {
                1
            };
            let d = self
                .decoder
                .decode_region_into(data, plan.want, denom, &mut self.pixels)?;
            (d.rect, d.scale_denom)
        } else {
            let d = self.decoder.decode_rgb8(data, &mut self.pixels)?;
            (Rect::full(d.width, d.height), 1)
        };
        self.decode_ns = started.elapsed().as_nanos() as u64;
        let df = f64::from(denom);

        // Everything relative to the decoded rectangle, at its scale.
        let bounds = match plan.bounds {
            Some(b) => {
                // Scaled outwards, then clipped to what was decoded.
                let left = (b.left / denom).max(rect.left);
                let top = (b.top / denom).max(rect.top);
                let right = (b.left + b.width).div_ceil(denom).min(rect.left + rect.width);
                let bottom = (b.top + b.height).div_ceil(denom).min(rect.top + rect.height);
                Rect {
                    left: left - rect.left,
                    top: top - rect.top,
                    width: right.saturating_sub(left),
                    height: bottom.saturating_sub(top),
                }
            }
            None => Rect::full(rect.width, rect.height),
        };
        let sample = BoxF {
            left: plan.sample.left / df - f64::from(rect.left),
            top: plan.sample.top / df - f64::from(rect.top),
            width: plan.sample.width / df,
            height: plan.sample.height / df,
        };
        let src = Src {
            pixels: &self.pixels[..rect.width as usize * rect.height as usize * 3],
            size: (rect.width, rect.height),
            bounds,
        };
        let padded = plan.dst != Rect::full(out_w, out_h);
        let flip = plan.crop.flipped;
        match layout {
            Layout::Nhwc => {
                if padded {
                    out.fill(0);
                }
                let dst = Dst {
                    pixels: out,
                    size: (out_w, out_h),
                    rect: plan.dst,
                };
                write::resample(&mut self.resampler, src, sample, dst)?;
                if flip {
                    write::flip_rows(out, out_w as usize);
                }
            }
            Layout::Nchw => {
                self.hwc.resize(expected, 0);
                if padded {
                    self.hwc.fill(0);
                }
                let dst = Dst {
                    pixels: &mut self.hwc,
                    size: (out_w, out_h),
                    rect: plan.dst,
                };
                write::resample(&mut self.resampler, src, sample, dst)?;
                write::hwc_to_chw(&self.hwc, out_w as usize, out_h as usize, flip, out);
            }
        }
        Ok(plan.crop)
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
            let msg = t.validate().unwrap_err();
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
        assert!(Layout::parse("nchw").unwrap_err().starts_with("layout: "));
    }

    #[test]
    fn margin_covers_the_filter() {
        // 437.5 source pixels onto 224: radius 1.95 + 1.
        assert_eq!(margin(31.25, 437.5, 224, 500), (28, 444));
        // Clipped at both edges, never empty.
        assert_eq!(margin(0.0, 10.0, 10, 10), (0, 10));
        assert_eq!(margin(9.5, 0.5, 10, 10), (7, 3));
    }

    #[test]
    fn center_crop_plan() {
        let t = Transform::CenterCrop {
            size: (224, 224),
            resize: 256,
        };
        let p = Plan::new(&t, 500, 375, &mut SampleRng::new(0, 0, 0));
        // Resized to 341x256; crop offsets round((341-224)/2) = 58 (58.5 -> 58), 16.
        assert!((p.sample.left - 58.0 * 500.0 / 341.0).abs() < 1e-9);
        assert!((p.sample.top - 16.0 * 375.0 / 256.0).abs() < 1e-9);
        assert_eq!(p.dst, Rect::full(224, 224));
        assert!(Rect::full(500, 375).contains(&p.want));
        assert_eq!(
            (p.crop.top, p.crop.left, p.crop.height, p.crop.width),
            (23, 85, 328, 328)
        );
        // A crop larger than the resized image pads.
        let t = Transform::CenterCrop {
            size: (300, 100),
            resize: 256,
        };
        let p = Plan::new(&t, 500, 375, &mut SampleRng::new(0, 0, 0));
        assert_eq!(
            p.dst,
            Rect {
                left: 0,
                top: 22,
                width: 100,
                height: 256
            }
        );
    }

    #[test]
    fn processor_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<Processor>();
    }
}
