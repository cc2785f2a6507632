//! Seeded test data for ringfeed's tests, examples and benchmarks, in one place: the same seed
//! gives the same bytes on every run and platform, so a failure can be replayed and a benchmark
//! compared with an earlier one.
//!
//! Two pictures, for two purposes:
//!
//! - [`picture`]: smooth gradients plus a little noise, any channel count. What the correctness
//!   tests decode and compare (`crates/ringfeed/tests/it`), and what [`jpeg`], [`gray_jpeg`],
//!   [`cmyk_jpeg`], [`png`] and [`png16`] encode.
//! - [`photo`]: RGB gradients, a hard-edged disc and noise, about 3 bits per pixel as a
//!   quality-90 JPEG: entropy-heavy like real photos, for the speed and allocation measurements
//!   (`benches/benches/pipeline.rs`, `crates/ringfeed/examples/ops_throughput.rs`, `crates/ringfeed/tests/alloc.rs`).
//!   [`photo_jpeg`] encodes it.
//!
//! Plus [`png_claiming`], a PNG header claiming any size (a decompression bomb's calling card).
//!
//! Everything panics on failure: it is test support, and an encoder error is a broken test.

/// splitmix64: a tiny seeded generator, so test data is the same on every run and platform.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits. Not `Iterator::next`: the generator never ends, and the tests
    /// call it by this name.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }

    /// A uniform number in `[0, 1)`, from the top 24 bits.
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Pixels of a smooth, seeded test picture: gradients plus a little noise, so JPEGs of it have
/// realistic structure.
pub fn picture(w: usize, h: usize, channels: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    let base: Vec<u64> = (0..channels).map(|_| rng.next() % 256).collect();
    let mut px = Vec::with_capacity(w * h * channels);
    for y in 0..h {
        for x in 0..w {
            for (c, b) in base.iter().enumerate() {
                let v = b + (x * (c + 1) + y * (3 - c.min(2))) as u64 + rng.next() % 9;
                px.push((v % 256) as u8);
            }
        }
    }
    px
}

/// A baseline 4:2:0 JPEG.
pub fn jpeg(w: usize, h: usize, seed: u64) -> Vec<u8> {
    let px = picture(w, h, 3, seed);
    let img = turbojpeg::Image {
        pixels: &px[..],
        width: w,
        pitch: w * 3,
        height: h,
        format: turbojpeg::PixelFormat::RGB,
    };
    turbojpeg::compress(img, 90, turbojpeg::Subsamp::Sub2x2)
        .unwrap()
        .to_vec()
}

/// A grayscale JPEG.
pub fn gray_jpeg(w: usize, h: usize, seed: u64) -> Vec<u8> {
    let px = picture(w, h, 1, seed);
    let img = turbojpeg::Image {
        pixels: &px[..],
        width: w,
        pitch: w,
        height: h,
        format: turbojpeg::PixelFormat::GRAY,
    };
    turbojpeg::compress(img, 90, turbojpeg::Subsamp::Gray).unwrap().to_vec()
}

/// A CMYK (YCCK) JPEG, as Adobe tools write them.
pub fn cmyk_jpeg(w: usize, h: usize, seed: u64) -> Vec<u8> {
    let px = picture(w, h, 4, seed);
    let img = turbojpeg::Image {
        pixels: &px[..],
        width: w,
        pitch: w * 4,
        height: h,
        format: turbojpeg::PixelFormat::CMYK,
    };
    turbojpeg::compress(img, 90, turbojpeg::Subsamp::None).unwrap().to_vec()
}

/// An 8-bit RGB PNG.
pub fn png(w: u32, h: u32, seed: u64) -> Vec<u8> {
    let px = picture(w as usize, h as usize, 3, seed);
    let mut out = Vec::new();
    image::ImageEncoder::write_image(
        image::codecs::png::PngEncoder::new(&mut out),
        &px,
        w,
        h,
        image::ExtendedColorType::Rgb8,
    )
    .unwrap();
    out
}

/// A 16-bit RGBA PNG.
pub fn png16(w: u32, h: u32, seed: u64) -> Vec<u8> {
    let px = picture(w as usize, h as usize, 8, seed);
    let mut out = Vec::new();
    image::ImageEncoder::write_image(
        image::codecs::png::PngEncoder::new(&mut out),
        &px,
        w,
        h,
        image::ExtendedColorType::Rgba16,
    )
    .unwrap();
    out
}

/// CRC-32 (IEEE), as PNG chunks use it.
fn crc32_ieee(bytes: &[u8]) -> u32 {
    let mut c = 0xFFFF_FFFFu32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
        }
    }
    !c
}

/// A PNG whose header claims `w` x `h` pixels, with valid chunk CRCs and almost no data: a
/// decompression bomb's calling card.
pub fn png_claiming(w: u32, h: u32) -> Vec<u8> {
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let chunk = |out: &mut Vec<u8>, kind: &[u8], data: &[u8]| {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        out.extend_from_slice(&body);
        out.extend_from_slice(&crc32_ieee(&body).to_be_bytes());
    };
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01]);
    chunk(&mut out, b"IEND", &[]);
    out
}

/// A photo-like RGB picture: gradients, a hard-edged disc of radius 90 centred at (250, 190)
/// (where a 500x375 picture has its middle; it stays there at other sizes), and xorshift noise.
/// The seed also shifts the blue channel, so pictures of different seeds differ everywhere.
pub fn photo(w: usize, h: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut px = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let noise = (state % 24) as usize;
            let disc = ((x as i64 - 250).pow(2) + (y as i64 - 190).pow(2) < 90 * 90) as usize * 80;
            px.push(((x + noise + disc) % 256) as u8);
            px.push(((y * 2 + noise) % 256) as u8);
            px.push(((x + y + disc + seed as usize * 7) % 256) as u8);
        }
    }
    px
}

/// [`photo`] as a quality-90 JPEG with the given chroma subsampling (`Gray` gives a grayscale
/// JPEG of the same picture).
pub fn photo_jpeg(w: usize, h: usize, seed: u64, subsamp: turbojpeg::Subsamp) -> Vec<u8> {
    let px = photo(w, h, seed);
    let img = turbojpeg::Image {
        pixels: &px[..],
        width: w,
        pitch: w * 3,
        height: h,
        format: turbojpeg::PixelFormat::RGB,
    };
    turbojpeg::compress(img, 90, subsamp).expect("encodes").to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_bytes_and_another_seed_others() {
        assert_eq!(picture(33, 17, 3, 5), picture(33, 17, 3, 5));
        assert_ne!(picture(33, 17, 3, 5), picture(33, 17, 3, 6));
        assert_eq!(
            photo_jpeg(64, 48, 1, turbojpeg::Subsamp::Sub2x2),
            photo_jpeg(64, 48, 1, turbojpeg::Subsamp::Sub2x2)
        );
        assert_ne!(photo(64, 48, 1), photo(64, 48, 2));
        // splitmix64's first output for seed 0, as published with the algorithm.
        assert_eq!(Rng(0).next(), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn encoded_pictures_decode_to_their_size() {
        for (bytes, w, h) in [
            (jpeg(40, 30, 1), 40, 30),
            (gray_jpeg(17, 9, 2), 17, 9),
            (cmyk_jpeg(16, 8, 3), 16, 8),
        ] {
            let header = turbojpeg::read_header(&bytes).unwrap();
            assert_eq!((header.width, header.height), (w, h));
        }
        for bytes in [png(12, 7, 4), png16(12, 7, 5), png_claiming(12, 7)] {
            let d = image::codecs::png::PngDecoder::new(std::io::Cursor::new(bytes)).unwrap();
            assert_eq!(image::ImageDecoder::dimensions(&d), (12, 7));
        }
    }
}
