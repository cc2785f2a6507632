//! JPEG through libjpeg-turbo, using the raw TurboJPEG 3 API (`turbojpeg::raw`), because the
//! safe wrapper cannot set `TJPARAM_STOPONWARNING`, the memory/pixel/scan limits, or hand us a
//! handle to reuse with our own buffers.
//!
//! # Invariants
//! - Between calls, the decompressor's handle has no scaling factor and no cropping region set,
//!   so `tj3Decompress8` writes exactly `width * height * pixel_size` bytes for the header it
//!   parses. A region decode (`decode_region_rgb8`) sets both right before its
//!   `tj3Decompress8` call and resets both right after it, on every path (or replaces the
//!   handle when the reset fails).
//! - `tj3Decompress8` re-parses the header from the same bytes that `tj3DecompressHeader`
//!   parsed, so the buffer sized from our probe is the buffer it fills.
//! - Warnings stop the decode (`TJPARAM_STOPONWARNING = 1`). Without it, libjpeg-turbo finishes
//!   a truncated image by padding it with grey and only flags a warning afterwards. The one
//!   exception is a warning that loses no pixel (stray bytes before a marker, see
//!   `is_benign_warning`): such an image is decoded again without stopping, and accepted only if
//!   its last warning is benign too.
//! - A stream that is not self-contained (see `markers.rs`) is decoded on a fresh handle, so
//!   tables left behind by earlier images never change its pixels; and a handle that reported
//!   an error is replaced, so a broken image never affects the next one.
//! - The compressor writes into our `Vec` with `TJPARAM_NOREALLOC = 1` and a buffer of
//!   `tj3JPEGBufSize` bytes, so libjpeg-turbo never reallocates or frees Rust memory.

use std::ffi::{CStr, c_int, c_void};
use std::ptr::NonNull;

use turbojpeg::raw;

use super::markers::{self, JpegMarkers};
use super::restart;
use super::{CodecError, ColorKind, Format, ImageInfo, JpegTuning, Limits, Rect};

/// Progressive scans allowed per image (libjpeg-turbo's own recommended `TJFLAG_LIMITSCANS`
/// value). Real encoders write about 10; thousands of scans are a known CPU exhaustion attack.
const SCAN_LIMIT: c_int = 500;

/// iMCU width in pixels for each `TJSAMP_*` (libjpeg-turbo's `tjMCUWidth`, a `static` in
/// `turbojpeg.h` that the bindings do not export): 4:4:4, 4:2:2, 4:2:0, grey, 4:4:0, 4:1:1,
/// 4:4:1. A region's left edge must be a multiple of it (scaled).
const MCU_WIDTH: [u32; 7] = [8, 16, 16, 8, 8, 32, 8];

/// An owned `tjhandle`.
#[derive(Debug)]
struct Handle(NonNull<c_void>);

// SAFETY: a TurboJPEG instance holds no thread-local or thread-affine state; it may be used
// from any thread as long as it is not used from two at once, which `&mut self` on every use
// guarantees. `Handle` is deliberately not `Sync`.
unsafe impl Send for Handle {}

impl Handle {
    fn new(init: raw::TJINIT) -> Result<Self, CodecError> {
        // SAFETY: tj3Init has no preconditions; it returns NULL on failure.
        let ptr = unsafe { raw::tj3Init(init as c_int) };
        match NonNull::new(ptr) {
            Some(ptr) => Ok(Handle(ptr)),
            None => {
                // SAFETY: tj3GetErrorStr(NULL) returns the global error string: a valid,
                // NUL-terminated, static buffer.
                let reason = unsafe { c_message(raw::tj3GetErrorStr(ptr)) };
                Err(CodecError::Turbo { op: "init", reason })
            }
        }
    }

    fn ptr(&self) -> raw::tjhandle {
        self.0.as_ptr()
    }

    fn set(&mut self, param: raw::TJPARAM, value: c_int) -> Result<(), CodecError> {
        // SAFETY: the handle is valid for our lifetime; tj3Set validates param and value.
        let rc = unsafe { raw::tj3Set(self.ptr(), param as c_int, value) };
        if rc != 0 {
            return Err(CodecError::Turbo {
                op: "init",
                reason: self.error(),
            });
        }
        Ok(())
    }

    fn get(&self, param: raw::TJPARAM) -> c_int {
        // SAFETY: the handle is valid; tj3Get returns -1 for an unknown parameter.
        unsafe { raw::tj3Get(self.ptr(), param as c_int) }
    }

    /// Whether the last error on this handle was only a warning (`TJERR_WARNING`).
    fn is_warning(&self) -> bool {
        // SAFETY: the handle is valid; tj3GetErrorCode only reads its state.
        let code = unsafe { raw::tj3GetErrorCode(self.ptr()) };
        code == raw::TJERR_TJERR_WARNING as c_int
    }

    /// The message of the last error on this handle.
    fn error(&self) -> String {
        // SAFETY: the handle is valid; the returned string lives in the instance and is
        // NUL-terminated; we copy it out before anything else touches the handle.
        unsafe { c_message(raw::tj3GetErrorStr(self.ptr())) }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the pointer came from tj3Init and is destroyed exactly once, here.
        unsafe { raw::tj3Destroy(self.ptr()) }
    }
}

/// Copies a C error string.
///
/// # Safety
/// `s` must be NULL or point to a NUL-terminated string valid for the duration of the call.
unsafe fn c_message(s: *const std::ffi::c_char) -> String {
    if s.is_null() {
        return "unknown error".into();
    }
    // SAFETY: forwarded from the caller.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().trim_end().to_owned()
}

/// What a JPEG header says, beyond [`ImageInfo`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Header {
    pub(super) info: ImageInfo,
    /// `TJCS_*`.
    colorspace: c_int,
    /// Bits per sample, 2..=16.
    precision: c_int,
    /// `TJSAMP_*`, -1 when unusual.
    subsamp: c_int,
    /// A lossless (SOF3) JPEG.
    lossless: bool,
    markers: JpegMarkers,
}

impl Header {
    /// The MCU grid and restart interval, for a sequential single-scan Huffman-coded image
    /// (see `markers.rs`).
    pub(super) fn layout(&self) -> Option<markers::RestartLayout> {
        self.markers.layout
    }

    /// The iMCU width a region's left edge must be aligned to at scale `1/denom`, or `None`
    /// when libjpeg-turbo cannot decode a region of this image (lossless, not 8-bit, or an
    /// unusual subsampling).
    pub(super) fn region_align(&self, denom: u32) -> Option<u32> {
        if self.precision != 8 || self.lossless {
            return None;
        }
        let mcu = *MCU_WIDTH.get(usize::try_from(self.subsamp).ok()?)?;
        Some(mcu.div_ceil(denom))
    }
}

/// How `tj3Decompress8` is to be called: whole image, or a region at a scale.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    /// Scaling denominator: 1, 2, 4 or 8.
    denom: u32,
    /// The region, in scaled coordinates; its left edge is iMCU-aligned.
    region: Rect,
}

/// A libjpeg-turbo decompressor configured with our limits.
#[derive(Debug)]
pub(super) struct TjDecompressor {
    handle: Handle,
    limits: Limits,
    tuning: JpegTuning,
    /// A region's segments cut out as a JPEG of their own (`restart.rs`); capacity kept.
    cut: Vec<u8>,
    /// Scratch for the restart markers' offsets; capacity kept.
    marks: Vec<usize>,
}

impl TjDecompressor {
    pub(super) fn new(limits: &Limits) -> Result<Self, CodecError> {
        let tuning = JpegTuning::default();
        let handle = Self::configured(limits, tuning)?;
        Ok(TjDecompressor {
            handle,
            limits: *limits,
            tuning,
            cut: Vec::new(),
            marks: Vec::new(),
        })
    }

    /// Changes the speed/accuracy switches for the following images.
    pub(super) fn set_tuning(&mut self, tuning: JpegTuning) -> Result<(), CodecError> {
        if tuning != self.tuning {
            self.tuning = tuning;
            self.reset()?;
        }
        Ok(())
    }

    /// `TJPARAM_MAXMEMORY` in MiB: 8 bytes per pixel covers a 4-component 4:4:4 progressive
    /// coefficient buffer; the extra 64 MiB absorbs the padding of partial MCUs at the edges.
    fn max_memory_mib(limits: &Limits) -> c_int {
        c_int::try_from(limits.budget_bytes() / (1 << 20) + 64).unwrap_or(c_int::MAX)
    }

    fn configured(limits: &Limits, tuning: JpegTuning) -> Result<Handle, CodecError> {
        let mut h = Handle::new(raw::TJINIT_TJINIT_DECOMPRESS)?;
        h.set(raw::TJPARAM_TJPARAM_FASTUPSAMPLE, c_int::from(tuning.fast_upsample))?;
        h.set(raw::TJPARAM_TJPARAM_FASTDCT, c_int::from(tuning.fast_dct))?;
        h.set(raw::TJPARAM_TJPARAM_STOPONWARNING, 1)?;
        // Our own check runs first (from the header, with a better message); this is the
        // second line of defence inside libjpeg-turbo. 0 (off) where the limit does not fit
        // its `int`; ours still applies.
        let max_pixels = c_int::try_from(limits.max_pixels).unwrap_or(0);
        h.set(raw::TJPARAM_TJPARAM_MAXPIXELS, max_pixels)?;
        h.set(raw::TJPARAM_TJPARAM_MAXMEMORY, Self::max_memory_mib(limits))?;
        h.set(raw::TJPARAM_TJPARAM_SCANLIMIT, SCAN_LIMIT)?;
        Ok(h)
    }

    /// Replaces the handle with a fresh one, dropping every table earlier images defined.
    fn reset(&mut self) -> Result<(), CodecError> {
        self.handle = Self::configured(&self.limits, self.tuning)?;
        Ok(())
    }

    /// The error libjpeg-turbo just reported, after which the handle is replaced: a failed
    /// `tj3DecompressHeader` returns without aborting the decompressor, which then reads the
    /// next image as the continuation of the broken header ("two SOI markers").
    fn fail(&mut self) -> CodecError {
        let reason = self.handle.error();
        // If even a fresh handle cannot be made, the next call reports that.
        let _ = self.reset();
        // libjpeg's memory manager messages ("Insufficient memory (case N)") come from
        // `TJPARAM_MAXMEMORY`, not from a broken file.
        if reason.contains("Insufficient memory") {
            let budget = u64::try_from(Self::max_memory_mib(&self.limits)).unwrap_or(0) << 20;
            return CodecError::OverBudget {
                format: Format::Jpeg,
                budget,
                reason,
            };
        }
        CodecError::Corrupt {
            format: Format::Jpeg,
            reason,
        }
    }

    /// Parses the header (no pixel data) and checks the pixel limit.
    pub(super) fn probe(&mut self, data: &[u8]) -> Result<Header, CodecError> {
        let markers = markers::walk(data);
        let len = raw::size_t::try_from(data.len()).map_err(|_| CodecError::Corrupt {
            format: Format::Jpeg,
            reason: "input too long".into(),
        })?;
        // SAFETY: the handle is valid; `data` is readable for `len` bytes, and libjpeg-turbo
        // only reads it during this call.
        let rc = unsafe { raw::tj3DecompressHeader(self.handle.ptr(), data.as_ptr(), len) };
        if rc != 0 {
            return Err(self.fail());
        }
        if !markers.has_frame {
            // A tables-only stream: libjpeg-turbo reports success and leaves the previous
            // image's size in the handle.
            return Err(CodecError::Corrupt {
                format: Format::Jpeg,
                reason: "no frame header (SOF) before the first scan: not an image".into(),
            });
        }
        let h = &self.handle;
        let (width, height) = (
            h.get(raw::TJPARAM_TJPARAM_JPEGWIDTH),
            h.get(raw::TJPARAM_TJPARAM_JPEGHEIGHT),
        );
        let (Ok(width), Ok(height)) = (u32::try_from(width), u32::try_from(height)) else {
            return Err(CodecError::Corrupt {
                format: Format::Jpeg,
                reason: format!("invalid size {width}x{height}"),
            });
        };
        if width == 0 || height == 0 {
            return Err(CodecError::Corrupt {
                format: Format::Jpeg,
                reason: format!("invalid size {width}x{height}"),
            });
        }
        let colorspace = h.get(raw::TJPARAM_TJPARAM_COLORSPACE);
        let precision = h.get(raw::TJPARAM_TJPARAM_PRECISION);
        let subsamp = h.get(raw::TJPARAM_TJPARAM_SUBSAMP);
        let lossless = h.get(raw::TJPARAM_TJPARAM_LOSSLESS) == 1;
        let color = match u32::try_from(colorspace) {
            Ok(raw::TJCS_TJCS_GRAY) => ColorKind::Gray,
            Ok(raw::TJCS_TJCS_RGB | raw::TJCS_TJCS_YCbCr) => ColorKind::Rgb,
            Ok(raw::TJCS_TJCS_CMYK) => ColorKind::Cmyk,
            Ok(raw::TJCS_TJCS_YCCK) => ColorKind::Ycck,
            _ => ColorKind::Other,
        };
        let info = ImageInfo {
            format: Format::Jpeg,
            width,
            height,
            color,
            bits_per_channel: u8::try_from(precision).unwrap_or(0),
            orientation: markers.orientation,
            progressive: h.get(raw::TJPARAM_TJPARAM_PROGRESSIVE) == 1,
        };
        self.limits.check(width, height)?;
        Ok(Header {
            info,
            colorspace,
            precision,
            subsamp,
            lossless,
            markers,
        })
    }

    /// Decodes to packed RGB8 in `out` (stored orientation), using `scratch` for CMYK.
    pub(super) fn decode_rgb8(
        &mut self,
        data: &[u8],
        out: &mut Vec<u8>,
        scratch: &mut Vec<u8>,
    ) -> Result<ImageInfo, CodecError> {
        let header = self.probe(data)?;
        let info = header.info;
        if header.precision != 8 {
            return Err(CodecError::Unsupported {
                format: Format::Jpeg,
                reason: format!("{}-bit samples (only 8-bit JPEG is decoded)", header.precision),
            });
        }
        if !header.markers.self_contained {
            self.reset()?;
        }
        // JPEG sides are at most 65535, so this and `* 4` cannot overflow a 64-bit usize.
        let pixels = info.width as usize * info.height as usize;
        self.decode_pixels(data, header.colorspace, pixels, None, out, scratch)?;
        out.truncate(pixels * 3);
        Ok(info)
    }

    /// Decodes `pixels` pixels (the whole image, or `geometry`'s region) to packed RGB8 in `out`.
    fn decode_pixels(
        &mut self,
        data: &[u8],
        colorspace: c_int,
        pixels: usize,
        geometry: Option<Geometry>,
        out: &mut Vec<u8>,
        scratch: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        let four_channel = matches!(u32::try_from(colorspace), Ok(raw::TJCS_TJCS_CMYK | raw::TJCS_TJCS_YCCK));
        // Grow only: `resize` would zero every byte between the old and the new length, which
        // for a per-thread buffer that holds regions of varying size is a memset per sample
        // (measured: 1.6 % of the instructions of a RandomResizedCrop). Callers that promise an
        // exact length truncate afterwards, which costs nothing.
        let need = pixels * 3;
        if out.len() < need {
            out.resize(need, 0);
        }
        if four_channel {
            // libjpeg-turbo cannot convert CMYK/YCCK to RGB itself; it gives us the stored
            // (YCCK → CMYK converted) samples and we do what Pillow does.
            if scratch.len() < pixels * 4 {
                scratch.resize(pixels * 4, 0);
            }
            self.decompress(data, scratch, raw::TJPF_TJPF_CMYK, pixels * 4, geometry)?;
            cmyk_to_rgb(&scratch[..pixels * 4], &mut out[..need]);
        } else {
            self.decompress(data, &mut out[..need], raw::TJPF_TJPF_RGB, need, geometry)?;
        }
        Ok(())
    }

    /// Decodes a region of the image `header` describes (just probed from `data`) at scale
    /// `1/denom` to packed RGB8 in the first `width * height * 3` bytes of `out` (stored
    /// orientation; `out` may be longer), using `scratch` for CMYK.
    ///
    /// `want` is in the scaled image's coordinates and must lie inside it; `denom` must be one
    /// of 1, 2, 4, 8 and `header.region_align(denom)` must be `Some`. The decoded region is
    /// returned: `want` with its left edge moved down to the iMCU boundary.
    ///
    /// A sequential JPEG is decoded only down to the region's last row; its rows below are
    /// never read. So that a truncated file fails as it does on a full decode, the file must
    /// then have an EOI marker after its scan data (a truncated file has none). Other damage
    /// below the region goes unnoticed.
    pub(super) fn decode_region_rgb8(
        &mut self,
        data: &[u8],
        header: &Header,
        want: Rect,
        denom: u32,
        out: &mut Vec<u8>,
        scratch: &mut Vec<u8>,
    ) -> Result<Rect, CodecError> {
        let invalid = |what: &str| CodecError::InvalidRegion(format!("{what}: {want:?} at 1/{denom}"));
        let Some(align) = header.region_align(denom) else {
            return Err(invalid("this JPEG cannot be decoded by region"));
        };
        if !matches!(denom, 1 | 2 | 4 | 8) {
            return Err(invalid("scale denominator must be 1, 2, 4 or 8"));
        }
        let info = header.info;
        let (sw, sh) = (info.width.div_ceil(denom), info.height.div_ceil(denom));
        let (right, bottom) = (
            u64::from(want.left) + u64::from(want.width),
            u64::from(want.top) + u64::from(want.height),
        );
        if want.width == 0 || want.height == 0 || right > u64::from(sw) || bottom > u64::from(sh) {
            return Err(invalid(&format!("region outside the {sw}x{sh} scaled image")));
        }
        let left = want.left / align * align;
        let region = Rect {
            left,
            top: want.top,
            width: want.left + want.width - left,
            height: want.height,
        };
        // Searched from the end, where it normally is: asked at most once per sample.
        let ends_with_eoi = has_eoi(data, header.markers.scan_data);
        if !info.progressive && region.top + region.height < sh && !ends_with_eoi {
            return Err(CodecError::Corrupt {
                format: Format::Jpeg,
                reason: "premature end of JPEG file (no EOI marker after the scan data)".into(),
            });
        }
        if !header.markers.self_contained {
            self.reset()?;
        }
        let pixels = region.width as usize * region.height as usize;
        // A cut reads only the region's segments, so truncation anywhere would go unseen: only
        // a file that ends with EOI is cut (a truncated one takes the path below and fails as
        // it always did).
        let cuttable = header
            .markers
            .layout
            .filter(|l| l.interval > 0 && self.tuning.restart_cuts && ends_with_eoi);
        if let Some(layout) = cuttable {
            // The region in full-size pixels, clipped to the image.
            let full = Rect {
                left: region.left * denom,
                top: region.top * denom,
                width: ((region.left + region.width) * denom).min(info.width) - region.left * denom,
                height: ((region.top + region.height) * denom).min(info.height) - region.top * denom,
            };
            let mut cut = std::mem::take(&mut self.cut);
            let made = restart::cut(data, header.markers.scan_data, &layout, full, &mut cut, &mut self.marks);
            let result = made.map(|c| {
                // Whole MCUs, and MCU sides are multiples of every denominator: exact.
                let (dx, dy) = (c.left / denom, c.top / denom);
                let (cw, ch) = (c.width.div_ceil(denom), c.height.div_ceil(denom));
                let inner = Rect {
                    left: region.left - dx,
                    top: region.top - dy,
                    ..region
                };
                let geometry = (inner != Rect::full(cw, ch) || denom != 1).then_some(Geometry { denom, region: inner });
                self.decode_pixels(&cut, header.colorspace, pixels, geometry, out, scratch)
            });
            self.cut = cut;
            if let Some(decoded) = result {
                decoded?;
                return Ok(region);
            }
        }
        // The whole image at full size is an ordinary decode (no header re-read, no region).
        let geometry = (region != Rect::full(sw, sh) || denom != 1).then_some(Geometry { denom, region });
        self.decode_pixels(data, header.colorspace, pixels, geometry, out, scratch)?;
        Ok(region)
    }

    /// `tj3Decompress8` into `buf`, which must hold `need` bytes: the full image of the header
    /// just probed from `data` in `format`, or with `geometry` the region at its scale.
    fn decompress(
        &mut self,
        data: &[u8],
        buf: &mut [u8],
        format: raw::TJPF,
        need: usize,
        geometry: Option<Geometry>,
    ) -> Result<(), CodecError> {
        if buf.len() < need {
            return Err(CodecError::Corrupt {
                format: Format::Jpeg,
                reason: "internal: output buffer too small".into(),
            });
        }
        if self.decompress_raw(data, buf, format, geometry) == 0 {
            return Ok(());
        }
        if !(self.handle.is_warning() && is_benign_warning(&self.handle.error())) {
            return Err(self.fail());
        }
        // Only a benign warning so far: decode again on a fresh handle that does not stop on
        // warnings, and accept the result only if its last warning is benign too
        // (libjpeg-turbo reports the last one; truncation is reported at the very end, so a
        // truncated file that also has stray bytes is still refused).
        self.reset()?;
        self.handle.set(raw::TJPARAM_TJPARAM_STOPONWARNING, 0)?;
        let rc = self.decompress_raw(data, buf, format, geometry);
        if rc != 0 && !(self.handle.is_warning() && is_benign_warning(&self.handle.error())) {
            return Err(self.fail());
        }
        // Back to a handle that stops on warnings, for the next image.
        self.reset()?;
        Ok(())
    }

    /// One `tj3Decompress8` call; returns its status. `buf` must hold the full image, or the
    /// region of `geometry` (checked by `decompress`, the only caller).
    ///
    /// With a geometry, the header is read again (libjpeg-turbo checks a cropping region against
    /// it), the scaling factor and cropping region are set, and both are reset after the call.
    fn decompress_raw(&mut self, data: &[u8], buf: &mut [u8], format: raw::TJPF, geometry: Option<Geometry>) -> c_int {
        let len = data.len() as raw::size_t; // checked in probe
        if let Some(g) = geometry {
            let rc = self.arm(data, g);
            if rc != 0 {
                self.disarm();
                return rc;
            }
        }
        // SAFETY: the handle is valid. `data` is readable for `len` bytes. `buf` is writable for
        // width * height * pixel size bytes of the header libjpeg-turbo parses again from these
        // same bytes, or with a geometry of the region it sets (checked by `decompress`; the
        // module invariants say no other scaling or cropping is set); pitch 0 means rows are
        // packed at the (cropped) output width.
        let rc = unsafe {
            raw::tj3Decompress8(
                self.handle.ptr(),
                data.as_ptr(),
                len,
                buf.as_mut_ptr(),
                0,
                format as c_int,
            )
        };
        if geometry.is_some() {
            self.disarm();
        }
        rc
    }

    /// Reads the header of `data` and sets the scaling factor and cropping region of `g`.
    /// Returns 0, or -1 with the error in the handle.
    fn arm(&mut self, data: &[u8], g: Geometry) -> c_int {
        let h = self.handle.ptr();
        let (Ok(denom), Ok(x), Ok(y), Ok(w), Ok(hh)) = (
            c_int::try_from(g.denom),
            c_int::try_from(g.region.left),
            c_int::try_from(g.region.top),
            c_int::try_from(g.region.width),
            c_int::try_from(g.region.height),
        ) else {
            return -1;
        };
        // SAFETY: the handle is valid; `data` is readable for its length during the call.
        let rc = unsafe { raw::tj3DecompressHeader(h, data.as_ptr(), data.len() as raw::size_t) };
        if rc != 0 {
            return rc;
        }
        let factor = raw::tjscalingfactor { num: 1, denom };
        // SAFETY: the handle is valid; the factor is validated by libjpeg-turbo.
        let rc = unsafe { raw::tj3SetScalingFactor(h, factor) };
        if rc != 0 {
            return rc;
        }
        let region = raw::tjregion { x, y, w, h: hh };
        // SAFETY: the handle is valid and has read the header; the region is validated by
        // libjpeg-turbo against the scaled image.
        unsafe { raw::tj3SetCroppingRegion(h, region) }
    }

    /// Resets the scaling factor and cropping region (module invariant); replaces the handle if
    /// that fails.
    fn disarm(&mut self) {
        let h = self.handle.ptr();
        let unscaled = raw::tjscalingfactor { num: 1, denom: 1 };
        let uncropped = raw::tjregion { x: 0, y: 0, w: 0, h: 0 };
        // SAFETY: the handle is valid; 1/1 and the all-zero region are always accepted, and
        // neither call touches the error state on success.
        let ok = unsafe { raw::tj3SetScalingFactor(h, unscaled) == 0 && raw::tj3SetCroppingRegion(h, uncropped) == 0 };
        if !ok {
            // If even a fresh handle cannot be made, the next call reports that.
            let _ = self.reset();
        }
    }
}

/// Whether `data` has an EOI marker (`FF D9`) at or after `from`, the start of the first
/// scan's entropy-coded data. Inside entropy-coded data `FF` is only ever followed by `00` or
/// a restart marker, so an `FF D9` there is the end of the image. Searched from the end, where
/// it normally is. `from` is 0 when the marker walk did not reach the scan: then any `FF D9`
/// after SOI counts (a weaker check, which never refuses a complete file).
fn has_eoi(data: &[u8], from: usize) -> bool {
    data.get(from.max(2)..)
        .is_some_and(|tail| tail.windows(2).rev().any(|w| w == [0xFF, 0xD9]))
}

/// libjpeg warnings that leave every pixel decoded: stray bytes between segments
/// (`JWRN_EXTRANEOUS_DATA`), which real datasets contain (some ImageNet files do) and which
/// Pillow accepts silently. Every other warning (a premature end, a bad Huffman code, a
/// resync) means missing or guessed pixels and stays an error.
fn is_benign_warning(message: &str) -> bool {
    message.contains("extraneous bytes before marker")
}

/// CMYK as libjpeg hands it over (for YCCK: after its YCC → RGB step) to RGB, exactly as
/// Pillow's `Image.open(f).convert("RGB")` does.
///
/// Pillow reads every 4-channel JPEG with raw mode `CMYK;I` ("assume adobe conventions",
/// JpegImagePlugin.py), i.e. it inverts the stored samples: `C = 255 - c_stored`. Its
/// `cmyk2rgb` (Convert.c) is `R = (255 - K) - MULDIV255(C, 255 - K)`. Substituting gives
/// `R = k - MULDIV255(255 - c, k)` on the stored samples, which equals the exactly rounded
/// `c * k / 255` (255 is odd, so there are no ties).
///
/// Verified against Pillow 13.0.0 (which bundles libjpeg-turbo 3.2): the formula over all
/// 65,536 (C, K) pairs of `Image.fromarray(.., "CMYK").convert("RGB")`, and end to end on
/// libjpeg-turbo-encoded CMYK and YCCK JPEGs (with Adobe APP14 markers), where Pillow's
/// `convert("RGB")` and this function gave bit-identical images. The unit test below pins the
/// formula; the integration tests check the round trip without Python.
fn cmyk_to_rgb(cmyk: &[u8], rgb: &mut [u8]) {
    for (px, out) in cmyk.chunks_exact(4).zip(rgb.chunks_exact_mut(3)) {
        let k = u32::from(px[3]);
        for i in 0..3 {
            out[i] = mul_div255(u32::from(px[i]), k);
        }
    }
}

/// `round(a * b / 255)` for `a, b <= 255`, Pillow's MULDIV255.
#[inline]
fn mul_div255(a: u32, b: u32) -> u8 {
    let t = a * b + 128;
    (((t >> 8) + t) >> 8) as u8
}

/// Lossless JPEG → JPEG transcoding with libjpeg-turbo's `tj3Transform` (what `jpegtran
/// -restart N -optimize -copy all` does): the DCT coefficients move unchanged; only the entropy
/// coding is redone, as one sequential Huffman-coded scan with restart markers every `interval`
/// MCUs and Huffman tables optimised for the image. Every marker (EXIF, ICC, COM) is copied.
#[derive(Debug)]
pub(super) struct TjTransformer {
    handle: Handle,
    limits: Limits,
}

impl TjTransformer {
    pub(super) fn new(limits: &Limits) -> Result<Self, CodecError> {
        Ok(TjTransformer {
            handle: Self::configured(limits)?,
            limits: *limits,
        })
    }

    fn configured(limits: &Limits) -> Result<Handle, CodecError> {
        let mut h = Handle::new(raw::TJINIT_TJINIT_TRANSFORM)?;
        h.set(raw::TJPARAM_TJPARAM_STOPONWARNING, 1)?;
        h.set(
            raw::TJPARAM_TJPARAM_MAXPIXELS,
            c_int::try_from(limits.max_pixels).unwrap_or(0),
        )?;
        h.set(raw::TJPARAM_TJPARAM_MAXMEMORY, TjDecompressor::max_memory_mib(limits))?;
        h.set(raw::TJPARAM_TJPARAM_SCANLIMIT, SCAN_LIMIT)?;
        h.set(raw::TJPARAM_TJPARAM_OPTIMIZE, 1)?;
        h.set(raw::TJPARAM_TJPARAM_SAVEMARKERS, 2)?;
        Ok(h)
    }

    /// Writes `data` again into `out` (replacing its contents) with a restart marker every
    /// `interval` MCUs. On error the handle is replaced, so the next file starts clean.
    pub(super) fn with_restarts(&mut self, data: &[u8], interval: u32, out: &mut Vec<u8>) -> Result<(), CodecError> {
        let fail = |this: &mut Self| {
            let reason = this.handle.error();
            // If even a fresh handle cannot be made, the next call reports that.
            if let Ok(fresh) = Self::configured(&this.limits) {
                this.handle = fresh;
            }
            CodecError::Corrupt {
                format: Format::Jpeg,
                reason,
            }
        };
        let interval = c_int::try_from(interval).map_err(|_| CodecError::InvalidOptions("restart interval".into()))?;
        self.handle.set(raw::TJPARAM_TJPARAM_RESTARTBLOCKS, interval)?;
        let len = raw::size_t::try_from(data.len()).map_err(|_| CodecError::Corrupt {
            format: Format::Jpeg,
            reason: "input too long".into(),
        })?;
        // SAFETY: the handle is valid; `data` is readable for `len` bytes during the call.
        if unsafe { raw::tj3DecompressHeader(self.handle.ptr(), data.as_ptr(), len) } != 0 {
            return Err(fail(self));
        }
        // Sequential and Huffman-coded whatever the input was: the header just read set both
        // parameters to the input's coding, and a transform keeps them unless told otherwise.
        self.handle.set(raw::TJPARAM_TJPARAM_PROGRESSIVE, 0)?;
        self.handle.set(raw::TJPARAM_TJPARAM_ARITHMETIC, 0)?;
        let transform = raw::tjtransform {
            r: raw::tjregion { x: 0, y: 0, w: 0, h: 0 },
            op: raw::TJXOP_TJXOP_NONE as c_int,
            options: 0,
            data: std::ptr::null_mut(),
            customFilter: None,
        };
        let mut dst: *mut u8 = std::ptr::null_mut();
        let mut size: raw::size_t = 0;
        // SAFETY: the handle is valid; `data` is readable for `len` bytes; one transform is
        // passed with one output pointer and size, NULL so that libjpeg-turbo allocates the
        // output (freed below with tj3Free on every path).
        let rc = unsafe {
            raw::tj3Transform(
                self.handle.ptr(),
                data.as_ptr(),
                len,
                1,
                &mut dst,
                &mut size,
                &transform,
            )
        };
        let result = if rc == 0 && !dst.is_null() {
            let written = usize::try_from(size).unwrap_or(0);
            // SAFETY: on success `dst` points to `size` initialised bytes owned by libjpeg-turbo.
            let bytes = unsafe { std::slice::from_raw_parts(dst, written) };
            out.clear();
            out.extend_from_slice(bytes);
            Ok(())
        } else {
            Err(fail(self))
        };
        if !dst.is_null() {
            // SAFETY: `dst` came from libjpeg-turbo's allocator and is freed exactly once.
            unsafe { raw::tj3Free(dst.cast()) };
        }
        result
    }
}

/// A libjpeg-turbo compressor writing baseline 4:2:0 JPEGs.
#[derive(Debug)]
pub(super) struct TjCompressor {
    handle: Handle,
}

impl TjCompressor {
    pub(super) fn new() -> Result<Self, CodecError> {
        let mut h = Handle::new(raw::TJINIT_TJINIT_COMPRESS)?;
        h.set(raw::TJPARAM_TJPARAM_SUBSAMP, raw::TJSAMP_TJSAMP_420 as c_int)?;
        // Baseline, standard Huffman tables (like Pillow's default `save(quality=q)`).
        h.set(raw::TJPARAM_TJPARAM_PROGRESSIVE, 0)?;
        h.set(raw::TJPARAM_TJPARAM_ARITHMETIC, 0)?;
        h.set(raw::TJPARAM_TJPARAM_OPTIMIZE, 0)?;
        h.set(raw::TJPARAM_TJPARAM_NOREALLOC, 1)?;
        Ok(TjCompressor { handle: h })
    }

    /// Encodes packed RGB8 `pixels` (`width * height * 3` bytes) into `out` (replacing its
    /// contents).
    pub(super) fn compress_rgb8(
        &mut self,
        pixels: &[u8],
        width: u32,
        height: u32,
        quality: u8,
        out: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        let fail = |reason: String| CodecError::Turbo { op: "compress", reason };
        let (Ok(w), Ok(h)) = (c_int::try_from(width), c_int::try_from(height)) else {
            return Err(fail(format!("size {width}x{height} out of range")));
        };
        if pixels.len() < width as usize * height as usize * 3 {
            return Err(fail("internal: pixel buffer too small".into()));
        }
        self.handle.set(raw::TJPARAM_TJPARAM_QUALITY, c_int::from(quality))?;
        // SAFETY: pure function of its arguments.
        let cap = unsafe { raw::tj3JPEGBufSize(w, h, raw::TJSAMP_TJSAMP_420 as c_int) };
        let Ok(cap_usize) = usize::try_from(cap) else {
            return Err(fail("buffer size overflow".into()));
        };
        if cap_usize == 0 || cap_usize == usize::MAX {
            return Err(fail(self.handle.error()));
        }
        out.clear();
        out.reserve(cap_usize);
        let mut dst = out.as_mut_ptr();
        let mut size: raw::size_t = cap;
        // SAFETY: the handle is valid. `pixels` holds width * height * 3 bytes (checked above),
        // packed (pitch 0). `dst` points to `cap` writable bytes (reserved above);
        // TJPARAM_NOREALLOC = 1 makes libjpeg-turbo fail rather than realloc or free it, and
        // `size` tells it the capacity.
        let rc = unsafe {
            raw::tj3Compress8(
                self.handle.ptr(),
                pixels.as_ptr(),
                w,
                0,
                h,
                raw::TJPF_TJPF_RGB as c_int,
                &mut dst,
                &mut size,
            )
        };
        if rc != 0 {
            return Err(fail(self.handle.error()));
        }
        let written = usize::try_from(size).unwrap_or(usize::MAX);
        if dst != out.as_mut_ptr() || written > cap_usize {
            // Cannot happen with NOREALLOC; refuse to trust the buffer if it did.
            return Err(fail("internal: libjpeg-turbo moved the output buffer".into()));
        }
        // SAFETY: libjpeg-turbo initialised the first `written` bytes of the reserved
        // capacity (`written <= cap`, checked).
        unsafe { out.set_len(written) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pillow's `cmyk2rgb` applied to the `CMYK;I` raw mode, written exactly as in Convert.c.
    fn pillow(stored_c: u8, stored_k: u8) -> u8 {
        let (c, k) = (255 - i32::from(stored_c), 255 - i32::from(stored_k));
        let nk = 255 - k;
        let t = c * nk + 128;
        let muldiv = ((t >> 8) + t) >> 8;
        (nk - muldiv).clamp(0, 255) as u8
    }

    #[test]
    fn cmyk_formula_equals_pillow_for_all_pairs() {
        for c in 0..=255u8 {
            for k in 0..=255u8 {
                assert_eq!(mul_div255(c.into(), k.into()), pillow(c, k), "c={c} k={k}");
            }
        }
    }

    #[test]
    fn cmyk_to_rgb_uses_each_channel() {
        let mut rgb = [0u8; 6];
        cmyk_to_rgb(&[255, 0, 128, 255, 10, 20, 30, 0], &mut rgb);
        assert_eq!(rgb, [255, 0, 128, 0, 0, 0]);
    }

    /// A tiny JPEG from the safe wrapper, for handle-level checks.
    fn small_jpeg() -> Vec<u8> {
        let img = turbojpeg::Image::mandelbrot(64, 48, turbojpeg::PixelFormat::RGB);
        turbojpeg::compress(img.as_deref(), 90, turbojpeg::Subsamp::Sub2x2)
            .unwrap()
            .to_vec()
    }

    /// What STOPONWARNING changes: without it, a truncated JPEG is decoded to the end (the
    /// missing rows padded) and only flagged as a warning; with it, the decode stops at the
    /// warning. Either way `tj3Decompress8` returns -1, so a caller that treats
    /// `TJERR_WARNING` as success would get a grey-padded image.
    #[test]
    fn stop_on_warning_behaviour() {
        let jpeg = small_jpeg();
        let cut = &jpeg[..jpeg.len() * 2 / 3];
        let mut buf = vec![0x55u8; 64 * 48 * 3];
        for stop in [0, 1] {
            let mut h = Handle::new(raw::TJINIT_TJINIT_DECOMPRESS).unwrap();
            h.set(raw::TJPARAM_TJPARAM_STOPONWARNING, stop).unwrap();
            buf.fill(0x55);
            // SAFETY: valid handle, `cut` readable, `buf` holds the full 64x48 RGB image.
            let rc = unsafe {
                raw::tj3Decompress8(
                    h.ptr(),
                    cut.as_ptr(),
                    cut.len() as raw::size_t,
                    buf.as_mut_ptr(),
                    0,
                    raw::TJPF_TJPF_RGB as c_int,
                )
            };
            // SAFETY: valid handle.
            let code = unsafe { raw::tj3GetErrorCode(h.ptr()) };
            assert_eq!(rc, -1);
            assert_eq!(code, raw::TJERR_TJERR_WARNING as c_int);
            assert!(h.error().contains("Premature end of JPEG file"), "{}", h.error());
            let last_row = &buf[47 * 64 * 3..];
            if stop == 0 {
                // Decoded to the end: the last row was written (grey padding), not left alone.
                assert!(last_row.iter().any(|&b| b != 0x55));
            } else {
                // Stopped at the warning: the last row was never written.
                assert!(last_row.iter().all(|&b| b == 0x55));
            }
        }
    }

    #[test]
    fn tables_only_stream_is_not_an_image() {
        // A real image first, so the handle holds a size from it.
        let jpeg = small_jpeg();
        let mut d = TjDecompressor::new(&Limits::default()).unwrap();
        assert_eq!(d.probe(&jpeg).unwrap().info.width, 64);
        // SOI, the DQT segment of that image, EOI.
        let dqt = jpeg.windows(2).position(|w| w == [0xFF, 0xDB]).unwrap();
        let len = usize::from(u16::from_be_bytes([jpeg[dqt + 2], jpeg[dqt + 3]]));
        let mut tables = vec![0xFF, 0xD8];
        tables.extend_from_slice(&jpeg[dqt..dqt + 2 + len]);
        tables.extend_from_slice(&[0xFF, 0xD9]);
        match d.probe(&tables) {
            Err(CodecError::Corrupt { reason, .. }) => {
                assert!(reason.contains("no frame header"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn twelve_bit_jpeg_probes_but_is_unsupported() {
        let (w, h) = (16, 8);
        let samples: Vec<i16> = (0..w * h * 3).map(|i| (i * 37 % 4096) as i16).collect();
        let mut c = Handle::new(raw::TJINIT_TJINIT_COMPRESS).unwrap();
        c.set(raw::TJPARAM_TJPARAM_QUALITY, 90).unwrap();
        c.set(raw::TJPARAM_TJPARAM_SUBSAMP, raw::TJSAMP_TJSAMP_444 as c_int)
            .unwrap();
        let mut buf: *mut u8 = std::ptr::null_mut();
        let mut size: raw::size_t = 0;
        // SAFETY: valid handle; `samples` holds w * h * 3 12-bit samples, packed (pitch 0);
        // a NULL `buf` asks libjpeg-turbo to allocate the output, freed below with tj3Free.
        let rc = unsafe {
            raw::tj3Compress12(
                c.ptr(),
                samples.as_ptr(),
                w,
                0,
                h,
                raw::TJPF_TJPF_RGB as c_int,
                &mut buf,
                &mut size,
            )
        };
        assert_eq!(rc, 0, "{}", c.error());
        // SAFETY: on success `buf` points to `size` initialised bytes owned by libjpeg-turbo.
        let jpeg = unsafe { std::slice::from_raw_parts(buf, size as usize) }.to_vec();
        // SAFETY: `buf` came from libjpeg-turbo's allocator and is freed once.
        unsafe { raw::tj3Free(buf.cast()) };

        let mut d = TjDecompressor::new(&Limits::default()).unwrap();
        let header = d.probe(&jpeg).unwrap();
        assert_eq!(
            (header.info.width, header.info.height, header.info.bits_per_channel),
            (16, 8, 12)
        );
        let (mut out, mut scratch) = (Vec::new(), Vec::new());
        match d.decode_rgb8(&jpeg, &mut out, &mut scratch) {
            Err(CodecError::Unsupported { reason, .. }) => {
                assert!(reason.contains("12-bit"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
}
