//! `LmdbSource` against real LMDBs written by Python's `lmdb` package.
//!
//! `tests/fixtures/make_lmdb.py` writes one LMDB per supported layout and an `expected.json`
//! saying what reading each must give. It needs `python3` with `lmdb`, `msgpack`, `pillow` and
//! `numpy`; without them these tests fail (they are never skipped).

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use ringfeed_source::lmdb::{LabelSource, Layout, LmdbError, LmdbOptions, LmdbSource};
use ringfeed_source::{NO_LABEL, Source, SourceError};
use serde_json::Value;

/// A fresh directory of fixtures, removed when dropped.
struct Fixtures {
    dir: tempfile::TempDir,
    expected: Value,
}

impl Fixtures {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/make_lmdb.py");
        let output = Command::new("python3")
            .arg(&script)
            .arg(dir.path())
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run python3 ({e}); the lmdb tests need python3 with: pip install \
                     lmdb msgpack pillow numpy"
                )
            });
        assert!(
            output.status.success(),
            "{} failed ({}): {}\nthe lmdb tests need python3 with: pip install lmdb msgpack \
             pillow numpy",
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let expected = fs::read(dir.path().join("expected.json")).expect("expected.json");
        let expected = serde_json::from_slice(&expected).expect("expected.json is json");
        Fixtures { dir, expected }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn databases(&self) -> &[Value] {
        self.expected["databases"].as_array().expect("databases")
    }

    fn db(&self, name: &str) -> &Value {
        self.databases()
            .iter()
            .chain(self.expected["bad"].as_array().expect("bad"))
            .find(|d| d["name"] == name)
            .unwrap_or_else(|| panic!("no fixture {name}"))
    }

    fn options(&self, db: &Value, layout: Layout) -> LmdbOptions {
        let labels = &db["labels"];
        let labels = match labels["kind"].as_str().expect("labels kind") {
            "none" => LabelSource::None,
            "key" => LabelSource::Key(unhex(labels["key_hex"].as_str().expect("key_hex"))),
            "file" => LabelSource::File(self.path(labels["file"].as_str().expect("file"))),
            other => panic!("unknown labels kind {other}"),
        };
        LmdbOptions { layout, labels }
    }

    fn open(&self, name: &str) -> LmdbSource {
        let db = self.db(name);
        let path = self.path(db["path"].as_str().expect("path"));
        LmdbSource::open(&path, &self.options(db, Layout::Auto)).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    /// The expected (key, label, bytes) of every sample of `name`, in order.
    fn samples(&self, name: &str) -> Vec<(Vec<u8>, i64, Vec<u8>)> {
        self.db(name)["samples"]
            .as_array()
            .expect("samples")
            .iter()
            .map(|s| {
                let bytes = fs::read(self.path(s["file"].as_str().expect("file"))).expect("image");
                (
                    unhex(s["key_hex"].as_str().expect("key_hex")),
                    s["label"].as_i64().expect("label"),
                    bytes,
                )
            })
            .collect()
    }
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn layout_of(name: &str) -> Layout {
    name.parse().expect("layout name")
}

/// Whether `ptr` lies in a memory mapping of `file` (from `/proc/self/maps`): proof that a sample
/// borrows LMDB's map rather than a copy.
fn is_mapped_from(ptr: *const u8, file: &Path) -> bool {
    let file = file.canonicalize().expect("canonical data file");
    let maps = fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let addr = ptr as usize;
    maps.lines().any(|line| {
        let mut fields = line.split_whitespace();
        let range = fields.next().unwrap_or_default();
        let path = fields.nth(4).unwrap_or_default();
        let Some((lo, hi)) = range.split_once('-') else {
            return false;
        };
        let lo = usize::from_str_radix(lo, 16).unwrap_or(usize::MAX);
        let hi = usize::from_str_radix(hi, 16).unwrap_or(0);
        Path::new(path) == file && (lo..hi).contains(&addr)
    })
}

#[test]
fn every_layout_reads_back_exactly() {
    let fx = Fixtures::new();
    assert!(fx.databases().len() >= 17);
    for db in fx.databases() {
        let name = db["name"].as_str().expect("name");
        let rel = db["path"].as_str().expect("path");
        let path = fx.path(rel);
        let want_layout = layout_of(db["layout"].as_str().expect("layout"));
        let want = fx.samples(name);
        let want_classes: Vec<Vec<u8>> = db["class_names"]
            .as_array()
            .expect("class_names")
            .iter()
            .map(|c| c.as_str().expect("class name").as_bytes().to_vec())
            .collect();

        // Auto-detected, then given explicitly: the same samples either way.
        for layout in [Layout::Auto, want_layout] {
            let src =
                LmdbSource::open(&path, &fx.options(db, layout)).unwrap_or_else(|e| panic!("{name} ({layout}): {e}"));
            assert_eq!(src.layout(), want_layout, "{name}");
            assert_eq!(src.len(), want.len() as u64, "{name}");
            assert_eq!(src.class_names(), want_classes, "{name}");
            assert_eq!(
                src.describe(),
                format!("lmdb {} ({want_layout} layout, {} samples)", path.display(), want.len())
            );
            let data_file = if path.is_dir() {
                path.join("data.mdb")
            } else {
                path.clone()
            };
            let mut reader = src.reader().unwrap_or_else(|e| panic!("{name}: {e}"));
            // Backwards, to not depend on a cursor's direction.
            for (i, (key, label, bytes)) in want.iter().enumerate().rev() {
                let s = reader
                    .get(i as u64)
                    .unwrap_or_else(|e| panic!("{name} sample {i}: {e}"));
                assert_eq!(s.index, i as u64);
                assert_eq!(s.key, key.as_slice(), "{name} sample {i}");
                assert_eq!(s.label, *label, "{name} sample {i}");
                assert!(s.data == bytes.as_slice(), "{name} sample {i}: bytes differ");
                // Zero-copy: the bytes are LMDB's map, except protocol-2 pickles whose bytes are
                // latin-1 text that must be converted.
                let mapped = is_mapped_from(s.data.as_ptr(), &data_file);
                assert_eq!(mapped, !name.ends_with("p2"), "{name} {i}: zero-copy is {mapped}");
            }
        }
    }
}

#[test]
fn no_labels_means_no_label_and_label_sources_are_checked() {
    let fx = Fixtures::new();
    let src = fx.open("raw_nosubdir");
    let mut r = src.reader().unwrap();
    assert_eq!(r.get(0).unwrap().label, NO_LABEL);

    // The labels key exists but was not asked for: no labels.
    let path = fx.path("raw_labels_key");
    let src = LmdbSource::open(&path, &LmdbOptions::default()).unwrap();
    assert_eq!(src.reader().unwrap().get(0).unwrap().label, NO_LABEL);

    let expect_err = |opts: LmdbOptions, path: &Path, wants: &[&str]| {
        let e = LmdbSource::open(path, &opts).unwrap_err();
        let msg = e.to_string();
        for want in wants {
            assert!(msg.contains(want), "{msg:?} lacks {want:?}");
        }
        assert!(msg.starts_with(&format!("lmdb {}: ", path.display())), "{msg}");
        e
    };
    let key = |k: &str| LabelSource::Key(k.as_bytes().to_vec());
    let file = |f: &str| LabelSource::File(fx.path(f));
    let opts = |labels| LmdbOptions {
        layout: Layout::Auto,
        labels,
    };

    // A missing labels key names the key, the setting, and the metadata keys present.
    expect_err(
        opts(key("__labelz__")),
        &path,
        &["\"__labelz__\" not found", "--labels-key", "\"__keys__\""],
    );
    // Labels for another lmdb: the first sample without one is named, by index and key.
    let e = expect_err(
        opts(file("raw_csv.labels.csv")),
        &path,
        &[
            "sample 0 (key \"Img_0.png\")",
            "no label in the labels file",
            "--labels",
        ],
    );
    assert!(matches!(e, LmdbError::Sample { index: 0, .. }), "{e:?}");
    // A label list of the wrong length.
    expect_err(
        opts(file("raw_json.labels.json")),
        &path,
        &["lists 5 labels", "holds 7 samples", "--labels"],
    );
    // An unreadable labels file.
    expect_err(
        opts(file("nope.csv")),
        &path,
        &["cannot read the labels file", "nope.csv", "--labels"],
    );
    // A labels value that is not a table: a pickled list of keys is labels "in order" of strings,
    // but `__len__` is neither.
    expect_err(
        opts(key("__len__")),
        &path,
        &["cannot parse the labels key \"__len__\"", "--labels-key"],
    );
    // Labels given for records that carry their own.
    expect_err(
        opts(key("__len__")),
        &fx.path("pickle_p4"),
        &["--labels-key only applies to the raw layout", "pickle"],
    );

    // Class names mixed with ints.
    let mixed = fx.path("mixed.json");
    let keys: Vec<String> = fx
        .samples("raw_csv")
        .iter()
        .map(|s| String::from_utf8(s.0.clone()).unwrap())
        .collect();
    let table: serde_json::Map<String, Value> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.clone(), if i == 0 { Value::from("cat") } else { Value::from(i) }))
        .collect();
    fs::write(&mixed, serde_json::to_vec(&table).unwrap()).unwrap();
    expect_err(
        opts(LabelSource::File(mixed)),
        &fx.path("raw_csv"),
        &["mixes integer labels and class names"],
    );
}

#[test]
fn bad_values_fail_per_sample_with_clear_messages() {
    let fx = Fixtures::new();

    // numpy ints as labels: open works (the layout is detected), every get names the opcode.
    let bad = fx.db("bad_numpy");
    let path = fx.path(bad["path"].as_str().unwrap());
    let src = LmdbSource::open(&path, &LmdbOptions::default()).unwrap();
    assert_eq!(src.layout(), Layout::Pickle);
    let mut r = src.reader().unwrap();
    let err = r.get(0).unwrap_err();
    let msg = err.to_string();
    for want in bad["error_contains"].as_array().unwrap() {
        assert!(msg.contains(want.as_str().unwrap()), "{msg:?} lacks {want}");
    }
    let key = String::from_utf8(unhex(bad["first_key_hex"].as_str().unwrap())).unwrap();
    assert!(msg.contains(&format!("sample 0 (key \"{key}\")")), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(matches!(err, SourceError::Lmdb(LmdbError::Sample { index: 0, .. })));
    // The reader is still usable after an error.
    assert!(r.get(1).is_err());
    assert!(matches!(
        r.get(3),
        Err(SourceError::OutOfRange { index: 3, len: 3, .. })
    ));

    // Values that are neither images nor records: auto-detection says what it saw.
    let bad = fx.db("bad_not_images");
    let path = fx.path(bad["path"].as_str().unwrap());
    let msg = LmdbSource::open(&path, &LmdbOptions::default())
        .unwrap_err()
        .to_string();
    for want in bad["error_contains"].as_array().unwrap() {
        assert!(msg.contains(want.as_str().unwrap()), "{msg:?} lacks {want}");
    }
    assert!(msg.contains("sample 0 (key \"t0\")"), "{msg}");

    // The wrong explicit layout: each get fails, naming the layout setting.
    let opts = LmdbOptions {
        layout: Layout::Msgpack,
        ..LmdbOptions::default()
    };
    let src = LmdbSource::open(&fx.path("pickle_p4"), &opts).unwrap();
    let msg = src.reader().unwrap().get(2).unwrap_err().to_string();
    assert!(
        msg.contains("sample 2 (key \"p4_2\")") && msg.contains("--lmdb-layout"),
        "{msg}"
    );
    let opts = LmdbOptions {
        layout: Layout::Pickle,
        ..LmdbOptions::default()
    };
    let src = LmdbSource::open(&fx.path("msgpack_map"), &opts).unwrap();
    let msg = src.reader().unwrap().get(0).unwrap_err().to_string();
    assert!(
        msg.contains("cannot decode the value as a pickle record (--lmdb-layout pickle)")
            && msg.contains("--lmdb-layout"),
        "{msg}"
    );
}

#[test]
fn out_of_range_index() {
    let fx = Fixtures::new();
    let src = fx.open("pickle_p3");
    let mut r = src.reader().unwrap();
    for index in [src.len(), src.len() + 1, u64::MAX] {
        match r.get(index) {
            Err(SourceError::OutOfRange {
                index: i,
                len,
                source_desc,
            }) => {
                assert_eq!((i, len), (index, src.len()));
                assert_eq!(source_desc, src.describe());
            }
            other => panic!("{other:?}"),
        }
    }
    let msg = r.get(src.len()).unwrap_err().to_string();
    assert!(msg.contains("out of range") && msg.contains("pickle_p3"), "{msg}");
}

#[test]
fn threads_read_concurrently_with_their_own_readers() {
    let fx = Fixtures::new();
    for name in ["raw_labels_key", "pickle_p2", "pickle_p5", "msgpack_map"] {
        let src = fx.open(name);
        let want = fx.samples(name);
        let n = want.len();
        std::thread::scope(|scope| {
            for t in 0..6usize {
                let (src, want) = (&src, &want);
                scope.spawn(move || {
                    let mut reader = src.reader().unwrap();
                    for round in 0..200 {
                        // A different stride per thread and round.
                        let i = (t * 7 + round * (2 * t + 1)) % n;
                        let s = reader.get(i as u64).unwrap();
                        assert_eq!(s.key, want[i].0.as_slice());
                        assert_eq!(s.label, want[i].1);
                        assert!(s.data == want[i].2.as_slice());
                    }
                });
            }
        });
    }
}

#[test]
fn one_path_opened_twice_in_one_process() {
    let fx = Fixtures::new();
    let path = fx.path("raw_csv");
    let db = fx.db("raw_csv");
    let want = fx.samples("raw_csv");
    let a = LmdbSource::open(&path, &fx.options(db, Layout::Auto)).unwrap();
    // Same environment, another spelling of the path, other options.
    let b = LmdbSource::open(&path.join("."), &LmdbOptions::default()).unwrap();
    let c = LmdbSource::open(&path.join("data.mdb"), &fx.options(db, Layout::Raw)).unwrap();
    {
        let (mut ra, mut rb, mut rc) = (a.reader().unwrap(), b.reader().unwrap(), c.reader().unwrap());
        for (i, (key, label, bytes)) in want.iter().enumerate() {
            let (sa, sb, sc) = (
                ra.get(i as u64).unwrap(),
                rb.get(i as u64).unwrap(),
                rc.get(i as u64).unwrap(),
            );
            assert_eq!((sa.key, sa.label), (key.as_slice(), *label));
            assert_eq!((sb.key, sb.label), (key.as_slice(), NO_LABEL));
            assert_eq!((sc.key, sc.label), (key.as_slice(), *label));
            // One map: the very same bytes.
            assert_eq!(sa.data.as_ptr(), sb.data.as_ptr());
            assert_eq!(sa.data.as_ptr(), sc.data.as_ptr());
            assert!(sa.data == bytes.as_slice());
        }
    }
    drop(a);
    assert_eq!(b.reader().unwrap().get(0).unwrap().key, want[0].0.as_slice());
    drop((b, c));
    // Every source on the path is gone: it opens afresh, repeatedly, also from other threads.
    for _ in 0..3 {
        let d = LmdbSource::open(&path, &LmdbOptions::default()).unwrap();
        assert_eq!(d.len(), want.len() as u64);
    }
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..10 {
                    let s = LmdbSource::open(&path, &LmdbOptions::default()).unwrap();
                    assert_eq!(s.reader().unwrap().get(1).unwrap().key, want[1].0.as_slice());
                }
            });
        }
    });
    // The single-file environment too.
    let single = fx.path("raw_nosubdir.lmdb");
    let e = LmdbSource::open(&single, &LmdbOptions::default()).unwrap();
    let f = LmdbSource::open(&single, &LmdbOptions::default()).unwrap();
    assert_eq!(e.len(), f.len());
}

#[test]
fn paths_that_are_not_lmdbs() {
    let fx = Fixtures::new();
    let dir = fx.dir.path();

    let missing = dir.join("missing");
    let msg = LmdbSource::open(&missing, &LmdbOptions::default())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("cannot open") && msg.contains("no such file"), "{msg}");
    assert!(msg.contains(&missing.display().to_string()), "{msg}");

    let empty_dir = dir.join("empty_dir");
    fs::create_dir(&empty_dir).unwrap();
    let msg = LmdbSource::open(&empty_dir, &LmdbOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("not an lmdb environment: the directory has no data.mdb"),
        "{msg}"
    );
    assert!(!empty_dir.join("lock.mdb").exists());

    let text = dir.join("notes.txt");
    fs::write(&text, "hello, this is not an lmdb at all, just some text").unwrap();
    let msg = LmdbSource::open(&text, &LmdbOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("not an lmdb environment") && msg.contains("68 65 6c 6c 6f"),
        "{msg}"
    );
    assert!(!dir.join("notes.txt-lock").exists(), "a stray lock file was created");

    let empty = dir.join("empty.mdb");
    fs::write(&empty, "").unwrap();
    let msg = LmdbSource::open(&empty, &LmdbOptions::default())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("is empty"), "{msg}");

    // A directory whose data.mdb is garbage of a plausible size.
    let garbage = dir.join("garbage");
    fs::create_dir(&garbage).unwrap();
    fs::write(garbage.join("data.mdb"), vec![0x5a; 16384]).unwrap();
    let e = LmdbSource::open(&garbage, &LmdbOptions::default()).unwrap_err();
    assert!(matches!(e, LmdbError::NotLmdb { .. }), "{e:?}");

    // Image files are not lmdbs either.
    let img = fx.db("raw_csv")["samples"][0]["file"].as_str().unwrap().to_owned();
    let e = LmdbSource::open(&fx.path(&img), &LmdbOptions::default()).unwrap_err();
    assert!(e.to_string().contains("ff d8 ff"), "{e}");
}

#[test]
fn read_only_directory_opens_without_a_lock_file() {
    use std::os::unix::fs::PermissionsExt;

    let fx = Fixtures::new();
    let ro = fx.path("read_only");
    fs::create_dir(&ro).unwrap();
    fs::copy(fx.path("raw_json/data.mdb"), ro.join("data.mdb")).unwrap();
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).unwrap();
    // Root ignores directory permissions; then the lock file is simply created.
    let probe = ro.join("probe");
    let writable = fs::write(&probe, b"").is_ok();
    let _ = fs::remove_file(&probe);

    let want = fx.samples("raw_json");
    let opts = LmdbOptions {
        labels: LabelSource::File(fx.path("raw_json.labels.json")),
        ..LmdbOptions::default()
    };
    let result = LmdbSource::open(&ro, &opts);
    let seen: HashSet<Vec<u8>> = match &result {
        Ok(src) => {
            let mut r = src.reader().unwrap();
            (0..src.len()).map(|i| r.get(i).unwrap().data.to_vec()).collect()
        }
        Err(_) => HashSet::new(),
    };
    let lock_created = ro.join("lock.mdb").exists();
    let unlocked = result.as_ref().map(|s| s.is_unlocked()).unwrap_or(false);
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o755)).unwrap();

    let src = result.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(src.len(), want.len() as u64);
    assert_eq!(seen, want.iter().map(|s| s.2.clone()).collect::<HashSet<_>>());
    if writable {
        assert!(lock_created && !unlocked);
    } else {
        assert!(!lock_created, "a lock file appeared in a read-only directory");
        assert!(unlocked);
    }
}
