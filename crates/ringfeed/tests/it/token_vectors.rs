//! The shared vectors in `proto/vectors/tokens/`: the Rust writer must reproduce them byte for
//! byte, the reader must read them, and each damage case must produce its pinned error.
//!
//! `RINGFEED_BLESS=1 cargo test -p ringfeed --test it token_vectors_are_current` regenerates them.

use std::fs;
use std::path::{Path, PathBuf};

use ringfeed_format::tokens::packing::{self, PACK_HEADER_LEN, Packing};
use ringfeed_format::tokens::{Layout, TOKENS_FILE, TokenFile, TokenWriter, TokenWriterOptions, verify_tokens};
use serde_json::{Value, json};

use crate::support::blessing;

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto/vectors/tokens")
}

/// One vector dataset: its writer options, documents (tokens, prompt length) and the seq_lens
/// of its packing files (1.1).
struct Spec {
    name: &'static str,
    opts: TokenWriterOptions,
    docs: Vec<(Vec<u32>, u32)>,
    info: &'static str,
    packings: &'static [u32],
}

fn specs() -> Vec<Spec> {
    // A small deterministic generator: the documents have lengths 1..=9 plus the EOS.
    let mut x = 12345u32;
    let mut next = move |m: u32| {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        (x >> 8) % m
    };
    let mut basic = Vec::new();
    for (len, prompt) in [(3usize, 1u32), (9, 4), (1, 0), (6, 2), (4, 0)] {
        let mut t: Vec<u32> = (0..len).map(|_| next(998)).collect();
        t.push(999);
        basic.push((t, prompt));
    }
    let wide = vec![
        (vec![0, 65_535, 65_536, 69_999], 0),
        (vec![12, 70_000 - 2], 0),
        (vec![65_537], 0),
    ];
    vec![
        Spec {
            name: "v1-basic",
            opts: TokenWriterOptions {
                vocab_size: 1000,
                eos_id: Some(999),
                prompts: true,
                chunk_bytes: 16,
            },
            docs: basic,
            info: r#"{"format":"ringfeed-tokens","version":"1.0","writer":"vectors","source_kind":"jsonl"}"#,
            // Windows of 5 tokens (two documents cut) and of 10.
            packings: &[4, 9],
        },
        Spec {
            name: "v1-wide",
            opts: TokenWriterOptions {
                vocab_size: 70_000,
                eos_id: None,
                prompts: false,
                chunk_bytes: 1 << 20,
            },
            docs: wide,
            info: r#"{"format":"ringfeed-tokens","version":"1.0","writer":"vectors","source_kind":"text"}"#,
            packings: &[],
        },
    ]
}

fn write(spec: &Spec, dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    let mut w = TokenWriter::create(&dir.join(TOKENS_FILE), spec.opts).unwrap();
    for (t, p) in &spec.docs {
        w.push(t, *p).unwrap();
    }
    w.finish(spec.info).unwrap();
    let tf = TokenFile::open(dir).unwrap();
    for &s in spec.packings {
        packing::write(&tf, s).unwrap();
    }
}

/// The files of a vector dataset.
fn files(spec: &Spec) -> Vec<String> {
    let mut f = vec![TOKENS_FILE.to_owned()];
    f.extend(spec.packings.iter().map(|&s| packing::file_name(s)));
    f
}

/// Each packing's counts and tables, read back from the written files.
fn packings_json(spec: &Spec, dir: &Path) -> Value {
    let tf = TokenFile::open(dir).unwrap();
    let m: serde_json::Map<String, Value> = spec
        .packings
        .iter()
        .map(|&s| {
            let p = Packing::open(&tf, s).unwrap().unwrap();
            let starts: Vec<u64> = (0..p.len())
                .map(|w| p.bin_range(w).unwrap().start)
                .chain([tf.doc_count()])
                .collect();
            let bins: Vec<u64> = (0..tf.doc_count()).map(|k| p.bin_doc(k).unwrap()).collect();
            (
                s.to_string(),
                json!({"window_count": p.len(), "cut_tokens": p.header.cut_tokens, "bin_starts": starts, "bins": bins}),
            )
        })
        .collect();
    Value::Object(m)
}

fn expected(specs: &[Spec], root: &Path) -> Value {
    let sets: serde_json::Map<String, Value> = specs
        .iter()
        .map(|s| {
            let tokens: Vec<u32> = s.docs.iter().flat_map(|d| d.0.clone()).collect();
            let mut starts = vec![0u64];
            for d in &s.docs {
                starts.push(starts.last().unwrap() + d.0.len() as u64);
            }
            (
                s.name.to_owned(),
                json!({
                    "token_width": if s.opts.vocab_size > 65_536 { 4 } else { 2 },
                    "vocab_size": s.opts.vocab_size,
                    "eos_id": s.opts.eos_id,
                    "chunk_bytes": s.opts.chunk_bytes,
                    "tokens": tokens,
                    "doc_starts": starts,
                    "prompt_lens": if s.opts.prompts { json!(s.docs.iter().map(|d| d.1).collect::<Vec<_>>()) } else { Value::Null },
                    "info": s.info,
                    "packings": packings_json(s, &root.join(s.name)),
                }),
            )
        })
        .collect();
    json!({
        "description": "ringfeed token dataset v1.1 vectors (tokens.rft 1.0, packing files 1.1), written by the Rust writer (crates/ringfeed/tests/it/token_vectors.rs)",
        "datasets": sets,
    })
}

/// Damages of `v1-basic`, each with what `verify` must report first.
fn cases(dir: &Path) -> Value {
    let tf = TokenFile::open(dir).unwrap();
    let l: Layout = tf.footer.layout;
    let len = l.file_len;
    let footer = l.footer_offset;
    let f = TOKENS_FILE;
    let doc0_end = tf.doc_start(1);
    let p4 = packing::file_name(4);
    let p4_len = fs::metadata(dir.join(&p4)).unwrap().len();
    let p4_bins = PACK_HEADER_LEN as u64 + 8 * (Packing::open(&tf, 4).unwrap().unwrap().len() + 1);
    json!([
        {"name": "header magic", "op": "xor", "file": f, "offset": 0, "value": 1, "kind": "bad_magic", "error_offset": 0},
        {"name": "footer magic", "op": "xor", "file": f, "offset": footer + 3, "value": 1, "kind": "bad_magic", "error_offset": footer},
        {"name": "shorter than a page and a footer", "op": "truncate", "file": f, "length": 4096 + 100, "kind": "truncated", "error_offset": 4196},
        {"name": "cut by 8 bytes: no footer at the end", "op": "truncate", "file": f, "length": len - 8, "kind": "bad_magic", "error_offset": len - 8 - 128},
        {"name": "header major version 2", "op": "set_u16_fix_crc", "file": f, "offset": 8, "value": 2, "crc_start": 0, "crc_end": 60, "kind": "unsupported_version", "error_offset": 8},
        {"name": "footer major version 2", "op": "set_u16_fix_crc", "file": f, "offset": footer + 8, "value": 2, "crc_start": footer, "crc_end": footer + 124, "kind": "unsupported_version", "error_offset": footer + 8},
        {"name": "header field flipped", "op": "xor", "file": f, "offset": 16, "value": 4, "kind": "checksum", "error_offset": 60},
        {"name": "footer count flipped", "op": "xor", "file": f, "offset": footer + 16, "value": 1, "kind": "checksum", "error_offset": footer + 124},
        {"name": "file length disagrees", "op": "set_u16_fix_crc", "file": f, "offset": footer + 72, "value": 7, "crc_start": footer, "crc_end": footer + 124, "kind": "truncated", "error_offset": footer + 72},
        {"name": "token byte flipped", "op": "xor", "file": f, "offset": 4096 + 21, "value": 1, "kind": "checksum", "error_offset": 4096 + 16},
        {"name": "document table byte flipped", "op": "xor", "file": f, "offset": l.docs_offset + 9, "value": 1, "kind": "checksum", "error_offset": footer + 88},
        {"name": "prompt length flipped", "op": "xor", "file": f, "offset": l.prompts_offset, "value": 1, "kind": "checksum", "error_offset": footer + 92},
        {"name": "info byte flipped", "op": "xor", "file": f, "offset": l.info_offset + 2, "value": 1, "kind": "checksum", "error_offset": footer + 100},
        {"name": "non-zero header padding", "op": "patch_refresh_crcs", "file": f, "offset": 100, "bytes": "01", "kind": "corrupt", "error_offset": 100},
        {"name": "non-zero reserved header byte", "op": "patch_refresh_crcs", "file": f, "offset": 40, "bytes": "01", "kind": "corrupt", "error_offset": 40},
        {"name": "empty document in the table", "op": "patch_refresh_crcs", "file": f, "offset": l.docs_offset + 16, "bytes": hex_u64(doc0_end), "kind": "corrupt", "error_offset": l.docs_offset + 16},
        {"name": "prompt covers its whole document", "op": "patch_refresh_crcs", "file": f, "offset": l.prompts_offset, "bytes": "ff000000", "kind": "corrupt", "error_offset": l.prompts_offset},
        {"name": "token id past the vocabulary", "op": "patch_refresh_crcs", "file": f, "offset": 4096 + 2, "bytes": "e803", "kind": "corrupt", "error_offset": 4096 + 2},
        {"name": "document without its EOS", "op": "patch_refresh_crcs", "file": f, "offset": 4096 + 2 * (doc0_end - 1), "bytes": "0100", "kind": "corrupt", "error_offset": 4096 + 2 * (doc0_end - 1)},
        {"name": "non-zero padding after the info", "op": "patch_refresh_crcs", "file": f, "offset": footer - 1, "bytes": "20", "kind": "corrupt", "error_offset": footer - 1},
        {"name": "info not a JSON object", "op": "patch_refresh_crcs", "file": f, "offset": l.info_offset, "bytes": "5b", "kind": "corrupt", "error_offset": l.info_offset},
        {"name": "packing magic", "op": "xor", "file": p4, "offset": 1, "value": 1, "kind": "bad_magic", "error_offset": 0},
        {"name": "packing header field flipped", "op": "xor", "file": p4, "offset": 40, "value": 1, "kind": "checksum", "error_offset": 60},
        {"name": "packing major version 2", "op": "set_u16_fix_crc", "file": p4, "offset": 8, "value": 2, "crc_start": 0, "crc_end": 60, "kind": "unsupported_version", "error_offset": 8},
        {"name": "packing cut short", "op": "truncate", "file": p4, "length": p4_len - 8, "kind": "truncated", "error_offset": 16},
        {"name": "packing shorter than its header", "op": "truncate", "file": p4, "length": 40, "kind": "truncated", "error_offset": 40},
        {"name": "packing for another seq_len", "op": "patch_refresh_crcs", "file": p4, "offset": 12, "bytes": "05000000", "kind": "corrupt", "error_offset": 12},
        {"name": "packing of another dataset", "op": "patch_refresh_crcs", "file": p4, "offset": 48, "bytes": "00000000", "kind": "corrupt", "error_offset": 48},
        {"name": "packing table byte flipped", "op": "xor", "file": p4, "offset": p4_bins + 3, "value": 1, "kind": "checksum", "error_offset": 52},
        {"name": "packing window table not increasing", "op": "patch_refresh_crcs", "file": p4, "offset": PACK_HEADER_LEN + 8, "bytes": hex_u64(0), "kind": "corrupt", "error_offset": PACK_HEADER_LEN + 8},
        {"name": "packing not best-fit decreasing", "op": "patch_refresh_crcs", "file": p4, "offset": p4_bins, "bytes": hex_u64(4), "kind": "corrupt", "error_offset": p4_bins},
        {"name": "packing cut_tokens wrong", "op": "patch_refresh_crcs", "file": p4, "offset": 40, "bytes": hex_u64(0), "kind": "corrupt", "error_offset": 40},
    ])
}

fn hex_u64(v: u64) -> String {
    v.to_le_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn put_crc(b: &mut [u8], at: usize, start: usize, end: usize) {
    let c = crc32c::crc32c(&b[start..end]);
    b[at..at + 4].copy_from_slice(&c.to_le_bytes());
}

/// Recomputes every CRC of a token file from its footer's counts and offsets: header, every
/// chunk, the chunk table, documents, prompts, info, footer.
pub fn refresh_crcs(file: &Path) {
    let mut b = fs::read(file).unwrap();
    if file.extension().is_some_and(|e| e == "rfp") {
        // A packing file: its tables, then its header.
        let n = b.len();
        put_crc(&mut b, 52, PACK_HEADER_LEN, n);
        put_crc(&mut b, 60, 0, 60);
        fs::write(file, b).unwrap();
        return;
    }
    let footer = b.len() - 128;
    let width = b[12] as usize;
    let (tokens, docs) = (le_u64(&b, footer + 16) as usize, le_u64(&b, footer + 24) as usize);
    let (docs_off, prompts_off, chunks_off, info_off) = (
        le_u64(&b, footer + 32) as usize,
        le_u64(&b, footer + 40) as usize,
        le_u64(&b, footer + 48) as usize,
        le_u64(&b, footer + 56) as usize,
    );
    let info_len = le_u64(&b, footer + 64) as usize;
    let (chunk_bytes, chunk_count) = (le_u32(&b, footer + 80) as usize, le_u32(&b, footer + 84) as usize);
    let prompts_len = if le_u32(&b, footer + 12) & 1 != 0 { 4 * docs } else { 0 };
    put_crc(&mut b, 60, 0, 60);
    let tokens_end = 4096 + tokens * width;
    for c in 0..chunk_count {
        let s = 4096 + c * chunk_bytes;
        let e = (s + chunk_bytes).min(tokens_end);
        put_crc(&mut b, chunks_off + 4 * c, s, e);
    }
    put_crc(&mut b, footer + 88, docs_off, docs_off + 8 * (docs + 1));
    put_crc(&mut b, footer + 92, prompts_off, prompts_off + prompts_len);
    put_crc(&mut b, footer + 96, chunks_off, chunks_off + 4 * chunk_count);
    put_crc(&mut b, footer + 100, info_off, info_off + info_len);
    put_crc(&mut b, footer + 124, footer, footer + 124);
    fs::write(file, b).unwrap();
}

fn apply(dir: &Path, case: &Value) {
    let file = dir.join(case["file"].as_str().unwrap());
    let mut b = fs::read(&file).unwrap();
    let at = case["offset"].as_u64().unwrap_or(0) as usize;
    match case["op"].as_str().unwrap() {
        "xor" => b[at] ^= case["value"].as_u64().unwrap() as u8,
        "truncate" => b.truncate(case["length"].as_u64().unwrap() as usize),
        "set_u16_fix_crc" => {
            b[at..at + 2].copy_from_slice(&(case["value"].as_u64().unwrap() as u16).to_le_bytes());
            let (s, e) = (
                case["crc_start"].as_u64().unwrap() as usize,
                case["crc_end"].as_u64().unwrap() as usize,
            );
            put_crc(&mut b, e, s, e);
        }
        "patch_refresh_crcs" => {
            let patch = unhex(case["bytes"].as_str().unwrap());
            b[at..at + patch.len()].copy_from_slice(&patch);
            fs::write(&file, b).unwrap();
            refresh_crcs(&file);
            return;
        }
        op => panic!("unknown op {op}"),
    }
    fs::write(&file, b).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn token_vectors_are_current() {
    let tmp = tempfile::tempdir().unwrap();
    let specs = specs();
    for s in &specs {
        write(s, &tmp.path().join(s.name));
    }
    let expected = serde_json::to_string_pretty(&expected(&specs, tmp.path())).unwrap() + "\n";
    let cases = serde_json::to_string_pretty(&cases(&tmp.path().join("v1-basic"))).unwrap() + "\n";
    let dir = vectors_dir();
    if blessing() {
        for s in &specs {
            fs::create_dir_all(dir.join(s.name)).unwrap();
            for f in files(s) {
                fs::copy(tmp.path().join(s.name).join(&f), dir.join(s.name).join(&f)).unwrap();
            }
        }
        fs::write(dir.join("expected.json"), &expected).unwrap();
        fs::write(dir.join("cases.json"), &cases).unwrap();
    }
    for s in &specs {
        for f in files(s) {
            let committed = fs::read(dir.join(s.name).join(&f)).expect("vectors exist (bless them)");
            let fresh = fs::read(tmp.path().join(s.name).join(&f)).unwrap();
            assert!(
                committed == fresh,
                "{}/{f} is stale: rerun with RINGFEED_BLESS=1",
                s.name
            );
        }
        let mut present: Vec<String> = fs::read_dir(dir.join(s.name))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        present.sort();
        let mut want = files(s);
        want.sort();
        assert_eq!(present, want, "{}: files that are not vectors", s.name);
    }
    assert_eq!(
        fs::read_to_string(dir.join("expected.json")).unwrap(),
        expected,
        "expected.json is stale"
    );
    assert_eq!(
        fs::read_to_string(dir.join("cases.json")).unwrap(),
        cases,
        "cases.json is stale"
    );
}

#[test]
fn token_vectors_read_back_exactly() {
    let exp: Value = serde_json::from_str(&fs::read_to_string(vectors_dir().join("expected.json")).unwrap()).unwrap();
    for (name, e) in exp["datasets"].as_object().unwrap() {
        let dir = vectors_dir().join(name);
        let tf = TokenFile::open(&dir).unwrap();
        assert_eq!(u64::from(tf.width()), e["token_width"].as_u64().unwrap(), "{name}");
        assert_eq!(tf.eos_id().map(u64::from), e["eos_id"].as_u64(), "{name}");
        let mut got = Vec::new();
        tf.tokens_into(0..tf.token_count(), &mut got);
        let want: Vec<u32> = e["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(got, want, "{name}");
        let starts: Vec<u64> = e["doc_starts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        for d in 0..tf.doc_count() {
            assert_eq!(tf.doc(d).unwrap(), starts[d as usize]..starts[d as usize + 1]);
            if let Some(p) = e["prompt_lens"].as_array() {
                assert_eq!(u64::from(tf.prompt_len(d)), p[d as usize].as_u64().unwrap());
            }
            assert_eq!(tf.doc_of(starts[d as usize]), d);
        }
        assert_eq!(tf.info().unwrap(), e["info"].as_str().unwrap());
        for (s, pe) in e["packings"].as_object().unwrap() {
            let p = Packing::open(&tf, s.parse().unwrap()).unwrap().unwrap();
            assert_eq!(p.len(), pe["window_count"].as_u64().unwrap(), "{name} packing {s}");
            assert_eq!(p.header.cut_tokens, pe["cut_tokens"].as_u64().unwrap());
            let bins: Vec<u64> = pe["bins"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            let starts: Vec<u64> = pe["bin_starts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            for w in 0..p.len() {
                let r = p.bin_range(w).unwrap();
                assert_eq!(r, starts[w as usize]..starts[w as usize + 1]);
                for k in r {
                    assert_eq!(p.bin_doc(k).unwrap(), bins[k as usize]);
                }
            }
        }
        let report = verify_tokens(&dir).unwrap();
        let want: Vec<u32> = e["packings"]
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.parse().unwrap())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(report.packings, want, "{name}");
    }
}

#[test]
fn token_damage_cases_report_their_pinned_error() {
    let cases: Value = serde_json::from_str(&fs::read_to_string(vectors_dir().join("cases.json")).unwrap()).unwrap();
    for case in cases.as_array().unwrap() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ds");
        copy_dir(&vectors_dir().join("v1-basic"), &dir);
        apply(&dir, case);
        let err = verify_tokens(&dir).expect_err(case["name"].as_str().unwrap());
        let (_, offset) = err.location();
        assert_eq!(err.kind(), case["kind"].as_str().unwrap(), "{}: {err}", case["name"]);
        assert_eq!(offset, case["error_offset"].as_u64(), "{}: {err}", case["name"]);
    }
}
