//! An existing image LMDB, read in place as a [`Source`].
//!
//! The LMDB is opened read-only with [`heed`] and every [`Sample::data`] is a slice of LMDB's
//! memory map: values are never copied (one exception below). Each worker thread's
//! [`SampleReader`] holds its own long-lived read transaction; the environment is opened without
//! thread-local storage (`MDB_NOTLS`) so that transactions are tied to readers, not threads.
//!
//! Supported value layouts ([`Layout`]), documented for users in `docs/lmdb.md`:
//! - **raw**: each value is an encoded image; labels come from a key of the LMDB or a sidecar file
//!   ([`LabelSource`], see the `labels` module), or there are none.
//! - **pickle**: each value is a pickled `(image_bytes, label)` tuple / list, or a dict with image
//!   and label fields. Protocols 3 to 5 are zero-copy; protocol 2 written by Python 3 stores bytes
//!   as latin-1 text, which the reader turns back into bytes in a per-reader buffer (one copy).
//! - **msgpack**: each value is a msgpack `[image_bytes, label]` array or a map with the same
//!   fields.
//! - **auto** picks one of the above from the first sample's value.
//!
//! Invariants:
//! - Samples are the keys not of the form `__*__` (and not the labels key), in LMDB's bytewise key
//!   order, collected at open by one cursor pass: opening is O(keys), unlike packed shards (O(1)).
//! - The dataset must not be written while it is read (see the `SAFETY` notes in [`open_env`]).
//! - `get` never panics on bad data; every error names the path, the sample and the setting to
//!   change.

mod keys;
mod labels;
mod msgpack;
mod pickle;
mod record;

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use heed::types::Bytes;
use heed::{CommitOrAbort, Database, Env, EnvFlags, EnvOpenOptions, MdbError, RoTxn, WithoutTls};

use self::keys::KeyTable;
use self::record::Image;
use super::{NO_LABEL, Sample, SampleReader, Source, SourceError};
use ringfeed_format::fault::Watch;

/// How the values of an LMDB are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// Detect from the first sample's value (pickle, msgpack, or a known image format).
    #[default]
    Auto,
    /// Each value is encoded image bytes (JPEG, PNG, ...).
    Raw,
    /// Each value is a pickled `(image_bytes, label)` tuple / list or a dict with image and label
    /// fields (protocols 2 to 5).
    Pickle,
    /// Each value is a msgpack `[image_bytes, label]` array or a map with image and label fields.
    Msgpack,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Auto => "auto",
            Layout::Raw => "raw",
            Layout::Pickle => "pickle",
            Layout::Msgpack => "msgpack",
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Layout {
    type Err = LmdbError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Layout::Auto),
            "raw" => Ok(Layout::Raw),
            "pickle" => Ok(Layout::Pickle),
            "msgpack" => Ok(Layout::Msgpack),
            _ => Err(LmdbError::UnknownLayout(s.to_owned())),
        }
    }
}

/// Where the labels of a [`Layout::Raw`] LMDB come from. The other layouts carry their labels in
/// each value, so they take only [`LabelSource::None`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LabelSource {
    /// No labels: every sample's label is [`NO_LABEL`].
    #[default]
    None,
    /// A key of the same LMDB (e.g. `__labels__`) whose value is a label table.
    Key(Vec<u8>),
    /// A sidecar file holding a label table (JSON, JSON lines, CSV, pickle or msgpack).
    File(PathBuf),
}

/// How to read an LMDB.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LmdbOptions {
    /// The value layout (`--lmdb-layout`).
    pub layout: Layout,
    /// Labels of a raw LMDB (`--labels-key` or `--labels`).
    pub labels: LabelSource,
}

/// Errors opening or reading an LMDB. Messages are lowercase and name the LMDB path, the sample
/// (index and key) where there is one, and the setting that fixes the problem.
#[derive(Debug, thiserror::Error)]
pub enum LmdbError {
    /// The path is missing or unreadable, or LMDB refused to open it.
    #[error("lmdb {}: cannot open: {reason}", path.display())]
    Open { path: PathBuf, reason: String },
    /// The path exists but does not hold an LMDB environment.
    #[error(
        "lmdb {}: not an lmdb environment: {reason} (expected a directory holding data.mdb, as \
         written by python's `lmdb.open(path)`, or the single file written with `subdir=False`)",
        path.display()
    )]
    NotLmdb { path: PathBuf, reason: String },
    /// A read transaction or the cursor pass over the keys failed.
    #[error("lmdb {}: {reason}", path.display())]
    Read { path: PathBuf, reason: String },
    /// The layout could not be detected, or does not go with the options.
    #[error("lmdb {}: {reason}", path.display())]
    Layout { path: PathBuf, reason: String },
    /// The label table could not be read or parsed, or does not fit the samples.
    #[error("lmdb {}: {reason}", path.display())]
    Labels { path: PathBuf, reason: String },
    /// One sample could not be read or decoded.
    #[error("lmdb {}: sample {index} (key {key}): {reason}", path.display())]
    Sample {
        path: PathBuf,
        index: u64,
        /// The key, escaped (`\xff` for non-printable bytes) and quoted.
        key: String,
        reason: String,
    },
    /// `--lmdb-layout` names no layout.
    #[error("unknown lmdb layout {0:?}: expected auto, raw, pickle or msgpack (--lmdb-layout)")]
    UnknownLayout(String),
}

/// A key for messages: quoted, escaped, and cut after 96 bytes.
fn show_key(key: &[u8]) -> String {
    const MAX: usize = 96;
    let shown = &key[..key.len().min(MAX)];
    let more = if key.len() > MAX { "..." } else { "" };
    format!("\"{}\"{more}", shown.escape_ascii())
}

/// An error's text with its first letter lowercased (OS and LMDB messages are capitalized).
fn lower(err: &dyn fmt::Display) -> String {
    let s = err.to_string();
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => s,
    }
}

/// An LMDB environment opened by this process, shared by every [`LmdbSource`] on the same path.
struct SharedEnv {
    /// The data file's mappings, watched for SIGBUS ([`ringfeed_format::fault`]). Declared before `env` so
    /// they are unregistered before LMDB unmaps the file.
    watches: Vec<Watch>,
    /// The data file, and its length when the environment was opened, for fault messages.
    data_file: PathBuf,
    opened_len: u64,
    env: Env<WithoutTls>,
    /// The unnamed (main) database, where py-lmdb's `txn.put` writes.
    db: Database<'static, Bytes, Bytes>,
    /// Opened with `MDB_NOLOCK` because the lock file could not be created.
    no_lock: bool,
}

impl fmt::Debug for SharedEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedEnv")
            .field("path", &self.env.path())
            .field("no_lock", &self.no_lock)
            .finish_non_exhaustive()
    }
}

/// Environments opened by this process, by canonical path. heed refuses to open one path twice
/// in a process (`EnvAlreadyOpened`), so a second [`LmdbSource`] on the same path shares the first
/// one's environment; the entry dies with the last source using it.
static OPEN_ENVS: Mutex<BTreeMap<PathBuf, Weak<SharedEnv>>> = Mutex::new(BTreeMap::new());

/// How long to wait for a just-dropped environment to finish closing before reopening it.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// What to hand LMDB for a user's path.
#[derive(Debug)]
struct Target {
    /// Canonical path of the environment: a directory, or the data file itself.
    path: PathBuf,
    /// `subdir=False`: the path is the data file and the lock file is `<path>-lock`.
    single_file: bool,
    /// The data file, for the header check.
    data_file: PathBuf,
}

/// LMDB's meta page magic (`MDB_MAGIC`), at byte 16 of the data file.
const MDB_MAGIC: u32 = 0xBEEF_C0DE;

fn resolve_target(user_path: &Path) -> Result<Target, LmdbError> {
    let open_err = |e: &io::Error| LmdbError::Open {
        path: user_path.to_owned(),
        reason: lower(e),
    };
    let meta = fs::metadata(user_path).map_err(|e| open_err(&e))?;
    let (env_path, single_file) = if meta.is_dir() {
        (user_path.to_owned(), false)
    } else if user_path.file_name().is_some_and(|n| n == "data.mdb") && !lock_path(user_path, true).exists() {
        // The data file of a directory environment: open the directory, so that we share its
        // lock.mdb with any other reader or writer.
        let dir = user_path.parent().unwrap_or(Path::new("."));
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        tracing::debug!(path = %user_path.display(), "opening the lmdb directory holding this data.mdb");
        (dir.to_owned(), false)
    } else {
        (user_path.to_owned(), true)
    };
    let path = env_path.canonicalize().map_err(|e| open_err(&e))?;
    let data_file = if single_file {
        path.clone()
    } else {
        path.join("data.mdb")
    };
    Ok(Target {
        path,
        single_file,
        data_file,
    })
}

/// The lock file LMDB uses for an environment at `path`.
fn lock_path(path: &Path, single_file: bool) -> PathBuf {
    if single_file {
        let mut p = path.as_os_str().to_owned();
        p.push("-lock");
        PathBuf::from(p)
    } else {
        path.join("lock.mdb")
    }
}

/// Checks the data file's header ourselves: LMDB creates its lock file before reading the header,
/// so without this check pointing ringfeed at a random file would leave a stray `-lock` file, and
/// an empty file would be reported as "no such file".
fn check_header(user_path: &Path, target: &Target) -> Result<(), LmdbError> {
    let not_lmdb = |reason: String| LmdbError::NotLmdb {
        path: user_path.to_owned(),
        reason,
    };
    let mut file = match fs::File::open(&target.data_file) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound && !target.single_file => {
            return Err(not_lmdb("the directory has no data.mdb".into()));
        }
        Err(e) => {
            return Err(LmdbError::Open {
                path: user_path.to_owned(),
                reason: format!("{}: {}", target.data_file.display(), lower(&e)),
            });
        }
    };
    let mut head = Vec::with_capacity(24);
    file.by_ref()
        .take(24)
        .read_to_end(&mut head)
        .map_err(|e| LmdbError::Open {
            path: user_path.to_owned(),
            reason: format!("{}: {}", target.data_file.display(), lower(&e)),
        })?;
    let magic = head
        .get(16..20)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_ne_bytes);
    if magic != Some(MDB_MAGIC) {
        let what = if head.is_empty() {
            "is empty".to_owned()
        } else {
            format!("starts with {}", hex_prefix(&head, 16))
        };
        return Err(not_lmdb(format!(
            "{} {what}, with no lmdb header",
            target.data_file.display()
        )));
    }
    Ok(())
}

fn hex_prefix(bytes: &[u8], max: usize) -> String {
    let mut s: Vec<String> = bytes.iter().take(max).map(|b| format!("{b:02x}")).collect();
    if bytes.len() > max {
        s.push("...".into());
    }
    s.join(" ")
}

/// Whether an open error means the lock file could not be created or opened for writing.
fn lock_denied(err: &heed::Error) -> bool {
    matches!(err, heed::Error::Io(e) if matches!(
        e.kind(),
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem
    ))
}

/// Opens the environment at `target`, read-only, and its main database.
fn open_env(user_path: &Path, target: &Target, force_no_lock: bool) -> Result<SharedEnv, LmdbError> {
    let open_once = |no_lock: bool| -> heed::Result<Env<WithoutTls>> {
        let mut options = EnvOpenOptions::new().read_txn_without_tls();
        // Only matters when this process creates the lock file: room for many worker threads.
        options.max_readers(1024);
        let mut flags = EnvFlags::READ_ONLY;
        if target.single_file {
            flags |= EnvFlags::NO_SUB_DIR;
        }
        if no_lock {
            flags |= EnvFlags::NO_LOCK;
        }
        // SAFETY: heed marks the flag setter unsafe for NO_SYNC, NO_META_SYNC and NO_LOCK.
        // READ_ONLY and NO_SUB_DIR carry no hazard, and NO_SYNC / NO_META_SYNC are never set
        // (they only matter to writers anyway). NO_LOCK is set only when the lock file cannot be
        // created or opened (a read-only directory or lock file). This process only reads, so
        // it needs no writer lock; what is lost is that a writer in another process cannot see
        // our readers and could reuse pages we are reading. Hence the precondition stated in the
        // module docs and docs/lmdb.md: nobody writes the dataset while ringfeed reads it. Under
        // it, reading without locks is sound.
        unsafe { options.flags(flags) };
        // SAFETY: `open` is unsafe because the memory map is undefined behaviour if the file is
        // modified underneath it. ringfeed opens the environment read-only (MDB_RDONLY, so this
        // process never writes it) and requires that the dataset is not written while training.
        // If another process does write it anyway, LMDB's lock file keeps the pages our read
        // transactions see from being reused, so readers keep a consistent snapshot; the
        // remaining hazards are a writer that ignores the lock (NO_LOCK, as in our fallback, or
        // a broken lock file) reusing pages we are reading (garbage bytes, decode errors), and a
        // file truncated or replaced underneath the map (SIGBUS). Opening the same path twice in
        // this process is handled by heed (it refuses) and by `shared_env` (which shares one
        // environment per path).
        unsafe { options.open(&target.path) }
    };

    let mut no_lock = force_no_lock;
    let mut waited = false;
    let env = loop {
        match open_once(no_lock) {
            Ok(env) => break env,
            Err(e) if !no_lock && lock_denied(&e) => {
                tracing::debug!(
                    path = %user_path.display(),
                    lock_file = %lock_path(&target.path, target.single_file).display(),
                    error = %e,
                    "cannot create or open the lmdb lock file (read-only directory?); opening \
                     without locking (MDB_NOLOCK): the dataset must not be written while ringfeed \
                     reads it",
                );
                no_lock = true;
            }
            Err(heed::Error::EnvAlreadyOpened) if !waited => {
                // The last source on this path was just dropped and its environment is still
                // closing, or someone else in this process holds it.
                waited = true;
                if let Some(event) = heed::env_closing_event(&target.path) {
                    event.wait_timeout(CLOSE_WAIT);
                }
            }
            Err(e) => return Err(open_error(user_path, target, &e)),
        }
    };

    // SAFETY: LMDB maps the data file read-only (MDB_RDONLY, without MDB_WRITEMAP) for the life
    // of `env`, and the watches are dropped first (locals here, fields of `SharedEnv` below,
    // both in that order). Every read checks them after using the bytes (`LmdbSource::faulted`).
    let watches =
        unsafe { ringfeed_format::fault::watch_file_mappings(&target.data_file) }.map_err(|e| LmdbError::Open {
            path: user_path.to_owned(),
            reason: format!(
                "cannot find the memory map of {}: {}",
                target.data_file.display(),
                lower(&e)
            ),
        })?;
    let opened_len = fs::metadata(&target.data_file).map(|m| m.len()).unwrap_or(0);

    let reason = |e: &heed::Error| LmdbError::Read {
        path: user_path.to_owned(),
        reason: format!("cannot open the main database: {}", lower(e)),
    };
    let rtxn = env.read_txn().map_err(|e| txn_error(user_path, &e))?;
    let db = env
        .open_databases_and_commit(rtxn, |opener, rtxn| {
            opener
                .open_database::<Bytes, Bytes>(rtxn, None)
                .map(CommitOrAbort::<_, ()>::Commit)
        })
        .map_err(|e| reason(&e))?
        .commit()
        .flatten()
        .ok_or_else(|| LmdbError::Read {
            path: user_path.to_owned(),
            reason: "the main database is missing".into(),
        })?;
    Ok(SharedEnv {
        watches,
        data_file: target.data_file.clone(),
        opened_len,
        env,
        db,
        no_lock,
    })
}

fn open_error(user_path: &Path, target: &Target, e: &heed::Error) -> LmdbError {
    let path = user_path.to_owned();
    match e {
        heed::Error::Mdb(MdbError::Invalid) => LmdbError::NotLmdb {
            path,
            reason: format!("{} is not an lmdb data file", target.data_file.display()),
        },
        heed::Error::Mdb(MdbError::VersionMismatch) => LmdbError::Open {
            path,
            reason: "written by an incompatible lmdb version".into(),
        },
        heed::Error::EnvAlreadyOpened => LmdbError::Open {
            path,
            reason: "the environment is held open by other code in this process with different \
                     options"
                .into(),
        },
        heed::Error::Io(io) if io.kind() == io::ErrorKind::PermissionDenied => LmdbError::Open {
            path,
            reason: format!(
                "{} (the data file must be readable; the lock file {} is created if missing)",
                lower(io),
                lock_path(&target.path, target.single_file).display()
            ),
        },
        other => LmdbError::Open {
            path,
            reason: lower(other),
        },
    }
}

fn txn_error(user_path: &Path, e: &heed::Error) -> LmdbError {
    let reason = match e {
        heed::Error::Mdb(MdbError::ReadersFull) => "cannot start a read transaction: the lock \
            file's reader table is full (every worker thread holds one reader; use fewer worker \
            threads, or delete a stale lock file written with a small max_readers while nothing \
            uses the lmdb)"
            .to_owned(),
        other => format!("cannot start a read transaction: {}", lower(other)),
    };
    LmdbError::Read {
        path: user_path.to_owned(),
        reason,
    }
}

/// The environment for `user_path`: the one this process already has open, or a new one.
fn shared_env(user_path: &Path, force_no_lock: bool) -> Result<Arc<SharedEnv>, LmdbError> {
    let target = resolve_target(user_path)?;
    let mut open = OPEN_ENVS.lock().unwrap_or_else(PoisonError::into_inner);
    open.retain(|_, env| env.strong_count() > 0);
    if let Some(env) = open.get(&target.path).and_then(Weak::upgrade) {
        return Ok(env);
    }
    check_header(user_path, &target)?;
    let env = Arc::new(open_env(user_path, &target, force_no_lock)?);
    open.insert(target.path, Arc::downgrade(&env));
    Ok(env)
}

/// Whether `value` starts like an encoded image ringfeed can decode.
fn sniff_image(value: &[u8]) -> bool {
    value.starts_with(&[0xff, 0xd8, 0xff])
        || value.starts_with(b"\x89PNG\r\n\x1a\n")
        || value.starts_with(b"GIF87a")
        || value.starts_with(b"GIF89a")
        || value.starts_with(b"BM")
        || (value.starts_with(b"RIFF") && value.get(8..12) == Some(b"WEBP"))
        || value.starts_with(b"II*\0")
        || value.starts_with(b"MM\0*")
}

fn detect_layout(value: &[u8]) -> Option<Layout> {
    // Images first: a PNG's 0x89 is also a msgpack fixmap header.
    if sniff_image(value) {
        Some(Layout::Raw)
    } else if pickle::sniff(value) {
        Some(Layout::Pickle)
    } else if msgpack::sniff(value) {
        Some(Layout::Msgpack)
    } else {
        None
    }
}

/// An image LMDB read in place. See the module docs.
pub struct LmdbSource {
    /// The path as the user gave it, for messages.
    path: PathBuf,
    shared: Arc<SharedEnv>,
    keys: KeyTable,
    /// The resolved layout, never [`Layout::Auto`].
    layout: Layout,
    /// Raw layout with labels: `labels[i]` is sample `i`'s. Empty otherwise.
    labels: Vec<i64>,
    /// Class names when the labels were names.
    classes: Vec<Vec<u8>>,
}

impl fmt::Debug for LmdbSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LmdbSource")
            .field("path", &self.path)
            .field("layout", &self.layout)
            .field("len", &self.keys.len())
            .field("labels", &self.labels.len())
            .field("classes", &self.classes.len())
            .field("env", &self.shared)
            .finish()
    }
}

impl LmdbSource {
    /// Opens the LMDB at `path` (a directory holding `data.mdb`, or a single-file environment
    /// written with `subdir=False`) read-only, and collects its sample keys (O(keys)).
    pub fn open(path: &Path, opts: &LmdbOptions) -> Result<Self, LmdbError> {
        Self::open_with(path, opts, false)
    }

    fn open_with(path: &Path, opts: &LmdbOptions, force_no_lock: bool) -> Result<Self, LmdbError> {
        ringfeed_format::fault::install().map_err(|e| LmdbError::Open {
            path: path.to_owned(),
            reason: format!("cannot install the SIGBUS handler: {}", lower(&e)),
        })?;
        let shared = shared_env(path, force_no_lock)?;
        let read_err = |what: &str, e: &heed::Error| LmdbError::Read {
            path: path.to_owned(),
            reason: format!("{what}: {}", lower(e)),
        };
        let rtxn = shared.env.read_txn().map_err(|e| txn_error(path, &e))?;
        let label_key = match &opts.labels {
            LabelSource::Key(k) => Some(k.as_slice()),
            _ => None,
        };

        // One cursor pass: sample keys, and the first sample's value for layout detection.
        let entries = shared.db.len(&rtxn).map_err(|e| read_err("cannot count keys", &e))?;
        let mut keys = KeyTable::with_capacity(usize::try_from(entries).unwrap_or(0));
        let mut first: Option<&[u8]> = None;
        let mut metadata: Vec<Vec<u8>> = Vec::new();
        let iter = shared.db.iter(&rtxn).map_err(|e| read_err("cannot walk keys", &e))?;
        for entry in iter {
            let (key, value) = entry.map_err(|e| read_err("cannot walk keys", &e))?;
            if keys::is_metadata(key) || Some(key) == label_key {
                if metadata.len() < 8 {
                    metadata.push(key.to_vec());
                }
                continue;
            }
            if first.is_none() {
                first = Some(value);
            }
            keys.push(key);
        }
        keys.shrink_to_fit();

        let layout = match opts.layout {
            Layout::Auto => {
                let (Some(value), Some(key)) = (first, keys.get(0)) else {
                    return Err(LmdbError::Layout {
                        path: path.to_owned(),
                        reason: format!(
                            "holds no samples (keys seen: {}), so there is nothing to detect the \
                             layout from; set --lmdb-layout",
                            show_keys(&metadata)
                        ),
                    });
                };
                detect_layout(value).ok_or_else(|| LmdbError::Layout {
                    path: path.to_owned(),
                    reason: format!(
                        "cannot detect the layout from sample 0 (key {}): its value ({} bytes) \
                         starts with {}, which is neither a pickle (80 02..05), msgpack (an array \
                         or map header) nor a jpeg/png/gif/bmp/webp/tiff image; set --lmdb-layout \
                         to raw, pickle or msgpack",
                        show_key(key),
                        value.len(),
                        hex_prefix(value, 16)
                    ),
                })?
            }
            other => other,
        };
        tracing::debug!(path = %path.display(), %layout, samples = keys.len(), "opened lmdb");

        let (labels, classes) = match (&opts.labels, layout) {
            (LabelSource::None, Layout::Raw) => {
                if let Ok(Some(_)) = shared.db.get(&rtxn, b"__labels__") {
                    tracing::warn!(
                        path = %path.display(),
                        "the lmdb has a __labels__ key but no labels were asked for, so every \
                         label is -1; pass --labels-key __labels__ to use it",
                    );
                }
                (Vec::new(), Vec::new())
            }
            (LabelSource::None, _) => (Vec::new(), Vec::new()),
            (LabelSource::Key(k), Layout::Raw) => {
                let origin = format!("labels key {}", show_key(k));
                let value = shared
                    .db
                    .get(&rtxn, k)
                    .map_err(|e| read_err(&format!("cannot read the {origin}"), &e))?
                    .ok_or_else(|| LmdbError::Labels {
                        path: path.to_owned(),
                        reason: format!(
                            "{origin} not found; check --labels-key (metadata keys present: {})",
                            show_keys(&metadata)
                        ),
                    })?;
                resolve_labels(path, &keys, value, None, &origin, "--labels-key")?
            }
            (LabelSource::File(f), Layout::Raw) => {
                let origin = format!("labels file {}", f.display());
                let bytes = fs::read(f).map_err(|e| LmdbError::Labels {
                    path: path.to_owned(),
                    reason: format!("cannot read the {origin}: {}; check --labels", lower(&e)),
                })?;
                let extension = f.extension().and_then(|e| e.to_str());
                resolve_labels(path, &keys, &bytes, extension, &origin, "--labels")?
            }
            (source, layout) => {
                let setting = match source {
                    LabelSource::Key(_) => "--labels-key",
                    _ => "--labels",
                };
                return Err(LmdbError::Layout {
                    path: path.to_owned(),
                    reason: format!(
                        "{setting} only applies to the raw layout, but the values are {layout} \
                         records that carry their own labels; drop {setting}, or set \
                         --lmdb-layout raw if the values are plain images"
                    ),
                });
            }
        };
        drop(rtxn);
        if let Some(reason) = faulted(&shared) {
            return Err(LmdbError::Read {
                path: path.to_owned(),
                reason,
            });
        }

        Ok(LmdbSource {
            path: path.to_owned(),
            shared,
            keys,
            layout,
            labels,
            classes,
        })
    }

    /// The layout of the values, as detected or given (never [`Layout::Auto`]).
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Whether the environment was opened without a lock file (read-only directory).
    pub fn is_unlocked(&self) -> bool {
        self.shared.no_lock
    }

    /// The error for sample `index` if the data file faulted (see [`faulted`]).
    fn check_faults(&self, index: u64) -> Result<(), SourceError> {
        match faulted(&self.shared) {
            Some(reason) => Err(self.sample_error(index, self.keys.get(index).unwrap_or_default(), reason)),
            None => Ok(()),
        }
    }

    fn sample_error(&self, index: u64, key: &[u8], reason: String) -> SourceError {
        SourceError::Lmdb(LmdbError::Sample {
            path: self.path.clone(),
            index,
            key: show_key(key),
            reason,
        })
    }
}

/// Why the environment's bytes cannot be trusted, if its data file raised SIGBUS since it was
/// opened (truncated, or unreadable). The fault stays: every later read fails the same way.
fn faulted(shared: &SharedEnv) -> Option<String> {
    let at = shared.watches.iter().find_map(|w| w.fault())?;
    let was = shared.opened_len;
    let now = match fs::metadata(&shared.data_file) {
        Ok(m) if m.len() < was => format!("it is now {} bytes, it had {was} when opened (truncated)", m.len()),
        Ok(m) => format!(
            "it is now {} bytes, it had {was} when opened (rewritten, or an i/o error?)",
            m.len()
        ),
        Err(e) => format!("it cannot be read any more ({})", lower(&e)),
    };
    Some(format!(
        "{} changed on disk after it was opened: reading byte {at} failed (SIGBUS); {now}. The lmdb \
         must not be written while ringfeed reads it: restore it, then open it again (a server \
         keeps the open lmdb until every stream reading it has ended)",
        shared.data_file.display()
    ))
}

/// Parses a label table and gives each sample of `keys` its label: (labels, class names).
fn resolve_labels(
    path: &Path,
    keys: &KeyTable,
    bytes: &[u8],
    extension: Option<&str>,
    origin: &str,
    setting: &str,
) -> Result<(Vec<i64>, Vec<Vec<u8>>), LmdbError> {
    let labels_err = |reason: String| LmdbError::Labels {
        path: path.to_owned(),
        reason,
    };
    let format = labels::detect(bytes, extension);
    let table = labels::parse(bytes, format).map_err(|reason| {
        labels_err(format!(
            "cannot parse the {origin} as {format}: {reason}; check {setting}"
        ))
    })?;
    let resolved = labels::resolve(&table, keys).map_err(|e| match e {
        labels::ResolveError::Missing { index } => LmdbError::Sample {
            path: path.to_owned(),
            index,
            key: show_key(keys.get(index).unwrap_or_default()),
            reason: format!("no label in the {origin}; every sample needs one (check {setting})"),
        },
        labels::ResolveError::Count { labels, samples } => labels_err(format!(
            "the {origin} lists {labels} labels but the lmdb holds {samples} samples; a label \
             list must hold one label per sample, in key order (check {setting})"
        )),
        labels::ResolveError::Mixed => labels_err(format!(
            "the {origin} mixes integer labels and class names; use one or the other (check \
             {setting})"
        )),
    })?;
    Ok((resolved.labels, resolved.classes))
}

/// A few keys for messages.
fn show_keys(keys: &[Vec<u8>]) -> String {
    if keys.is_empty() {
        "none".to_owned()
    } else {
        keys.iter().map(|k| show_key(k)).collect::<Vec<_>>().join(", ")
    }
}

impl Source for LmdbSource {
    fn len(&self) -> u64 {
        self.keys.len()
    }

    fn class_names(&self) -> Vec<Vec<u8>> {
        self.classes.clone()
    }

    fn describe(&self) -> String {
        format!(
            "lmdb {} ({} layout, {} samples)",
            self.path.display(),
            self.layout,
            self.keys.len()
        )
    }

    fn reader(&self) -> Result<Box<dyn SampleReader + '_>, SourceError> {
        Ok(Box::new(self.lmdb_reader()?))
    }

    fn with_sample(&self, index: u64, f: &mut dyn FnMut(Sample<'_>)) -> Result<(), SourceError> {
        let mut reader = self.lmdb_reader()?;
        f(reader.get(index)?);
        // The decoder may have read zeros where the file was cut: say so instead of its result.
        self.check_faults(index)
    }
}

impl LmdbSource {
    fn lmdb_reader(&self) -> Result<LmdbReader<'_>, SourceError> {
        let txn = self.shared.env.read_txn().map_err(|e| txn_error(&self.path, &e))?;
        Ok(LmdbReader {
            src: self,
            txn,
            scratch: Vec::new(),
        })
    }
}

/// One worker thread's access to an [`LmdbSource`]: a read transaction held for the reader's
/// life, so every `get` sees the same snapshot and returns slices of the memory map.
struct LmdbReader<'s> {
    src: &'s LmdbSource,
    txn: RoTxn<'s, WithoutTls>,
    /// Bytes of a protocol-2 pickle image (stored as latin-1 text), reused between samples.
    scratch: Vec<u8>,
}

impl fmt::Debug for LmdbReader<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LmdbReader")
            .field("source", &self.src.path)
            .field("txn", &self.txn.id())
            .finish_non_exhaustive()
    }
}

impl SampleReader for LmdbReader<'_> {
    fn get(&mut self, index: u64) -> Result<Sample<'_>, SourceError> {
        let src = self.src;
        // Before and after the lookup: a data file that faulted is never read again, and a fault
        // during this lookup (LMDB read zeros) is reported as such, not as what the zeros gave.
        src.check_faults(index)?;
        let got = self.lookup(index);
        src.check_faults(index)?;
        got
    }
}

impl LmdbReader<'_> {
    fn lookup(&mut self, index: u64) -> Result<Sample<'_>, SourceError> {
        let src = self.src;
        let Some(key) = src.keys.get(index) else {
            return Err(SourceError::OutOfRange {
                index,
                len: src.keys.len(),
                source_desc: src.describe(),
            });
        };
        let value = match src.shared.db.get(&self.txn, key) {
            Ok(Some(value)) => value,
            Ok(None) => {
                return Err(src.sample_error(
                    index,
                    key,
                    "the key is gone: the lmdb was modified after it was opened (it must not be \
                     written while ringfeed reads it)"
                        .into(),
                ));
            }
            Err(e) => {
                return Err(src.sample_error(index, key, format!("read failed: {}", lower(&e))));
            }
        };
        let (data, label): (&[u8], i64) = match src.layout {
            Layout::Raw | Layout::Auto => (
                value,
                usize::try_from(index)
                    .ok()
                    .and_then(|i| src.labels.get(i).copied())
                    .unwrap_or(NO_LABEL),
            ),
            Layout::Pickle | Layout::Msgpack => {
                let decoded = if src.layout == Layout::Pickle {
                    record::from_pickle(value)
                } else {
                    record::from_msgpack(value)
                };
                let rec = decoded.map_err(|reason| {
                    src.sample_error(
                        index,
                        key,
                        format!(
                            "cannot decode the value as a {layout} record (--lmdb-layout \
                             {layout}): {reason}",
                            layout = src.layout
                        ),
                    )
                })?;
                match rec.image {
                    Image::Borrowed(bytes) => (bytes, rec.label),
                    Image::Latin1(text) => {
                        pickle::latin1_to_bytes(text, &mut self.scratch).map_err(|c| {
                            src.sample_error(
                                index,
                                key,
                                format!(
                                    "cannot decode the value as a pickle record (--lmdb-layout \
                                     pickle): the image is stored as text holding {c:?}, which \
                                     is not latin-1"
                                ),
                            )
                        })?;
                        (self.scratch.as_slice(), rec.label)
                    }
                }
            }
        };
        Ok(Sample {
            index,
            key,
            label,
            data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a small LMDB with heed itself (the integration tests use Python's `lmdb`).
    fn write_env(dir: &Path, entries: &[(&[u8], &[u8])]) {
        let env = {
            let mut options = EnvOpenOptions::new();
            options.map_size(1 << 20);
            // SAFETY: a fresh temporary directory, written by this test only.
            unsafe { options.open(dir) }.unwrap()
        };
        let wtxn = env.write_txn().unwrap();
        env.create_databases_and_commit(wtxn, |opener, wtxn| -> heed::Result<_> {
            let db = opener.create_database::<Bytes, Bytes>(wtxn, None)?;
            for (k, v) in entries {
                db.put(wtxn, k, v)?;
            }
            Ok(CommitOrAbort::<_, ()>::Commit(()))
        })
        .unwrap();
        let closing = env.prepare_for_closing();
        closing.wait();
    }

    #[test]
    fn layout_from_str() {
        assert_eq!("auto".parse::<Layout>().unwrap(), Layout::Auto);
        assert_eq!(" Pickle".parse::<Layout>().unwrap(), Layout::Pickle);
        assert_eq!("raw".parse::<Layout>().unwrap(), Layout::Raw);
        assert_eq!("msgpack".parse::<Layout>().unwrap(), Layout::Msgpack);
        let e = "json".parse::<Layout>().unwrap_err().to_string();
        assert!(e.contains("\"json\"") && e.contains("--lmdb-layout"), "{e}");
        for l in [Layout::Auto, Layout::Raw, Layout::Pickle, Layout::Msgpack] {
            assert_eq!(l.to_string().parse::<Layout>().unwrap(), l);
        }
    }

    #[test]
    fn detects_layouts() {
        assert_eq!(detect_layout(b"\x80\x04\x95"), Some(Layout::Pickle));
        assert_eq!(detect_layout(b"\x92\xc4"), Some(Layout::Msgpack));
        assert_eq!(detect_layout(b"\x82\xa5"), Some(Layout::Msgpack));
        assert_eq!(detect_layout(b"\xde\x00\x02"), Some(Layout::Msgpack));
        assert_eq!(detect_layout(b"\xff\xd8\xff\xe0"), Some(Layout::Raw));
        assert_eq!(detect_layout(b"\x89PNG\r\n\x1a\n"), Some(Layout::Raw));
        assert_eq!(detect_layout(b"GIF89a"), Some(Layout::Raw));
        assert_eq!(detect_layout(b"BM\x00"), Some(Layout::Raw));
        assert_eq!(detect_layout(b"RIFF\0\0\0\0WEBPVP8 "), Some(Layout::Raw));
        assert_eq!(detect_layout(b"RIFF\0\0\0\0WAVE"), None);
        assert_eq!(detect_layout(b"II*\0"), Some(Layout::Raw));
        assert_eq!(detect_layout(b"MM\0*"), Some(Layout::Raw));
        assert_eq!(detect_layout(b"hello"), None);
        assert_eq!(detect_layout(b""), None);
    }

    #[test]
    fn keys_are_shown_escaped() {
        assert_eq!(show_key(b"a/b.jpg"), "\"a/b.jpg\"");
        assert_eq!(show_key(b"\xff\n\""), "\"\\xff\\n\\\"\"");
        assert!(show_key(&[b'x'; 200]).ends_with("\"..."));
    }

    #[test]
    fn no_lock_fallback_reads_the_same() {
        let dir = tempfile::tempdir().unwrap();
        write_env(
            dir.path(),
            &[(b"a", b"\xff\xd8\xffa"), (b"b", b"\xff\xd8\xffb"), (b"__len__", b"2")],
        );
        fs::remove_file(dir.path().join("lock.mdb")).unwrap();
        let src = LmdbSource::open_with(dir.path(), &LmdbOptions::default(), true).unwrap();
        assert!(src.is_unlocked());
        assert!(!dir.path().join("lock.mdb").exists());
        assert_eq!(src.layout(), Layout::Raw);
        assert_eq!(src.len(), 2);
        let mut r = src.reader().unwrap();
        let s = r.get(1).unwrap();
        assert_eq!((s.key, s.data, s.label), (&b"b"[..], &b"\xff\xd8\xffb"[..], NO_LABEL));
    }

    #[test]
    fn lock_errors_trigger_the_fallback() {
        let denied = heed::Error::Io(io::Error::from(io::ErrorKind::PermissionDenied));
        let rofs = heed::Error::Io(io::Error::from(io::ErrorKind::ReadOnlyFilesystem));
        let missing = heed::Error::Io(io::Error::from(io::ErrorKind::NotFound));
        assert!(lock_denied(&denied));
        assert!(lock_denied(&rofs));
        assert!(!lock_denied(&missing));
        assert!(!lock_denied(&heed::Error::Mdb(MdbError::Invalid)));
    }

    #[test]
    fn empty_lmdb() {
        let dir = tempfile::tempdir().unwrap();
        write_env(dir.path(), &[(b"__len__", b"0")]);
        let e = LmdbSource::open(dir.path(), &LmdbOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("holds no samples") && e.contains("\"__len__\"") && e.contains("--lmdb-layout"),
            "{e}"
        );
        let opts = LmdbOptions {
            layout: Layout::Raw,
            ..LmdbOptions::default()
        };
        let src = LmdbSource::open(dir.path(), &opts).unwrap();
        assert!(src.is_empty());
        assert!(matches!(
            src.reader().unwrap().get(0),
            Err(SourceError::OutOfRange { .. })
        ));
    }
}
