//! Sources: random access to encoded samples, wherever they live: packed shards
//! ([`PackedSource`]), LMDBs ([`lmdb`]), image folders and manifests ([`files`]), and WebDataset
//! tars ([`wds`]), and (1.9, feature `parquet`) Parquet files (`pq`; 1.10: also `save_to_disk` directories'
//! Arrow IPC streams, `saved`), the last four read in place. [`listing`] lists folders, manifests and LMDBs
//! for both the files source and `ringfeed pack`, so both see the same samples in the same order.
//!
//! A [`Source`] is opened once and shared by every worker thread. Each thread asks it for its own
//! [`SampleReader`], which holds whatever per-thread state the backing store needs (an LMDB read
//! transaction, say). A [`Sample`] borrows its bytes straight from the store's memory map (packed
//! shards, LMDB): nothing is copied between the file and the decoder. Files served in place are
//! the exception: each is read into a per-thread buffer, one `read` per sample.
//!
//! 1.9: a sample's other values (a WebDataset sample's other members, a manifest's other
//! columns) come with it through [`Source::with_sample_extra`] as an [`Extra`], borrowed from the
//! same read as the image; [`fields`] finds and parses the ones a stream asks for. Sources without
//! such values say so ([`Source::field_kind`]), and nothing is read or kept for a stream that
//! asks for none.
//!
//! 1.10: a sample's detection and segmentation targets ([`targets`]) come from a packed
//! dataset's `targets.rft` ([`Source::stored_targets`]) or a WebDataset sample's members;
//! [`instances`] rasterises COCO `segmentation`s for both `ringfeed pack --coco` and WebDataset
//! annotations, so the two paths give the same masks.
//!
//! Invariants every implementation keeps:
//! - `len()` is fixed for the life of the source, and `get(i)` for `i < len()` returns the same
//!   key, label and bytes every time (a training order is a pure function of the index); files
//!   served in place keep this only while nobody rewrites them.
//! - `get` never panics on bad data: it returns a [`SourceError`] naming the sample and where it
//!   was looked for.

use std::fmt;

pub mod fields;
pub mod files;
pub mod instances;
pub mod listing;
pub mod lmdb;
pub mod packed;
#[cfg(feature = "parquet")]
pub mod pq;
#[cfg(feature = "parquet")]
pub mod saved;
pub mod targets;
pub mod wds;

pub use files::FilesSource;
pub use packed::PackedSource;

/// One encoded sample, borrowed from the source's mapped memory.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sample<'a> {
    /// Position of the sample in the source, `0..len()`.
    pub index: u64,
    /// The sample's original key or path, as raw bytes (UTF-8 where the origin was).
    pub key: &'a [u8],
    /// Class index or integer label; `-1` when the source has no label for the sample.
    pub label: i64,
    /// The encoded image bytes (JPEG, PNG, ...), exactly as stored.
    pub data: &'a [u8],
}

impl fmt::Debug for Sample<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sample")
            .field("index", &self.index)
            .field("key", &String::from_utf8_lossy(self.key))
            .field("label", &self.label)
            .field("data_len", &self.data.len())
            .finish()
    }
}

/// 1.9: a sample's values besides its image and label (control.md, "Sample fields (1.9)"),
/// borrowed from where the sample was read; [`fields::values`] picks the ones a stream wants.
#[derive(Debug, Clone, Copy)]
pub enum Extra<'a> {
    /// The source has none.
    None,
    /// A WebDataset sample's members (in archive order) and the bytes of its tar from byte `base`
    /// on (the whole mapping, or a ranged read of the sample's members).
    Members {
        members: &'a [wds::tar::Member],
        data: &'a [u8],
        base: u64,
    },
    /// A manifest row's other columns as a JSON object (`{}` when it has none); `text`: the
    /// values are a CSV row's cells (text), not JSON values.
    Row { json: &'a [u8], text: bool },
    /// A Parquet row's field columns (`names[i]`'s value is `cells[i]`): strings and binary as
    /// text, the rest (numbers, structs) as JSON.
    Cells {
        names: &'a [String],
        cells: &'a [fields::Value<'static>],
    },
}

/// What kind of field sources a source reads (control.md, "Sample fields (1.9)").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    /// WebDataset members: `EXT`, or `EXT:KEY` of a JSON member.
    Members,
    /// Manifest columns (CSV) or members (JSONL), by name.
    Columns,
    /// Parquet columns: `COLUMN`, or `COLUMN:KEY` of a struct column.
    Parquet,
}

/// Label used for samples that have none.
pub const NO_LABEL: i64 = -1;

/// A random-access collection of encoded samples.
pub trait Source: Send + Sync + fmt::Debug {
    /// Number of samples.
    fn len(&self) -> u64;

    /// Whether the source holds no sample at all.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Class names, indexed by label; empty when the labels are plain integers.
    fn class_names(&self) -> Vec<Vec<u8>>;

    /// A short human description for messages: the path and the kind of source.
    fn describe(&self) -> String;

    /// A reader for the calling thread. Cheap enough to make one per worker thread.
    fn reader(&self) -> Result<Box<dyn SampleReader + '_>, SourceError>;

    /// What listing the source set aside (an empty class directory, a manifest path listed
    /// twice): a stream under `on_error = raise` refuses to open while there is any, as `pack
    /// --on-error fail` does. Only sources listed from files have any.
    fn listing_problems(&self) -> &[crate::listing::Problem] {
        &[]
    }

    /// The sizes of the source's shard files, in index order (shard `s` holds the next
    /// `sizes[s]` indices), for the `shard_blocks` order (`ringfeed_order::blocks`); `None` for sources
    /// without shard files, whose order cuts the indices into ranges instead.
    fn shard_sizes(&self) -> Option<Vec<u64>> {
        None
    }

    /// Adds what identifies the served data to `id` (`ring.dataset_id`, control.md "Dataset
    /// identity"): its length, class names and shard sizes. Sources that index other things
    /// (token windows) add those after.
    fn identify(&self, id: &mut ringfeed_format::control::DatasetId) {
        id.samples(self.len(), &self.class_names(), self.shard_sizes().as_deref());
    }

    /// Whether touching a new shard is expensive (a remote source), so that `open.order =
    /// auto` picks the `shard_blocks` order. Local sources keep the global order.
    fn prefers_shard_order(&self) -> bool {
        false
    }

    /// Calls `f` with sample `index`. The default makes a reader for the call; sources whose
    /// samples need no per-thread state override it to avoid that allocation on the hot path.
    fn with_sample(&self, index: u64, f: &mut dyn FnMut(Sample<'_>)) -> Result<(), SourceError> {
        let mut reader = self.reader()?;
        f(reader.get(index)?);
        Ok(())
    }

    /// 1.9: which sample fields the source can serve (`None`: none; an `open` that asks for one
    /// is refused naming the source's kind).
    fn field_kind(&self) -> Option<FieldKind> {
        None
    }

    /// 1.9: [`Source::with_sample`], with the sample's other values beside it, from the same
    /// read. Sources without any ([`Source::field_kind`] is `None`) pass [`Extra::None`].
    fn with_sample_extra(&self, index: u64, f: &mut dyn FnMut(Sample<'_>, Extra<'_>)) -> Result<(), SourceError> {
        self.with_sample(index, &mut |s| f(s, Extra::None))
    }

    /// How many of the samples a stream will read next this source wants to be told about
    /// ([`Source::will_read`]); 0 (local sources): none.
    fn read_ahead(&self) -> usize {
        0
    }

    /// The samples a stream will read next, in order (at most [`Source::read_ahead`]): a remote
    /// source fetches what they need ahead of the reads. Called from the control plane: it
    /// must not block.
    fn will_read(&self, _upcoming: &mut dyn Iterator<Item = u64>) {}

    /// 1.10: the source's stored targets (a packed dataset's `targets.rft`), if it has them
    /// (control.md, "Detection and segmentation targets (1.10)", `"stored"`).
    fn stored_targets(&self) -> Option<&ringfeed_format::targets::TargetsFile> {
        None
    }

    /// A batch of these samples has been submitted: a guard that keeps what they need at hand
    /// until it is dropped (when the batch is done), for sources that can lose it in between (a
    /// remote source's cache). Must not block; `None` when there is nothing to keep.
    fn lease(&self, _indices: &[u64]) -> Option<Box<dyn std::any::Any + Send + Sync>> {
        None
    }
}

/// Per-thread access to a [`Source`].
pub trait SampleReader {
    /// Sample `index`, borrowed until the next call on this reader.
    fn get(&mut self, index: u64) -> Result<Sample<'_>, SourceError>;
}

/// Why a sample could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The index is past the end of the source.
    #[error("sample {index} is out of range: the source {source_desc} has {len} samples")]
    OutOfRange { index: u64, len: u64, source_desc: String },
    /// A packed-shard problem (bad magic, checksum, bounds, ...).
    #[error(transparent)]
    Shard(#[from] ringfeed_format::shard::ShardError),
    /// An LMDB problem (open, transaction, missing key, undecodable value, ...).
    #[error(transparent)]
    Lmdb(#[from] lmdb::LmdbError),
    /// A remote dataset's shard could not be fetched (`ringfeed_remote`).
    #[error("{why}")]
    Remote { dataset: String, why: String },
    /// A WebDataset sample cannot be served (no image, no label, a cut member, ...).
    #[error(transparent)]
    Wds(#[from] wds::WdsError),
    /// A Parquet row cannot be served (a null image, an undecodable row group, ...).
    #[cfg(feature = "parquet")]
    #[error(transparent)]
    Parquet(#[from] pq::ParquetError),
    /// A file of an image folder or manifest served in place could not be read.
    #[error("cannot read {}: {source}", path.display())]
    File {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}
