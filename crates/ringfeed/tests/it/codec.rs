//! The codec module against generated images: formats, pixels, orientation, limits, truncation,
//! determinism, and "no input panics".

pub(crate) mod images;

use std::time::{Duration, Instant};

use image::ImageFormat;
use images::{JpegOpts, Rng};
use proptest::prelude::*;
use ringfeed_decode::{CodecError, ColorKind, Decoded, Decoder, Format, ImageInfo, Limits, Reencode, sniff};
use turbojpeg::{PixelFormat, Subsamp};

fn decoder() -> Decoder {
    Decoder::new(Limits::default()).unwrap()
}

fn decode(data: &[u8]) -> Result<(Decoded, Vec<u8>), CodecError> {
    let mut out = Vec::new();
    let d = decoder().decode_rgb8(data, &mut out)?;
    Ok((d, out))
}

/// libjpeg-turbo's own RGB decode, through the safe wrapper (default handle settings).
fn turbo_rgb(jpeg: &[u8]) -> Vec<u8> {
    turbojpeg::decompress(jpeg, PixelFormat::RGB).unwrap().pixels
}

fn mean_abs_diff(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len());
    let sum: u64 = a.iter().zip(b).map(|(&x, &y)| u64::from(x.abs_diff(y))).sum();
    sum as f64 / a.len() as f64
}

// ---------------------------------------------------------------------------------------------
// JPEG

#[test]
fn jpeg_variants_match_libjpeg_turbo_rgb() {
    let (w, h) = (97, 61); // odd sizes: partial MCUs on both edges
    let src = images::photo(w, h, 1);
    let base = JpegOpts::default();
    let cases = [
        ("baseline 4:2:0", base, false),
        (
            "4:4:4",
            JpegOpts {
                subsamp: Subsamp::None,
                ..base
            },
            false,
        ),
        (
            "4:2:2",
            JpegOpts {
                subsamp: Subsamp::Sub2x1,
                ..base
            },
            false,
        ),
        (
            "progressive",
            JpegOpts {
                progressive: true,
                ..base
            },
            true,
        ),
        ("optimized huffman", JpegOpts { optimize: true, ..base }, false),
        (
            "arithmetic",
            JpegOpts {
                arithmetic: true,
                ..base
            },
            false,
        ),
        (
            "arithmetic progressive",
            JpegOpts {
                arithmetic: true,
                progressive: true,
                ..base
            },
            true,
        ),
        ("lossless", JpegOpts { lossless: true, ..base }, false),
    ];
    let mut d = decoder();
    let mut out = Vec::new();
    for (name, opts, progressive) in cases {
        let jpeg = images::jpeg_rgb(&src, w, h, &opts);
        let info = d.probe(&jpeg).unwrap();
        assert_eq!(
            info,
            ImageInfo {
                format: Format::Jpeg,
                width: w,
                height: h,
                color: ColorKind::Rgb,
                bits_per_channel: 8,
                orientation: 1,
                progressive,
            },
            "{name}"
        );
        let got = d.decode_rgb8(&jpeg, &mut out).unwrap();
        assert_eq!((got.width, got.height), (w, h), "{name}");
        assert_eq!(out, turbo_rgb(&jpeg), "{name}: differs from libjpeg-turbo's RGB decode");
        // And it is the picture we encoded, not merely the same wrong answer twice.
        assert!(mean_abs_diff(&out, &src) < 4.0, "{name}: {}", mean_abs_diff(&out, &src));
    }
}

#[test]
fn chroma_sampling_is_read_from_the_frame_header() {
    use ringfeed_decode::{Chroma, sequential_huffman_chroma};
    let (w, h) = (45, 33);
    let src = images::photo(w, h, 4);
    for (subsamp, want) in [
        (Subsamp::None, Chroma::Full),
        (Subsamp::Sub2x1, Chroma::HalfWidth),
        (Subsamp::Sub2x2, Chroma::Half),
        (Subsamp::Sub1x2, Chroma::HalfHeight),
        (Subsamp::Sub4x1, Chroma::Other),
    ] {
        let jpeg = images::jpeg_rgb(
            &src,
            w,
            h,
            &JpegOpts {
                subsamp,
                ..JpegOpts::default()
            },
        );
        assert_eq!(sequential_huffman_chroma(&jpeg), Some(want), "{subsamp:?}");
        let progressive = JpegOpts {
            subsamp,
            progressive: true,
            ..JpegOpts::default()
        };
        // A JPEG the GPU path does not take has no chroma to say.
        assert_eq!(
            sequential_huffman_chroma(&images::jpeg_rgb(&src, w, h, &progressive)),
            None
        );
    }
    let gray = images::jpeg_gray(&vec![128u8; (w * h) as usize], w, h);
    assert_eq!(sequential_huffman_chroma(&gray), Some(Chroma::Gray));
    assert_eq!(sequential_huffman_chroma(b"not a jpeg"), None);
}

#[test]
fn grayscale_jpeg_is_replicated() {
    let (w, h) = (40, 30);
    let gray: Vec<u8> = images::photo(w, h, 2).chunks(3).map(|p| p[0]).collect();
    let jpeg = images::jpeg_gray(&gray, w, h);
    let (d, out) = decode(&jpeg).unwrap();
    assert_eq!(d.info.color, ColorKind::Gray);
    let want = turbojpeg::decompress(&jpeg, PixelFormat::GRAY).unwrap().pixels;
    assert_eq!(out.len(), want.len() * 3);
    for (px, g) in out.chunks(3).zip(&want) {
        assert_eq!(px, [*g, *g, *g]);
    }
}

/// Pillow's `convert("RGB")` of a 4-channel JPEG is `round(c * k / 255)` on the stored samples
/// (it reads them as inverted Adobe CMYK). Checked here against the CMYK we encoded, through
/// JPEG loss at quality 100.
#[test]
fn cmyk_and_ycck_jpegs_convert_like_pillow() {
    let (w, h) = (48, 32);
    let cmyk = images::cmyk_content(w, h);
    let want: Vec<u8> = cmyk
        .chunks(4)
        .flat_map(|p| {
            let k = f64::from(p[3]);
            [0, 1, 2].map(|i| (f64::from(p[i]) * k / 255.0).round() as u8)
        })
        .collect();
    for (ycck, kind) in [(false, ColorKind::Cmyk), (true, ColorKind::Ycck)] {
        let jpeg = images::jpeg_cmyk(&cmyk, w, h, ycck);
        let (d, out) = decode(&jpeg).unwrap();
        assert_eq!(d.info.color, kind);
        assert_eq!((d.width, d.height), (w, h));
        let max = out.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
        let mean = mean_abs_diff(&out, &want);
        assert!(mean < 1.0 && max <= 4, "{kind:?}: mean {mean}, max {max}");
    }
}

#[test]
fn exif_orientations_match_manual_rotation() {
    let (w, h) = (37, 23);
    let jpeg = images::jpeg_rgb(&images::photo(w, h, 3), w, h, &JpegOpts::default());
    let (_, upright) = decode(&jpeg).unwrap();
    for little in [true, false] {
        for o in 1..=8u8 {
            let tagged = images::with_exif(&jpeg, o.into(), little);
            let mut d = decoder();
            assert_eq!(d.probe(&tagged).unwrap().orientation, o);
            let mut out = Vec::new();
            let got = d.decode_rgb8(&tagged, &mut out).unwrap();
            // Oracle: the `image` crate's own implementation of the EXIF transforms.
            let mut want = image::DynamicImage::ImageRgb8(image::RgbImage::from_raw(w, h, upright.clone()).unwrap());
            want.apply_orientation(image::metadata::Orientation::from_exif(o).unwrap());
            let want = want.into_rgb8();
            assert_eq!((got.width, got.height), want.dimensions(), "orientation {o}");
            assert_eq!(out, want.into_raw(), "orientation {o}, little endian {little}");
        }
    }
    // Out-of-range values are ignored.
    for o in [0u16, 9, 0xFFFF] {
        let (d, out) = decode(&images::with_exif(&jpeg, o, true)).unwrap();
        assert_eq!((d.info.orientation, d.width, d.height), (1, w, h));
        assert_eq!(out, upright);
    }
}

/// Stray bytes before the end-of-image marker (found in real datasets, accepted by Pillow)
/// decode to the same pixels; the same file truncated is still refused.
#[test]
fn extraneous_bytes_are_tolerated_but_truncation_is_not() {
    let (w, h) = (64, 48);
    let src = images::photo(w, h, 5);
    let clean = images::jpeg_rgb(&src, w, h, &JpegOpts::default());
    assert_eq!(&clean[clean.len() - 2..], [0xFF, 0xD9]);
    let mut stray = clean[..clean.len() - 2].to_vec();
    stray.extend_from_slice(&[0x12, 0x34, 0x56, 0xFF, 0xD9]);
    let (_, clean_px) = decode(&clean).unwrap();
    let mut d = decoder();
    let mut out = Vec::new();
    d.decode_rgb8(&stray, &mut out).unwrap();
    assert_eq!(out, clean_px);
    // The decoder is back to stopping on warnings for the next image.
    let err = d
        .decode_rgb8(&clean[..clean.len() / 2], &mut out)
        .unwrap_err()
        .to_string();
    assert!(err.contains("Premature end of JPEG file"), "{err}");
    let mut both = clean[..clean.len() / 2].to_vec();
    both.extend_from_slice(&[0x12, 0x34, 0xFF, 0xD9]);
    assert!(d.decode_rgb8(&both, &mut out).is_err());
    d.decode_rgb8(&clean, &mut out).unwrap();
    assert_eq!(out, clean_px);
}

#[test]
fn truncated_jpegs_always_fail() {
    let (w, h) = (64, 48);
    let src = images::photo(w, h, 4);
    let base = JpegOpts::default();
    for opts in [
        base,
        JpegOpts {
            progressive: true,
            ..base
        },
        JpegOpts {
            arithmetic: true,
            ..base
        },
    ] {
        let jpeg = images::jpeg_rgb(&src, w, h, &opts);
        let mut d = decoder();
        let mut out = Vec::new();
        let mut cuts: Vec<usize> = (1..40).map(|i| jpeg.len() * i / 40).collect();
        cuts.extend([1, 2, 3, 4, jpeg.len() - 2, jpeg.len() - 1]);
        for cut in cuts {
            match d.decode_rgb8(&jpeg[..cut], &mut out) {
                Err(CodecError::Corrupt {
                    format: Format::Jpeg,
                    reason,
                }) => assert!(!reason.is_empty()),
                Err(CodecError::UnknownFormat { .. }) if cut < 3 => {}
                other => panic!("{opts:?} cut at {cut}/{}: {other:?}", jpeg.len()),
            }
        }
    }
    // The reason is libjpeg-turbo's.
    let jpeg = images::jpeg_rgb(&src, w, h, &base);
    let err = decode(&jpeg[..jpeg.len() / 2]).unwrap_err().to_string();
    assert!(err.contains("corrupt jpeg image: Premature end of JPEG file"), "{err}");
}

#[test]
fn jpeg_sof_claiming_60000_squared_is_too_large() {
    let jpeg = images::jpeg_rgb(&images::photo(16, 16, 5), 16, 16, &JpegOpts::default());
    let huge = images::with_sof_size(&jpeg, 60_000, 60_000);
    let mut d = decoder();
    let mut out = Vec::new();
    let start = Instant::now();
    for r in [d.probe(&huge).map(|_| ()), d.decode_rgb8(&huge, &mut out).map(|_| ())] {
        match r {
            Err(CodecError::TooLarge {
                width: 60_000,
                height: 60_000,
                limit: 89_478_485,
            }) => {}
            other => panic!("{other:?}"),
        }
    }
    assert!(start.elapsed() < Duration::from_secs(1));
    assert_eq!(out.capacity(), 0, "nothing may be allocated for a refused image");
    // Exactly at the limit is fine: 16x16 with max_pixels = 256.
    let mut tight = Decoder::new(Limits { max_pixels: 256 }).unwrap();
    assert!(tight.decode_rgb8(&jpeg, &mut out).is_ok());
    let mut tighter = Decoder::new(Limits { max_pixels: 255 }).unwrap();
    assert!(matches!(
        tighter.probe(&jpeg),
        Err(CodecError::TooLarge {
            width: 16,
            height: 16,
            limit: 255
        })
    ));
}

/// Tables left in a reused libjpeg-turbo handle must not change what the next image decodes
/// to: an image without its own Huffman tables decodes as on a fresh handle (with the
/// standard tables), one without quantisation tables fails as on a fresh handle.
#[test]
fn jpeg_decoding_does_not_depend_on_history() {
    let (w, h) = (48, 40);
    let src = images::photo(w, h, 6);
    // Optimised Huffman tables: not the standard ones.
    let primer = images::jpeg_rgb(
        &images::photo(w, h, 7),
        w,
        h,
        &JpegOpts {
            optimize: true,
            ..JpegOpts::default()
        },
    );
    // Standard tables, then stripped: decodable only with the standard tables.
    let plain = images::jpeg_rgb(&src, w, h, &JpegOpts::default());
    let no_dht = images::strip_segments(&plain, 0xC4);
    let no_dqt = images::strip_segments(&plain, 0xDB);
    assert!(no_dht.len() < plain.len() && no_dqt.len() < plain.len());

    let fresh = decode(&no_dht).unwrap().1;
    assert_eq!(fresh, turbo_rgb(&plain));
    let mut d = decoder();
    let mut out = Vec::new();
    d.decode_rgb8(&primer, &mut out).unwrap();
    d.decode_rgb8(&no_dht, &mut out).unwrap();
    assert_eq!(out, fresh);

    assert!(matches!(decode(&no_dqt), Err(CodecError::Corrupt { .. })));
    d.decode_rgb8(&primer, &mut out).unwrap();
    match d.decode_rgb8(&no_dqt, &mut out) {
        Err(CodecError::Corrupt { reason, .. }) => {
            assert!(reason.contains("Quantization table"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_failed_jpeg_does_not_affect_the_next() {
    let (w, h) = (32, 24);
    let jpeg = images::jpeg_rgb(&images::photo(w, h, 21), w, h, &JpegOpts::default());
    let want = decode(&jpeg).unwrap().1;
    let mut d = decoder();
    let mut out = Vec::new();
    // Cut inside the headers (tj3DecompressHeader fails), inside the scan (tj3Decompress8
    // fails), and a lying SOF (our limit check fails).
    let sos = images::find_marker(&jpeg, 0xDA).unwrap();
    let broken = [
        jpeg[..sos / 2].to_vec(),
        jpeg[..jpeg.len() - 40].to_vec(),
        images::with_sof_size(&jpeg, 60_000, 60_000),
    ];
    for bad in &broken {
        assert!(d.decode_rgb8(bad, &mut out).is_err());
        d.decode_rgb8(&jpeg, &mut out).unwrap();
        assert_eq!(out, want);
        let _ = d.probe(bad); // fails for the header cut and the lying SOF
        assert_eq!(d.probe(&jpeg).unwrap().width, w);
    }
}

// ---------------------------------------------------------------------------------------------
// PNG and the other formats

#[test]
fn png_8bit_colour_types() {
    let (w, h) = (5u32, 3u32);
    let rgb = images::photo(w, h, 8);
    let gray: Vec<u8> = rgb.chunks(3).map(|p| p[1]).collect();
    let gray_rgb: Vec<u8> = gray.iter().flat_map(|&g| [g, g, g]).collect();
    let rgba: Vec<u8> = rgb
        .chunks(3)
        .enumerate()
        .flat_map(|(i, p)| [p[0], p[1], p[2], (i * 17) as u8])
        .collect();
    let gray_alpha: Vec<u8> = gray.iter().flat_map(|&g| [g, 255 - g]).collect();

    let cases: [(&str, Vec<u8>, ColorKind, &Vec<u8>); 4] = [
        ("rgb", images::png(w, h, 8, 2, &rgb, &[]), ColorKind::Rgb, &rgb),
        ("rgba", images::png(w, h, 8, 6, &rgba, &[]), ColorKind::Rgba, &rgb),
        ("gray", images::png(w, h, 8, 0, &gray, &[]), ColorKind::Gray, &gray_rgb),
        (
            "gray+alpha",
            images::png(w, h, 8, 4, &gray_alpha, &[]),
            ColorKind::GrayAlpha,
            &gray_rgb,
        ),
    ];
    for (name, png, color, want) in cases {
        let (d, out) = decode(&png).unwrap();
        assert_eq!(d.info.format, Format::Png, "{name}");
        assert_eq!((d.info.color, d.info.bits_per_channel), (color, 8), "{name}");
        assert_eq!(&out, want, "{name}");
    }
}

#[test]
fn png_palette_and_low_depth() {
    // 4x2, 2-bit palette indices: row 0 = 0 1 2 3, row 1 = 3 2 1 0.
    let palette = vec![255, 0, 0, 0, 255, 0, 0, 0, 255, 9, 8, 7];
    let rows = [0b00_01_10_11u8, 0b11_10_01_00];
    let png = images::png(4, 2, 2, 3, &rows, &[(b"PLTE", palette.clone())]);
    let (d, out) = decode(&png).unwrap();
    assert_eq!((d.width, d.height, d.info.color), (4, 2, ColorKind::Rgb));
    let px = |i: usize| &palette[i * 3..i * 3 + 3];
    let want: Vec<u8> = [0, 1, 2, 3, 3, 2, 1, 0].iter().flat_map(|&i| px(i).to_vec()).collect();
    assert_eq!(out, want);

    // 1-bit grey: 0 → black, 1 → white.
    let png = images::png(8, 1, 1, 0, &[0b1010_0001], &[]);
    let (_, out) = decode(&png).unwrap();
    let want: Vec<u8> = [1, 0, 1, 0, 0, 0, 0, 1].iter().flat_map(|&b| [b * 255; 3]).collect();
    assert_eq!(out, want);
}

#[test]
fn png_16bit_rounds_to_8bit() {
    // Rounded, not truncated: truncation (`v >> 8`) would give [0, 0, 1, 128, 255, 255].
    let samples: [u16; 6] = [0, 0x00FF, 0x01FF, 0x8000, 0xFF00, 0xFFFF];
    let want8: Vec<u8> = samples.iter().map(|&v| ((u32::from(v) + 128) / 257) as u8).collect();
    assert_eq!(want8, [0, 1, 2, 128, 254, 255]);
    let be: Vec<u8> = samples.iter().flat_map(|v| v.to_be_bytes()).collect();

    // RGB16: two pixels.
    let (d, out) = decode(&images::png(2, 1, 16, 2, &be, &[])).unwrap();
    assert_eq!((d.info.color, d.info.bits_per_channel), (ColorKind::Rgb, 16));
    assert_eq!(out, want8);
    // Grey16: six pixels, replicated.
    let (d, out) = decode(&images::png(6, 1, 16, 0, &be, &[])).unwrap();
    assert_eq!((d.info.color, d.info.bits_per_channel), (ColorKind::Gray, 16));
    assert_eq!(out, want8.iter().flat_map(|&g| [g; 3]).collect::<Vec<_>>());
    // RGBA16: alpha dropped.
    let rgba: Vec<u8> = be[..6]
        .iter()
        .chain(&[0xAB, 0xCD])
        .chain(&be[6..])
        .chain(&[0, 0])
        .copied()
        .collect();
    let (_, out) = decode(&images::png(2, 1, 16, 6, &rgba, &[])).unwrap();
    assert_eq!(out, want8);
}

#[test]
fn png_exif_orientation_is_applied() {
    let (w, h) = (3u32, 2u32);
    let rgb = images::photo(w, h, 9);
    let png = images::png(w, h, 8, 2, &rgb, &[(b"eXIf", images::exif_tiff(6, false))]);
    let (d, out) = decode(&png).unwrap();
    assert_eq!((d.info.orientation, d.width, d.height), (6, 2, 3));
    // Rotated 90° clockwise: output (x, y) is source (y, h - 1 - x).
    for y in 0..3usize {
        for x in 0..2usize {
            let s = ((1 - x) * 3 + y) * 3;
            assert_eq!(&out[(y * 2 + x) * 3..][..3], &rgb[s..s + 3]);
        }
    }
}

#[test]
fn png_header_claiming_100000_squared_is_too_large_without_allocating() {
    let png = images::png_huge_header(100_000, 100_000);
    let mut d = decoder();
    let mut out = Vec::new();
    let start = Instant::now();
    for r in [d.probe(&png).map(|_| ()), d.decode_rgb8(&png, &mut out).map(|_| ())] {
        match r {
            Err(
                e @ CodecError::TooLarge {
                    width: 100_000,
                    height: 100_000,
                    ..
                },
            ) => {
                assert!(e.to_string().contains("--max-pixels"))
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(start.elapsed() < Duration::from_millis(200), "{:?}", start.elapsed());
    assert_eq!(out.capacity(), 0);
    // Only the IHDR is needed: the same header cut right after it.
    assert!(matches!(d.probe(&png[..33]), Err(CodecError::TooLarge { .. })));
}

#[test]
fn bmp_header_claiming_60000_squared_is_too_large() {
    let mut out = Vec::new();
    let bmp = images::bmp_huge_header(60_000, -60_000);
    let r = decoder().decode_rgb8(&bmp, &mut out);
    assert!(
        matches!(
            r,
            Err(CodecError::TooLarge {
                width: 60_000,
                height: 60_000,
                ..
            })
        ),
        "{r:?}"
    );
    // The BMP decoder refuses sides over 65535 on its own, before our check.
    let bmp = images::bmp_huge_header(100_000, -100_000);
    let r = decoder().decode_rgb8(&bmp, &mut out);
    assert!(
        matches!(
            r,
            Err(CodecError::Corrupt {
                format: Format::Bmp,
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(out.capacity(), 0);
}

#[test]
fn other_formats_decode_to_their_pixels() {
    let (w, h) = (13u32, 7u32);
    let rgb = images::photo(w, h, 10);
    for (format, want) in [
        (ImageFormat::Bmp, Format::Bmp),
        (ImageFormat::Tiff, Format::Tiff),
        (ImageFormat::WebP, Format::Webp),
        (ImageFormat::Pnm, Format::Pnm),
        (ImageFormat::Png, Format::Png),
    ] {
        let data = images::encode_with_image(&rgb, w, h, format);
        assert_eq!(sniff(&data), Some(want));
        let (d, out) = decode(&data).unwrap_or_else(|e| panic!("{want}: {e}"));
        assert_eq!((d.info.format, d.width, d.height), (want, w, h));
        assert_eq!(out, rgb, "{want} is lossless");
    }
}

#[test]
fn gif_decodes_its_first_frame() {
    let gif = images::gif_two_frames(6, 4, [250, 10, 10], [10, 10, 250]);
    let (d, out) = decode(&gif).unwrap();
    assert_eq!((d.info.format, d.width, d.height), (Format::Gif, 6, 4));
    for px in out.chunks(3) {
        assert!(px[0] > 200 && px[2] < 50, "{px:?}");
    }
}

#[test]
fn content_decides_not_the_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("really-a-png.jpg");
    let rgb = images::photo(4, 4, 11);
    std::fs::write(&path, images::png(4, 4, 8, 2, &rgb, &[])).unwrap();
    let (d, out) = decode(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(d.info.format, Format::Png);
    assert_eq!(out, rgb);
}

#[test]
fn empty_and_unknown_inputs() {
    assert!(matches!(decode(&[]), Err(CodecError::Empty)));
    let mut rng = Rng::new(12);
    for _ in 0..50 {
        let mut junk = rng.bytes(256);
        junk[0] = 0x00; // no signature starts with NUL
        match decode(&junk) {
            Err(CodecError::UnknownFormat { head }) => assert_eq!(head.len(), 16 * 3 - 1),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn corrupt_png_reports_the_reason() {
    let rgb = images::photo(8, 8, 13);
    let png = images::png(8, 8, 8, 2, &rgb, &[]);
    let mut bad = png.clone();
    let idat = bad.windows(4).position(|w| w == b"IDAT").unwrap();
    bad[idat + 10] ^= 0xFF; // breaks the CRC
    for data in [&bad[..], &png[..png.len() - 20], &png[..40]] {
        match decode(data) {
            Err(CodecError::Corrupt {
                format: Format::Png,
                reason,
            }) => assert!(!reason.is_empty()),
            other => panic!("{other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Re-encoding

fn reencode(d: &mut Decoder, data: &[u8], max_side: u32, quality: u8) -> (Decoded, Vec<u8>) {
    let mut out = Vec::new();
    let r = d
        .reencode_jpeg(data, &Reencode { max_side, quality }, &mut out)
        .unwrap();
    (r, out)
}

#[test]
fn reencode_fits_keeps_aspect_and_never_upscales() {
    let mut d = decoder();
    for (w, h, max_side) in [
        (400, 300, 128),
        (300, 400, 128),
        (1000, 7, 100),
        (64, 48, 512),
        (64, 48, 64),
        (33, 1, 8),
    ] {
        let src = images::jpeg_rgb(&images::photo(w, h, 14), w, h, &JpegOpts::default());
        let (r, out) = reencode(&mut d, &src, max_side, 85);
        assert!(r.width.max(r.height) <= max_side, "{w}x{h} → {}x{}", r.width, r.height);
        assert!(r.width <= w && r.height <= h, "never upscaled");
        if w.max(h) <= max_side {
            assert_eq!((r.width, r.height), (w, h));
        }
        // Aspect ratio within one pixel: compare h' against w' * h / w.
        let ideal = f64::from(r.width) * f64::from(h) / f64::from(w);
        assert!(
            (f64::from(r.height) - ideal).abs() <= 1.0,
            "{w}x{h} → {}x{}",
            r.width,
            r.height
        );

        // The output decodes, as a baseline 4:2:0 JPEG of the reported size.
        let header = turbojpeg::read_header(&out).unwrap();
        assert_eq!((header.width, header.height), (r.width as usize, r.height as usize));
        assert!(!header.is_progressive && !header.is_arithmetic);
        assert_eq!(header.subsamp, Subsamp::Sub2x2);
        assert!(
            out[2..].starts_with(&[0xFF, 0xE0]) && images::find_marker(&out, 0xC0).is_some(),
            "SOF0"
        );
        let (again, _) = decode(&out).unwrap();
        assert_eq!((again.width, again.height), (r.width, r.height));
    }
}

#[test]
fn reencode_applies_orientation_and_accepts_any_format() {
    let (w, h) = (60, 20);
    let rgb = images::photo(w, h, 15);
    let jpeg = images::with_exif(&images::jpeg_rgb(&rgb, w, h, &JpegOpts::default()), 8, true);
    let (r, _) = reencode(&mut decoder(), &jpeg, 30, 90);
    assert_eq!((r.width, r.height), (10, 30));
    let png = images::png(w, h, 8, 2, &rgb, &[]);
    let (r, out) = reencode(&mut decoder(), &png, 30, 90);
    assert_eq!((r.info.format, r.width, r.height), (Format::Png, 30, 10));
    assert_eq!(sniff(&out), Some(Format::Jpeg));
}

#[test]
fn reencode_is_deterministic_across_calls_and_threads() {
    let (w, h) = (301, 203);
    let jpeg = images::jpeg_rgb(
        &images::photo(w, h, 16),
        w,
        h,
        &JpegOpts {
            progressive: true,
            ..JpegOpts::default()
        },
    );
    let png = images::png(w, h, 8, 2, &images::photo(w, h, 17), &[]);
    let run = |data: Vec<u8>| {
        std::thread::spawn(move || {
            let mut d = decoder();
            let (_, a) = reencode(&mut d, &data, 128, 80);
            let (_, b) = reencode(&mut d, &data, 128, 80);
            assert_eq!(a, b, "same decoder, two calls");
            a
        })
    };
    for data in [jpeg, png] {
        let (t1, t2) = (run(data.clone()), run(data.clone()));
        let (a, b) = (t1.join().unwrap(), t2.join().unwrap());
        assert_eq!(a, b, "two decoders on two threads");
        let (_, c) = reencode(&mut decoder(), &data, 128, 80);
        assert_eq!(a, c);
    }
}

#[test]
fn reencode_quality_changes_size() {
    let (w, h) = (200, 150);
    let jpeg = images::jpeg_rgb(
        &images::photo(w, h, 18),
        w,
        h,
        &JpegOpts {
            quality: 98,
            ..JpegOpts::default()
        },
    );
    let mut d = decoder();
    let (_, low) = reencode(&mut d, &jpeg, 1000, 30);
    let (_, high) = reencode(&mut d, &jpeg, 1000, 95);
    assert!(low.len() < high.len(), "{} vs {}", low.len(), high.len());
}

// ---------------------------------------------------------------------------------------------
// No input panics

/// Runs every entry point on `data`; only panics matter (an error is fine).
fn exercise(d: &mut Decoder, data: &[u8]) {
    let mut out = Vec::new();
    let probed = d.probe(data);
    let decoded = d.decode_rgb8(data, &mut out);
    if let Ok(dec) = &decoded {
        assert_eq!(out.len(), dec.width as usize * dec.height as usize * 3);
        assert!(probed.is_ok(), "decodes but does not probe: {probed:?}");
    }
    let _ = d.reencode_jpeg(
        data,
        &Reencode {
            max_side: 16,
            quality: 75,
        },
        &mut out,
    );
}

fn small_limits_decoder() -> Decoder {
    // Small enough that a mutated header cannot make a test slow.
    Decoder::new(Limits { max_pixels: 1 << 16 }).unwrap()
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let (w, h) = (24, 16);
    let rgb = images::photo(w, h, 19);
    let base = JpegOpts::default();
    vec![
        (
            "jpeg",
            images::with_exif(&images::jpeg_rgb(&rgb, w, h, &base), 6, false),
        ),
        (
            "jpeg progressive",
            images::jpeg_rgb(
                &rgb,
                w,
                h,
                &JpegOpts {
                    progressive: true,
                    ..base
                },
            ),
        ),
        (
            "jpeg arithmetic",
            images::jpeg_rgb(
                &rgb,
                w,
                h,
                &JpegOpts {
                    arithmetic: true,
                    ..base
                },
            ),
        ),
        ("jpeg cmyk", images::jpeg_cmyk(&images::cmyk_content(w, h), w, h, true)),
        (
            "png",
            images::png(w, h, 8, 2, &rgb, &[(b"eXIf", images::exif_tiff(3, true))]),
        ),
        ("png16", images::png(4, 2, 16, 6, &Rng::new(20).bytes(64), &[])),
        ("gif", images::gif_two_frames(4, 4, [1, 2, 3], [4, 5, 6])),
        ("bmp", images::encode_with_image(&rgb, w, h, ImageFormat::Bmp)),
        ("tiff", images::encode_with_image(&rgb, w, h, ImageFormat::Tiff)),
        ("webp", images::encode_with_image(&rgb, w, h, ImageFormat::WebP)),
        ("pnm", images::encode_with_image(&rgb, w, h, ImageFormat::Pnm)),
    ]
}

#[test]
fn every_seed_decodes_and_every_prefix_fails_cleanly() {
    let mut d = small_limits_decoder();
    let mut out = Vec::new();
    for (name, data) in seeds() {
        d.decode_rgb8(&data, &mut out).unwrap_or_else(|e| panic!("{name}: {e}"));
        for cut in 0..data.len() {
            exercise(&mut d, &data[..cut]);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        exercise(&mut small_limits_decoder(), &data);
    }

    #[test]
    fn arbitrary_bytes_behind_a_signature_never_panic(
        which in 0usize..7,
        tail in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let heads: [&[u8]; 7] = [
            b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR", b"GIF89a", b"BM",
            b"II*\0", b"RIFF\0\0\0\0WEBPVP8 ", b"P6\n",
        ];
        let mut data = heads[which].to_vec();
        data.extend_from_slice(&tail);
        exercise(&mut small_limits_decoder(), &data);
    }

    #[test]
    fn mutated_images_never_panic(
        which in 0usize..11,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let seeds = seeds_cached();
        let mut data = seeds[which % seeds.len()].1.clone();
        for (at, byte) in edits {
            let i = at.index(data.len());
            data[i] = byte;
        }
        if truncate {
            data.truncate(cut.index(data.len() + 1));
        }
        exercise(&mut small_limits_decoder(), &data);
    }
}

fn seeds_cached() -> &'static [(&'static str, Vec<u8>)] {
    static SEEDS: std::sync::OnceLock<Vec<(&'static str, Vec<u8>)>> = std::sync::OnceLock::new();
    SEEDS.get_or_init(seeds)
}
