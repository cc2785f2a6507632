//! Image probing, decoding and JPEG re-encoding, with explicit resource limits.
//!
//! The offline packer (`ringfeed pack`) runs every image through [`Decoder::probe`] /
//! [`Decoder::decode_rgb8`] to validate it, and through [`Decoder::reencode_jpeg`] when it
//! shrinks a dataset to a maximum side and JPEG quality. The serving hot path (`ringfeed_ops`)
//! decodes through the same [`Decoder`], with [`Decoder::decode_region_rgb8`]: only the part of
//! a JPEG that a crop needs. A `Decoder` is per-thread state: one libjpeg-turbo handle reused
//! across images, and scratch buffers that keep their capacity between calls.
//!
//! [`resample`] is the antialiased bilinear resampler behind the ops and re-encoding (it owns
//! [`Rect`]); it allocates nothing once warm.
//!
//! # Invariants
//! - **Content decides the format.** [`sniff`] looks at magic bytes only; a file name never
//!   matters.
//! - **Limits are checked from the header, before any pixel allocation.** An image with more than
//!   [`Limits::max_pixels`] pixels fails with [`CodecError::TooLarge`] after parsing only its
//!   header, whatever its format. Memory per decoding thread is therefore bounded; see
//!   [`Limits`] for the bound.
//! - **Every output is packed RGB8**, row-major, `width * height * 3` bytes, with the EXIF
//!   orientation already applied. Grey is replicated, alpha is dropped without compositing,
//!   palettes are expanded, 16-bit samples are rounded to 8 bits (`(v + 128) / 257`), CMYK/YCCK
//!   JPEGs are converted the way Pillow's `Image.open(f).convert("RGB")` does. A region decode
//!   gives exactly the pixels of the same rectangle of a full decode (tested), except within
//!   two pixels of a region edge that is not an image edge, where libjpeg-turbo's chroma
//!   upsampling lacks its neighbours; and except when DCT scaling is asked for.
//! - **Warnings are errors.** A truncated or corrupt JPEG fails instead of decoding to grey
//!   (libjpeg-turbo's `TJPARAM_STOPONWARNING`). A decode either returns the whole image or an
//!   error; never a partial image.
//! - **No input panics.** Our parsers are bounds-checked, and calls into the `image` crate run
//!   under `catch_unwind`, so a panic inside a decoder becomes [`CodecError::Corrupt`].
//! - **Results do not depend on history.** The same bytes and options give the same pixels and
//!   the same re-encoded bytes on any `Decoder` and any thread, whatever it decoded before (a
//!   JPEG that relies on tables it does not define is decoded on a fresh libjpeg-turbo handle,
//!   see `jpeg.rs`).
//!
//! # Layout
//! - `sniff`: [`Format`] and magic-byte detection.
//! - `jpeg`: libjpeg-turbo through the raw TurboJPEG 3 API: header probe, decode (whole, or a
//!   region at a DCT scale), CMYK → RGB, baseline encode.
//! - `markers`: a bounded JPEG marker walk: EXIF orientation, frame presence, and whether the
//!   stream defines every table it uses.
//! - `raster`: every other format through the `image` crate, with `image::Limits` set.
//! - `orient`: EXIF orientation applied to a packed RGB8 buffer, and rectangles mapped between
//!   stored and oriented coordinates.
//! - `resize`: the target size of a re-encode, and the antialiased bilinear downscale.
//! - [`labels`]: label-map PNGs (segmentation masks): palette indices and grey values as labels.

mod jpeg;
pub mod labels;
mod markers;
mod orient;
mod raster;
pub mod resample;
mod resize;
mod restart;
mod sniff;

use std::fmt;

pub use markers::Chroma;
pub use resample::Rect;
pub use sniff::{Format, sniff};

/// For a self-contained, sequential, single-scan, Huffman-coded JPEG (SOF0/SOF1 with every
/// table it uses: what a GPU's hardware decoder takes, control.md "Hybrid decode"), its chroma
/// sampling from its frame header; `None` for anything else. A bounded header walk; the
/// entropy-coded data is not read.
pub fn sequential_huffman_chroma(data: &[u8]) -> Option<Chroma> {
    let m = markers::walk(data);
    m.layout.and(m.chroma)
}

/// PIL's `Image.MAX_IMAGE_PIXELS`: `1024 * 1024 * 1024 // 4 // 3`.
pub const DEFAULT_MAX_PIXELS: u64 = 89_478_485;

/// Resource limits for one [`Decoder`].
///
/// # Memory bound per decoding thread
/// Every allocation that grows with the image is sized from the header after the
/// `width * height <= max_pixels` check, so with `P = max_pixels` one thread holds at most about:
/// - `3·P` bytes of RGB8 output (the caller's `out`, or the decoder's own buffer in
///   [`Decoder::reencode_jpeg`]);
/// - `8·P` bytes of scratch: the native-depth decode of a 16-bit RGBA image, the CMYK
///   intermediate of a CMYK JPEG (`4·P`), or the rotation target of an EXIF orientation
///   (`3·P`);
/// - `8·P` bytes inside the decoder: libjpeg-turbo's whole-image coefficient buffer for
///   progressive JPEGs (`TJPARAM_MAXMEMORY`), or the `image` crate's internal buffers
///   (`image::Limits::max_alloc`, which also counts the scratch above);
/// - for a re-encode, after the decoder's internal buffers are freed: the downscaled copy
///   (at most `3·P`) and the JPEG output buffer (libjpeg-turbo's worst case, about 4 bytes per
///   encoded pixel).
///
/// That is under `19·P` bytes, about 1.7 GB at the default `P` of 89,478,485; an ordinary
/// baseline 8-bit JPEG needs `3·P` (`6·P` when it must be rotated). Lower `max_pixels`
/// (`--max-pixels`) to cap memory on a many-core host, raise it to accept larger images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted `width * height` of a source image, checked from its header.
    pub max_pixels: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_pixels: DEFAULT_MAX_PIXELS,
        }
    }
}

impl Limits {
    /// Bytes of scratch and of decoder-internal buffers allowed per image (`8 * max_pixels`).
    fn budget_bytes(&self) -> u64 {
        self.max_pixels.saturating_mul(8)
    }

    /// `Err(TooLarge)` unless `width * height <= max_pixels`.
    fn check(&self, width: u32, height: u32) -> Result<(), CodecError> {
        if u64::from(width) * u64::from(height) > self.max_pixels {
            return Err(CodecError::TooLarge {
                width,
                height,
                limit: self.max_pixels,
            });
        }
        Ok(())
    }
}

/// The colour model stored in the file (before conversion to RGB8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColorKind {
    /// One channel (also bilevel and 2/4-bit grey).
    Gray,
    /// Grey plus alpha.
    GrayAlpha,
    /// Three colour channels: RGB, BGR, or a YCbCr JPEG.
    Rgb,
    /// RGB plus alpha.
    Rgba,
    /// Four-channel JPEG (or TIFF) stored as CMYK.
    Cmyk,
    /// Four-channel JPEG stored as YCCK (Adobe transform 2).
    Ycck,
    /// Anything else the decoder reports.
    Other,
}

/// What a header says about an image. `width`/`height` are as stored, before orientation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInfo {
    /// The format found by [`sniff`].
    pub format: Format,
    /// Stored width in pixels.
    pub width: u32,
    /// Stored height in pixels.
    pub height: u32,
    /// The stored colour model.
    pub color: ColorKind,
    /// Bits per sample before conversion to 8 bits: 8 for most files, 16 for 16-bit PNG, TIFF
    /// and PNM, the JPEG precision (12-bit JPEGs probe but do not decode). Palette and
    /// low-depth PNGs report 8: the decoder expands them.
    pub bits_per_channel: u8,
    /// EXIF orientation, 1..=8; 1 when absent or invalid.
    pub orientation: u8,
    /// A progressive JPEG (SOF2/SOF6/SOF10/SOF14) or an Adam7-interlaced PNG.
    pub progressive: bool,
}

/// The result of a decode: the header, and the size of the pixels written to `out`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    /// The source image's header.
    pub info: ImageInfo,
    /// Width of the output: after orientation, and for a re-encode after downscaling.
    pub width: u32,
    /// Height of the output: after orientation, and for a re-encode after downscaling.
    pub height: u32,
}

/// The result of [`Decoder::decode_region_rgb8`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionDecoded {
    /// The source image's header.
    pub info: ImageInfo,
    /// Width of the whole image after orientation and scaling.
    pub width: u32,
    /// Height of the whole image after orientation and scaling.
    pub height: u32,
    /// The rectangle of that (oriented, scaled) image held in the output buffer, packed RGB8,
    /// `rect.width * rect.height * 3` bytes. It contains the requested rectangle (scaled).
    pub rect: Rect,
    /// The DCT scaling actually applied: the image was decoded at `1/scale_denom` (1, 2, 4 or
    /// 8). Always 1 for anything but a region-decodable JPEG.
    pub scale_denom: u32,
}

/// Speed switches for JPEG decoding ([`Decoder::set_jpeg_tuning`]). The two libjpeg-turbo
/// switches are off by default: then pixels equal Pillow's decode (same library, same
/// defaults). Restart cuts change no pixel and are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegTuning {
    /// `TJPARAM_FASTUPSAMPLE`: nearest-neighbour chroma upsampling (merged with the colour
    /// conversion) instead of the triangle ("fancy") filter.
    pub fast_upsample: bool,
    /// `TJPARAM_FASTDCT`: the fast integer IDCT (`JDCT_IFAST`) instead of the accurate one.
    pub fast_dct: bool,
    /// Region decodes of a JPEG with restart markers decode only the segments that cover the
    /// region (`restart.rs`): the same pixels, without Huffman-decoding the rest. Default
    /// `true`; `false` is the reference path in tests and benchmarks.
    pub restart_cuts: bool,
}

impl Default for JpegTuning {
    fn default() -> Self {
        JpegTuning {
            fast_upsample: false,
            fast_dct: false,
            restart_cuts: true,
        }
    }
}

/// MCUs per restart segment that `ringfeed pack` aims for ([`Decoder::add_restarts`]). Four
/// 16-pixel MCUs (64 pixels) is fine enough that a RandomResizedCrop decodes little outside
/// its crop, and coarse enough that the markers cost about 1 % of the file.
pub const RESTART_TARGET_MCUS: u32 = 2;

/// Options of [`Decoder::reencode_jpeg`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reencode {
    /// Largest output side in pixels; images are downscaled to fit, never upscaled. At least 1.
    pub max_side: u32,
    /// JPEG quality, 1..=100 (libjpeg scale, the same as Pillow's `quality=`).
    pub quality: u8,
}

/// Why an image could not be probed, decoded or re-encoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The input has zero bytes.
    #[error("empty input: zero bytes")]
    Empty,
    /// [`sniff`] recognised no format.
    #[error("unknown image format (first bytes: {head})")]
    UnknownFormat {
        /// Up to the first 16 bytes, hex.
        head: String,
    },
    /// The header claims more pixels than [`Limits::max_pixels`].
    #[error(
        "image is {width}x{height} = {} pixels, over the limit of {limit}; \
         raise `--max-pixels` if such images are expected",
        u64::from(*width) * u64::from(*height)
    )]
    TooLarge {
        /// Width claimed by the header.
        width: u32,
        /// Height claimed by the header.
        height: u32,
        /// The `max_pixels` limit in force.
        limit: u64,
    },
    /// The data is malformed or truncated; `reason` comes from libjpeg-turbo or the `image`
    /// crate.
    #[error("corrupt {format} image: {reason}")]
    Corrupt {
        /// The sniffed format.
        format: Format,
        /// The decoder's message.
        reason: String,
    },
    /// Valid, but a feature we do not decode (12-bit JPEG, an unusual colour type, ...).
    #[error("unsupported {format} image: {reason}")]
    Unsupported {
        /// The sniffed format.
        format: Format,
        /// What is unsupported.
        reason: String,
    },
    /// Within `max_pixels`, but the decoder needs more memory than the per-image budget.
    #[error(
        "{format} image needs more than its memory budget of {budget} bytes \
         (8 x `--max-pixels`): {reason}; raise `--max-pixels` to allow it"
    )]
    OverBudget {
        /// The sniffed format.
        format: Format,
        /// The budget in bytes.
        budget: u64,
        /// What went over.
        reason: String,
    },
    /// [`Reencode`] options out of range.
    #[error("invalid re-encode options: {0}")]
    InvalidOptions(String),
    /// A region or scale for [`Decoder::decode_region_rgb8`] out of range (a caller's bug).
    #[error("invalid decode region: {0}")]
    InvalidRegion(String),
    /// libjpeg-turbo failed outside of decoding an input: creating a handle, or encoding.
    #[error("libjpeg-turbo {op} failed: {reason}")]
    Turbo {
        /// What we were doing (`"init"`, `"compress"`).
        op: &'static str,
        /// libjpeg-turbo's message.
        reason: String,
    },
    /// The resizer rejected its arguments (a bug in our size arithmetic).
    #[error("resize from {from:?} to {to:?} failed: {reason}")]
    Resize {
        /// Source (width, height).
        from: (u32, u32),
        /// Target (width, height).
        to: (u32, u32),
        /// The resampler's message.
        reason: String,
    },
}

/// Probes, decodes and re-encodes images. One per thread: it owns a libjpeg-turbo handle and
/// scratch buffers that are reused from call to call. `Send`, not `Sync`.
pub struct Decoder {
    limits: Limits,
    /// libjpeg-turbo decompressor, reused across images.
    tj: jpeg::TjDecompressor,
    /// libjpeg-turbo compressor, created by the first re-encode.
    tjc: Option<jpeg::TjCompressor>,
    /// libjpeg-turbo transformer, created by the first [`Decoder::add_restarts`].
    tjt: Option<jpeg::TjTransformer>,
    /// Native-depth decodes, CMYK intermediates and rotation targets.
    scratch: Vec<u8>,
    /// The full-size RGB8 decode inside `reencode_jpeg`; the original's pixels inside
    /// `add_restarts`.
    rgb: Vec<u8>,
    /// The downscaled RGB8 image inside `reencode_jpeg`; the rewrite's pixels inside
    /// `add_restarts`.
    resized: Vec<u8>,
    resizer: crate::resample::Resampler,
}

impl fmt::Debug for Decoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decoder")
            .field("limits", &self.limits)
            .field("scratch_capacity", &self.scratch.capacity())
            .field("rgb_capacity", &self.rgb.capacity())
            .field("resized_capacity", &self.resized.capacity())
            .field("has_compressor", &self.tjc.is_some())
            .finish_non_exhaustive()
    }
}

impl Decoder {
    /// A decoder enforcing `limits`. Fails only if libjpeg-turbo cannot allocate a handle.
    pub fn new(limits: Limits) -> Result<Self, CodecError> {
        Ok(Decoder {
            limits,
            tj: jpeg::TjDecompressor::new(&limits)?,
            tjc: None,
            tjt: None,
            scratch: Vec::new(),
            rgb: Vec::new(),
            resized: Vec::new(),
            resizer: crate::resample::Resampler::new(),
        })
    }

    /// Sets libjpeg-turbo's speed/accuracy switches for the following JPEG decodes.
    pub fn set_jpeg_tuning(&mut self, tuning: JpegTuning) -> Result<(), CodecError> {
        self.tj.set_tuning(tuning)
    }

    /// The limits this decoder enforces.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Header only: format, size, colour, orientation, and the `max_pixels` check. Cheap: no
    /// pixel data is decoded or allocated.
    pub fn probe(&mut self, data: &[u8]) -> Result<ImageInfo, CodecError> {
        let format = detect(data)?;
        let info = match format {
            Format::Jpeg => self.tj.probe(data)?.info,
            _ => raster::probe(format, data, &self.limits)?,
        };
        self.limits.check(info.width, info.height)?;
        Ok(info)
    }

    /// Full decode to packed RGB8 (row-major, `width * height * 3` bytes) into `out`, which is
    /// resized to fit and keeps its capacity. EXIF orientation is applied, so the returned
    /// `width`/`height` are after orientation. On error `out` holds unspecified bytes.
    pub fn decode_rgb8(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<Decoded, CodecError> {
        let format = detect(data)?;
        let info = match format {
            Format::Jpeg => self.tj.decode_rgb8(data, out, &mut self.scratch)?,
            _ => raster::decode_rgb8(format, data, &self.limits, out, &mut self.scratch)?,
        };
        let (width, height) = orient::apply(info.orientation, info.width, info.height, out, &mut self.scratch);
        Ok(Decoded { info, width, height })
    }

    /// Decodes at least the rectangle `want` of the image, with the EXIF orientation applied,
    /// to packed RGB8 in `out`; see [`RegionDecoded`] for what `out` then holds.
    ///
    /// `want` is in the coordinates of the oriented image at full size (as [`Decoder::probe`]
    /// describes it, with width and height swapped for orientations 5–8) and must be non-empty
    /// and inside it. For a JPEG that libjpeg-turbo can decode by region (8-bit, lossy, a
    /// standard subsampling), only `want` is decoded, widened on one side to an iMCU boundary;
    /// `scale_denom` (1, 2, 4 or 8) then also selects DCT-domain downscaling, and the returned
    /// rectangle is in the scaled image (covering `want / scale_denom`, rounded outwards). An
    /// EXIF-oriented JPEG ignores `scale_denom`; any other image is decoded whole at full size.
    ///
    /// A sequential JPEG is read only down to the region's last row: damage below it is not
    /// seen, except truncation (the file must have an EOI marker after its scan data). A JPEG
    /// with restart markers that tile it (as `ringfeed pack` writes them) is read only in the
    /// segments that cover the region (`restart.rs`, unless [`JpegTuning::restart_cuts`] is
    /// off): damage elsewhere is not seen either.
    pub fn decode_region_rgb8(
        &mut self,
        data: &[u8],
        want: Rect,
        scale_denom: u32,
        out: &mut Vec<u8>,
    ) -> Result<RegionDecoded, CodecError> {
        let d = self.decode_region_into(data, want, scale_denom, out)?;
        out.truncate(d.rect.width as usize * d.rect.height as usize * 3);
        Ok(d)
    }

    /// [`Decoder::decode_region_rgb8`], except that `out` is only ever grown: the pixels are
    /// its first `rect.width * rect.height * 3` bytes and whatever follows is stale. A buffer
    /// reused across samples then never has bytes zeroed that the decoder overwrites anyway.
    pub fn decode_region_into(
        &mut self,
        data: &[u8],
        want: Rect,
        scale_denom: u32,
        out: &mut Vec<u8>,
    ) -> Result<RegionDecoded, CodecError> {
        let format = detect(data)?;
        let (info, header) = match format {
            Format::Jpeg => {
                let header = self.tj.probe(data)?;
                (header.info, Some(header))
            }
            _ => (raster::probe(format, data, &self.limits)?, None),
        };
        let o = info.orientation;
        let (ow, oh) = if orient::transposes(o) {
            (info.height, info.width)
        } else {
            (info.width, info.height)
        };
        if want.width == 0 || want.height == 0 || !Rect::full(ow, oh).contains(&want) {
            return Err(CodecError::InvalidRegion(format!(
                "{want:?} is not inside the {ow}x{oh} image"
            )));
        }
        if !matches!(scale_denom, 1 | 2 | 4 | 8) {
            return Err(CodecError::InvalidRegion(format!(
                "scale denominator {scale_denom}; must be 1, 2, 4 or 8"
            )));
        }
        // DCT scaling of an EXIF-oriented image would need the rounding of the scaled edges
        // mirrored too; orientation is rare, so such images are decoded at full size.
        let scale_denom = if (2..=8).contains(&o) { 1 } else { scale_denom };
        if let Some(header) = header.filter(|h| h.region_align(scale_denom).is_some()) {
            match self.jpeg_region(data, &header, want, scale_denom, out) {
                Err(CodecError::Corrupt { reason, .. }) if reason.contains("cropping region") => {
                    // libjpeg-turbo aligns regions to its own iMCU width, which for unusual
                    // sampling factors is wider than the subsampling suggests: decode it whole.
                }
                result => return result,
            }
        }
        let decoded = self.decode_rgb8(data, out)?;
        Ok(RegionDecoded {
            info: decoded.info,
            width: decoded.width,
            height: decoded.height,
            rect: Rect::full(decoded.width, decoded.height),
            scale_denom: 1,
        })
    }

    /// The region path of [`Decoder::decode_region_rgb8`] (arguments checked there).
    fn jpeg_region(
        &mut self,
        data: &[u8],
        header: &jpeg::Header,
        want: Rect,
        denom: u32,
        out: &mut Vec<u8>,
    ) -> Result<RegionDecoded, CodecError> {
        let info = header.info;
        let o = info.orientation;
        // The scaled stored image, and `want` scaled (rounded outwards) in oriented coordinates.
        let (sw, sh) = (info.width.div_ceil(denom), info.height.div_ceil(denom));
        let (osw, osh) = if orient::transposes(o) { (sh, sw) } else { (sw, sh) };
        let scale = |start: u32, len: u32, limit: u32| {
            let a = start / denom;
            let b = (start + len).div_ceil(denom).min(limit);
            (a, b.max(a + 1).min(limit) - a)
        };
        let (left, width) = scale(want.left, want.width, osw);
        let (top, height) = scale(want.top, want.height, osh);
        let oriented_want = Rect {
            left,
            top,
            width,
            height,
        };
        let stored_want = orient::rect_to_stored(o, sw, sh, oriented_want);
        let stored = self
            .tj
            .decode_region_rgb8(data, header, stored_want, denom, out, &mut self.scratch)?;
        orient::apply(o, stored.width, stored.height, out, &mut self.scratch);
        Ok(RegionDecoded {
            info,
            width: osw,
            height: osh,
            rect: orient::rect_to_oriented(o, sw, sh, stored),
            scale_denom: denom,
        })
    }

    /// Rewrites the JPEG `data` losslessly into `out` as a sequential, Huffman-coded JPEG with
    /// a restart marker every few MCUs (`jpegtran -restart N -optimize -copy all`), so that
    /// region decodes skip the Huffman decoding of everything outside the region
    /// (`restart.rs`). Progressive and arithmetic-coded JPEGs become sequential Huffman-coded
    /// ones, which also decode faster. The interval is the largest divisor of the MCUs per row
    /// up to `target_mcus` (see [`RESTART_TARGET_MCUS`]), or one MCU row when the width has no
    /// such divisor near it.
    ///
    /// The DCT coefficients are moved, not recomputed, and this is verified: both images are
    /// decoded and compared, and the rewrite is kept only if every pixel is the same.
    ///
    /// Returns the interval; or `None`, with `out` unspecified, when the rewrite does not apply
    /// or was not kept: not a JPEG, not 8-bit, lossless or an unusual subsampling, restart
    /// markers that already allow cuts, a file libjpeg-turbo does not rewrite (it refuses
    /// warnings a decode accepts), or different pixels. An error means `data` itself does not
    /// decode.
    pub fn add_restarts(
        &mut self,
        data: &[u8],
        target_mcus: u32,
        out: &mut Vec<u8>,
    ) -> Result<Option<u32>, CodecError> {
        if detect(data)? != Format::Jpeg {
            return Ok(None);
        }
        let header = self.tj.probe(data)?;
        let Some(mcu_width) = header.region_align(1) else {
            return Ok(None);
        };
        if header.layout().is_some_and(|l| restart::is_cuttable(&l)) {
            return Ok(None);
        }
        let interval = restart::choose_interval(header.info.width.div_ceil(mcu_width), target_mcus);
        let tjt = match &mut self.tjt {
            Some(tjt) => tjt,
            none => none.insert(jpeg::TjTransformer::new(&self.limits)?),
        };
        let rewritten = tjt.with_restarts(data, interval, out).is_ok();
        let (mut before, mut after) = (std::mem::take(&mut self.rgb), std::mem::take(&mut self.resized));
        let original = self.decode_rgb8(data, &mut before);
        let same = rewritten
            && original.is_ok()
            && self.decode_rgb8(out, &mut after).is_ok_and(|d| {
                original
                    .as_ref()
                    .is_ok_and(|o| (o.width, o.height) == (d.width, d.height))
            })
            && before == after;
        (self.rgb, self.resized) = (before, after);
        original?;
        Ok(same.then_some(interval))
    }

    /// Decodes, downscales (never upscales) so that `max(width, height) <= max_side` with an
    /// antialiased bilinear filter ([`crate::resample`]), and encodes a
    /// baseline 4:2:0 JPEG at `quality` with libjpeg-turbo into `out`. The returned size is the
    /// size of the encoded JPEG.
    ///
    /// Deterministic: the same input and options give identical bytes on any `Decoder` and any
    /// thread of the same machine.
    pub fn reencode_jpeg(&mut self, data: &[u8], opts: &Reencode, out: &mut Vec<u8>) -> Result<Decoded, CodecError> {
        if opts.max_side == 0 {
            return Err(CodecError::InvalidOptions("max_side must be at least 1".into()));
        }
        if !(1..=100).contains(&opts.quality) {
            return Err(CodecError::InvalidOptions(format!(
                "quality must be in 1..=100, got {}",
                opts.quality
            )));
        }
        let mut rgb = std::mem::take(&mut self.rgb);
        let result = self.reencode_inner(data, opts, &mut rgb, out);
        self.rgb = rgb;
        result
    }

    fn reencode_inner(
        &mut self,
        data: &[u8],
        opts: &Reencode,
        rgb: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<Decoded, CodecError> {
        let decoded = self.decode_rgb8(data, rgb)?;
        let (src_w, src_h) = (decoded.width, decoded.height);
        let (width, height) = resize::fit(src_w, src_h, opts.max_side);
        let pixels: &[u8] = if (width, height) == (src_w, src_h) {
            rgb
        } else {
            resize::bilinear(
                &mut self.resizer,
                rgb,
                (src_w, src_h),
                &mut self.resized,
                (width, height),
            )?;
            &self.resized
        };
        let tjc = match &mut self.tjc {
            Some(tjc) => tjc,
            none => none.insert(jpeg::TjCompressor::new()?),
        };
        tjc.compress_rgb8(pixels, width, height, opts.quality, out)?;
        Ok(Decoded {
            info: decoded.info,
            width,
            height,
        })
    }
}

/// Sniffs `data`, turning "no format" into the right error.
fn detect(data: &[u8]) -> Result<Format, CodecError> {
    if data.is_empty() {
        return Err(CodecError::Empty);
    }
    sniff(data).ok_or_else(|| CodecError::UnknownFormat { head: hex_head(data) })
}

/// The first (up to) 16 bytes of `data` as lowercase hex, space-separated.
fn hex_head(data: &[u8]) -> String {
    let head = &data[..data.len().min(16)];
    let mut s = String::with_capacity(head.len() * 3);
    for (i, b) in head.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_unknown() {
        let mut d = Decoder::new(Limits::default()).unwrap();
        assert!(matches!(d.probe(&[]), Err(CodecError::Empty)));
        match d.probe(b"hello world, not an image") {
            Err(CodecError::UnknownFormat { head }) => {
                assert_eq!(head, "68 65 6c 6c 6f 20 77 6f 72 6c 64 2c 20 6e 6f 74")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn too_large_message_names_the_flag() {
        let e = CodecError::TooLarge {
            width: 100_000,
            height: 100_000,
            limit: DEFAULT_MAX_PIXELS,
        };
        let msg = e.to_string();
        assert!(msg.contains("100000x100000 = 10000000000 pixels"), "{msg}");
        assert!(msg.contains("--max-pixels"), "{msg}");
    }

    #[test]
    fn reencode_options_are_validated() {
        let mut d = Decoder::new(Limits::default()).unwrap();
        let mut out = Vec::new();
        let bad = [
            Reencode {
                max_side: 0,
                quality: 90,
            },
            Reencode {
                max_side: 10,
                quality: 0,
            },
        ];
        for opts in bad {
            assert!(matches!(
                d.reencode_jpeg(b"\xff\xd8\xff", &opts, &mut out),
                Err(CodecError::InvalidOptions(_))
            ));
        }
        let opts = Reencode {
            max_side: 10,
            quality: 101,
        };
        assert!(d.reencode_jpeg(b"x", &opts, &mut out).is_err());
    }

    #[test]
    fn decoder_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<Decoder>();
    }
}
