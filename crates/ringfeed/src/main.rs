//! The `ringfeed` command: parses flags, calls the library, prints results and errors.
//!
//! One module per subcommand (its arguments and its `run_*`); [`common`] holds what several share.

mod bench;
mod common;
mod index;
mod inspect;
mod ops;
mod pack;
mod packing;
#[cfg_attr(not(feature = "remote"), path = "remote_absent.rs")]
mod remote;
mod serve;
#[cfg_attr(not(feature = "text"), path = "text_absent.rs")]
mod text;
mod top;
mod verify;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use bench::{BenchArgs, run_bench};
use index::{IndexArgs, run_index};
use inspect::{InspectArgs, run_inspect};
use ops::{OpsArgs, run_ops};
use pack::{PackArgs, run_pack};
use packing::{PackingArgs, run_packing};
use serve::{ServeArgs, run_serve};
use top::{TopArgs, run_top};
use verify::{VerifyArgs, run_verify};

/// Exit status for a run stopped by SIGINT or SIGTERM (128 + SIGINT, as shells report it).
const EXIT_INTERRUPTED: u8 = 130;

#[derive(Parser, Debug)]
#[command(
    name = "ringfeed",
    version,
    about = "Keeps GPUs fed: packs image datasets and serves decoded batches"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Pack an image folder, a manifest (CSV/JSONL) or an LMDB into a packed dataset; with
    /// --tokenizer, pack text (JSONL, plain text) into a token dataset.
    Pack(Box<PackArgs>),
    /// Check a packed dataset: magics, versions, checksums, index consistency, and optionally
    /// that every sample decodes. Exits non-zero at the first problem.
    Verify(VerifyArgs),
    /// Print counts, classes, size statistics and one sample's metadata.
    Inspect(InspectArgs),
    /// Write the index file (TAR.rfidx) beside each WebDataset tar, local or in a store
    /// (s3://...), so that serving it opens without scanning the tar; a valid index is left as
    /// it is. Exits non-zero when a tar is damaged (it is indexed up to the damage).
    Index(IndexArgs),
    /// Write the `pack`-mode windows of an existing token dataset for a seq_len
    /// (DATASET/packing-N.rfp), so that a `pack` stream opens without packing every document at
    /// start-up (`pack --pack-seq-len` does the same while packing).
    Packing(PackingArgs),
    /// Run the sidecar: serve decoded batches to training processes over a Unix socket.
    Serve(ServeArgs),
    /// Show every stream of a running server: throughput, the training loop's wait, threads,
    /// depth, slot states and per-stage times, refreshed every second.
    Top(TopArgs),
    /// Run a pipeline (control.md, "Pipelines") on one image file, as the server would for
    /// sample indices `--index ..` of `--epoch`, and write the images (HWC, RGB8, outputs in
    /// order) to `--out`; print each sample's drawn parameters as a JSON line. For checking
    /// ops against torchvision, and for seeing what a pipeline does to a picture.
    Ops(OpsArgs),
    /// Measure img/s by thread count on this machine and dataset, beside a DataLoader + PIL,
    /// and the threads a target rate needs (runs `python3 -m ringfeed.bench`; `--help` lists
    /// its options).
    #[command(disable_help_flag = true)]
    Bench(BenchArgs),
}

/// The error and its causes on one line, "context: cause: cause", leaving out a cause whose text
/// the message already ends with (our error types print their source inline).
fn one_line(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if msg.ends_with(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    msg
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RINGFEED_LOG").unwrap_or_else(|_| {
                "warn,ringfeed_serve::tune=info,ringfeed_order::windows=info,ringfeed_order::mix=info".into()
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Pack(a) => run_pack(*a),
        Command::Verify(a) => run_verify(a),
        Command::Inspect(a) => run_inspect(a),
        Command::Index(a) => run_index(a),
        Command::Packing(a) => run_packing(a),
        Command::Serve(a) => run_serve(a),
        Command::Top(a) => run_top(a),
        Command::Ops(a) => run_ops(a),
        Command::Bench(a) => run_bench(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}
