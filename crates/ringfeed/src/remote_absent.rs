//! Stands in for `remote.rs` in a build without the `remote` feature (the demo's, for one): no
//! `RemoteUrl` can exist, so the subcommands' remote halves cannot be reached, and an `s3://`
//! argument is refused with an error that names the feature.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use ringfeed_format::shard::{VerifyOptions, VerifyReport};
use ringfeed_pack::ProgressMode;
use ringfeed_pack::inspect::Inspection;
use ringfeed_pack::progress::Progress;

/// A dataset on object storage; uninhabited in this build.
#[derive(Debug)]
pub(crate) enum RemoteUrl {}

impl std::fmt::Display for RemoteUrl {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {}
    }
}

/// Object storage's flags do not exist in this build.
#[derive(clap::Args, Debug)]
pub(crate) struct RemoteArgs {}

/// `Ok(None)` for a path; an error naming the feature for an `s3://` URL.
pub(crate) fn remote_url(p: &Path) -> Result<Option<RemoteUrl>> {
    match p.to_str() {
        Some(s) if ringfeed_format::control::names_object_storage(s) => bail!(ringfeed_serve::remote_not_built(s)),
        _ => Ok(None),
    }
}

/// An upload of a packed dataset; none can start in this build.
#[derive(Debug)]
pub(crate) struct Upload(RemoteUrl);

impl Upload {
    pub(crate) fn start(_: &RemoteArgs, url: RemoteUrl, _: bool) -> Result<Upload> {
        match url {}
    }
    pub(crate) fn local(&self) -> PathBuf {
        match self.0 {}
    }
    pub(crate) fn finish(self) -> Result<()> {
        match self.0 {}
    }
}

pub(crate) fn verify(_: &RemoteArgs, url: &RemoteUrl, _: &VerifyOptions<'_>, _: &Progress) -> Result<VerifyReport> {
    match *url {}
}

pub(crate) fn inspect(_: &RemoteArgs, url: &RemoteUrl, _: u64) -> Result<Inspection> {
    match *url {}
}

pub(crate) fn index(_: &RemoteArgs, _: ProgressMode, url: &RemoteUrl) -> Result<(usize, usize, usize)> {
    match *url {}
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    #[test]
    fn a_url_is_refused_naming_the_feature_and_a_path_is_not_a_url() {
        let e = super::remote_url(Path::new("s3://bucket/prefix"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("s3://bucket/prefix: "), "{e}");
        assert!(e.contains("the `remote` feature"), "{e}");
        assert!(super::remote_url(Path::new("/data/packed")).unwrap().is_none());
    }
}
