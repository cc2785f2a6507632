//! 1.9: Parquet files served in place (control.md, "Parquet datasets (1.9)"; docs/parquet.md).
//!
//! Rows are samples: the image column is binary, or Hugging Face's `Image()` struct `{bytes,
//! path}`; the label column an integer (null: [`NO_LABEL`]); the columns a stream's sample fields
//! read come with each row as an [`Extra::Cells`]. Each file's footer is read at open (its schema
//! checked against the columns, its row-group table kept); a row group is the unit of reading: the
//! first reader that needs one of its rows decodes the whole group (the projected columns only)
//! into a cache shared by every thread, and its rows are served from there.
//!
//! Invariants (besides [`Source`]'s):
//! - Sample order is the files' order (bytewise by name), then row order; one row group is one
//!   shard of the `shard_blocks` order, which this source prefers, so that a row group is decoded
//!   about once per epoch instead of once per row.
//! - A file that is not Parquet, or lacks a column or has it in another type, is a listing
//!   problem and is left out whole; a row that cannot be served (a null image, an image struct
//!   that names only a path, a row group that cannot be decoded) is an error for that sample,
//!   naming the file and the row.
//! - The cache holds at most [`CACHE_GROUPS`] row groups and about [`CACHE_BYTES`] of them; a
//!   group in use by a reader stays alive (it is shared) until the reader moves on.
//! - Where a group's bytes come from is a file's [`RowGroups`]: the local file, or (1.10,
//!   `ringfeed_remote::pq`) its column chunks fetched by range into the shard cache. A group
//!   whose bytes cannot be had (a failed fetch) is not kept, so the next reader tries again; a
//!   group whose bytes do not decode is kept, as its rows' error.

use std::borrow::Cow;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use parquet::basic::Type as Physical;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use parquet::file::properties::ReaderProperties;
use parquet::file::reader::{ChunkReader, RowGroupReader};
use parquet::file::serialized_reader::SerializedRowGroupReader;
use parquet::record::{Field, reader::RowIter};
use parquet::schema::types::Type;

use super::{Extra, FieldKind, NO_LABEL, Sample, SampleReader, Source, SourceError};
use crate::fields::Value;
use crate::listing::{InputError, InputKind, Item, Origin, ParquetColumns, Plan, Problem};
use crate::saved::ArrowFile;

/// Row groups the decoded-row cache holds at most.
pub const CACHE_GROUPS: usize = 64;
/// Bytes of decoded rows (images and cells) the cache holds at most, beyond the groups in use.
pub const CACHE_BYTES: usize = 1 << 30;

/// Why a Parquet dataset cannot be opened, or one of its rows served.
#[derive(Debug, thiserror::Error)]
pub enum ParquetError {
    #[error("cannot list {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{} holds no *.parquet file", path.display())]
    Empty { path: PathBuf },
    #[error("listing was cancelled: every stream that asked for it has gone")]
    Cancelled,
    /// One row cannot be served.
    #[error("{}: row {row}: {reason}", file.display())]
    Row { file: PathBuf, row: u64, reason: String },
}

/// What a stream's `open.parquet` chooses, with the columns its sample fields read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ParquetOptions {
    /// The image column (binary, or a struct with a binary member `bytes`).
    pub image: String,
    /// The integer label column; `None`: no labels.
    pub label: Option<String>,
    /// The other columns the stream's sample fields read (top-level names), in order.
    pub columns: Vec<String>,
}

impl Default for ParquetOptions {
    fn default() -> Self {
        ParquetOptions {
            image: "image".to_owned(),
            label: Some("label".to_owned()),
            columns: Vec::new(),
        }
    }
}

impl ParquetOptions {
    /// The options of an `open` (`image`, `label`: `""` for none) and the `source` strings of its
    /// sample fields (`COLUMN` or `COLUMN:KEY`); the error names the member.
    pub fn new(image: Option<&str>, label: Option<&str>, sources: &[&str]) -> Result<Self, String> {
        let image = image.unwrap_or("image");
        if image.is_empty() {
            return Err("open.parquet.image names no column (e.g. \"image\")".to_owned());
        }
        let label = match label.unwrap_or("label") {
            "" => None,
            l => Some(l.to_owned()),
        };
        let mut columns: Vec<String> = Vec::new();
        for s in sources {
            let c = s.split_once(':').map_or(*s, |(c, _)| c);
            if !c.is_empty() && !columns.iter().any(|x| x == c) {
                columns.push(c.to_owned());
            }
        }
        Ok(ParquetOptions {
            image: image.to_owned(),
            label,
            columns,
        })
    }
}

/// The `*.parquet` files of `path` (itself when it is a file), bytewise by name; (1.10) of a
/// `save_to_disk` directory, its `*.arrow` files.
pub fn files(path: &Path) -> Result<Vec<PathBuf>, ParquetError> {
    if !path.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let wanted: fn(&Path) -> bool = if crate::listing::saved_by_datasets(path) {
        crate::saved::is_arrow_name
    } else {
        is_parquet_name
    };
    let io = |source| ParquetError::Io {
        path: path.to_owned(),
        source,
    };
    let mut files = Vec::new();
    for e in std::fs::read_dir(path).map_err(io)? {
        let p = e.map_err(io)?.path();
        if wanted(&p) && p.is_file() {
            files.push(p);
        }
    }
    files.sort_by(|a, b| a.as_os_str().as_encoded_bytes().cmp(b.as_os_str().as_encoded_bytes()));
    if files.is_empty() {
        return Err(ParquetError::Empty { path: path.to_owned() });
    }
    Ok(files)
}

/// Whether a path is named `*.parquet` (any case).
pub fn is_parquet_name(p: &Path) -> bool {
    p.extension().is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
}

/// Where one file's row groups are read from: the local file, or (1.10) its column chunks
/// fetched into the shard cache (`ringfeed_remote::pq`).
pub trait RowGroups: Send + Sync {
    /// A reader of row group `g` of the file whose footer is `meta`. `Err` says why its bytes
    /// cannot be had now (a fetch that failed): the group is not kept, so a later read tries again.
    fn row_group<'a>(&'a self, meta: &'a ParquetMetaData, g: usize) -> Result<Box<dyn RowGroupReader + 'a>, String>;
}

/// A row group of `meta` read through `chunks` (which must hold the byte ranges of the column
/// chunks the projection reads).
pub fn row_group_reader<'a, R: ChunkReader + 'static>(
    chunks: Arc<R>,
    meta: &'a ParquetMetaData,
    g: usize,
) -> parquet::errors::Result<Box<dyn RowGroupReader + 'a>> {
    let props = Arc::new(ReaderProperties::builder().build());
    Ok(Box::new(SerializedRowGroupReader::new(
        chunks,
        meta.row_group(g),
        meta.page_index_for_row_group(g),
        props,
    )?))
}

/// A local file's row groups: read from the file.
struct LocalGroups(Arc<File>);

impl RowGroups for LocalGroups {
    fn row_group<'a>(&'a self, meta: &'a ParquetMetaData, g: usize) -> Result<Box<dyn RowGroupReader + 'a>, String> {
        row_group_reader(Arc::clone(&self.0), meta, g).map_err(|e| format!("cannot read row group {g}: {e}"))
    }
}

/// A file opened for [`ParquetSource::from_files`].
pub enum Opened {
    /// A Parquet file: its footer, and where its row groups' bytes come from.
    Parquet(Arc<ParquetMetaData>, Box<dyn RowGroups>),
    /// 1.10: an Arrow IPC stream of a `save_to_disk` directory, its columns checked.
    Arrow(ArrowFile),
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Opened::Parquet(meta, _) => write!(f, "Parquet({} row groups)", meta.num_row_groups()),
            Opened::Arrow(a) => write!(f, "Arrow({} batches)", a.batch_rows().count()),
        }
    }
}

/// A file to serve, as [`ParquetSource::from_files`] takes it: its name for messages and the
/// file opened, or why it cannot be served (a listing problem).
pub type FileParts = (PathBuf, Result<Opened, String>);

/// How one file's groups become rows.
enum Body {
    Parquet {
        meta: Arc<ParquetMetaData>,
        groups: Box<dyn RowGroups>,
        /// The projection on the columns read (the file's column order).
        projection: Type,
    },
    /// Its record batches are the groups.
    Arrow(ArrowFile),
}

/// One file, its footer (or its messages' headers) read.
struct PqFile {
    path: PathBuf,
    /// Its place in the list the source was made from.
    input: usize,
    body: Body,
}

impl std::fmt::Debug for PqFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PqFile").field("path", &self.path).finish()
    }
}

/// One decoded row.
#[derive(Debug)]
struct Row {
    /// `FILE:ROW` (the file's name, the row in the file), for messages.
    key: Vec<u8>,
    image: Result<Vec<u8>, String>,
    label: Result<i64, String>,
    cells: Vec<Value<'static>>,
}

/// One decoded row group: its rows, or why it cannot be decoded.
#[derive(Debug)]
struct Group {
    rows: Result<Vec<Row>, String>,
    bytes: usize,
    /// Whether its bytes could not be had ([`RowGroups::row_group`] failed): not kept.
    unfetched: bool,
}

/// A row group's place: its file, its index in the file, its first row in the file.
#[derive(Debug, Clone, Copy)]
struct GroupAt {
    file: u32,
    group: u32,
    first_row: u64,
}

/// A cache slot: decoded once by the first thread that needs it; the others wait for it.
type Slot = Arc<OnceLock<Arc<Group>>>;

/// Parquet files served in place.
#[derive(Debug)]
pub struct ParquetSource {
    name: String,
    opts: ParquetOptions,
    files: Vec<PqFile>,
    groups: Vec<GroupAt>,
    /// Each group's first sample index, and the total at the end.
    starts: Vec<u64>,
    problems: Vec<Problem>,
    /// Recently used groups, most recent last.
    cache: Mutex<Vec<(u32, Slot)>>,
}

impl ParquetSource {
    /// Reads the footers of `files` (in order) and checks their schemas against `opts`; `name`
    /// is what the client named. `listed` counts the rows found so far; `cancel` stops it.
    pub fn open(
        name: &str,
        files: &[PathBuf],
        opts: &ParquetOptions,
        cancel: &AtomicBool,
        listed: &AtomicU64,
    ) -> Result<Self, ParquetError> {
        let mut parts: Vec<FileParts> = Vec::with_capacity(files.len());
        for path in files {
            if cancel.load(Ordering::Relaxed) {
                return Err(ParquetError::Cancelled);
            }
            parts.push((path.clone(), open_file(path, opts)));
        }
        Ok(Self::from_files(name, parts, opts, listed))
    }

    /// The source of files whose footers are read (`ringfeed_remote::pq` reads them by range):
    /// each file's schema is checked against `opts`, and a file that fails, or came as `Err`, is
    /// a listing problem. `listed` counts the rows found.
    pub fn from_files(name: &str, files: Vec<FileParts>, opts: &ParquetOptions, listed: &AtomicU64) -> Self {
        let mut s = ParquetSource {
            name: name.to_owned(),
            opts: opts.clone(),
            files: Vec::new(),
            groups: Vec::new(),
            starts: vec![0],
            problems: Vec::new(),
            cache: Mutex::new(Vec::new()),
        };
        for (input, (path, got)) in files.into_iter().enumerate() {
            let checked = got.and_then(|opened| match opened {
                Opened::Parquet(meta, groups) => Ok(Body::Parquet {
                    projection: projection(&meta, opts)?,
                    meta,
                    groups,
                }),
                Opened::Arrow(f) => Ok(Body::Arrow(f)),
            });
            let body = match checked {
                Err(reason) => {
                    s.problems.push(Problem {
                        key: path.as_os_str().as_encoded_bytes().to_vec(),
                        reason,
                    });
                    continue;
                }
                Ok(f) => f,
            };
            let group_rows: Vec<u64> = match &body {
                Body::Parquet { meta, .. } => meta.row_groups().iter().map(|rg| rg.num_rows().max(0) as u64).collect(),
                Body::Arrow(f) => f.batch_rows().collect(),
            };
            let fi = s.files.len() as u32;
            let mut first_row = 0u64;
            for (g, rows) in group_rows.into_iter().enumerate() {
                if rows == 0 {
                    continue;
                }
                s.groups.push(GroupAt {
                    file: fi,
                    group: g as u32,
                    first_row,
                });
                first_row += rows;
                let end = s.starts.last().copied().unwrap_or(0) + rows;
                s.starts.push(end);
                listed.fetch_add(rows, Ordering::Relaxed);
            }
            s.files.push(PqFile { path, input, body });
        }
        s
    }

    /// Which row group sample `index` is in (an index of the groups served, which are the
    /// shards of [`Source::shard_sizes`]).
    pub fn group_of(&self, index: u64) -> Option<usize> {
        self.locate(index).ok().map(|(g, _)| g)
    }

    /// Group `g`'s place: its file's position in the list the source was made from, and its
    /// index among that file's row groups.
    pub fn group_place(&self, g: usize) -> (usize, usize) {
        let at = self.groups[g];
        (self.files[at.file as usize].input, at.group as usize)
    }

    /// Files served (those left out are listing problems).
    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    /// Row groups served.
    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// Sample `index`'s key, `FILE:ROW` (the file's name, the row in the file), without reading it.
    pub fn key(&self, index: u64) -> Option<Vec<u8>> {
        let (g, r) = self.locate(index).ok()?;
        let at = self.groups[g];
        let path = &self.files[at.file as usize].path;
        let name = path.file_name().unwrap_or(path.as_os_str()).to_string_lossy();
        Some(format!("{name}:{}", at.first_row + r as u64).into_bytes())
    }

    /// Where sample `index` is: its group and its row in that group.
    fn locate(&self, index: u64) -> Result<(usize, usize), SourceError> {
        if index >= self.len() {
            return Err(SourceError::OutOfRange {
                index,
                len: self.len(),
                source_desc: self.describe(),
            });
        }
        let g = self.starts.partition_point(|&s| s <= index) - 1;
        Ok((g, (index - self.starts[g]) as usize))
    }

    /// Group `g`, decoded (by this thread, or by another one that got there first).
    fn group(&self, g: usize) -> Arc<Group> {
        let slot = {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            match cache.iter().position(|(k, _)| *k as usize == g) {
                Some(i) => {
                    let hit = cache.remove(i);
                    let slot = Arc::clone(&hit.1);
                    cache.push(hit);
                    slot
                }
                None => {
                    // Evict the least recently used groups beyond the bounds (the slots being
                    // decoded count nothing yet; a reader holding a group keeps it alive).
                    let mut bytes: usize = cache.iter().filter_map(|(_, s)| s.get()).map(|g| g.bytes).sum();
                    while !cache.is_empty() && (cache.len() >= CACHE_GROUPS || bytes > CACHE_BYTES) {
                        let (_, old) = cache.remove(0);
                        bytes -= old.get().map_or(0, |g| g.bytes);
                    }
                    let slot: Slot = Arc::new(OnceLock::new());
                    cache.push((g as u32, Arc::clone(&slot)));
                    slot
                }
            }
        };
        let group = Arc::clone(slot.get_or_init(|| Arc::new(self.decode(g))));
        if group.unfetched {
            // Not kept: the next reader fetches again (the shard cache keeps a failure a few
            // seconds, so a gone object is not asked for once per row).
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            cache.retain(|(_, s)| !Arc::ptr_eq(s, &slot));
        }
        group
    }

    /// Decodes group `g`'s projected columns, row by row.
    fn decode(&self, g: usize) -> Group {
        let at = self.groups[g];
        let f = &self.files[at.file as usize];
        let records = match &f.body {
            Body::Parquet {
                meta,
                groups,
                projection,
            } => {
                let rg = match groups.row_group(meta, at.group as usize) {
                    Ok(rg) => rg,
                    Err(why) => {
                        return Group {
                            rows: Err(why),
                            bytes: 0,
                            unfetched: true,
                        };
                    }
                };
                RowIter::from_row_group(Some(projection.clone()), rg.as_ref())
                    .map_err(|e| format!("cannot read row group {}: {e}", at.group))
                    .and_then(|iter| {
                        iter.map(|row| row.map_err(|e| format!("cannot decode row group {}: {e}", at.group)))
                            .collect::<Result<Vec<_>, String>>()
                    })
            }
            Body::Arrow(file) => file.rows(at.group as usize),
        };
        let rows = records.map(|records| {
            records
                .into_iter()
                .enumerate()
                .map(|(i, row)| {
                    let key = self.key(self.starts[g] + i as u64).unwrap_or_default();
                    self.row(key, row)
                })
                .collect::<Vec<Row>>()
        });
        let bytes = match &rows {
            Ok(rows) => rows
                .iter()
                .map(|r| {
                    r.image.as_ref().map_or(0, Vec::len)
                        + r.cells
                            .iter()
                            .map(|c| match c {
                                Value::Text(t) => t.len(),
                                Value::Json(_) => 16,
                            })
                            .sum::<usize>()
                        + 64
                })
                .sum(),
            Err(_) => 0,
        };
        Group {
            rows,
            bytes,
            unfetched: false,
        }
    }

    /// One decoded row's image, label and cells.
    fn row(&self, key: Vec<u8>, row: parquet::record::Row) -> Row {
        let mut image = Err("the row has no image column".to_owned());
        let mut label = Ok(NO_LABEL);
        let mut cells = vec![Value::Json(serde_json::Value::Null); self.opts.columns.len()];
        for (name, field) in row.into_columns() {
            if name == self.opts.image {
                image = image_bytes(field, &name);
            } else if self.opts.label.as_deref() == Some(name.as_str()) {
                label = label_of(&field, &name);
            }
            // A column may be the label and a field too.
            else if let Some(i) = self.opts.columns.iter().position(|c| *c == name) {
                cells[i] = cell(field);
            }
        }
        if let Some(l) = self.opts.label.as_deref()
            && let Some(i) = self.opts.columns.iter().position(|c| c == l)
        {
            cells[i] = match &label {
                Ok(v) if *v != NO_LABEL => Value::Json((*v).into()),
                _ => Value::Json(serde_json::Value::Null),
            };
        }
        Row {
            key,
            image,
            label,
            cells,
        }
    }

    fn row_error(&self, g: usize, row: usize, reason: String) -> SourceError {
        let at = self.groups[g];
        ParquetError::Row {
            file: self.files[at.file as usize].path.clone(),
            row: at.first_row + row as u64,
            reason,
        }
        .into()
    }

    /// Calls `f` with sample `index` of `group`, its row `r`.
    fn serve(
        &self,
        index: u64,
        g: usize,
        r: usize,
        group: &Group,
        f: &mut dyn FnMut(Sample<'_>, Extra<'_>),
    ) -> Result<(), SourceError> {
        let rows = group.rows.as_ref().map_err(|e| self.row_error(g, r, e.clone()))?;
        let row = rows.get(r).ok_or_else(|| {
            self.row_error(
                g,
                r,
                format!("the row group holds {} rows, fewer than its footer says", rows.len()),
            )
        })?;
        let data = row.image.as_ref().map_err(|e| self.row_error(g, r, e.clone()))?;
        let label = *row.label.as_ref().map_err(|e| self.row_error(g, r, e.clone()))?;
        f(
            Sample {
                index,
                key: &row.key,
                label,
                data,
            },
            Extra::Cells {
                names: &self.opts.columns,
                cells: &row.cells,
            },
        );
        Ok(())
    }
}

/// Opens `path` and reads its footer (an `.arrow` file: its messages' headers, its columns
/// checked against `opts`); the error names the file's problem.
fn open_file(path: &Path, opts: &ParquetOptions) -> Result<Opened, String> {
    if crate::saved::is_arrow_name(path) {
        return ArrowFile::open(path, &opts.image, opts.label.as_deref(), &opts.columns).map(Opened::Arrow);
    }
    let file = File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let meta = ParquetMetaDataReader::new()
        .parse_and_finish(&file)
        .map_err(|e| format!("not a readable Parquet file: {e}"))?;
    Ok(Opened::Parquet(Arc::new(meta), Box::new(LocalGroups(Arc::new(file)))))
}

/// Checks a file's columns against `opts` (the error names the column and the option) and
/// returns the projection on the columns read.
pub fn projection(meta: &ParquetMetaData, opts: &ParquetOptions) -> Result<Type, String> {
    let root = meta.file_metadata().schema_descr().root_schema().clone();
    let have = || {
        root.get_fields()
            .iter()
            .map(|f| f.name().to_owned())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let column = |name: &str, what: &str| -> Result<&Arc<Type>, String> {
        root.get_fields()
            .iter()
            .find(|f| f.name() == name)
            .ok_or_else(|| format!("no column {name:?} ({what}); its columns: {}", have()))
    };
    let image = column(&opts.image, "open.parquet.image")?;
    let binary = |t: &Type| t.is_primitive() && t.get_physical_type() == Physical::BYTE_ARRAY;
    let image_ok =
        binary(image) || (image.is_group() && image.get_fields().iter().any(|m| m.name() == "bytes" && binary(m)));
    if !image_ok {
        return Err(format!(
            "column {:?} (open.parquet.image) is {}, not binary nor a struct with a binary member `bytes`",
            opts.image,
            describe_type(image)
        ));
    }
    if let Some(l) = &opts.label {
        let t = column(l, "open.parquet.label")?;
        if !(t.is_primitive() && matches!(t.get_physical_type(), Physical::INT32 | Physical::INT64)) {
            return Err(format!(
                "column {l:?} (open.parquet.label) is {}, not an integer; pass label=\"\" for no labels",
                describe_type(t)
            ));
        }
    }
    for c in &opts.columns {
        column(c, "a sample field's source")?;
    }
    let mut projected = root.get_fields().to_vec();
    projected.retain(|f| {
        f.name() == opts.image || opts.label.as_deref() == Some(f.name()) || opts.columns.iter().any(|c| c == f.name())
    });
    Type::group_type_builder(root.name())
        .with_fields(projected)
        .build()
        .map_err(|e| format!("projecting the columns: {e}"))
}

/// The leaf columns (their indices in a row group) that `projection` reads: those under its
/// top-level fields.
pub fn projected_leaves(meta: &ParquetMetaData, projection: &Type) -> Vec<usize> {
    let names: Vec<&str> = projection.get_fields().iter().map(|f| f.name()).collect();
    let schema = meta.file_metadata().schema_descr();
    (0..schema.num_columns())
        .filter(|&i| {
            schema
                .column(i)
                .path()
                .parts()
                .first()
                .is_some_and(|p| names.contains(&p.as_str()))
        })
        .collect()
}

/// A column's type, for messages.
fn describe_type(t: &Type) -> String {
    if t.is_primitive() {
        format!("{:?}", t.get_physical_type())
    } else {
        let members: Vec<&str> = t.get_fields().iter().map(|f| f.name()).collect();
        format!("a group of ({})", members.join(", "))
    }
}

/// The encoded image of a row's image cell.
fn image_bytes(field: Field, column: &str) -> Result<Vec<u8>, String> {
    match field {
        Field::Bytes(b) => Ok(b.data().to_vec()),
        Field::Null => Err(format!("the image (column {column:?}) is null")),
        Field::Group(row) => {
            let mut path = None;
            for (name, f) in row.into_columns() {
                match (name.as_str(), f) {
                    ("bytes", Field::Bytes(b)) => return Ok(b.data().to_vec()),
                    ("path", Field::Str(p)) => path = Some(p),
                    _ => {}
                }
            }
            Err(match path {
                Some(p) => format!(
                    "the image (column {column:?}) has no bytes, only the path {p:?}: the server does not follow paths; store the bytes (datasets' Image() feature embeds them with embed_external_files)"
                ),
                None => format!("the image (column {column:?}) has neither bytes nor a path"),
            })
        }
        other => Err(format!("the image (column {column:?}) is not binary: {other}")),
    }
}

/// A row's label.
fn label_of(field: &Field, column: &str) -> Result<i64, String> {
    Ok(match *field {
        Field::Null => NO_LABEL,
        Field::Byte(v) => v.into(),
        Field::Short(v) => v.into(),
        Field::Int(v) => v.into(),
        Field::Long(v) => v,
        Field::UByte(v) => v.into(),
        Field::UShort(v) => v.into(),
        Field::UInt(v) => v.into(),
        Field::ULong(v) => {
            i64::try_from(v).map_err(|_| format!("the label (column {column:?}) {v} is out of range"))?
        }
        ref other => return Err(format!("the label (column {column:?}) is not an integer: {other}")),
    })
}

/// A field column's cell: strings and binary as text, the rest as JSON.
fn cell(field: Field) -> Value<'static> {
    match field {
        Field::Str(s) => Value::Text(Cow::Owned(s.into_bytes())),
        Field::Bytes(b) => Value::Text(Cow::Owned(b.data().to_vec())),
        other => Value::Json(json(other)),
    }
}

/// A cell as JSON (a struct as an object, a list as an array; binary as lossy UTF-8).
fn json(field: Field) -> serde_json::Value {
    use serde_json::Value as J;
    match field {
        Field::Null => J::Null,
        Field::Bool(b) => J::Bool(b),
        Field::Byte(v) => v.into(),
        Field::Short(v) => v.into(),
        Field::Int(v) => v.into(),
        Field::Long(v) => v.into(),
        Field::UByte(v) => v.into(),
        Field::UShort(v) => v.into(),
        Field::UInt(v) => v.into(),
        Field::ULong(v) => v.into(),
        Field::Float(v) => serde_json::Number::from_f64(v.into()).map_or(J::Null, J::Number),
        Field::Double(v) => serde_json::Number::from_f64(v).map_or(J::Null, J::Number),
        Field::Str(s) => J::String(s),
        Field::Bytes(b) => J::String(String::from_utf8_lossy(b.data()).into_owned()),
        Field::Group(row) => J::Object(row.into_columns().into_iter().map(|(k, v)| (k, json(v))).collect()),
        Field::ListInternal(l) => J::Array(l.elements().iter().cloned().map(json).collect()),
        Field::Date(v) | Field::TimeMillis(v) => v.into(),
        Field::TimestampMillis(v) | Field::TimestampMicros(v) | Field::TimeMicros(v) => v.into(),
        other => J::String(other.to_string()),
    }
}

impl Source for ParquetSource {
    fn len(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    fn class_names(&self) -> Vec<Vec<u8>> {
        Vec::new()
    }

    fn describe(&self) -> String {
        format!("{} (Parquet)", self.name)
    }

    fn reader(&self) -> Result<Box<dyn SampleReader + '_>, SourceError> {
        Ok(Box::new(ParquetReader {
            source: self,
            current: None,
        }))
    }

    fn listing_problems(&self) -> &[Problem] {
        &self.problems
    }

    fn shard_sizes(&self) -> Option<Vec<u64>> {
        Some(self.starts.windows(2).map(|w| w[1] - w[0]).collect())
    }

    fn prefers_shard_order(&self) -> bool {
        true
    }

    fn with_sample(&self, index: u64, f: &mut dyn FnMut(Sample<'_>)) -> Result<(), SourceError> {
        self.with_sample_extra(index, &mut |s, _| f(s))
    }

    fn field_kind(&self) -> Option<FieldKind> {
        Some(FieldKind::Parquet)
    }

    fn with_sample_extra(&self, index: u64, f: &mut dyn FnMut(Sample<'_>, Extra<'_>)) -> Result<(), SourceError> {
        let (g, r) = self.locate(index)?;
        let group = self.group(g);
        self.serve(index, g, r, &group, f)
    }
}

/// A thread's reader: it keeps the group it read last.
struct ParquetReader<'s> {
    source: &'s ParquetSource,
    current: Option<(usize, Arc<Group>)>,
}

impl SampleReader for ParquetReader<'_> {
    fn get(&mut self, index: u64) -> Result<Sample<'_>, SourceError> {
        let s = self.source;
        let (g, r) = s.locate(index)?;
        if self.current.as_ref().is_none_or(|(k, _)| *k != g) {
            self.current = Some((g, s.group(g)));
        }
        let group = &self.current.as_ref().expect("set above").1;
        let mut label = NO_LABEL;
        s.serve(index, g, r, group, &mut |sample, _| label = sample.label)?;
        let rows = group.rows.as_ref().expect("served above");
        let data = rows[r].image.as_deref().expect("served above");
        Ok(Sample {
            index,
            key: &rows[r].key,
            label,
            data,
        })
    }
}

/// 1.9: the rows of the Parquet file or directory `src`, read with `columns` (the row groups are
/// read once here for the labels, as an LMDB's values are): a file that cannot be served whole is
/// a problem, a row that cannot (a null image) another, as an unreadable file is.
pub fn plan(src: &Path, columns: &ParquetColumns, cancel: &AtomicBool, listed: &AtomicU64) -> Result<Plan, InputError> {
    let invalid = |detail: String| InputError::Invalid {
        path: src.to_owned(),
        detail,
    };
    let opts = ParquetOptions::new(columns.image.as_deref(), columns.label.as_deref(), &[]).map_err(invalid)?;
    let name = src.display().to_string();
    let files = files(src).map_err(|e| invalid(e.to_string()))?;
    let source = ParquetSource::open(&name, &files, &opts, cancel, listed).map_err(|e| match e {
        ParquetError::Cancelled => InputError::Interrupted,
        e => invalid(e.to_string()),
    })?;
    let mut problems: Vec<Problem> = source.listing_problems().to_vec();
    let mut items = Vec::with_capacity(source.len() as usize);
    for i in 0..source.len() {
        if i % 4096 == 0 && cancel.load(Ordering::Relaxed) {
            return Err(InputError::Interrupted);
        }
        let mut item = None;
        let read = source.with_sample(i, &mut |s| {
            item = Some(Item {
                key: s.key.to_vec(),
                label: s.label,
                meta: Vec::new(),
                origin: Origin::Row(i),
            });
        });
        match (read, item) {
            (Ok(()), Some(item)) => items.push(item),
            (Err(e), _) => problems.push(Problem {
                key: source.key(i).unwrap_or_else(|| format!("#{i}").into_bytes()),
                reason: e.to_string(),
            }),
            (Ok(()), None) => unreachable!("with_sample calls back on success"),
        }
    }
    Ok(Plan {
        kind: InputKind::Parquet,
        items,
        classes: Vec::new(),
        problems,
        ignored: 0,
        lmdb: None,
        rows: Some(Box::new(source)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields::{FieldFrom, values};
    use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;

    /// One row: its image (`None`: null), label (`None`: null) and caption.
    type TestRow<'a> = (Option<&'a [u8]>, Option<i64>, &'a str);

    /// Writes `groups` (each a row group) with an optional binary `image`, an optional int64
    /// `label` and a string `caption`.
    fn write(path: &Path, groups: &[Vec<TestRow<'_>>]) {
        let schema = Arc::new(
            parse_message_type(
                "message m { optional binary image; optional int64 label; required binary caption (UTF8); }",
            )
            .unwrap(),
        );
        let props = Arc::new(WriterProperties::builder().build());
        let mut w = SerializedFileWriter::new(File::create(path).unwrap(), schema, props).unwrap();
        for rows in groups {
            let mut rg = w.next_row_group().unwrap();
            let mut c = rg.next_column().unwrap().unwrap();
            let defs: Vec<i16> = rows.iter().map(|r| i16::from(r.0.is_some())).collect();
            let images: Vec<ByteArray> = rows.iter().filter_map(|r| r.0).map(|b| b.to_vec().into()).collect();
            c.typed::<ByteArrayType>()
                .write_batch(&images, Some(&defs), None)
                .unwrap();
            c.close().unwrap();
            let mut c = rg.next_column().unwrap().unwrap();
            let defs: Vec<i16> = rows.iter().map(|r| i16::from(r.1.is_some())).collect();
            let labels: Vec<i64> = rows.iter().filter_map(|r| r.1).collect();
            c.typed::<Int64Type>().write_batch(&labels, Some(&defs), None).unwrap();
            c.close().unwrap();
            let mut c = rg.next_column().unwrap().unwrap();
            let caps: Vec<ByteArray> = rows.iter().map(|r| r.2.as_bytes().to_vec().into()).collect();
            c.typed::<ByteArrayType>().write_batch(&caps, None, None).unwrap();
            c.close().unwrap();
            rg.close().unwrap();
        }
        w.close().unwrap();
    }

    /// Sample `i`'s `caption` column, as text.
    fn caption_of(s: &ParquetSource, i: u64) -> Vec<u8> {
        let mut caption = Vec::new();
        s.with_sample_extra(i, &mut |_, extra| {
            let v = values(&extra, &[FieldFrom::Column("caption".into())]);
            let Ok(Value::Text(t)) = &v[0] else { panic!("{v:?}") };
            caption = t.to_vec();
        })
        .unwrap();
        caption
    }

    fn open(files: &[PathBuf], opts: &ParquetOptions) -> ParquetSource {
        ParquetSource::open("test", files, opts, &AtomicBool::new(false), &AtomicU64::new(0)).unwrap()
    }

    #[test]
    fn rows_are_samples_in_file_then_row_order_and_groups_are_shards() {
        let d = tempfile::tempdir().unwrap();
        write(
            &d.path().join("b.parquet"),
            &[vec![(Some(b"img3"), Some(3), "c3")], vec![(Some(b"img4"), None, "c4")]],
        );
        write(
            &d.path().join("a.parquet"),
            &[vec![
                (Some(b"img0"), Some(0), "c0"),
                (Some(b"img1"), Some(1), "c1"),
                (None, Some(2), "c2"),
            ]],
        );
        std::fs::write(d.path().join("notes.txt"), "not a parquet file").unwrap();
        let files = files(d.path()).unwrap();
        assert_eq!(files.len(), 2, "only *.parquet, sorted");
        assert!(files[0].ends_with("a.parquet"));
        let opts = ParquetOptions::new(None, None, &["caption"]).unwrap();
        let s = open(&files, &opts);
        assert_eq!((s.len(), s.group_count()), (5, 3));
        assert_eq!(s.shard_sizes(), Some(vec![3, 1, 1]));
        assert!(s.prefers_shard_order());
        let mut r = s.reader().unwrap();
        let got = r.get(1).unwrap();
        assert_eq!((got.data, got.label, got.key), (&b"img1"[..], 1, &b"a.parquet:1"[..]));
        // A null label is -1; the row's place in its file is its key.
        let got = r.get(4).unwrap();
        assert_eq!(
            (got.data, got.label, got.key),
            (&b"img4"[..], NO_LABEL, &b"b.parquet:1"[..])
        );
        // A null image is an error for that row only, naming the file and the row.
        let e = r.get(2).unwrap_err().to_string();
        assert!(
            e.contains("a.parquet: row 2: the image (column \"image\") is null"),
            "{e}"
        );
        assert_eq!(r.get(3).unwrap().data, b"img3");
        assert!(matches!(r.get(5), Err(SourceError::OutOfRange { .. })));
        // The caption comes with its row, as text.
        assert_eq!(caption_of(&s, 3), b"c3");
    }

    #[test]
    fn a_row_group_is_decoded_once_for_all_its_rows() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.parquet");
        write(
            &p,
            &[vec![
                (Some(b"a"), Some(0), ""),
                (Some(b"b"), Some(1), ""),
                (Some(b"c"), Some(2), ""),
            ]],
        );
        let s = open(&[p], &ParquetOptions::default());
        let first = s.group(0);
        for i in 0..3 {
            s.with_sample(i, &mut |_| {}).unwrap();
        }
        assert!(
            Arc::ptr_eq(&first, &s.group(0)),
            "the cached group is served, not decoded again"
        );
    }

    #[test]
    fn bad_files_and_columns_are_listing_problems_naming_them() {
        let d = tempfile::tempdir().unwrap();
        let good = d.path().join("a.parquet");
        write(&good, &[vec![(Some(b"a"), Some(0), "x")]]);
        let junk = d.path().join("b.parquet");
        std::fs::write(&junk, b"PAR1 but not really").unwrap();
        let files = [good.clone(), junk];
        let s = open(&files, &ParquetOptions::default());
        assert_eq!(s.len(), 1, "the bad file is left out");
        assert_eq!(s.listing_problems().len(), 1);
        assert!(s.listing_problems()[0].key.ends_with(b"b.parquet"));
        assert!(s.listing_problems()[0].reason.contains("not a readable Parquet file"));
        let wrong = ParquetOptions::new(Some("jpg"), None, &[]).unwrap();
        let s = open(std::slice::from_ref(&good), &wrong);
        assert_eq!(s.len(), 0);
        let why = &s.listing_problems()[0].reason;
        assert!(
            why.contains("no column \"jpg\" (open.parquet.image); its columns: image, label, caption"),
            "{why}"
        );
        let wrong = ParquetOptions::new(None, Some("caption"), &[]).unwrap();
        let why = open(std::slice::from_ref(&good), &wrong).listing_problems()[0]
            .reason
            .clone();
        assert!(
            why.contains("column \"caption\" (open.parquet.label) is BYTE_ARRAY, not an integer"),
            "{why}"
        );
        let wrong = ParquetOptions::new(None, None, &["meta:width"]).unwrap();
        let why = open(&[good], &wrong).listing_problems()[0].reason.clone();
        assert!(why.contains("no column \"meta\" (a sample field's source)"), "{why}");
    }

    #[test]
    fn options_name_the_member_and_collect_the_field_columns() {
        assert!(
            ParquetOptions::new(Some(""), None, &[])
                .unwrap_err()
                .contains("open.parquet.image")
        );
        let o = ParquetOptions::new(None, Some(""), &["caption", "meta:w", "meta:h", "caption"]).unwrap();
        assert_eq!(o.label, None);
        assert_eq!(o.columns, vec!["caption".to_owned(), "meta".to_owned()]);
    }

    #[test]
    fn struct_images_read_their_bytes_and_refuse_a_path() {
        let row = |bytes: Field, path: Field| {
            Field::Group(parquet::record::Row::new(vec![
                ("bytes".to_owned(), bytes),
                ("path".to_owned(), path),
            ]))
        };
        let b = Field::Bytes(ByteArray::from(b"jpeg".to_vec()));
        assert_eq!(image_bytes(row(b, Field::Null), "image").unwrap(), b"jpeg");
        let e = image_bytes(row(Field::Null, Field::Str("x/1.jpg".into())), "image").unwrap_err();
        assert!(
            e.contains("only the path \"x/1.jpg\": the server does not follow paths"),
            "{e}"
        );
        assert!(image_bytes(Field::Int(3), "image").unwrap_err().contains("not binary"));
        assert_eq!(label_of(&Field::UShort(7), "l"), Ok(7));
        assert!(
            label_of(&Field::ULong(u64::MAX), "l")
                .unwrap_err()
                .contains("out of range")
        );
        assert!(
            label_of(&Field::Str("3".into()), "l")
                .unwrap_err()
                .contains("not an integer")
        );
    }

    // 1.10: `save_to_disk` streams (`crate::saved`), served by this source.
    use arrow_array::{ArrayRef, BinaryArray, Int32Array, RecordBatch, StringArray, StructArray};
    use arrow_schema::{DataType, Field as ArrowField, Schema};

    /// A stream of two batches (3 rows, then 2) with an HF image struct, an int32 label and a
    /// caption; row 3's image is null.
    fn write_arrow(path: &Path) {
        let image_fields = vec![
            ArrowField::new("bytes", DataType::Binary, true),
            ArrowField::new("path", DataType::Utf8, true),
        ];
        let schema = Arc::new(Schema::new(vec![
            ArrowField::new("image", DataType::Struct(image_fields.clone().into()), true),
            ArrowField::new("label", DataType::Int32, true),
            ArrowField::new("caption", DataType::Utf8, false),
        ]));
        let batch = |rows: std::ops::Range<usize>| {
            let bytes: BinaryArray = rows
                .clone()
                .map(|i| (i != 3).then(|| format!("img{i}").into_bytes()))
                .collect();
            let paths: StringArray = rows.clone().map(|_| None::<&str>).collect();
            let image = StructArray::new(
                image_fields.clone().into(),
                vec![Arc::new(bytes) as ArrayRef, Arc::new(paths)],
                None,
            );
            let labels: Int32Array = rows.clone().map(|i| i as i32).collect();
            let caps: StringArray = rows.map(|i| Some(format!("c{i}"))).collect();
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(image), Arc::new(labels), Arc::new(caps)],
            )
            .unwrap()
        };
        let mut w = arrow_ipc::writer::StreamWriter::try_new(File::create(path).unwrap(), &schema).unwrap();
        w.write(&batch(0..3)).unwrap();
        w.write(&batch(3..5)).unwrap();
        w.finish().unwrap();
    }

    #[test]
    fn save_to_disk_record_batches_are_groups_and_rows_are_samples() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("state.json"), "{}").unwrap();
        write_arrow(&d.path().join("data-00000-of-00001.arrow"));
        assert!(crate::listing::saved_by_datasets(d.path()));
        let files = files(d.path()).unwrap();
        assert_eq!(files.len(), 1);
        let opts = ParquetOptions::new(None, None, &["caption"]).unwrap();
        let s = ParquetSource::open("t", &files, &opts, &AtomicBool::new(false), &AtomicU64::new(0)).unwrap();
        assert_eq!((s.len(), s.shard_sizes()), (5, Some(vec![3, 2])));
        let mut r = s.reader().unwrap();
        let got = r.get(4).unwrap();
        assert_eq!(
            (got.data, got.label, got.key),
            (&b"img4"[..], 4, &b"data-00000-of-00001.arrow:4"[..])
        );
        let e = r.get(3).unwrap_err().to_string();
        assert!(e.contains("data-00000-of-00001.arrow: row 3: the image"), "{e}");
        assert_eq!(caption_of(&s, 1), b"c1");
        // A column that is not there is the file's problem, named as for Parquet.
        let wrong = ParquetOptions::new(Some("jpg"), None, &[]).unwrap();
        let s = ParquetSource::open("t", &files, &wrong, &AtomicBool::new(false), &AtomicU64::new(0)).unwrap();
        let why = &s.listing_problems()[0].reason;
        assert!(
            why.contains("no column \"jpg\" (open.parquet.image); its columns: image, label, caption"),
            "{why}"
        );
        // Not a stream at all.
        let junk = d.path().join("junk.arrow");
        std::fs::write(&junk, b"not arrow").unwrap();
        let e = ArrowFile::open(&junk, "image", None, &[]).unwrap_err();
        assert!(e.contains("not a readable Arrow IPC stream"), "{e}");
    }
}
