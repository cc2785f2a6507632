//! What the command line does with remote datasets: `pack` uploads one, `verify` and `inspect`
//! download one to read it with the local tools.
//!
//! An upload sends every file but the index first and `index.rfi` last: a reader opens a dataset
//! by its index, so until the index is there the prefix is no dataset, and once it is, every
//! shard it names is there (S3 has no rename; this is the "atomic-ish" that the order gives).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Counters, RemoteConfig, RemoteError, RemoteUrl, Store};
use crate::shard::INDEX_FILE;

/// A store for `url`'s bucket, for one command.
pub fn store_for(url: &RemoteUrl, config: &RemoteConfig) -> Result<Store, RemoteError> {
    Store::from_env(&url.bucket, config, Arc::new(Counters::default()))
}

/// Whether `url` already holds a dataset (its index).
pub fn exists(store: &Store, url: &RemoteUrl) -> Result<bool, RemoteError> {
    let listed = store.list(&url.prefix)?;
    let index = url.key(INDEX_FILE);
    Ok(listed.iter().any(|(k, _)| *k == index))
}

/// Uploads the dataset directory `dir` to `url`: every file but the index, in name order, then
/// the index. Returns the files and bytes sent.
pub fn upload(store: &Store, dir: &Path, url: &RemoteUrl) -> Result<(usize, u64), RemoteError> {
    let io = |e: std::io::Error| RemoteError::Io {
        path: dir.to_owned(),
        source: e,
    };
    let mut files: Vec<(String, u64)> = Vec::new();
    for ent in std::fs::read_dir(dir).map_err(io)? {
        let ent = ent.map_err(io)?;
        let meta = ent.metadata().map_err(io)?;
        if meta.is_file() {
            files.push((ent.file_name().to_string_lossy().into_owned(), meta.len()));
        }
    }
    files.sort_by_key(|(name, _)| (name == INDEX_FILE, name.clone()));
    let mut bytes = 0;
    for (name, len) in &files {
        store.put_file(&url.key(name), &dir.join(name))?;
        bytes += len;
    }
    Ok((files.len(), bytes))
}

/// Downloads the dataset at `url` into the new directory `dest` (the index, then every shard
/// it names, each checked for its length), for the local `verify` and `inspect`.
pub fn download(store: &Store, url: &RemoteUrl, dest: &Path) -> Result<PathBuf, RemoteError> {
    let io = |p: &Path, e: std::io::Error| RemoteError::Io {
        path: p.to_owned(),
        source: e,
    };
    std::fs::create_dir_all(dest).map_err(|e| io(dest, e))?;
    let (index, _) = match store.get_bytes(&url.key(INDEX_FILE)) {
        Err(RemoteError::Gone { .. }) => {
            return Err(RemoteError::Other {
                url: url.to_string(),
                why: format!("no packed dataset there: {} does not exist", url.object_url(INDEX_FILE)),
            });
        }
        other => other?,
    };
    let index_path = dest.join(INDEX_FILE);
    std::fs::write(&index_path, &index).map_err(|e| io(&index_path, e))?;
    // The shards the index names, with their lengths; a damaged index is left for `verify` to
    // report, with what was downloaded so far.
    let Ok(ds) = crate::shard::Dataset::index_only(&PathBuf::from(url.to_string()), index) else {
        return Ok(dest.to_owned());
    };
    for n in 0..ds.shard_count() {
        let Ok(name) = ds.shard_name(n) else { break };
        let len = ds.shard_entry(n).file_len;
        let path = dest.join(name);
        match store.download(&url.key(name), &path, len, None) {
            Ok(_) => {}
            // A shard of another length is kept out; `verify` names it as missing.
            Err(RemoteError::Other { .. }) => {
                let _ = std::fs::remove_file(&path);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(dest.to_owned())
}
