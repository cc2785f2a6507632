//! `ringfeed bench`: the Python throughput bench, run with this binary.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};

/// `ringfeed bench`'s arguments, all passed to the Python module that measures (the baseline it
/// compares with is a Python DataLoader, and the ringfeed figure is the Python Loader's).
#[derive(clap::Args, Debug)]
pub(crate) struct BenchArgs {
    /// DATASET and options, as `python3 -m ringfeed.bench --help` lists them.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
    pub(crate) args: Vec<std::ffi::OsString>,
}

/// Replaces this process with `PYTHON -m ringfeed.bench ARGS`, where PYTHON is
/// `$RINGFEED_PYTHON`, else the `python3` beside this binary (a virtualenv's, where the wheel
/// put both), else `python3` on `PATH`. The Loader it runs starts this very binary as its server
/// (`RINGFEED_BIN`).
pub(crate) fn run_bench(a: BenchArgs) -> Result<ExitCode> {
    use std::os::unix::process::CommandExt;
    let me = std::env::current_exe().context("finding this binary's path")?;
    let python = std::env::var_os("RINGFEED_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            let beside = me.parent()?.join("python3");
            beside.is_file().then_some(beside)
        })
        .unwrap_or_else(|| PathBuf::from("python3"));
    let err = std::process::Command::new(&python)
        .args(["-m", "ringfeed.bench"])
        .args(&a.args)
        .env("RINGFEED_BIN", &me)
        .exec();
    bail!(
        "cannot run `{} -m ringfeed.bench`: {err} (set RINGFEED_PYTHON to a Python with the ringfeed package installed)",
        python.display()
    )
}
