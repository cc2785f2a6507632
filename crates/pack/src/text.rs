//! The text packer: JSONL, Parquet and plain-text files in, a token dataset (`proto/tokens.md`)
//! out, tokenised in parallel with the Hugging Face `tokenizers` crate.
//!
//! ```text
//!  reader (lines, in order) ──batches──► N workers: parse, check, tokenise ──results──► writer
//!        ▲                                                                              │
//!        └──────────────────── tokens (bounded reorder window) ◄────────────────────────┘
//! ```
//!
//! The same shape as image packing ([`super`]): batches carry a sequence number, the writer puts
//! them back in input order, so the bytes do not depend on `--threads`; at most `window` batches
//! are in memory; the output is written under a temporary name and renamed into place only when
//! complete; every bad document is named with its file and line and either fails the pack or,
//! with `--on-error skip`, is listed in the report.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded};
use tokenizers::Tokenizer;

use super::{OnError, PackError, ProgressMode, Skipped, install, temp_dir_for, write_report};
use ringfeed_format::tokens::{DEFAULT_CHUNK_BYTES, TOKENS_FILE, TokenWriter, TokenWriterOptions, width_for_vocab};

/// Names tried, in order, for the end-of-document token when `--eos` is not given.
pub const EOS_CANDIDATES: [&str; 5] = ["<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>"];

/// What the text input is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum TextInput {
    /// From the path: `.jsonl`/`.json`/`.ndjson` files are JSON Lines, anything else plain text.
    Auto,
    /// One JSON object per line; the document is a string field (`--text-field`), or a
    /// prompt/completion pair.
    Jsonl,
    /// Each file is one document (a directory: every `*.txt` under it, sorted bytewise).
    Text,
    /// Parquet files (`*.parquet`): one document per row, from a string column (`--text-field`),
    /// or a prompt/completion pair of columns.
    Parquet,
}

/// Which token ends each document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eos {
    /// The first of [`EOS_CANDIDATES`] the tokenizer knows.
    Auto,
    /// This token (by its string, e.g. `</s>`).
    Token(String),
    /// Append nothing.
    None,
}

/// Everything a text pack needs to know.
#[derive(Debug, Clone)]
pub struct TextPackOptions {
    pub tokenizer: PathBuf,
    pub input: TextInput,
    pub eos: Eos,
    pub text_field: String,
    /// With `completion_field`: documents are prompt + completion, the prompt carrying no loss.
    pub prompt_field: Option<String>,
    pub completion_field: Option<String>,
    pub threads: usize,
    pub on_error: OnError,
    pub report: Option<PathBuf>,
    pub force: bool,
    pub progress: ProgressMode,
    pub chunk_bytes: u32,
    /// 1.1: write a packing file (`pack` mode's windows) for each of these seq_lens.
    pub pack_seq_lens: Vec<u32>,
}

impl TextPackOptions {
    pub fn new(tokenizer: PathBuf) -> Self {
        TextPackOptions {
            tokenizer,
            input: TextInput::Auto,
            eos: Eos::Auto,
            text_field: "text".into(),
            prompt_field: None,
            completion_field: None,
            threads: 0,
            on_error: OnError::Fail,
            report: None,
            force: false,
            progress: ProgressMode::Auto,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            pack_seq_lens: Vec::new(),
        }
    }
}

/// What a successful text pack did.
#[derive(Debug, Clone)]
pub struct TextPackSummary {
    pub input: &'static str,
    pub documents: u64,
    pub tokens: u64,
    pub width: u8,
    pub vocab_size: u32,
    pub eos_id: Option<u32>,
    pub bytes: u64,
    pub input_bytes: u64,
    pub blank_lines: u64,
    pub skipped: Vec<Skipped>,
    pub report: Option<PathBuf>,
    pub threads: usize,
    pub elapsed: Duration,
    /// The packing files written: seq_len, windows, tokens cut.
    pub packings: Vec<(u32, u64, u64)>,
}

impl TextPackSummary {
    pub fn tokens_per_sec(&self) -> f64 {
        self.tokens as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn input_mb_per_sec(&self) -> f64 {
        self.input_bytes as f64 / 1e6 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "input": self.input,
            "documents": self.documents,
            "tokens": self.tokens,
            "token_width": self.width,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "bytes": self.bytes,
            "input_bytes": self.input_bytes,
            "blank_lines": self.blank_lines,
            "skipped": self.skipped.len(),
            "threads": self.threads,
            "seconds": self.elapsed.as_secs_f64(),
            "tokens_per_sec": self.tokens_per_sec(),
            "input_mb_per_sec": self.input_mb_per_sec(),
            "packings": self.packings.iter().map(|(s, w, c)| serde_json::json!({"seq_len": s, "windows": w, "cut_tokens": c})).collect::<Vec<_>>(),
        })
    }
}

/// One input line (or file, or Parquet row) waiting to be tokenised.
struct Doc {
    file: usize,
    /// 1-based line number (1 for a plain-text file; the row for Parquet).
    line: u64,
    bytes: Vec<u8>,
    /// Parquet: the document's columns (the text, or the prompt and the completion), `None` where
    /// the value is null.
    columns: Vec<Option<Vec<u8>>>,
}

/// A worker's verdict on one document.
enum DocOut {
    Ready { tokens: Vec<u32>, prompt_len: u32 },
    Blank,
    Bad { reason: DocError },
}

/// Why a document cannot be packed (the reason of a [`PackError::BadSample`], or of a line of
/// the report under `--on-error skip`). A field is a JSONL line's, a column a Parquet row's;
/// `flag` is the setting that named it.
#[derive(Debug, thiserror::Error)]
enum DocError {
    #[error("column `{column}` is null ({flag} names the text column)")]
    NullColumn { column: String, flag: &'static str },
    /// Holds the length of the column's valid UTF-8 prefix.
    #[error("column `{column}`: invalid UTF-8 at byte {at}")]
    ColumnUtf8 { column: String, at: usize },
    /// Holds the length of the line's valid UTF-8 prefix.
    #[error("invalid UTF-8 at byte {0} of the line")]
    LineUtf8(usize),
    #[error("not a JSON object: {0}")]
    NotJson(serde_json::Error),
    #[error("not a JSON object")]
    NotObject,
    #[error("no field `{field}` (the document is read from {flag} {field})")]
    NoField { field: String, flag: &'static str },
    /// Holds what the field is instead ("a number", "null", ...).
    #[error("field `{field}` is {kind}, not a string ({flag} names the text field)")]
    NotString {
        field: String,
        kind: &'static str,
        flag: &'static str,
    },
    /// A field or column (`place`) holding the empty string.
    #[error("empty document: {place} `{name}` is \"\"")]
    EmptyText { place: &'static str, name: String },
    /// A field or column (`place`) whose text gives no tokens.
    #[error("empty document: {place} `{name}` has no tokens")]
    NoTokensIn { place: &'static str, name: String },
    #[error("empty document: the file is empty")]
    EmptyFile,
    #[error("empty document: the text has no tokens")]
    NoTokens,
    #[error("the tokenizer failed: {0}")]
    Tokenizer(tokenizers::Error),
    #[error("token id {id} does not fit: the tokenizer's vocabulary has {vocab} ids (token width {} bytes)", width_for_vocab(*vocab))]
    OutOfVocabulary { id: u32, vocab: u32 },
}

struct Batch {
    docs: Vec<Doc>,
}

/// Loads a tokenizer file, naming it on failure.
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer, PackError> {
    let bad = |reason: String| PackError::Tokenizer {
        path: path.to_owned(),
        reason,
    };
    let bytes = fs::read(path).map_err(|e| bad(e.to_string()))?;
    let text = std::str::from_utf8(&bytes).map_err(|e| bad(format!("not UTF-8 text: {e}")))?;
    text.parse::<Tokenizer>().map_err(|e| bad(e.to_string()))
}

/// The number of ids a tokenizer can produce: one past its largest id, added tokens included.
pub fn vocab_size(tok: &Tokenizer) -> u32 {
    let max = tok.get_vocab(true).values().copied().max().map_or(0, |m| m + 1);
    max.max(tok.get_vocab_size(true) as u32)
}

fn resolve_eos(tok: &Tokenizer, eos: &Eos, path: &Path) -> Result<Option<(u32, String)>, PackError> {
    match eos {
        Eos::None => Ok(None),
        Eos::Token(t) => match tok.token_to_id(t) {
            Some(id) => Ok(Some((id, t.clone()))),
            None => Err(PackError::Setting(format!(
                "{}: the tokenizer has no token {t:?} (--eos names a token of the vocabulary, e.g. </s>; --no-eos appends none)",
                path.display()
            ))),
        },
        Eos::Auto => {
            for c in EOS_CANDIDATES {
                if let Some(id) = tok.token_to_id(c) {
                    return Ok(Some((id, c.to_owned())));
                }
            }
            Err(PackError::Setting(format!(
                "{}: the tokenizer has none of the usual end-of-document tokens ({}); name one with --eos TOKEN, or pass --no-eos",
                path.display(),
                EOS_CANDIDATES.join(", ")
            )))
        }
    }
}

/// Lists the input files: SRC itself, or for a directory every file with the input's
/// extension under it, sorted bytewise.
fn list_inputs(src: &Path, input: TextInput) -> Result<(Vec<PathBuf>, TextInput), PackError> {
    let is_jsonl = |p: &Path| {
        matches!(
            p.extension()
                .and_then(|e| e.to_str())
                .map(str::to_ascii_lowercase)
                .as_deref(),
            Some("jsonl" | "json" | "ndjson")
        )
    };
    let meta = fs::metadata(src).map_err(|e| PackError::Io {
        path: src.to_owned(),
        source: e,
    })?;
    let is_parquet = |p: &Path| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("parquet"));
    if meta.is_file() {
        let kind = match input {
            TextInput::Auto if is_jsonl(src) => TextInput::Jsonl,
            TextInput::Auto if is_parquet(src) => TextInput::Parquet,
            TextInput::Auto => TextInput::Text,
            k => k,
        };
        return Ok((vec![src.to_owned()], kind));
    }
    let kind = match input {
        TextInput::Jsonl | TextInput::Parquet => input,
        _ => TextInput::Text,
    };
    let mut files = Vec::new();
    let mut stack = vec![src.to_owned()];
    while let Some(dir) = stack.pop() {
        let rd = fs::read_dir(&dir).map_err(|e| PackError::Io {
            path: dir.clone(),
            source: e,
        })?;
        for entry in rd {
            let entry = entry.map_err(|e| PackError::Io {
                path: dir.clone(),
                source: e,
            })?;
            let p = entry.path();
            let ft = entry.file_type().map_err(|e| PackError::Io {
                path: p.clone(),
                source: e,
            })?;
            if ft.is_dir() {
                stack.push(p);
            } else if match kind {
                TextInput::Jsonl => is_jsonl(&p),
                TextInput::Parquet => is_parquet(&p),
                _ => p.extension().is_some_and(|e| e.eq_ignore_ascii_case("txt")),
            } {
                files.push(p);
            }
        }
    }
    files.sort_by(|a, b| a.as_os_str().as_encoded_bytes().cmp(b.as_os_str().as_encoded_bytes()));
    if files.is_empty() {
        return Err(PackError::Empty { path: src.to_owned() });
    }
    Ok((files, kind))
}

/// Packs the text at `src` into a token dataset at `out`.
pub fn pack_text(
    src: &Path,
    out: &Path,
    opts: &TextPackOptions,
    cancel: &Arc<AtomicBool>,
) -> Result<TextPackSummary, PackError> {
    let started = Instant::now();
    if out.exists() && !opts.force {
        return Err(PackError::Exists { path: out.to_owned() });
    }
    if opts.prompt_field.is_some() != opts.completion_field.is_some() {
        return Err(PackError::Setting(
            "--prompt-field and --completion-field go together: name both".into(),
        ));
    }
    let mut pack_seq_lens = opts.pack_seq_lens.clone();
    pack_seq_lens.sort_unstable();
    pack_seq_lens.dedup();
    if let Some(bad) = pack_seq_lens
        .iter()
        .find(|&&s| !(1..=ringfeed_format::tokens::packing::MAX_SEQ_LEN).contains(&s))
    {
        return Err(PackError::Setting(format!(
            "--pack-seq-len {bad} is outside 1..={}",
            ringfeed_format::tokens::packing::MAX_SEQ_LEN
        )));
    }
    let tok = load_tokenizer(&opts.tokenizer)?;
    let vocab = vocab_size(&tok);
    let eos = resolve_eos(&tok, &opts.eos, &opts.tokenizer)?;
    let (files, kind) = list_inputs(src, opts.input)?;
    let total_bytes: u64 = files.iter().filter_map(|f| fs::metadata(f).ok()).map(|m| m.len()).sum();
    let threads = match opts.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let progress = crate::progress::Progress::new(opts.progress);
    let tmp = temp_dir_for(out)?;
    let mut skipped = Vec::new();
    let ctx = Ctx {
        tok: &tok,
        opts,
        kind,
        files: &files,
        eos_id: eos.as_ref().map(|e| e.0),
        vocab,
    };
    progress.start(total_bytes);
    let result = write_tokens(&ctx, &tmp.join(TOKENS_FILE), threads, cancel, &progress, &mut skipped);
    progress.finish();
    let (documents, tokens, blank_lines, input_bytes, bytes) = match result {
        Ok(r) => r,
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    if documents == 0 {
        let _ = fs::remove_dir_all(&tmp);
        return Err(if skipped.is_empty() {
            PackError::Empty { path: src.to_owned() }
        } else {
            let keep = opts
                .report
                .clone()
                .unwrap_or_else(|| super::sibling(out, ".skipped.tsv"));
            write_report(&keep, &skipped)?;
            PackError::NothingPacked {
                skipped: skipped.len(),
                report: keep,
            }
        });
    }
    // The packing files go into the temporary directory too, so they appear with the dataset.
    let mut packings = Vec::new();
    for &seq_len in &pack_seq_lens {
        let written = ringfeed_format::tokens::TokenFile::open(&tmp)
            .and_then(|tf| ringfeed_format::tokens::packing::write(&tf, seq_len));
        match written {
            Ok(h) => packings.push((seq_len, h.window_count, h.cut_tokens)),
            Err(e) => {
                let _ = fs::remove_dir_all(&tmp);
                return Err(e.into());
            }
        }
    }
    let report = if skipped.is_empty() {
        None
    } else {
        let dest = opts.report.clone().unwrap_or_else(|| tmp.join("skipped.tsv"));
        if let Err(e) = write_report(&dest, &skipped) {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
        Some(if opts.report.is_some() {
            dest
        } else {
            out.join("skipped.tsv")
        })
    };
    install(&tmp, out, opts.force)?;
    Ok(TextPackSummary {
        input: match kind {
            TextInput::Jsonl => "jsonl",
            TextInput::Parquet => "parquet",
            _ => "text",
        },
        documents,
        tokens,
        width: width_for_vocab(vocab),
        vocab_size: vocab,
        eos_id: eos.map(|e| e.0),
        bytes,
        input_bytes,
        blank_lines,
        skipped,
        report,
        threads,
        elapsed: started.elapsed(),
        packings,
    })
}

/// What every worker shares.
struct Ctx<'a> {
    tok: &'a Tokenizer,
    opts: &'a TextPackOptions,
    kind: TextInput,
    files: &'a [PathBuf],
    eos_id: Option<u32>,
    vocab: u32,
}

impl Ctx<'_> {
    fn key(&self, doc: &Doc) -> String {
        match self.kind {
            TextInput::Parquet => format!("{}:row {}", self.files[doc.file].display(), doc.line),
            _ => format!("{}:{}", self.files[doc.file].display(), doc.line),
        }
    }

    /// The columns a Parquet document is read from: the text column, or the prompt and
    /// completion columns.
    fn parquet_columns(&self) -> Vec<(&str, &'static str)> {
        match (&self.opts.prompt_field, &self.opts.completion_field) {
            (Some(p), Some(c)) => vec![(p.as_str(), "--prompt-field"), (c.as_str(), "--completion-field")],
            _ => vec![(self.opts.text_field.as_str(), "--text-field")],
        }
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, DocError> {
        self.tok
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(DocError::Tokenizer)
    }

    fn process(&self, doc: &Doc) -> DocOut {
        match self.process_inner(doc) {
            Ok(Some(out)) => out,
            Ok(None) => DocOut::Blank,
            Err(reason) => DocOut::Bad { reason },
        }
    }

    fn process_inner(&self, doc: &Doc) -> Result<Option<DocOut>, DocError> {
        if self.kind == TextInput::Parquet {
            let mut texts = Vec::with_capacity(doc.columns.len());
            for ((name, flag), value) in self.parquet_columns().into_iter().zip(&doc.columns) {
                let Some(bytes) = value else {
                    return Err(DocError::NullColumn {
                        column: name.to_owned(),
                        flag,
                    });
                };
                let text = std::str::from_utf8(bytes).map_err(|e| DocError::ColumnUtf8 {
                    column: name.to_owned(),
                    at: e.valid_up_to(),
                })?;
                texts.push((name, text));
            }
            return self.document(&texts).map(Some);
        }
        let text = match std::str::from_utf8(&doc.bytes) {
            Ok(t) => t,
            Err(e) => return Err(DocError::LineUtf8(e.valid_up_to())),
        };
        let (tokens, prompt_len) = match self.kind {
            TextInput::Jsonl => {
                if text.trim().is_empty() {
                    return Ok(None);
                }
                let v: serde_json::Value = serde_json::from_str(text).map_err(DocError::NotJson)?;
                let obj = v.as_object().ok_or(DocError::NotObject)?;
                let field = |name: &str, flag: &'static str| -> Result<String, DocError> {
                    match obj.get(name) {
                        None => Err(DocError::NoField {
                            field: name.to_owned(),
                            flag,
                        }),
                        Some(serde_json::Value::String(s)) => Ok(s.clone()),
                        Some(other) => Err(DocError::NotString {
                            field: name.to_owned(),
                            kind: json_kind(other),
                            flag,
                        }),
                    }
                };
                match (&self.opts.prompt_field, &self.opts.completion_field) {
                    (Some(p), Some(c)) => {
                        let prompt = field(p, "--prompt-field")?;
                        let completion = field(c, "--completion-field")?;
                        if completion.is_empty() {
                            return Err(DocError::EmptyText {
                                place: "field",
                                name: c.clone(),
                            });
                        }
                        let mut t = self.encode(&prompt)?;
                        let n = t.len() as u32;
                        let ct = self.encode(&completion)?;
                        if ct.is_empty() {
                            return Err(DocError::NoTokensIn {
                                place: "field",
                                name: c.clone(),
                            });
                        }
                        t.extend(ct);
                        (t, n)
                    }
                    _ => {
                        let f = &self.opts.text_field;
                        let s = field(f, "--text-field")?;
                        if s.is_empty() {
                            return Err(DocError::EmptyText {
                                place: "field",
                                name: f.clone(),
                            });
                        }
                        (self.encode(&s)?, 0)
                    }
                }
            }
            _ => {
                if text.is_empty() {
                    return Err(DocError::EmptyFile);
                }
                (self.encode(text)?, 0)
            }
        };
        self.finish_document(tokens, prompt_len).map(Some)
    }
}

impl Ctx<'_> {
    /// The tokens of a document given as its text column, or its prompt and completion columns
    /// (Parquet), with the same checks as a JSONL line's fields.
    fn document(&self, texts: &[(&str, &str)]) -> Result<DocOut, DocError> {
        let (tokens, prompt_len) = match texts {
            [(_, prompt), (c, completion)] => {
                if completion.is_empty() {
                    return Err(DocError::EmptyText {
                        place: "column",
                        name: (*c).to_owned(),
                    });
                }
                let mut t = self.encode(prompt)?;
                let n = t.len() as u32;
                let ct = self.encode(completion)?;
                if ct.is_empty() {
                    return Err(DocError::NoTokensIn {
                        place: "column",
                        name: (*c).to_owned(),
                    });
                }
                t.extend(ct);
                (t, n)
            }
            [(f, text)] => {
                if text.is_empty() {
                    return Err(DocError::EmptyText {
                        place: "column",
                        name: (*f).to_owned(),
                    });
                }
                (self.encode(text)?, 0)
            }
            _ => unreachable!("one or two columns"),
        };
        self.finish_document(tokens, prompt_len)
    }

    /// The checks every document's tokens pass, whatever its input (a JSONL line's fields, a
    /// Parquet row's columns, a text file): some tokens, each within the vocabulary; then EOS.
    fn finish_document(&self, mut tokens: Vec<u32>, prompt_len: u32) -> Result<DocOut, DocError> {
        if tokens.is_empty() {
            return Err(DocError::NoTokens);
        }
        if let Some(&id) = tokens.iter().find(|&&t| t >= self.vocab) {
            return Err(DocError::OutOfVocabulary { id, vocab: self.vocab });
        }
        if let Some(e) = self.eos_id {
            tokens.push(e);
        }
        Ok(DocOut::Ready { tokens, prompt_len })
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Documents per batch and the bytes that close a batch early.
const BATCH_DOCS: usize = 256;
const BATCH_BYTES: usize = 4 << 20;

/// Reads the inputs in order and sends batches; returns the input bytes read.
fn read_inputs(ctx: &Ctx<'_>, send: &mut dyn FnMut(Batch) -> bool) -> Result<u64, PackError> {
    let mut total = 0u64;
    let mut batch = Vec::new();
    let mut batch_bytes = 0usize;
    for (fi, path) in ctx.files.iter().enumerate() {
        let io = |e| PackError::Io {
            path: path.clone(),
            source: e,
        };
        let meta = fs::metadata(path).map_err(io)?;
        if !meta.is_file() {
            return Err(PackError::BadSample {
                key: path.display().to_string(),
                reason: "not a regular file".into(),
            });
        }
        let file = fs::File::open(path).map_err(io)?;
        match ctx.kind {
            TextInput::Parquet => {
                let (read, stop) = read_parquet(ctx, fi, path, file, &mut batch, &mut batch_bytes, send)?;
                total += read;
                if stop {
                    return Ok(total);
                }
            }
            TextInput::Jsonl => {
                let mut r = BufReader::with_capacity(1 << 20, file);
                let mut line = 0u64;
                loop {
                    let mut buf = Vec::new();
                    let n = r.read_until(b'\n', &mut buf).map_err(io)?;
                    if n == 0 {
                        break;
                    }
                    line += 1;
                    total += n as u64;
                    if buf.last() == Some(&b'\n') {
                        buf.pop();
                        if buf.last() == Some(&b'\r') {
                            buf.pop();
                        }
                    }
                    batch_bytes += buf.len();
                    batch.push(Doc {
                        file: fi,
                        line,
                        bytes: buf,
                        columns: Vec::new(),
                    });
                    if batch.len() >= BATCH_DOCS || batch_bytes >= BATCH_BYTES {
                        batch_bytes = 0;
                        if !send(Batch {
                            docs: std::mem::take(&mut batch),
                        }) {
                            return Ok(total);
                        }
                    }
                }
            }
            _ => {
                let mut buf = Vec::new();
                let mut f = file;
                f.read_to_end(&mut buf).map_err(io)?;
                total += buf.len() as u64;
                // A bad byte is reported at its line.
                let line = match std::str::from_utf8(&buf) {
                    Ok(_) => 1,
                    Err(e) => 1 + buf[..e.valid_up_to()].iter().filter(|&&b| b == b'\n').count() as u64,
                };
                batch_bytes += buf.len();
                batch.push(Doc {
                    file: fi,
                    line,
                    bytes: buf,
                    columns: Vec::new(),
                });
                if batch.len() >= BATCH_DOCS || batch_bytes >= BATCH_BYTES {
                    batch_bytes = 0;
                    if !send(Batch {
                        docs: std::mem::take(&mut batch),
                    }) {
                        return Ok(total);
                    }
                }
            }
        }
    }
    if !batch.is_empty() {
        send(Batch { docs: batch });
    }
    Ok(total)
}

/// Reads one Parquet file's rows in order into `batch`, sending full batches; returns the bytes
/// of text read and whether the writer asked to stop. The text column(s) must be strings
/// (`BYTE_ARRAY`, annotated UTF-8 or not); a missing column or another type fails the pack,
/// naming the file, the column and the columns there are.
fn read_parquet(
    ctx: &Ctx<'_>,
    fi: usize,
    path: &Path,
    file: fs::File,
    batch: &mut Vec<Doc>,
    batch_bytes: &mut usize,
    send: &mut dyn FnMut(Batch) -> bool,
) -> Result<(u64, bool), PackError> {
    use parquet::basic::Type as Physical;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;
    let bad = |reason: String| PackError::BadSample {
        key: path.display().to_string(),
        reason,
    };
    let reader = SerializedFileReader::new(file).map_err(|e| bad(format!("not a readable Parquet file: {e}")))?;
    let schema = reader.metadata().file_metadata().schema_descr_ptr();
    let root = schema.root_schema();
    let wanted = ctx.parquet_columns();
    for (name, flag) in &wanted {
        let Some(f) = root.get_fields().iter().find(|f| f.name() == *name) else {
            let have: Vec<&str> = root.get_fields().iter().map(|f| f.name()).collect();
            return Err(bad(format!(
                "no column `{name}` (the document is read from {flag} {name}); its columns: {}",
                have.join(", ")
            )));
        };
        if !f.is_primitive() || f.get_physical_type() != Physical::BYTE_ARRAY {
            return Err(bad(format!(
                "column `{name}` is {}, not a string ({flag} names the text column)",
                if f.is_primitive() {
                    format!("{:?}", f.get_physical_type())
                } else {
                    "a group".to_owned()
                }
            )));
        }
    }
    // Rows are projected on the text column(s); the projection keeps the file's column order.
    let mut projected = root.get_fields().to_vec();
    projected.retain(|f| wanted.iter().any(|(n, _)| f.name() == *n));
    let projection = parquet::schema::types::Type::group_type_builder(root.name())
        .with_fields(projected)
        .build()
        .map_err(|e| bad(format!("projecting the text columns: {e}")))?;
    let rows = reader
        .get_row_iter(Some(projection))
        .map_err(|e| bad(format!("reading rows: {e}")))?;
    let mut total = 0u64;
    for (r, row) in rows.enumerate() {
        let line = r as u64 + 1;
        let row = row.map_err(|e| PackError::BadSample {
            key: format!("{}:row {line}", path.display()),
            reason: format!("cannot be read: {e}"),
        })?;
        let mut columns = vec![None; wanted.len()];
        for (name, value) in row.get_column_iter() {
            let Some(k) = wanted.iter().position(|(n, _)| n == name) else {
                continue;
            };
            columns[k] = match value {
                Field::Str(s) => Some(s.as_bytes().to_vec()),
                Field::Bytes(b) => Some(b.data().to_vec()),
                _ => None,
            };
        }
        let n: usize = columns.iter().flatten().map(Vec::len).sum();
        total += n as u64;
        *batch_bytes += n;
        batch.push(Doc {
            file: fi,
            line,
            bytes: Vec::new(),
            columns,
        });
        if batch.len() >= BATCH_DOCS || *batch_bytes >= BATCH_BYTES {
            *batch_bytes = 0;
            if !send(Batch {
                docs: std::mem::take(batch),
            }) {
                return Ok((total, true));
            }
        }
    }
    Ok((total, false))
}

/// Runs the reader, the workers and the writer; returns documents, tokens, blank lines, input
/// bytes and output bytes.
fn write_tokens(
    ctx: &Ctx<'_>,
    path: &Path,
    threads: usize,
    cancel: &AtomicBool,
    progress: &crate::progress::Progress,
    skipped: &mut Vec<Skipped>,
) -> Result<(u64, u64, u64, u64, u64), PackError> {
    let window = threads * 4 + 4;
    let mut writer = TokenWriter::create(
        path,
        TokenWriterOptions {
            vocab_size: ctx.vocab,
            eos_id: ctx.eos_id,
            prompts: ctx.opts.prompt_field.is_some(),
            chunk_bytes: ctx.opts.chunk_bytes,
        },
    )?;
    let stop = AtomicBool::new(false);
    let mut blank = 0u64;
    let mut consumed = 0u64;
    let outcome: Result<u64, PackError> = std::thread::scope(|scope| {
        let (job_tx, job_rx) = bounded::<(usize, Batch)>(window);
        let (res_tx, res_rx) = unbounded::<(usize, Vec<(Doc, DocOut)>)>();
        let (token_tx, token_rx) = bounded::<()>(window);
        for _ in 0..window {
            token_tx.send(()).expect("the token channel has room for the window");
        }
        let stop = &stop;
        let reader = scope.spawn(move || {
            let mut seq = 0usize;
            let mut send = |b: Batch| {
                // SYNC POINT: the writer returns a token only after consuming an earlier batch,
                // so batches in flight never exceed `window`.
                if token_rx.recv().is_err() || stop.load(Ordering::Relaxed) || cancel.load(Ordering::Relaxed) {
                    return false;
                }
                let ok = job_tx.send((seq, b)).is_ok();
                seq += 1;
                ok
            };
            let r = read_inputs(ctx, &mut send);
            (r, seq)
        });
        for _ in 0..threads {
            let (job_rx, res_tx) = (job_rx.clone(), res_tx.clone());
            scope.spawn(move || {
                for (seq, batch) in job_rx.iter() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let outs = batch
                        .docs
                        .into_iter()
                        .map(|d| {
                            let o = ctx.process(&d);
                            (d, o)
                        })
                        .collect();
                    if res_tx.send((seq, outs)).is_err() {
                        break;
                    }
                }
            });
        }
        drop((job_rx, res_tx));

        let mut pending: BTreeMap<usize, Vec<(Doc, DocOut)>> = BTreeMap::new();
        let mut next = 0usize;
        let result = (|| {
            loop {
                if cancel.load(Ordering::Relaxed) {
                    return Err(PackError::Interrupted);
                }
                match res_rx.recv_timeout(Duration::from_millis(200)) {
                    Ok((seq, outs)) => {
                        pending.insert(seq, outs);
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => continue,
                    // Every worker has finished: the reader has sent its last batch.
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Ok(()),
                }
                while let Some(outs) = pending.remove(&next) {
                    for (doc, out) in outs {
                        consumed += doc.bytes.len() as u64 + 1;
                        match out {
                            DocOut::Ready { tokens, prompt_len } => {
                                writer.push(&tokens, prompt_len).map_err(|e| PackError::BadSample {
                                    key: ctx.key(&doc),
                                    reason: e.to_string(),
                                })?;
                            }
                            DocOut::Blank => blank += 1,
                            DocOut::Bad { reason } => {
                                let (key, reason) = (ctx.key(&doc), reason.to_string());
                                if ctx.opts.on_error == OnError::Fail {
                                    return Err(PackError::BadSample { key, reason });
                                }
                                skipped.push(Skipped { key, reason });
                            }
                        }
                    }
                    next += 1;
                    progress.set_position(consumed);
                    let _ = token_tx.send(());
                }
            }
        })();
        // SYNC POINT: `stop` tells the reader and workers to quit; dropping the receivers
        // unblocks any sender, so the scope can join them.
        stop.store(true, Ordering::Relaxed);
        drop(res_rx);
        drop(token_tx);
        let (read, sent) = reader.join().expect("the reader does not panic");
        result?;
        if next != sent {
            return Err(PackError::Interrupted);
        }
        read
    });
    let input_bytes = outcome?;
    let (documents, tokens) = (writer.doc_count(), writer.token_count());
    let info = serde_json::json!({
        "format": "ringfeed-tokens",
        "version": format!("{}.{}", ringfeed_format::shard::MAJOR, ringfeed_format::tokens::TOKENS_MINOR),
        "writer": concat!("ringfeed ", env!("CARGO_PKG_VERSION")),
        "source_kind": match ctx.kind { TextInput::Jsonl => "jsonl", TextInput::Parquet => "parquet", _ => "text" },
        "text_field": if ctx.opts.prompt_field.is_none() && matches!(ctx.kind, TextInput::Jsonl | TextInput::Parquet) {
            serde_json::Value::from(ctx.opts.text_field.clone())
        } else {
            serde_json::Value::Null
        },
        "prompt_field": ctx.opts.prompt_field,
        "completion_field": ctx.opts.completion_field,
        "tokenizer": {
            "vocab_size": ctx.vocab,
            "crc32c": format!("{:#010x}", fs::read(&ctx.opts.tokenizer).map(|b| ringfeed_format::shard::crc(&b)).unwrap_or(0)),
        },
        "eos": ctx.eos_id.and_then(|id| ctx.tok.id_to_token(id)),
    });
    let footer = writer.finish(&info.to_string())?;
    Ok((documents, tokens, blank, input_bytes, footer.layout.file_len))
}
