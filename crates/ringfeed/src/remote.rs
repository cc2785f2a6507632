//! Object storage (`s3://bucket/prefix`, docs/remote.md): the options and the subcommands' remote
//! halves. Built with the `remote` feature (the default); without it, `remote_absent.rs` stands
//! in: no `RemoteUrl` can exist there, and an `s3://` argument is refused naming the feature.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use ringfeed_format::shard::{VerifyError, VerifyOptions, VerifyReport};
use ringfeed_pack::ProgressMode;
use ringfeed_pack::inspect::Inspection;
use ringfeed_pack::progress::Progress;
pub(crate) use ringfeed_remote::{RemoteConfig, RemoteUrl};

use crate::common::parse_size;

/// Remote datasets (`s3://bucket/prefix`, docs/remote.md): the shard cache and fetching.
#[derive(clap::Args, Debug)]
pub(crate) struct RemoteArgs {
    /// Directory of the shard cache [default: $XDG_CACHE_HOME/ringfeed/shards, else
    /// ~/.cache/ringfeed/shards].
    #[arg(long, value_name = "DIR", env = "RINGFEED_CACHE_DIR")]
    pub(crate) cache_dir: Option<PathBuf>,
    /// Most bytes the shard cache may hold, e.g. 100GiB [default: half the space free in its
    /// directory, at most 64 GiB].
    #[arg(long, value_name = "SIZE", env = "RINGFEED_CACHE_BYTES", value_parser = parse_size)]
    pub(crate) cache_bytes: Option<u64>,
    /// Downloads running at once, over every stream: pins it [default: set by the autotuner,
    /// starting at 4, within what the cache's bound holds].
    #[arg(long, value_name = "N", env = "RINGFEED_FETCH_CONCURRENCY", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) fetch_concurrency: Option<u32>,
    /// Shards each stream downloads ahead of its reads, in the order it will read them (0: none).
    #[arg(long, value_name = "N", env = "RINGFEED_PREFETCH_SHARDS", default_value_t = 4)]
    pub(crate) prefetch_shards: usize,
    /// Deadline of one request to the object store, its whole body included, in seconds.
    #[arg(long, value_name = "SECS", env = "RINGFEED_FETCH_TIMEOUT", default_value_t = 120.0)]
    pub(crate) fetch_timeout: f64,
    /// Attempts after the first for a failed request (timeouts, 5xx, 429/503, resets, short or
    /// corrupted bodies).
    #[arg(long, value_name = "N", env = "RINGFEED_FETCH_RETRIES", default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub(crate) fetch_retries: u32,
}

impl RemoteArgs {
    pub(crate) fn config(&self) -> Result<RemoteConfig> {
        if !(0.1..=86400.0).contains(&self.fetch_timeout) {
            bail!(
                "--fetch-timeout {} must be between 0.1 and 86400 seconds",
                self.fetch_timeout
            );
        }
        let mut c = RemoteConfig::defaults();
        if let Some(d) = &self.cache_dir {
            c.cache_bytes = ringfeed_remote::default_cache_bytes(d);
            c.cache_dir = d.clone();
        }
        if let Some(b) = self.cache_bytes {
            c.cache_bytes = b;
        }
        if let Some(n) = self.fetch_concurrency {
            c.concurrency = n as usize;
            c.concurrency_pinned = true;
        }
        c.prefetch_shards = self.prefetch_shards;
        c.timeout = std::time::Duration::from_secs_f64(self.fetch_timeout);
        c.retries = self.fetch_retries;
        Ok(c)
    }
}

/// The `s3://` URL `p` names, if it names one.
pub(crate) fn remote_url(p: &Path) -> Result<Option<RemoteUrl>> {
    match p.to_str().and_then(RemoteUrl::parse) {
        None => Ok(None),
        Some(u) => Ok(Some(u?)),
    }
}

/// `pack SRC s3://...`: the dataset is packed into a temporary directory ([`Upload::local`]),
/// then uploaded, its index last ([`Upload::finish`]).
#[derive(Debug)]
pub(crate) struct Upload {
    store: ringfeed_remote::Store,
    url: RemoteUrl,
    /// Holds the packed dataset ([`Upload::local`]); removed with the upload.
    tmp: TempDir,
}

impl Upload {
    /// Refuses to replace a dataset at `url` without `force`.
    pub(crate) fn start(args: &RemoteArgs, url: RemoteUrl, force: bool) -> Result<Upload> {
        let store = ringfeed_pack::remote::store_for(&url, &args.config()?)?;
        if let Some(file) = ringfeed_pack::remote::existing_dataset(&store, &url)?.filter(|_| !force) {
            bail!("{url} already holds a dataset (its {file}); pass --force to replace it");
        }
        let tmp = TempDir::new("pack")?;
        Ok(Upload { store, url, tmp })
    }

    /// Where to pack the dataset before it is uploaded.
    pub(crate) fn local(&self) -> PathBuf {
        self.tmp.0.join("dataset")
    }

    pub(crate) fn finish(self) -> Result<()> {
        let (files, bytes) = ringfeed_pack::remote::upload(&self.store, &self.local(), &self.url)?;
        println!("uploaded {files} files, {:.1} MB, to {}", bytes as f64 / 1e6, self.url);
        Ok(())
    }
}

/// `verify s3://...`: streamed, one shard at a time in a temporary directory, never the whole
/// dataset.
pub(crate) fn verify(
    args: &RemoteArgs,
    url: &RemoteUrl,
    opts: &VerifyOptions<'_>,
    progress: &Progress,
) -> Result<VerifyReport> {
    let tmp = TempDir::new("verify")?;
    let store = ringfeed_pack::remote::store_for(url, &args.config()?)?;
    let mut on_shard = |n: u32, of: u32| progress.message(&format!("verifying {url}: shard {} of {of}", n + 1));
    let result = ringfeed_pack::remote::verify(&store, url, &tmp.0.join("shard"), opts, &mut on_shard);
    progress.finish();
    result.map_err(|e| {
        let kind = e.kind();
        let e: anyhow::Error = match e {
            ringfeed_pack::remote::ToolError::Verify(VerifyError::Format(f)) => f.into(),
            other => other.into(),
        };
        e.context(format!("verify failed ({kind})"))
    })
}

/// `inspect s3://...`: ranged GETs of what the description needs.
pub(crate) fn inspect(args: &RemoteArgs, url: &RemoteUrl, sample: u64) -> Result<Inspection> {
    let store = ringfeed_pack::remote::store_for(url, &args.config()?)?;
    Ok(
        if ringfeed_remote::wds::names_tars(url) || !ringfeed_pack::remote::exists(&store, url)? {
            // WebDataset tars: ranged GETs where their index files are valid, else each tar
            // read whole through a temporary directory.
            let tmp = TempDir::new("inspect")?;
            ringfeed_pack::remote::inspect_tars(&store, url, Some(sample), &tmp.0)?
        } else {
            // Ranged GETs of the index, the record tables and a few samples' first bytes only.
            ringfeed_pack::remote::inspect(&store, url, Some(sample))?
        },
    )
}

/// `index s3://...`: every tar's index checked or written beside it in the store; returns the
/// index files written, those already valid, and the damaged tars.
pub(crate) fn index(args: &RemoteArgs, mode: ProgressMode, url: &RemoteUrl) -> Result<(usize, usize, usize)> {
    let config = args.config()?;
    let store = ringfeed_pack::remote::store_for(url, &config)?;
    let tmp = TempDir::new("index")?;
    let progress = Progress::new(mode);
    progress.message(&format!("indexing the tars of {url}"));
    let on_start = |i: usize, n: usize, key: &str, size: u64| {
        progress.message(&format!(
            "indexing tar {} of {n}: {} ({:.1} MB)",
            i + 1,
            url.key_url(key),
            size as f64 / 1e6
        ));
    };
    let on_done = |r: &ringfeed_remote::wds::ObjectIndexReport| {
        let what = match (&r.rebuilt, r.fresh) {
            (_, true) => "index valid, kept".to_owned(),
            (Some(why), false) => format!("index rebuilt (the one there was not used: {why})"),
            (None, false) => "index written".to_owned(),
        };
        println!("{}: {} members, {what}", r.url, r.members);
        if let Some(p) = &r.problem {
            eprintln!("ringfeed: {}: {p}", r.url);
        }
    };
    let reports = ringfeed_remote::wds::index_objects(&store, url, config.concurrency, &tmp.0, &on_start, &on_done);
    progress.finish();
    let reports = reports.with_context(|| format!("indexing {url}"))?;
    let fresh = reports.iter().filter(|r| r.fresh).count();
    let damaged = reports.iter().filter(|r| r.problem.is_some()).count();
    let read: u64 = reports.iter().map(|r| r.read).sum();
    eprintln!(
        "ringfeed: {url}: {} tars, {:.1} MB downloaded to index them",
        reports.len(),
        read as f64 / 1e6
    );
    Ok((reports.len() - fresh, fresh, damaged))
}

/// A temporary directory for a remote dataset's local copy, removed on drop.
#[derive(Debug)]
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new(what: &str) -> Result<Self> {
        let p = std::env::temp_dir().join(format!(".ringfeed-{what}-{}", std::process::id()));
        if p.exists() {
            std::fs::remove_dir_all(&p).with_context(|| format!("removing {}", p.display()))?;
        }
        std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
