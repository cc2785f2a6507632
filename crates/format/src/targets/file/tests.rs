//! The writer, reader and verifier against each other and against the shared vectors in
//! `proto/vectors/targets/` (which the Python reader checks too).
//!
//! `RINGFEED_BLESS=1 cargo test -p ringfeed-format targets::file::tests::vectors_are_current`
//! regenerates the vectors after a deliberate format change; otherwise the tests fail when the
//! committed files are stale.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::*;

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto/vectors/targets")
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// An 8-bit greyscale PNG of `w x h` pixels whose value at `(x, y)` is `f(x, y)`.
fn grey_png(w: u32, h: u32, f: impl Fn(u32, u32) -> u8) -> Vec<u8> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, w, h);
    enc.set_color(png::ColorType::Grayscale);
    enc.set_depth(png::BitDepth::Eight);
    let mut wr = enc.write_header().unwrap();
    let data: Vec<u8> = (0..h)
        .flat_map(|y| (0..w).map(move |x| (x, y)))
        .map(|(x, y)| f(x, y))
        .collect();
    wr.write_image_data(&data).unwrap();
    wr.finish().unwrap();
    out
}

type Sample = (Vec<[f32; 4]>, Vec<i64>, Vec<u8>);

/// The vector's samples: boxes on three of four (none on sample 2), masks on all.
fn vector_samples() -> Vec<Sample> {
    vec![
        (
            vec![[1.0, 2.0, 10.5, 12.25], [0.0, 0.0, 16.0, 8.0]],
            vec![1, 3],
            grey_png(16, 12, |x, y| u8::from(x > 8) + u8::from(y > 6)),
        ),
        (vec![[3.5, 4.0, 3.5, 9.0]], vec![3], grey_png(8, 8, |_, _| 0)),
        (vec![], vec![], grey_png(5, 3, |x, _| x as u8)),
        (
            vec![[0.0, 0.0, 1.0, 1.0], [2.0, 2.0, 4.0, 4.0], [1.0, 0.5, 7.0, 7.5]],
            vec![1, 1, 3],
            grey_png(8, 8, |x, y| if x == y { 255 } else { 1 }),
        ),
    ]
}

const CATEGORIES: &str = r#"[{"id":1,"name":"circle"},{"id":3,"name":"square"}]"#;

fn write_vector(path: &Path) {
    let mut w = TargetsWriter::create(path, true, true).unwrap();
    for (boxes, labels, mask) in vector_samples() {
        w.push(&boxes, &labels, Some(&mask)).unwrap();
    }
    w.finish(CATEGORIES).unwrap();
}

fn expected_json() -> Value {
    json!({
        "description": "ringfeed targets file v1.0 vector: written by the Rust writer from crates/format/src/targets/file/tests.rs vector_samples()",
        "flags": FLAG_BOXES | FLAG_MASKS,
        "max_boxes": 3,
        "categories": serde_json::from_str::<Value>(CATEGORIES).unwrap(),
        "samples": vector_samples().iter().map(|(b, l, m)| json!({
            "boxes": b, "labels": l, "mask_png": hex(m),
        })).collect::<Vec<_>>(),
    })
}

/// Damages located from the file's own structure.
fn case_list(bytes: &[u8]) -> Vec<Value> {
    let t = TargetsFile::from_bytes(Path::new("v"), bytes.to_vec()).unwrap();
    let len = bytes.len() as u64;
    let footer = len - TARGETS_FOOTER_LEN as u64;
    let (r0, _, _) = t.entry(0).unwrap();
    let x = |name: &str, offset: u64, kind: &str| json!({"name": name, "op": "xor", "offset": offset, "value": 1, "kind": kind});
    vec![
        x("header magic", 0, "bad_magic"),
        x("header sample count", 16, "checksum"),
        x("header crc", 60, "checksum"),
        x("footer magic", footer, "bad_magic"),
        x("footer crc", footer + 28, "checksum"),
        x("first record's box count", r0, "checksum"),
        x("first record's first box", r0 + 8, "checksum"),
        x("sample table entry", t.header.table_offset + 8, "checksum"),
        x("a categories byte", t.header.categories_offset + 2, "checksum"),
        json!({"name": "cut to 90 bytes", "op": "truncate", "length": 90, "kind": "truncated"}),
        json!({"name": "missing its last byte", "op": "truncate", "length": len - 1, "kind": "bad_magic"}),
    ]
}

fn apply(bytes: &mut Vec<u8>, case: &Value) {
    match case["op"].as_str().unwrap() {
        "xor" => bytes[case["offset"].as_u64().unwrap() as usize] ^= case["value"].as_u64().unwrap() as u8,
        "truncate" => bytes.truncate(case["length"].as_u64().unwrap() as usize),
        op => panic!("unknown op {op}"),
    }
}

fn blessing() -> bool {
    std::env::var_os("RINGFEED_BLESS").is_some_and(|v| v == "1")
}

#[test]
fn vectors_are_current() {
    let tmp = tempfile::tempdir().unwrap();
    let fresh = tmp.path().join(TARGETS_FILE);
    write_vector(&fresh);
    let bytes = std::fs::read(&fresh).unwrap();
    let dir = vectors_dir();
    let expected = serde_json::to_string_pretty(&expected_json()).unwrap() + "\n";
    let cases = serde_json::to_string_pretty(&case_list(&bytes)).unwrap() + "\n";
    if blessing() {
        std::fs::create_dir_all(dir.join("v1-basic")).unwrap();
        std::fs::write(dir.join("v1-basic").join(TARGETS_FILE), &bytes).unwrap();
        std::fs::write(dir.join("expected.json"), expected).unwrap();
        std::fs::write(dir.join("cases.json"), cases).unwrap();
        return;
    }
    let stale = "the vectors in proto/vectors/targets are stale: regenerate them with RINGFEED_BLESS=1";
    assert!(
        std::fs::read(dir.join("v1-basic").join(TARGETS_FILE)).unwrap() == bytes,
        "{stale}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("expected.json")).unwrap(),
        expected,
        "{stale}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("cases.json")).unwrap(),
        cases,
        "{stale}"
    );
}

#[test]
fn vector_reads_back_and_verifies() {
    let path = vectors_dir().join("v1-basic").join(TARGETS_FILE);
    let t = TargetsFile::open(&path).unwrap();
    let want = vector_samples();
    assert_eq!(t.len(), want.len() as u64);
    assert_eq!(t.header.max_boxes, 3);
    assert!(t.header.has_boxes() && t.header.has_masks());
    assert_eq!(t.categories(), CATEGORIES.as_bytes());
    for (i, (boxes, labels, mask)) in want.iter().enumerate() {
        let s = t.get(i as u64, true).unwrap();
        assert_eq!((&s.boxes, &s.labels, s.mask_png), (boxes, labels, mask.as_slice()));
        assert!(check_grey_png(s.mask_png).is_ok());
    }
    let report = verify_targets(&path, Some(4)).unwrap();
    assert_eq!((report.samples, report.boxes, report.masks), (4, 6, 4));
}

#[test]
fn damage_cases_report_their_kind() {
    let path = vectors_dir().join("v1-basic").join(TARGETS_FILE);
    let clean = std::fs::read(&path).unwrap();
    let cases: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(vectors_dir().join("cases.json")).unwrap()).unwrap();
    assert!(cases.len() >= 10);
    let tmp = tempfile::tempdir().unwrap();
    for case in &cases {
        let mut b = clean.clone();
        apply(&mut b, case);
        let damaged = tmp.path().join(TARGETS_FILE);
        std::fs::write(&damaged, &b).unwrap();
        let err = verify_targets(&damaged, None).expect_err(case["name"].as_str().unwrap());
        assert_eq!(err.kind(), case["kind"].as_str().unwrap(), "{}: {err}", case["name"]);
        assert!(err.to_string().contains("targets.rft"), "{err}");
    }
}

#[test]
fn verify_compares_the_sample_count_with_the_index() {
    let path = vectors_dir().join("v1-basic").join(TARGETS_FILE);
    let err = verify_targets(&path, Some(5)).unwrap_err();
    assert!(
        err.to_string().contains("targets for 4 samples, the index has 5"),
        "{err}"
    );
}

#[test]
fn writer_refuses_what_the_spec_forbids() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(TARGETS_FILE);
    let mut w = TargetsWriter::create(&path, true, false).unwrap();
    let err = w.push(&[[0.0, 0.0, f32::NAN, 1.0]], &[1], None).unwrap_err();
    assert!(err.to_string().contains("sample 0: box"), "{err}");
    let err = w.push(&[[5.0, 0.0, 1.0, 1.0]], &[1], None).unwrap_err();
    assert!(err.to_string().contains("negative size"), "{err}");
    let err = w.push(&[], &[], Some(&grey_png(1, 1, |_, _| 0))).unwrap_err();
    assert!(err.to_string().contains("without masks"), "{err}");
    let err = w.push(&[[0.0; 4]], &[], None).unwrap_err();
    assert!(err.to_string().contains("1 boxes but 0 labels"), "{err}");
    // Only valid records were written: the file is a good empty-box file.
    w.push(&[], &[], None).unwrap();
    w.finish("").unwrap();
    let report = verify_targets(&path, Some(1)).unwrap();
    assert_eq!((report.samples, report.boxes, report.max_boxes), (1, 0, 0));
}

#[test]
fn roundtrip_of_many_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(TARGETS_FILE);
    let mut w = TargetsWriter::create(&path, true, false).unwrap();
    let sample = |i: usize| -> (Vec<[f32; 4]>, Vec<i64>) {
        let n = (i * 7) % 11;
        let b = (0..n)
            .map(|k| [k as f32, i as f32, k as f32 + 0.5, i as f32 + 2.25])
            .collect();
        (b, (0..n).map(|k| (k * i) as i64 - 3).collect())
    };
    for i in 0..50 {
        let (b, l) = sample(i);
        w.push(&b, &l, None).unwrap();
    }
    w.finish("[]").unwrap();
    let t = TargetsFile::open(&path).unwrap();
    assert_eq!(t.header.max_boxes, 10);
    for i in 0..50 {
        let s = t.get(i as u64, true).unwrap();
        assert_eq!((s.boxes, s.labels), sample(i));
        assert!(s.mask_png.is_empty());
    }
    assert!(matches!(
        t.get(50, false),
        Err(ShardError::OutOfRange { index: 50, .. })
    ));
    verify_targets(&path, Some(50)).unwrap();
}

/// The 1.1 vector's samples: boxes with runs (column-major, first of zeros) on a 4x3 image and
/// two keypoints each; sample 1 has no boxes, sample 2 nine (two bit planes when served).
/// A 1.1 sample: boxes, labels, each box's runs, keypoints.
type Sample11 = (Vec<[f32; 4]>, Vec<i64>, Vec<Vec<u32>>, Vec<[f32; 3]>);

fn vector_1_1_samples() -> Vec<Sample11> {
    let one = |k: usize| -> (Vec<u32>, [f32; 3]) {
        // Box k's mask: the single pixel k (column-major), so each is distinct.
        (
            vec![k as u32, 1, 11 - k as u32],
            [k as f32 + 0.5, -1.25, (k % 3) as f32],
        )
    };
    let sample = |ks: &[usize]| {
        let boxes = ks.iter().map(|&k| [0.0, 0.0, k as f32 + 1.0, 3.0]).collect();
        let labels = ks.iter().map(|&k| k as i64 + 1).collect();
        let runs = ks.iter().map(|&k| one(k).0).collect();
        let kps = ks
            .iter()
            .flat_map(|&k| [one(k).1, [4.0 + k as f32, 300.0, 2.0]])
            .collect();
        (boxes, labels, runs, kps)
    };
    vec![sample(&[0, 11]), sample(&[]), sample(&[1, 2, 3, 4, 5, 6, 7, 8, 9])]
}

fn write_vector_1_1(path: &Path) {
    let mut w = TargetsWriter::create_with(path, true, false, true, 2).unwrap();
    for (boxes, labels, runs, kps) in vector_1_1_samples() {
        let enc: Vec<Vec<u8>> = runs
            .iter()
            .map(|r| {
                let mut b = Vec::new();
                super::super::rle::encode_runs(r, &mut b);
                b
            })
            .collect();
        let inst = InstancesIn {
            width: 4,
            height: 3,
            runs: &enc,
        };
        w.push_all(&boxes, &labels, None, Some(inst), &kps).unwrap();
    }
    w.finish(CATEGORIES).unwrap();
}

fn expected_1_1_json() -> Value {
    json!({
        "description": "ringfeed targets file v1.1 vector (instance masks, keypoints): written by the Rust writer from crates/format/src/targets/file/tests.rs vector_1_1_samples(); masks are [h][w] of 0/1",
        "flags": FLAG_BOXES | FLAG_INSTANCES | FLAG_KEYPOINTS,
        "max_boxes": 9,
        "keypoints": 2,
        "samples": vector_1_1_samples().iter().map(|(b, l, runs, kps)| json!({
            "boxes": b, "labels": l, "keypoints": kps,
            "instance_masks": runs.iter().map(|r| {
                let mut plane = LabelMap::filled(4, 3, 0);
                super::super::rle::paint_runs(r, &mut plane, 0).unwrap();
                plane.data.chunks(4).map(<[u8]>::to_vec).collect::<Vec<_>>()
            }).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

#[test]
fn vectors_1_1_are_current() {
    let tmp = tempfile::tempdir().unwrap();
    let fresh = tmp.path().join(TARGETS_FILE);
    write_vector_1_1(&fresh);
    let bytes = std::fs::read(&fresh).unwrap();
    let dir = vectors_dir();
    let expected = serde_json::to_string_pretty(&expected_1_1_json()).unwrap() + "\n";
    if blessing() {
        std::fs::create_dir_all(dir.join("v1.1-instances")).unwrap();
        std::fs::write(dir.join("v1.1-instances").join(TARGETS_FILE), &bytes).unwrap();
        std::fs::write(dir.join("expected-1.1.json"), expected).unwrap();
        return;
    }
    assert_current(&dir.join("v1.1-instances").join(TARGETS_FILE), &bytes);
    assert_current(&dir.join("expected-1.1.json"), expected.as_bytes());
}

/// Panics, naming the bless command, when the committed `path` is not `fresh`.
fn assert_current(path: &Path, fresh: &[u8]) {
    assert!(
        std::fs::read(path).unwrap() == fresh,
        "{} is stale: regenerate the vectors in proto/vectors/targets with RINGFEED_BLESS=1",
        path.display()
    );
}

#[test]
fn vector_1_1_reads_back_and_verifies() {
    let path = vectors_dir().join("v1.1-instances").join(TARGETS_FILE);
    let t = TargetsFile::open(&path).unwrap();
    assert_eq!((t.header.minor, t.header.keypoints, t.header.max_boxes), (1, 2, 9));
    assert!(t.header.has_instances() && !t.header.has_masks());
    let mut runs = Vec::new();
    for (i, (boxes, labels, want_runs, kps)) in vector_1_1_samples().iter().enumerate() {
        let s = t.get(i as u64, true).unwrap();
        assert_eq!((&s.boxes, &s.labels, &s.keypoints), (boxes, labels, kps));
        let inst = s.instances.unwrap();
        assert_eq!((inst.width, inst.height, inst.runs.len()), (4, 3, want_runs.len()));
        for (r, want) in inst.runs.iter().zip(want_runs) {
            super::super::rle::decode_runs(r, &mut runs).unwrap();
            assert_eq!(&runs, want);
        }
    }
    let report = verify_targets(&path, Some(3)).unwrap();
    assert_eq!((report.boxes, report.instances, report.keypoints), (11, 11, 2));
}

#[test]
fn a_1_1_record_is_checked_against_its_parts() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(TARGETS_FILE);
    let mut w = TargetsWriter::create_with(&path, true, false, true, 2).unwrap();
    let runs = vec![vec![0u8, 12]];
    let inst = InstancesIn {
        width: 4,
        height: 3,
        runs: &runs,
    };
    let b = [[0.0, 0.0, 1.0, 1.0]];
    let err = w.push_all(&b, &[1], None, Some(inst), &[[0.0; 3]]).unwrap_err();
    assert!(
        err.to_string()
            .contains("1 keypoints for 1 boxes, the file has 2 per box"),
        "{err}"
    );
    let err = w.push_all(&b, &[1], None, None, &[[0.0; 3]; 2]).unwrap_err();
    assert!(err.to_string().contains("0 instance masks for 1 boxes"), "{err}");
    // Runs that do not cover the image are verify's corruption, naming the sample and the mask.
    let short = vec![vec![0u8, 11]];
    let inst = InstancesIn { runs: &short, ..inst };
    w.push_all(&b, &[1], None, Some(inst), &[[0.0; 3]; 2]).unwrap();
    w.finish("").unwrap();
    let err = verify_targets(&path, None).unwrap_err();
    assert!(
        err.to_string()
            .contains("sample 0's instance mask 0: its runs cover 11 pixels, the masks are 4x3"),
        "{err}"
    );
}
