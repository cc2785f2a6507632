//! `ringfeed verify`: a packed dataset (local or in a store) or a token dataset, checked.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use ringfeed_decode::{Decoder, Limits};
use ringfeed_format::shard::{SampleCheckError, VerifyError, VerifyOptions};
use ringfeed_format::tokens::{FlatDtype, TokenSource};
use ringfeed_pack::ProgressMode;
use ringfeed_pack::progress::Progress;

use crate::common::is_token_data;
use crate::remote::{RemoteArgs, remote_url};

#[derive(clap::Args, Debug)]
pub(crate) struct VerifyArgs {
    /// Packed dataset directory, or an `s3://bucket/prefix` (streamed shard by shard through a
    /// temporary directory: one shard on disk at a time).
    pub(crate) dataset: PathBuf,
    /// Also decode every sample.
    #[arg(long)]
    pub(crate) decode: bool,
    /// Threads for --decode (default: all cores).
    #[arg(long, short = 'j', value_name = "N", default_value_t = 0)]
    pub(crate) threads: usize,
    /// Largest image accepted by --decode, in pixels.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_pixels)]
    pub(crate) max_pixels: u64,
    /// Progress display.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    pub(crate) progress: ProgressMode,
    /// DATASET is a flat token file (nanoGPT's train.bin) of this dtype (Python's
    /// `TokenLoader(token_dtype=...)`; `--dtype` is its older name).
    #[arg(long = "token-dtype", visible_alias = "dtype", value_enum, value_name = "DTYPE")]
    pub(crate) dtype: Option<FlatDtype>,
    #[command(flatten)]
    pub(crate) remote: RemoteArgs,
}

pub(crate) fn run_verify_tokens(a: &VerifyArgs) -> Result<ExitCode> {
    ringfeed_format::fault::install().context("installing the SIGBUS handler")?;
    let src = TokenSource::open(&a.dataset, a.dtype).context("verify failed")?;
    match src.verify() {
        Ok(()) => {
            let packings = match &src {
                TokenSource::Packed(tf) => ringfeed_format::tokens::packing::list(tf.dir()).0,
                _ => Vec::new(),
            };
            println!(
                "ok: {} tokens in {} documents ({}, uint{}){}",
                src.token_count(),
                src.doc_count(),
                src.kind(),
                u32::from(src.width()) * 8,
                if packings.is_empty() {
                    String::new()
                } else {
                    let s: Vec<String> = packings.iter().map(u32::to_string).collect();
                    format!("; packing files for seq_len {}", s.join(", "))
                }
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let kind = e.kind();
            Err(anyhow::Error::from(e).context(format!("verify failed ({kind})")))
        }
    }
}

/// `verify`'s summary line, for a local and a remote dataset alike (`from` says where it was read).
pub(crate) fn print_verified(r: &ringfeed_format::shard::VerifyReport, decoded: bool, from: &str) {
    let decoded = if decoded {
        format!(", {} samples decoded", r.checked_samples)
    } else {
        String::new()
    };
    println!(
        "ok: {} samples in {} shards, {} classes, {:.1} MB checked{decoded}{from}",
        r.samples,
        r.shards,
        r.classes,
        r.bytes as f64 / 1e6,
    );
}

pub(crate) fn run_verify(a: VerifyArgs) -> Result<ExitCode> {
    let remote = remote_url(&a.dataset)?;
    if remote.is_none() && is_token_data(&a.dataset, a.dtype) {
        return run_verify_tokens(&a);
    }
    let limits = Limits {
        max_pixels: a.max_pixels,
    };
    // One decoder per thread, made on first use.
    thread_local! {
        static DECODER: std::cell::RefCell<Option<Decoder>> = const { std::cell::RefCell::new(None) };
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let decode = move |data: &[u8]| -> Result<(), SampleCheckError> {
        DECODER.with(|d| {
            let mut d = d.borrow_mut();
            if d.is_none() {
                *d = Some(Decoder::new(limits)?);
            }
            let decoder = d.as_mut().expect("set above");
            SCRATCH.with(|s| {
                decoder
                    .decode_rgb8(data, &mut s.borrow_mut())
                    .map(|_| ())
                    .map_err(Into::into)
            })
        })
    };
    let progress = Progress::new(a.progress);
    progress.message(&format!("verifying {}", a.dataset.display()));
    let started = std::sync::Once::new();
    let on_progress = |done: u64, total: u64| {
        started.call_once(|| progress.start(total));
        progress.set_position(done);
    };
    let opts = VerifyOptions {
        sample_check: if a.decode { Some(&decode) } else { None },
        threads: a.threads,
        progress: Some(&on_progress),
    };
    if let Some(url) = remote {
        let r = crate::remote::verify(&a.remote, &url, &opts, &progress)?;
        print_verified(&r, a.decode, &format!(" (streamed from {url}, one shard at a time)"));
        return Ok(ExitCode::SUCCESS);
    }
    let result = ringfeed_format::shard::verify(&a.dataset, &opts);
    progress.finish();
    match result {
        Ok(r) => {
            print_verified(&r, a.decode, "");
            let path = a.dataset.join(ringfeed_format::targets::TARGETS_FILE);
            if path.exists() {
                match ringfeed_format::targets::verify_targets(&path, Some(r.samples)) {
                    Ok(t) => println!(
                        "ok: targets of {} samples: {} boxes (at most {} per sample), {} masks{}, {:.1} MB checked",
                        t.samples,
                        t.boxes,
                        t.max_boxes,
                        t.masks,
                        match (t.instances, t.keypoints) {
                            (0, 0) => String::new(),
                            (i, 0) => format!(", {i} instance masks"),
                            (i, k) => format!(", {i} instance masks, {k} keypoints per box"),
                        },
                        t.bytes as f64 / 1e6
                    ),
                    Err(e) => {
                        let kind = e.kind();
                        return Err(anyhow::Error::from(e).context(format!("verify failed ({kind})")));
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let kind = e.kind();
            let e: anyhow::Error = match e {
                VerifyError::Format(f) => f.into(),
                other => other.into(),
            };
            Err(e.context(format!("verify failed ({kind})")))
        }
    }
}
