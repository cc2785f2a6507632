//! `ringfeed index`: WebDataset tar indexes, local or in a store.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use ringfeed_pack::ProgressMode;

use crate::remote::{RemoteArgs, remote_url};

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
            let (w, f, bad) = crate::remote::index(&a.remote, a.progress, &url)?;
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
