//! Test images generated from a seed: JPEG through libjpeg-turbo's safe wrapper, PNG and BMP
//! built by hand (so we control bit depth, palette, interlace and lying headers), the rest
//! through the `image` crate's encoders. No binary fixtures.

use std::io::Cursor;

use turbojpeg::{Colorspace, Compressor, Image, PixelFormat, Subsamp};

/// splitmix64: tiny, seedable, good enough for test data.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// A photo-like RGB8 image: smooth, asymmetric gradients (so every rotation differs) plus a
/// little seeded noise.
pub(crate) fn photo(w: u32, h: u32, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut v = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            let n = (rng.next_u64() % 9) as i32 - 4;
            let r = (x * 200 / w.max(1)) as i32 + 20 + n;
            let g = (y * 180 / h.max(1)) as i32 + 40 - n;
            let b = ((x + 2 * y) * 255 / (w + 2 * h).max(1)) as i32;
            v.extend_from_slice(&[r.clamp(0, 255) as u8, g.clamp(0, 255) as u8, b.clamp(0, 255) as u8]);
        }
    }
    v
}

/// How to encode a test JPEG.
#[derive(Clone, Copy, Debug)]
pub(crate) struct JpegOpts {
    pub(crate) quality: i32,
    pub(crate) subsamp: Subsamp,
    pub(crate) progressive: bool,
    pub(crate) arithmetic: bool,
    pub(crate) optimize: bool,
    pub(crate) lossless: bool,
}

impl Default for JpegOpts {
    fn default() -> Self {
        JpegOpts {
            quality: 90,
            subsamp: Subsamp::Sub2x2,
            progressive: false,
            arithmetic: false,
            optimize: false,
            lossless: false,
        }
    }
}

fn compressor(o: &JpegOpts) -> Compressor {
    let mut c = Compressor::new().unwrap();
    c.set_quality(o.quality).unwrap();
    c.set_subsamp(o.subsamp).unwrap();
    c.set_progressive(o.progressive).unwrap();
    c.set_arithmetic(o.arithmetic).unwrap();
    c.set_optimize(o.optimize).unwrap();
    c.set_lossless(o.lossless).unwrap();
    c
}

/// Encodes packed RGB8.
pub(crate) fn jpeg_rgb(rgb: &[u8], w: u32, h: u32, o: &JpegOpts) -> Vec<u8> {
    let img = Image {
        pixels: rgb,
        width: w as usize,
        pitch: w as usize * 3,
        height: h as usize,
        format: PixelFormat::RGB,
    };
    compressor(o).compress_to_vec(img).unwrap()
}

/// Encodes 8-bit grey.
pub(crate) fn jpeg_gray(gray: &[u8], w: u32, h: u32) -> Vec<u8> {
    let o = JpegOpts {
        subsamp: Subsamp::Gray,
        ..JpegOpts::default()
    };
    let img = Image {
        pixels: gray,
        width: w as usize,
        pitch: w as usize,
        height: h as usize,
        format: PixelFormat::GRAY,
    };
    compressor(&o).compress_to_vec(img).unwrap()
}

/// Encodes packed CMYK (4:4:4, quality 100) as YCCK (`ycck`) or plain CMYK. libjpeg-turbo
/// writes an Adobe APP14 marker and stores the samples as given.
pub(crate) fn jpeg_cmyk(cmyk: &[u8], w: u32, h: u32, ycck: bool) -> Vec<u8> {
    let o = JpegOpts {
        quality: 100,
        subsamp: Subsamp::None,
        ..JpegOpts::default()
    };
    let mut c = compressor(&o);
    c.set_colorspace(if ycck { Colorspace::YCCK } else { Colorspace::CMYK })
        .unwrap();
    let img = Image {
        pixels: cmyk,
        width: w as usize,
        pitch: w as usize * 4,
        height: h as usize,
        format: PixelFormat::CMYK,
    };
    c.compress_to_vec(img).unwrap()
}

/// Smooth CMYK test content.
pub(crate) fn cmyk_content(w: u32, h: u32) -> Vec<u8> {
    let mut v = Vec::new();
    for y in 0..h {
        for x in 0..w {
            v.extend_from_slice(&[
                (x * 255 / w) as u8,
                (y * 255 / h) as u8,
                ((x + y) * 255 / (w + h)) as u8,
                (64 + (x * 191) / w) as u8,
            ]);
        }
    }
    v
}

/// A TIFF structure holding only IFD0 tag 0x0112 = `orientation`.
pub(crate) fn exif_tiff(orientation: u16, little: bool) -> Vec<u8> {
    let w16 = |v: u16| {
        if little { v.to_le_bytes() } else { v.to_be_bytes() }
    };
    let w32 = |v: u32| {
        if little { v.to_le_bytes() } else { v.to_be_bytes() }
    };
    let mut t = Vec::new();
    t.extend_from_slice(if little { b"II" } else { b"MM" });
    t.extend_from_slice(&w16(42));
    t.extend_from_slice(&w32(8));
    t.extend_from_slice(&w16(1));
    t.extend_from_slice(&w16(0x0112));
    t.extend_from_slice(&w16(3));
    t.extend_from_slice(&w32(1));
    t.extend_from_slice(&w16(orientation));
    t.extend_from_slice(&w16(0));
    t.extend_from_slice(&w32(0));
    t
}

/// `jpeg` with an APP1 `Exif` segment carrying `orientation` inserted right after SOI.
pub(crate) fn with_exif(jpeg: &[u8], orientation: u16, little: bool) -> Vec<u8> {
    let mut payload = b"Exif\0\0".to_vec();
    payload.extend_from_slice(&exif_tiff(orientation, little));
    let mut out = jpeg[..2].to_vec();
    out.extend_from_slice(&[0xFF, 0xE1]);
    out.extend_from_slice(&((payload.len() + 2) as u16).to_be_bytes());
    out.extend_from_slice(&payload);
    out.extend_from_slice(&jpeg[2..]);
    out
}

/// The offset of the first `FF marker` segment in `jpeg` (before the first SOS).
pub(crate) fn find_marker(jpeg: &[u8], marker: u8) -> Option<usize> {
    let mut pos = 2;
    while pos + 4 <= jpeg.len() && jpeg[pos] == 0xFF {
        let m = jpeg[pos + 1];
        if m == marker {
            return Some(pos);
        }
        if m == 0xDA {
            return None;
        }
        pos += 2 + usize::from(u16::from_be_bytes([jpeg[pos + 2], jpeg[pos + 3]]));
    }
    None
}

/// `jpeg` without any segment of type `marker` before the first scan.
pub(crate) fn strip_segments(jpeg: &[u8], marker: u8) -> Vec<u8> {
    let mut out = jpeg.to_vec();
    while let Some(at) = find_marker(&out, marker) {
        let len = 2 + usize::from(u16::from_be_bytes([out[at + 2], out[at + 3]]));
        out.drain(at..at + len);
    }
    out
}

/// `jpeg` with its SOF claiming `w`×`h`.
pub(crate) fn with_sof_size(jpeg: &[u8], w: u16, h: u16) -> Vec<u8> {
    let at = (0xC0..=0xC2).find_map(|m| find_marker(jpeg, m)).expect("SOF");
    let mut out = jpeg.to_vec();
    out[at + 5..at + 7].copy_from_slice(&h.to_be_bytes());
    out[at + 7..at + 9].copy_from_slice(&w.to_be_bytes());
    out
}

// ---------------------------------------------------------------------------------------------
// PNG, by hand.

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &x in data {
        a = (a + u32::from(x)) % 65521;
        b = (b + a) % 65521;
    }
    (b << 16) | a
}

/// zlib stream of stored (uncompressed) deflate blocks.
fn zlib_stored(data: &[u8]) -> Vec<u8> {
    let mut z = vec![0x78, 0x01];
    let mut chunks = data.chunks(65_535).peekable();
    if chunks.peek().is_none() {
        z.extend_from_slice(&[1, 0, 0, 0xFF, 0xFF]);
    }
    while let Some(c) = chunks.next() {
        z.push(u8::from(chunks.peek().is_none()));
        z.extend_from_slice(&(c.len() as u16).to_le_bytes());
        z.extend_from_slice(&(!(c.len() as u16)).to_le_bytes());
        z.extend_from_slice(c);
    }
    z.extend_from_slice(&adler32(data).to_be_bytes());
    z
}

pub(crate) fn png_chunk(out: &mut Vec<u8>, kind: &[u8; 4], body: &[u8]) {
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(body);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

pub(crate) const PNG_SIG: &[u8] = b"\x89PNG\r\n\x1a\n";

pub(crate) fn ihdr(w: u32, h: u32, depth: u8, color_type: u8) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&w.to_be_bytes());
    b.extend_from_slice(&h.to_be_bytes());
    b.extend_from_slice(&[depth, color_type, 0, 0, 0]);
    b
}

/// A PNG of `rows` (raw scanlines without the filter byte; 16-bit samples big-endian).
/// `color_type`: 0 grey, 2 RGB, 3 palette, 4 grey+alpha, 6 RGBA. `extra` chunks go before IDAT.
pub(crate) fn png(w: u32, h: u32, depth: u8, color_type: u8, rows: &[u8], extra: &[(&[u8; 4], Vec<u8>)]) -> Vec<u8> {
    let stride = rows.len() / h as usize;
    let mut raw = Vec::with_capacity(rows.len() + h as usize);
    for row in rows.chunks(stride) {
        raw.push(0); // filter: none
        raw.extend_from_slice(row);
    }
    let mut out = PNG_SIG.to_vec();
    png_chunk(&mut out, b"IHDR", &ihdr(w, h, depth, color_type));
    for (kind, body) in extra {
        png_chunk(&mut out, kind, body);
    }
    png_chunk(&mut out, b"IDAT", &zlib_stored(&raw));
    png_chunk(&mut out, b"IEND", &[]);
    out
}

/// A PNG that is only a signature, an IHDR claiming `w`×`h` RGB8 (valid CRC), a tiny IDAT
/// that could never hold that image, and IEND.
pub(crate) fn png_huge_header(w: u32, h: u32) -> Vec<u8> {
    let mut out = PNG_SIG.to_vec();
    png_chunk(&mut out, b"IHDR", &ihdr(w, h, 8, 2));
    png_chunk(&mut out, b"IDAT", &zlib_stored(&[0, 1, 2, 3]));
    png_chunk(&mut out, b"IEND", &[]);
    out
}

/// A BMP header (BITMAPINFOHEADER, 24-bit) claiming `w`×`h`, followed by a few pixel bytes.
pub(crate) fn bmp_huge_header(w: i32, h: i32) -> Vec<u8> {
    let mut b = b"BM".to_vec();
    b.extend_from_slice(&(54u32 + 16).to_le_bytes()); // file size (a lie is fine)
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&54u32.to_le_bytes()); // pixel data offset
    b.extend_from_slice(&40u32.to_le_bytes());
    b.extend_from_slice(&w.to_le_bytes());
    b.extend_from_slice(&h.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&24u16.to_le_bytes());
    b.extend_from_slice(&[0; 24]);
    b.extend_from_slice(&[0x7F; 16]);
    b
}

/// Encodes RGB8 with the `image` crate's encoder for `format`.
pub(crate) fn encode_with_image(rgb: &[u8], w: u32, h: u32, format: image::ImageFormat) -> Vec<u8> {
    let img = image::RgbImage::from_raw(w, h, rgb.to_vec()).unwrap();
    let mut out = Cursor::new(Vec::new());
    image::DynamicImage::ImageRgb8(img).write_to(&mut out, format).unwrap();
    out.into_inner()
}

/// A two-frame GIF: a solid `first` frame, then a solid `second` one.
pub(crate) fn gif_two_frames(w: u32, h: u32, first: [u8; 3], second: [u8; 3]) -> Vec<u8> {
    use image::codecs::gif::GifEncoder;
    use image::{Delay, Frame, Rgba, RgbaImage};
    let frame = |c: [u8; 3]| {
        Frame::from_parts(
            RgbaImage::from_pixel(w, h, Rgba([c[0], c[1], c[2], 255])),
            0,
            0,
            Delay::from_numer_denom_ms(100, 1),
        )
    };
    let mut out = Vec::new();
    {
        let mut enc = GifEncoder::new(&mut out);
        enc.encode_frames([frame(first), frame(second)]).unwrap();
    }
    out
}

/// `jpeg` rewritten losslessly by libjpeg-turbo (`tj3Transform`, no transform) with a restart
/// marker every `blocks` MCUs, or every `rows` MCU rows when `rows > 0`: any interval, also
/// those `Decoder::add_restarts` would never choose (and those restart cuts cannot use).
pub(crate) fn restarted(jpeg: &[u8], blocks: i32, rows: i32) -> Vec<u8> {
    use std::ffi::c_int;
    use turbojpeg::raw;
    // SAFETY: one handle from tj3Init, used only here and destroyed at the end; `jpeg` is
    // readable for its length; libjpeg-turbo allocates the output (NULL `dst`), which is
    // copied out and freed with tj3Free exactly once.
    unsafe {
        let h = raw::tj3Init(raw::TJINIT_TJINIT_TRANSFORM as c_int);
        assert!(!h.is_null());
        let set = |p: raw::TJPARAM, v: c_int| assert_eq!(raw::tj3Set(h, p as c_int, v), 0);
        if rows > 0 {
            set(raw::TJPARAM_TJPARAM_RESTARTROWS, rows);
        } else {
            set(raw::TJPARAM_TJPARAM_RESTARTBLOCKS, blocks);
        }
        assert_eq!(raw::tj3DecompressHeader(h, jpeg.as_ptr(), jpeg.len() as raw::size_t), 0);
        let t = raw::tjtransform {
            r: raw::tjregion { x: 0, y: 0, w: 0, h: 0 },
            op: raw::TJXOP_TJXOP_NONE as c_int,
            options: 0,
            data: std::ptr::null_mut(),
            customFilter: None,
        };
        let (mut dst, mut size): (*mut u8, raw::size_t) = (std::ptr::null_mut(), 0);
        let rc = raw::tj3Transform(h, jpeg.as_ptr(), jpeg.len() as raw::size_t, 1, &mut dst, &mut size, &t);
        assert_eq!(rc, 0);
        let out = std::slice::from_raw_parts(dst, size as usize).to_vec();
        raw::tj3Free(dst.cast());
        raw::tj3Destroy(h);
        out
    }
}
