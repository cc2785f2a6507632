//! Stands in for `text.rs` in a build without the `text` feature (the demo's, for one):
//! `--tokenizer` is still a flag, so that using it says which feature is missing rather than
//! "unexpected argument", and token data cannot be inspected.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Result, bail};
use ringfeed_format::tokens::FlatDtype;

use crate::common::PackRun;

const NOT_BUILT: &str = "this ringfeed was built without text packing (the `text` feature: Hugging Face \
                         tokenizers and Parquet); use a build with default features (`cargo build --release \
                         -p ringfeed`, or the wheel)";

/// Text packing's one flag in this build: `--tokenizer`, refused.
#[derive(clap::Args, Debug)]
pub(crate) struct TextArgs {
    /// Pack text into a token dataset with this tokenizer.json (needs the `text` feature).
    #[arg(long, value_name = "FILE")]
    pub(crate) tokenizer: Option<PathBuf>,
}

pub(crate) fn pack(_: TextArgs, _: PackRun) -> Result<ExitCode> {
    bail!("pack --tokenizer: {NOT_BUILT}")
}

pub(crate) fn inspect(dataset: &Path, _: Option<FlatDtype>, _: u64, _: Option<&Path>, _: bool) -> Result<ExitCode> {
    bail!("inspect {}: token data: {NOT_BUILT}", dataset.display())
}
