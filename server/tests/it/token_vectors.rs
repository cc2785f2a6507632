//! The shared vectors in `proto/vectors/tokens/`: the Rust writer must reproduce them byte for
//! byte, the reader must read them, and each damage case must produce its pinned error.
//!
//! `RINGFEED_BLESS=1 cargo test -p ringfeed --test it token_vectors_are_current` regenerates them.

use std::fs;
use std::path::{Path, PathBuf};

use ringfeed::tokens::{Layout, TOKENS_FILE, TokenFile, TokenWriter, TokenWriterOptions, verify_tokens};
use serde_json::{Value, json};

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/vectors/tokens")
}

fn blessing() -> bool {
    std::env::var_os("RINGFEED_BLESS").is_some_and(|v| v == "1")
}

/// One vector dataset: its writer options and documents (tokens, prompt length).
struct Spec {
    name: &'static str,
    opts: TokenWriterOptions,
    docs: Vec<(Vec<u32>, u32)>,
    info: &'static str,
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
}

fn expected(specs: &[Spec]) -> Value {
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
                }),
            )
        })
        .collect();
    json!({
        "description": "ringfeed token dataset v1.0 vectors, written by the Rust writer (server/tests/it/token_vectors.rs)",
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
    let expected = serde_json::to_string_pretty(&expected(&specs)).unwrap() + "\n";
    let cases = serde_json::to_string_pretty(&cases(&tmp.path().join("v1-basic"))).unwrap() + "\n";
    let dir = vectors_dir();
    if blessing() {
        for s in &specs {
            fs::create_dir_all(dir.join(s.name)).unwrap();
            fs::copy(
                tmp.path().join(s.name).join(TOKENS_FILE),
                dir.join(s.name).join(TOKENS_FILE),
            )
            .unwrap();
        }
        fs::write(dir.join("expected.json"), &expected).unwrap();
        fs::write(dir.join("cases.json"), &cases).unwrap();
    }
    for s in &specs {
        let committed = fs::read(dir.join(s.name).join(TOKENS_FILE)).expect("vectors exist (bless them)");
        let fresh = fs::read(tmp.path().join(s.name).join(TOKENS_FILE)).unwrap();
        assert!(committed == fresh, "{} is stale: rerun with RINGFEED_BLESS=1", s.name);
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
        verify_tokens(&dir).unwrap();
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
