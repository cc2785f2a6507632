//! Arguments and helpers more than one subcommand uses: remote and LMDB options, sizes, temporary
//! directories, signals.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result, bail};
use ringfeed_format::tokens::FlatDtype;
use ringfeed_source::lmdb::{LabelSource, Layout, LmdbOptions};

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
    pub(crate) fn config(&self) -> Result<ringfeed_remote::RemoteConfig> {
        if !(0.1..=86400.0).contains(&self.fetch_timeout) {
            bail!(
                "--fetch-timeout {} must be between 0.1 and 86400 seconds",
                self.fetch_timeout
            );
        }
        let mut c = ringfeed_remote::RemoteConfig::defaults();
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

#[derive(clap::Args, Debug)]
pub(crate) struct LmdbArgs {
    /// How LMDB values are laid out (see docs/lmdb.md).
    #[arg(long, value_name = "LAYOUT", default_value = "auto", value_parser = ["auto", "raw", "pickle", "msgpack"])]
    pub(crate) lmdb_layout: String,
    /// Raw layout: labels from this file (CSV `key,label`, JSON, or JSONL).
    #[arg(long, value_name = "FILE", conflicts_with = "labels_key")]
    pub(crate) labels: Option<PathBuf>,
    /// Raw layout: labels from the value of this key in the same LMDB.
    #[arg(long, value_name = "KEY")]
    pub(crate) labels_key: Option<String>,
}

impl LmdbArgs {
    pub(crate) fn options(&self) -> Result<LmdbOptions> {
        let layout: Layout = self.lmdb_layout.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
        let labels = match (&self.labels, &self.labels_key) {
            (Some(f), _) => LabelSource::File(f.clone()),
            (None, Some(k)) => LabelSource::Key(k.as_bytes().to_vec()),
            (None, None) => LabelSource::None,
        };
        Ok(LmdbOptions { layout, labels })
    }
}

/// The `s3://` URL `p` names, if it names one.
pub(crate) fn remote_url(p: &Path) -> Result<Option<ringfeed_remote::RemoteUrl>> {
    match p.to_str().and_then(ringfeed_remote::RemoteUrl::parse) {
        None => Ok(None),
        Some(u) => Ok(Some(u?)),
    }
}

/// A temporary directory for a remote dataset's local copy, removed on drop.
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

/// Parses a byte size: a number with an optional K/M/G/T suffix (powers of 1000), or
/// KiB/MiB/GiB/TiB (powers of 1024). `B` alone or no suffix means bytes.
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid size {s:?}: expected e.g. 256MiB, 1GB or 500000000"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0f64.powi(4),
        other => {
            return Err(format!(
                "invalid size unit {other:?} in {s:?}: use K, M, G, T, KiB, MiB, GiB or TiB"
            ));
        }
    };
    let v = n * mult;
    if !(1.0..=u64::MAX as f64).contains(&v) {
        return Err(format!("size {s:?} is out of range"));
    }
    Ok(v as u64)
}

/// Sets `flag` on SIGINT and SIGTERM, so long commands stop cleanly instead of dying mid-write.
pub(crate) fn cancel_on_signals() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&flag)).context("installing a signal handler")?;
    }
    Ok(flag)
}

/// Whether `path` holds token data (a token dataset, a Megatron .bin/.idx pair), or `--dtype`
/// says it is a flat token file.
pub(crate) fn is_token_data(path: &Path, dtype: Option<FlatDtype>) -> bool {
    dtype.is_some()
        || path.join(ringfeed_format::tokens::TOKENS_FILE).is_file()
        || (path.extension().is_some_and(|e| e == "bin" || e == "idx") && path.with_extension("idx").is_file())
}

pub(crate) fn is_lmdb(path: &Path) -> bool {
    path.join("data.mdb").is_file() || path.extension().is_some_and(|e| e == "mdb" || e == "lmdb")
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("500M"), Ok(500_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert!(parse_size("12parsecs").unwrap_err().contains("invalid size unit"));
        assert!(parse_size("").is_err());
        assert!(parse_size("0").is_err());
    }
}
