//! One bucket of an object store (S3-compatible, Google Cloud Storage, Azure Blob Storage: one
//! `dyn ObjectStore` from `object_store`'s own backend for the URL's scheme), as blocking calls
//! with deadlines and bounded retries. Everything above this module is the same for every store.
//!
//! `object_store`'s own retry loop is switched off (`max_retries: 0`) and this module retries
//! instead, so that every retry is counted ([`super::Counters::retries`]) and the error that ends
//! the attempts names the object and the settings (`--fetch-retries`, `--fetch-timeout`). Each
//! attempt, its whole body included, runs under `tokio::time::timeout`, so a stalled store never
//! holds a reader beyond `timeout × (retries + 1)` plus the backoffs.
//!
//! What is retried: timeouts, connection errors and resets, 5xx, 429 and 503 throttling, a body
//! that ends early. A download resumes where a broken body stopped (a ranged GET from the bytes
//! already written) as long as the object's ETag is the one the first attempt saw. What is not:
//! 404 (the object is gone), 401/403 (credentials), an ETag that changed (the object was
//! rewritten), a body longer than the index says.
//!
//! The client runs on this module's own two-thread tokio runtime, so callers are plain threads
//! (decode workers, fetch jobs, the CLI); calling in from a tokio worker thread would panic, so
//! the control plane reaches it through `spawn_blocking`.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, RetryConfig};

use super::{Counters, RemoteConfig, RemoteError, Scheme};

/// Largest object [`Store::put_file`] sends in one request; larger ones go in 16 MiB parts.
const SINGLE_PUT: u64 = 64 << 20;

/// One bucket's client.
#[derive(Debug)]
pub struct Store {
    scheme: Scheme,
    bucket: String,
    s3: Arc<dyn ObjectStore>,
    runtime: tokio::runtime::Runtime,
    timeout: Duration,
    retries: u32,
    backoff: Duration,
    counters: Arc<Counters>,
}

/// How one attempt failed: worth another, or final.
enum Attempt {
    Retry(String),
    Fatal(RemoteError),
}

impl Store {
    /// A client for `bucket` configured from the environment (`AmazonS3Builder::from_env`: the
    /// `AWS_*` variables), with `AWS_ALLOW_HTTP` implied by an `http://` endpoint.
    ///
    /// What the environment leaves unset (keys, region, endpoint) is read from the AWS CLI's
    /// files, for the profile `$AWS_PROFILE` (else `default`): `$AWS_SHARED_CREDENTIALS_FILE`
    /// (else `~/.aws/credentials`) and `$AWS_CONFIG_FILE` (else `~/.aws/config`).
    ///
    /// `gs://` (1.9): `GoogleCloudStorageBuilder::from_env` (the `GOOGLE_*` variables; an
    /// `http://` `GOOGLE_BASE_URL` allows plain HTTP, for an emulator). `az://` (1.9):
    /// `MicrosoftAzureBuilder::from_env` (the `AZURE_*` variables; `AZURE_STORAGE_USE_EMULATOR`
    /// for Azurite at `AZURITE_BLOB_STORAGE_URL`), the URL's bucket being the container.
    pub fn from_env(
        scheme: Scheme,
        bucket: &str,
        config: &RemoteConfig,
        counters: Arc<Counters>,
    ) -> Result<Self, RemoteError> {
        match scheme {
            Scheme::S3 => Self::s3_from_env(bucket, config, counters),
            Scheme::Gcs => {
                let builder = GoogleCloudStorageBuilder::from_env();
                let http = builder
                    .get_config_value(&GoogleConfigKey::BaseUrl)
                    .is_some_and(|u| u.starts_with("http://"));
                let gcs = builder
                    .with_bucket_name(bucket)
                    .with_client_options(client_options(config, http))
                    .with_retry(retry_config(config))
                    .build()
                    .map_err(|e| config_error(scheme, bucket, &e))?;
                Self::from_object_store(scheme, bucket, Arc::new(gcs), config, counters)
            }
            Scheme::Azure => {
                let builder = MicrosoftAzureBuilder::from_env();
                // Azurite's endpoint is plain HTTP (the builder allows it for the emulator itself
                // only when it keeps its own client options, which ours replace).
                let http = builder
                    .get_config_value(&AzureConfigKey::UseEmulator)
                    .is_some_and(|v| v == "true")
                    || builder
                        .get_config_value(&AzureConfigKey::Endpoint)
                        .is_some_and(|u| u.starts_with("http://"));
                let az = builder
                    .with_container_name(bucket)
                    .with_client_options(client_options(config, http))
                    .with_retry(retry_config(config))
                    .build()
                    .map_err(|e| config_error(scheme, bucket, &e))?;
                Self::from_object_store(scheme, bucket, Arc::new(az), config, counters)
            }
        }
    }

    /// [`Store::from_env`] for `s3://`: the `AWS_*` variables, then the AWS CLI's files.
    fn s3_from_env(bucket: &str, config: &RemoteConfig, counters: Arc<Counters>) -> Result<Self, RemoteError> {
        let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
        let file = |var: &str, name: &str| {
            std::env::var_os(var)
                .map(std::path::PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(".aws").join(name)))
        };
        let profile = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".to_owned());
        let files = AwsFiles::read(
            file("AWS_SHARED_CREDENTIALS_FILE", "credentials").as_deref(),
            file("AWS_CONFIG_FILE", "config").as_deref(),
            &profile,
        );
        let builder = files.apply(AmazonS3Builder::from_env());
        let endpoint = builder
            .get_config_value(&object_store::aws::AmazonS3ConfigKey::Endpoint)
            .unwrap_or_default();
        Self::from_builder(builder, bucket, &endpoint, config, counters)
    }

    /// A client for `bucket` from `builder` (what [`Store::from_env`] makes from the
    /// environment; tests give the endpoint and keys of their own server instead). `endpoint`:
    /// the builder's endpoint, if any (an `http://` one allows plain HTTP).
    pub fn from_builder(
        builder: AmazonS3Builder,
        bucket: &str,
        endpoint: &str,
        config: &RemoteConfig,
        counters: Arc<Counters>,
    ) -> Result<Self, RemoteError> {
        let mut builder = builder.with_bucket_name(bucket);
        if builder
            .get_config_value(&object_store::aws::AmazonS3ConfigKey::Region)
            .is_none_or(|r| r.is_empty())
        {
            builder = builder.with_region("us-east-1");
        }
        builder = builder
            .with_client_options(client_options(config, endpoint.starts_with("http://")))
            .with_retry(retry_config(config));
        let s3 = builder.build().map_err(|e| config_error(Scheme::S3, bucket, &e))?;
        Self::from_object_store(Scheme::S3, bucket, Arc::new(s3), config, counters)
    }

    /// A client for `bucket` of a `scheme` store over `store`, an `object_store` client made
    /// for that bucket with [`client_options`] and [`retry_config`] (tests give one for their
    /// own emulator).
    pub fn from_object_store(
        scheme: Scheme,
        bucket: &str,
        store: Arc<dyn ObjectStore>,
        config: &RemoteConfig,
        counters: Arc<Counters>,
    ) -> Result<Self, RemoteError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ringfeed-store")
            .enable_all()
            .build()
            .map_err(|e| RemoteError::Config {
                scheme,
                store: format!("{scheme}{bucket}"),
                why: format!("starting its runtime: {e}"),
            })?;
        Ok(Store {
            scheme,
            bucket: bucket.to_owned(),
            s3: store,
            runtime,
            timeout: config.timeout,
            retries: config.retries,
            backoff: config.backoff,
            counters,
        })
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The store's scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The cache key of object `key` ([`super::cache::Object::key`]): `bucket/key` for S3 (as
    /// before 1.9, so a cache filled then stays valid), the whole URL for the other stores, so
    /// that buckets of the same name in two stores never share a file.
    pub fn cache_key(&self, key: &str) -> String {
        format!("{}{key}", self.cache_prefix())
    }

    /// What [`Store::cache_key`] puts before an object's key.
    pub fn cache_prefix(&self) -> String {
        match self.scheme {
            Scheme::S3 => format!("{}/", self.bucket),
            _ => format!("{}{}/", self.scheme, self.bucket),
        }
    }

    /// `s3://bucket/key` (with the store's scheme) of object `key`, for messages.
    pub fn url(&self, key: &str) -> String {
        format!("{}{}/{key}", self.scheme, self.bucket)
    }

    /// Classifies an `object_store` error.
    fn classify(&self, key: &str, e: object_store::Error) -> Attempt {
        match e {
            object_store::Error::NotFound { .. } => Attempt::Fatal(RemoteError::Gone { url: self.url(key) }),
            object_store::Error::PermissionDenied { source, .. }
            | object_store::Error::Unauthenticated { source, .. } => Attempt::Fatal(RemoteError::Denied {
                scheme: self.scheme,
                url: self.url(key),
                why: source.to_string(),
            }),
            other => {
                let why = one_line(&other);
                // Some requests (LIST) report a refused signature or key as a generic error
                // with the status in its text: as final as a typed 401/403.
                if why.contains("403 Forbidden") || why.contains("401 Unauthorized") {
                    Attempt::Fatal(RemoteError::Denied {
                        scheme: self.scheme,
                        url: self.url(key),
                        why,
                    })
                } else {
                    Attempt::Retry(why)
                }
            }
        }
    }

    /// Runs `attempt` until it succeeds, fails for good, or the retries are spent; every
    /// attempt under the deadline.
    fn with_retries<T, F, Fut>(&self, key: &str, attempt: F) -> Result<T, RemoteError>
    where
        F: FnMut(u32) -> Fut,
        Fut: std::future::Future<Output = Result<T, Attempt>>,
    {
        self.attempts(key, true, attempt)
    }

    /// [`Store::with_retries`]; `count_gone: false` leaves a 404 out of `errors` (a probe for an
    /// object that may not exist).
    fn attempts<T, F, Fut>(&self, key: &str, count_gone: bool, mut attempt: F) -> Result<T, RemoteError>
    where
        F: FnMut(u32) -> Fut,
        Fut: std::future::Future<Output = Result<T, Attempt>>,
    {
        let attempts = self.retries + 1;
        let mut last = String::new();
        for n in 0..attempts {
            if n > 0 {
                Counters::bump(&self.counters.retries);
                std::thread::sleep(backoff(self.backoff, n));
            }
            let got = self.runtime.block_on(async {
                match tokio::time::timeout(self.timeout, attempt(n)).await {
                    Ok(r) => r,
                    Err(_) => Err(Attempt::Retry(format!(
                        "no answer within --fetch-timeout {:.0} s",
                        self.timeout.as_secs_f64()
                    ))),
                }
            });
            match got {
                Ok(v) => return Ok(v),
                Err(Attempt::Fatal(e)) => {
                    if count_gone || !matches!(e, RemoteError::Gone { .. }) {
                        Counters::bump(&self.counters.errors);
                    }
                    return Err(e);
                }
                Err(Attempt::Retry(why)) => {
                    tracing::debug!("{}: attempt {} failed: {why}", self.url(key), n + 1);
                    last = why;
                }
            }
        }
        Counters::bump(&self.counters.errors);
        Err(RemoteError::Exhausted {
            url: self.url(key),
            attempts,
            last,
        })
    }

    /// The whole object `key` in memory, and its ETag.
    pub fn get_bytes(&self, key: &str) -> Result<(Vec<u8>, Option<String>), RemoteError> {
        self.get_bytes_counting(key, true)
    }

    /// [`Store::get_bytes`] of an object that may not be there: its absence
    /// ([`RemoteError::Gone`]) is not counted in `errors`.
    pub fn probe_bytes(&self, key: &str) -> Result<(Vec<u8>, Option<String>), RemoteError> {
        self.get_bytes_counting(key, false)
    }

    fn get_bytes_counting(&self, key: &str, count_gone: bool) -> Result<(Vec<u8>, Option<String>), RemoteError> {
        let path = ObjectPath::from(key);
        let got = self.attempts(key, count_gone, |_| async {
            let r = self.s3.get(&path).await.map_err(|e| self.classify(key, e))?;
            let etag = quoted(r.meta.e_tag.as_deref());
            let mut stream = r.into_stream();
            let mut out = Vec::new();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| self.classify(key, e))?;
                self.counters.bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                out.extend_from_slice(&chunk);
            }
            Ok((out, etag))
        })?;
        Counters::bump(&self.counters.fetches);
        Ok(got)
    }

    /// Downloads `key` into the new file `dest`, which must end up exactly `len` bytes long.
    /// `etag`: the ETag the object had when this server first saw it (the download fails with
    /// [`RemoteError::Changed`] if it differs now); returns the ETag it has. A body that breaks
    /// off is resumed from where it stopped; the file is synced before this returns.
    pub fn download(
        &self,
        key: &str,
        dest: &Path,
        len: u64,
        etag: Option<&str>,
    ) -> Result<Option<String>, RemoteError> {
        let io = |e: std::io::Error| RemoteError::Io {
            path: dest.to_owned(),
            source: e,
        };
        let mut file = std::fs::File::create(dest).map_err(io)?;
        let path = ObjectPath::from(key);
        let written = std::cell::Cell::new(0u64);
        let seen: std::cell::RefCell<Option<String>> = std::cell::RefCell::new(etag.map(str::to_owned));
        let file_ref = std::cell::RefCell::new(&mut file);
        let got = self.with_retries(key, |_| {
            let path = &path;
            let written = &written;
            let seen = &seen;
            let file_ref = &file_ref;
            async move {
                let at = written.get();
                let options = GetOptions {
                    range: (at > 0).then_some(GetRange::Offset(at)),
                    ..GetOptions::default()
                };
                let r = self.s3.get_opts(path, options).await.map_err(|e| self.classify(key, e))?;
                let now = quoted(r.meta.e_tag.as_deref());
                if let (Some(was), Some(now)) = (seen.borrow().as_deref(), now.as_deref())
                    && was != now
                {
                    return Err(Attempt::Fatal(RemoteError::Changed {
                        url: self.url(key),
                        was: was.to_owned(),
                        now: now.to_owned(),
                    }));
                }
                if seen.borrow().is_none() {
                    *seen.borrow_mut() = now;
                }
                if r.meta.size != len {
                    return Err(Attempt::Fatal(RemoteError::Other {
                        url: self.url(key),
                        why: format!(
                            "the object has {} bytes, the dataset's index says {len}: the dataset was rewritten or damaged; repack and upload it again",
                            r.meta.size
                        ),
                    }));
                }
                let mut stream = r.into_stream();
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk.map_err(|e| self.classify(key, e))?;
                    self.counters.bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    if written.get() + chunk.len() as u64 > len {
                        return Err(Attempt::Retry(format!(
                            "the body runs past the {len} bytes the object has"
                        )));
                    }
                    file_ref
                        .borrow_mut()
                        .write_all(&chunk)
                        .map_err(|e| Attempt::Fatal(io(e)))?;
                    written.set(written.get() + chunk.len() as u64);
                }
                if written.get() < len {
                    return Err(Attempt::Retry(format!(
                        "the body ended after {} of {len} bytes",
                        written.get()
                    )));
                }
                Ok(())
            }
        });
        got?;
        file.sync_all().map_err(io)?;
        Counters::bump(&self.counters.fetches);
        Ok(seen.into_inner())
    }

    /// Uploads `bytes` as `key` in one request (a small object: an index file). S3 makes an
    /// object visible whole or not at all, so no reader sees part of it.
    pub fn put_bytes(&self, key: &str, bytes: &[u8]) -> Result<(), RemoteError> {
        let path = ObjectPath::from(key);
        self.with_retries(key, |_| async {
            self.s3
                .put(&path, bytes.to_vec().into())
                .await
                .map_err(|e| self.classify(key, e))?;
            Ok(())
        })
    }

    /// Uploads the local file `src` as `key` (in parts when it is large).
    pub fn put_file(&self, key: &str, src: &Path) -> Result<(), RemoteError> {
        let io = |e: std::io::Error| RemoteError::Io {
            path: src.to_owned(),
            source: e,
        };
        let len = std::fs::metadata(src).map_err(io)?.len();
        let path = ObjectPath::from(key);
        self.with_retries(key, |_| async {
            if len <= SINGLE_PUT {
                let bytes = std::fs::read(src).map_err(|e| Attempt::Fatal(io(e)))?;
                self.s3
                    .put(&path, bytes.into())
                    .await
                    .map_err(|e| self.classify(key, e))?;
                return Ok(());
            }
            let upload = self.s3.put_multipart(&path).await.map_err(|e| self.classify(key, e))?;
            let mut w = object_store::WriteMultipart::new_with_chunk_size(upload, 16 << 20);
            let mut f = std::fs::File::open(src).map_err(|e| Attempt::Fatal(io(e)))?;
            let mut buf = vec![0u8; 8 << 20];
            loop {
                let n = std::io::Read::read(&mut f, &mut buf).map_err(|e| Attempt::Fatal(io(e)))?;
                if n == 0 {
                    break;
                }
                w.wait_for_capacity(4).await.map_err(|e| self.classify(key, e))?;
                w.write(&buf[..n]);
            }
            w.finish().await.map_err(|e| self.classify(key, e))?;
            Ok(())
        })
    }

    /// The objects directly under `prefix/` (not in deeper "directories"), in key order, with
    /// their sizes and ETags: one paged LIST.
    pub fn list_dir(&self, prefix: &str) -> Result<Vec<Listed>, RemoteError> {
        Ok(self.list_dir_and_prefixes(prefix)?.0)
    }

    /// [`Store::list_dir`], and the deeper "directories" directly under `prefix/` (their keys,
    /// in key order), for messages that say where a dataset may be instead.
    pub fn list_dir_and_prefixes(&self, prefix: &str) -> Result<(Vec<Listed>, Vec<String>), RemoteError> {
        let p = ObjectPath::from(prefix);
        let (mut out, mut dirs) = self.with_retries(prefix, |_| async {
            let r = self
                .s3
                .list_with_delimiter((!prefix.is_empty()).then_some(&p))
                .await
                .map_err(|e| self.classify(prefix, e))?;
            let objects = r
                .objects
                .into_iter()
                .map(|m| Listed {
                    key: m.location.to_string(),
                    size: m.size,
                    etag: quoted(m.e_tag.as_deref()),
                    modified_ns: m.last_modified.timestamp_nanos_opt().unwrap_or(0),
                })
                .collect::<Vec<_>>();
            let dirs = r.common_prefixes.iter().map(ToString::to_string).collect::<Vec<_>>();
            Ok((objects, dirs))
        })?;
        out.sort_by(|a, b| a.key.cmp(&b.key));
        dirs.sort();
        Ok((out, dirs))
    }

    /// Bytes `range` of object `key` (one ranged GET); see [`Store::get_ranges`].
    pub fn get_range(
        &self,
        key: &str,
        range: std::ops::Range<u64>,
        etag: Option<&str>,
    ) -> Result<Vec<u8>, RemoteError> {
        Ok(self
            .get_ranges(key, std::slice::from_ref(&range), etag)?
            .0
            .pop()
            .unwrap_or_default())
    }

    /// Byte ranges of object `key` (ranged GETs, one per range), as long as its ETag is `etag`
    /// (when given; else the first answer's): another one is [`RemoteError::Changed`]. Returns
    /// the ranges and the ETag the store gave.
    pub fn get_ranges(
        &self,
        key: &str,
        ranges: &[std::ops::Range<u64>],
        etag: Option<&str>,
    ) -> Result<(Vec<Vec<u8>>, Option<String>), RemoteError> {
        let path = ObjectPath::from(key);
        let mut out = Vec::with_capacity(ranges.len());
        let mut seen: Option<String> = etag.map(str::to_owned);
        for range in ranges {
            let etag = seen.clone();
            let etag = etag.as_deref();
            let got = self.with_retries(key, |_| async {
                let options = GetOptions {
                    range: Some(GetRange::Bounded(range.clone())),
                    ..GetOptions::default()
                };
                let r = self
                    .s3
                    .get_opts(&path, options)
                    .await
                    .map_err(|e| self.classify(key, e))?;
                let now = quoted(r.meta.e_tag.as_deref());
                if let (Some(was), Some(now)) = (etag, now.as_deref())
                    && was != now
                {
                    return Err(Attempt::Fatal(RemoteError::Changed {
                        url: self.url(key),
                        was: was.to_owned(),
                        now: now.to_owned(),
                    }));
                }
                let mut stream = r.into_stream();
                let mut bytes = Vec::with_capacity((range.end - range.start) as usize);
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk.map_err(|e| self.classify(key, e))?;
                    self.counters.bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    bytes.extend_from_slice(&chunk);
                }
                if bytes.len() as u64 != range.end - range.start {
                    return Err(Attempt::Retry(format!(
                        "bytes {}..{}: the body has {} bytes",
                        range.start,
                        range.end,
                        bytes.len()
                    )));
                }
                Ok((bytes, now))
            })?;
            if seen.is_none() {
                seen = got.1;
            }
            out.push(got.0);
        }
        Ok((out, seen))
    }

    /// The keys under `prefix/` (for tools and tests).
    pub fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, RemoteError> {
        let p = ObjectPath::from(prefix);
        self.with_retries(prefix, |_| async {
            let mut out = Vec::new();
            let mut s = self.s3.list(Some(&p));
            while let Some(m) = s.next().await {
                let m = m.map_err(|e| self.classify(prefix, e))?;
                out.push((m.location.to_string(), m.size));
            }
            Ok(out)
        })
    }
}

/// The HTTP client's settings of every store: a request's deadline (`--fetch-timeout`), and plain
/// HTTP where the configured endpoint is `http://` (an emulator, a local store).
pub fn client_options(config: &RemoteConfig, allow_http: bool) -> ClientOptions {
    ClientOptions::new()
        .with_timeout(config.timeout)
        .with_connect_timeout(Duration::from_secs(5).min(config.timeout))
        .with_allow_http(allow_http)
}

/// `object_store`'s own retries, off: [`Store`] retries (and counts, and names the settings).
pub fn retry_config(config: &RemoteConfig) -> RetryConfig {
    RetryConfig {
        max_retries: 0,
        retry_timeout: config.timeout,
        ..RetryConfig::default()
    }
}

fn config_error(scheme: Scheme, bucket: &str, e: &object_store::Error) -> RemoteError {
    RemoteError::Config {
        scheme,
        store: format!("{scheme}{bucket}"),
        why: one_line(e),
    }
}

/// One object of a listing ([`Store::list_dir`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its key.
    pub key: String,
    pub size: u64,
    pub etag: Option<String>,
    /// Its last modification, nanoseconds since the Unix epoch.
    pub modified_ns: i64,
}

/// What the AWS CLI's files say for one profile.
#[derive(Debug, Default, PartialEq, Eq)]
struct AwsFiles {
    access_key_id: Option<String>,
    secret_access_key: Option<String>,
    session_token: Option<String>,
    region: Option<String>,
    endpoint_url: Option<String>,
}

impl AwsFiles {
    /// Reads `profile` from the credentials file (section `[profile]`) and the config file
    /// (`[profile NAME]`, or `[default]`); a missing file or key is simply absent.
    fn read(credentials: Option<&Path>, config: Option<&Path>, profile: &str) -> Self {
        let section = |path: Option<&Path>, names: &[String]| -> Vec<(String, String)> {
            let Some(text) = path.and_then(|p| std::fs::read_to_string(p).ok()) else {
                return Vec::new();
            };
            let mut inside = false;
            let mut out = Vec::new();
            for line in text.lines() {
                let line = line.trim();
                if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
                    continue;
                }
                if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                    inside = names.iter().any(|n| n == name.trim());
                } else if inside && let Some((k, v)) = line.split_once('=') {
                    out.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
                }
            }
            out
        };
        let creds = section(credentials, &[profile.to_owned()]);
        let conf_names = if profile == "default" {
            vec!["default".to_owned()]
        } else {
            vec![format!("profile {profile}")]
        };
        let conf = section(config, &conf_names);
        let get = |kv: &[(String, String)], k: &str| kv.iter().rev().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        AwsFiles {
            access_key_id: get(&creds, "aws_access_key_id").or_else(|| get(&conf, "aws_access_key_id")),
            secret_access_key: get(&creds, "aws_secret_access_key").or_else(|| get(&conf, "aws_secret_access_key")),
            session_token: get(&creds, "aws_session_token").or_else(|| get(&conf, "aws_session_token")),
            region: get(&conf, "region"),
            endpoint_url: get(&conf, "endpoint_url"),
        }
    }

    /// Sets on `builder` what it does not have yet (the environment wins).
    fn apply(self, mut builder: AmazonS3Builder) -> AmazonS3Builder {
        use object_store::aws::AmazonS3ConfigKey as K;
        for (key, value) in [
            (K::AccessKeyId, self.access_key_id),
            (K::SecretAccessKey, self.secret_access_key),
            (K::Token, self.session_token),
            (K::Region, self.region),
            (K::Endpoint, self.endpoint_url),
        ] {
            if let Some(v) = value
                && builder.get_config_value(&key).is_none_or(|x| x.is_empty())
            {
                builder = builder.with_config(key, v);
            }
        }
        builder
    }
}

/// An ETag in its quoted form (`"abc"`), whatever the store sent: S3 and Azure quote them
/// everywhere, GCS's XML listing does not where its GET headers do, and an ETag is compared
/// between the two (a tar listed at open, then downloaded). A quoted one is left as it is, so
/// the ETags recorded before 1.9 (S3's, in `TAR.rfidx` files) still compare equal.
fn quoted(etag: Option<&str>) -> Option<String> {
    etag.map(|e| {
        if e.starts_with('"') || e.starts_with("W/\"") {
            e.to_owned()
        } else {
            format!("\"{e}\"")
        }
    })
}

/// The wait before attempt `n` (1, 2, ...): `first × 2^(n-1)`, at most 8 s, with up to 50 %
/// jitter from the clock (so ranks that failed together do not retry together).
fn backoff(first: Duration, n: u32) -> Duration {
    let base = first
        .saturating_mul(1u32 << (n - 1).min(16))
        .min(Duration::from_secs(8));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    base + base.mul_f64(f64::from(nanos % 1000) / 2000.0)
}

/// An error and its causes on one line.
fn one_line(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let t = c.to_string();
        if !msg.contains(&t) {
            msg.push_str(": ");
            msg.push_str(&t);
        }
        cause = c.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aws_files_give_what_the_environment_does_not() {
        let d = tempfile::tempdir().unwrap();
        let creds = d.path().join("credentials");
        let conf = d.path().join("config");
        std::fs::write(
            &creds,
            "[default]\naws_access_key_id = DEF\naws_secret_access_key=defsecret\n[work]\naws_access_key_id = WORK\naws_secret_access_key = worksecret\naws_session_token = tok\n",
        )
        .unwrap();
        std::fs::write(
            &conf,
            "# comment\n[default]\nregion = eu-west-1\n[profile work]\nregion = us-west-2\nendpoint_url = http://127.0.0.1:9000\n",
        )
        .unwrap();
        let work = AwsFiles::read(Some(&creds), Some(&conf), "work");
        assert_eq!(work.access_key_id.as_deref(), Some("WORK"));
        assert_eq!(work.session_token.as_deref(), Some("tok"));
        assert_eq!(work.region.as_deref(), Some("us-west-2"));
        assert_eq!(work.endpoint_url.as_deref(), Some("http://127.0.0.1:9000"));
        let def = AwsFiles::read(Some(&creds), Some(&conf), "default");
        assert_eq!(
            (def.secret_access_key.as_deref(), def.region.as_deref()),
            (Some("defsecret"), Some("eu-west-1"))
        );
        assert_eq!(
            AwsFiles::read(None, Some(&d.path().join("nope")), "x"),
            AwsFiles::default()
        );
        // The environment (here: the builder) wins over the files.
        use object_store::aws::AmazonS3ConfigKey as K;
        let b = work.apply(AmazonS3Builder::new().with_region("ap-south-1"));
        assert_eq!(b.get_config_value(&K::Region).as_deref(), Some("ap-south-1"));
        assert_eq!(b.get_config_value(&K::AccessKeyId).as_deref(), Some("WORK"));
    }

    #[test]
    fn etags_compare_in_their_quoted_form() {
        assert_eq!(quoted(Some("abc")).as_deref(), Some("\"abc\""));
        assert_eq!(quoted(Some("\"abc\"")).as_deref(), Some("\"abc\""));
        assert_eq!(quoted(Some("W/\"abc\"")).as_deref(), Some("W/\"abc\""));
        assert_eq!(quoted(None), None);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let f = Duration::from_millis(100);
        assert!(backoff(f, 1) >= f && backoff(f, 1) < f * 2);
        assert!(backoff(f, 3) >= f * 4);
        assert!(backoff(f, 30) <= Duration::from_secs(12));
    }
}
