//! The `ringfeed` command: parses flags, calls the library, prints results and errors.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use ringfeed_decode::{Decoder, Limits, Reencode};
use ringfeed_format::shard::{VerifyError, VerifyOptions, WriterOptions};
use ringfeed_format::tokens::{FlatDtype, TokenSource};
use ringfeed_pack::progress::Progress;
use ringfeed_pack::text::{Eos, TextInput, TextPackOptions};
use ringfeed_pack::{Check, InputKind, OnError, PackError, PackOptions, ProgressMode};
use ringfeed_source::lmdb::{LabelSource, Layout, LmdbOptions};

/// Exit status for a run stopped by SIGINT or SIGTERM (128 + SIGINT, as shells report it).
const EXIT_INTERRUPTED: u8 = 130;

#[derive(Parser, Debug)]
#[command(
    name = "ringfeed",
    version,
    about = "Keeps GPUs fed: packs image datasets and serves decoded batches"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Pack an image folder, a manifest (CSV/JSONL) or an LMDB into a packed dataset; with
    /// --tokenizer, pack text (JSONL, plain text) into a token dataset.
    Pack(Box<PackArgs>),
    /// Check a packed dataset: magics, versions, checksums, index consistency, and optionally
    /// that every sample decodes. Exits non-zero at the first problem.
    Verify(VerifyArgs),
    /// Print counts, classes, size statistics and one sample's metadata.
    Inspect(InspectArgs),
    /// Write the index file (TAR.rfidx) beside each WebDataset tar, local or in a store
    /// (s3://...), so that serving it opens without scanning the tar; a valid index is left as
    /// it is. Exits non-zero when a tar is damaged (it is indexed up to the damage).
    Index(IndexArgs),
    /// Write the `pack`-mode windows of an existing token dataset for a seq_len
    /// (DATASET/packing-N.rfp), so that a `pack` stream opens without packing every document at
    /// start-up (`pack --pack-seq-len` does the same while packing).
    Packing(PackingArgs),
    /// Run the sidecar: serve decoded batches to training processes over a Unix socket.
    Serve(ServeArgs),
    /// Show every stream of a running server: throughput, the training loop's wait, threads,
    /// depth, slot states and per-stage times, refreshed every second.
    Top(TopArgs),
    /// Run a pipeline (control.md, "Pipelines") on one image file, as the server would for
    /// sample indices `--index ..` of `--epoch`, and write the images (HWC, RGB8, outputs in
    /// order) to `--out`; print each sample's drawn parameters as a JSON line. For checking
    /// ops against torchvision, and for seeing what a pipeline does to a picture.
    Ops(OpsArgs),
    /// Measure img/s by thread count on this machine and dataset, beside a DataLoader + PIL,
    /// and the threads a target rate needs (runs `python3 -m ringfeed.bench`; `--help` lists
    /// its options).
    #[command(disable_help_flag = true)]
    Bench(BenchArgs),
}

#[derive(clap::Args, Debug)]
struct OpsArgs {
    /// The encoded image.
    image: PathBuf,
    /// The pipeline as JSON (`{"views": [...]}`), or `@FILE`.
    #[arg(long)]
    pipeline: String,
    /// The stream's seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The epoch.
    #[arg(long, default_value_t = 0)]
    epoch: u64,
    /// The first sample index.
    #[arg(long, default_value_t = 0)]
    index: u64,
    /// How many indices, from `--index`.
    #[arg(long, default_value_t = 1)]
    count: u64,
    /// Where the images go: every output of every sample, in order, raw bytes.
    #[arg(long)]
    out: PathBuf,
    /// Decode every image whole (the reference path) instead of by region.
    #[arg(long)]
    no_region_decode: bool,
}

/// `ringfeed bench`'s arguments, all passed to the Python module that measures (the baseline it
/// compares with is a Python DataLoader, and the ringfeed figure is the Python Loader's).
#[derive(clap::Args, Debug)]
struct BenchArgs {
    /// DATASET and options, as `python3 -m ringfeed.bench --help` lists them.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
    args: Vec<std::ffi::OsString>,
}

#[derive(clap::Args, Debug)]
struct TopArgs {
    /// The server's socket [default: as for `serve`].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Print one snapshot and exit (for scripts).
    #[arg(long)]
    once: bool,
    /// Print snapshots as JSON lines (with --once: one line).
    #[arg(long)]
    json: bool,
    /// Seconds between refreshes.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    interval: f64,
}

#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// Socket path [default: $RINGFEED_SOCKET, else $XDG_RUNTIME_DIR/ringfeed/ringfeed.sock, else
    /// /tmp/ringfeed-$UID/ringfeed.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Decode threads in the pool shared by all clients: the most that can ever run (default:
    /// all cores). The autotuner decides how many of them work.
    #[arg(long, short = 'j', value_name = "N", default_value_t = 0)]
    threads: usize,
    /// Decode threads the autotuner may use for all streams together [default: the cores minus
    /// one per training process on the node].
    #[arg(long, value_name = "N")]
    cpu_budget: Option<u32>,
    /// Largest image accepted, in pixels.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_pixels)]
    max_pixels: u64,
    /// Exit once the last client has left and none came back within SECS seconds (what a
    /// sidecar started by the Python client uses).
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "5")]
    exit_when_idle: Option<f64>,
    /// Only serve datasets under this directory (repeatable).
    #[arg(long, value_name = "DIR")]
    data_root: Vec<PathBuf>,
    /// Pin each decode thread to its own CPU, from the last CPU of the process's affinity mask
    /// down (with --threads N, N CPUs; run the training processes on the others).
    #[arg(long)]
    pin_threads: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics; ADDR is PORT (on 127.0.0.1) or HOST:PORT.
    #[arg(long, value_name = "ADDR", value_parser = ringfeed_serve::observe::metrics_addr)]
    metrics: Option<std::net::SocketAddr>,
    /// Largest shared-memory ring one client may ask for, e.g. 16GiB.
    #[arg(long, value_name = "SIZE", default_value = "16GiB", value_parser = parse_size)]
    max_ring_bytes: u64,
    /// While an image folder or manifest is being listed for a client, tell the client how far
    /// the listing is every SECS seconds.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    open_progress: f64,
    #[command(flatten)]
    remote: RemoteArgs,
}

/// Remote datasets (`s3://bucket/prefix`, docs/remote.md): the shard cache and fetching.
#[derive(clap::Args, Debug)]
struct RemoteArgs {
    /// Directory of the shard cache [default: $XDG_CACHE_HOME/ringfeed/shards, else
    /// ~/.cache/ringfeed/shards].
    #[arg(long, value_name = "DIR", env = "RINGFEED_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Most bytes the shard cache may hold, e.g. 100GiB [default: half the space free in its
    /// directory, at most 64 GiB].
    #[arg(long, value_name = "SIZE", env = "RINGFEED_CACHE_BYTES", value_parser = parse_size)]
    cache_bytes: Option<u64>,
    /// Downloads running at once, over every stream: pins it [default: set by the autotuner,
    /// starting at 4, within what the cache's bound holds].
    #[arg(long, value_name = "N", env = "RINGFEED_FETCH_CONCURRENCY", value_parser = clap::value_parser!(u32).range(1..=256))]
    fetch_concurrency: Option<u32>,
    /// Shards each stream downloads ahead of its reads, in the order it will read them (0: none).
    #[arg(long, value_name = "N", env = "RINGFEED_PREFETCH_SHARDS", default_value_t = 4)]
    prefetch_shards: usize,
    /// Deadline of one request to the object store, its whole body included, in seconds.
    #[arg(long, value_name = "SECS", env = "RINGFEED_FETCH_TIMEOUT", default_value_t = 120.0)]
    fetch_timeout: f64,
    /// Attempts after the first for a failed request (timeouts, 5xx, 429/503, resets, short or
    /// corrupted bodies).
    #[arg(long, value_name = "N", env = "RINGFEED_FETCH_RETRIES", default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=100))]
    fetch_retries: u32,
}

impl RemoteArgs {
    fn config(&self) -> Result<ringfeed_remote::RemoteConfig> {
        if !(0.1..=86400.0).contains(&self.fetch_timeout) {
            bail!(
                "--fetch-timeout {} must be between 0.1 and 86400 seconds",
                self.fetch_timeout
            );
        }
        let mut c = ringfeed_remote::RemoteConfig::defaults();
        if let Some(d) = &self.cache_dir {
            c.cache_bytes = ringfeed_remote::default_cache_bytes(d);
            c.cache_dir = d.clone();
        }
        if let Some(b) = self.cache_bytes {
            c.cache_bytes = b;
        }
        if let Some(n) = self.fetch_concurrency {
            c.concurrency = n as usize;
            c.concurrency_pinned = true;
        }
        c.prefetch_shards = self.prefetch_shards;
        c.timeout = std::time::Duration::from_secs_f64(self.fetch_timeout);
        c.retries = self.fetch_retries;
        Ok(c)
    }
}

#[derive(clap::Args, Debug)]
struct LmdbArgs {
    /// How LMDB values are laid out (see docs/lmdb.md).
    #[arg(long, value_name = "LAYOUT", default_value = "auto", value_parser = ["auto", "raw", "pickle", "msgpack"])]
    lmdb_layout: String,
    /// Raw layout: labels from this file (CSV `key,label`, JSON, or JSONL).
    #[arg(long, value_name = "FILE", conflicts_with = "labels_key")]
    labels: Option<PathBuf>,
    /// Raw layout: labels from the value of this key in the same LMDB.
    #[arg(long, value_name = "KEY")]
    labels_key: Option<String>,
}

impl LmdbArgs {
    fn options(&self) -> Result<LmdbOptions> {
        let layout: Layout = self.lmdb_layout.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
        let labels = match (&self.labels, &self.labels_key) {
            (Some(f), _) => LabelSource::File(f.clone()),
            (None, Some(k)) => LabelSource::Key(k.as_bytes().to_vec()),
            (None, None) => LabelSource::None,
        };
        Ok(LmdbOptions { layout, labels })
    }
}

#[derive(clap::Args, Debug)]
struct PackArgs {
    /// Image folder (SRC/class/*.jpg), manifest (.csv/.jsonl) or LMDB.
    src: PathBuf,
    /// Output dataset directory (must not exist unless --force), or an `s3://bucket/prefix`
    /// (packed in a temporary directory, then uploaded: shards first, the index last).
    out: PathBuf,
    /// What SRC is.
    #[arg(long, value_enum, default_value_t = InputKind::Auto)]
    input: InputKind,
    /// Target shard size, e.g. 256MiB, 1GB, 500M.
    #[arg(long, value_name = "SIZE", default_value = "256MiB", value_parser = parse_size)]
    shard_size: u64,
    /// Record alignment in bytes (power of two, 8..=1MiB).
    #[arg(long, value_name = "BYTES", default_value_t = ringfeed_format::shard::DEFAULT_RECORD_ALIGN)]
    align: u32,
    /// Re-encode every image as JPEG, downscaled so its longer side is at most --max-side.
    /// Decoding the smaller files is several times cheaper at training time.
    #[arg(long)]
    reencode: bool,
    /// Longest side after re-encoding, in pixels.
    #[arg(long, value_name = "PX", default_value_t = 512, requires = "reencode")]
    max_side: u32,
    /// JPEG quality when re-encoding (1-100).
    #[arg(long, value_name = "Q", default_value_t = 90, requires = "reencode", value_parser = clap::value_parser!(u8).range(1..=100))]
    quality: u8,
    /// Store JPEGs byte for byte. By default sequential JPEGs are rewritten losslessly with
    /// restart markers every 2 MCUs (like `jpegtran -restart 2B -optimize -copy all`): the
    /// same pixels, and the server then decodes only the part of each file a crop needs.
    #[arg(long)]
    no_restarts: bool,
    /// How each image is checked while packing.
    #[arg(long, value_enum, default_value_t = Check::Decode)]
    check: Check,
    /// Largest image accepted, in pixels (width x height); bounds memory per thread.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_pixels)]
    max_pixels: u64,
    /// Worker threads (default: all cores).
    #[arg(long, short = 'j', value_name = "N", default_value_t = 0)]
    threads: usize,
    /// What to do with a file that cannot be packed.
    #[arg(long, value_enum, default_value_t = OnError::Fail)]
    on_error: OnError,
    /// Where `--on-error skip` lists skipped files (default: OUT/skipped.tsv).
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Replace OUT if it exists.
    #[arg(long)]
    force: bool,
    /// Progress display.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    progress: ProgressMode,
    /// Also write the closing summary as JSON to this file.
    #[arg(long, value_name = "FILE")]
    summary_json: Option<PathBuf>,
    #[command(flatten)]
    lmdb: LmdbArgs,
    #[command(flatten)]
    text: TextArgs,
    #[command(flatten)]
    remote: RemoteArgs,
}

/// The `s3://` URL `p` names, if it names one.
fn remote_url(p: &Path) -> Result<Option<ringfeed_remote::RemoteUrl>> {
    match p.to_str().and_then(ringfeed_remote::RemoteUrl::parse) {
        None => Ok(None),
        Some(u) => Ok(Some(u?)),
    }
}

/// A temporary directory for a remote dataset's local copy, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> Result<Self> {
        let p = std::env::temp_dir().join(format!(".ringfeed-{what}-{}", std::process::id()));
        if p.exists() {
            std::fs::remove_dir_all(&p).with_context(|| format!("removing {}", p.display()))?;
        }
        std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `pack SRC s3://...`: packs into a temporary directory, then uploads it (index last).
fn run_pack_remote(mut a: PackArgs, url: ringfeed_remote::RemoteUrl) -> Result<ExitCode> {
    let config = a.remote.config()?;
    let store = ringfeed_pack::remote::store_for(&url, &config)?;
    if !a.force && ringfeed_pack::remote::exists(&store, &url)? {
        bail!(
            "{url} already holds a dataset (its {}); pass --force to replace it",
            ringfeed_format::shard::INDEX_FILE
        );
    }
    let tmp = TempDir::new("pack")?;
    let local = tmp.0.join("dataset");
    a.out = local.clone();
    a.force = false;
    let code = if a.text.tokenizer.is_some() {
        run_pack_text(a)?
    } else {
        run_pack_local(a)?
    };
    if code != ExitCode::SUCCESS {
        return Ok(code);
    }
    let (files, bytes) = ringfeed_pack::remote::upload(&store, &local, &url)?;
    println!("uploaded {files} files, {:.1} MB, to {url}", bytes as f64 / 1e6);
    Ok(ExitCode::SUCCESS)
}

/// Text packing: with `--tokenizer`, SRC is text (JSONL, Parquet or plain text) and OUT a token
/// dataset.
#[derive(clap::Args, Debug)]
struct TextArgs {
    /// Pack text into a token dataset with this Hugging Face tokenizer.json: SRC is a JSONL file,
    /// a Parquet file, a plain-text file, or a directory of them (`--text-input` picks the kind
    /// of a directory's files: `*.txt` by default).
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
    /// What the text input is.
    #[arg(long, value_enum, default_value_t = TextInput::Auto, requires = "tokenizer")]
    text_input: TextInput,
    /// JSONL and Parquet: the field (column) holding each document's text.
    #[arg(long, value_name = "NAME", default_value = "text", requires = "tokenizer")]
    text_field: String,
    /// JSONL: the prompt field of prompt/completion pairs (its tokens carry no loss).
    #[arg(long, value_name = "NAME", requires_all = ["tokenizer", "completion_field"])]
    prompt_field: Option<String>,
    /// JSONL: the completion field of prompt/completion pairs.
    #[arg(long, value_name = "NAME", requires_all = ["tokenizer", "prompt_field"])]
    completion_field: Option<String>,
    /// The token appended after each document [default: the tokenizer's <|endoftext|>, </s>, ...].
    #[arg(long, value_name = "TOKEN", requires = "tokenizer", conflicts_with = "no_eos")]
    eos: Option<String>,
    /// Append no end-of-document token.
    #[arg(long, requires = "tokenizer")]
    no_eos: bool,
    /// Also write the `pack`-mode windows for this seq_len (DATASET/packing-N.rfp), so that a
    /// `pack` stream of that seq_len opens without packing every document at start-up.
    /// Repeatable, or comma-separated: `--pack-seq-len 2048,4096`.
    #[arg(long, value_name = "N", requires = "tokenizer", value_delimiter = ',')]
    pack_seq_len: Vec<u32>,
}

#[derive(clap::Args, Debug)]
struct PackingArgs {
    /// A token dataset directory (DATASET/tokens.rft).
    dataset: PathBuf,
    /// The seq_len to write the `pack`-mode windows for (DATASET/packing-N.rfp, replaced if it
    /// exists). Repeatable, or comma-separated.
    #[arg(long, value_name = "N", required = true, value_delimiter = ',')]
    seq_len: Vec<u32>,
}

#[derive(clap::Args, Debug)]
struct VerifyArgs {
    /// Packed dataset directory, or an `s3://bucket/prefix` (streamed shard by shard through a
    /// temporary directory: one shard on disk at a time).
    dataset: PathBuf,
    /// Also decode every sample.
    #[arg(long)]
    decode: bool,
    /// Threads for --decode (default: all cores).
    #[arg(long, short = 'j', value_name = "N", default_value_t = 0)]
    threads: usize,
    /// Largest image accepted by --decode, in pixels.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_pixels)]
    max_pixels: u64,
    /// Progress display.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    progress: ProgressMode,
    /// DATASET is a flat token file (nanoGPT's train.bin) of this dtype.
    #[arg(long, value_enum, value_name = "DTYPE")]
    dtype: Option<FlatDtype>,
    #[command(flatten)]
    remote: RemoteArgs,
}

#[derive(clap::Args, Debug)]
struct IndexArgs {
    /// WebDataset tars: directories of `*.tar` files, `.tar` files, or patterns
    /// (`shards-{000..099}.tar`, `shards-*.tar`); or tars in a store, `s3://bucket/prefix`
    /// (every `*.tar` under it), a pattern or one `.tar` key, whose index is written beside
    /// each tar in the store (each tar downloaded once, `--fetch-concurrency` at a time,
    /// through a temporary directory).
    #[arg(required = true)]
    datasets: Vec<String>,
    /// Progress display (tars in a store).
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    progress: ProgressMode,
    #[command(flatten)]
    remote: RemoteArgs,
}

#[derive(clap::Args, Debug)]
struct InspectArgs {
    /// Packed dataset directory, an LMDB, a token dataset, a Megatron PREFIX.bin, or WebDataset
    /// tars; or an `s3://bucket/prefix` packed dataset (read with ranged GETs: the index, the
    /// record tables and a few samples, never whole shards), or WebDataset tars in a store
    /// (`s3://bucket/prefix` without an index.rfi, a pattern, a `.tar` key: ranged GETs where
    /// a tar has a valid TAR.rfidx beside it, else the tar read whole).
    dataset: PathBuf,
    /// Describe this sample (for token data: this document).
    #[arg(long, value_name = "I", default_value_t = 0)]
    sample: u64,
    /// Token data: decode the sample with this tokenizer.json.
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
    /// DATASET is a flat token file (nanoGPT's train.bin) of this dtype.
    #[arg(long, value_enum, value_name = "DTYPE")]
    dtype: Option<FlatDtype>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    lmdb: LmdbArgs,
    #[command(flatten)]
    remote: RemoteArgs,
}

/// Parses a byte size: a number with an optional K/M/G/T suffix (powers of 1000), or
/// KiB/MiB/GiB/TiB (powers of 1024). `B` alone or no suffix means bytes.
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid size {s:?}: expected e.g. 256MiB, 1GB or 500000000"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0f64.powi(4),
        other => {
            return Err(format!(
                "invalid size unit {other:?} in {s:?}: use K, M, G, T, KiB, MiB, GiB or TiB"
            ));
        }
    };
    let v = n * mult;
    if !(1.0..=u64::MAX as f64).contains(&v) {
        return Err(format!("size {s:?} is out of range"));
    }
    Ok(v as u64)
}

/// Sets `flag` on SIGINT and SIGTERM, so long commands stop cleanly instead of dying mid-write.
fn cancel_on_signals() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&flag)).context("installing a signal handler")?;
    }
    Ok(flag)
}

fn run_pack(a: PackArgs) -> Result<ExitCode> {
    if let Some(url) = remote_url(&a.out)? {
        return run_pack_remote(a, url);
    }
    run_pack_local(a)
}

fn run_pack_local(a: PackArgs) -> Result<ExitCode> {
    if a.text.tokenizer.is_some() {
        return run_pack_text(a);
    }
    let cancel = cancel_on_signals()?;
    let opts = PackOptions {
        input: a.input,
        lmdb: a.lmdb.options()?,
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
        on_error: a.on_error,
        report: a.report,
        force: a.force,
        progress: a.progress,
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

fn run_pack_text(a: PackArgs) -> Result<ExitCode> {
    let cancel = cancel_on_signals()?;
    let t = a.text;
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

/// Whether `path` holds token data (a token dataset, a Megatron .bin/.idx pair), or `--dtype`
/// says it is a flat token file.
fn is_token_data(path: &Path, dtype: Option<FlatDtype>) -> bool {
    dtype.is_some()
        || path.join(ringfeed_format::tokens::TOKENS_FILE).is_file()
        || (path.extension().is_some_and(|e| e == "bin" || e == "idx") && path.with_extension("idx").is_file())
}

fn run_verify_tokens(a: &VerifyArgs) -> Result<ExitCode> {
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
fn print_verified(r: &ringfeed_format::shard::VerifyReport, decoded: bool, from: &str) {
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

fn run_verify(a: VerifyArgs) -> Result<ExitCode> {
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
    let decode = move |data: &[u8]| -> Result<(), String> {
        DECODER.with(|d| {
            let mut d = d.borrow_mut();
            if d.is_none() {
                *d = Some(Decoder::new(limits).map_err(|e| e.to_string())?);
            }
            let decoder = d.as_mut().expect("set above");
            SCRATCH.with(|s| {
                decoder
                    .decode_rgb8(data, &mut s.borrow_mut())
                    .map(|_| ())
                    .map_err(|e| e.to_string())
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
        // Streamed: one shard at a time in a temporary directory, never the whole dataset.
        let tmp = TempDir::new("verify")?;
        let store = ringfeed_pack::remote::store_for(&url, &a.remote.config()?)?;
        let mut on_shard = |n: u32, of: u32| progress.message(&format!("verifying {url}: shard {} of {of}", n + 1));
        let result = ringfeed_pack::remote::verify(&store, &url, &tmp.0.join("shard"), &opts, &mut on_shard);
        progress.finish();
        return match result {
            Ok(r) => {
                print_verified(&r, a.decode, &format!(" (streamed from {url}, one shard at a time)"));
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => {
                let kind = e.kind();
                let e: anyhow::Error = match e {
                    ringfeed_pack::remote::ToolError::Verify(VerifyError::Format(f)) => f.into(),
                    other => other.into(),
                };
                Err(e.context(format!("verify failed ({kind})")))
            }
        };
    }
    let result = ringfeed_format::shard::verify(&a.dataset, &opts);
    progress.finish();
    match result {
        Ok(r) => {
            print_verified(&r, a.decode, "");
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

fn is_lmdb(path: &Path) -> bool {
    path.join("data.mdb").is_file() || path.extension().is_some_and(|e| e == "mdb" || e == "lmdb")
}

fn run_inspect(a: InspectArgs) -> Result<ExitCode> {
    if let Some(url) = remote_url(&a.dataset)? {
        let store = ringfeed_pack::remote::store_for(&url, &a.remote.config()?)?;
        let inspection = if ringfeed_remote::wds::names_tars(&url) || !ringfeed_pack::remote::exists(&store, &url)? {
            // WebDataset tars: ranged GETs where their index files are valid, else each tar
            // read whole through a temporary directory.
            let tmp = TempDir::new("inspect")?;
            ringfeed_pack::remote::inspect_tars(&store, &url, Some(a.sample), &tmp.0)?
        } else {
            // Ranged GETs of the index, the record tables and a few samples' first bytes only.
            ringfeed_pack::remote::inspect(&store, &url, Some(a.sample))?
        };
        if a.json {
            println!("{}", serde_json::to_string_pretty(&inspection.to_json())?);
        } else {
            print!("{}", inspection.to_text());
        }
        return Ok(ExitCode::SUCCESS);
    }
    if is_token_data(&a.dataset, a.dtype) {
        let src = TokenSource::open(&a.dataset, a.dtype)?;
        let tok = match &a.tokenizer {
            Some(p) => Some(ringfeed_pack::text::load_tokenizer(p)?),
            None => None,
        };
        let v = ringfeed_pack::inspect::tokens::inspect(&src, a.sample, tok.as_ref())?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            print!("{}", ringfeed_pack::inspect::tokens::to_text(&v));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let text = a.dataset.to_string_lossy();
    let tars = ringfeed_source::files::ServedKind::detect(&a.dataset)
        .is_ok_and(|k| k == ringfeed_source::files::ServedKind::WebDataset)
        || (!a.dataset.exists() && ringfeed_source::wds::pattern::is_pattern(&text));
    let inspection = if tars {
        ringfeed_pack::inspect::inspect_webdataset(&text, Some(a.sample))?
    } else if is_lmdb(&a.dataset) {
        ringfeed_pack::inspect::inspect_lmdb(&a.dataset, &a.lmdb.options()?, Some(a.sample))?
    } else {
        ringfeed_pack::inspect::inspect_packed(&a.dataset, Some(a.sample))?
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&inspection.to_json())?);
    } else {
        print!("{}", inspection.to_text());
    }
    Ok(ExitCode::SUCCESS)
}

/// The error and its causes on one line, "context: cause: cause", leaving out a cause whose text
/// the message already ends with (our error types print their source inline).
fn one_line(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if msg.ends_with(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    msg
}

fn run_serve(a: ServeArgs) -> Result<ExitCode> {
    let socket = a.socket.unwrap_or_else(ringfeed_serve::socket::default_socket_path);
    let data_roots = a
        .data_root
        .iter()
        .map(|d| std::fs::canonicalize(d).with_context(|| format!("--data-root {}", d.display())))
        .collect::<Result<Vec<_>>>()?;
    if let Some(s) = a.exit_when_idle.filter(|s| !(0.0..=86400.0).contains(s)) {
        bail!("--exit-when-idle {s} must be between 0 and 86400 seconds");
    }
    if !(0.001..=3600.0).contains(&a.open_progress) {
        bail!(
            "--open-progress {} must be between 0.001 and 3600 seconds",
            a.open_progress
        );
    }
    let config = ringfeed_serve::server::ServeConfig {
        open_progress: std::time::Duration::from_secs_f64(a.open_progress),
        socket: socket.clone(),
        threads: a.threads,
        limits: Limits {
            max_pixels: a.max_pixels,
        },
        exit_when_idle: a.exit_when_idle.map(std::time::Duration::from_secs_f64),
        data_roots,
        max_ring_bytes: a.max_ring_bytes,
        cpu_budget: a.cpu_budget,
        metrics: a.metrics,
        pin_threads: a.pin_threads,
        remote: a.remote.config()?,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ringfeed-control")
        .enable_all()
        .build()
        .context("starting the control runtime")?;
    runtime.block_on(async {
        let listener = ringfeed_serve::server::bind(&socket)?;
        eprintln!("ringfeed: serving on {}", socket.display());
        ringfeed_serve::server::run(config, listener, std::future::pending()).await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

fn run_packing(a: PackingArgs) -> Result<ExitCode> {
    ringfeed_format::fault::install().context("installing the SIGBUS handler")?;
    let tf = ringfeed_format::tokens::TokenFile::open(&a.dataset)?;
    let mut seq_lens = a.seq_len;
    seq_lens.sort_unstable();
    seq_lens.dedup();
    for s in seq_lens {
        let t0 = std::time::Instant::now();
        let h = ringfeed_format::tokens::packing::write(&tf, s)?;
        println!(
            "wrote {}: {} documents in {} windows of seq_len {s} ({} tokens cut), {:.1} s",
            tf.dir().join(ringfeed_format::tokens::packing::file_name(s)).display(),
            h.doc_count,
            h.window_count,
            h.cut_tokens,
            t0.elapsed().as_secs_f64()
        );
    }
    if let Some(off) = tf.fault() {
        bail!("{} changed while it was read (at byte {off})", tf.path().display());
    }
    Ok(ExitCode::SUCCESS)
}

fn run_index(a: IndexArgs) -> Result<ExitCode> {
    use ringfeed_source::wds;
    let mut damaged = 0;
    let (mut written, mut fresh) = (0, 0);
    for d in &a.datasets {
        if let Some(url) = remote_url(Path::new(d))? {
            let (w, f, bad) = run_index_remote(&a, &url)?;
            (written, fresh, damaged) = (written + w, fresh + f, damaged + bad);
            continue;
        }
        let tars = wds::pattern::tars(d).map_err(anyhow::Error::msg)?;
        for t in &tars {
            let r = wds::write_index(t, &std::sync::atomic::AtomicU64::new(0))?;
            let what = if r.fresh { "index valid, kept" } else { "index written" };
            println!("{}: {} members, {what}", t.display(), r.members);
            if let Some(p) = &r.problem {
                eprintln!("ringfeed: {}: {p}", t.display());
                damaged += 1;
            }
            if r.fresh {
                fresh += 1;
            } else {
                written += 1;
            }
        }
    }
    eprintln!("ringfeed: {written} index files written, {fresh} already valid, {damaged} damaged tars");
    Ok(if damaged > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `index s3://...`: every tar's index checked or written beside it in the store; returns the
/// index files written, those already valid, and the damaged tars.
fn run_index_remote(a: &IndexArgs, url: &ringfeed_remote::RemoteUrl) -> Result<(usize, usize, usize)> {
    let config = a.remote.config()?;
    let store = ringfeed_pack::remote::store_for(url, &config)?;
    let tmp = TempDir::new("index")?;
    let progress = Progress::new(a.progress);
    progress.message(&format!("indexing the tars of {url}"));
    let on_start = |i: usize, n: usize, key: &str, size: u64| {
        progress.message(&format!(
            "indexing tar {} of {n}: s3://{}/{key} ({:.1} MB)",
            i + 1,
            url.bucket,
            size as f64 / 1e6
        ));
    };
    let on_done = |r: &ringfeed_remote::wds::ObjectIndexReport| {
        let what = match (&r.rebuilt, r.fresh) {
            (_, true) => "index valid, kept".to_owned(),
            (Some(why), false) => format!("index rebuilt (the one there was not used: {why})"),
            (None, false) => "index written".to_owned(),
        };
        println!("{}: {} members, {what}", r.url, r.members);
        if let Some(p) = &r.problem {
            eprintln!("ringfeed: {}: {p}", r.url);
        }
    };
    let reports = ringfeed_remote::wds::index_objects(&store, url, config.concurrency, &tmp.0, &on_start, &on_done);
    progress.finish();
    let reports = reports.with_context(|| format!("indexing {url}"))?;
    let fresh = reports.iter().filter(|r| r.fresh).count();
    let damaged = reports.iter().filter(|r| r.problem.is_some()).count();
    let read: u64 = reports.iter().map(|r| r.read).sum();
    eprintln!(
        "ringfeed: {url}: {} tars, {:.1} MB downloaded to index them",
        reports.len(),
        read as f64 / 1e6
    );
    Ok((reports.len() - fresh, fresh, damaged))
}

fn run_ops(a: OpsArgs) -> Result<ExitCode> {
    use ringfeed_ops::{BufferSink, Options, Pipeline, Processor, Trace};
    use ringfeed_order::rng::SampleRng;
    use std::io::Write;
    let text = match a.pipeline.strip_prefix('@') {
        Some(f) => std::fs::read_to_string(f).with_context(|| format!("reading {f}"))?,
        None => a.pipeline.clone(),
    };
    let value: serde_json::Value = serde_json::from_str(&text).context("--pipeline is not JSON")?;
    let pipeline = Pipeline::parse(&value).map_err(|e| anyhow::anyhow!("--pipeline: {e}"))?;
    let data = std::fs::read(&a.image).with_context(|| format!("reading {}", a.image.display()))?;
    let options = Options {
        region_decode: !a.no_region_decode,
        ..Options::default()
    };
    let mut p = Processor::with_options(Limits::default(), options)?;
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(&a.out).with_context(|| format!("creating {}", a.out.display()))?,
    );
    let stdout = std::io::stdout();
    let mut lines = stdout.lock();
    let mut sink = BufferSink::for_pipeline(&pipeline);
    let mut trace = Trace::on();
    for index in a.index..a.index + a.count {
        let rng = SampleRng::new(a.seed, a.epoch, index);
        let crop = p
            .run(&data, &pipeline, rng, ringfeed_ops::Layout::Nhwc, &mut sink, &mut trace)
            .with_context(|| format!("{}: sample {index}", a.image.display()))?;
        for o in &sink.outs {
            out.write_all(o)?;
        }
        let line = serde_json::json!({
            "index": index,
            "trace": trace.take(),
            "erase": sink.erase,
            "crop": crop.to_i32s(),
        });
        writeln!(lines, "{line}")?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn run_top(a: TopArgs) -> Result<ExitCode> {
    use std::io::{IsTerminal, Write};
    if !(0.05..=3600.0).contains(&a.interval) {
        bail!("--interval {} must be between 0.05 and 3600 seconds", a.interval);
    }
    let socket = a.socket.unwrap_or_else(ringfeed_serve::socket::default_socket_path);
    let mut observer = ringfeed_serve::observe::Observer::connect(&socket)?;
    let live = !a.once && !a.json && std::io::stdout().is_terminal();
    let mut out = std::io::stdout().lock();
    loop {
        let snap = observer.snapshot(&socket)?;
        let text = if a.json {
            serde_json::to_string(&snap)? + "\n"
        } else {
            ringfeed_serve::observe::render(&snap)
        };
        if live {
            // Home, clear, redraw.
            write!(out, "\x1b[H\x1b[2J{text}")?;
        } else {
            write!(out, "{text}")?;
        }
        out.flush()?;
        if a.once {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(a.interval));
    }
}

/// Replaces this process with `PYTHON -m ringfeed.bench ARGS`, where PYTHON is
/// `$RINGFEED_PYTHON`, else the `python3` beside this binary (a virtualenv's, where the wheel
/// put both), else `python3` on `PATH`. The Loader it runs starts this very binary as its server
/// (`RINGFEED_BIN`).
fn run_bench(a: BenchArgs) -> Result<ExitCode> {
    use std::os::unix::process::CommandExt;
    let me = std::env::current_exe().context("finding this binary's path")?;
    let python = std::env::var_os("RINGFEED_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            let beside = me.parent()?.join("python3");
            beside.is_file().then_some(beside)
        })
        .unwrap_or_else(|| PathBuf::from("python3"));
    let err = std::process::Command::new(&python)
        .args(["-m", "ringfeed.bench"])
        .args(&a.args)
        .env("RINGFEED_BIN", &me)
        .exec();
    bail!(
        "cannot run `{} -m ringfeed.bench`: {err} (set RINGFEED_PYTHON to a Python with the ringfeed package installed)",
        python.display()
    )
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RINGFEED_LOG")
                .unwrap_or_else(|_| "warn,ringfeed_serve::tune=info,ringfeed_format::tokens=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Pack(a) => run_pack(*a),
        Command::Verify(a) => run_verify(a),
        Command::Inspect(a) => run_inspect(a),
        Command::Index(a) => run_index(a),
        Command::Packing(a) => run_packing(a),
        Command::Serve(a) => run_serve(a),
        Command::Top(a) => run_top(a),
        Command::Ops(a) => run_ops(a),
        Command::Bench(a) => run_bench(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("500M"), Ok(500_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert!(parse_size("12parsecs").unwrap_err().contains("invalid size unit"));
        assert!(parse_size("").is_err());
        assert!(parse_size("0").is_err());
    }
}
