//! Every format but JPEG, through the `image` crate's per-format decoders.
//!
//! # Invariants
//! - The pixel limit is checked from the header, before any pixel buffer exists: PNG's IHDR is
//!   read here directly (so a file that is nothing but a huge IHDR still fails as `TooLarge`),
//!   the other formats' decoders parse only their header on construction.
//! - `image::Limits` is set on every decoder: `max_image_width`/`max_image_height` are
//!   `max_pixels` (no side can be longer), and `max_alloc` is `8 * max_pixels` minus the decode
//!   buffer we allocate, as `ImageReader::decode` does.
//! - Every call into the `image` crate runs under `catch_unwind`; a panic becomes `Corrupt`.
//! - Conversion to RGB8 follows Pillow's `convert("RGB")` where it is sane: grey replicated,
//!   alpha dropped (not composited), palettes already expanded by the decoder, GIF/WebP/APNG
//!   first frame. 16-bit samples are rounded, `(v + 128) / 257` (the `image` crate's rule);
//!   Pillow truncates (`v >> 8`) for RGB and clips for grey, which differ by up to one step (or,
//!   for grey, completely).

use std::any::Any;
use std::io::Cursor;
use std::panic::{AssertUnwindSafe, catch_unwind};

use image::codecs::{bmp, gif, png, pnm, tiff, webp};
use image::{ColorType, ExtendedColorType, ImageDecoder, ImageError, ImageResult};

use super::{CodecError, ColorKind, Format, ImageInfo, Limits};

type BoxedDecoder<'a> = Box<dyn ImageDecoder + 'a>;

/// Header only.
pub(super) fn probe(format: Format, data: &[u8], limits: &Limits) -> Result<ImageInfo, CodecError> {
    let (info, _decoder) = open(format, data, limits)?;
    Ok(info)
}

/// Full decode to packed RGB8 in `out` (stored orientation), using `scratch` for the native
/// decode when the image is not already RGB8.
pub(super) fn decode_rgb8(
    format: Format,
    data: &[u8],
    limits: &Limits,
    out: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
) -> Result<ImageInfo, CodecError> {
    let (info, mut decoder) = open(format, data, limits)?;
    let budget = limits.budget_bytes();
    let color = decoder.color_type();
    let pixels = u64::from(info.width) * u64::from(info.height);
    let total = decoder.total_bytes();
    if total != pixels * u64::from(color.bytes_per_pixel()) {
        return Err(corrupt(
            format,
            format!(
                "decoder reports {total} bytes for {}x{} {color:?}",
                info.width, info.height
            ),
        ));
    }
    if total > budget {
        return Err(CodecError::OverBudget {
            format,
            budget,
            reason: format!("{color:?} decode buffer of {total} bytes"),
        });
    }
    let mut image_limits = image_limits(limits);
    image_limits.max_alloc = Some(budget - total);
    // `total <= budget` and `pixels <= max_pixels`, both far below usize::MAX on 64-bit.
    let (total, pixels) = (total as usize, pixels as usize);
    guarded(format, budget, || decoder.set_limits(image_limits))?;
    if color == ColorType::Rgb8 {
        out.resize(total, 0);
        guarded(format, budget, || decoder.read_image_boxed(out))?;
        return Ok(info);
    }
    scratch.resize(total, 0);
    guarded(format, budget, || decoder.read_image_boxed(scratch))?;
    out.resize(pixels * 3, 0);
    to_rgb8(color, scratch, out).ok_or_else(|| CodecError::Unsupported {
        format,
        reason: format!("decoded colour type {color:?}"),
    })?;
    Ok(info)
}

/// Builds the decoder for `format` over `data`, reads the header, and checks the pixel limit.
fn open<'a>(format: Format, data: &'a [u8], limits: &Limits) -> Result<(ImageInfo, BoxedDecoder<'a>), CodecError> {
    let mut interlaced = false;
    if format == Format::Png
        && let Some(ihdr) = png_ihdr(data)
    {
        limits.check(ihdr.width, ihdr.height)?;
        interlaced = ihdr.interlaced;
    }
    let budget = limits.budget_bytes();
    let image_limits = image_limits(limits);
    let mut decoder = guarded(format, budget, || -> ImageResult<BoxedDecoder<'a>> {
        let r = Cursor::new(data);
        Ok(match format {
            Format::Png => Box::new(png::PngDecoder::with_limits(r, image_limits)?),
            Format::Gif => Box::new(gif::GifDecoder::new(r)?),
            Format::Bmp => Box::new(bmp::BmpDecoder::new(r)?),
            Format::Tiff => Box::new(tiff::TiffDecoder::new(r)?),
            Format::Webp => Box::new(webp::WebPDecoder::new(r)?),
            Format::Pnm => Box::new(pnm::PnmDecoder::new(r)?),
            Format::Jpeg => {
                return Err(ImageError::Unsupported(
                    image::error::UnsupportedError::from_format_and_kind(
                        image::error::ImageFormatHint::Unknown,
                        image::error::UnsupportedErrorKind::GenericFeature("jpeg goes through libjpeg-turbo".into()),
                    ),
                ));
            }
        })
    })?;
    let (width, height) = decoder.dimensions();
    if width == 0 || height == 0 {
        return Err(corrupt(format, format!("invalid size {width}x{height}")));
    }
    limits.check(width, height)?;
    let original = decoder.original_color_type();
    // A missing or broken orientation tag is not worth failing an image for.
    let orientation = guarded(format, budget, || decoder.orientation()).map_or(1, |o| o.to_exif());
    let info = ImageInfo {
        format,
        width,
        height,
        color: color_kind(original),
        bits_per_channel: bits_per_channel(original),
        orientation,
        progressive: interlaced,
    };
    Ok((info, decoder))
}

/// The `image::Limits` derived from ours.
fn image_limits(limits: &Limits) -> image::Limits {
    let side = u32::try_from(limits.max_pixels).unwrap_or(u32::MAX);
    let mut l = image::Limits::default();
    l.max_image_width = Some(side);
    l.max_image_height = Some(side);
    l.max_alloc = Some(limits.budget_bytes());
    l
}

struct Ihdr {
    width: u32,
    height: u32,
    interlaced: bool,
}

/// The fields we need from a PNG's IHDR, if the file starts with one.
fn png_ihdr(data: &[u8]) -> Option<Ihdr> {
    if data.get(8..16)? != b"\0\0\0\x0dIHDR" {
        return None;
    }
    let be32 = |at: usize| -> Option<u32> { Some(u32::from_be_bytes(data.get(at..at + 4)?.try_into().ok()?)) };
    Some(Ihdr {
        width: be32(16)?,
        height: be32(20)?,
        interlaced: *data.get(28)? == 1,
    })
}

/// Runs `f` with panics caught; maps both outcomes to our errors.
fn guarded<T>(format: Format, budget: u64, f: impl FnOnce() -> ImageResult<T>) -> Result<T, CodecError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(image_error(format, budget, e)),
        Err(payload) => Err(corrupt(
            format,
            format!("decoder panicked: {}", panic_message(&*payload)),
        )),
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "non-string panic payload"
    }
}

fn corrupt(format: Format, reason: String) -> CodecError {
    CodecError::Corrupt { format, reason }
}

fn image_error(format: Format, budget: u64, e: ImageError) -> CodecError {
    match e {
        ImageError::Limits(e) => CodecError::OverBudget {
            format,
            budget,
            reason: e.to_string(),
        },
        ImageError::Unsupported(e) => CodecError::Unsupported {
            format,
            reason: e.to_string(),
        },
        // Decoding, I/O (truncation shows up as "failed to fill whole buffer"), parameter.
        e => corrupt(format, e.to_string()),
    }
}

fn color_kind(c: ExtendedColorType) -> ColorKind {
    use ExtendedColorType as E;
    match c {
        E::L1 | E::L2 | E::L4 | E::L8 | E::L16 => ColorKind::Gray,
        E::La1 | E::La2 | E::La4 | E::La8 | E::La16 => ColorKind::GrayAlpha,
        E::Rgb1 | E::Rgb2 | E::Rgb4 | E::Rgb5x1 | E::Rgb8 | E::Rgb16 | E::Bgr8 | E::Rgb32F => ColorKind::Rgb,
        E::Rgba1 | E::Rgba2 | E::Rgba4 | E::Rgba8 | E::Rgba16 | E::Bgra8 | E::Rgba32F => ColorKind::Rgba,
        E::Cmyk8 | E::Cmyk16 => ColorKind::Cmyk,
        _ => ColorKind::Other,
    }
}

fn bits_per_channel(c: ExtendedColorType) -> u8 {
    match c.channel_count() {
        0 => 0,
        n => u8::try_from(c.bits_per_pixel() / u16::from(n)).unwrap_or(0),
    }
}

/// Converts a native decode (`image` crate layout: packed, native-endian samples) to RGB8.
/// `None` for a colour type we do not know.
fn to_rgb8(color: ColorType, src: &[u8], out: &mut [u8]) -> Option<()> {
    fn u16_sample(b: &[u8]) -> u8 {
        let v = u32::from(u16::from_ne_bytes([b[0], b[1]]));
        ((v + 128) / 257) as u8
    }
    fn f32_sample(b: &[u8]) -> u8 {
        let v = f32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        // NaN and +inf → 1.0, like the `image` crate; -inf → 0.
        let v = if v < 1.0 { v.max(0.0) } else { 1.0 };
        (v * 255.0).round() as u8
    }
    match color {
        ColorType::L8 => convert(src, out, 1, 1, |b| b[0]),
        ColorType::La8 => convert(src, out, 2, 1, |b| b[0]),
        ColorType::Rgb8 => convert(src, out, 3, 1, |b| b[0]),
        ColorType::Rgba8 => convert(src, out, 4, 1, |b| b[0]),
        ColorType::L16 => convert(src, out, 1, 2, u16_sample),
        ColorType::La16 => convert(src, out, 2, 2, u16_sample),
        ColorType::Rgb16 => convert(src, out, 3, 2, u16_sample),
        ColorType::Rgba16 => convert(src, out, 4, 2, u16_sample),
        ColorType::Rgb32F => convert(src, out, 3, 4, f32_sample),
        ColorType::Rgba32F => convert(src, out, 4, 4, f32_sample),
        _ => return None,
    }
    Some(())
}

/// Pixel by pixel: `channels` samples of `bytes` bytes each in, RGB8 out. One or two channels
/// are grey (+ alpha), replicated; three or four are RGB (+ alpha). Alpha is dropped.
#[inline(always)]
fn convert(src: &[u8], out: &mut [u8], channels: usize, bytes: usize, sample: impl Fn(&[u8]) -> u8) {
    let stride = channels * bytes;
    for (px, o) in src.chunks_exact(stride).zip(out.chunks_exact_mut(3)) {
        if channels < 3 {
            o.fill(sample(&px[..bytes]));
        } else {
            o[0] = sample(&px[..bytes]);
            o[1] = sample(&px[bytes..2 * bytes]);
            o[2] = sample(&px[2 * bytes..3 * bytes]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_bit_rounds_like_the_image_crate() {
        let samples: [u16; 6] = [0, 128, 129, 257, 0x8080, 65535];
        let mut src = Vec::new();
        for s in samples {
            src.extend_from_slice(&s.to_ne_bytes());
        }
        let mut out = [0u8; 18];
        to_rgb8(ColorType::L16, &src, &mut out).unwrap();
        let grey: Vec<u8> = out.chunks(3).map(|p| p[0]).collect();
        assert_eq!(grey, [0, 0, 1, 1, 128, 255]);
        assert!(out.chunks(3).all(|p| p[0] == p[1] && p[1] == p[2]));
    }

    #[test]
    fn alpha_is_dropped_and_grey_replicated() {
        let mut out = [0u8; 6];
        to_rgb8(ColorType::La8, &[7, 0, 9, 255], &mut out).unwrap();
        assert_eq!(out, [7, 7, 7, 9, 9, 9]);
        to_rgb8(ColorType::Rgba8, &[1, 2, 3, 0, 4, 5, 6, 128], &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn floats_are_clamped() {
        let mut src = Vec::new();
        for v in [-1.0f32, 0.5, f32::NAN, 2.0, 0.0, 1.0] {
            src.extend_from_slice(&v.to_ne_bytes());
        }
        let mut out = [0u8; 6];
        to_rgb8(ColorType::Rgb32F, &src, &mut out).unwrap();
        assert_eq!(out, [0, 128, 255, 255, 0, 255]);
    }

    #[test]
    fn ihdr_is_read_only_when_present() {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        png.extend_from_slice(&100_000u32.to_be_bytes());
        png.extend_from_slice(&7u32.to_be_bytes());
        png.extend_from_slice(&[8, 2, 0, 0, 1]);
        let ihdr = png_ihdr(&png).unwrap();
        assert_eq!((ihdr.width, ihdr.height, ihdr.interlaced), (100_000, 7, true));
        assert!(png_ihdr(&png[..28]).is_none());
        assert!(png_ihdr(b"\x89PNG\r\n\x1a\n\0\0\0\x0dIDAT").is_none());
    }
}
