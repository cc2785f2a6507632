//! What `pack` reads: an image folder, a manifest, or an LMDB, enumerated into an ordered plan.
//!
//! Enumeration is deterministic: folders and files are sorted bytewise (torchvision's
//! `ImageFolder` order, since Python sorts `str` by code point, which is UTF-8 byte order),
//! manifests keep their line order, LMDB keeps its key order. The plan's order is the dataset's
//! sample order.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::lmdb::{LmdbOptions, LmdbSource};
use crate::{NO_LABEL, Source};

/// Extensions an image folder's files must have (torchvision's `IMG_EXTENSIONS`, plus `.gif`),
/// compared case-insensitively. Other files are ignored and counted.
pub const IMAGE_EXTENSIONS: &[&str] = &[
    "jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "bmp", "tif", "tiff", "webp", "gif",
];

/// Which kind of input `SRC` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum InputKind {
    /// Decide from the path: an LMDB (a directory with `data.mdb`, or an `.mdb`/`.lmdb` file),
    /// a manifest (`.csv`, `.jsonl`, `.ndjson`), or else an image folder.
    Auto,
    /// `SRC/class_name/**/*.jpg|png|...`, classes sorted bytewise.
    Folder,
    /// CSV with a header, or JSONL: a `path` column (relative to the manifest's directory) and
    /// an optional `label` column (integers, or class names); other columns become metadata.
    Manifest,
    /// An LMDB environment read in place.
    Lmdb,
    /// 1.9: a `.parquet` file or a directory of them (docs/parquet.md): rows with an image
    /// column (binary, or Hugging Face's `{bytes, path}` struct) and an integer label column.
    Parquet,
}

impl InputKind {
    /// Resolves `Auto` by looking at `src`.
    pub fn detect(self, src: &Path) -> InputKind {
        if self != InputKind::Auto {
            return self;
        }
        let ext = src.extension().and_then(OsStr::to_str).map(str::to_ascii_lowercase);
        if src.is_dir() {
            if src.join("data.mdb").is_file() {
                InputKind::Lmdb
            } else if parquet_in(src) {
                InputKind::Parquet
            } else {
                InputKind::Folder
            }
        } else {
            match ext.as_deref() {
                Some("mdb" | "lmdb") => InputKind::Lmdb,
                Some("parquet") => InputKind::Parquet,
                _ => InputKind::Manifest,
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            InputKind::Auto => "auto",
            InputKind::Folder => "imagefolder",
            InputKind::Manifest => "manifest",
            InputKind::Lmdb => "lmdb",
            InputKind::Parquet => "parquet",
        }
    }
}

/// Whether a directory holds a `*.parquet` file (any case), or (1.10) is a `save_to_disk`
/// directory, which is read as Parquet is.
pub fn parquet_in(dir: &Path) -> bool {
    saved_by_datasets(dir)
        || std::fs::read_dir(dir).is_ok_and(|es| {
            es.flatten().any(|e| {
                let p = e.path();
                p.extension().is_some_and(|x| x.eq_ignore_ascii_case("parquet")) && p.is_file()
            })
        })
}

/// Whether a directory is a `datasets.Dataset.save_to_disk` output: `state.json` beside
/// `*.arrow` files (1.10: read as Parquet is, `crate::saved`).
pub fn saved_by_datasets(dir: &Path) -> bool {
    dir.join("state.json").is_file()
        && std::fs::read_dir(dir).is_ok_and(|es| {
            es.flatten()
                .any(|e| e.path().extension().is_some_and(|x| x.eq_ignore_ascii_case("arrow")))
        })
}

/// Where one planned sample's bytes come from.
#[derive(Debug, Clone)]
pub enum Origin {
    File(PathBuf),
    /// Sample index in the LMDB source.
    Lmdb(u64),
    /// 1.9: sample index (row) in the Parquet source ([`Plan::rows`]).
    Row(u64),
}

/// One sample to pack.
#[derive(Debug, Clone)]
pub struct Item {
    /// The key stored in the index: the path relative to the folder, the manifest's path as
    /// written, or the LMDB key.
    pub key: Vec<u8>,
    pub label: i64,
    /// Empty, or a JSON object of extra manifest columns.
    pub meta: Vec<u8>,
    pub origin: Origin,
}

/// A problem found while enumerating, before any image is read. Under `--on-error skip` these
/// become lines of the report; under `fail` the first one stops the pack.
#[derive(Debug, Clone)]
pub struct Problem {
    pub key: Vec<u8>,
    pub reason: String,
}

/// The ordered list of samples, their classes, and what was set aside while listing them.
#[derive(Debug)]
pub struct Plan {
    pub kind: InputKind,
    pub items: Vec<Item>,
    pub classes: Vec<Vec<u8>>,
    pub problems: Vec<Problem>,
    /// Files present but ignored because of their extension (folder inputs).
    pub ignored: u64,
    /// For LMDB inputs, the open source the items refer to.
    pub lmdb: Option<LmdbSource>,
    /// 1.9: for Parquet inputs, the open source the items' rows are read from.
    pub rows: Option<Box<dyn crate::Source>>,
}

/// 1.9: the columns a Parquet input is read with (`open.parquet`'s `image` and `label`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParquetColumns {
    /// The image column (default `image`).
    pub image: Option<String>,
    /// The integer label column (default `label`); `""`: no labels.
    pub label: Option<String>,
}

/// Why the input could not be listed at all.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: {detail}", path.display())]
    Invalid { path: PathBuf, detail: String },
    #[error(transparent)]
    Lmdb(#[from] crate::lmdb::LmdbError),
    #[error("interrupted")]
    Interrupted,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> InputError + '_ {
    move |source| InputError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Lists `src` as `kind`. `cancel` is polled so a long listing can be interrupted.
pub fn plan(src: &Path, kind: InputKind, lmdb: &LmdbOptions, cancel: &AtomicBool) -> Result<Plan, InputError> {
    plan_counted(src, kind, lmdb, cancel, &AtomicU64::new(0))
}

/// [`plan`], adding to `listed` as entries are found (files of a folder, lines of a manifest),
/// so that another thread can report the progress of a long listing. The server lists image
/// folders and manifests it serves in place with this, so `pack` and `serve` give the same
/// samples, labels and order.
pub fn plan_counted(
    src: &Path,
    kind: InputKind,
    lmdb: &LmdbOptions,
    cancel: &AtomicBool,
    listed: &AtomicU64,
) -> Result<Plan, InputError> {
    let watch = Watch { cancel, listed };
    match kind.detect(src) {
        InputKind::Folder => plan_folder(src, &watch),
        InputKind::Manifest => plan_manifest(src, &watch),
        InputKind::Lmdb => plan_lmdb(src, lmdb),
        // Its own plan reads row groups (`crate::pq::plan`, the `parquet` feature).
        InputKind::Parquet => Err(InputError::Invalid {
            path: src.to_owned(),
            detail: "a Parquet input is planned by ringfeed_source::pq::plan (the `parquet` feature)".to_owned(),
        }),
        InputKind::Auto => unreachable!("detect never returns Auto"),
    }
}

/// What a listing reports to, and is stopped by.
struct Watch<'a> {
    cancel: &'a AtomicBool,
    listed: &'a AtomicU64,
}

impl Watch<'_> {
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    fn found(&self, n: u64) {
        // Relaxed: a progress counter, read only for display.
        self.listed.fetch_add(n, Ordering::Relaxed);
    }
}

/// Reads a file only if it is a regular file: opening a FIFO named `x.jpg` would block forever,
/// and a device could stream without end. `buf` is cleared and reused.
pub fn read_regular_file_into(path: &Path, buf: &mut Vec<u8>) -> std::io::Result<()> {
    use std::io::Read;
    // Checked before opening: opening a FIFO for reading blocks until a writer comes.
    let meta = fs::metadata(path)?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    buf.clear();
    buf.reserve(meta.len() as usize);
    fs::File::open(path)?.read_to_end(buf)?;
    Ok(())
}

fn has_image_extension(name: &OsStr) -> bool {
    Path::new(name)
        .extension()
        .and_then(OsStr::to_str)
        .is_some_and(|e| IMAGE_EXTENSIONS.iter().any(|x| x.eq_ignore_ascii_case(e)))
}

/// Entries of `dir` sorted bytewise by name.
fn sorted_entries(dir: &Path) -> Result<Vec<fs::DirEntry>, InputError> {
    let mut entries = fs::read_dir(dir)
        .map_err(io_err(dir))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(io_err(dir))?;
    entries.sort_by(|a, b| a.file_name().as_bytes().cmp(b.file_name().as_bytes()));
    Ok(entries)
}

fn plan_folder(root: &Path, watch: &Watch<'_>) -> Result<Plan, InputError> {
    if !root.is_dir() {
        return Err(InputError::Invalid {
            path: root.to_owned(),
            detail: "not a directory; an image folder is SRC/class_name/image.jpg".to_owned(),
        });
    }
    let mut plan = Plan {
        kind: InputKind::Folder,
        items: Vec::new(),
        classes: Vec::new(),
        problems: Vec::new(),
        ignored: 0,
        lmdb: None,
        rows: None,
    };
    for entry in sorted_entries(root)? {
        // Follow symlinks, as torchvision does (os.walk(followlinks=True)).
        let path = entry.path();
        if !path.is_dir() {
            if path.is_file() {
                plan.ignored += 1;
            }
            continue;
        }
        let label = plan.classes.len() as i64;
        let name = entry.file_name().as_bytes().to_vec();
        let before = plan.items.len();
        walk_class(root, &path, label, &mut plan, watch, 0)?;
        if plan.items.len() == before {
            plan.problems.push(Problem {
                key: name.clone(),
                reason: format!(
                    "class directory {:?} holds no image file ({})",
                    String::from_utf8_lossy(&name),
                    IMAGE_EXTENSIONS.join(", ")
                ),
            });
        }
        plan.classes.push(name);
    }
    if plan.classes.is_empty() {
        return Err(InputError::Invalid {
            path: root.to_owned(),
            detail: "no class directories found; an image folder is SRC/class_name/image.jpg (or pass a manifest or an LMDB)"
                .to_owned(),
        });
    }
    Ok(plan)
}

/// Depth limit for class directories, against symlink loops.
const MAX_DEPTH: usize = 32;

fn walk_class(
    root: &Path,
    dir: &Path,
    label: i64,
    plan: &mut Plan,
    watch: &Watch<'_>,
    depth: usize,
) -> Result<(), InputError> {
    if watch.cancelled() {
        return Err(InputError::Interrupted);
    }
    if depth > MAX_DEPTH {
        return Err(InputError::Invalid {
            path: dir.to_owned(),
            detail: format!("directories nest deeper than {MAX_DEPTH} levels (a symlink loop?)"),
        });
    }
    for entry in sorted_entries(dir)? {
        let path = entry.path();
        if path.is_dir() {
            walk_class(root, &path, label, plan, watch, depth + 1)?;
        } else if has_image_extension(&entry.file_name()) {
            watch.found(1);
            let key = path.strip_prefix(root).unwrap_or(&path).as_os_str().as_bytes().to_vec();
            plan.items.push(Item {
                key,
                label,
                meta: Vec::new(),
                origin: Origin::File(path),
            });
        } else {
            plan.ignored += 1;
        }
    }
    Ok(())
}

/// One manifest row before labels are resolved.
struct Row {
    line: u64,
    path: String,
    label: Option<serde_json::Value>,
    meta: serde_json::Map<String, serde_json::Value>,
}

fn plan_manifest(manifest: &Path, watch: &Watch<'_>) -> Result<Plan, InputError> {
    let ext = manifest
        .extension()
        .and_then(OsStr::to_str)
        .map(str::to_ascii_lowercase);
    let rows = match ext.as_deref() {
        Some("jsonl" | "ndjson") => read_jsonl(manifest, watch)?,
        Some("csv") => read_csv(manifest, watch)?,
        _ => {
            if !manifest.exists() {
                return Err(InputError::Io {
                    path: manifest.to_owned(),
                    source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
                });
            }
            return Err(InputError::Invalid {
                path: manifest.to_owned(),
                detail: "not an image folder, LMDB or manifest: a manifest must end in .csv, .jsonl or .ndjson (or pass --input)"
                    .to_owned(),
            });
        }
    };
    let base = manifest.parent().unwrap_or(Path::new("."));

    // Labels: all integers, or all strings (class names, sorted bytewise), or absent.
    let mut names: Vec<&str> = rows.iter().filter_map(|r| r.label.as_ref()?.as_str()).collect();
    let ints = rows
        .iter()
        .filter(|r| r.label.as_ref().is_some_and(|l| l.is_i64()))
        .count();
    if !names.is_empty() && ints > 0 {
        return Err(InputError::Invalid {
            path: manifest.to_owned(),
            detail: "the label column mixes integers and class names; use one or the other".to_owned(),
        });
    }
    names.sort_unstable();
    names.dedup();
    let classes: Vec<Vec<u8>> = names.iter().map(|n| n.as_bytes().to_vec()).collect();
    let class_of: HashMap<&str, i64> = names.iter().enumerate().map(|(i, n)| (*n, i as i64)).collect();

    let mut plan = Plan {
        kind: InputKind::Manifest,
        items: Vec::with_capacity(rows.len()),
        classes,
        problems: Vec::new(),
        ignored: 0,
        lmdb: None,
        rows: None,
    };
    let mut seen: HashMap<PathBuf, u64> = HashMap::new();
    for row in &rows {
        let label = match &row.label {
            None | Some(serde_json::Value::Null) => NO_LABEL,
            Some(serde_json::Value::String(s)) => class_of[s.as_str()],
            Some(v) => match v.as_i64() {
                Some(l) if l >= 0 => l,
                _ => {
                    return Err(InputError::Invalid {
                        path: manifest.to_owned(),
                        detail: format!(
                            "line {}: label {v} is not a non-negative integer or a class name",
                            row.line
                        ),
                    });
                }
            },
        };
        let resolved = base.join(&row.path);
        if let Some(first) = seen.insert(resolved.clone(), row.line) {
            seen.insert(resolved, first);
            plan.problems.push(Problem {
                key: row.path.as_bytes().to_vec(),
                reason: format!("line {}: duplicate path (first listed on line {first})", row.line),
            });
            continue;
        }
        let meta = if row.meta.is_empty() {
            Vec::new()
        } else {
            serde_json::to_vec(&row.meta).expect("a JSON map serializes")
        };
        plan.items.push(Item {
            key: row.path.as_bytes().to_vec(),
            label,
            meta,
            origin: Origin::File(resolved),
        });
    }
    if plan.items.is_empty() && plan.problems.is_empty() {
        return Err(InputError::Invalid {
            path: manifest.to_owned(),
            detail: "the manifest lists no images".to_owned(),
        });
    }
    Ok(plan)
}

fn read_jsonl(manifest: &Path, watch: &Watch<'_>) -> Result<Vec<Row>, InputError> {
    let file = fs::File::open(manifest).map_err(io_err(manifest))?;
    let mut rows = Vec::new();
    for (n, line) in BufReader::new(file).lines().enumerate() {
        let line_no = n as u64 + 1;
        if line_no.is_multiple_of(4096) {
            watch.found(4096);
            if watch.cancelled() {
                return Err(InputError::Interrupted);
            }
        }
        let line = line.map_err(io_err(manifest))?;
        if line.trim().is_empty() {
            continue;
        }
        let invalid = |detail: String| InputError::Invalid {
            path: manifest.to_owned(),
            detail: format!("line {line_no}: {detail}"),
        };
        let mut obj = match serde_json::from_str::<serde_json::Value>(&line) {
            Ok(serde_json::Value::Object(o)) => o,
            Ok(_) => {
                return Err(invalid(
                    "expected a JSON object like {\"path\": \"a.jpg\", \"label\": 3}".to_owned(),
                ));
            }
            Err(e) => return Err(invalid(format!("invalid JSON: {e}"))),
        };
        let path = match obj.remove("path") {
            Some(serde_json::Value::String(p)) if !p.is_empty() => p,
            _ => return Err(invalid("missing \"path\" (a non-empty string)".to_owned())),
        };
        let label = obj.remove("label");
        rows.push(Row {
            line: line_no,
            path,
            label,
            meta: obj,
        });
    }
    Ok(rows)
}

fn read_csv(manifest: &Path, watch: &Watch<'_>) -> Result<Vec<Row>, InputError> {
    let invalid = |detail: String| InputError::Invalid {
        path: manifest.to_owned(),
        detail,
    };
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_path(manifest)
        .map_err(|e| invalid(format!("cannot read CSV: {e}")))?;
    let headers = reader
        .headers()
        .map_err(|e| invalid(format!("cannot read the CSV header: {e}")))?
        .clone();
    let path_col = headers.iter().position(|h| h == "path").ok_or_else(|| {
        invalid(format!(
            "the CSV header has no `path` column (found: {}); the first line must name the columns, e.g. `path,label`",
            headers.iter().collect::<Vec<_>>().join(", ")
        ))
    })?;
    let label_col = headers.iter().position(|h| h == "label");
    let mut rows = Vec::new();
    for (n, record) in reader.records().enumerate() {
        let line_no = n as u64 + 2;
        if line_no.is_multiple_of(4096) {
            watch.found(4096);
            if watch.cancelled() {
                return Err(InputError::Interrupted);
            }
        }
        let record = record.map_err(|e| invalid(format!("line {line_no}: {e}")))?;
        let path = record.get(path_col).unwrap_or("").to_owned();
        if path.is_empty() {
            return Err(invalid(format!("line {line_no}: empty path")));
        }
        let label = label_col
            .and_then(|c| record.get(c))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| match s.parse::<i64>() {
                Ok(i) => serde_json::Value::from(i),
                Err(_) => serde_json::Value::from(s),
            });
        let mut meta = serde_json::Map::new();
        for (i, h) in headers.iter().enumerate() {
            if i != path_col && Some(i) != label_col {
                meta.insert(h.to_owned(), serde_json::Value::from(record.get(i).unwrap_or("")));
            }
        }
        rows.push(Row {
            line: line_no,
            path,
            label,
            meta,
        });
    }
    Ok(rows)
}

fn plan_lmdb(src: &Path, opts: &LmdbOptions) -> Result<Plan, InputError> {
    let source = LmdbSource::open(src, opts)?;
    let mut reader = source.reader().map_err(|e| InputError::Invalid {
        path: src.to_owned(),
        detail: e.to_string(),
    })?;
    let mut items = Vec::with_capacity(source.len() as usize);
    let mut problems = Vec::new();
    for i in 0..source.len() {
        match reader.get(i) {
            Ok(s) => items.push(Item {
                key: s.key.to_vec(),
                label: s.label,
                meta: Vec::new(),
                origin: Origin::Lmdb(i),
            }),
            // A value that cannot be parsed is a per-sample problem, like an unreadable file.
            Err(e) => problems.push(Problem {
                key: format!("#{i}").into_bytes(),
                reason: e.to_string(),
            }),
        }
    }
    drop(reader);
    let classes = source.class_names();
    Ok(Plan {
        kind: InputKind::Lmdb,
        items,
        classes,
        problems,
        ignored: 0,
        lmdb: Some(source),
        rows: None,
    })
}

/// [`read_regular_file_into`] into a new buffer.
pub fn read_regular_file(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    read_regular_file_into(path, &mut buf)?;
    Ok(buf)
}
