//! WebDataset tars on object storage (`s3://bucket/prefix/shard-*.tar`, a brace pattern, one
//! `.tar` key, or a prefix holding `*.tar` objects) as a [`Source`]: each tar is a file of the
//! shard [`Cache`], read in place by the local WebDataset reader's sample logic
//! ([`ringfeed_source::wds::Catalog`]) once its download is complete and checked.
//!
//! At open, every tar's member table is needed (for the sample count and the order), without
//! downloading every tar. For each tar, in this order of preference (`proto/webdataset.md`,
//! "Tars in a store", 1.1):
//! 1. an index kept in the cache directory (`CACHE/indexes/`) stamped with the object's ETag;
//! 2. the store's own `TAR.rfidx` beside the tar, when it matches the object (its length, its
//!    ETag when it records one, else the member headers it names, read by two ranged GETs);
//! 3. else the tar is downloaded into the cache and scanned, and the index it gives is kept in
//!    `CACHE/indexes/` stamped with the ETag, for the next open.
//!
//! Invariants:
//! - A tar's samples are served only from a cached copy whose members are exactly those of the
//!   member table fixed at open (the cache's check scans the copy's headers): a stale or wrong
//!   index never serves bytes of another layout, and a tar rewritten under a running job is
//!   reported (its ETag, as for packed shards).
//! - Every tar fits the cache's bound (checked at open, naming the tar and `--cache-bytes`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::cache::{CacheError, Check, CheckError, Fetch, Object, Pin, file_name};
use super::source::{OpenError, StoreFetch};
use super::store::Listed;
use super::{Cache, Hub, RemoteError, RemoteUrl, Store};
use ringfeed_format::shard::reader::Mapped;
use ringfeed_source::listing::Problem;
use ringfeed_source::wds::{Catalog, WdsOptions, index, pattern, tar};
use ringfeed_source::{Extra, FieldKind, Sample, SampleReader, Source, SourceError};

/// The subdirectory of the cache directory holding the index files made from cached tars.
pub const INDEX_DIR: &str = "indexes";

/// Whether `url` names tars by itself (a pattern, or a key ending in `.tar`) rather than a
/// prefix that may hold a packed dataset.
pub fn names_tars(url: &RemoteUrl) -> bool {
    pattern::is_pattern(&url.prefix) || url.prefix.ends_with(".tar")
}

/// The tars `url` names, in order, and the index files (`TAR.rfidx`) listed beside them.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub tars: Vec<Listed>,
    /// By key.
    pub indexes: BTreeMap<String, Listed>,
}

/// Lists what `url` names: a pattern's matches (braces expanded first, then `*` and `?` in the
/// last component, each glob's matches in key order), one `.tar` key, or every `*.tar` object
/// directly under the prefix. One LIST per distinct parent "directory".
pub fn list_tars(store: &Store, url: &RemoteUrl) -> Result<Listing, RemoteError> {
    list_objects(
        store,
        url,
        ".tar",
        pattern::is_pattern(&url.prefix) || url.prefix.ends_with(".tar"),
    )
    .map_err(|e| match e {
        RemoteError::Other { url, why } if why.starts_with("no .tar object") => RemoteError::Other {
            url,
            why: format!("{why} (and no packed dataset is there: no index.rfi)"),
        },
        e => e,
    })
}

/// [`list_tars`] for objects named `*SUFFIX` (`.tar`, `.parquet`): `named` says whether the URL
/// names them itself (a pattern or one key) rather than a prefix holding them. Index files
/// (`*.tar.rfidx`) seen on the way are listed too.
pub fn list_objects(store: &Store, url: &RemoteUrl, suffix: &str, named: bool) -> Result<Listing, RemoteError> {
    let bad = |why: String| RemoteError::Url {
        url: url.to_string(),
        why,
    };
    let mut dirs: BTreeMap<String, Vec<Listed>> = BTreeMap::new();
    let mut listing = Listing::default();
    let mut list = |dir: &str, listing: &mut Listing| -> Result<Vec<Listed>, RemoteError> {
        if let Some(l) = dirs.get(dir) {
            return Ok(l.clone());
        }
        let l = store.list_dir(dir)?;
        for o in &l {
            if o.key.ends_with(".tar.rfidx") {
                listing.indexes.insert(o.key.clone(), o.clone());
            }
        }
        dirs.insert(dir.to_owned(), l.clone());
        Ok(l)
    };
    let split = |key: &str| -> (String, String) {
        match key.rsplit_once('/') {
            Some((d, n)) => (d.to_owned(), n.to_owned()),
            None => (String::new(), key.to_owned()),
        }
    };
    if !named {
        let l = list(&url.prefix, &mut listing)?;
        listing.tars = l.into_iter().filter(|o| o.key.ends_with(suffix)).collect();
    } else {
        for key in pattern::expand_braces(&url.prefix).map_err(|e| bad(e.to_string()))? {
            let (dir, name) = split(&key);
            if dir.contains(['*', '?']) {
                return Err(bad(format!(
                    "`*` and `?` may only match in the last component, not in {dir}"
                )));
            }
            let l = list(&dir, &mut listing)?;
            let base = |o: &Listed| split(&o.key).1;
            if name.contains(['*', '?']) {
                listing.tars.extend(
                    l.into_iter()
                        .filter(|o| pattern::glob_match(name.as_bytes(), base(o).as_bytes())),
                );
            } else {
                match l.into_iter().find(|o| o.key == key) {
                    Some(o) => listing.tars.push(o),
                    None => {
                        return Err(RemoteError::Gone { url: url.key_url(&key) });
                    }
                }
            }
            if listing.tars.len() > pattern::MAX_PATHS {
                return Err(bad(format!("it matches more than {} objects", pattern::MAX_PATHS)));
            }
        }
    }
    if listing.tars.is_empty() {
        return Err(RemoteError::Other {
            url: url.to_string(),
            why: format!("no {suffix} object matches it"),
        });
    }
    Ok(listing)
}

/// Why a tar's member table cannot be had from an index file ([`check_index`]: the tar is then
/// indexed from a download), or at all (the open fails, naming the tar).
#[derive(Debug, thiserror::Error)]
pub enum TarIndexError {
    /// The index file is unreadable or does not match the tar's member headers.
    #[error(transparent)]
    Index(#[from] index::IndexError),
    /// The index was made for a tar of another length.
    #[error("it was made for a tar of {made} bytes, the object has {len}")]
    Length { made: u64, len: u64 },
    /// The index was made for another version of the object.
    #[error("it was made for the object's etag {made}, it now has {now}")]
    Etag { made: String, now: String },
    /// Reading the index, or the headers it names, from the store failed.
    #[error(transparent)]
    Store(#[from] RemoteError),
    /// The tar could not be downloaded into the cache.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// The cache handed out the download without running the tar's check.
    #[error("{url}: the download was not checked")]
    Unchecked { url: String },
}

/// A tar's mapping and the cache generation of the file it maps.
type Mapping = Arc<Mutex<Option<(u64, Arc<Mapped>)>>>;

/// One tar of the dataset.
struct Slot {
    object: Object,
    map: Mapping,
}

/// WebDataset tars on object storage.
pub struct RemoteWdsSource {
    catalog: Catalog,
    slots: Vec<Slot>,
    cache: Arc<Cache>,
    prefetch_shards: usize,
    /// How each tar's member table was had at open: from the cache's index files, from the
    /// store's index files, and by downloading and scanning the tar.
    pub from_cache: u64,
    pub from_store: u64,
    pub scanned: u64,
}

impl std::fmt::Debug for RemoteWdsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteWdsSource")
            .field("name", &self.catalog.name())
            .field("tars", &self.slots.len())
            .finish_non_exhaustive()
    }
}

/// How a tar's member table was had.
enum Had {
    Cache,
    Store,
    Scanned,
}

impl RemoteWdsSource {
    /// Lists the tars `url` names and finds every one's member table (above), on up to
    /// `threads` threads, counting members in `listed` and stopping when `cancel` is set.
    /// Blocking (call it off the control plane).
    pub fn open(
        hub: &Hub,
        url: &RemoteUrl,
        opts: &WdsOptions,
        threads: usize,
        cancel: &AtomicBool,
        listed: &AtomicU64,
    ) -> Result<Self, OpenError> {
        let name = url.to_string();
        ringfeed_format::fault::install().map_err(|e| ringfeed_format::shard::ShardError::io(Path::new(&name), e))?;
        let store = hub.store(url)?;
        let cache = hub.cache()?;
        let listing = list_tars(&store, url)?;
        let fetch = Arc::new(StoreFetch::new(Arc::clone(&store)));
        let mut tables: Vec<Arc<OnceLock<tar::Scan>>> = Vec::with_capacity(listing.tars.len());
        let mut slots = Vec::with_capacity(listing.tars.len());
        for o in &listing.tars {
            let key = store.cache_key(&o.key);
            cache.check_fits(&key, o.size)?;
            if let Some(e) = &o.etag {
                fetch.expect(&o.key, e);
            }
            let table: Arc<OnceLock<tar::Scan>> = Arc::default();
            let map: Mapping = Arc::default();
            let on_evict = {
                let map = Arc::clone(&map);
                Arc::new(move || *map.lock().unwrap_or_else(|p| p.into_inner()) = None) as Arc<dyn Fn() + Send + Sync>
            };
            slots.push(Slot {
                object: Object {
                    check: tar_check(Arc::clone(&table), store.url(&o.key)),
                    key,
                    len: o.size,
                    fetch: Arc::clone(&fetch) as Arc<dyn Fetch>,
                    on_evict: Some(on_evict),
                },
                map,
            });
            tables.push(table);
        }
        let index_dir = cache.dir().join(INDEX_DIR);
        std::fs::create_dir_all(&index_dir).map_err(|e| RemoteError::Io {
            path: index_dir.clone(),
            source: e,
        })?;
        let next = AtomicUsize::new(0);
        let results: Vec<Mutex<Option<Result<Had, TarIndexError>>>> = slots.iter().map(|_| Mutex::new(None)).collect();
        std::thread::scope(|s| {
            for _ in 0..threads.clamp(1, slots.len().max(1)) {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= slots.len() || cancel.load(Ordering::Relaxed) {
                            return;
                        }
                        let ctx = TarCtx {
                            store: &store,
                            fetch: &fetch,
                            cache: &cache,
                            listed: &listing.tars[i],
                            object: &slots[i].object,
                            table: &tables[i],
                            index_dir: &index_dir,
                            indexes: &listing.indexes,
                        };
                        let r = ctx.member_table();
                        if let Some(t) = tables[i].get() {
                            listed.fetch_add(t.members.len() as u64, Ordering::Relaxed);
                        }
                        *results[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                    }
                });
            }
        });
        if cancel.load(Ordering::Relaxed) {
            return Err(RemoteError::Other {
                url: name,
                why: "listing was cancelled: every stream that asked for it has gone".into(),
            }
            .into());
        }
        let mut source = RemoteWdsSource {
            catalog: Catalog::new(&name, opts),
            slots,
            cache,
            prefetch_shards: hub.config.prefetch_shards,
            from_cache: 0,
            from_store: 0,
            scanned: 0,
        };
        for (i, r) in results.into_iter().enumerate() {
            let r = r
                .into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .expect("every tar was indexed");
            let tar_url = PathBuf::from(url.key_url(&listing.tars[i].key));
            match r {
                Ok(had) => {
                    match had {
                        Had::Cache => source.from_cache += 1,
                        Had::Store => source.from_store += 1,
                        Had::Scanned => source.scanned += 1,
                    }
                    let scan = tables[i].get().cloned().expect("set by member_table");
                    source.catalog.add(tar_url, scan.members, &scan.end);
                }
                // A tar that cannot be had at all (the store fails, or its copy fails its check)
                // fails the open, naming it: it is not a damaged tar `on_error` could skip.
                Err(why) => {
                    return Err(RemoteError::Other {
                        url: tar_url.display().to_string(),
                        why: format!("cannot index it: {why}"),
                    }
                    .into());
                }
            }
        }
        Ok(source)
    }

    /// Number of tars.
    pub fn tar_count(&self) -> usize {
        self.slots.len()
    }

    /// The mapping of tar `t`, with a pin that keeps its file in place.
    fn open_tar(&self, t: u32) -> Result<(Pin, Arc<Mapped>), SourceError> {
        let slot = &self.slots[t as usize];
        let pin = self.cache.get(&slot.object).map_err(|e| SourceError::Remote {
            dataset: self.catalog.name().to_owned(),
            why: e.to_string(),
        })?;
        let mut map = slot.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((generation, m)) = &*map
            && *generation == pin.generation()
        {
            return Ok((pin, Arc::clone(m)));
        }
        let m = Arc::new(Mapped::open(pin.path())?);
        *map = Some((pin.generation(), Arc::clone(&m)));
        Ok((pin, m))
    }

    fn tar_of(&self, index: u64) -> Option<u32> {
        self.catalog.tar_of(index, "").ok()
    }

    fn check_fault(&self, m: &Mapped, index: u64) -> Result<(), SourceError> {
        match m.fault() {
            Some(at) => Err(m
                .changed(at, format!("sample {index} (key {:?})", self.catalog.key_text(index)))
                .into()),
            None => Ok(()),
        }
    }
}

/// What finding one tar's member table needs.
struct TarCtx<'a> {
    store: &'a Store,
    fetch: &'a StoreFetch,
    cache: &'a Arc<Cache>,
    listed: &'a Listed,
    object: &'a Object,
    table: &'a OnceLock<tar::Scan>,
    index_dir: &'a Path,
    indexes: &'a BTreeMap<String, Listed>,
}

impl TarCtx<'_> {
    fn url(&self) -> String {
        self.store.url(&self.listed.key)
    }

    fn cached_index(&self) -> PathBuf {
        self.index_dir
            .join(format!("{}{}", file_name(&self.object.key), index::SUFFIX))
    }

    /// Sets the tar's member table (preferring an index file; see the module docs).
    fn member_table(&self) -> Result<Had, TarIndexError> {
        if self.listed.size == 0 {
            let _ = self.table.set(tar::Scan {
                members: Vec::new(),
                end: tar::End::Complete,
            });
            return Ok(Had::Cache);
        }
        if let Ok(bytes) = std::fs::read(self.cached_index()) {
            match self.usable(&bytes) {
                Ok(scan) => {
                    let _ = self.table.set(scan);
                    return Ok(Had::Cache);
                }
                Err(why) => tracing::info!("{}: not using its cached index: {why}", self.url()),
            }
        }
        let index_key = format!("{}{}", self.listed.key, index::SUFFIX);
        if self.indexes.contains_key(&index_key) {
            match self
                .store
                .get_bytes(&index_key)
                .map_err(TarIndexError::from)
                .and_then(|(b, _)| self.usable(&b))
            {
                Ok(scan) => {
                    self.keep(&scan);
                    let _ = self.table.set(scan);
                    return Ok(Had::Store);
                }
                Err(why) => tracing::info!(
                    "{}: not using it: {why}; indexing the tar from a download",
                    self.store.url(&index_key)
                ),
            }
        }
        // Download it (the cache's check scans it and fixes the member table) and keep the index.
        let pin = self.cache.get(self.object)?;
        drop(pin);
        let scan = self
            .table
            .get()
            .cloned()
            .ok_or_else(|| TarIndexError::Unchecked { url: self.url() })?;
        self.keep(&scan);
        Ok(Had::Scanned)
    }

    /// The member table of index file `bytes` if it belongs to the object as listed
    /// ([`check_index`]); an ETag learned from its checking reads is the object's from now on.
    fn usable(&self, bytes: &[u8]) -> Result<tar::Scan, TarIndexError> {
        let (scan, learned) = check_index(self.store, self.listed, bytes)?;
        // A listing without ETags (some stores): the one these reads saw is the object's from
        // now on, so a tar rewritten later is reported when it is downloaded.
        if let Some(e) = &learned {
            self.fetch.expect(&self.listed.key, e);
        }
        Ok(scan)
    }

    /// Writes the index of `scan`, stamped with the object's length and ETag, into the cache's
    /// index directory (atomically); a failure costs the next open a download, nothing else.
    fn keep(&self, scan: &tar::Scan) {
        let stamp = index::Stamp {
            len: self.listed.size,
            mtime_ns: self.listed.modified_ns,
        };
        let bytes = index::encode_with(scan, stamp, self.listed.etag.as_deref().map(str::as_bytes));
        let dest = self.cached_index();
        let tmp = self
            .index_dir
            .join(format!(".tmp-{}-{}", std::process::id(), file_name(&self.object.key)));
        let r = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, &dest));
        if let Err(e) = r {
            let _ = std::fs::remove_file(&tmp);
            tracing::info!("could not keep the index {}: {e}", dest.display());
        }
    }
}

/// The member table of index file `bytes` if it belongs to the object `o` as listed (the reading
/// rules of a tar in a store, `proto/webdataset.md` 1.1: its length; its ETag when the index
/// and the listing both have one; else rule 5 from two ranged GETs, and the ETag those GETs
/// were answered with against the index's). `Err` says why not (the tar is then indexed
/// again). Also returns the ETag the GETs saw when the listing gave none.
pub fn check_index(store: &Store, o: &Listed, bytes: &[u8]) -> Result<(tar::Scan, Option<String>), TarIndexError> {
    let parsed = index::parse(bytes)?;
    if parsed.made.len != o.size {
        return Err(TarIndexError::Length {
            made: parsed.made.len,
            len: o.size,
        });
    }
    let stale = |a: &[u8], b: &str| TarIndexError::Etag {
        made: String::from_utf8_lossy(a).into_owned(),
        now: b.to_owned(),
    };
    match (&parsed.etag, &o.etag) {
        (Some(a), Some(b)) if a.as_slice() == b.as_bytes() => return Ok((parsed.scan, None)),
        (Some(a), Some(b)) => return Err(stale(a, b)),
        _ => {}
    }
    let ranges = index::spot_ranges(&parsed.scan.members);
    let (got, etag) = store.get_ranges(&o.key, &ranges, o.etag.as_deref())?;
    // A listing without ETags: the reads' ETag is the object's, and binds as the listing's would.
    if let (Some(a), None, Some(now)) = (&parsed.etag, &o.etag, &etag)
        && a.as_slice() != now.as_bytes()
    {
        return Err(stale(a, now));
    }
    let mut headers = ranges.iter().map(|r| r.start).zip(got);
    index::spot_check(&parsed.scan.members, true, &mut |at| {
        headers.find(|(s, _)| *s == at).map(|(_, h)| h)
    })?;
    Ok((parsed.scan, if o.etag.is_none() { etag } else { None }))
}

/// What `ringfeed index s3://...` did with one tar ([`index_object`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectIndexReport {
    /// `s3://bucket/key` of the tar.
    pub url: String,
    /// Regular members listed.
    pub members: usize,
    /// Its `TAR.rfidx` in the store was already valid: nothing written, the tar not read.
    pub fresh: bool,
    /// Why the `TAR.rfidx` found beside it was not kept (it was rebuilt).
    pub rebuilt: Option<String>,
    /// What the scan found wrong with the tar (it is indexed up to there).
    pub problem: Option<String>,
    /// Bytes of the tar downloaded (0 when `fresh`).
    pub read: u64,
}

/// Makes sure tar `o` of `bucket` has a valid index beside it in the store, `KEY.rfidx`
/// (`proto/webdataset.md`, "Tars in a store"). One there that passes [`check_index`] is kept
/// (`has_index`: the listing showed one). Else the tar is downloaded into the directory `dir`
/// (one sequential GET, resumed where a broken body stopped, bound to the ETag of its first
/// answer), scanned exactly as a local tar is ([`tar::scan`]), and its index uploaded, stamped
/// with the object's length, its `LastModified` and the ETag the download saw. The download
/// is deleted before this returns, so `dir` holds at most one tar per call in flight.
///
/// Why a download and not ranged reads of the headers: a WebDataset tar has two or three
/// members per sample, each behind its own 512-byte header; one ranged GET per header is
/// 20,000 to 30,000 requests for a 10,000-sample shard, minutes at an object store's latency,
/// where one sequential GET takes seconds and reads bytes that are mostly the samples anyway.
pub fn index_object(
    store: &Store,
    bucket: &str,
    o: &Listed,
    has_index: bool,
    dir: &Path,
) -> Result<ObjectIndexReport, RemoteError> {
    debug_assert_eq!(bucket, store.bucket());
    let url = store.url(&o.key);
    let index_key = format!("{}{}", o.key, index::SUFFIX);
    let mut rebuilt = None;
    if has_index {
        let checked = store
            .probe_bytes(&index_key)
            .map_err(TarIndexError::from)
            .and_then(|(b, _)| check_index(store, o, &b));
        match checked {
            Ok((scan, _)) => {
                return Ok(ObjectIndexReport {
                    url,
                    members: scan.members.len(),
                    fresh: true,
                    rebuilt: None,
                    problem: scan.end.problem(scan.members.len()),
                    read: 0,
                });
            }
            Err(why) => rebuilt = Some(why.to_string()),
        }
    }
    let (scan, etag) = download_scan(store, &url, o, dir)?;
    let stamp = index::Stamp {
        len: o.size,
        mtime_ns: o.modified_ns,
    };
    store.put_bytes(
        &index_key,
        &index::encode_with(&scan, stamp, etag.as_deref().map(str::as_bytes)),
    )?;
    Ok(ObjectIndexReport {
        url,
        members: scan.members.len(),
        fresh: false,
        rebuilt,
        problem: scan.end.problem(scan.members.len()),
        read: o.size,
    })
}

/// Tar `o` downloaded into the directory `dir` (one sequential GET, resumed where a broken
/// body stopped, bound to the ETag of its first answer), scanned as a local tar is, and
/// deleted; with the ETag the download saw.
pub fn download_scan(
    store: &Store,
    url: &str,
    o: &Listed,
    dir: &Path,
) -> Result<(tar::Scan, Option<String>), RemoteError> {
    if o.size == 0 {
        return Ok((tar::scan(&[], &mut |_| {}), o.etag.clone()));
    }
    let path = dir.join(file_name(&o.key));
    let etag = store.download(&o.key, &path, o.size, o.etag.as_deref());
    let scanned = etag.and_then(|etag| {
        let mapped = Mapped::open(&path).map_err(|e| RemoteError::Other {
            url: url.to_owned(),
            why: format!("cannot read its download {}: {e}", path.display()),
        })?;
        Ok((tar::scan(&mapped.map, &mut |_| {}), etag))
    });
    let _ = std::fs::remove_file(&path);
    scanned
}

/// `ringfeed index s3://...`: [`index_object`] for every tar `url` names ([`list_tars`]), `jobs`
/// at a time (each holds one tar in `dir` while it scans it), calling `on_start(i, n, key,
/// size)` when the turn of tar `i` of `n` comes and `on_done(report)` when it is indexed. The reports are in the
/// listing's order. A tar the store fails on stops the others (those running finish) and is
/// the error, naming it.
pub fn index_objects(
    store: &Store,
    url: &RemoteUrl,
    jobs: usize,
    dir: &Path,
    on_start: &(dyn Fn(usize, usize, &str, u64) + Sync),
    on_done: &(dyn Fn(&ObjectIndexReport) + Sync),
) -> Result<Vec<ObjectIndexReport>, RemoteError> {
    let listing = list_tars(store, url)?;
    let n = listing.tars.len();
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let results: Vec<Mutex<Option<Result<ObjectIndexReport, RemoteError>>>> =
        (0..n).map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..jobs.clamp(1, n.max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n || failed.load(Ordering::Relaxed) {
                        return;
                    }
                    let o = &listing.tars[i];
                    let has_index = listing.indexes.contains_key(&format!("{}{}", o.key, index::SUFFIX));
                    on_start(i, n, &o.key, o.size);
                    let r = index_object(store, &url.bucket, o, has_index, dir);
                    match &r {
                        Ok(report) => on_done(report),
                        Err(_) => failed.store(true, Ordering::Relaxed),
                    }
                    *results[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                }
            });
        }
    });
    let mut out = Vec::with_capacity(n);
    for r in results {
        match r.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(Ok(report)) => out.push(report),
            Some(Err(e)) => return Err(e),
            // Not started: an earlier tar failed, and its error is returned above or below.
            None => {}
        }
    }
    Ok(out)
}

/// The check of a cached copy of a tar: its headers scanned give exactly the member table fixed
/// at open (or, when none is fixed yet, fix it).
fn tar_check(table: Arc<OnceLock<tar::Scan>>, url: String) -> Arc<Check> {
    Arc::new(move |path: &Path| {
        let mapped = Mapped::open(path)?;
        let scan = tar::scan(&mapped.map, &mut |_| {});
        if let Some(at) = mapped.fault() {
            return Err(CheckError::Changed { at });
        }
        let want = table.get_or_init(|| scan.clone());
        if *want != scan {
            return Err(CheckError::Members {
                url: url.clone(),
                members: scan.members.len(),
                indexed: want.members.len(),
            });
        }
        Ok(())
    })
}

impl Source for RemoteWdsSource {
    fn len(&self) -> u64 {
        self.catalog.len()
    }

    fn class_names(&self) -> Vec<Vec<u8>> {
        Vec::new()
    }

    fn describe(&self) -> String {
        self.catalog.describe("on object storage, through the shard cache")
    }

    fn reader(&self) -> Result<Box<dyn SampleReader + '_>, SourceError> {
        Ok(Box::new(RemoteWdsReader {
            source: self,
            held: None,
        }))
    }

    fn listing_problems(&self) -> &[Problem] {
        self.catalog.problems()
    }

    fn shard_sizes(&self) -> Option<Vec<u64>> {
        Some(self.catalog.sizes().to_vec())
    }

    fn prefers_shard_order(&self) -> bool {
        true
    }

    fn with_sample(&self, index: u64, f: &mut dyn FnMut(Sample<'_>)) -> Result<(), SourceError> {
        let t = self.catalog.tar_of(index, &self.describe())?;
        let (_pin, m) = self.open_tar(t)?;
        let got = self.catalog.lookup(index, &m.map);
        self.check_fault(&m, index)?;
        f(got?);
        self.check_fault(&m, index)
    }

    fn field_kind(&self) -> Option<FieldKind> {
        Some(FieldKind::Members)
    }

    fn with_sample_extra(&self, index: u64, f: &mut dyn FnMut(Sample<'_>, Extra<'_>)) -> Result<(), SourceError> {
        let t = self.catalog.tar_of(index, &self.describe())?;
        let (_pin, m) = self.open_tar(t)?;
        let got = self.catalog.lookup_extra_window(index, &m.map, 0);
        self.check_fault(&m, index)?;
        let (sample, extra) = got?;
        f(sample, extra);
        // The fields are read inside `f`, from the same pinned copy: a fault meanwhile is reported.
        self.check_fault(&m, index)
    }

    fn read_ahead(&self) -> usize {
        if self.prefetch_shards == 0 { 0 } else { 1 << 16 }
    }

    fn will_read(&self, upcoming: &mut dyn Iterator<Item = u64>) {
        self.cache.prefetch_upcoming(
            upcoming,
            self.prefetch_shards,
            self.slots.len(),
            |i| self.tar_of(i),
            |t| &self.slots[t as usize].object,
        );
    }

    fn lease(&self, indices: &[u64]) -> Option<Box<dyn std::any::Any + Send + Sync>> {
        let tars = indices.iter().filter_map(|&i| self.tar_of(i));
        let pins = self.cache.lease_objects(tars, |t| &self.slots[t as usize].object);
        Some(Box::new(pins))
    }
}

/// A reader: keeps the last sample's tar pinned until the next call (the borrowed [`Sample`]).
struct RemoteWdsReader<'a> {
    source: &'a RemoteWdsSource,
    held: Option<(Pin, Arc<Mapped>)>,
}

impl SampleReader for RemoteWdsReader<'_> {
    fn get(&mut self, index: u64) -> Result<Sample<'_>, SourceError> {
        let s = self.source;
        let t = s.catalog.tar_of(index, &s.describe())?;
        self.held = None;
        let held = s.open_tar(t)?;
        let m = &self.held.insert(held).1;
        let got = s.catalog.lookup(index, &m.map);
        s.check_fault(m, index)?;
        got
    }
}
