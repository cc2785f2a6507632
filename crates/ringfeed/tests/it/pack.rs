//! `pack` end to end through the library: inputs in, packed dataset out, read back.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use ringfeed_decode::Reencode;
use ringfeed_format::shard::{Dataset, VerifyOptions, WriterOptions, verify};
use ringfeed_pack::{OnError, PackError, PackOptions, ProgressMode, pack};

use crate::support::{cmyk_jpeg, dataset_files, gray_jpeg, jpeg, png, png_claiming, png16, write_tree};

fn opts() -> PackOptions {
    PackOptions {
        progress: ProgressMode::None,
        writer: WriterOptions {
            target_shard_bytes: 64 << 10,
            record_align: 4096,
        },
        ..PackOptions::default()
    }
}

fn no_cancel() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

/// A folder of good images of every supported kind, in three classes (one nested).
fn good_folder(root: &Path) -> Vec<(&'static str, Vec<u8>)> {
    let files = vec![
        ("cat/1.jpg", jpeg(64, 48, 1)),
        ("cat/2.JPEG", jpeg(40, 40, 2)),
        ("cat/sub/3.png", png(30, 20, 3)),
        ("dog/a.jpg", gray_jpeg(33, 17, 4)),
        ("dog/b.jpeg", cmyk_jpeg(24, 24, 5)),
        ("dog/c.png", png16(16, 16, 6)),
        ("eel/x.jpg", png(20, 20, 7)), // a PNG with a .jpg name: content decides
        ("eel/notes.txt", b"not an image, ignored by extension".to_vec()),
        ("README.md", b"loose file at the root, ignored".to_vec()),
    ];
    write_tree(root, &files);
    files
}

/// Packing a folder with `--no-restarts` keeps every image's bytes, sorts classes and files
/// bytewise, labels by class, ignores other extensions, and passes `verify`.
#[test]
fn folder_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files = good_folder(&src);
    let out = tmp.path().join("out");
    let o = PackOptions {
        restarts: false,
        ..opts()
    };
    let s = pack(&src, &out, &o, &no_cancel()).unwrap();
    assert_eq!(s.restarted, 0);
    assert_eq!(
        (s.written.samples, s.written.classes, s.ignored, s.skipped.len()),
        (7, 3, 2, 0)
    );
    assert_eq!(s.input, "imagefolder");
    let ds = Dataset::open(&out).unwrap();
    let classes: Vec<&[u8]> = (0..3).map(|c| ds.class_name(c).unwrap()).collect();
    assert_eq!(classes, [&b"cat"[..], b"dog", b"eel"]);
    let expect = [
        ("cat/1.jpg", 0),
        ("cat/2.JPEG", 0),
        ("cat/sub/3.png", 0),
        ("dog/a.jpg", 1),
        ("dog/b.jpeg", 1),
        ("dog/c.png", 1),
        ("eel/x.jpg", 2),
    ];
    for (i, (key, label)) in expect.iter().enumerate() {
        let smp = ds.sample_checked(i as u64).unwrap();
        assert_eq!(smp.key, key.as_bytes());
        assert_eq!(smp.label, *label);
        let original = &files.iter().find(|f| f.0 == *key).unwrap().1;
        assert_eq!(smp.data, &original[..], "{key}");
    }
    verify(&out, &VerifyOptions::default()).unwrap();
    assert!(!out.join("skipped.tsv").exists());
}

/// By default, 8-bit JPEGs (colour, grey, CMYK, progressive) are stored rewritten as
/// sequential JPEGs with restart markers that restart cuts can use, and decode to exactly the
/// original's pixels; PNGs keep their bytes. The dataset's info records it.
#[test]
fn packed_jpegs_get_restart_markers_and_keep_every_pixel() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let mut files = good_folder(&src);
    let progressive = crate::codec::images::jpeg_rgb(
        &crate::codec::images::photo(70, 45, 9),
        70,
        45,
        &crate::codec::images::JpegOpts {
            progressive: true,
            ..Default::default()
        },
    );
    write_tree(&src, &[("fox/p.jpg", progressive.clone())]);
    files.push(("fox/p.jpg", progressive));
    let out = tmp.path().join("out");
    let s = pack(&src, &out, &opts(), &no_cancel()).unwrap();
    let ds = Dataset::open(&out).unwrap();
    let mut decoder = ringfeed_decode::Decoder::new(ringfeed_decode::Limits::default()).unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let mut rewritten = 0;
    for i in 0..ds.len() {
        let smp = ds.sample_checked(i).unwrap();
        let key = std::str::from_utf8(smp.key).unwrap();
        let original = &files.iter().find(|f| f.0 == key).unwrap().1;
        let da = decoder.decode_rgb8(original, &mut a).unwrap();
        let db = decoder.decode_rgb8(smp.data, &mut b).unwrap();
        assert_eq!((da.width, da.height), (db.width, db.height), "{key}");
        assert!(a == b, "{key}: pixels changed");
        if smp.data != &original[..] {
            rewritten += 1;
            // DRI (FF DD) before the scan: restart markers were written.
            assert!(smp.data.windows(2).any(|w| w == [0xFF, 0xDD]), "{key}");
            // And the stored image needs no second rewrite.
            let mut again = Vec::new();
            assert_eq!(decoder.add_restarts(smp.data, 2, &mut again).unwrap(), None, "{key}");
        }
    }
    // The five JPEGs; not the PNGs.
    assert_eq!((rewritten, s.restarted), (5, 5));
    verify(&out, &VerifyOptions::default()).unwrap();
    let info: serde_json::Value = serde_json::from_str(ds.info().unwrap()).unwrap();
    assert_eq!(info["restarts"]["rewritten"], 5, "{info}");
}

/// The same input gives byte-identical output with 1 or 3 threads.
#[test]
fn deterministic_across_thread_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let mut files = Vec::new();
    for i in 0..40u64 {
        files.push((format!("c{}/{i:03}.jpg", i % 4), jpeg(20 + (i as usize % 7) * 9, 30, i)));
    }
    let refs: Vec<(&str, Vec<u8>)> = files.iter().map(|(p, d)| (p.as_str(), d.clone())).collect();
    write_tree(&src, &refs);
    for reencode in [
        None,
        Some(Reencode {
            max_side: 24,
            quality: 80,
        }),
    ] {
        let mut outs = Vec::new();
        for threads in [1, 3] {
            let out = tmp.path().join(format!("out-{threads}-{}", reencode.is_some()));
            let o = PackOptions {
                threads,
                reencode,
                ..opts()
            };
            pack(&src, &out, &o, &no_cancel()).unwrap();
            outs.push(out);
        }
        let (a, b) = (dataset_files(&outs[0]), dataset_files(&outs[1]));
        assert_eq!(a.len(), b.len());
        assert!(a.len() > 2, "expected several shards, got {a:?}");
        for (x, y) in a.iter().zip(&b) {
            assert!(
                fs::read(x).unwrap() == fs::read(y).unwrap(),
                "{} differs between thread counts",
                x.display()
            );
        }
    }
}

/// Re-encoding bounds the longer side, never upscales, and writes JPEGs.
#[test]
fn reencode_bounds_the_size() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(
        &src,
        &[("a/big.jpg", jpeg(200, 100, 1)), ("a/small.png", png(20, 30, 2))],
    );
    let out = tmp.path().join("out");
    let o = PackOptions {
        reencode: Some(Reencode {
            max_side: 64,
            quality: 85,
        }),
        ..opts()
    };
    pack(&src, &out, &o, &no_cancel()).unwrap();
    let ds = Dataset::open(&out).unwrap();
    let mut decoder = ringfeed_decode::Decoder::new(Default::default()).unwrap();
    let sizes: Vec<(u32, u32)> = (0..2)
        .map(|i| {
            let s = ds.sample(i).unwrap();
            assert_eq!(ringfeed_decode::sniff(s.data), Some(ringfeed_decode::Format::Jpeg));
            let info = decoder.probe(s.data).unwrap();
            (info.width, info.height)
        })
        .collect();
    assert_eq!(sizes, [(64, 32), (20, 30)]);
    let info: serde_json::Value = serde_json::from_str(ds.info().unwrap()).unwrap();
    assert_eq!(
        info["encoding"],
        serde_json::json!({"mode": "reencode", "max_side": 64, "quality": 85})
    );
}

/// A folder of bad files: every one is skipped with a reason in the report, the good ones are
/// packed, and memory stays bounded for a PNG that claims ten billion pixels.
#[test]
fn bad_inputs_are_skipped_with_reasons() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let good = jpeg(32, 32, 1);
    let mut truncated = jpeg(64, 64, 2);
    truncated.truncate(truncated.len() / 2);
    write_tree(
        &src,
        &[
            ("a/good.jpg", good.clone()),
            ("a/empty.jpg", Vec::new()),
            ("a/truncated.jpg", truncated),
            ("a/text.jpg", b"hello, I am not a JPEG at all".to_vec()),
            ("a/bomb.png", png_claiming(100_000, 100_000)),
            ("b/ok.png", png(8, 8, 3)),
        ],
    );
    std::os::unix::fs::symlink(src.join("a/does-not-exist.jpg"), src.join("a/dangling.jpg")).unwrap();
    let out = tmp.path().join("out");
    let o = PackOptions {
        on_error: OnError::Skip,
        restarts: false,
        ..opts()
    };
    let s = pack(&src, &out, &o, &no_cancel()).unwrap();
    assert_eq!(s.written.samples, 2);
    let keys: Vec<&str> = s.skipped.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "a/bomb.png",
            "a/dangling.jpg",
            "a/empty.jpg",
            "a/text.jpg",
            "a/truncated.jpg"
        ]
    );
    let reason = |k: &str| s.skipped.iter().find(|x| x.key == k).unwrap().reason.to_lowercase();
    assert!(
        reason("a/bomb.png").contains("--max-pixels"),
        "{}",
        reason("a/bomb.png")
    );
    assert!(
        reason("a/dangling.jpg").contains("cannot read"),
        "{}",
        reason("a/dangling.jpg")
    );
    assert!(reason("a/empty.jpg").contains("empty"), "{}", reason("a/empty.jpg"));
    let report = fs::read_to_string(out.join("skipped.tsv")).unwrap();
    assert_eq!(report.lines().count(), 6, "{report}");
    assert!(report.starts_with("key\treason\n"));
    assert_eq!(s.report.as_deref(), Some(out.join("skipped.tsv").as_path()));
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(ds.sample(0).unwrap().data, &good[..]);
}

/// Under the default `--on-error fail`, the first bad file stops the pack, is named, and no
/// output or temporary directory is left behind.
#[test]
fn fail_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let mut files = vec![("a/zzz.jpg", b"garbage".to_vec())];
    for i in 0..20 {
        files.push((Box::leak(format!("a/{i:02}.jpg").into_boxed_str()), jpeg(16, 16, i)));
    }
    write_tree(&src, &files);
    let out = tmp.path().join("out");
    let err = pack(&src, &out, &opts(), &no_cancel()).unwrap_err();
    assert!(
        matches!(&err, PackError::BadSample { key, .. } if key == "a/zzz.jpg"),
        "{err}"
    );
    assert!(err.to_string().contains("--on-error skip"), "{err}");
    assert!(!out.exists());
    let leftovers: Vec<_> = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, [OsStr::new("src")], "temporary output left behind");
}

/// An empty class directory fails by default (as torchvision does) and is reported under skip,
/// keeping its label so class indices match torchvision's.
#[test]
fn empty_class() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &[("a/1.jpg", jpeg(8, 8, 1)), ("c/1.jpg", jpeg(8, 8, 2))]);
    fs::create_dir_all(src.join("b")).unwrap();
    let err = pack(&src, &tmp.path().join("o1"), &opts(), &no_cancel()).unwrap_err();
    assert!(
        err.to_string().contains("class directory \"b\" holds no image file"),
        "{err}"
    );
    let o = PackOptions {
        on_error: OnError::Skip,
        ..opts()
    };
    let s = pack(&src, &tmp.path().join("o2"), &o, &no_cancel()).unwrap();
    assert_eq!(s.written.classes, 3);
    let ds = Dataset::open(&tmp.path().join("o2")).unwrap();
    assert_eq!(ds.sample(1).unwrap().label, 2);
}

/// Non-UTF-8 file and class names are kept byte for byte.
#[test]
fn non_utf8_names() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let class = OsStr::from_bytes(b"caf\xe9");
    let file = OsStr::from_bytes(b"\xff\xfe.jpg");
    fs::create_dir_all(src.join(class)).unwrap();
    fs::write(src.join(class).join(file), jpeg(8, 8, 1)).unwrap();
    let out = tmp.path().join("out");
    pack(&src, &out, &opts(), &no_cancel()).unwrap();
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(ds.class_name(0).unwrap(), b"caf\xe9");
    assert_eq!(ds.sample(0).unwrap().key, b"caf\xe9/\xff\xfe.jpg");
}

/// CSV manifests: paths relative to the manifest, string labels become sorted classes, extra
/// columns become metadata, duplicate paths are reported.
#[test]
fn csv_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    write_tree(
        tmp.path(),
        &[
            ("img/1.jpg", jpeg(8, 8, 1)),
            ("img/2.jpg", jpeg(8, 8, 2)),
            ("img/3.png", png(8, 8, 3)),
        ],
    );
    let manifest = tmp.path().join("list.csv");
    fs::write(
        &manifest,
        "path,label,split\nimg/1.jpg,zebra,train\nimg/2.jpg,ant,val\nimg/1.jpg,zebra,train\nimg/3.png,zebra,\"a,b\"\n",
    )
    .unwrap();
    let err = pack(&manifest, &tmp.path().join("o1"), &opts(), &no_cancel()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "img/1.jpg: line 4: duplicate path (first listed on line 2) (pass `--on-error skip` to leave such files out and list them in a report)"
    );
    let out = tmp.path().join("o2");
    let o = PackOptions {
        on_error: OnError::Skip,
        ..opts()
    };
    let s = pack(&manifest, &out, &o, &no_cancel()).unwrap();
    assert_eq!((s.written.samples, s.skipped.len(), s.input), (3, 1, "manifest"));
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(
        (ds.class_name(0).unwrap(), ds.class_name(1).unwrap()),
        (&b"ant"[..], &b"zebra"[..])
    );
    let s0 = ds.sample(0).unwrap();
    assert_eq!(
        (s0.key, s0.label, s0.meta),
        (&b"img/1.jpg"[..], 1, &br#"{"split":"train"}"#[..])
    );
    assert_eq!(ds.sample(2).unwrap().meta, br#"{"split":"a,b"}"#);
}

/// JSONL manifests with integer labels keep the integers and have no class table.
#[test]
fn jsonl_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    write_tree(tmp.path(), &[("1.jpg", jpeg(8, 8, 1)), ("2.jpg", jpeg(8, 8, 2))]);
    let manifest = tmp.path().join("list.jsonl");
    fs::write(
        &manifest,
        "{\"path\": \"1.jpg\", \"label\": 7, \"w\": 1.5}\n\n{\"path\": \"2.jpg\"}\n",
    )
    .unwrap();
    let out = tmp.path().join("out");
    pack(&manifest, &out, &opts(), &no_cancel()).unwrap();
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(ds.class_count(), 0);
    assert_eq!(
        (ds.sample(0).unwrap().label, ds.sample(0).unwrap().meta),
        (7, &br#"{"w":1.5}"#[..])
    );
    assert_eq!(ds.sample(1).unwrap().label, -1);
}

/// An existing output is refused without --force and replaced with it.
#[test]
fn existing_output() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &[("a/1.jpg", jpeg(8, 8, 1))]);
    let out = tmp.path().join("out");
    fs::create_dir(&out).unwrap();
    fs::write(out.join("precious"), b"x").unwrap();
    let err = pack(&src, &out, &opts(), &no_cancel()).unwrap_err();
    assert!(matches!(err, PackError::Exists { .. }), "{err}");
    assert!(out.join("precious").exists());
    pack(&src, &out, &PackOptions { force: true, ..opts() }, &no_cancel()).unwrap();
    assert!(!out.join("precious").exists());
    Dataset::open(&out).unwrap();
}

/// A cancelled pack stops, reports it, and leaves nothing behind.
#[test]
fn cancelled_pack_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &[("a/1.jpg", jpeg(8, 8, 1))]);
    let out = tmp.path().join("out");
    let err = pack(&src, &out, &opts(), &Arc::new(AtomicBool::new(true))).unwrap_err();
    assert!(matches!(err, PackError::Interrupted), "{err}");
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1);
}

/// `verify --decode` finds a sample that is a valid record but not a valid image.
#[test]
fn verify_decode_names_the_sample() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let mut bad = jpeg(64, 64, 9);
    let n = bad.len();
    bad[n / 2..n - 2].fill(0xFF);
    write_tree(&src, &[("a/1.jpg", jpeg(8, 8, 1)), ("a/2.jpg", bad)]);
    let out = tmp.path().join("out");
    // Header-only checks let the damaged file in; the full decode of verify catches it.
    let o = PackOptions {
        check: ringfeed_pack::Check::Header,
        ..opts()
    };
    pack(&src, &out, &o, &no_cancel()).unwrap();
    let check = |b: &[u8]| -> Result<(), ringfeed_format::shard::SampleCheckError> {
        let mut decoder = ringfeed_decode::Decoder::new(Default::default()).unwrap();
        decoder.decode_rgb8(b, &mut Vec::new()).map(|_| ()).map_err(Into::into)
    };
    let err = verify(
        &out,
        &VerifyOptions {
            sample_check: Some(&check),
            threads: 2,
            progress: None,
        },
    )
    .unwrap_err();
    assert_eq!(err.kind(), "decode");
    assert!(
        err.to_string().contains("sample 1 (key \"a/2.jpg\") does not decode"),
        "{err}"
    );
}
