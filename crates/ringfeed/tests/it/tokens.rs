//! Text packing and token files end to end through the library: JSONL and plain text in, token
//! datasets out, read back; bad inputs named with file and line; Megatron files read in place.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use ringfeed_format::tokens::{TOKENS_FILE, TokenFile, TokenSource, verify_tokens};
use ringfeed_pack::text::{Eos, TextPackOptions, pack_text};
use ringfeed_pack::{OnError, PackError, ProgressMode};

fn no_cancel() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

/// A word-level tokenizer.json: `<|endoftext|>` 0, `[UNK]` 1, then the words, split on
/// whitespace; `big` adds one word with id 70,000 (a vocabulary past uint16).
fn write_tokenizer(dir: &Path, words: &[&str], big: bool) -> PathBuf {
    let mut vocab = serde_json::Map::new();
    vocab.insert("<|endoftext|>".into(), 0.into());
    vocab.insert("[UNK]".into(), 1.into());
    for (i, w) in words.iter().enumerate() {
        vocab.insert((*w).into(), (i + 2).into());
    }
    if big {
        vocab.insert("huge".into(), 70_000.into());
    }
    let t = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 0, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    });
    let p = dir.join("tokenizer.json");
    fs::write(&p, t.to_string()).unwrap();
    p
}

const WORDS: [&str; 6] = ["the", "cat", "sat", "on", "mat", "why"];

fn opts(tok: PathBuf) -> TextPackOptions {
    TextPackOptions {
        progress: ProgressMode::None,
        chunk_bytes: 64,
        ..TextPackOptions::new(tok)
    }
}

fn read_all(dir: &Path) -> (TokenFile, Vec<Vec<u32>>) {
    let tf = TokenFile::open(dir).unwrap();
    let docs = (0..tf.doc_count())
        .map(|d| {
            let mut v = Vec::new();
            tf.tokens_into(tf.doc(d).unwrap(), &mut v);
            v
        })
        .collect();
    (tf, docs)
}

/// JSONL documents are tokenised in order, each followed by the EOS; blank lines are ignored;
/// the file verifies; any thread count gives the same bytes, packing files (`--pack-seq-len`)
/// included.
#[test]
fn jsonl_round_trip_is_deterministic() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = write_tokenizer(tmp.path(), &WORDS, false);
    let src = tmp.path().join("c.jsonl");
    let mut text = String::new();
    for i in 0..2000 {
        let words: Vec<&str> = (0..(i % 17 + 1)).map(|j| WORDS[(i * 7 + j) % WORDS.len()]).collect();
        text += &serde_json::json!({"id": i, "text": words.join(" ")}).to_string();
        text += if i == 5 { "\n\n" } else { "\n" };
    }
    fs::write(&src, text).unwrap();
    let mut outs = Vec::new();
    for threads in [1, 3] {
        let out = tmp.path().join(format!("out{threads}"));
        let o = TextPackOptions {
            threads,
            pack_seq_lens: vec![16, 8, 16],
            ..opts(tok.clone())
        };
        let s = pack_text(&src, &out, &o, &no_cancel()).unwrap();
        assert_eq!(s.documents, 2000);
        assert_eq!(s.blank_lines, 1);
        assert_eq!(s.width, 2);
        assert_eq!(s.packings.iter().map(|p| p.0).collect::<Vec<_>>(), [8, 16]);
        outs.push(
            [TOKENS_FILE, "packing-8.rfp", "packing-16.rfp"]
                .map(|f| fs::read(out.join(f)).unwrap())
                .to_vec(),
        );
        assert_eq!(verify_tokens(&out).unwrap().packings, [8, 16]);
    }
    assert!(outs[0] == outs[1], "1 and 3 threads wrote different bytes");
    let (tf, docs) = read_all(&tmp.path().join("out1"));
    assert_eq!(tf.eos_id(), Some(0));
    for (i, d) in docs.iter().enumerate() {
        let want: Vec<u32> = (0..(i % 17 + 1))
            .map(|j| ((i * 7 + j) % WORDS.len()) as u32 + 2)
            .chain([0])
            .collect();
        assert_eq!(d, &want, "document {i}");
    }
    assert!(
        !tmp.path()
            .read_dir()
            .unwrap()
            .any(|e| e.unwrap().file_name().to_string_lossy().contains("partial"))
    );
}

/// A vocabulary with an id above 65,535 switches to uint32 tokens, and the id survives.
#[test]
fn a_large_vocabulary_gets_uint32_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = write_tokenizer(tmp.path(), &WORDS, true);
    let src = tmp.path().join("c.jsonl");
    fs::write(&src, "{\"text\": \"the huge cat\"}\n").unwrap();
    let out = tmp.path().join("out");
    let s = pack_text(&src, &out, &opts(tok), &no_cancel()).unwrap();
    assert_eq!((s.width, s.vocab_size), (4, 70_001));
    let (tf, docs) = read_all(&out);
    assert_eq!(tf.width(), 4);
    assert_eq!(docs, vec![vec![2, 70_000, 3, 0]]);
}

/// Prompt/completion pairs record the prompt's token count; the completion ends with the EOS.
#[test]
fn prompt_completion_pairs_record_prompt_lengths() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = write_tokenizer(tmp.path(), &WORDS, false);
    let src = tmp.path().join("sft.jsonl");
    fs::write(
        &src,
        "{\"prompt\": \"why the cat\", \"completion\": \"sat\"}\n{\"prompt\": \"\", \"completion\": \"on the mat\"}\n",
    )
    .unwrap();
    let out = tmp.path().join("out");
    let o = TextPackOptions {
        prompt_field: Some("prompt".into()),
        completion_field: Some("completion".into()),
        ..opts(tok)
    };
    pack_text(&src, &out, &o, &no_cancel()).unwrap();
    let (tf, docs) = read_all(&out);
    assert!(tf.has_prompts());
    assert_eq!(docs, vec![vec![7, 2, 3, 4, 0], vec![5, 2, 6, 0]]);
    assert_eq!((tf.prompt_len(0), tf.prompt_len(1)), (3, 0));
    verify_tokens(&out).unwrap();
}

/// Plain-text files are one document each, directories sorted bytewise.
#[test]
fn plain_text_files_are_documents() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = write_tokenizer(tmp.path(), &WORDS, false);
    let src = tmp.path().join("txt");
    fs::create_dir_all(src.join("b")).unwrap();
    fs::write(src.join("b/2.txt"), "on the mat\n").unwrap();
    fs::write(src.join("a.txt"), "the cat\nsat").unwrap();
    fs::write(src.join("skip.md"), "not text input").unwrap();
    let out = tmp.path().join("out");
    let s = pack_text(&src, &out, &opts(tok), &no_cancel()).unwrap();
    assert_eq!(s.input, "text");
    let (_, docs) = read_all(&out);
    assert_eq!(docs, vec![vec![2, 3, 4, 0], vec![5, 2, 6, 0]]);
}

/// Each bad input is an error naming the file and line and the setting involved; nothing is
/// written; with `--on-error skip` the good documents are packed and the bad ones reported.
#[test]
fn bad_inputs_are_named_with_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = write_tokenizer(tmp.path(), &WORDS, false);
    let cases: [(&[u8], &str); 6] = [
        (b"{\"text\": \"the \xff cat\"}", "invalid UTF-8"),
        (b"{\"body\": \"the cat\"}", "no field `text`"),
        (b"{\"text\": 12}", "field `text` is a number, not a string"),
        (b"{\"text\": \"\"}", "empty document"),
        (b"{\"text\": \"the cat\"", "not a JSON object"),
        (b"[1, 2]", "not a JSON object"),
    ];
    for (i, (line, want)) in cases.iter().enumerate() {
        let src = tmp.path().join(format!("bad{i}.jsonl"));
        let mut b = b"{\"text\": \"the cat\"}\n".to_vec();
        b.extend_from_slice(line);
        b.extend_from_slice(b"\n{\"text\": \"on the mat\"}\n");
        fs::write(&src, &b).unwrap();
        let out = tmp.path().join(format!("out{i}"));
        let err = pack_text(&src, &out, &opts(tok.clone()), &no_cancel())
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("bad{i}.jsonl:2: ")), "{err}");
        assert!(err.contains(want), "{err}");
        assert!(err.contains("--on-error skip"), "{err}");
        assert!(!out.exists());
        let o = TextPackOptions {
            on_error: OnError::Skip,
            ..opts(tok.clone())
        };
        let s = pack_text(&src, &out, &o, &no_cancel()).unwrap();
        assert_eq!((s.documents, s.skipped.len()), (2, 1));
        let report = fs::read_to_string(out.join("skipped.tsv")).unwrap();
        assert!(report.contains(":2\t"), "{report}");
    }
}

/// A tokenizer file that does not parse, and an EOS the vocabulary lacks, are named.
#[test]
fn bad_tokenizer_and_eos_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("c.jsonl");
    fs::write(&src, "{\"text\": \"the cat\"}\n").unwrap();
    let bad = tmp.path().join("broken.json");
    fs::write(&bad, "{\"model\": 3}").unwrap();
    let err = pack_text(&src, &tmp.path().join("o"), &opts(bad), &no_cancel()).unwrap_err();
    assert!(matches!(err, PackError::Tokenizer { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("broken.json") && msg.contains("--tokenizer"), "{msg}");
    let tok = write_tokenizer(tmp.path(), &WORDS, false);
    let o = TextPackOptions {
        eos: Eos::Token("</s>".into()),
        ..opts(tok)
    };
    let msg = pack_text(&src, &tmp.path().join("o"), &o, &no_cancel())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("--eos") && msg.contains("</s>"), "{msg}");
}

/// A Megatron-LM indexed dataset written to the layout of Megatron-Core's `_IndexWriter` is read
/// in place: documents span their sequences, tokens come back as written.
#[test]
fn megatron_indexed_dataset_is_read_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    // Three documents: [5, 6, 7], [8] + [9, 10] (two sequences), [11].
    let seqs: [&[u16]; 4] = [&[5, 6, 7], &[8], &[9, 10], &[11]];
    let doc_idx: [i64; 4] = [0, 1, 3, 4];
    let mut bin = Vec::new();
    let (mut lens, mut ptrs) = (Vec::new(), Vec::new());
    for s in seqs {
        ptrs.push(bin.len() as i64);
        lens.push(s.len() as i32);
        bin.extend(s.iter().flat_map(|t| t.to_le_bytes()));
    }
    let mut idx = b"MMIDIDX\x00\x00".to_vec();
    idx.extend(1u64.to_le_bytes());
    idx.push(8); // uint16
    idx.extend((seqs.len() as u64).to_le_bytes());
    idx.extend((doc_idx.len() as u64).to_le_bytes());
    idx.extend(lens.iter().flat_map(|v| v.to_le_bytes()));
    idx.extend(ptrs.iter().flat_map(|v| v.to_le_bytes()));
    idx.extend(doc_idx.iter().flat_map(|v| v.to_le_bytes()));
    fs::write(tmp.path().join("ds_text_document.bin"), &bin).unwrap();
    fs::write(tmp.path().join("ds_text_document.idx"), &idx).unwrap();
    let src = TokenSource::open(&tmp.path().join("ds_text_document.bin"), None).unwrap();
    assert_eq!(
        (src.kind(), src.doc_count(), src.token_count(), src.width()),
        ("megatron", 3, 7, 2)
    );
    assert_eq!(src.doc(1).unwrap(), 3..6);
    let mut t = Vec::new();
    src.tokens_into(src.doc(1).unwrap(), &mut t);
    assert_eq!(t, vec![8, 9, 10]);
    src.verify().unwrap();
    // A gap between sequences is named.
    let mut idx2 = idx.clone();
    let at = 34 + 4 * 4 + 8 * 3;
    idx2[at..at + 8].copy_from_slice(&100i64.to_le_bytes());
    fs::write(tmp.path().join("ds_text_document.idx"), &idx2).unwrap();
    let src = TokenSource::open(&tmp.path().join("ds_text_document"), None).unwrap();
    let err = src.verify().unwrap_err().to_string();
    assert!(err.contains("sequence 3"), "{err}");
}
