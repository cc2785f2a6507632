//! `ringfeed packing`: the `pack`-mode windows of a token dataset, written once.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};

#[derive(clap::Args, Debug)]
pub(crate) struct PackingArgs {
    /// A token dataset directory (DATASET/tokens.rft).
    pub(crate) dataset: PathBuf,
    /// The seq_len to write the `pack`-mode windows for (DATASET/packing-N.rfp, replaced if it
    /// exists). Repeatable, or comma-separated.
    #[arg(long, value_name = "N", required = true, value_delimiter = ',')]
    pub(crate) seq_len: Vec<u32>,
}

pub(crate) fn run_packing(a: PackingArgs) -> Result<ExitCode> {
    ringfeed_format::fault::install().context("installing the SIGBUS handler")?;
    let tf = ringfeed_format::tokens::TokenFile::open(&a.dataset)?;
    let mut seq_lens = a.seq_len;
    seq_lens.sort_unstable();
    seq_lens.dedup();
    for s in seq_lens {
        let t0 = std::time::Instant::now();
        let h = ringfeed_format::tokens::packing::write(&tf, s)?;
        println!(
            "wrote {}: {} documents in {} windows of seq_len {s} ({} tokens cut), {:.1} s",
            tf.dir().join(ringfeed_format::tokens::packing::file_name(s)).display(),
            h.doc_count,
            h.window_count,
            h.cut_tokens,
            t0.elapsed().as_secs_f64()
        );
    }
    if let Some(off) = tf.fault() {
        bail!("{} changed while it was read (at byte {off})", tf.path().display());
    }
    Ok(ExitCode::SUCCESS)
}
