//! The offline packer: image folders, manifests and LMDBs in, a packed dataset out ([`text`]:
//! JSONL and plain text in, a token dataset out; feature `text`; [`targets`]: COCO boxes and PNG
//! label maps into the dataset's `targets.rft`). Also [`inspect`] (what a dataset holds, in
//! words), `remote` (upload, and verify or inspect in a store; feature `remote`) and
//! [`progress`] (bars and plain progress lines).
//!
//! ```text
//!  plan (ordered items) ──► dispatcher ──jobs──► N workers: read, check, re-encode ──results──►
//!                              ▲                                                            │
//!                              └────────────── tokens (bounded reorder window) ◄── writer ◄─┘
//! ```
//!
//! - The plan fixes the sample order up front. Workers finish out of order; the writer (the
//!   calling thread) puts results back in plan order before appending them to the dataset, so the
//!   output bytes do not depend on the number of threads or on timing.
//! - The dispatcher takes a token before sending each job and the writer returns it once that
//!   sample is written, so at most `window` samples are in memory at once, however slow one image
//!   is to decode.
//! - The dataset is written into a temporary directory beside the destination and renamed only
//!   when every file is complete and synced. A failed or interrupted pack removes it; nothing that
//!   looks like a dataset is ever left behind.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded};

use ringfeed_decode::{Decoder, Limits, RESTART_TARGET_MCUS, Reencode};
use ringfeed_format::shard::{DatasetWriter, ShardError, WriteSummary, WriterOptions};
use ringfeed_format::targets::{InstancesIn, TARGETS_FILE, TargetsWriter};
use ringfeed_source::listing;
use ringfeed_source::lmdb::LmdbOptions;
use ringfeed_source::{SampleReader, Source};

pub mod inspect;
pub mod progress;
#[cfg(feature = "remote")]
pub mod remote;
pub mod targets;
#[cfg(feature = "text")]
pub mod text;

pub use crate::progress::ProgressMode;
pub use crate::targets::TargetsInput;
pub use ringfeed_source::listing::{InputKind, ParquetColumns, Plan};

/// What to do when one input file cannot be packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum OnError {
    /// Stop at the first bad file, name it and the reason, and leave no output.
    Fail,
    /// Leave the file out, write it and the reason to the report, and go on.
    Skip,
}

/// How thoroughly each image is checked while packing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Check {
    /// Decode every image fully: catches truncated and corrupt files (the default).
    Decode,
    /// Read only the header: format, size, pixel limit. Faster; corrupt pixel data gets through.
    Header,
}

/// Everything `pack` needs to know.
#[derive(Debug, Clone)]
pub struct PackOptions {
    pub input: InputKind,
    pub lmdb: LmdbOptions,
    /// 1.9: the columns of a Parquet input.
    pub parquet: ParquetColumns,
    pub writer: WriterOptions,
    /// Re-encode every image as JPEG with this maximum side and quality; `None` keeps the bytes.
    pub reencode: Option<Reencode>,
    /// Rewrite 8-bit JPEGs losslessly as sequential JPEGs with restart markers
    /// ([`Decoder::add_restarts`]), so that the server's region decodes skip the Huffman
    /// decoding outside each crop. Every rewrite is decoded and compared with the original and
    /// kept only if every pixel is the same; the stored bytes differ from the input's. Default
    /// `true`.
    pub restarts: bool,
    pub check: Check,
    pub limits: Limits,
    /// Worker threads; 0 means all cores.
    pub threads: usize,
    pub on_error: OnError,
    /// Where the skip report goes; default `OUT/skipped.tsv`.
    pub report: Option<PathBuf>,
    /// Replace an existing dataset at the destination.
    pub force: bool,
    pub progress: ProgressMode,
    /// Detection and segmentation targets (`--coco`, `--masks`): written to `targets.rft`.
    pub targets: TargetsInput,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            input: InputKind::Auto,
            lmdb: LmdbOptions::default(),
            parquet: ParquetColumns::default(),
            writer: WriterOptions::default(),
            reencode: None,
            restarts: true,
            check: Check::Decode,
            limits: Limits::default(),
            threads: 0,
            on_error: OnError::Fail,
            report: None,
            force: false,
            progress: ProgressMode::Auto,
            targets: TargetsInput::default(),
        }
    }
}

/// One input that was left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub key: String,
    pub reason: String,
}

/// What a successful pack did.
#[derive(Debug, Clone)]
pub struct PackSummary {
    pub input: &'static str,
    pub written: WriteSummary,
    /// Bytes read from the input (encoded images).
    pub input_bytes: u64,
    /// JPEGs rewritten with restart markers ([`PackOptions::restarts`]).
    pub restarted: u64,
    pub skipped: Vec<Skipped>,
    /// Files ignored because of their extension.
    pub ignored: u64,
    pub report: Option<PathBuf>,
    pub threads: usize,
    pub elapsed: Duration,
    /// With targets: boxes written, masks written, crowd annotations left out, the largest count.
    pub targets: Option<TargetsSummary>,
}

/// What `pack` wrote to `targets.rft`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetsSummary {
    pub boxes: u64,
    pub masks: u64,
    pub crowds: u64,
    pub max_boxes: u32,
    /// 1.1: instance masks written (one per box of a set with `segmentation`).
    pub instances: u64,
    /// 1.1: keypoints per box (0: none).
    pub keypoints: u32,
}

impl PackSummary {
    pub fn images_per_sec(&self) -> f64 {
        self.written.samples as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Input megabytes (10^6 bytes) read per second.
    pub fn input_mb_per_sec(&self) -> f64 {
        self.input_bytes as f64 / 1e6 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The closing summary as a JSON object (for `--summary-json` and benchmarks).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "input": self.input,
            "samples": self.written.samples,
            "shards": self.written.shards,
            "classes": self.written.classes,
            "bytes": self.written.bytes,
            "payload_bytes": self.written.payload_bytes,
            "input_bytes": self.input_bytes,
            "restarted": self.restarted,
            "skipped": self.skipped.len(),
            "ignored": self.ignored,
            "threads": self.threads,
            "seconds": self.elapsed.as_secs_f64(),
            "images_per_sec": self.images_per_sec(),
            "input_mb_per_sec": self.input_mb_per_sec(),
            "targets": self.targets.map(|t| serde_json::json!({
                "boxes": t.boxes, "masks": t.masks, "crowds": t.crowds, "max_boxes": t.max_boxes,
                "instances": t.instances, "keypoints": t.keypoints,
            })),
        })
    }
}

/// Why a pack failed. In every case the destination is untouched and no temporary output remains.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error(transparent)]
    Input(#[from] listing::InputError),
    #[error("{key}: {reason} (pass `--on-error skip` to leave such files out and list them in a report)")]
    BadSample { key: String, reason: String },
    #[error(
        "{} already exists; pass --force to replace it, or choose another output directory",
        path.display()
    )]
    Exists { path: PathBuf },
    #[error("no sample could be packed: all {skipped} inputs were skipped (see {})", report.display())]
    NothingPacked { skipped: usize, report: PathBuf },
    #[error("no samples to pack in {}", path.display())]
    Empty { path: PathBuf },
    #[error("interrupted; no output was written")]
    Interrupted,
    #[error("writing the dataset: {0}")]
    Write(#[from] ShardError),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: cannot load the tokenizer: {reason} (--tokenizer takes a Hugging Face tokenizer.json)", path.display())]
    Tokenizer { path: PathBuf, reason: String },
    /// A setting that cannot work with this input; the message names the flag.
    #[error("{0}")]
    Setting(String),
}

/// Packs `src` into a new dataset at `out`.
///
/// `cancel` is polled throughout: set it (from a signal handler, say) to stop early with
/// [`PackError::Interrupted`].
pub fn pack(src: &Path, out: &Path, opts: &PackOptions, cancel: &Arc<AtomicBool>) -> Result<PackSummary, PackError> {
    let started = Instant::now();
    if out.exists() && !opts.force {
        return Err(PackError::Exists { path: out.to_owned() });
    }
    let progress = crate::progress::Progress::new(opts.progress);
    progress.message(&format!("listing {}", src.display()));
    let coco = match &opts.targets.coco {
        Some(path) => {
            if !src.is_dir() {
                return Err(PackError::Setting(format!(
                    "{}: with --coco, SRC is the directory the COCO file's `file_name`s are relative to",
                    src.display()
                )));
            }
            Some(targets::Coco::load(path)?)
        }
        None => None,
    };
    let planned = match opts.input.detect(src) {
        _ if coco.is_some() => Ok(coco.as_ref().expect("checked").plan(src)),
        #[cfg(feature = "parquet")]
        InputKind::Parquet => {
            ringfeed_source::pq::plan(src, &opts.parquet, cancel, &std::sync::atomic::AtomicU64::new(0))
        }
        #[cfg(not(feature = "parquet"))]
        InputKind::Parquet => Err(listing::InputError::Invalid {
            path: src.to_owned(),
            detail: "this ringfeed was built without Parquet input (the `parquet` feature); use a build with default features".to_owned(),
        }),
        _ => listing::plan(src, opts.input, &opts.lmdb, cancel),
    };
    let plan = planned.map_err(|e| match e {
        listing::InputError::Interrupted => PackError::Interrupted,
        e => PackError::Input(e),
    })?;

    let mut skipped: Vec<Skipped> = Vec::new();
    for p in &plan.problems {
        let s = Skipped {
            key: String::from_utf8_lossy(&p.key).into_owned(),
            reason: p.reason.clone(),
        };
        if opts.on_error == OnError::Fail {
            return Err(PackError::BadSample {
                key: s.key,
                reason: s.reason,
            });
        }
        skipped.push(s);
    }
    if plan.items.is_empty() && skipped.is_empty() {
        return Err(PackError::Empty { path: src.to_owned() });
    }

    let tmp = temp_dir_for(out)?;
    let result = write_dataset(&plan, &tmp, opts, coco.as_ref(), cancel, &progress, &mut skipped);
    let (written, input_bytes, restarted, threads, targets) = match result {
        Ok(r) => r,
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            progress.finish();
            return Err(e);
        }
    };
    progress.finish();

    // The report is written inside the temporary directory too, so it appears atomically.
    let report = if skipped.is_empty() {
        None
    } else {
        let in_dataset = tmp.join("skipped.tsv");
        if let Err(e) = write_report(&in_dataset, &skipped) {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
        Some(in_dataset)
    };
    if written.samples == 0 {
        let keep = opts.report.clone().unwrap_or_else(|| sibling(out, ".skipped.tsv"));
        let moved = report.as_ref().map(|r| fs::rename(r, &keep));
        let _ = fs::remove_dir_all(&tmp);
        if let Some(Err(e)) = moved {
            return Err(PackError::Io { path: keep, source: e });
        }
        return Err(PackError::NothingPacked {
            skipped: skipped.len(),
            report: keep,
        });
    }
    install(&tmp, out, opts.force)?;
    let report = match (report, &opts.report) {
        (Some(_), Some(dest)) => {
            let inside = out.join("skipped.tsv");
            fs::rename(&inside, dest).map_err(|e| PackError::Io {
                path: dest.clone(),
                source: e,
            })?;
            Some(dest.clone())
        }
        (Some(_), None) => Some(out.join("skipped.tsv")),
        (None, _) => None,
    };
    Ok(PackSummary {
        input: if coco.is_some() { "coco" } else { plan.kind.name() },
        targets,
        written,
        input_bytes,
        restarted,
        skipped,
        ignored: plan.ignored,
        report,
        threads,
        elapsed: started.elapsed(),
    })
}

/// `out` with `suffix` appended to its file name.
fn sibling(out: &Path, suffix: &str) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_owned();
    name.push(suffix);
    out.with_file_name(name)
}

/// Creates the temporary directory `pack` writes into: hidden, beside `out` (same filesystem, so
/// the final rename is atomic), named after the process so concurrent packs never collide.
fn temp_dir_for(out: &Path) -> Result<PathBuf, PackError> {
    let name = out.file_name().ok_or_else(|| PackError::Io {
        path: out.to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "the output path has no file name"),
    })?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    if !parent.is_dir() {
        return Err(PackError::Io {
            path: out.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("the output's parent directory {} does not exist", parent.display()),
            ),
        });
    }
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".partial-{}", std::process::id()));
    let tmp = parent.join(tmp_name);
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|e| PackError::Io {
            path: tmp.clone(),
            source: e,
        })?;
    }
    fs::create_dir(&tmp).map_err(|e| PackError::Io {
        path: tmp.clone(),
        source: e,
    })?;
    Ok(tmp)
}

/// Moves the finished dataset into place, replacing an old one only with `force`.
fn install(tmp: &Path, out: &Path, force: bool) -> Result<(), PackError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| PackError::Io { path, source }
    };
    if out.exists() {
        if !force {
            let _ = fs::remove_dir_all(tmp);
            return Err(PackError::Exists { path: out.to_owned() });
        }
        // Move the old dataset aside first: between the two renames `out` is briefly absent,
        // never half-written.
        let old = sibling(out, &format!(".old-{}", std::process::id()));
        fs::rename(out, &old).map_err(io(out))?;
        fs::rename(tmp, out).map_err(io(out))?;
        if old.is_dir() {
            fs::remove_dir_all(&old).map_err(io(&old))?;
        } else {
            fs::remove_file(&old).map_err(io(&old))?;
        }
    } else {
        fs::rename(tmp, out).map_err(io(out))?;
    }
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        // Make the rename durable.
        fs::File::open(parent).and_then(|d| d.sync_all()).map_err(io(parent))?;
    }
    Ok(())
}

fn write_report(path: &Path, skipped: &[Skipped]) -> Result<(), PackError> {
    let io = |source| PackError::Io {
        path: path.to_owned(),
        source,
    };
    let mut f = std::io::BufWriter::new(fs::File::create(path).map_err(io)?);
    writeln!(f, "key\treason").map_err(io)?;
    for s in skipped {
        let clean = |t: &str| t.replace(['\t', '\n', '\r'], " ");
        writeln!(f, "{}\t{}", clean(&s.key), clean(&s.reason)).map_err(io)?;
    }
    f.flush().map_err(io)?;
    Ok(())
}

/// A worker's result for plan item `seq`.
enum Outcome {
    /// `restarted`: the data is the input rewritten with restart markers.
    Ready {
        data: Vec<u8>,
        input_len: u64,
        restarted: bool,
        /// With `--masks`: the sample's label map, re-encoded as 8-bit grey PNG.
        mask: Option<Vec<u8>>,
        /// With COCO segmentations: the stored image's `(width, height)` and each box's runs.
        instances: Option<(u32, u32, Vec<Vec<u8>>)>,
    },
    Bad {
        reason: String,
    },
}

/// What [`write_dataset`] returns: what was written, the input bytes, the JPEGs given restart
/// markers, the threads, the targets written.
type Written = (WriteSummary, u64, u64, usize, Option<TargetsSummary>);

/// Runs the worker pool and the writer (and, with targets, the targets file's writer, fed in
/// the index's order).
fn write_dataset(
    plan: &Plan,
    dir: &Path,
    opts: &PackOptions,
    coco: Option<&targets::Coco>,
    cancel: &AtomicBool,
    progress: &crate::progress::Progress,
    skipped: &mut Vec<Skipped>,
) -> Result<Written, PackError> {
    let threads = match opts.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let n = plan.items.len();
    let window = (threads * 8).max(64);
    let mut writer = DatasetWriter::create(dir, opts.writer)?;
    let mut targets_out = match opts.targets.is_some() {
        true => Some(TargetsWriter::create_with(
            &dir.join(TARGETS_FILE),
            coco.is_some(),
            opts.targets.masks.is_some(),
            coco.is_some_and(|c| c.instances),
            coco.map_or(0, |c| c.keypoints),
        )?),
        false => None,
    };
    let mut summary = TargetsSummary {
        crowds: coco.map_or(0, |c| c.crowds),
        ..TargetsSummary::default()
    };
    let (mut input_bytes, mut restarted_count) = (0u64, 0u64);
    progress.start(n as u64);

    // Set when the writer stops early (error or interrupt), so the dispatcher and workers quit.
    let stop = AtomicBool::new(false);
    let outcome: Result<(), PackError> = std::thread::scope(|scope| {
        let (job_tx, job_rx) = bounded::<usize>(window);
        let (res_tx, res_rx) = unbounded::<(usize, Outcome)>();
        let (token_tx, token_rx) = bounded::<()>(window);
        for _ in 0..window {
            token_tx.send(()).expect("the token channel has room for the window");
        }
        let stop = &stop;
        scope.spawn(move || {
            for seq in 0..n {
                // SYNC POINT: a token is returned by the writer only after it has consumed an
                // earlier result, so results held in the reorder buffer never exceed `window`.
                if token_rx.recv().is_err() || stop.load(Ordering::Relaxed) || cancel.load(Ordering::Relaxed) {
                    break;
                }
                if job_tx.send(seq).is_err() {
                    break;
                }
            }
        });
        for _ in 0..threads {
            let (job_rx, res_tx) = (job_rx.clone(), res_tx.clone());
            scope.spawn(move || {
                let mut worker = match Worker::new(plan, opts, coco) {
                    Ok(w) => w,
                    Err(e) => {
                        // Every job this worker would take fails the same way.
                        let reason = e.to_string();
                        for seq in job_rx.iter() {
                            let _ = res_tx.send((seq, Outcome::Bad { reason: reason.clone() }));
                        }
                        return;
                    }
                };
                for seq in job_rx.iter() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let outcome = worker.process(seq, &plan.items[seq]);
                    if res_tx.send((seq, outcome)).is_err() {
                        break;
                    }
                }
            });
        }
        drop((job_rx, res_tx));

        let mut pending: BTreeMap<usize, Outcome> = BTreeMap::new();
        let mut next = 0usize;
        let result = (|| {
            while next < n {
                if cancel.load(Ordering::Relaxed) {
                    return Err(PackError::Interrupted);
                }
                let (seq, outcome) = match res_rx.recv_timeout(Duration::from_millis(200)) {
                    Ok(r) => r,
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => continue,
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                        return Err(PackError::Interrupted);
                    }
                };
                pending.insert(seq, outcome);
                while let Some(outcome) = pending.remove(&next) {
                    let item = &plan.items[next];
                    match outcome {
                        Outcome::Ready {
                            data,
                            input_len,
                            restarted,
                            mask,
                            instances,
                        } => {
                            writer.push(&item.key, item.label, &item.meta, &data)?;
                            if let Some(t) = targets_out.as_mut() {
                                let none = targets::SampleBoxes::default();
                                let b = coco.map_or(&none, |c| &c.boxes[next]);
                                let inst = instances.as_ref().map(|(w, h, runs)| InstancesIn {
                                    width: *w,
                                    height: *h,
                                    runs,
                                });
                                t.push_all(&b.boxes, &b.labels, mask.as_deref(), inst, &b.keypoints)?;
                                summary.boxes += b.boxes.len() as u64;
                                summary.instances += instances.as_ref().map_or(0, |i| i.2.len() as u64);
                                summary.keypoints = coco.map_or(0, |c| c.keypoints);
                                summary.masks += u64::from(mask.is_some());
                                summary.max_boxes = summary.max_boxes.max(b.boxes.len() as u32);
                            }
                            input_bytes += input_len;
                            restarted_count += u64::from(restarted);
                        }
                        Outcome::Bad { reason } => {
                            let key = String::from_utf8_lossy(&item.key).into_owned();
                            if opts.on_error == OnError::Fail {
                                return Err(PackError::BadSample { key, reason });
                            }
                            skipped.push(Skipped { key, reason });
                        }
                    }
                    next += 1;
                    progress.advance(writer.bytes_written(), skipped.len());
                    let _ = token_tx.send(());
                }
            }
            Ok(())
        })();
        // SYNC POINT: `stop` tells the dispatcher and workers to quit; dropping the receivers
        // unblocks any sender, so the scope can join them.
        stop.store(true, Ordering::Relaxed);
        drop(res_rx);
        drop(token_tx);
        result
    });
    outcome?;

    let info = serde_json::json!({
        "format": "ringfeed-packed",
        "version": format!("{}.{}", ringfeed_format::shard::MAJOR, ringfeed_format::shard::MINOR),
        "writer": concat!("ringfeed ", env!("CARGO_PKG_VERSION")),
        "source_kind": plan.kind.name(),
        "encoding": match &opts.reencode {
            None => serde_json::json!({"mode": "copy"}),
            Some(r) => serde_json::json!({"mode": "reencode", "max_side": r.max_side, "quality": r.quality}),
        },
        "restarts": if opts.restarts {
            serde_json::json!({"target_mcus": RESTART_TARGET_MCUS, "rewritten": restarted_count})
        } else {
            serde_json::Value::Null
        },
    });
    progress.message("writing the index");
    let written = writer.finish(&plan.classes, &info.to_string())?;
    let targets = match targets_out {
        Some(t) => {
            progress.message("writing the targets");
            t.finish(coco.map_or("", |c| &c.categories))?;
            Some(summary)
        }
        None => None,
    };
    Ok((written, input_bytes, restarted_count, threads, targets))
}

/// Per-thread state: a decoder and, for LMDB inputs, a reader with its own transaction (for
/// Parquet inputs, one that keeps the row group it read last).
struct Worker<'a> {
    decoder: Decoder,
    lmdb: Option<Box<dyn SampleReader + 'a>>,
    rows: Option<Box<dyn SampleReader + 'a>>,
    opts: &'a PackOptions,
    coco: Option<&'a targets::Coco>,
    scratch: Vec<u8>,
}

/// Why a [`Worker`] cannot start: every sample it would take fails with this reason.
#[derive(Debug, thiserror::Error)]
enum WorkerError {
    /// The LMDB reader (its read transaction) cannot be made.
    #[error(transparent)]
    Lmdb(#[from] ringfeed_source::SourceError),
    /// The decoder cannot be made.
    #[error(transparent)]
    Decoder(#[from] ringfeed_decode::CodecError),
}

impl<'a> Worker<'a> {
    fn new(plan: &'a Plan, opts: &'a PackOptions, coco: Option<&'a targets::Coco>) -> Result<Self, WorkerError> {
        let lmdb = match &plan.lmdb {
            Some(source) => Some(source.reader()?),
            None => None,
        };
        let rows = match &plan.rows {
            Some(source) => Some(source.reader()?),
            None => None,
        };
        Ok(Worker {
            decoder: Decoder::new(opts.limits)?,
            lmdb,
            rows,
            opts,
            coco,
            scratch: Vec::new(),
        })
    }

    /// [`Worker::read`], then, with COCO segmentations, sample `seq`'s instance masks at the
    /// stored image's size ([`Worker::instances`]), and with `--masks`, its label map checked
    /// against it.
    fn process(&mut self, seq: usize, item: &listing::Item) -> Outcome {
        let read = self.read(item);
        let outcome = self.instances(seq, read);
        let (Some(masks), Outcome::Ready { data, mask, .. }) = (&self.opts.targets.masks, &outcome) else {
            return outcome;
        };
        debug_assert!(mask.is_none());
        let mut labels = std::mem::take(&mut self.scratch);
        let read = targets::read_mask(
            &mut self.decoder,
            masks,
            &item.key,
            data,
            self.opts.limits.max_pixels,
            &mut labels,
        );
        self.scratch = labels;
        match (read, outcome) {
            (
                Ok(png),
                Outcome::Ready {
                    data,
                    input_len,
                    restarted,
                    instances,
                    ..
                },
            ) => Outcome::Ready {
                data,
                input_len,
                restarted,
                mask: Some(png),
                instances,
            },
            (Err(reason), _) => Outcome::Bad { reason },
            (_, bad) => bad,
        }
    }

    /// Adds sample `seq`'s instance masks to a ready `outcome` when the COCO file has them.
    fn instances(&mut self, seq: usize, outcome: Outcome) -> Outcome {
        let Some(coco) = self.coco.filter(|c| c.instances) else {
            return outcome;
        };
        let (data, input_len, restarted, mask) = match outcome {
            Outcome::Ready {
                data,
                input_len,
                restarted,
                mask,
                ..
            } => (data, input_len, restarted, mask),
            bad => return bad,
        };
        let info = match self.decoder.probe(&data) {
            Ok(i) => i,
            Err(e) => return Outcome::Bad { reason: e.to_string() },
        };
        match targets::instance_runs(&coco.boxes[seq], info.width, info.height) {
            Ok(runs) => Outcome::Ready {
                data,
                input_len,
                restarted,
                mask,
                instances: Some((info.width, info.height, runs)),
            },
            Err(reason) => Outcome::Bad { reason },
        }
    }

    /// Reads, checks and (as the options say) rewrites one image.
    fn read(&mut self, item: &listing::Item) -> Outcome {
        let owned;
        let data: &[u8] = match &item.origin {
            listing::Origin::File(path) => match listing::read_regular_file(path) {
                Ok(d) => {
                    owned = d;
                    &owned
                }
                Err(e) => {
                    return Outcome::Bad {
                        reason: format!("cannot read {}: {e}", path.display()),
                    };
                }
            },
            listing::Origin::Lmdb(_) | listing::Origin::Row(_) => {
                let (reader, i) = match &item.origin {
                    listing::Origin::Lmdb(i) => (self.lmdb.as_mut().expect("LMDB items come with an LMDB reader"), i),
                    listing::Origin::Row(i) => (self.rows.as_mut().expect("Parquet rows come with a reader"), i),
                    listing::Origin::File(_) => unreachable!("matched above"),
                };
                match reader.get(*i) {
                    Ok(s) => {
                        owned = s.data.to_vec();
                        &owned
                    }
                    Err(e) => return Outcome::Bad { reason: e.to_string() },
                }
            }
        };
        let input_len = data.len() as u64;
        let data = match &self.opts.reencode {
            Some(re) => {
                let mut out = Vec::new();
                if let Err(e) = self.decoder.reencode_jpeg(data, re, &mut out) {
                    return Outcome::Bad { reason: e.to_string() };
                }
                out
            }
            None => owned,
        };
        if self.opts.restarts {
            // The rewrite decodes the image and its rewrite and compares them, which is the
            // strongest check there is. When it does not apply, or the image does not decode,
            // the bytes stay as they are and the image is checked as `--check` says (which
            // under `--check header` lets a damaged file through, as it always did).
            let mut out = Vec::new();
            if let Ok(Some(_)) = self.decoder.add_restarts(&data, RESTART_TARGET_MCUS, &mut out) {
                return Outcome::Ready {
                    data: out,
                    input_len,
                    restarted: true,
                    mask: None,
                    instances: None,
                };
            }
        }
        if self.opts.reencode.is_none() {
            let checked = match self.opts.check {
                Check::Decode => self.decoder.decode_rgb8(&data, &mut self.scratch).map(|_| ()),
                Check::Header => self.decoder.probe(&data).map(|_| ()),
            };
            if let Err(e) = checked {
                return Outcome::Bad { reason: e.to_string() };
            }
        }
        Outcome::Ready {
            data,
            input_len,
            restarted: false,
            mask: None,
            instances: None,
        }
    }
}
