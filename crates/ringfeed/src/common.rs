//! Arguments and helpers more than one subcommand uses: LMDB options, sizes, temporary directories,
//! signals. (Object storage's options and commands are `crate::remote`'s.)

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result};
use ringfeed_format::tokens::FlatDtype;
use ringfeed_source::lmdb::{LabelSource, Layout, LmdbOptions};

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

/// What every `pack` run takes besides what it packs (images or text): `PackArgs`' shared half.
#[derive(Debug)]
// Without `text`, only `text_absent`'s refusal receives it, which reads nothing of it.
#[cfg_attr(not(feature = "text"), allow(dead_code))]
pub(crate) struct PackRun {
    pub(crate) src: PathBuf,
    pub(crate) out: PathBuf,
    pub(crate) threads: usize,
    pub(crate) on_error: ringfeed_pack::OnError,
    pub(crate) report: Option<PathBuf>,
    pub(crate) force: bool,
    pub(crate) progress: ringfeed_pack::ProgressMode,
    pub(crate) summary_json: Option<PathBuf>,
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
