//! The shared vectors in `proto/vectors/shard/`: the Rust writer must reproduce them byte for byte,
//! the reader must read them, and each damage case must produce its pinned error kind.
//!
//! `RINGFEED_BLESS=1 cargo test -p ringfeed --test it vectors_are_current` regenerates them after a
//! deliberate format change; otherwise these tests fail when the committed files are stale.

use std::fs;
use std::path::{Path, PathBuf};

use ringfeed_format::shard::{Dataset, VerifyOptions, verify};
use serde_json::{Value, json};

use crate::support::{blessing, dataset_files, small_options, small_specs, write_dataset};

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto/vectors/shard")
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn expected_json() -> Value {
    let (samples, classes) = small_specs();
    json!({
        "description": "ringfeed packed dataset v1.0 vector: written by the Rust writer from tests/it/support.rs small_specs(), record_align 64, target shard size 1200 bytes",
        "record_align": 64,
        "classes": classes.iter().map(|c| hex(c)).collect::<Vec<_>>(),
        "samples": samples.iter().map(|s| json!({
            "key": hex(&s.key),
            "label": s.label,
            "meta": String::from_utf8(s.meta.clone()).unwrap(),
            "data": hex(&s.data),
        })).collect::<Vec<_>>(),
    })
}

/// A damage to apply to a copy of `v1-basic`.
fn apply(dir: &Path, case: &Value) {
    let file = dir.join(case["file"].as_str().unwrap());
    let mut b = fs::read(&file).unwrap();
    match case["op"].as_str().unwrap() {
        "xor" => {
            let at = case["offset"].as_u64().unwrap() as usize;
            b[at] ^= case["value"].as_u64().unwrap() as u8;
        }
        "truncate" => b.truncate(case["length"].as_u64().unwrap() as usize),
        "set_u16_fix_crc" => {
            // Write a u16 and recompute the CRC of the structure it belongs to.
            let at = case["offset"].as_u64().unwrap() as usize;
            b[at..at + 2].copy_from_slice(&(case["value"].as_u64().unwrap() as u16).to_le_bytes());
            let (start, end) = (
                case["crc_start"].as_u64().unwrap() as usize,
                case["crc_end"].as_u64().unwrap() as usize,
            );
            let c = crc32c::crc32c(&b[start..end]);
            b[end..end + 4].copy_from_slice(&c.to_le_bytes());
        }
        "patch_refresh_crcs" => {
            // Damage behind valid checksums: verify's later steps must find it.
            let at = case["offset"].as_u64().unwrap() as usize;
            let patch = unhex(case["bytes"].as_str().unwrap());
            b[at..at + patch.len()].copy_from_slice(&patch);
            fs::write(&file, b).unwrap();
            refresh_crcs(dir);
            return;
        }
        op => panic!("unknown op {op}"),
    }
    fs::write(&file, b).unwrap();
}

fn put_crc(b: &mut [u8], at: usize, start: usize, end: usize) {
    let c = crc32c::crc32c(&b[start..end]);
    b[at..at + 4].copy_from_slice(&c.to_le_bytes());
}

fn le_u32(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize
}

fn le_u64(b: &[u8], at: usize) -> usize {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize
}

/// Recomputes every CRC of a dataset except the records': each shard's header, table, body and
/// footer CRCs and its entry in the index, then the index's header, body and footer CRCs.
fn refresh_crcs(dir: &Path) {
    let index_path = dir.join("index.rfi");
    let mut index = fs::read(&index_path).unwrap();
    let (shard_count, shards_offset, heap_offset) = (le_u32(&index, 24), le_u64(&index, 32), le_u64(&index, 56));
    for n in 0..shard_count {
        let entry = shards_offset + n * 32;
        let (name_offset, name_len) = (le_u64(&index, entry), le_u32(&index, entry + 8));
        let name =
            std::str::from_utf8(&index[heap_offset + name_offset..heap_offset + name_offset + name_len]).unwrap();
        let path = dir.join(name);
        let mut b = fs::read(&path).unwrap();
        let footer = b.len() - 64;
        let (count, table) = (le_u32(&b, footer + 12), le_u64(&b, footer + 16));
        put_crc(&mut b, 60, 0, 60);
        put_crc(&mut b, footer + 32, table, table + 16 * count);
        put_crc(&mut b, footer + 36, 0, footer);
        put_crc(&mut b, footer + 60, footer, footer + 60);
        index[entry + 24..entry + 28].copy_from_slice(&b[footer + 36..footer + 40]);
        fs::write(&path, b).unwrap();
    }
    let footer = index.len() - 32;
    put_crc(&mut index, 124, 0, 124);
    put_crc(&mut index, footer + 12, 0, footer);
    put_crc(&mut index, footer + 28, footer, footer + 28);
    fs::write(&index_path, index).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for f in dataset_files(from) {
        fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
    }
}

/// The damage cases, located from the dataset's own structure so they stay meaningful.
fn case_list(dir: &Path) -> Vec<Value> {
    let ds = Dataset::open(dir).unwrap();
    let index_len = fs::metadata(dir.join("index.rfi")).unwrap().len();
    let s0 = ds.sample(0).unwrap();
    let (shard0, _, shard0_len) = ds.shard_info(0).unwrap();
    let shard_name = shard0.file_name().unwrap().to_str().unwrap().to_owned();
    let table_offset = {
        let b = fs::read(shard0).unwrap();
        u64::from_le_bytes(b[b.len() - 48..b.len() - 40].try_into().unwrap())
    };
    let x = |name: &str, file: &str, offset: u64, value: u8| json!({"name": name, "file": file, "op": "xor", "offset": offset, "value": value});
    let p = |name: &str, file: &str, offset: u64, bytes: &[u8]| json!({"name": format!("{name} (crcs refreshed)"), "file": file, "op": "patch_refresh_crcs", "offset": offset, "bytes": hex(bytes)});
    let index = fs::read(dir.join("index.rfi")).unwrap();
    let field = |at: usize| u64::from_le_bytes(index[at..at + 8].try_into().unwrap());
    let (shard_entry, classes_offset, samples_offset, heap_offset, info_offset) =
        (field(32), field(40), field(48), field(56), field(72));
    assert!(
        !ds.sample(0).unwrap().meta.is_empty(),
        "sample 0 of the vector has metadata"
    );
    let s1_offset = ds.sample(1).unwrap().offset;
    let t =
        |name: &str, file: &str, length: u64| json!({"name": name, "file": file, "op": "truncate", "length": length});
    vec![
        x("index header magic", "index.rfi", 0, 0x01),
        x("index header sample count", "index.rfi", 16, 0x01),
        json!({"name": "index major version 2 with a valid header crc", "file": "index.rfi", "op": "set_u16_fix_crc", "offset": 8, "value": 2, "crc_start": 0, "crc_end": 124}),
        x(
            "index sample table label",
            "index.rfi",
            128 + 32 * u64::from(ds.shard_count()) + 16 * u64::from(ds.class_count()),
            0x01,
        ),
        x("index footer crc", "index.rfi", index_len - 4, 0x01),
        x("index footer magic", "index.rfi", index_len - 32, 0x01),
        t("index cut to 100 bytes", "index.rfi", 100),
        t("index missing its last byte", "index.rfi", index_len - 1),
        x("shard header magic", &shard_name, 0, 0x01),
        json!({"name": "shard major version 2 with a valid header crc", "file": &shard_name, "op": "set_u16_fix_crc", "offset": 8, "value": 2, "crc_start": 0, "crc_end": 60}),
        x("shard header reserved byte", &shard_name, 30, 0x01),
        x("first record's first byte", &shard_name, s0.offset, 0x80),
        x(
            "padding after the first record",
            &shard_name,
            s0.offset + s0.data.len() as u64,
            0x01,
        ),
        x("record table entry", &shard_name, table_offset + 8, 0x01),
        x("shard footer body crc", &shard_name, shard0_len - 64 + 36, 0x01),
        t("shard missing its footer", &shard_name, shard0_len - 64),
        t("shard cut to zero bytes", &shard_name, 0),
        // Damage behind valid CRCs, found by verify's content checks (steps 3 to 5).
        p("index flags", "index.rfi", 12, &[1]),
        p("index header reserved byte", "index.rfi", 100, &[1]),
        p("index footer reserved byte", "index.rfi", index_len - 32 + 24, &[1]),
        p("shard entry reserved byte", "index.rfi", shard_entry + 28, &[1]),
        p("class entry reserved byte", "index.rfi", classes_offset + 12, &[1]),
        p("padding before the info", "index.rfi", info_offset - 1, &[1]),
        p("info is not a json object", "index.rfi", info_offset, b"["),
        p("label past the classes", "index.rfi", samples_offset, &[3]),
        p(
            "label below -1",
            "index.rfi",
            samples_offset,
            &[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        ),
        p(
            "metadata not a json object",
            "index.rfi",
            heap_offset + s0.key.len() as u64,
            b"[",
        ),
        p("record used twice", "index.rfi", samples_offset + 32 + 28, &[0]),
        p("shard header reserved byte", &shard_name, 30, &[1]),
        p("shard footer reserved byte", &shard_name, shard0_len - 64 + 50, &[1]),
        p(
            "record not where the layout puts it",
            &shard_name,
            table_offset + 16,
            &[s1_offset as u8 ^ 8],
        ),
    ]
}

/// Applies a case to a copy of `v1-basic` and returns what `verify` reports: kind, file name and
/// byte offset (`null` where the error has none), or kind `ok`.
fn run_case(case: &Value) -> Value {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    copy_dir(&vectors_dir().join("v1-basic"), &dir);
    apply(&dir, case);
    match verify(&dir, &VerifyOptions::default()) {
        Ok(_) => json!({"kind": "ok"}),
        Err(e) => {
            let (file, offset) = match &e {
                ringfeed_format::shard::VerifyError::Format(f) => f.location(),
                other => panic!("unexpected {other}"),
            };
            let file = file
                .and_then(|f| f.strip_prefix(&dir).ok())
                .map(|f| f.display().to_string());
            json!({"kind": e.kind(), "error_file": file, "error_offset": offset})
        }
    }
}

#[test]
fn vectors_are_current() {
    let tmp = tempfile::tempdir().unwrap();
    let fresh = tmp.path().join("v1-basic");
    let (samples, classes) = small_specs();
    write_dataset(&fresh, &samples, &classes, small_options());
    let committed = vectors_dir().join("v1-basic");
    let expected = serde_json::to_string_pretty(&expected_json()).unwrap() + "\n";
    if blessing() {
        let _ = fs::remove_dir_all(&committed);
        copy_dir(&fresh, &committed);
        fs::write(vectors_dir().join("expected.json"), &expected).unwrap();
        let cases: Vec<Value> = case_list(&committed)
            .into_iter()
            .map(|mut c| {
                let found = run_case(&c);
                for k in ["kind", "error_file", "error_offset"] {
                    c[k] = found[k].clone();
                }
                c
            })
            .collect();
        fs::write(
            vectors_dir().join("cases.json"),
            serde_json::to_string_pretty(&cases).unwrap() + "\n",
        )
        .unwrap();
    }
    let stale = "the committed vectors are stale; if the format change is deliberate, run `RINGFEED_BLESS=1 cargo test -p ringfeed --test it vectors_are_current` and commit proto/vectors";
    let names = |d: &Path| {
        dataset_files(d)
            .iter()
            .map(|f| f.file_name().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&fresh), names(&committed), "{stale}");
    for f in dataset_files(&fresh) {
        let c = committed.join(f.file_name().unwrap());
        assert!(
            fs::read(&f).unwrap() == fs::read(&c).unwrap(),
            "{} differs: {stale}",
            c.display()
        );
    }
    assert_eq!(
        fs::read_to_string(vectors_dir().join("expected.json")).unwrap(),
        expected,
        "{stale}"
    );
    let committed_cases: Vec<Value> =
        serde_json::from_str(&fs::read_to_string(vectors_dir().join("cases.json")).unwrap()).unwrap();
    let located = case_list(&committed);
    assert_eq!(committed_cases.len(), located.len(), "{stale}");
    for (c, l) in committed_cases.iter().zip(&located) {
        let mut c = c.clone();
        for k in ["kind", "error_file", "error_offset"] {
            c.as_object_mut().unwrap().remove(k);
        }
        assert_eq!(&c, l, "{stale}");
    }
}

/// The reader returns exactly what `expected.json` describes.
#[test]
fn vectors_read_back() {
    let expected: Value =
        serde_json::from_str(&fs::read_to_string(vectors_dir().join("expected.json")).unwrap()).unwrap();
    let ds = Dataset::open(&vectors_dir().join("v1-basic")).unwrap();
    let classes = expected["classes"].as_array().unwrap();
    assert_eq!(ds.class_count() as usize, classes.len());
    for (c, name) in classes.iter().enumerate() {
        assert_eq!(ds.class_name(c as u32).unwrap(), unhex(name.as_str().unwrap()));
    }
    let samples = expected["samples"].as_array().unwrap();
    assert_eq!(ds.len() as usize, samples.len());
    for (i, e) in samples.iter().enumerate() {
        let s = ds.sample_checked(i as u64).unwrap();
        assert_eq!(s.key, unhex(e["key"].as_str().unwrap()), "sample {i}");
        assert_eq!(s.label, e["label"].as_i64().unwrap(), "sample {i}");
        assert_eq!(s.meta, e["meta"].as_str().unwrap().as_bytes(), "sample {i}");
        assert_eq!(s.data, unhex(e["data"].as_str().unwrap()), "sample {i}");
    }
    verify(&vectors_dir().join("v1-basic"), &VerifyOptions::default()).unwrap();
}

/// Each damage case produces its pinned error kind.
#[test]
fn vector_cases() {
    let cases: Vec<Value> =
        serde_json::from_str(&fs::read_to_string(vectors_dir().join("cases.json")).unwrap()).unwrap();
    assert!(cases.len() >= 10);
    for case in &cases {
        let found = run_case(case);
        assert_ne!(found["kind"], "ok", "case {} went unnoticed", case["name"]);
        for k in ["kind", "error_file", "error_offset"] {
            assert_eq!(found[k], case[k], "case {}: {k}", case["name"]);
        }
    }
}
