//! Text into tokens: `pack --tokenizer` and `inspect` of token data. Built with the `text`
//! feature (the default: Hugging Face tokenizers and the Parquet reader); without it,
//! `text_absent.rs` stands in and refuses `--tokenizer` naming the feature.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use ringfeed_format::tokens::{FlatDtype, TokenSource};
use ringfeed_pack::PackError;
use ringfeed_pack::text::{Eos, TextInput, TextPackOptions};

use crate::EXIT_INTERRUPTED;
use crate::common::{PackRun, cancel_on_signals};

/// Text packing: with `--tokenizer`, SRC is text (JSONL, Parquet or plain text) and OUT a token
/// dataset.
#[derive(clap::Args, Debug)]
pub(crate) struct TextArgs {
    /// Pack text into a token dataset with this Hugging Face tokenizer.json: SRC is a JSONL file,
    /// a Parquet file, a plain-text file, or a directory of them (`--text-input` picks the kind
    /// of a directory's files: `*.txt` by default).
    #[arg(long, value_name = "FILE")]
    pub(crate) tokenizer: Option<PathBuf>,
    /// What the text input is.
    #[arg(long, value_enum, default_value_t = TextInput::Auto, requires = "tokenizer")]
    pub(crate) text_input: TextInput,
    /// JSONL and Parquet: the field (column) holding each document's text.
    #[arg(long, value_name = "NAME", default_value = "text", requires = "tokenizer")]
    pub(crate) text_field: String,
    /// JSONL: the prompt field of prompt/completion pairs (its tokens carry no loss).
    #[arg(long, value_name = "NAME", requires_all = ["tokenizer", "completion_field"])]
    pub(crate) prompt_field: Option<String>,
    /// JSONL: the completion field of prompt/completion pairs.
    #[arg(long, value_name = "NAME", requires_all = ["tokenizer", "prompt_field"])]
    pub(crate) completion_field: Option<String>,
    /// The token appended after each document [default: the tokenizer's <|endoftext|>, </s>, ...].
    #[arg(long, value_name = "TOKEN", requires = "tokenizer", conflicts_with = "no_eos")]
    pub(crate) eos: Option<String>,
    /// Append no end-of-document token.
    #[arg(long, requires = "tokenizer")]
    pub(crate) no_eos: bool,
    /// Also write the `pack`-mode windows for this seq_len (DATASET/packing-N.rfp), so that a
    /// `pack` stream of that seq_len opens without packing every document at start-up.
    /// Repeatable, or comma-separated: `--pack-seq-len 2048,4096`.
    #[arg(long, value_name = "N", requires = "tokenizer", value_delimiter = ',')]
    pub(crate) pack_seq_len: Vec<u32>,
}

/// `pack --tokenizer`: text into a token dataset.
pub(crate) fn pack(t: TextArgs, a: PackRun) -> Result<ExitCode> {
    let cancel = cancel_on_signals()?;
    let mut opts = TextPackOptions::new(t.tokenizer.expect("checked by the caller"));
    opts.input = t.text_input;
    opts.eos = match (t.eos, t.no_eos) {
        (_, true) => Eos::None,
        (Some(tok), false) => Eos::Token(tok),
        (None, false) => Eos::Auto,
    };
    opts.text_field = t.text_field;
    opts.prompt_field = t.prompt_field;
    opts.completion_field = t.completion_field;
    opts.threads = a.threads;
    opts.on_error = a.on_error;
    opts.report = a.report;
    opts.force = a.force;
    opts.progress = a.progress;
    opts.pack_seq_lens = t.pack_seq_len;
    let s = match ringfeed_pack::text::pack_text(&a.src, &a.out, &opts, &cancel) {
        Ok(s) => s,
        Err(PackError::Interrupted) => {
            eprintln!("ringfeed: pack interrupted; no output was written");
            return Ok(ExitCode::from(EXIT_INTERRUPTED));
        }
        Err(e) => return Err(e.into()),
    };
    println!(
        "packed {} documents, {} tokens from {} ({}) into {}: uint{} tokens (vocabulary {}), {:.1} MB",
        s.documents,
        s.tokens,
        a.src.display(),
        s.input,
        a.out.display(),
        u32::from(s.width) * 8,
        s.vocab_size,
        s.bytes as f64 / 1e6
    );
    println!(
        "{:.1} s with {} threads: {:.0} tokens/s, {:.1} MB/s read",
        s.elapsed.as_secs_f64(),
        s.threads,
        s.tokens_per_sec(),
        s.input_mb_per_sec()
    );
    for (seq_len, windows, cut) in &s.packings {
        println!("pack mode, seq_len {seq_len}: {windows} windows ({cut} tokens cut), stored");
    }
    match &s.report {
        Some(r) => println!("skipped {} (listed in {})", s.skipped.len(), r.display()),
        None => println!("skipped 0"),
    }
    if let Some(path) = &a.summary_json {
        std::fs::write(path, serde_json::to_string_pretty(&s.to_json())?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `inspect` of token data: counts, and one document (decoded with `tokenizer`).
pub(crate) fn inspect(
    dataset: &Path,
    dtype: Option<FlatDtype>,
    sample: u64,
    tokenizer: Option<&Path>,
    json: bool,
) -> Result<ExitCode> {
    let src = TokenSource::open(dataset, dtype)?;
    let tok = match tokenizer {
        Some(p) => Some(ringfeed_pack::text::load_tokenizer(p)?),
        None => None,
    };
    let v = ringfeed_pack::inspect::tokens::inspect(&src, sample, tok.as_ref())?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", ringfeed_pack::inspect::tokens::to_text(&v));
    }
    Ok(ExitCode::SUCCESS)
}
