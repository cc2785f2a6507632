//! `ringfeed pack`: image folders, manifests, LMDBs and WebDataset tars into packed shards (local
//! or uploaded to a store), or text into a token dataset.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use ringfeed_decode::{Limits, Reencode};
use ringfeed_format::shard::WriterOptions;
use ringfeed_pack::{Check, InputKind, OnError, PackError, PackOptions, ProgressMode};

use crate::EXIT_INTERRUPTED;
use crate::common::{LmdbArgs, PackRun, cancel_on_signals, parse_size};
use crate::remote::{RemoteArgs, Upload, remote_url};
use crate::text::TextArgs;

#[derive(clap::Args, Debug)]
pub(crate) struct PackArgs {
    /// Image folder (SRC/class/*.jpg), manifest (.csv/.jsonl), LMDB, or Parquet (a .parquet
    /// file or a directory of them).
    pub(crate) src: PathBuf,
    /// Output dataset directory (must not exist unless --force), or an `s3://bucket/prefix`
    /// (packed in a temporary directory, then uploaded: shards first, the index last).
    pub(crate) out: PathBuf,
    /// What SRC is.
    #[arg(long, value_enum, default_value_t = InputKind::Auto)]
    pub(crate) input: InputKind,
    /// Target shard size, e.g. 256MiB, 1GB, 500M.
    #[arg(long, value_name = "SIZE", default_value = "256MiB", value_parser = parse_size)]
    pub(crate) shard_size: u64,
    /// Record alignment in bytes (power of two, 8..=1MiB).
    #[arg(long, value_name = "BYTES", default_value_t = ringfeed_format::shard::DEFAULT_RECORD_ALIGN)]
    pub(crate) align: u32,
    /// Re-encode every image as JPEG, downscaled so its longer side is at most --max-side.
    /// Decoding the smaller files is several times cheaper at training time.
    #[arg(long)]
    pub(crate) reencode: bool,
    /// Longest side after re-encoding, in pixels.
    #[arg(long, value_name = "PX", default_value_t = 512, requires = "reencode")]
    pub(crate) max_side: u32,
    /// JPEG quality when re-encoding (1-100).
    #[arg(long, value_name = "Q", default_value_t = 90, requires = "reencode", value_parser = clap::value_parser!(u8).range(1..=100))]
    pub(crate) quality: u8,
    /// Store JPEGs byte for byte. By default sequential JPEGs are rewritten losslessly with
    /// restart markers every 2 MCUs (like `jpegtran -restart 2B -optimize -copy all`): the
    /// same pixels, and the server then decodes only the part of each file a crop needs.
    #[arg(long)]
    pub(crate) no_restarts: bool,
    /// How each image is checked while packing.
    #[arg(long, value_enum, default_value_t = Check::Decode)]
    pub(crate) check: Check,
    /// Largest image accepted, in pixels (width x height); bounds memory per thread.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_pixels)]
    pub(crate) max_pixels: u64,
    /// Worker threads (default: all cores).
    #[arg(long, short = 'j', value_name = "N", default_value_t = 0)]
    pub(crate) threads: usize,
    /// What to do with a file that cannot be packed (the words of Python's `on_error=`).
    #[arg(long, value_enum, default_value_t = OnErrorArg::Raise)]
    pub(crate) on_error: OnErrorArg,
    /// Where `--on-error skip` lists skipped files (default: OUT/skipped.tsv).
    #[arg(long, value_name = "FILE")]
    pub(crate) report: Option<PathBuf>,
    /// Replace OUT if it exists.
    #[arg(long)]
    pub(crate) force: bool,
    /// Progress display.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    pub(crate) progress: ProgressMode,
    /// Also write the closing summary as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) summary_json: Option<PathBuf>,
    /// Detection targets: a COCO instances JSON whose `images` are the samples (SRC/file_name,
    /// in ascending id) and whose `annotations` give their boxes (`bbox` xywh becomes xyxy,
    /// `category_id` the label; crowds are left out; polygons, RLE and keypoints are ignored).
    /// Written to OUT/targets.rft (proto/targets.md).
    #[arg(long, value_name = "FILE")]
    pub(crate) coco: Option<PathBuf>,
    /// Segmentation targets: DIR/<stem>.png for every image, an 8-bit grey or palette PNG of the
    /// image's size whose values (palette indices) are the labels. Written to OUT/targets.rft.
    #[arg(long, value_name = "DIR")]
    pub(crate) masks: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) lmdb: LmdbArgs,
    /// Parquet input: the image column (binary, or Hugging Face's `{bytes, path}` struct).
    #[arg(long, value_name = "COLUMN", default_value = "image")]
    pub(crate) image_column: String,
    /// Parquet input: the integer label column ("" for none).
    #[arg(long, value_name = "COLUMN", default_value = "label")]
    pub(crate) label_column: String,
    #[command(flatten)]
    pub(crate) text: TextArgs,
    #[command(flatten)]
    pub(crate) remote: RemoteArgs,
}

/// `--on-error`: the same words as Python's `Loader(on_error=...)` for the same policy.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnErrorArg {
    /// Stop at the first bad file, name it and the reason, and leave no output.
    Raise,
    /// Leave the file out, write it and the reason to the report, and go on.
    Skip,
    /// The old word for `raise`: still accepted, with a note on stderr.
    #[value(hide = true)]
    Fail,
}

impl OnErrorArg {
    /// The packer's policy; `fail` says once that `raise` is its new spelling.
    pub(crate) fn policy(self) -> OnError {
        match self {
            OnErrorArg::Raise => OnError::Fail,
            OnErrorArg::Skip => OnError::Skip,
            OnErrorArg::Fail => {
                eprintln!(
                    "ringfeed: --on-error fail is deprecated: use --on-error raise \
                     (the word Python's on_error= uses)"
                );
                OnError::Fail
            }
        }
    }
}

pub(crate) fn run_pack(mut a: PackArgs) -> Result<ExitCode> {
    let Some(url) = remote_url(&a.out)? else {
        return run_pack_local(a);
    };
    // `pack SRC s3://...`: packs into a temporary directory, then uploads it (index last).
    let upload = Upload::start(&a.remote, url, a.force)?;
    a.out = upload.local();
    a.force = false;
    let code = run_pack_local(a)?;
    if code != ExitCode::SUCCESS {
        return Ok(code);
    }
    upload.finish()?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn run_pack_local(a: PackArgs) -> Result<ExitCode> {
    if a.text.tokenizer.is_some() {
        let run = PackRun {
            src: a.src,
            out: a.out,
            threads: a.threads,
            on_error: a.on_error.policy(),
            report: a.report,
            force: a.force,
            progress: a.progress,
            summary_json: a.summary_json,
        };
        return crate::text::pack(a.text, run);
    }
    let cancel = cancel_on_signals()?;
    let opts = PackOptions {
        input: a.input,
        lmdb: a.lmdb.options()?,
        parquet: ringfeed_pack::ParquetColumns {
            image: Some(a.image_column),
            label: Some(a.label_column),
        },
        writer: WriterOptions {
            target_shard_bytes: a.shard_size,
            record_align: a.align,
        },
        reencode: a.reencode.then_some(Reencode {
            max_side: a.max_side,
            quality: a.quality,
        }),
        restarts: !a.no_restarts,
        check: a.check,
        limits: Limits {
            max_pixels: a.max_pixels,
        },
        threads: a.threads,
        on_error: a.on_error.policy(),
        report: a.report,
        force: a.force,
        progress: a.progress,
        targets: ringfeed_pack::TargetsInput {
            coco: a.coco,
            masks: a.masks,
        },
    };
    if !a.align.is_power_of_two() || !(8..=1 << 20).contains(&a.align) {
        bail!("--align {} must be a power of two between 8 and 1048576", a.align);
    }
    let summary = match ringfeed_pack::pack(&a.src, &a.out, &opts, &cancel) {
        Ok(s) => s,
        Err(PackError::Interrupted) => {
            eprintln!("ringfeed: pack interrupted; no output was written");
            return Ok(ExitCode::from(EXIT_INTERRUPTED));
        }
        Err(e) => return Err(e.into()),
    };
    let w = &summary.written;
    println!(
        "packed {} samples from {} ({}) into {}: {} shard{}, {} classes, {:.1} MB",
        w.samples,
        a.src.display(),
        summary.input,
        a.out.display(),
        w.shards,
        if w.shards == 1 { "" } else { "s" },
        w.classes,
        w.bytes as f64 / 1e6
    );
    if summary.restarted > 0 {
        println!(
            "{} JPEGs rewritten losslessly with restart markers (same pixels; --no-restarts keeps the bytes)",
            summary.restarted
        );
    }
    println!(
        "{:.1} s with {} threads: {:.1} images/s, {:.1} MB/s read",
        summary.elapsed.as_secs_f64(),
        summary.threads,
        summary.images_per_sec(),
        summary.input_mb_per_sec()
    );
    if let Some(t) = &summary.targets {
        println!(
            "targets: {} boxes (at most {} per image; {} crowd annotations left out), {} masks{}, in {}",
            t.boxes,
            t.max_boxes,
            t.crowds,
            t.masks,
            match (t.instances, t.keypoints) {
                (0, 0) => String::new(),
                (i, 0) => format!(", {i} instance masks"),
                (i, k) => format!(", {i} instance masks, {k} keypoints per box"),
            },
            a.out.join(ringfeed_format::targets::TARGETS_FILE).display()
        );
    }
    let ignored = if summary.ignored > 0 {
        format!("; ignored {} files with other extensions", summary.ignored)
    } else {
        String::new()
    };
    match &summary.report {
        Some(r) => println!("skipped {} (listed in {}){ignored}", summary.skipped.len(), r.display()),
        None => println!("skipped 0{ignored}"),
    }
    if let Some(path) = &a.summary_json {
        std::fs::write(path, serde_json::to_string_pretty(&summary.to_json())?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}
