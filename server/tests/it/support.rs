//! Shared test helpers: seeded data, small datasets, running the binary.

use std::path::{Path, PathBuf};

use ringfeed::shard::{DatasetWriter, WriteSummary, WriterOptions};

/// One sample as the tests describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub key: Vec<u8>,
    pub label: i64,
    pub meta: Vec<u8>,
    pub data: Vec<u8>,
}

/// splitmix64: a tiny seeded generator, so test data is the same on every run and platform.
pub struct Rng(pub u64);

impl Rng {
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
}

/// Writes `samples` as a dataset in a new directory `dir`.
pub fn write_dataset(dir: &Path, samples: &[Spec], classes: &[Vec<u8>], opts: WriterOptions) -> WriteSummary {
    std::fs::create_dir_all(dir).unwrap();
    let mut w = DatasetWriter::create(dir, opts).unwrap();
    for s in samples {
        w.push(&s.key, s.label, &s.meta, &s.data).unwrap();
    }
    w.finish(classes, r#"{"format":"ringfeed-packed","source_kind":"test"}"#)
        .unwrap()
}

/// A small dataset with two shards, classes, metadata and a non-UTF-8 key.
pub fn small_specs() -> (Vec<Spec>, Vec<Vec<u8>>) {
    let mut rng = Rng(7);
    let classes = vec![
        b"cat".to_vec(),
        b"dog".to_vec(),
        "\u{e9}l\u{e9}phant".as_bytes().to_vec(),
    ];
    let mut samples = Vec::new();
    for i in 0..7u64 {
        let len = 1 + (rng.next() % 300) as usize;
        samples.push(Spec {
            key: if i == 3 {
                b"dog/\xff\xfe.jpg".to_vec()
            } else {
                format!("c{}/{i:03}.jpg", i % 3).into_bytes()
            },
            label: if i == 5 { -1 } else { (i % 3) as i64 },
            meta: if i % 2 == 0 {
                format!("{{\"row\":{i}}}").into_bytes()
            } else {
                Vec::new()
            },
            data: rng.bytes(len),
        });
    }
    (samples, classes)
}

/// Options that give `small_specs` two or three shards and visible padding.
pub fn small_options() -> WriterOptions {
    WriterOptions {
        target_shard_bytes: 1200,
        record_align: 64,
    }
}

/// Every file of a dataset directory, sorted by name.
pub fn dataset_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
}

/// Path of the built `ringfeed` binary.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ringfeed"))
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

/// Writes `files` (relative path, bytes) under `root`.
pub fn write_tree(root: &Path, files: &[(&str, Vec<u8>)]) {
    for (rel, data) in files {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
}
