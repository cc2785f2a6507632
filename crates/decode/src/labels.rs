//! Label maps: PNGs whose pixel values are labels, not colours (semantic segmentation masks:
//! VOC, ADE20K, Cityscapes style; control.md, "Detection and segmentation targets (1.10)").
//!
//! Unlike [`crate::Decoder`], nothing here converts colours: a palette PNG gives its palette
//! *indices* (VOC's class ids), a grey PNG its values. Only 8-bit grey and 8-bit palette PNGs are
//! label maps; anything else (RGB, 16-bit, low bit depths, alpha) is refused, since its values
//! are not one label per pixel. [`encode_grey_png`] writes the form `targets.rft` stores.

use std::io::Cursor;

/// Why a PNG is not a label map.
#[derive(Debug, thiserror::Error)]
pub enum LabelError {
    /// The bytes are not a PNG the `png` crate decodes.
    #[error("not a readable PNG: {0}")]
    Png(String),
    /// A PNG that is not 8-bit grey or 8-bit palette.
    #[error(
        "a PNG of colour type {color:?} and bit depth {depth}; a label map is an 8-bit greyscale or 8-bit palette PNG whose values are the labels"
    )]
    Form { color: String, depth: u8 },
    /// More pixels than the decoder's limit.
    #[error(
        "the label map is {width}x{height} pixels, over the limit of {limit}; raise `--max-pixels` if such images are expected"
    )]
    TooLarge { width: u32, height: u32, limit: u64 },
}

/// Decodes `png` (8-bit grey or palette) into `out` as one `u8` label per pixel, row-major;
/// returns `(width, height)`. At most `max_pixels` pixels, checked from the header.
pub fn decode_labels(png: &[u8], max_pixels: u64, out: &mut Vec<u8>) -> Result<(u32, u32), LabelError> {
    let bad = |e: png::DecodingError| LabelError::Png(e.to_string());
    let mut decoder = png::Decoder::new(Cursor::new(png));
    decoder.set_transformations(png::Transformations::IDENTITY);
    let mut reader = decoder.read_info().map_err(bad)?;
    let info = reader.info();
    let (width, height, color, depth) = (info.width, info.height, info.color_type, info.bit_depth);
    if !matches!(color, png::ColorType::Grayscale | png::ColorType::Indexed) || depth != png::BitDepth::Eight {
        return Err(LabelError::Form {
            color: format!("{color:?}"),
            depth: depth as u8,
        });
    }
    if u64::from(width) * u64::from(height) > max_pixels {
        return Err(LabelError::TooLarge {
            width,
            height,
            limit: max_pixels,
        });
    }
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| LabelError::Png("the image is too large to decode".to_owned()))?;
    out.clear();
    out.resize(size, 0);
    let frame = reader.next_frame(out).map_err(bad)?;
    out.truncate(frame.buffer_size());
    Ok((width, height))
}

/// An 8-bit greyscale PNG of `width x height` pixels holding `labels` (row-major, one per pixel).
///
/// # Panics
/// If `labels.len() != width * height`.
pub fn encode_grey_png(width: u32, height: u32, labels: &[u8]) -> Vec<u8> {
    assert_eq!(labels.len(), width as usize * height as usize, "one label per pixel");
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, width, height);
    enc.set_color(png::ColorType::Grayscale);
    enc.set_depth(png::BitDepth::Eight);
    // Writing into a Vec cannot fail for a correct size, which the assert above ensures.
    let mut w = enc.write_header().expect("writing a PNG header into memory");
    w.write_image_data(labels).expect("writing PNG data into memory");
    w.finish().expect("finishing a PNG in memory");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn palette_png(w: u32, h: u32, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(png::ColorType::Indexed);
        enc.set_depth(png::BitDepth::Eight);
        enc.set_palette((0..=255u8).flat_map(|i| [i, 255 - i, i / 2]).collect::<Vec<_>>());
        let mut wr = enc.write_header().unwrap();
        wr.write_image_data(data).unwrap();
        wr.finish().unwrap();
        out
    }

    #[test]
    fn grey_round_trips_and_palettes_give_indices() {
        let data: Vec<u8> = (0..35).map(|i| (i * 7 % 256) as u8).collect();
        let mut out = Vec::new();
        assert_eq!(
            decode_labels(&encode_grey_png(7, 5, &data), 1 << 20, &mut out).unwrap(),
            (7, 5)
        );
        assert_eq!(out, data);
        // A VOC-style palette PNG: the values are the indices, not the palette's colours.
        assert_eq!(
            decode_labels(&palette_png(5, 7, &data), 1 << 20, &mut out).unwrap(),
            (5, 7)
        );
        assert_eq!(out, data);
    }

    #[test]
    fn refuses_what_is_not_a_label_map() {
        let mut rgb = Vec::new();
        let mut enc = png::Encoder::new(&mut rgb, 2, 2);
        enc.set_color(png::ColorType::Rgb);
        let mut wr = enc.write_header().unwrap();
        wr.write_image_data(&[0; 12]).unwrap();
        wr.finish().unwrap();
        let mut out = Vec::new();
        let e = decode_labels(&rgb, 1 << 20, &mut out).unwrap_err();
        assert!(e.to_string().contains("8-bit greyscale or 8-bit palette"), "{e}");
        let e = decode_labels(b"not a png", 1 << 20, &mut out).unwrap_err();
        assert!(e.to_string().starts_with("not a readable PNG"), "{e}");
        let e = decode_labels(&encode_grey_png(4, 4, &[0; 16]), 15, &mut out).unwrap_err();
        assert!(e.to_string().contains("--max-pixels"), "{e}");
    }
}
