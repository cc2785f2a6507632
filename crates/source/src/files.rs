//! Image folders and CSV/JSONL manifests served in place: the files `ringfeed pack` would read,
//! read at each request instead.
//!
//! The listing is `pack`'s own ([`crate::listing::plan_counted`]), so samples, their order,
//! labels and class names are exactly those of the dataset `ringfeed pack` makes from the same
//! input: classes are the sub-directories sorted bytewise (torchvision's `ImageFolder` order),
//! files sorted bytewise within them, a manifest in its line order. The tree is listed once, at
//! open; files added or removed afterwards are not seen until the source is opened again.
//!
//! Invariants (besides [`Source`]'s):
//! - Sample `i`'s path is `base.join(key(i))`: a folder's keys are relative to the folder, a
//!   manifest's are its `path` column, relative to the manifest's directory (or absolute).
//! - Problems found while listing (an empty class directory, a manifest path listed twice) are
//!   kept in [`FilesSource::problems`], not acted on: whether they stop the stream is the
//!   stream's `on_error` policy, as `--on-error` is `pack`'s. A problem that makes the tree
//!   unlistable (an unreadable directory, a symlink loop) fails the open whatever the policy.
//! - A file that cannot be read when a sample is asked for (removed, unreadable, a FIFO) is a
//!   [`SourceError::File`] for that sample, and goes through `on_error` like a corrupt image.
//!
//! What this lacks and a packed dataset has (the reason to pack): JPEGs rewritten with restart
//! markers (region decodes skip the Huffman decoding outside a crop), a CRC-32C per record
//! (silent corruption is caught), and one memory map per shard instead of an `open`, `stat` and
//! `read` per sample (cheap on a local disk, the bottleneck on a network filesystem).

use std::cell::RefCell;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};

use super::{Extra, FieldKind, Sample, SampleReader, Source, SourceError};
use crate::listing::{self, InputError, InputKind, Origin, Problem};
use crate::lmdb::LmdbOptions;

/// Buffers above this size are not kept between samples, so one huge file does not pin its
/// memory in every decode thread.
const KEEP_BUFFER_BYTES: usize = 64 << 20;

/// An image folder or a manifest, listed.
pub struct FilesSource {
    kind: InputKind,
    /// The folder or the manifest, as opened.
    path: PathBuf,
    /// What keys are relative to: the folder, or the manifest's directory.
    base: PathBuf,
    /// Every key, concatenated; key `i` is `keys[ends[i-1]..ends[i]]`.
    keys: Vec<u8>,
    ends: Vec<usize>,
    labels: Vec<i64>,
    /// 1.9, a manifest opened with its columns: each row's other columns as a JSON object, all
    /// concatenated (row `i` ends at `column_ends[i]`); empty when not asked for.
    columns: Vec<u8>,
    column_ends: Vec<usize>,
    /// Whether the manifest is a CSV (its cells are text) rather than JSONL (JSON values).
    csv: bool,
    classes: Vec<Vec<u8>>,
    problems: Vec<Problem>,
    /// Files ignored because of their extension.
    ignored: u64,
}

impl fmt::Debug for FilesSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FilesSource")
            .field("kind", &self.kind)
            .field("path", &self.path)
            .field("len", &self.labels.len())
            .field("classes", &self.classes.len())
            .field("problems", &self.problems.len())
            .finish_non_exhaustive()
    }
}

impl FilesSource {
    /// Lists the image folder or manifest at `path` (`kind` is [`InputKind::Folder`] or
    /// [`InputKind::Manifest`]), adding to `listed` as it goes and stopping early when `cancel`
    /// is set.
    pub fn open(path: &Path, kind: InputKind, cancel: &AtomicBool, listed: &AtomicU64) -> Result<Self, InputError> {
        Self::open_with_columns(path, kind, false, cancel, listed)
    }

    /// [`FilesSource::open`]; with `columns`, a manifest keeps each row's other columns for the
    /// sample fields of 1.9 ([`Source::with_sample_extra`]). Without, nothing of them is kept.
    pub fn open_with_columns(
        path: &Path,
        kind: InputKind,
        columns: bool,
        cancel: &AtomicBool,
        listed: &AtomicU64,
    ) -> Result<Self, InputError> {
        assert!(
            matches!(kind, InputKind::Folder | InputKind::Manifest),
            "FilesSource serves folders and manifests, not {kind:?}"
        );
        let plan = listing::plan_counted(path, kind, &LmdbOptions::default(), cancel, listed)?;
        let base = match kind {
            InputKind::Folder => path.to_owned(),
            _ => path.parent().unwrap_or(Path::new(".")).to_owned(),
        };
        let mut keys = Vec::with_capacity(plan.items.iter().map(|i| i.key.len()).sum());
        let mut ends = Vec::with_capacity(plan.items.len());
        let mut labels = Vec::with_capacity(plan.items.len());
        for item in &plan.items {
            match &item.origin {
                Origin::File(p) => debug_assert_eq!(*p, base.join(std::ffi::OsStr::from_bytes(&item.key))),
                Origin::Lmdb(_) | Origin::Row(_) => unreachable!("folders and manifests list files"),
            }
            keys.extend_from_slice(&item.key);
            ends.push(keys.len());
            labels.push(item.label);
        }
        let columns = columns && kind == InputKind::Manifest;
        let (mut row_columns, mut column_ends) = (Vec::new(), Vec::new());
        if columns {
            row_columns.reserve(plan.items.iter().map(|i| i.meta.len()).sum());
            column_ends.reserve(plan.items.len());
            for item in &plan.items {
                row_columns.extend_from_slice(&item.meta);
                column_ends.push(row_columns.len());
            }
        }
        let csv = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv"));
        Ok(FilesSource {
            kind,
            path: path.to_owned(),
            base,
            keys,
            ends,
            labels,
            columns: row_columns,
            column_ends,
            csv,
            classes: plan.classes,
            problems: plan.problems,
            ignored: plan.ignored,
        })
    }

    /// `imagefolder` or `manifest`.
    pub fn kind(&self) -> InputKind {
        self.kind
    }

    /// What the listing set aside: empty class directories, duplicate manifest paths.
    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }

    /// Files ignored because of their extension.
    pub fn ignored(&self) -> u64 {
        self.ignored
    }

    fn key(&self, index: usize) -> &[u8] {
        let start = if index == 0 { 0 } else { self.ends[index - 1] };
        &self.keys[start..self.ends[index]]
    }

    fn file_path(&self, key: &[u8]) -> PathBuf {
        self.base.join(std::ffi::OsStr::from_bytes(key))
    }

    fn check(&self, index: u64) -> Result<usize, SourceError> {
        if index >= self.len() {
            return Err(SourceError::OutOfRange {
                index,
                len: self.len(),
                source_desc: self.describe(),
            });
        }
        Ok(index as usize)
    }

    /// Row `i`'s other columns (1.9), as a JSON object: `{}` when it has none or they were not kept.
    fn row(&self, i: usize) -> Extra<'_> {
        let json: &[u8] = match self.column_ends.get(i) {
            Some(&end) => {
                let start = if i == 0 { 0 } else { self.column_ends[i - 1] };
                &self.columns[start..end]
            }
            None => &[],
        };
        let json = if json.is_empty() { b"{}".as_slice() } else { json };
        Extra::Row { json, text: self.csv }
    }

    /// Reads sample `index` into `buf` and calls `f` with it and its row's other columns.
    fn read_into(
        &self,
        index: u64,
        buf: &mut Vec<u8>,
        f: &mut dyn FnMut(Sample<'_>, Extra<'_>),
    ) -> Result<(), SourceError> {
        let i = self.check(index)?;
        let key = self.key(i);
        let path = self.file_path(key);
        listing::read_regular_file_into(&path, buf).map_err(|source| SourceError::File { path, source })?;
        f(
            Sample {
                index,
                key,
                label: self.labels[i],
                data: buf,
            },
            self.row(i),
        );
        if buf.capacity() > KEEP_BUFFER_BYTES {
            *buf = Vec::new();
        }
        Ok(())
    }
}

thread_local! {
    /// Each decode thread's file buffer, reused from sample to sample.
    static BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Source for FilesSource {
    fn len(&self) -> u64 {
        self.labels.len() as u64
    }

    fn class_names(&self) -> Vec<Vec<u8>> {
        self.classes.clone()
    }

    fn describe(&self) -> String {
        let kind = match self.kind {
            InputKind::Folder => "image folder",
            _ => "manifest",
        };
        format!(
            "{kind} {} ({} samples, served in place)",
            self.path.display(),
            self.len()
        )
    }

    fn listing_problems(&self) -> &[Problem] {
        &self.problems
    }

    fn reader(&self) -> Result<Box<dyn SampleReader + '_>, SourceError> {
        Ok(Box::new(FilesReader {
            source: self,
            buf: Vec::new(),
        }))
    }

    fn with_sample(&self, index: u64, f: &mut dyn FnMut(Sample<'_>)) -> Result<(), SourceError> {
        self.with_sample_extra(index, &mut |s, _| f(s))
    }

    fn field_kind(&self) -> Option<FieldKind> {
        (self.kind == InputKind::Manifest).then_some(FieldKind::Columns)
    }

    fn with_sample_extra(&self, index: u64, f: &mut dyn FnMut(Sample<'_>, Extra<'_>)) -> Result<(), SourceError> {
        BUFFER.with(|b| match b.try_borrow_mut() {
            Ok(mut buf) => self.read_into(index, &mut buf, f),
            // Re-entered from inside `f` (nothing does this today): use a buffer of its own.
            Err(_) => self.read_into(index, &mut Vec::new(), f),
        })
    }
}

/// A reader with its own buffer: the sample borrows it until the next `get`.
struct FilesReader<'a> {
    source: &'a FilesSource,
    buf: Vec<u8>,
}

impl SampleReader for FilesReader<'_> {
    fn get(&mut self, index: u64) -> Result<Sample<'_>, SourceError> {
        let source = self.source;
        let i = source.check(index)?;
        let key = source.key(i);
        let path = source.file_path(key);
        listing::read_regular_file_into(&path, &mut self.buf).map_err(|source| SourceError::File { path, source })?;
        Ok(Sample {
            index,
            key,
            label: source.labels[i],
            data: &self.buf,
        })
    }
}

/// What kind of dataset a path holds, for serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServedKind {
    /// A directory with `index.rfi` (`ringfeed pack`'s output).
    Packed,
    /// A directory with `data.mdb`, or a single-file LMDB (`.mdb`, `.lmdb`).
    Lmdb,
    /// A directory of class sub-directories.
    Folder,
    /// A `.csv`, `.jsonl` or `.ndjson` file.
    Manifest,
    /// 1.3: a directory holding `*.tar` files, or one `.tar` file: WebDataset shards.
    WebDataset,
    /// 1.9: a directory holding `*.parquet` files, or one `.parquet` file; 1.10: a directory
    /// written by `datasets.Dataset.save_to_disk` (Arrow IPC files), served alike.
    Parquet,
}

impl ServedKind {
    /// Decides from what is at `path` (which exists), as `pack --input auto` does, with packed
    /// datasets first. A path that is none of them is an error naming what was looked for.
    pub fn detect(path: &Path) -> Result<Self, UnknownKind> {
        if path.is_dir() {
            if path.join(ringfeed_format::shard::INDEX_FILE).is_file() {
                return Ok(ServedKind::Packed);
            }
            return match InputKind::Auto.detect(path) {
                InputKind::Lmdb => Ok(ServedKind::Lmdb),
                _ if crate::wds::pattern::tars_in(path).is_ok_and(|t| !t.is_empty()) => Ok(ServedKind::WebDataset),
                _ if listing::parquet_in(path) => Ok(ServedKind::Parquet),
                _ if has_subdirectory(path) => Ok(ServedKind::Folder),
                _ => Err(UnknownKind::Directory { path: path.to_owned() }),
            };
        }
        match InputKind::Auto.detect(path) {
            InputKind::Lmdb => Ok(ServedKind::Lmdb),
            _ => {
                let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
                match ext.as_deref() {
                    Some("csv" | "jsonl" | "ndjson") => Ok(ServedKind::Manifest),
                    Some("tar") => Ok(ServedKind::WebDataset),
                    Some("parquet") => Ok(ServedKind::Parquet),
                    _ => Err(UnknownKind::File { path: path.to_owned() }),
                }
            }
        }
    }

    /// `pack`'s name for the input kind; `packed` for a packed dataset.
    pub fn name(self) -> &'static str {
        match self {
            ServedKind::Packed => "packed",
            ServedKind::Lmdb => InputKind::Lmdb.name(),
            ServedKind::Folder => InputKind::Folder.name(),
            ServedKind::Manifest => InputKind::Manifest.name(),
            ServedKind::WebDataset => "webdataset",
            ServedKind::Parquet => "parquet",
        }
    }
}

/// What is at a path is no dataset the server serves ([`ServedKind::detect`]); the message names
/// what was looked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnknownKind {
    /// A directory that is none of the kinds.
    #[error(
        "{} is neither a packed ringfeed dataset (it has no {}), an LMDB (no data.mdb), nor WebDataset shards (no *.tar files), nor Parquet (no *.parquet files), nor an image folder (no class sub-directories: an image folder is DIR/class_name/image.jpg); pass one of these, a manifest (.csv, .jsonl), or pack the images with `ringfeed pack SRC OUT`",
        path.display(),
        ringfeed_format::shard::INDEX_FILE
    )]
    Directory { path: PathBuf },
    /// A file that is none of the kinds.
    #[error(
        "{} is a file but neither a manifest (.csv, .jsonl, .ndjson), a WebDataset shard (.tar), a Parquet file (.parquet) nor a single-file LMDB (.mdb, .lmdb); pass a packed dataset's directory, an LMDB, an image folder or a manifest",
        path.display()
    )]
    File { path: PathBuf },
}

/// Whether `dir` has at least one sub-directory (following symlinks, as the listing does). A
/// directory that cannot be read counts as having one: the listing then names the error.
fn has_subdirectory(dir: &Path) -> bool {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries.flatten().any(|e| e.path().is_dir()),
        Err(_) => true,
    }
}
