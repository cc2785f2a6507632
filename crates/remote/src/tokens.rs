//! Token datasets on object storage (`s3://bucket/prefix`, `proto/tokens.md` "Remote token
//! datasets"): the dataset's files fetched whole into the server's [`Cache`], checked, and held
//! there for as long as a stream reads them, then read exactly as a local copy.
//!
//! Why whole files and not ranged reads: a token stream reads windows all over `tokens.rft` (a
//! shuffled order touches every chunk of it), and the format's open is O(1) only because the file
//! is mapped; a local copy keeps both, and the windows are then those of the local reader, byte
//! for byte, by construction.
//!
//! What is fetched: `prefix/tokens.rft`, and, for a `pack` stream with `seq_len` S, also
//! `prefix/packing-S.rfp` when the prefix holds it (as a local open reads only that one packing).
//! Each is checked before it is used, with the checks the format gives:
//! - `tokens.rft`: everything `ringfeed verify` checks of it (`verify_file`: the structures and
//!   their CRCs, every chunk's CRC-32C, the tokens against the vocabulary, the padding);
//! - `packing-S.rfp`: everything a local open checks (header, length, that it belongs to this
//!   `tokens.rft`) and its `tables_crc`; not the recomputation of best-fit decreasing that
//!   `verify` does (that would cost the open what the packing file exists to save).
//!
//! Invariants:
//! - A stream never reads a partial or unchecked file: the cache renames a download into place
//!   only once its check passed ([`Cache`]'s invariants), and this module hands out a path only
//!   after that.
//! - The files are *pinned* (not leased) for the life of a [`RemoteTokens`]: a stream maps them,
//!   so evicting one would not even free its disk space. The open refuses a dataset whose files
//!   together exceed the cache's bound, naming `--cache-bytes`.
//! - The format's readers find a dataset by its directory (`DIR/tokens.rft`, `DIR/packing-S.rfp`),
//!   while the cache keeps flat file names; a *view* ([`View`]) is a small directory of symbolic
//!   links to the cached files, removed with its holder. Views left by a killed server are
//!   removed when the cache directory is next opened.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ringfeed_format::shard::ShardError;
use ringfeed_format::tokens::packing::{self, Packing};
use ringfeed_format::tokens::{TOKENS_FILE, TokenFile};

use super::cache::{CacheError, Check, CheckError, Fetch, Object, Pin};
use super::source::StoreFetch;
use super::{Hub, RemoteError, RemoteUrl};

/// The name prefix of view directories in the cache directory (see the module docs).
pub const VIEW_PREFIX: &str = ".view-";

/// Why a remote token dataset could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    /// Listing the prefix failed (access denied, no bucket, the store unreachable after the
    /// retries).
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// The cache could not hand out a checked file (the download failed, a copy failed its
    /// check, no room within the deadline).
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// The prefix holds no token dataset.
    #[error(
        "{url} is no token dataset: {why}; `ringfeed pack CORPUS --tokenizer tokenizer.json {url}` uploads one (Megatron and flat token files are served from local paths only)"
    )]
    Missing { url: String, why: String },
    /// The files a stream must hold do not fit the cache at all.
    #[error(
        "{url}: its files ({files}) are {len} bytes, more than the cache's bound of {limit} bytes; a token stream holds its dataset's files in the cache while it runs: start the server with a larger --cache-bytes (RINGFEED_CACHE_BYTES)"
    )]
    TooLarge {
        url: String,
        files: String,
        len: u64,
        limit: u64,
    },
    /// The view directory could not be made.
    #[error("{url}: making its view in the cache directory: {source}")]
    View { url: String, source: ShardError },
}

/// A directory of symbolic links (`name → target`), removed when dropped.
#[derive(Debug)]
pub struct View {
    dir: PathBuf,
}

impl View {
    /// Makes a new view directory in `parent` holding `links`.
    pub fn new(parent: &Path, links: &[(&str, &Path)]) -> Result<View, ShardError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = parent.join(format!(
            "{VIEW_PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&dir).map_err(|e| ShardError::io(&dir, e))?;
        let view = View { dir };
        for (name, target) in links {
            let link = view.dir.join(name);
            std::os::unix::fs::symlink(target, &link).map_err(|e| ShardError::io(&link, e))?;
        }
        Ok(view)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for View {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A remote token dataset's files, checked, in the cache, held there while this lives.
#[derive(Debug)]
pub struct RemoteTokens {
    url: RemoteUrl,
    /// Dropped first: the links go before the files may.
    view: View,
    /// Hard pins on `tokens.rft` and, if fetched, `packing-S.rfp`.
    _pins: Vec<Pin>,
    bytes: u64,
}

impl RemoteTokens {
    /// Lists `url`'s prefix, fetches (or finds in the cache) and checks `tokens.rft` and, with
    /// `pack_seq_len` S, `packing-S.rfp` when the prefix has one, and pins them; `fetched`
    /// counts the files checked in the cache so far (for `opening` progress). Blocking (call it
    /// off the control plane); every wait has the cache's and the store's deadlines.
    pub fn open(
        hub: &Hub,
        url: &RemoteUrl,
        pack_seq_len: Option<u32>,
        fetched: &AtomicU64,
    ) -> Result<Self, TokensError> {
        let shown = url.to_string();
        ringfeed_format::fault::install().map_err(|e| TokensError::View {
            url: shown.clone(),
            source: ShardError::io(Path::new(&shown), e),
        })?;
        let store = hub.store(url)?;
        let (listed, dirs) = store.list_dir_and_prefixes(&url.prefix)?;
        let find = |name: &str| listed.iter().find(|o| o.key == url.key(name));
        let Some(tokens) = find(TOKENS_FILE) else {
            let why = if listed.is_empty() && dirs.is_empty() {
                "nothing is stored under it".to_owned()
            } else {
                // What is there instead, by name: `index.rfi` (an image dataset), `tok/` (the
                // dataset is one level deeper), ...
                let last = |k: &str| k.trim_end_matches('/').rsplit('/').next().unwrap_or(k).to_owned();
                let names: Vec<String> = listed
                    .iter()
                    .map(|o| last(&o.key))
                    .chain(dirs.iter().map(|d| format!("{}/", last(d))))
                    .collect();
                format!(
                    "{} does not exist (the prefix holds {}{})",
                    url.object_url(TOKENS_FILE),
                    names[..names.len().min(4)].join(", "),
                    if names.len() > 4 { ", ..." } else { "" }
                )
            };
            return Err(TokensError::Missing { url: shown, why });
        };
        let packing_name = pack_seq_len.map(packing::file_name);
        let packing = packing_name.as_deref().and_then(find);
        let cache = hub.cache()?;
        let len = tokens.size + packing.map_or(0, |p| p.size);
        if len > cache.limit() {
            let mut files = TOKENS_FILE.to_owned();
            if let Some(n) = packing_name.as_deref().filter(|_| packing.is_some()) {
                files = format!("{files} and {n}");
            }
            return Err(TokensError::TooLarge {
                url: shown,
                files,
                len,
                limit: cache.limit(),
            });
        }
        let fetch = StoreFetch::new(Arc::clone(&store));
        for o in std::iter::once(tokens).chain(packing) {
            if let Some(etag) = &o.etag {
                fetch.expect(&o.key, etag);
            }
        }
        let fetch: Arc<dyn Fetch> = Arc::new(fetch);
        let object = |key: &str, len: u64, check: Arc<Check>| Object {
            key: store.cache_key(key),
            len,
            check,
            fetch: Arc::clone(&fetch),
            on_evict: None,
        };
        let tokens_obj = object(&tokens.key, tokens.size, tokens_check());
        cache.check_fits(&tokens_obj.key, tokens_obj.len)?;
        let tokens_pin = cache.get(&tokens_obj)?;
        fetched.fetch_add(1, Ordering::Relaxed);
        let mut links: Vec<(String, PathBuf)> = vec![(TOKENS_FILE.to_owned(), tokens_pin.path().to_owned())];
        let mut pins = vec![tokens_pin];
        if let (Some(p), Some(name), Some(seq_len)) = (packing, packing_name, pack_seq_len) {
            let obj = object(&p.key, p.size, packing_check(pins[0].path().to_owned(), seq_len));
            cache.check_fits(&obj.key, obj.len)?;
            let pin = cache.get(&obj)?;
            fetched.fetch_add(1, Ordering::Relaxed);
            links.push((name, pin.path().to_owned()));
            pins.push(pin);
        }
        let links: Vec<(&str, &Path)> = links.iter().map(|(n, p)| (n.as_str(), p.as_path())).collect();
        let view = View::new(cache.dir(), &links).map_err(|source| TokensError::View {
            url: shown.clone(),
            source,
        })?;
        Ok(RemoteTokens {
            url: url.clone(),
            view,
            _pins: pins,
            bytes: len,
        })
    }

    /// The dataset's URL.
    pub fn url(&self) -> &RemoteUrl {
        &self.url
    }

    /// A directory that reads as the dataset's local copy (`tokens.rft`, and the packing file
    /// fetched, if any), valid while `self` lives.
    pub fn dir(&self) -> &Path {
        self.view.dir()
    }

    /// Bytes held in the cache for this dataset.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Runs `f` on the token dataset that a view of `links` (in `file`'s directory) makes.
fn in_view<T>(
    file: &Path,
    links: &[(&str, &Path)],
    f: impl FnOnce(&Path) -> Result<T, CheckError>,
) -> Result<T, CheckError> {
    let parent = file.parent().unwrap_or(Path::new("."));
    let view = View::new(parent, links)?;
    f(view.dir())
}

/// The check of a copy of `tokens.rft`: what `ringfeed verify` checks of the file.
fn tokens_check() -> Arc<Check> {
    Arc::new(|path: &Path| {
        in_view(path, &[(TOKENS_FILE, path)], |dir| {
            let tf = TokenFile::open(dir)?;
            let r = ringfeed_format::tokens::verify::verify_file(&tf);
            if let Some(at) = tf.fault() {
                return Err(CheckError::Changed { at });
            }
            r?;
            Ok(())
        })
    })
}

/// The check of a copy of `packing-S.rfp`, against the checked `tokens.rft` at `tokens`: what a
/// local open checks, and its `tables_crc`.
fn packing_check(tokens: PathBuf, seq_len: u32) -> Arc<Check> {
    Arc::new(move |path: &Path| {
        let name = packing::file_name(seq_len);
        in_view(path, &[(TOKENS_FILE, &tokens), (&name, path)], |dir| {
            let tf = TokenFile::open(dir)?;
            let Some(p) = Packing::open(&tf, seq_len)? else {
                return Err(ShardError::io(path, std::io::ErrorKind::NotFound.into()).into());
            };
            let r = p.check_tables();
            if let Some(at) = p.fault() {
                return Err(CheckError::Changed { at });
            }
            r?;
            Ok(())
        })
    })
}
