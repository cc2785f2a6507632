//! `ringfeed inspect`: what a dataset holds, in words or JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use ringfeed_format::tokens::FlatDtype;

use crate::common::{LmdbArgs, is_lmdb, is_token_data};
use crate::remote::{RemoteArgs, remote_url};

#[derive(clap::Args, Debug)]
pub(crate) struct InspectArgs {
    /// Packed dataset directory, an LMDB, a token dataset, a Megatron PREFIX.bin, or WebDataset
    /// tars; or an `s3://bucket/prefix` packed dataset (read with ranged GETs: the index, the
    /// record tables and a few samples, never whole shards), or WebDataset tars in a store
    /// (`s3://bucket/prefix` without an index.rfi, a pattern, a `.tar` key: ranged GETs where
    /// a tar has a valid TAR.rfidx beside it, else the tar read whole).
    pub(crate) dataset: PathBuf,
    /// Describe this sample (for token data: this document).
    #[arg(long, value_name = "I", default_value_t = 0)]
    pub(crate) sample: u64,
    /// Token data: decode the sample with this tokenizer.json.
    #[arg(long, value_name = "FILE")]
    pub(crate) tokenizer: Option<PathBuf>,
    /// DATASET is a flat token file (nanoGPT's train.bin) of this dtype (Python's
    /// `TokenLoader(token_dtype=...)`; `--dtype` is its older name).
    #[arg(long = "token-dtype", visible_alias = "dtype", value_enum, value_name = "DTYPE")]
    pub(crate) dtype: Option<FlatDtype>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) lmdb: LmdbArgs,
    #[command(flatten)]
    pub(crate) remote: RemoteArgs,
}

pub(crate) fn run_inspect(a: InspectArgs) -> Result<ExitCode> {
    let inspection = if let Some(url) = remote_url(&a.dataset)? {
        crate::remote::inspect(&a.remote, &url, a.sample)?
    } else if is_token_data(&a.dataset, a.dtype) {
        return crate::text::inspect(&a.dataset, a.dtype, a.sample, a.tokenizer.as_deref(), a.json);
    } else {
        local(&a)?
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&inspection.to_json())?);
    } else {
        print!("{}", inspection.to_text());
    }
    Ok(ExitCode::SUCCESS)
}

/// A local dataset's description: WebDataset tars, an LMDB or a packed dataset.
fn local(a: &InspectArgs) -> Result<ringfeed_pack::inspect::Inspection> {
    let text = a.dataset.to_string_lossy();
    let tars = ringfeed_source::files::ServedKind::detect(&a.dataset)
        .is_ok_and(|k| k == ringfeed_source::files::ServedKind::WebDataset)
        || (!a.dataset.exists() && ringfeed_source::wds::pattern::is_pattern(&text));
    Ok(if tars {
        ringfeed_pack::inspect::inspect_webdataset(&text, Some(a.sample))?
    } else if is_lmdb(&a.dataset) {
        ringfeed_pack::inspect::inspect_lmdb(&a.dataset, &a.lmdb.options()?, Some(a.sample))?
    } else {
        ringfeed_pack::inspect::inspect_packed(&a.dataset, Some(a.sample))?
    })
}
