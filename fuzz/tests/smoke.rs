//! Stable smoke test of the fuzz targets (CI has no nightly): each target's body runs over its
//! seeds and a few thousand seeded mutations of them. It finds shallow crashes and keeps the
//! bodies compiling and running; `fuzz/run.sh` (nightly, libFuzzer) does the real search.

use std::path::Path;

/// splitmix64, so the mutations are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A libFuzzer-like mutation: flips, interesting bytes, cuts, duplicated and inserted runs.
fn mutate(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut d = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let n = d.len();
        match rng.below(6) {
            0 if n > 0 => d[rng.below(n)] ^= 1 << rng.below(8),
            1 if n > 0 => d[rng.below(n)] = [0, 0xFF, 0x7F, 0x80, b'"', b'{', b'9'][rng.below(7)],
            2 if n > 0 => d.truncate(rng.below(n)),
            3 if n > 1 => {
                let at = rng.below(n);
                let len = rng.below((n - at).min(64));
                let run = d[at..at + len].to_vec();
                let to = rng.below(n);
                d.splice(to..to, run);
            }
            4 => {
                let at = rng.below(n + 1);
                let bytes: Vec<u8> = (0..rng.below(16)).map(|_| rng.next() as u8).collect();
                d.splice(at..at, bytes);
            }
            _ if n >= 4 => {
                // A big-endian/little-endian size field somewhere: set it to an extreme.
                let at = rng.below(n - 3);
                d[at..at + 4].copy_from_slice(&[0xFF, 0xFF, 0x00, 0x01][..]);
            }
            _ => {}
        }
    }
    d
}

fn run(name: &str, body: fn(&[u8]), seeds: &[Vec<u8>], mutations_per_seed: usize) {
    assert!(!seeds.is_empty(), "{name}: no seeds");
    let mut rng = Rng(0x5EED ^ name.len() as u64);
    let mut runs = 0;
    for seed in seeds {
        body(seed);
        runs += 1;
        for _ in 0..mutations_per_seed {
            body(&mutate(seed, &mut rng));
            runs += 1;
        }
    }
    eprintln!("{name}: {runs} inputs, no crash");
}

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// The frames of `proto/vectors/control/*.json`, good and bad.
fn control_seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    for f in ["frames.json", "bad_frames.json"] {
        let text = std::fs::read_to_string(repo().join("proto/vectors/control").join(f)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        for case in v.as_array().unwrap() {
            seeds.push(unhex(case["frame"].as_str().unwrap()));
        }
    }
    seeds
}

/// Small JPEGs (colour, gray, progressive-free), the same with restart markers, and PNGs, encoded
/// here.
fn image_seeds() -> Vec<Vec<u8>> {
    use image::ImageEncoder;
    let mut seeds = Vec::new();
    for (w, h) in [(1u32, 1u32), (17, 9), (64, 48), (300, 200)] {
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 7 % 251) as u8).collect();
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 80)
            .write_image(&rgb, w, h, image::ExtendedColorType::Rgb8)
            .unwrap();
        seeds.push(jpeg);
        let gray: Vec<u8> = (0..w * h).map(|i| (i * 13 % 256) as u8).collect();
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 60)
            .write_image(&gray, w, h, image::ExtendedColorType::L8)
            .unwrap();
        seeds.push(jpeg);
        let mut png = Vec::new();
        image::codecs::png::PngEncoder::new(&mut png)
            .write_image(&rgb, w, h, image::ExtendedColorType::Rgb8)
            .unwrap();
        seeds.push(png);
    }
    // The JPEGs as `pack` stores them, with restart markers (so mutations hit restart cuts).
    let mut decoder = ringfeed_decode::Decoder::new(ringfeed_decode::Limits::default()).unwrap();
    let mut packed = Vec::new();
    for seed in &seeds {
        let mut out = Vec::new();
        if let Ok(Some(_)) = decoder.add_restarts(seed, 1, &mut out) {
            packed.push(out);
        }
    }
    assert!(packed.len() >= 6, "{} rewritten seeds", packed.len());
    seeds.extend(packed);
    seeds
}

/// The committed shard vectors, joined as `fuzz/seed.sh` joins them.
fn shard_seeds() -> Vec<Vec<u8>> {
    let v = repo().join("proto/vectors/shard/v1-basic");
    let mut joined = std::fs::read(v.join("index.rfi")).unwrap();
    for s in ["shard-000000.rfs", "shard-000001.rfs"] {
        joined.extend_from_slice(ringfeed_fuzz::SEPARATOR);
        joined.extend_from_slice(&std::fs::read(v.join(s)).unwrap());
    }
    vec![joined]
}

#[test]
fn control_frame() {
    run("control_frame", ringfeed_fuzz::control_frame, &control_seeds(), 200);
}

#[test]
fn image_decode() {
    run("image_decode", ringfeed_fuzz::image_decode, &image_seeds(), 150);
}

#[test]
fn image_decode_respects_the_limit() {
    // A valid image just over the limit is refused by every entry point (the body asserts it).
    use image::ImageEncoder;
    let (w, h) = (257u32, 256u32);
    assert!(u64::from(w * h) > ringfeed_fuzz::FUZZ_MAX_PIXELS);
    let mut png = Vec::new();
    image::codecs::png::PngEncoder::new(&mut png)
        .write_image(&vec![9u8; (w * h * 3) as usize], w, h, image::ExtendedColorType::Rgb8)
        .unwrap();
    ringfeed_fuzz::image_decode(&png);
}

#[test]
fn shard_reader() {
    run("shard_reader", ringfeed_fuzz::shard_reader, &shard_seeds(), 300);
}

/// Tars as WebDataset writers make them: ustar members, a GNU long name, a pax path, a
/// directory; and the index file of each (`tar_scan` reads an input as both).
fn tar_seeds() -> Vec<Vec<u8>> {
    fn header(name: &[u8], size: usize, kind: u8) -> Vec<u8> {
        let mut h = vec![0u8; 512];
        h[..name.len()].copy_from_slice(name);
        h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
        h[156] = kind;
        h[257..263].copy_from_slice(b"ustar\0");
        h[148..156].fill(b' ');
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        h
    }
    let member = |out: &mut Vec<u8>, name: &[u8], data: &[u8], kind: u8| {
        out.extend(header(name, data.len(), kind));
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    };
    let mut plain = Vec::new();
    for k in 0..3 {
        member(&mut plain, format!("k{k}.jpg").as_bytes(), &[0xFF; 700], b'0');
        member(&mut plain, format!("k{k}.cls").as_bytes(), b"2", b'0');
    }
    plain.extend([0u8; 1024]);
    let mut dialects = Vec::new();
    member(&mut dialects, b"d/", b"", b'5');
    member(&mut dialects, b"././@LongLink", &b"x/".repeat(90), b'L');
    member(&mut dialects, b"short", b"abc", b'0');
    member(&mut dialects, b"PaxHeaders/p", b"20 path=p/long.json\n", b'x');
    member(&mut dialects, b"ignored", b"{}", b'0');
    dialects.extend([0u8; 1024]);
    let mut seeds = vec![plain.clone(), dialects.clone(), plain[..1800].to_vec()];
    for t in [plain, dialects] {
        let scan = ringfeed_source::wds::tar::scan(&t, &mut |_| {});
        let stamp = ringfeed_source::wds::index::Stamp {
            len: t.len() as u64,
            mtime_ns: 7,
        };
        seeds.push(ringfeed_source::wds::index::encode(&scan, stamp));
    }
    seeds
}

#[test]
fn tar_scan() {
    run("tar_scan", ringfeed_fuzz::tar_scan, &tar_seeds(), 400);
}
