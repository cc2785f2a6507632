//! `ringfeed index`: WebDataset tar indexes, local or in a store.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use ringfeed_pack::ProgressMode;
use ringfeed_pack::progress::Progress;

use crate::common::{RemoteArgs, TempDir, remote_url};

#[derive(clap::Args, Debug)]
pub(crate) struct IndexArgs {
    /// WebDataset tars: directories of `*.tar` files, `.tar` files, or patterns
    /// (`shards-{000..099}.tar`, `shards-*.tar`); or tars in a store, `s3://bucket/prefix`
    /// (every `*.tar` under it), a pattern or one `.tar` key, whose index is written beside
    /// each tar in the store (each tar downloaded once, `--fetch-concurrency` at a time,
    /// through a temporary directory).
    #[arg(required = true)]
    pub(crate) datasets: Vec<String>,
    /// Progress display (tars in a store).
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    pub(crate) progress: ProgressMode,
    #[command(flatten)]
    pub(crate) remote: RemoteArgs,
}

pub(crate) fn run_index(a: IndexArgs) -> Result<ExitCode> {
    use ringfeed_source::wds;
    let mut damaged = 0;
    let (mut written, mut fresh) = (0, 0);
    for d in &a.datasets {
        if let Some(url) = remote_url(Path::new(d))? {
            let (w, f, bad) = run_index_remote(&a, &url)?;
            (written, fresh, damaged) = (written + w, fresh + f, damaged + bad);
            continue;
        }
        let tars = wds::pattern::tars(d).map_err(anyhow::Error::msg)?;
        for t in &tars {
            let r = wds::write_index(t, &std::sync::atomic::AtomicU64::new(0))?;
            let what = if r.fresh { "index valid, kept" } else { "index written" };
            println!("{}: {} members, {what}", t.display(), r.members);
            if let Some(p) = &r.problem {
                eprintln!("ringfeed: {}: {p}", t.display());
                damaged += 1;
            }
            if r.fresh {
                fresh += 1;
            } else {
                written += 1;
            }
        }
    }
    eprintln!("ringfeed: {written} index files written, {fresh} already valid, {damaged} damaged tars");
    Ok(if damaged > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `index s3://...`: every tar's index checked or written beside it in the store; returns the
/// index files written, those already valid, and the damaged tars.
pub(crate) fn run_index_remote(a: &IndexArgs, url: &ringfeed_remote::RemoteUrl) -> Result<(usize, usize, usize)> {
    let config = a.remote.config()?;
    let store = ringfeed_pack::remote::store_for(url, &config)?;
    let tmp = TempDir::new("index")?;
    let progress = Progress::new(a.progress);
    progress.message(&format!("indexing the tars of {url}"));
    let on_start = |i: usize, n: usize, key: &str, size: u64| {
        progress.message(&format!(
            "indexing tar {} of {n}: s3://{}/{key} ({:.1} MB)",
            i + 1,
            url.bucket,
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
