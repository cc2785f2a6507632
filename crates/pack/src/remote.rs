//! What the command line does with remote datasets: `pack` uploads one; `verify` streams it
//! shard by shard through a temporary directory (one shard on disk at a time), with the local
//! checks; `inspect` reads only the index, each shard's record table (a suffix GET) and a few
//! samples' first bytes (ranged GETs), never whole shards.
//!
//! An upload sends every file but the index first and `index.rfi` last: a reader opens a dataset
//! by its index, so until the index is there the prefix is no dataset, and once it is, every
//! shard it names is there (S3 has no rename; this is the "atomic-ish" that the order gives).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ringfeed_format::shard::INDEX_FILE;
use ringfeed_format::tokens::TOKENS_FILE;
use ringfeed_remote::wds;
use ringfeed_remote::{Counters, RemoteConfig, RemoteError, RemoteUrl, Store};
use ringfeed_source::wds::{Catalog, WdsOptions, index};

/// A store for `url`'s bucket, for one command.
pub fn store_for(url: &RemoteUrl, config: &RemoteConfig) -> Result<Store, RemoteError> {
    Store::from_env(url.scheme, &url.bucket, config, Arc::new(Counters::default()))
}

/// Whether `url` already holds a packed image dataset (its index).
pub fn exists(store: &Store, url: &RemoteUrl) -> Result<bool, RemoteError> {
    Ok(existing_dataset(store, url)? == Some(INDEX_FILE))
}

/// The file that makes `url` a dataset already, a packed image dataset's index or a token
/// dataset's `tokens.rft`, if it holds one: what an upload would replace.
pub fn existing_dataset(store: &Store, url: &RemoteUrl) -> Result<Option<&'static str>, RemoteError> {
    let listed = store.list(&url.prefix)?;
    Ok([INDEX_FILE, TOKENS_FILE]
        .into_iter()
        .find(|name| listed.iter().any(|(k, _)| *k == url.key(name))))
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
    let Ok(ds) = ringfeed_format::shard::Dataset::index_only(&PathBuf::from(url.to_string()), index) else {
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

/// The index of the dataset at `url`, in memory and checked.
fn fetch_index(store: &Store, url: &RemoteUrl) -> Result<ringfeed_format::shard::Dataset, ToolError> {
    let (index, _) = match store.get_bytes(&url.key(INDEX_FILE)) {
        Err(RemoteError::Gone { .. }) => {
            return Err(RemoteError::Other {
                url: url.to_string(),
                why: format!("no packed dataset there: {} does not exist", url.object_url(INDEX_FILE)),
            }
            .into());
        }
        other => other?,
    };
    Ok(ringfeed_format::shard::Dataset::index_only(
        &PathBuf::from(url.to_string()),
        index,
    )?)
}

/// Why a remote `verify` or `inspect` failed.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error(transparent)]
    Shard(#[from] ringfeed_format::shard::ShardError),
    #[error(transparent)]
    Verify(#[from] ringfeed_format::shard::VerifyError),
    #[error(transparent)]
    Inspect(#[from] crate::inspect::InspectError),
}

impl ToolError {
    /// The error kind `ringfeed verify` prints (`proto/shard.md`, "Error kinds"; `remote` for
    /// the store).
    pub fn kind(&self) -> &'static str {
        match self {
            ToolError::Remote(_) => "remote",
            ToolError::Shard(e) => e.kind(),
            ToolError::Verify(e) => e.kind(),
            ToolError::Inspect(_) => "inspect",
        }
    }
}

/// Verifies the dataset at `url` as `ringfeed verify` does a local one, streaming: the index in
/// memory, then each shard downloaded into `dir`, checked and deleted before the next
/// (`shard::verify::verify_streaming`): the disk holds one shard at a time. `on_shard(n, of)`
/// is called as each download starts.
pub fn verify(
    store: &Store,
    url: &RemoteUrl,
    dir: &Path,
    opts: &ringfeed_format::shard::VerifyOptions<'_>,
    on_shard: &mut dyn FnMut(u32, u32),
) -> Result<ringfeed_format::shard::VerifyReport, ToolError> {
    let ds = fetch_index(store, url)?;
    std::fs::create_dir_all(dir).map_err(|e| RemoteError::Io {
        path: dir.to_owned(),
        source: e,
    })?;
    let count = ds.shard_count();
    let mut fetch = |n: u32| -> Result<PathBuf, ringfeed_format::shard::VerifyError> {
        on_shard(n, count);
        let name = ds.shard_name(n)?;
        let path = dir.join(name);
        let len = ds.shard_entry(n).file_len;
        store
            .download(&url.key(name), &path, len, None)
            .map_err(|e| ringfeed_format::shard::ShardError::io(&path, std::io::Error::other(e.to_string())))?;
        Ok(path)
    };
    let mut done = |_: u32, path: &Path| {
        let _ = std::fs::remove_file(path);
    };
    Ok(ringfeed_format::shard::verify::verify_streaming(
        &ds, &mut fetch, &mut done, opts,
    )?)
}

/// How many samples a remote `inspect` probes for their format (one small ranged GET each).
pub const REMOTE_FORMAT_PROBES: u64 = 32;

/// First bytes of a record read to tell its format.
const SNIFF_BYTES: u64 = 64;

/// Inspects the dataset at `url` with ranged GETs only: the index (whole; a few bytes per
/// sample), each shard's record table and footer (one suffix GET per shard, `16 × records + 72`
/// bytes), the first 64 bytes of at most [`REMOTE_FORMAT_PROBES`] evenly spaced samples, and
/// sample `sample` whole (if any). Never downloads a shard.
pub fn inspect(store: &Store, url: &RemoteUrl, sample: Option<u64>) -> Result<crate::inspect::Inspection, ToolError> {
    use ringfeed_format::shard::{RECORD_ENTRY_LEN, RecordEntry, SHARD_FOOTER_LEN, ShardFooter};
    let ds = fetch_index(store, url)?;
    let mut tables: Vec<Vec<RecordEntry>> = Vec::with_capacity(ds.shard_count() as usize);
    let mut files_bytes = ds.index.len();
    for n in 0..ds.shard_count() {
        let name = ds.shard_name(n)?.to_owned();
        let entry = ds.shard_entry(n);
        files_bytes += entry.file_len;
        let path = PathBuf::from(url.object_url(&name));
        let want =
            (u64::from(entry.record_count) * RECORD_ENTRY_LEN as u64 + SHARD_FOOTER_LEN as u64 + 8).min(entry.file_len);
        let from = entry.file_len - want;
        let tail = store.get_range(&url.key(&name), from..entry.file_len, None)?;
        let footer_at = entry.file_len - SHARD_FOOTER_LEN as u64;
        let footer = ShardFooter::decode(&path, footer_at, &tail[(footer_at - from) as usize..], entry.file_len)?;
        if footer.record_count != entry.record_count || footer.table_offset < from {
            return Err(ringfeed_format::shard::ShardError::corrupt(
                &path,
                footer_at + 12,
                format!(
                    "the footer records {} records, the index {}",
                    footer.record_count, entry.record_count
                ),
            )
            .into());
        }
        let table = &tail[(footer.table_offset - from) as usize..][..footer.record_count as usize * RECORD_ENTRY_LEN];
        let computed = ringfeed_format::shard::crc(table);
        if computed != footer.table_crc {
            return Err(ringfeed_format::shard::ShardError::Checksum {
                path,
                offset: footer.table_offset,
                what: "record table".into(),
                stored: footer.table_crc,
                computed,
            }
            .into());
        }
        tables.push(table.chunks_exact(RECORD_ENTRY_LEN).map(RecordEntry::decode).collect());
    }
    let record = |i: u64| -> Result<(ringfeed_format::shard::SampleEntry, RecordEntry, String), ToolError> {
        let (e, _, _) = ds.sample_entry(i)?;
        let r = tables
            .get(e.shard as usize)
            .and_then(|t| t.get(e.record as usize))
            .copied()
            .ok_or_else(|| {
                ringfeed_format::shard::ShardError::corrupt(
                    ds.index_path(),
                    ds.sample_entry_offset(i),
                    format!(
                        "sample {i} refers to shard {} record {}, which does not exist",
                        e.shard, e.record
                    ),
                )
            })?;
        Ok((e, r, ds.shard_name(e.shard)?.to_owned()))
    };
    let n = ds.len();
    let mut sizes = Vec::with_capacity(n as usize);
    let mut per_class = vec![0u64; ds.class_count() as usize];
    for i in 0..n {
        let (e, r, _) = record(i)?;
        sizes.push(u64::from(r.length));
        if let Some(c) = usize::try_from(e.label).ok().and_then(|l| per_class.get_mut(l)) {
            *c += 1;
        }
    }
    let classes = (0..ds.class_count())
        .map(|c| {
            Ok((
                String::from_utf8_lossy(ds.class_name(c)?).into_owned(),
                per_class[c as usize],
            ))
        })
        .collect::<Result<Vec<_>, ringfeed_format::shard::ShardError>>()?;
    let mut formats = std::collections::BTreeMap::new();
    let mut probed = 0;
    for i in (0..n).step_by(n.div_ceil(REMOTE_FORMAT_PROBES).max(1) as usize) {
        let (_, r, name) = record(i)?;
        let head = store.get_range(
            &url.key(&name),
            r.offset..r.offset + u64::from(r.length).min(SNIFF_BYTES),
            None,
        )?;
        let fmt = ringfeed_decode::sniff(&head).map_or("unknown".to_owned(), |f| f.to_string());
        *formats.entry(fmt).or_insert(0) += 1;
        probed += 1;
    }
    let sample = match sample {
        None => None,
        Some(i) if i >= n => return Err(crate::inspect::InspectError::NoSuchSample { index: i, len: n }.into()),
        Some(i) => {
            let (e, r, name) = record(i)?;
            let data = store.get_range(&url.key(&name), r.offset..r.offset + u64::from(r.length), None)?;
            let (_, key, meta) = ds.sample_entry(i)?;
            let mut info = crate::inspect::SampleInfo::new(i, key, e.label, &data, &classes);
            info.meta = (!meta.is_empty()).then(|| String::from_utf8_lossy(meta).into_owned());
            info.location = Some((url.object_url(&name), r.offset, r.crc));
            Some(info)
        }
    };
    Ok(crate::inspect::Inspection {
        kind: "packed".to_owned(),
        path: url.to_string(),
        samples: n,
        shards: Some(ds.shard_count()),
        files_bytes: Some(files_bytes),
        classes,
        sizes: crate::inspect::SizeStats::from(sizes),
        formats,
        probed,
        info: ds.info().ok().and_then(|i| serde_json::from_str(i).ok()),
        sample,
        webdataset: None,
        labels: None,
        targets: None,
    })
}

/// How many samples a remote `inspect` of tars reads (one ranged GET of each one's members).
pub const INSPECT_PROBES: u64 = 32;

/// `ringfeed inspect s3://...` of tars: what the local inspect of the same tars reports, read
/// with ranged GETs wherever an index file allows. Each tar's member table comes from its
/// `TAR.rfidx` when that is valid ([`wds::check_index`]: one GET of it, and two of 512 bytes when
/// the listing gives no ETag), else from the tar downloaded into `dir` and scanned (then
/// deleted; `ringfeed index` writes the missing indexes). Counts, extensions, keys and image
/// sizes come from the member tables alone; formats and labels from at most
/// [`INSPECT_PROBES`] evenly spaced samples (one ranged GET of each one's members), and
/// sample `sample` from one more.
pub fn inspect_tars(
    store: &Store,
    url: &RemoteUrl,
    sample: Option<u64>,
    dir: &Path,
) -> Result<crate::inspect::Inspection, ToolError> {
    use crate::inspect::{InspectError, Inspection, LabelStats, SizeStats, WdsSummary, wds_sample_info};
    let listing = wds::list_tars(store, url)?;
    let opts = WdsOptions {
        write_index: false,
        ..WdsOptions::default()
    };
    let mut cat = Catalog::new(&url.to_string(), &opts);
    let (mut from_index, mut read_whole) = (0u64, 0u64);
    let object_url = |key: &str| url.key_url(key);
    for o in &listing.tars {
        let index_key = format!("{}{}", o.key, index::SUFFIX);
        let indexed = listing.indexes.contains_key(&index_key).then(|| {
            store
                .probe_bytes(&index_key)
                .map_err(wds::TarIndexError::from)
                .and_then(|(b, _)| wds::check_index(store, o, &b))
        });
        let scan = match indexed {
            Some(Ok((scan, _))) => {
                from_index += 1;
                scan
            }
            other => {
                if let Some(Err(why)) = other {
                    tracing::warn!("{}: not using it: {why}; reading the tar whole", object_url(&index_key));
                }
                read_whole += 1;
                wds::download_scan(store, &object_url(&o.key), o, dir)?.0
            }
        };
        cat.add(PathBuf::from(object_url(&o.key)), scan.members, &scan.end);
    }
    if let Some(p) = cat.problems().first() {
        return Err(InspectError::Damaged {
            key: String::from_utf8_lossy(&p.key).into_owned(),
            reason: p.reason.clone(),
        }
        .into());
    }
    // One ranged GET of sample `i`'s members: the sample looked up in it.
    let window = |i: u64| -> Result<(Vec<u8>, u64), ToolError> {
        let m = cat.sample_members(i).expect("in range");
        let (first, last) = (&m.members[0], &m.members[m.members.len() - 1]);
        let key = &listing.tars[m.tar as usize].key;
        let end = (last.offset + last.size).min(listing.tars[m.tar as usize].size);
        Ok((store.get_range(key, first.offset..end, None)?, first.offset))
    };
    let n = cat.len();
    let mut sizes = Vec::with_capacity(n as usize);
    for i in 0..n {
        let m = cat.sample_members(i).expect("in range");
        match m.image {
            // A sample the local inspect fails on fails here too, with its message.
            Some(image) if m.label.is_some() || opts.label.is_none() => sizes.push(image.size),
            _ => {
                let (data, base) = window(i)?;
                cat.lookup_window(i, &data, base).map_err(InspectError::from)?;
            }
        }
    }
    let mut formats = std::collections::BTreeMap::new();
    let mut labels = Vec::new();
    let mut probed = 0;
    for i in (0..n).step_by(n.div_ceil(INSPECT_PROBES).max(1) as usize) {
        let (data, base) = window(i)?;
        let s = cat.lookup_window(i, &data, base).map_err(InspectError::from)?;
        let fmt = ringfeed_decode::sniff(s.data).map_or("unknown".to_owned(), |f| f.to_string());
        *formats.entry(fmt).or_insert(0) += 1;
        if opts.label.is_some() {
            labels.push(s.label);
        }
        probed += 1;
    }
    let sample = match sample {
        None => None,
        Some(i) if i >= n => return Err(InspectError::NoSuchSample { index: i, len: n }.into()),
        Some(i) => {
            let (data, base) = window(i)?;
            Some(wds_sample_info(&cat, i, &data, base)?)
        }
    };
    let mut summary = WdsSummary::of(&cat);
    summary.from_index = Some((from_index, read_whole));
    Ok(Inspection {
        kind: "webdataset".into(),
        path: url.to_string(),
        samples: n,
        shards: Some(listing.tars.len() as u32),
        files_bytes: Some(listing.tars.iter().map(|o| o.size).sum()),
        classes: Vec::new(),
        sizes: SizeStats::from(sizes),
        formats,
        probed,
        info: None,
        sample,
        webdataset: Some(summary),
        labels: (!labels.is_empty()).then(|| LabelStats::from(&labels)),
        targets: None,
    })
}
