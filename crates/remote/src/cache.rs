//! The local cache: object key → a validated local file, within a size bound.
//!
//! Generic over what is cached: a caller describes an [`Object`] (its key, its length, and a
//! check that says whether a local file is a good copy of it) and names a [`Fetch`] that can
//! download it. Packed shards are checked against their dataset's index (`source.rs`); another
//! kind of file only needs another check.
//!
//! Invariants:
//! - **Bound.** Bytes of files in the directory plus downloads in progress never exceed the
//!   bound: room is reserved before a download starts, by evicting least-recently-used files.
//! - **Pins.** A file is pinned while someone reads it ([`Pin`]) and is then never evicted.
//!   A *lease* ([`Cache::lease`]: the shards of a batch that is submitted but not yet read) is a
//!   softer pin: prefetching never evicts it, and a reader evicts it only when nothing else can
//!   make room (counted in `evictions`, logged), because waiting there could wait for ever (the
//!   leased batch may be waiting for this very download, MosaicML Streaming #417). Every reader
//!   holds at most one pin and never waits while holding it, so a bound of at least the largest
//!   object always makes progress.
//! - **One download per object.** Readers of an object that is being downloaded wait for that
//!   download (on the condition variable, with a deadline) instead of starting another.
//! - **Nothing partial is ever served.** Downloads go to `.partial-*` files, are checked, then
//!   renamed into place. Files left from an earlier run are registered as *unchecked* and checked
//!   on first use; one that fails is deleted and downloaded again. `.partial-*` leftovers are
//!   deleted at open.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ringfeed_format::shard::ShardError;

use super::{Counters, RemoteConfig, RemoteError};

/// How long a failed object keeps failing without a new download (so a gone shard under
/// `on_error = skip` is not downloaded again for each of its samples).
const FAILED_FOR: Duration = Duration::from_secs(10);

/// The most downloads at once the autotuner allows.
pub const MAX_CONCURRENCY: usize = 32;

/// Downloads beyond the first for an object whose copies fail their check (a corrupted body).
const CHECK_RETRIES: u32 = 2;

/// Downloads an object into a new local file.
pub trait Fetch: Send + Sync {
    /// Writes object `key` (`len` bytes) to the new file `dest`, synced; its own retries and
    /// deadlines included.
    fn fetch(&self, key: &str, dest: &Path, len: u64) -> Result<(), RemoteError>;
}

/// Whether a local file is a good copy of its object; `Err` says what is wrong with it.
pub type Check = dyn Fn(&Path) -> Result<(), CheckError> + Send + Sync;

/// What is wrong with a local copy of an object: the reasons of the checks of packed shards
/// (`source.rs`) and of WebDataset tars (`wds.rs`).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The copy cannot be read as its kind of file (mapped, or opened as a shard).
    #[error(transparent)]
    Read(#[from] ShardError),
    /// Reading the mapped copy raised SIGBUS at byte `at`.
    #[error("reading the file failed at byte {at} (it changed while being checked)")]
    Changed { at: u64 },
    /// A shard's body does not have the CRC-32C its dataset's index records.
    #[error("body crc {computed:#010x}, the index expects {expected:#010x}")]
    BodyCrc { computed: u32, expected: u32 },
    /// A tar's members differ from the member table its index gave at open.
    #[error(
        "{url}: its members are not those its index lists ({members} members, the index {indexed}); the tar was rewritten after it was indexed: run `ringfeed index` on it again, or delete {url}.rfidx"
    )]
    Members {
        url: String,
        members: usize,
        indexed: usize,
    },
    /// 1.10: a Parquet row group's copy does not parse as the column chunks its footer describes.
    #[error("{url}: row group {group}: {why}")]
    RowGroup { url: String, group: usize, why: String },
}

/// Why the cache could not make a checked copy of an object. A failure is kept for
/// [`FAILED_FOR`], and every reader asking for the object meanwhile gets it.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The download itself failed (after its own retries).
    #[error(transparent)]
    Store(#[from] RemoteError),
    /// The checked download could not be renamed into the cache directory.
    #[error("{}: moving the download into the cache: {source}", path.display())]
    Move { path: PathBuf, source: std::io::Error },
    /// Every download of the object failed its check; `last` is the last check's reason.
    #[error(
        "{key}: {attempts} downloads failed their check, the last: {last}; the object differs from what the dataset's index expects (repack and upload it again)"
    )]
    Check {
        key: String,
        attempts: u32,
        last: CheckError,
    },
    /// No thread could be started for the download.
    #[error("cannot start a download thread: {0}")]
    Thread(std::io::Error),
}

/// An object a caller wants as a local file.
#[derive(Clone)]
pub struct Object {
    /// The cache key: unique per object (e.g. `bucket/key`).
    pub key: String,
    /// Its exact length in bytes.
    pub len: u64,
    /// The check a file must pass before it is used.
    pub check: Arc<Check>,
    /// Who downloads it.
    pub fetch: Arc<dyn Fetch>,
    /// Called (under the cache's lock: it must not call back into the cache) when the file is
    /// evicted, so a holder of a mapping of it can let it go and its disk space is freed.
    pub on_evict: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Object")
            .field("key", &self.key)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// Why the cache could not hand out a file.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CacheError {
    #[error("the shard cache {dir}: {why}", dir = dir.display())]
    Dir { dir: PathBuf, why: String },
    #[error(
        "{key} ({len} bytes) is larger than the shard cache's bound ({limit} bytes); start the server with a larger --cache-bytes (RINGFEED_CACHE_BYTES)"
    )]
    TooLarge { key: String, len: u64, limit: u64 },
    #[error(
        "no room in the shard cache {dir} ({limit} bytes) for {key} ({len} bytes) within {secs:.0} s: every file in it is being read; raise --cache-bytes (RINGFEED_CACHE_BYTES)", dir = dir.display()
    )]
    Full {
        dir: PathBuf,
        key: String,
        len: u64,
        limit: u64,
        secs: f64,
    },
    /// The object's download failed (now, or less than [`FAILED_FOR`] ago).
    #[error(transparent)]
    Fetch(Arc<FetchError>),
    #[error(
        "{key}: no download finished within {secs:.0} s; raise --fetch-timeout (RINGFEED_FETCH_TIMEOUT) or check the store"
    )]
    Timeout { key: String, secs: f64 },
}

#[derive(Debug, Clone)]
enum State {
    /// Found in the directory at open, not yet checked.
    Unchecked,
    Fetching,
    Ready,
    /// The last download failed, with this error, at this time.
    Failed(Arc<FetchError>, Instant),
}

struct Entry {
    state: State,
    len: u64,
    /// Readers now.
    pins: u32,
    /// Batches submitted and not yet read that need it.
    leases: u32,
    /// Downloaded ahead and not read since.
    fresh: bool,
    last_use: u64,
    /// Changes whenever the file is replaced (a new download), so a mapping of an older copy
    /// can tell.
    generation: u64,
    on_evict: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("state", &self.state)
            .field("len", &self.len)
            .field("pins", &self.pins)
            .field("leases", &self.leases)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// By file name in the directory.
    entries: HashMap<String, Entry>,
    /// Bytes of entries present or being downloaded.
    used: u64,
    /// Downloads running.
    running: usize,
    clock: u64,
    /// Uses of a lease-pinned file's room, logged once.
    warned: bool,
}

/// The cache of one server.
#[derive(Debug)]
pub struct Cache {
    dir: PathBuf,
    limit: u64,
    /// Downloads allowed at once: `--fetch-concurrency` when pinned, else the autotuner's
    /// (`ringfeed_serve::tune::fetch_concurrency`); read at every admission, so a change applies to the
    /// next download.
    concurrency: AtomicUsize,
    /// Whether `--fetch-concurrency` pins it (the tuner leaves it alone).
    pinned: bool,
    /// The largest object checked to fit ([`Cache::check_fits`]): the bound leaves room for
    /// `limit / largest` downloads at once.
    largest: AtomicU64,
    /// How long a reader waits for a download or for room before it gives up.
    wait_limit: Duration,
    inner: Mutex<Inner>,
    changed: Condvar,
    counters: Arc<Counters>,
    partials: AtomicU64,
}

/// A reader's hold on a cached file: it stays in place until this is dropped.
#[derive(Debug)]
pub struct Pin {
    cache: Arc<Cache>,
    name: String,
    path: PathBuf,
    lease: bool,
    generation: u64,
}

impl Pin {
    /// The local file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Which copy of the object the file is: changes with every download of it.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut inner = self.cache.lock();
        if let Some(e) = inner.entries.get_mut(&self.name) {
            if self.lease {
                e.leases = e.leases.saturating_sub(1);
            } else {
                e.pins = e.pins.saturating_sub(1);
            }
        }
        drop(inner);
        self.cache.changed.notify_all();
    }
}

/// The file name an object key is cached under: the key with every byte outside
/// `[A-Za-z0-9._-]` percent-encoded (so `/` too), or, past 200 bytes, a hash of it with its tail.
pub fn file_name(key: &str) -> String {
    let mut s = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b"._-".contains(&b) {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    if s.starts_with('.') {
        s.replace_range(0..1, "%2E");
    }
    if s.len() > 200 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in key.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        let tail: String = s
            .chars()
            .rev()
            .take(100)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        s = format!("h{h:016x}-{tail}");
    }
    s
}

impl Cache {
    /// Opens (creating it if needed) the cache directory: deletes `.partial-*` leftovers and
    /// registers every other file as unchecked, oldest first; evicts until within the bound.
    pub fn open(config: &RemoteConfig, counters: Arc<Counters>) -> Result<Arc<Cache>, CacheError> {
        let dir = config.cache_dir.clone();
        let err = |why: String| CacheError::Dir { dir: dir.clone(), why };
        std::fs::create_dir_all(&dir)
            .map_err(|e| err(format!("cannot create it: {e}; set --cache-dir (RINGFEED_CACHE_DIR)")))?;
        let mut found = Vec::new();
        for ent in std::fs::read_dir(&dir).map_err(|e| err(format!("cannot list it: {e}")))? {
            let ent = ent.map_err(|e| err(format!("cannot list it: {e}")))?;
            let name = ent.file_name().to_string_lossy().into_owned();
            let Ok(meta) = ent.metadata() else { continue };
            if !meta.is_file() {
                // A token dataset's view (`tokens.rs`) left by a server that was killed: its
                // links point at files that are registered below like any other.
                if meta.is_dir() && name.starts_with(super::tokens::VIEW_PREFIX) {
                    let _ = std::fs::remove_dir_all(ent.path());
                }
                continue;
            }
            if name.starts_with(".partial-") {
                let _ = std::fs::remove_file(ent.path());
                continue;
            }
            found.push((meta.modified().ok(), name, meta.len()));
        }
        found.sort();
        let mut inner = Inner::default();
        for (_, name, len) in found {
            inner.clock += 1;
            inner.used += len;
            inner.entries.insert(
                name,
                Entry {
                    state: State::Unchecked,
                    len,
                    pins: 0,
                    leases: 0,
                    fresh: false,
                    last_use: inner.clock,
                    generation: 0,
                    on_evict: None,
                },
            );
        }
        let cache = Arc::new(Cache {
            dir,
            limit: config.cache_bytes,
            concurrency: AtomicUsize::new(config.concurrency.max(1)),
            pinned: config.concurrency_pinned,
            largest: AtomicU64::new(0),
            wait_limit: config.timeout.saturating_mul(config.retries + 2) + Duration::from_secs(30),
            inner: Mutex::new(inner),
            changed: Condvar::new(),
            counters,
            partials: AtomicU64::new(0),
        });
        {
            let mut inner = cache.lock();
            cache.make_room(&mut inner, 0, Need::Prefetch);
            cache.publish(&inner);
        }
        Ok(cache)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The bound, in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes held now (files and downloads in progress).
    pub fn used(&self) -> u64 {
        self.lock().used
    }

    fn publish(&self, inner: &Inner) {
        self.counters.cache_used.store(inner.used, Ordering::Relaxed);
    }

    /// Downloads allowed at once now.
    pub fn concurrency(&self) -> usize {
        self.concurrency.load(Ordering::Relaxed)
    }

    /// Whether `--fetch-concurrency` pins the concurrency.
    pub fn pinned(&self) -> bool {
        self.pinned
    }

    /// The most downloads at once worth allowing: as many of the largest object as the bound
    /// holds (more would wait for room), at most [`MAX_CONCURRENCY`].
    pub fn max_concurrency(&self) -> usize {
        let largest = self.largest.load(Ordering::Relaxed).max(1);
        ((self.limit / largest) as usize).clamp(1, MAX_CONCURRENCY)
    }

    /// Sets the downloads allowed at once (the autotuner), within `1..=max_concurrency()`.
    pub fn set_concurrency(&self, n: usize) {
        let n = n.clamp(1, self.max_concurrency());
        self.concurrency.store(n, Ordering::Relaxed);
        self.counters.concurrency.store(n as u64, Ordering::Relaxed);
        // Readers waiting for a download slot may start one now.
        self.changed.notify_all();
    }

    /// Downloads running now.
    pub fn running(&self) -> usize {
        self.lock().running
    }

    /// Refuses an object that can never fit.
    pub fn check_fits(&self, key: &str, len: u64) -> Result<(), CacheError> {
        self.largest.fetch_max(len, Ordering::Relaxed);
        if len > self.limit {
            return Err(CacheError::TooLarge {
                key: key.to_owned(),
                len,
                limit: self.limit,
            });
        }
        Ok(())
    }

    /// Evicts until `len` more bytes fit; `false` if they cannot. Victims, least recently used
    /// first: files nobody reads or leases (a prefetch also spares files downloaded ahead and
    /// not read yet); then, for a reader only, leased files.
    fn make_room(&self, inner: &mut Inner, len: u64, need: Need) -> bool {
        while inner.used + len > self.limit {
            let pick = |inner: &Inner, leased: bool| {
                inner
                    .entries
                    .iter()
                    .filter(|(_, e)| matches!(e.state, State::Ready | State::Unchecked) && e.pins == 0)
                    .filter(|(_, e)| leased || e.leases == 0)
                    .filter(|(_, e)| need == Need::Read || !e.fresh)
                    .min_by_key(|(_, e)| e.last_use)
                    .map(|(n, _)| n.clone())
            };
            let victim = match pick(inner, false) {
                Some(v) => v,
                None if need == Need::Read => match pick(inner, true) {
                    Some(v) => {
                        if !inner.warned {
                            inner.warned = true;
                            tracing::warn!(
                                "the shard cache {} ({} bytes) is too small for the batches in flight: a shard a pending batch needs is evicted and will be downloaded again; raise --cache-bytes, or use fewer slots or an order that reads few shards at a time",
                                self.dir.display(),
                                self.limit
                            );
                        }
                        v
                    }
                    None => return false,
                },
                None => return false,
            };
            let e = inner.entries.remove(&victim).expect("picked from the map");
            inner.used -= e.len;
            if let Some(f) = &e.on_evict {
                f();
            }
            let _ = std::fs::remove_file(self.dir.join(&victim));
            Counters::bump(&self.counters.evictions);
        }
        true
    }

    /// A pin on `obj`'s file, downloading (or checking) it first if needed. Blocks; every wait
    /// has a deadline.
    pub fn get(self: &Arc<Self>, obj: &Object) -> Result<Pin, CacheError> {
        self.check_fits(&obj.key, obj.len)?;
        let name = file_name(&obj.key);
        let started = Instant::now();
        let deadline = started + self.wait_limit;
        let mut inner = self.lock();
        let mut waited = false;
        loop {
            inner.clock += 1;
            let clock = inner.clock;
            let state = inner.entries.get(&name).map(|e| e.state.clone());
            match state {
                Some(State::Ready) => {
                    let e = inner.entries.get_mut(&name).expect("present");
                    e.pins += 1;
                    e.fresh = false;
                    e.last_use = clock;
                    if e.on_evict.is_none() {
                        e.on_evict.clone_from(&obj.on_evict);
                    }
                    let generation = e.generation;
                    if waited {
                        self.counters
                            .wait_ns
                            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    } else {
                        Counters::bump(&self.counters.hits);
                    }
                    return Ok(self.pin(name, false, generation));
                }
                Some(State::Failed(failed, at)) if at.elapsed() < FAILED_FOR => return Err(CacheError::Fetch(failed)),
                Some(State::Fetching) => {}
                Some(State::Unchecked) if inner.running < self.concurrency() => {
                    let e = inner.entries.get_mut(&name).expect("present");
                    e.state = State::Fetching;
                    e.on_evict.clone_from(&obj.on_evict);
                    self.spawn(&mut inner, obj.clone(), name.clone(), true);
                    if !waited {
                        Counters::bump(&self.counters.misses);
                    }
                }
                Some(State::Unchecked) => {}
                Some(State::Failed(..)) | None => {
                    if inner.running < self.concurrency() {
                        if let Some(old) = inner.entries.remove(&name) {
                            inner.used -= old.len;
                        }
                        if self.make_room(&mut inner, obj.len, Need::Read) {
                            self.insert_fetching(&mut inner, &name, obj, false);
                            self.spawn(&mut inner, obj.clone(), name.clone(), false);
                            if !waited {
                                Counters::bump(&self.counters.misses);
                            }
                        }
                    }
                }
            }
            if !waited && !matches!(inner.entries.get(&name).map(|e| &e.state), Some(State::Ready)) {
                waited = true;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(match inner.entries.get(&name).map(|e| &e.state) {
                    Some(State::Fetching) => CacheError::Timeout {
                        key: obj.key.clone(),
                        secs: self.wait_limit.as_secs_f64(),
                    },
                    _ => CacheError::Full {
                        dir: self.dir.clone(),
                        key: obj.key.clone(),
                        len: obj.len,
                        limit: self.limit,
                        secs: self.wait_limit.as_secs_f64(),
                    },
                });
            }
            let (g, _) = self
                .changed
                .wait_timeout(inner, (deadline - now).min(Duration::from_millis(500)))
                .unwrap_or_else(|p| p.into_inner());
            inner = g;
        }
    }

    /// Starts downloading `obj` ahead of its readers if there is a free download slot and room
    /// without evicting anything leased, read, or downloaded ahead and not yet read. Never
    /// blocks. Returns `false` when it could not (the caller stops prefetching for now).
    pub fn prefetch(self: &Arc<Self>, obj: &Object) -> bool {
        if obj.len > self.limit {
            return false;
        }
        let name = file_name(&obj.key);
        let mut inner = self.lock();
        match inner.entries.get(&name).map(|e| e.state.clone()) {
            Some(State::Ready | State::Fetching) => return true,
            Some(State::Failed(_, at)) if at.elapsed() < FAILED_FOR => return true,
            _ => {}
        }
        if inner.running >= self.concurrency() {
            return false;
        }
        if let Some(State::Unchecked) = inner.entries.get(&name).map(|e| e.state.clone()) {
            let e = inner.entries.get_mut(&name).expect("present");
            e.state = State::Fetching;
            e.fresh = true;
            e.on_evict.clone_from(&obj.on_evict);
            self.spawn(&mut inner, obj.clone(), name, true);
            return true;
        }
        if let Some(old) = inner.entries.remove(&name) {
            inner.used -= old.len;
        }
        if !self.make_room(&mut inner, obj.len, Need::Prefetch) {
            self.publish(&inner);
            return false;
        }
        self.insert_fetching(&mut inner, &name, obj, true);
        Counters::bump(&self.counters.prefetches);
        self.spawn(&mut inner, obj.clone(), name, false);
        true
    }

    /// Prefetches the objects the next reads need, in the order they first need them: the
    /// first upcoming sample's object first (the one a reader waits for), then each further one,
    /// until `ahead` objects beyond the first have started, every one of the `count` objects has,
    /// or a download cannot start now. `object_of` maps a sample to its object's number,
    /// `object` a number to the object (a remote source's shards or tars).
    pub fn prefetch_upcoming<'o>(
        self: &Arc<Self>,
        upcoming: &mut dyn Iterator<Item = u64>,
        ahead: usize,
        count: usize,
        object_of: impl Fn(u64) -> Option<u32>,
        object: impl Fn(u32) -> &'o Object,
    ) {
        let mut seen: Vec<u32> = Vec::with_capacity(ahead + 1);
        for i in upcoming {
            let Some(n) = object_of(i) else { continue };
            if seen.contains(&n) {
                continue;
            }
            seen.push(n);
            if !self.prefetch(object(n)) || seen.len() > ahead || seen.len() == count {
                break;
            }
        }
    }

    /// Leases on the files of the objects `numbers` name (each once) that are in the cache now,
    /// for [`Source::lease`](ringfeed_source::Source::lease): the batch's shards or tars.
    pub fn lease_objects<'o>(
        self: &Arc<Self>,
        numbers: impl Iterator<Item = u32>,
        object: impl Fn(u32) -> &'o Object,
    ) -> Vec<Pin> {
        let mut numbers: Vec<u32> = numbers.collect();
        numbers.sort_unstable();
        numbers.dedup();
        numbers.into_iter().filter_map(|n| self.lease(&object(n).key)).collect()
    }

    /// A lease on `key`'s file if it is in the cache now (see the module docs); never blocks.
    pub fn lease(self: &Arc<Self>, key: &str) -> Option<Pin> {
        let name = file_name(key);
        let mut inner = self.lock();
        let e = inner.entries.get_mut(&name)?;
        if !matches!(e.state, State::Ready | State::Fetching | State::Unchecked) {
            return None;
        }
        e.leases += 1;
        let generation = e.generation;
        drop(inner);
        Some(self.pin(name, true, generation))
    }

    fn pin(self: &Arc<Self>, name: String, lease: bool, generation: u64) -> Pin {
        Pin {
            path: self.dir.join(&name),
            cache: Arc::clone(self),
            name,
            lease,
            generation,
        }
    }

    fn insert_fetching(&self, inner: &mut Inner, name: &str, obj: &Object, fresh: bool) {
        let len = obj.len;
        inner.clock += 1;
        inner.used += len;
        let last_use = inner.clock;
        inner.entries.insert(
            name.to_owned(),
            Entry {
                state: State::Fetching,
                len,
                pins: 0,
                leases: 0,
                fresh,
                last_use,
                generation: 0,
                on_evict: obj.on_evict.clone(),
            },
        );
        self.publish(inner);
    }

    /// Runs the download (or, for an unchecked file, first the check) on a thread of its own.
    fn spawn(self: &Arc<Self>, inner: &mut Inner, obj: Object, name: String, unchecked: bool) {
        inner.running += 1;
        let cache = Arc::clone(self);
        let key = name.clone();
        let spawned = std::thread::Builder::new()
            .name("ringfeed-fetch".into())
            .spawn(move || cache.job(&obj, &name, unchecked));
        if let Err(e) = spawned {
            inner.running -= 1;
            let freed = inner.entries.get_mut(&key).map_or(0, |en| {
                en.state = State::Failed(Arc::new(FetchError::Thread(e)), Instant::now());
                std::mem::take(&mut en.len)
            });
            inner.used -= freed;
        }
    }

    fn job(&self, obj: &Object, name: &str, unchecked: bool) {
        let path = self.dir.join(name);
        let started = Instant::now();
        let result = self.produce(obj, &path, unchecked);
        self.counters
            .fetch_busy_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let mut guard = self.lock();
        let inner = &mut *guard;
        inner.running -= 1;
        match result {
            Ok(()) => {
                inner.clock += 1;
                let generation = inner.clock;
                if let Some(e) = inner.entries.get_mut(name) {
                    e.state = State::Ready;
                    e.generation = generation;
                    // An unchecked file's length was its size on disk; now it is the object's.
                    inner.used = inner.used - e.len + obj.len;
                    e.len = obj.len;
                }
            }
            Err(failed) => {
                let _ = std::fs::remove_file(&path);
                if let Some(e) = inner.entries.get_mut(name) {
                    e.state = State::Failed(Arc::new(failed), Instant::now());
                    inner.used -= e.len;
                    e.len = 0;
                }
            }
        }
        self.publish(inner);
        drop(guard);
        self.changed.notify_all();
    }

    /// Makes `path` a checked copy of `obj`: checks a file found at open, else downloads it to a
    /// partial file, checks that, and renames it into place.
    fn produce(&self, obj: &Object, path: &Path, unchecked: bool) -> Result<(), FetchError> {
        if unchecked {
            match (obj.check)(path) {
                Ok(()) => {
                    Counters::bump(&self.counters.reused);
                    return Ok(());
                }
                Err(why) => {
                    Counters::bump(&self.counters.rejected);
                    tracing::warn!(
                        "{}: the cached copy fails its check ({why}); downloading it again",
                        obj.key
                    );
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        let mut last = None;
        for attempt in 0..=CHECK_RETRIES {
            if attempt > 0 {
                Counters::bump(&self.counters.retries);
            }
            let partial = self.dir.join(format!(
                ".partial-{}-{}",
                std::process::id(),
                self.partials.fetch_add(1, Ordering::Relaxed)
            ));
            let fetched = obj.fetch.fetch(&obj.key, &partial, obj.len);
            if let Err(e) = fetched {
                let _ = std::fs::remove_file(&partial);
                return Err(e.into());
            }
            match (obj.check)(&partial) {
                Ok(()) => {
                    std::fs::rename(&partial, path).map_err(|source| {
                        let _ = std::fs::remove_file(&partial);
                        FetchError::Move {
                            path: path.to_owned(),
                            source,
                        }
                    })?;
                    return Ok(());
                }
                Err(why) => {
                    Counters::bump(&self.counters.rejected);
                    let _ = std::fs::remove_file(&partial);
                    tracing::warn!("{}: the downloaded copy fails its check ({why})", obj.key);
                    last = Some(why);
                }
            }
        }
        Counters::bump(&self.counters.errors);
        Err(FetchError::Check {
            key: obj.key.clone(),
            attempts: CHECK_RETRIES + 1,
            last: last.expect("every attempt that did not return failed its check"),
        })
    }
}

impl Cache {
    /// Nanoseconds readers have waited for downloads, in all (the autotuner's signal).
    pub fn waited_ns(&self) -> u64 {
        self.counters.wait_ns.load(Ordering::Relaxed)
    }

    /// Nanoseconds downloads have been in flight, summed over downloads.
    pub fn busy_ns(&self) -> u64 {
        self.counters.fetch_busy_ns.load(Ordering::Relaxed)
    }
}

/// Who asks for room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    /// A reader: may evict files downloaded ahead, and, as a last resort, leased ones.
    Read,
    /// A prefetch: never evicts leased, read or ahead-downloaded files.
    Prefetch,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Writes `len` copies of the key's first byte; counts calls.
    struct Fake {
        calls: AtomicUsize,
        delay: Duration,
    }
    impl Fetch for Fake {
        fn fetch(&self, key: &str, dest: &Path, len: u64) -> Result<(), RemoteError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(self.delay);
            std::fs::write(dest, vec![key.as_bytes()[0]; len as usize]).map_err(|e| RemoteError::Io {
                path: dest.to_owned(),
                source: e,
            })
        }
    }

    fn config(dir: &Path, bytes: u64) -> RemoteConfig {
        RemoteConfig {
            cache_dir: dir.to_owned(),
            cache_bytes: bytes,
            concurrency: 2,
            concurrency_pinned: true,
            prefetch_shards: 2,
            timeout: Duration::from_secs(5),
            retries: 1,
            backoff: Duration::from_millis(1),
        }
    }

    fn obj(key: &str, len: u64, fetch: &Arc<Fake>) -> Object {
        let k = key.as_bytes()[0];
        Object {
            key: key.to_owned(),
            len,
            check: Arc::new(move |p: &Path| {
                let b = std::fs::read(p).map_err(|e| ShardError::io(p, e))?;
                if b.len() as u64 == len && b.iter().all(|&x| x == k) {
                    Ok(())
                } else {
                    Err(CheckError::BodyCrc {
                        computed: ringfeed_format::shard::crc(&b),
                        expected: ringfeed_format::shard::crc(&vec![k; len as usize]),
                    })
                }
            }),
            fetch: Arc::clone(fetch) as Arc<dyn Fetch>,
            on_evict: None,
        }
    }

    fn dir_bytes(d: &Path) -> u64 {
        std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum()
    }

    #[test]
    fn names_are_flat_and_distinct() {
        assert_eq!(file_name("b/p/shard-000001.rfs"), "b%2Fp%2Fshard-000001.rfs");
        assert_ne!(file_name("a/b"), file_name("a%2Fb"));
        assert!(!file_name(".x").starts_with('.'));
        let long = "k/".repeat(300);
        assert!(file_name(&long).len() <= 120);
        assert_ne!(file_name(&long), file_name(&(long.clone() + "x")));
    }

    #[test]
    fn one_download_serves_concurrent_readers_and_the_bound_holds() {
        let d = tempfile::tempdir().unwrap();
        let cache = Cache::open(&config(d.path(), 250), Arc::default()).unwrap();
        let fake = Arc::new(Fake {
            calls: AtomicUsize::new(0),
            delay: Duration::from_millis(100),
        });
        let a = obj("a", 100, &fake);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| drop(cache.get(&a).unwrap()));
            }
        });
        assert_eq!(fake.calls.load(Ordering::SeqCst), 1);
        for k in ["b", "c", "d", "e"] {
            let p = cache.get(&obj(k, 100, &fake)).unwrap();
            assert!(dir_bytes(d.path()) <= 250);
            assert_eq!(std::fs::read(p.path()).unwrap()[0], k.as_bytes()[0]);
        }
        assert!(cache.used() <= 250);
        assert!(matches!(
            cache.get(&obj("z", 251, &fake)),
            Err(CacheError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_pinned_file_is_never_evicted() {
        let d = tempfile::tempdir().unwrap();
        let cache = Cache::open(&config(d.path(), 200), Arc::default()).unwrap();
        let fake = Arc::new(Fake {
            calls: AtomicUsize::new(0),
            delay: Duration::ZERO,
        });
        let held = cache.get(&obj("a", 100, &fake)).unwrap();
        for k in ["b", "c", "d"] {
            drop(cache.get(&obj(k, 100, &fake)).unwrap());
            assert!(held.path().exists());
        }
        // The bound leaves room for one more only: a second reader waits for the first's pin.
        let c2 = Arc::clone(&cache);
        let f2 = Arc::clone(&fake);
        let t = std::thread::spawn(move || c2.get(&obj("e", 150, &f2)).map(drop));
        std::thread::sleep(Duration::from_millis(200));
        assert!(held.path().exists() && !t.is_finished(), "e waits for room");
        drop(held);
        t.join().unwrap().unwrap();
    }

    #[test]
    fn files_from_before_are_checked_reused_or_replaced() {
        let d = tempfile::tempdir().unwrap();
        let counters: Arc<Counters> = Arc::default();
        let fake = Arc::new(Fake {
            calls: AtomicUsize::new(0),
            delay: Duration::ZERO,
        });
        {
            let cache = Cache::open(&config(d.path(), 1000), Arc::clone(&counters)).unwrap();
            drop(cache.get(&obj("a", 10, &fake)).unwrap());
            drop(cache.get(&obj("b", 10, &fake)).unwrap());
        }
        std::fs::write(d.path().join(".partial-1-1"), b"junk").unwrap();
        std::fs::write(d.path().join(file_name("b")), b"bbbbbbbbbX").unwrap();
        let cache = Cache::open(&config(d.path(), 1000), Arc::clone(&counters)).unwrap();
        assert!(!d.path().join(".partial-1-1").exists());
        drop(cache.get(&obj("a", 10, &fake)).unwrap());
        assert_eq!(fake.calls.load(Ordering::SeqCst), 2, "a valid file is reused");
        let b = cache.get(&obj("b", 10, &fake)).unwrap();
        assert_eq!(fake.calls.load(Ordering::SeqCst), 3, "a tampered file is fetched again");
        assert_eq!(std::fs::read(b.path()).unwrap(), b"bbbbbbbbbb");
        let s = counters.snapshot();
        assert_eq!((s.reused, s.rejected), (1, 1));
    }
}
