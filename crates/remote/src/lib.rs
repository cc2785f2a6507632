//! Remote packed datasets on object storage (`s3://bucket/prefix/dataset` on S3-compatible
//! stores; 1.9: `gs://` on Google Cloud Storage, `az://container/prefix` on Azure Blob Storage),
//! served through a bounded local cache of whole shards (`docs/remote.md`).
//!
//! The sidecar does all the fetching: credentials and the endpoint come from the server's
//! environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`, read by `object_store`'s own builders'
//! `from_env`), never from a client's message. A client names a dataset by URL and nothing else.
//! Every store goes through the same [`Store`] (one `dyn ObjectStore`), so the cache, prefetch,
//! retries and messages are one code path whatever the scheme.
//!
//! The pieces, from the network to the decoder:
//! - [`store`]: one bucket's object store, a blocking facade over `object_store` on its own small
//!   runtime; every request has a deadline, and failed ones are retried a bounded number of times
//!   with backoff, counted in [`Counters`].
//! - [`cache`]: object key → validated local file, generic over what "valid" means (a callback):
//!   a size bound, LRU eviction that never touches a file being read, one download however many
//!   readers ask, files from an earlier run re-validated before use.
//! - [`source`]: a packed dataset whose index is fetched at open and whose shards are cached
//!   files, read by the same mmap shard reader as a local dataset; it fetches ahead of the
//!   stream's order.
//! - [`wds`]: WebDataset tars in a store, indexed by ranged reads where an index file allows.
//! - `pq` (1.10, feature `parquet`): Parquet files in a store, their footers read by range and
//!   each row group's column chunks a cached file, decoded by the local Parquet source's logic.
//! - [`tokens`]: token datasets (`tokens.rft`, a packing file) fetched whole into the cache,
//!   checked, and pinned there while a stream reads them as a local copy.
//!
//! Invariants:
//! - A sample is never served from a partial download: files are downloaded under a temporary
//!   name, checked against the dataset's own index (length, structure, body CRC-32C) and renamed
//!   into place only then.
//! - Every wait has a deadline: a fetch attempt (`--fetch-timeout`), a reader waiting for a fetch
//!   or for room in the cache. A stuck store ends in an error naming the object and the setting.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringfeed_format::control::RemoteSnapshot;

pub mod cache;
#[cfg(feature = "parquet")]
pub mod pq;
pub mod source;
pub mod store;
pub mod tokens;
pub mod wds;

pub use cache::Cache;
#[cfg(feature = "parquet")]
pub use pq::RemoteParquetSource;
pub use source::RemoteSource;
pub use store::Store;
pub use tokens::RemoteTokens;
pub use wds::RemoteWdsSource;

/// The URL scheme of S3 datasets.
pub const SCHEME: &str = ringfeed_format::control::REMOTE_SCHEME;

/// Which object store a URL names: its scheme (`ringfeed_format::control::REMOTE_SCHEMES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scheme {
    /// `s3://bucket/prefix`: S3 or an S3-compatible store.
    S3,
    /// `gs://bucket/prefix`: Google Cloud Storage (1.9).
    Gcs,
    /// `az://container/prefix`: Azure Blob Storage (1.9).
    Azure,
}

impl Scheme {
    /// The scheme `s` starts with, if it is one of ours.
    pub fn of(s: &str) -> Option<Self> {
        match ringfeed_format::control::object_storage_scheme(s)? {
            "s3://" => Some(Scheme::S3),
            "gs://" => Some(Scheme::Gcs),
            "az://" => Some(Scheme::Azure),
            other => unreachable!("REMOTE_SCHEMES has {other}, which Scheme does not know"),
        }
    }

    /// `s3://`, `gs://` or `az://`.
    pub fn prefix(self) -> &'static str {
        match self {
            Scheme::S3 => "s3://",
            Scheme::Gcs => "gs://",
            Scheme::Azure => "az://",
        }
    }

    /// What the store calls the top level of a URL (for messages).
    pub fn bucket_word(self) -> &'static str {
        match self {
            Scheme::Azure => "container",
            Scheme::S3 | Scheme::Gcs => "bucket",
        }
    }

    /// The environment variables that configure this store, for messages that send the user
    /// there (`docs/remote.md`, "Settings").
    pub fn settings(self) -> &'static str {
        match self {
            Scheme::S3 => {
                "set AWS_ENDPOINT_URL (and AWS_ALLOW_HTTP=true for http://), AWS_REGION, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the server's environment"
            }
            Scheme::Gcs => {
                "set GOOGLE_SERVICE_ACCOUNT (or GOOGLE_APPLICATION_CREDENTIALS, or GOOGLE_SERVICE_ACCOUNT_KEY) in the server's environment, and GOOGLE_BASE_URL with GOOGLE_SKIP_SIGNATURE=true for an emulator"
            }
            Scheme::Azure => {
                "set AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_KEY, or a service principal) in the server's environment, or AZURE_STORAGE_USE_EMULATOR=true for Azurite"
            }
        }
    }

    /// The credential variables, for an access-denied message.
    pub fn credentials(self) -> &'static str {
        match self {
            Scheme::S3 => "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN",
            Scheme::Gcs => "GOOGLE_SERVICE_ACCOUNT, GOOGLE_SERVICE_ACCOUNT_KEY, GOOGLE_APPLICATION_CREDENTIALS",
            Scheme::Azure => "AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_KEY",
        }
    }
}

impl std::fmt::Display for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.prefix())
    }
}

/// A parsed `s3://bucket/prefix` (or `gs://bucket/prefix`, `az://container/prefix`) URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteUrl {
    /// The store, as the URL named it.
    pub scheme: Scheme,
    /// The bucket (Azure: the container).
    pub bucket: String,
    /// The key prefix of the dataset's files, without leading or trailing `/` (may be empty).
    pub prefix: String,
}

impl RemoteUrl {
    /// Parses `s3://bucket/prefix` (`gs://`, `az://`); `None` when `s` is no such URL at all.
    pub fn parse(s: &str) -> Option<Result<Self, RemoteError>> {
        let scheme = Scheme::of(s)?;
        let rest = &s[scheme.prefix().len()..];
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            let word = scheme.bucket_word();
            return Some(Err(RemoteError::Url {
                url: s.to_owned(),
                why: format!("it names no {word} (expected {scheme}{word}/prefix)"),
            }));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|c| c == "." || c == "..") {
            return Some(Err(RemoteError::Url {
                url: s.to_owned(),
                why: "`.` and `..` are not allowed in the prefix".into(),
            }));
        }
        Some(Ok(RemoteUrl {
            scheme,
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
        }))
    }

    /// The object key of file `name` of the dataset.
    pub fn key(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{}/{name}", self.prefix)
        }
    }

    /// `s3://bucket/key` of file `name`, for messages.
    pub fn object_url(&self, name: &str) -> String {
        self.key_url(&self.key(name))
    }

    /// `s3://bucket/key` of the object `key` of the URL's bucket, for messages.
    pub fn key_url(&self, key: &str) -> String {
        format!("{}{}/{key}", self.scheme, self.bucket)
    }
}

impl std::fmt::Display for RemoteUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}/{}", self.scheme, self.bucket, self.prefix)
    }
}

/// The settings of remote fetching and the cache (`ringfeed serve --cache-dir ...`).
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteConfig {
    /// Where cached shards live (`--cache-dir`, `RINGFEED_CACHE_DIR`).
    pub cache_dir: PathBuf,
    /// The most bytes the cache directory may hold (`--cache-bytes`, `RINGFEED_CACHE_BYTES`).
    pub cache_bytes: u64,
    /// Downloads running at once, over every stream: the start, which the autotuner moves
    /// (`ringfeed_serve::tune::FetchTuner`), or `--fetch-concurrency`.
    pub concurrency: usize,
    /// Whether `--fetch-concurrency` (or `RINGFEED_FETCH_CONCURRENCY`) pins `concurrency`.
    pub concurrency_pinned: bool,
    /// Shards a stream fetches ahead of the one it reads (`--prefetch-shards`; 0: none).
    pub prefetch_shards: usize,
    /// Deadline of one request, its whole body included (`--fetch-timeout`).
    pub timeout: Duration,
    /// Attempts after the first for a failed request or a download that fails its check
    /// (`--fetch-retries`).
    pub retries: u32,
    /// First backoff between attempts; doubles each time, up to 8 s, with jitter.
    pub backoff: Duration,
}

impl RemoteConfig {
    /// The defaults: `$XDG_CACHE_HOME/ringfeed/shards` (else `~/.cache/ringfeed/shards`, else
    /// `/tmp/ringfeed-$UID/shards`), bounded by half the space free there now, at most 64 GiB.
    pub fn defaults() -> Self {
        let cache_dir = default_cache_dir();
        RemoteConfig {
            cache_bytes: default_cache_bytes(&cache_dir),
            cache_dir,
            concurrency: 4,
            concurrency_pinned: false,
            prefetch_shards: 4,
            timeout: Duration::from_secs(120),
            retries: 5,
            backoff: Duration::from_millis(200),
        }
    }
}

fn default_cache_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("ringfeed/shards");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(h).join(".cache/ringfeed/shards");
    }
    PathBuf::from(format!("/tmp/ringfeed-{}/shards", rustix::process::getuid().as_raw()))
}

/// Half the space available to this user on the filesystem of `dir` (or of its nearest
/// existing ancestor), at most 64 GiB, at least 1 GiB.
pub fn default_cache_bytes(dir: &std::path::Path) -> u64 {
    let mut d = dir;
    let free = loop {
        if let Ok(s) = rustix::fs::statvfs(d) {
            break s.f_bavail.saturating_mul(s.f_frsize);
        }
        match d.parent() {
            Some(p) => d = p,
            None => break 0,
        }
    };
    (free / 2).clamp(1 << 30, 64 << 30)
}

/// What remote fetching has done since the server started (every dataset, every stream), for
/// `snapshot` (`server.remote`, control.md 1.3), `ringfeed top` and the metrics.
#[derive(Debug, Default)]
pub struct Counters {
    /// Objects downloaded completely (shards and indexes).
    pub fetches: AtomicU64,
    /// Bytes received from the store, partial attempts included.
    pub bytes: AtomicU64,
    /// Attempts repeated after a failure (a timeout, 5xx, 429, a reset, a short or bad body).
    pub retries: AtomicU64,
    /// Objects that failed for good (after the retries, or at once: gone, access denied, changed).
    pub errors: AtomicU64,
    /// Reads that found their shard in the cache.
    pub hits: AtomicU64,
    /// Reads that had to wait for a download.
    pub misses: AtomicU64,
    /// Downloads started ahead of the reader (prefetch).
    pub prefetches: AtomicU64,
    /// Files removed to make room.
    pub evictions: AtomicU64,
    /// Files found in the cache directory at start that passed their check and were used.
    pub reused: AtomicU64,
    /// Files (cached, or just downloaded) that failed their check and were deleted.
    pub rejected: AtomicU64,
    /// Nanoseconds readers spent waiting for downloads.
    pub wait_ns: AtomicU64,
    /// Nanoseconds spent downloading and checking, summed over downloads (the slots' busy time).
    pub fetch_busy_ns: AtomicU64,
    /// Bytes in the cache directory now (files and downloads in progress).
    pub cache_used: AtomicU64,
    /// The cache's bound.
    pub cache_limit: AtomicU64,
    /// Downloads allowed at once now (the autotuner's, or `--fetch-concurrency`).
    pub concurrency: AtomicU64,
    /// 1 when `--fetch-concurrency` pins it.
    pub concurrency_pinned: AtomicU64,
}

impl Counters {
    /// Adds one to `c`.
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> RemoteSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RemoteSnapshot {
            fetches: g(&self.fetches),
            bytes: g(&self.bytes),
            retries: g(&self.retries),
            errors: g(&self.errors),
            hits: g(&self.hits),
            misses: g(&self.misses),
            prefetches: g(&self.prefetches),
            evictions: g(&self.evictions),
            reused: g(&self.reused),
            rejected: g(&self.rejected),
            wait_s: (g(&self.wait_ns) as f64 / 1e6).round() / 1e3,
            cache_bytes: g(&self.cache_used),
            cache_limit: g(&self.cache_limit),
            fetch_concurrency: g(&self.concurrency),
            fetch_pinned: g(&self.concurrency_pinned) == 1,
        }
    }
}

/// Why a remote dataset or object could not be had.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("{url} is not a usable dataset URL: {why}")]
    Url { url: String, why: String },
    #[error("cannot make a client for {store}: {why}; {settings}", settings = scheme.settings())]
    Config { scheme: Scheme, store: String, why: String },
    #[error("{url}: the object does not exist (404); the dataset was moved or deleted, or the URL is wrong")]
    Gone { url: String },
    #[error(
        "{url}: access denied ({why}); check the credentials in the server's environment ({vars})",
        vars = scheme.credentials()
    )]
    Denied { scheme: Scheme, url: String, why: String },
    #[error(
        "{url} changed while this server used it (etag {was}, now {now}): the dataset was rewritten under a running job; restart the job once the new dataset is complete"
    )]
    Changed { url: String, was: String, now: String },
    #[error(
        "{url}: {attempts} attempts failed, the last: {last}; raise --fetch-retries or --fetch-timeout (RINGFEED_FETCH_RETRIES, RINGFEED_FETCH_TIMEOUT) if the store is slow or throttles"
    )]
    Exhausted { url: String, attempts: u32, last: String },
    #[error("{url}: {why}")]
    Other { url: String, why: String },
    #[error("{path}: {source}", path = path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

/// Everything remote a server shares between its streams: the settings, one cache, one store
/// per bucket (of each scheme), the counters. Made at server start; the cache directory is opened on first use.
#[derive(Debug)]
pub struct Hub {
    pub config: RemoteConfig,
    pub counters: Arc<Counters>,
    cache: Mutex<Option<Arc<Cache>>>,
    stores: Mutex<BTreeMap<(Scheme, String), Arc<Store>>>,
}

impl Hub {
    pub fn new(config: RemoteConfig) -> Self {
        let counters = Arc::new(Counters::default());
        counters.cache_limit.store(config.cache_bytes, Ordering::Relaxed);
        counters.concurrency.store(config.concurrency as u64, Ordering::Relaxed);
        counters
            .concurrency_pinned
            .store(u64::from(config.concurrency_pinned), Ordering::Relaxed);
        Hub {
            config,
            counters,
            cache: Mutex::new(None),
            stores: Mutex::new(BTreeMap::new()),
        }
    }

    /// The cache, opened (its directory scanned) on first use.
    pub fn cache(&self) -> Result<Arc<Cache>, cache::CacheError> {
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = &*c {
            return Ok(Arc::clone(c));
        }
        let opened = Cache::open(&self.config, Arc::clone(&self.counters))?;
        *c = Some(Arc::clone(&opened));
        Ok(opened)
    }

    /// The cache, if a remote dataset opened it (for the autotuner: nothing to tune before).
    pub fn opened_cache(&self) -> Option<Arc<Cache>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The store of `url`'s bucket, made from the environment on first use.
    pub fn store(&self, url: &RemoteUrl) -> Result<Arc<Store>, RemoteError> {
        let mut stores = self.stores.lock().unwrap_or_else(|p| p.into_inner());
        let key = (url.scheme, url.bucket.clone());
        if let Some(s) = stores.get(&key) {
            return Ok(Arc::clone(s));
        }
        let s = Arc::new(Store::from_env(
            url.scheme,
            &url.bucket,
            &self.config,
            Arc::clone(&self.counters),
        )?);
        stores.insert(key, Arc::clone(&s));
        Ok(s)
    }

    /// Uses `store` for its bucket from now on (instead of one made from the environment).
    pub fn add_store(&self, store: Store) {
        let mut stores = self.stores.lock().unwrap_or_else(|p| p.into_inner());
        stores.insert((store.scheme(), store.bucket().to_owned()), Arc::new(store));
    }

    /// What remote fetching has done, when anything remote was opened.
    pub fn snapshot(&self) -> Option<RemoteSnapshot> {
        let opened = self.cache.lock().unwrap_or_else(|p| p.into_inner()).is_some()
            || !self.stores.lock().unwrap_or_else(|p| p.into_inner()).is_empty();
        opened.then(|| self.counters.snapshot())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = RemoteUrl::parse("s3://b/x/y/ds/").unwrap().unwrap();
        assert_eq!(u.bucket, "b");
        assert_eq!(u.prefix, "x/y/ds");
        assert_eq!(u.key("index.rfi"), "x/y/ds/index.rfi");
        assert_eq!(u.object_url("a"), "s3://b/x/y/ds/a");
        assert_eq!(RemoteUrl::parse("s3://b").unwrap().unwrap().key("i"), "i");
        assert!(RemoteUrl::parse("/data/x").is_none());
        assert!(RemoteUrl::parse("s3:///x").unwrap().is_err());
        assert!(RemoteUrl::parse("s3://b/../x").unwrap().is_err());
        // 1.9: the other stores keep their scheme, in every URL made from theirs.
        let g = RemoteUrl::parse("gs://b/ds").unwrap().unwrap();
        assert_eq!(
            (g.scheme, g.bucket.as_str(), g.prefix.as_str()),
            (Scheme::Gcs, "b", "ds")
        );
        assert_eq!(g.object_url("index.rfi"), "gs://b/ds/index.rfi");
        assert_eq!(g.to_string(), "gs://b/ds");
        let a = RemoteUrl::parse("az://c/x/ds").unwrap().unwrap();
        assert_eq!((a.scheme, a.key_url("k")), (Scheme::Azure, "az://c/k".to_owned()));
        let e = RemoteUrl::parse("az:///x").unwrap().unwrap_err().to_string();
        assert!(
            e.contains("az:///x") && e.contains("expected az://container/prefix"),
            "{e}"
        );
        assert!(RemoteUrl::parse("gs://b/x/../y").unwrap().is_err());
        assert!(RemoteUrl::parse("gcs://b/x").is_none());
        // Every scheme the protocol lists is one a URL can have.
        for s in ringfeed_format::control::REMOTE_SCHEMES {
            assert_eq!(Scheme::of(s).map(Scheme::prefix), Some(s));
        }
    }
}
