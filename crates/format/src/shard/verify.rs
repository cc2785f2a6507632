//! Full verification of a packed dataset: every byte of every file is checked.
//!
//! The checks run in the order `proto/shard.md` ("Verification order") fixes, and stop at the
//! first problem, so the Rust and Python implementations report the same first error for the same
//! damage (the vectors in `proto/vectors/shard/cases.json` pin it).

use std::path::Path;

use super::reader::{Dataset, Shard};
use super::{
    CLASS_ENTRY_LEN, INDEX_FOOTER_LEN, INDEX_HEADER_LEN, RECORD_ENTRY_LEN, SHARD_ENTRY_LEN, SHARD_FOOTER_LEN,
    SHARD_HEADER_LEN, ShardError, align_up, crc, le,
};

/// A per-sample check supplied by the caller (`--decode` passes an image decoder). It gets the
/// sample's bytes and returns the caller's error on failure (this crate is below the decoders,
/// so it cannot name their error types). Called from several threads at once.
pub type SampleCheck<'a> = &'a (dyn Fn(&[u8]) -> Result<(), SampleCheckError> + Sync);

/// Why a [`SampleCheck`] rejected a sample: the caller's own error.
pub type SampleCheckError = Box<dyn std::error::Error + Send + Sync>;

/// What to verify beyond the format itself.
#[derive(Clone, Copy, Default)]
pub struct VerifyOptions<'a> {
    /// Run this on every sample after the format checks passed.
    pub sample_check: Option<SampleCheck<'a>>,
    /// Threads for `sample_check` (0 = all cores).
    pub threads: usize,
    /// Called with (bytes checked, bytes total) as the checksums progress.
    pub progress: Option<&'a (dyn Fn(u64, u64) + Sync)>,
}

impl std::fmt::Debug for VerifyOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyOptions")
            .field("sample_check", &self.sample_check.is_some())
            .field("threads", &self.threads)
            .finish()
    }
}

/// What a successful verification covered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    pub samples: u64,
    pub shards: u32,
    pub classes: u32,
    /// Bytes of all files, all of them checksummed.
    pub bytes: u64,
    /// Samples that went through the sample check (0 without one).
    pub checked_samples: u64,
}

/// Why verification failed: a format problem, or a sample that the sample check rejected.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Format(#[from] ShardError),
    #[error("{} at byte {offset}: sample {index} (key {key:?}) does not decode: {reason}", shard.display())]
    Sample {
        shard: std::path::PathBuf,
        offset: u64,
        index: u64,
        key: String,
        #[source]
        reason: SampleCheckError,
    },
}

impl VerifyError {
    /// The spec's error kind; a failed sample check is `decode`.
    pub fn kind(&self) -> &'static str {
        match self {
            VerifyError::Format(e) => e.kind(),
            VerifyError::Sample { .. } => "decode",
        }
    }
}

/// Verifies the dataset in `dir`. See `proto/shard.md` for the list and order of checks.
pub fn verify(dir: &Path, opts: &VerifyOptions<'_>) -> Result<VerifyReport, VerifyError> {
    // 1. Structure: footers, headers, section bounds, shard files tied to the index.
    let ds = Dataset::open(dir)?;
    verify_dataset(&ds, opts)
}

/// Verifies an already opened dataset (steps 2 onwards of the spec's order).
///
/// A file cut or made unreadable while it is being verified raises SIGBUS on its mapping; with
/// the handler of [`crate::fault`] installed here, that becomes [`ShardError::Changed`] naming
/// the file and the offset (the root cause, reported instead of whatever the zeros read after
/// the fault made the checks say), never a dead process.
pub fn verify_dataset(ds: &Dataset, opts: &VerifyOptions<'_>) -> Result<VerifyReport, VerifyError> {
    crate::fault::install().map_err(|e| ShardError::io(ds.index_path(), e))?;
    let result = verify_mapped(ds, opts);
    // Any fault is the root cause: checked after the result, whether it is Ok or an error.
    ds.check_faults(0, None).map_err(|e| match e {
        ShardError::Changed { path, offset, now, .. } => ShardError::Changed {
            path,
            offset,
            what: "it for verification".into(),
            now,
        },
        other => other,
    })?;
    result
}

/// The bytes checked so far out of `total`, reported to [`VerifyOptions::progress`] as they grow.
struct Progress<'a> {
    done: u64,
    total: u64,
    report: Option<&'a (dyn Fn(u64, u64) + Sync)>,
}

impl<'a> Progress<'a> {
    /// Checks the index (steps 2 and 3) and counts its bytes as checked: where both verifications
    /// start, for a dataset of `total` bytes.
    fn after_index(ds: &Dataset, total: u64, opts: &VerifyOptions<'a>) -> Result<Self, VerifyError> {
        check_index(ds)?;
        let mut p = Progress {
            done: 0,
            total,
            report: opts.progress,
        };
        p.add(ds.index.len());
        Ok(p)
    }

    fn add(&mut self, bytes: u64) {
        self.done += bytes;
        if let Some(report) = self.report {
            report(self.done, self.total);
        }
    }

    /// What the verification covered, once every check has passed.
    fn finished(&self, ds: &Dataset, checked_samples: u64) -> VerifyReport {
        VerifyReport {
            samples: ds.len(),
            shards: ds.shard_count(),
            classes: ds.class_count(),
            bytes: self.total,
            checked_samples,
        }
    }
}

fn verify_mapped(ds: &Dataset, opts: &VerifyOptions<'_>) -> Result<VerifyReport, VerifyError> {
    let total: u64 = ds.index.len() + ds.shards.iter().map(|s| s.file.len()).sum::<u64>();
    let mut progress = Progress::after_index(ds, total, opts)?;
    let counts: Vec<u32> = ds.shards.iter().map(|s| s.footer.record_count).collect();
    check_references(
        ds,
        &counts,
        &|n, r| {
            (
                ds.shards[n as usize].path().to_owned(),
                ds.shards[n as usize].footer.table_offset + u64::from(r) * RECORD_ENTRY_LEN as u64,
            )
        },
        &|i| ds.sample(i).map(drop),
    )?;

    // 4. Every shard, front to back.
    for shard in &ds.shards {
        check_shard(shard, &mut |bytes| progress.add(bytes))?;
    }

    // 5. The caller's per-sample check, in parallel, reporting the lowest failing index.
    let checked_samples = match opts.sample_check {
        Some(check) => run_sample_check(ds, check, opts.threads)?,
        None => 0,
    };
    Ok(progress.finished(ds, checked_samples))
}

/// Steps 2 and 3 of the index: its body checksum and its contents.
fn check_index(ds: &Dataset) -> Result<(), VerifyError> {
    let footer_at = ds.index.len() - super::INDEX_FOOTER_LEN as u64;
    let computed = crc(&ds.index.map[..footer_at as usize]);
    if computed != ds.footer.body_crc {
        return Err(ShardError::Checksum {
            path: ds.index_path().to_owned(),
            offset: footer_at + 12,
            what: format!("index body (bytes 0..{footer_at})"),
            stored: ds.footer.body_crc,
            computed,
        }
        .into());
    }
    check_index_contents(ds)?;
    Ok(())
}

/// Every sample's label, metadata and record: each record of shard `n` (of `counts[n]`) used by
/// exactly one sample. `record_at(n, r)`: the file and offset naming record `r` of shard `n` in
/// an error; `first(i)`: a check of sample `i` run before these (an opened dataset reads it).
/// Returns the samples of each shard, in index order.
fn check_references(
    ds: &Dataset,
    counts: &[u32],
    record_at: &dyn Fn(u32, u32) -> (std::path::PathBuf, u64),
    first: &dyn Fn(u64) -> Result<(), ShardError>,
) -> Result<Vec<Vec<u64>>, VerifyError> {
    let mut referenced: Vec<Vec<bool>> = counts.iter().map(|&c| vec![false; c as usize]).collect();
    let mut by_shard: Vec<Vec<u64>> = vec![Vec::new(); counts.len()];
    for i in 0..ds.len() {
        first(i)?;
        let (e, _key, meta) = ds.sample_entry(i)?;
        let at = ds.sample_entry_offset(i);
        if e.label < -1 || (ds.class_count() > 0 && e.label >= i64::from(ds.class_count())) {
            return Err(ShardError::corrupt(
                ds.index_path(),
                at,
                format!("sample {i} has label {}, outside -1..{}", e.label, ds.class_count()),
            )
            .into());
        }
        if !meta.is_empty() && !is_json_object(meta) {
            return Err(ShardError::corrupt(
                ds.index_path(),
                at + 20,
                format!("sample {i} has metadata that is not a UTF-8 JSON object"),
            )
            .into());
        }
        let seen = referenced
            .get_mut(e.shard as usize)
            .and_then(|r| r.get_mut(e.record as usize))
            .ok_or_else(|| {
                ShardError::corrupt(
                    ds.index_path(),
                    at + 24,
                    format!(
                        "sample {i} refers to shard {} record {}, which does not exist",
                        e.shard, e.record
                    ),
                )
            })?;
        if *seen {
            return Err(ShardError::corrupt(
                ds.index_path(),
                at + 24,
                format!(
                    "sample {i} refers to shard {} record {}, which an earlier sample already uses",
                    e.shard, e.record
                ),
            )
            .into());
        }
        *seen = true;
        by_shard[e.shard as usize].push(i);
    }
    for (n, refs) in referenced.iter().enumerate() {
        if let Some(r) = refs.iter().position(|&seen| !seen) {
            let (path, offset) = record_at(n as u32, r as u32);
            return Err(ShardError::corrupt(
                &path,
                offset,
                format!("record {r} is not referenced by any sample of the index"),
            )
            .into());
        }
    }
    Ok(by_shard)
}

/// Verifies a dataset whose index is in memory (`Dataset::index_only`) and whose shards are
/// had one at a time (a remote dataset, `ringfeed_pack::remote::verify`): every check of
/// [`verify`], in its order for the index, then shard by shard: `fetch(n)` makes shard `n` a
/// local file, it is checked (structure, every CRC, then `opts.sample_check` on its samples),
/// and `done(n, path)` may delete it before the next is fetched. So the disk holds one shard at
/// a time. A failing sample check reports the lowest failing index of the first shard with one.
pub fn verify_streaming(
    ds: &Dataset,
    fetch: &mut dyn FnMut(u32) -> Result<std::path::PathBuf, VerifyError>,
    done_with: &mut dyn FnMut(u32, &Path),
    opts: &VerifyOptions<'_>,
) -> Result<VerifyReport, VerifyError> {
    crate::fault::install().map_err(|e| ShardError::io(ds.index_path(), e))?;
    let entries: Vec<_> = (0..ds.shard_count()).map(|n| ds.shard_entry(n)).collect();
    let total: u64 = ds.index.len() + entries.iter().map(|e| e.file_len).sum::<u64>();
    let mut progress = Progress::after_index(ds, total, opts)?;
    let counts: Vec<u32> = entries.iter().map(|e| e.record_count).collect();
    let names: Vec<String> = (0..ds.shard_count())
        .map(|n| ds.shard_name(n).map(str::to_owned))
        .collect::<Result<_, _>>()?;
    let by_shard = check_references(
        ds,
        &counts,
        &|n, r| (ds.dir().join(&names[n as usize]), u64::from(r)),
        &|_| Ok(()),
    )?;
    let mut checked_samples = 0;
    for n in 0..ds.shard_count() {
        let path = fetch(n)?;
        let result = (|| -> Result<u64, VerifyError> {
            let shard = ds.open_shard_at(n, &path)?;
            let r = check_shard(&shard, &mut |bytes| progress.add(bytes));
            if let Some(at) = shard.file.fault() {
                return Err(shard.file.changed(at, "the shard, while it was verified".into()).into());
            }
            r?;
            match opts.sample_check {
                Some(check) => check_shard_samples(ds, &shard, &by_shard[n as usize], check, opts.threads),
                None => Ok(0),
            }
        })();
        done_with(n, &path);
        checked_samples += result?;
    }
    Ok(progress.finished(ds, checked_samples))
}

/// `check` on the samples `indices` of `shard`, on `threads` threads; the lowest failing index.
fn check_shard_samples(
    ds: &Dataset,
    shard: &Shard,
    indices: &[u64],
    check: SampleCheck<'_>,
    threads: usize,
) -> Result<u64, VerifyError> {
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .clamp(1, indices.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures: Vec<Option<VerifyError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> Option<VerifyError> {
                    let mut first: Option<VerifyError> = None;
                    loop {
                        // Relaxed: the counter only hands out distinct positions.
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&i) = indices.get(k) else { return first };
                        let got = ds
                            .sample_entry(i)
                            .and_then(|(e, key, _)| Ok((shard.record(e.record)?, key)));
                        let (r, key) = match got {
                            Ok(x) => x,
                            Err(e) => return Some(e.into()),
                        };
                        if let Err(reason) = check(shard.bytes(&r)) {
                            let older = first
                                .as_ref()
                                .is_some_and(|f| matches!(f, VerifyError::Sample { index, .. } if *index < i));
                            if !older {
                                first = Some(VerifyError::Sample {
                                    shard: shard.path().to_owned(),
                                    offset: r.offset,
                                    index: i,
                                    key: String::from_utf8_lossy(key).into_owned(),
                                    reason,
                                });
                            }
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(None)).collect()
    });
    match failures.into_iter().flatten().min_by_key(|e| match e {
        VerifyError::Sample { index, .. } => *index,
        VerifyError::Format(_) => 0,
    }) {
        Some(e) => Err(e),
        None => Ok(indices.len() as u64),
    }
}

fn is_json_object(b: &[u8]) -> bool {
    matches!(
        serde_json::from_slice::<serde_json::Value>(b),
        Ok(serde_json::Value::Object(_))
    )
}

/// Checks `bytes` (at `offset` of `path`) are all zero.
fn check_zero(path: &Path, offset: u64, bytes: &[u8], what: &str) -> Result<(), ShardError> {
    match bytes.iter().position(|&b| b != 0) {
        None => Ok(()),
        Some(p) => Err(ShardError::corrupt(
            path,
            offset + p as u64,
            format!("non-zero byte in {what}"),
        )),
    }
}

fn check_index_contents(ds: &Dataset) -> Result<(), ShardError> {
    let h = &ds.header;
    let path = ds.index_path();
    let map = &ds.index.map;
    let zero = |from: u64, to: u64, what: &str| -> Result<(), ShardError> {
        if to < from {
            return Err(ShardError::corrupt(
                path,
                from,
                format!("{what}: sections overlap or are out of order"),
            ));
        }
        check_zero(path, from, &map[from as usize..to as usize], what)
    };
    let a8 = |x: u64| align_up(x, 8).unwrap_or(u64::MAX);
    // A newer minor version may add sections or give reserved bytes a meaning, so the exact
    // layout and the zero checks apply to the structures of a 1.0 file only.
    if h.minor == 0 {
        // Sections in the spec's order, each at the first multiple of 8 after the previous one.
        let ends = [
            (INDEX_HEADER_LEN as u64, h.shards_offset, "shard table"),
            (
                h.shards_offset + u64::from(h.shard_count) * SHARD_ENTRY_LEN as u64,
                h.classes_offset,
                "class table",
            ),
            (
                h.classes_offset + u64::from(h.class_count) * CLASS_ENTRY_LEN as u64,
                h.samples_offset,
                "sample table",
            ),
            (
                h.samples_offset + h.sample_count * super::SAMPLE_ENTRY_LEN as u64,
                h.heap_offset,
                "heap",
            ),
            (h.heap_offset + h.heap_len, h.info_offset, "info"),
            (
                h.info_offset + h.info_len,
                ds.index.len() - INDEX_FOOTER_LEN as u64,
                "footer",
            ),
        ];
        for (prev_end, start, what) in ends {
            if start != a8(prev_end) {
                return Err(ShardError::corrupt(
                    path,
                    0,
                    format!(
                        "the {what} starts at {start}, but the layout puts it at {}",
                        a8(prev_end)
                    ),
                ));
            }
            zero(prev_end, start, &format!("padding before the {what}"))?;
        }
        for n in 0..h.shard_count {
            let at = ds.shard_entry_offset(n);
            check_zero(
                path,
                at + 28,
                &map[at as usize + 28..at as usize + 32],
                "a shard entry's reserved field",
            )?;
        }
        for c in 0..h.class_count {
            let at = h.classes_offset + u64::from(c) * CLASS_ENTRY_LEN as u64;
            check_zero(
                path,
                at + 12,
                &map[at as usize + 12..at as usize + 16],
                "a class entry's reserved field",
            )?;
        }
        let header = &map[..INDEX_HEADER_LEN];
        if le::u32(header, 12) != 0 {
            return Err(ShardError::corrupt(
                path,
                12,
                "flags are non-zero in a version 1.0 index",
            ));
        }
        check_zero(path, 88, &header[88..124], "the header's reserved field")?;
    }
    if ds.footer.minor == 0 {
        let at = ds.index.len() - INDEX_FOOTER_LEN as u64 + 24;
        check_zero(
            path,
            at,
            &map[at as usize..at as usize + 4],
            "the footer's reserved field",
        )?;
    }
    let info = ds.info()?;
    if !is_json_object(info.as_bytes()) {
        return Err(ShardError::corrupt(
            path,
            h.info_offset,
            "the info section is not a JSON object",
        ));
    }
    Ok(())
}

fn check_shard(shard: &Shard, progress: &mut dyn FnMut(u64)) -> Result<(), ShardError> {
    let path = shard.path();
    let map = &shard.file.map;
    let f = &shard.footer;
    let align = u64::from(shard.header.record_align);
    let table =
        &map[f.table_offset as usize..(f.table_offset + u64::from(f.record_count) * RECORD_ENTRY_LEN as u64) as usize];
    let computed = crc(table);
    if computed != f.table_crc {
        return Err(ShardError::Checksum {
            path: path.to_owned(),
            offset: f.table_offset,
            what: "record table".to_owned(),
            stored: f.table_crc,
            computed,
        });
    }
    // Reserved bytes are zero in a 1.0 structure; each structure's own minor version decides.
    if shard.header.minor == 0 {
        check_zero(path, 20, &map[20..60], "the header's reserved field")?;
    }
    if f.minor == 0 {
        let fo = map.len() - SHARD_FOOTER_LEN;
        check_zero(
            path,
            fo as u64 + 40,
            &map[fo + 40..fo + 60],
            "the footer's reserved field",
        )?;
    }
    check_zero(
        path,
        SHARD_HEADER_LEN as u64,
        &map[SHARD_HEADER_LEN..shard.header.data_offset() as usize],
        "padding after the header",
    )?;

    let mut expected = shard.header.data_offset();
    let (mut since_report, mut reported) = (0u64, 0u64);
    for r in 0..f.record_count {
        let e = shard.record(r)?;
        if e.offset != expected {
            return Err(ShardError::corrupt(
                path,
                f.table_offset + u64::from(r) * RECORD_ENTRY_LEN as u64,
                format!(
                    "record {r} starts at {}, but the layout puts it at {expected}",
                    e.offset
                ),
            ));
        }
        let bytes = shard.bytes(&e);
        let computed = crc(bytes);
        if computed != e.crc {
            return Err(ShardError::Checksum {
                path: path.to_owned(),
                offset: e.offset,
                what: format!("record {r}"),
                stored: e.crc,
                computed,
            });
        }
        let end = e.offset + u64::from(e.length);
        expected = align_up(end, align).unwrap_or(u64::MAX);
        if expected > f.table_offset {
            return Err(ShardError::corrupt(
                path,
                end,
                format!("record {r} overlaps the record table"),
            ));
        }
        check_zero(
            path,
            end,
            &map[end as usize..expected as usize],
            &format!("padding after record {r}"),
        )?;
        since_report += expected - e.offset;
        if since_report > 64 << 20 {
            progress(since_report);
            reported += since_report;
            since_report = 0;
        }
    }
    if expected != f.table_offset {
        return Err(ShardError::corrupt(
            path,
            f.table_offset,
            format!(
                "the record table starts at {}, but the layout puts it at {expected}",
                f.table_offset
            ),
        ));
    }
    let table_end = f.table_offset + table.len() as u64;
    let footer_at = map.len() as u64 - SHARD_FOOTER_LEN as u64;
    check_zero(
        path,
        table_end,
        &map[table_end as usize..footer_at as usize],
        "padding after the record table",
    )?;
    let computed = crc(&map[..footer_at as usize]);
    if computed != f.body_crc {
        return Err(ShardError::Checksum {
            path: path.to_owned(),
            offset: footer_at + 36,
            what: format!("shard body (bytes 0..{footer_at})"),
            stored: f.body_crc,
            computed,
        });
    }
    progress(map.len() as u64 - reported);
    Ok(())
}

fn run_sample_check(ds: &Dataset, check: SampleCheck<'_>, threads: usize) -> Result<u64, VerifyError> {
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .max(1);
    let next = std::sync::atomic::AtomicU64::new(0);
    let n = ds.len();
    // Each thread keeps the lowest failing index it saw; the overall lowest is reported, so
    // the result does not depend on the number of threads.
    let failures: Vec<Option<VerifyError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> Option<VerifyError> {
                    let mut first: Option<VerifyError> = None;
                    loop {
                        // Relaxed: the counter only hands out distinct indices; no data is
                        // published through it.
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= n {
                            return first;
                        }
                        if first
                            .as_ref()
                            .is_some_and(|f| matches!(f, VerifyError::Sample { index, .. } if *index < i))
                        {
                            continue;
                        }
                        let s = match ds.sample(i) {
                            Ok(s) => s,
                            Err(e) => return Some(e.into()),
                        };
                        if let Err(reason) = check(s.data) {
                            first = Some(VerifyError::Sample {
                                shard: ds.shards[s.shard as usize].path().to_owned(),
                                offset: s.offset,
                                index: i,
                                key: String::from_utf8_lossy(s.key).into_owned(),
                                reason,
                            });
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(None)).collect()
    });
    let lowest = failures.into_iter().flatten().min_by_key(|e| match e {
        VerifyError::Sample { index, .. } => *index,
        VerifyError::Format(_) => 0,
    });
    match lowest {
        Some(e) => Err(e),
        None => Ok(n),
    }
}
