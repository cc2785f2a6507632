//! 1.10: Parquet files on object storage (`s3://bucket/prefix/*.parquet`, one `.parquet` key, a
//! prefix holding `*.parquet` objects; `gs://` and `az://` alike) served in place as a
//! [`Source`] (control.md, "Parquet datasets (1.9)", "Parquet on object storage (1.10)").
//!
//! At open each file's footer is read by range (its last 64 KiB, and the rest of the metadata
//! when it is larger), its schema checked as a local file's ([`ringfeed_source::pq`]). A row
//! group is then a file of the shard [`Cache`]: the byte ranges of the column chunks the stream
//! reads (the projection's leaves, whole, adjacent ones in one GET), concatenated, fetched by
//! the store's ranged reads (retries, deadlines, ETag binding, counted) ahead of the reads as a
//! tar or shard is, and decoded by the local source's row-group logic from that copy.
//!
//! Invariants:
//! - A row group's copy is served only once it passes its check: its length is the sum of its
//!   ranges, and every column chunk's pages parse and hold the values the footer counts, so a
//!   cut or garbled body is refetched, never decoded as rows.
//! - Every range is read from the version of the object listed at open (its ETag, else the one
//!   the footer read saw): a file rewritten under a running job is reported, not mixed. The cache
//!   key carries the ETag and the length, so a copy left by an earlier run of an older version
//!   is never taken for this one.
//! - Every row group's copy fits the cache's bound (checked at open, naming the file, the group
//!   and `--cache-bytes`).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use parquet::file::reader::{ChunkReader, Length, RowGroupReader};

use super::cache::{CacheError, Check, CheckError, Fetch, Object};
use super::source::OpenError;
use super::store::Listed;
use super::wds::list_objects;
use super::{Cache, Counters, Hub, RemoteError, RemoteUrl, Store};
use ringfeed_source::listing::Problem;
use ringfeed_source::pq::{
    FileParts, Opened, ParquetOptions, ParquetSource, RowGroups, projected_leaves, projection, row_group_reader,
};
use ringfeed_source::wds::pattern;
use ringfeed_source::{Extra, FieldKind, Sample, SampleReader, Source, SourceError};

/// Bytes read from a file's end at open: the footer of most files in one GET.
const TAIL: u64 = 64 << 10;

/// Whether `url` names Parquet files by itself (a key ending in `.parquet`, or a pattern whose
/// last component does).
pub fn names_parquet(url: &RemoteUrl) -> bool {
    let last = url.prefix.rsplit('/').next().unwrap_or("");
    last.to_ascii_lowercase().ends_with(".parquet")
}

/// Whether the prefix `url` (no packed dataset there) holds `*.parquet` objects and no `*.tar`
/// (which would make it WebDataset tars): one LIST.
pub fn holds_parquet(hub: &Hub, url: &RemoteUrl) -> Result<bool, RemoteError> {
    let listed = hub.store(url)?.list_dir(&url.prefix)?;
    let has = |s: &str| listed.iter().any(|o| o.key.to_ascii_lowercase().ends_with(s));
    Ok(has(".parquet") && !has(".tar"))
}

/// A row group's copy: the ranges it holds, at their offsets in the file.
#[derive(Debug, Clone)]
struct Spliced {
    /// (offset in the file, bytes), by offset.
    parts: Vec<(u64, Bytes)>,
    /// The file's length.
    len: u64,
}

impl Spliced {
    /// Cuts `data` (the ranges' bytes, one after the other) back into `ranges`.
    fn new(ranges: &[Range<u64>], data: Bytes, len: u64) -> Self {
        let mut at = 0usize;
        let parts = ranges
            .iter()
            .map(|r| {
                let n = (r.end - r.start) as usize;
                let part = data.slice(at..at + n);
                at += n;
                (r.start, part)
            })
            .collect();
        Spliced { parts, len }
    }

    /// The bytes from `start` to the end of the range holding it.
    fn from(&self, start: u64) -> parquet::errors::Result<Bytes> {
        let i = self.parts.partition_point(|(s, _)| *s <= start);
        if i > 0 {
            let (s, b) = &self.parts[i - 1];
            if start < s + b.len() as u64 {
                return Ok(b.slice((start - s) as usize..));
            }
        }
        Err(parquet::errors::ParquetError::General(format!(
            "byte {start} of the file was not fetched with its row group"
        )))
    }
}

impl Length for Spliced {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for Spliced {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(self.from(start)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let b = self.from(start)?;
        if b.len() < length {
            return Err(parquet::errors::ParquetError::General(format!(
                "bytes {start}..{} of the file were not fetched with its row group",
                start + length as u64
            )));
        }
        Ok(b.slice(..length))
    }
}

/// Downloads one row group's ranges, one after the other, into the cache's file.
struct RangesFetch {
    store: Arc<Store>,
    /// The object's key (without the bucket).
    key: String,
    ranges: Vec<Range<u64>>,
    etag: Option<String>,
    /// `fetches` counts a row group's copy as one object downloaded.
    counters: Arc<Counters>,
}

impl Fetch for RangesFetch {
    fn fetch(&self, _cache_key: &str, dest: &Path, len: u64) -> Result<(), RemoteError> {
        let (parts, _) = self.store.get_ranges(&self.key, &self.ranges, self.etag.as_deref())?;
        let io = |e: std::io::Error| RemoteError::Io {
            path: dest.to_owned(),
            source: e,
        };
        let got: u64 = parts.iter().map(|p| p.len() as u64).sum();
        if got != len {
            return Err(RemoteError::Other {
                url: self.store.url(&self.key),
                why: format!("the row group's ranges gave {got} bytes, {len} expected"),
            });
        }
        let mut f = std::fs::File::create(dest).map_err(io)?;
        for p in &parts {
            std::io::Write::write_all(&mut f, p).map_err(io)?;
        }
        f.sync_all().map_err(io)?;
        Counters::bump(&self.counters.fetches);
        Ok(())
    }
}

/// One row group of one file: its object in the cache and the ranges its copy holds.
struct GroupObject {
    object: Object,
    ranges: Arc<Vec<Range<u64>>>,
}

/// One file's row groups, read from the cache.
struct CachedGroups {
    cache: Arc<Cache>,
    len: u64,
    /// By row group; `None` for an empty group (never read).
    groups: Vec<Option<GroupObject>>,
}

impl RowGroups for CachedGroups {
    fn row_group<'a>(&'a self, meta: &'a ParquetMetaData, g: usize) -> Result<Box<dyn RowGroupReader + 'a>, String> {
        let o = self.groups[g]
            .as_ref()
            .ok_or_else(|| format!("row group {g} is empty"))?;
        let pin = self.cache.get(&o.object).map_err(|e| e.to_string())?;
        let data = std::fs::read(pin.path()).map_err(|e| format!("{}: {e}", pin.path().display()))?;
        drop(pin);
        let chunks = Spliced::new(&o.ranges, Bytes::from(data), self.len);
        row_group_reader(Arc::new(chunks), meta, g).map_err(|e| format!("cannot read row group {g}: {e}"))
    }
}

/// The ranges a row group's copy holds: the column chunks of `leaves`, adjacent ones merged.
fn group_ranges(meta: &ParquetMetaData, g: usize, leaves: &[usize]) -> Vec<Range<u64>> {
    let rg = meta.row_group(g);
    let mut r: Vec<Range<u64>> = leaves
        .iter()
        .map(|&c| {
            let (start, len) = rg.column(c).byte_range();
            start..start + len
        })
        .collect();
    r.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(r.len());
    for x in r {
        match merged.last_mut() {
            Some(last) if x.start <= last.end => last.end = last.end.max(x.end),
            _ => merged.push(x),
        }
    }
    merged
}

/// The check of a row group's copy: its length, and every read column chunk's pages parse and
/// hold as many values as the footer says.
fn group_check(
    meta: Arc<ParquetMetaData>,
    g: usize,
    leaves: Arc<Vec<usize>>,
    ranges: Arc<Vec<Range<u64>>>,
    file_len: u64,
    url: String,
) -> Arc<Check> {
    Arc::new(move |path: &Path| {
        let bad = |why: String| CheckError::RowGroup {
            url: url.clone(),
            group: g,
            why,
        };
        let data = std::fs::read(path).map_err(|e| bad(format!("cannot read the copy: {e}")))?;
        let want: u64 = ranges.iter().map(|r| r.end - r.start).sum();
        if data.len() as u64 != want {
            return Err(bad(format!("the copy has {} bytes, its ranges {want}", data.len())));
        }
        let chunks = Arc::new(Spliced::new(&ranges, Bytes::from(data), file_len));
        let rg = row_group_reader(chunks, &meta, g).map_err(|e| bad(e.to_string()))?;
        for &c in leaves.iter() {
            let col = meta.row_group(g).column(c);
            let mut pages = rg.get_column_page_reader(c).map_err(|e| bad(e.to_string()))?;
            let mut values = 0i64;
            while let Some(page) = pages
                .get_next_page()
                .map_err(|e| bad(format!("column {}: {e}", col.column_path())))?
            {
                if !matches!(page.page_type(), parquet::basic::PageType::DICTIONARY_PAGE) {
                    values += i64::from(page.num_values());
                }
            }
            if values != col.num_values() {
                return Err(bad(format!(
                    "column {}: its pages hold {values} values, the footer says {}",
                    col.column_path(),
                    col.num_values()
                )));
            }
        }
        Ok(())
    })
}

/// A file's footer, read by range: returns it and the ETag the reads saw.
fn read_footer(store: &Store, o: &Listed) -> Result<(ParquetMetaData, Option<String>), String> {
    let bad = |why: String| format!("not a readable Parquet file: {why}");
    if o.size < 12 {
        return Err(bad(format!("it has {} bytes", o.size)));
    }
    let tail = TAIL.min(o.size);
    let (mut got, etag) = store
        .get_ranges(
            &o.key,
            std::slice::from_ref(&(o.size - tail..o.size)),
            o.etag.as_deref(),
        )
        .map_err(|e| e.to_string())?;
    let mut buf = got.pop().unwrap_or_default();
    let n = buf.len();
    if &buf[n - 4..] != b"PAR1" {
        return Err(bad(
            "it does not end with PAR1 (an encrypted footer, PARE, is not read)".into(),
        ));
    }
    let meta_len = u64::from(u32::from_le_bytes(buf[n - 8..n - 4].try_into().expect("4 bytes")));
    if meta_len + 8 > o.size {
        return Err(bad(format!(
            "its footer says {meta_len} bytes of metadata, the file has {}",
            o.size
        )));
    }
    if meta_len + 8 > tail {
        let more = store
            .get_range(&o.key, o.size - 8 - meta_len..o.size - tail, etag.as_deref())
            .map_err(|e| e.to_string())?;
        let mut all = more;
        all.extend_from_slice(&buf);
        buf = all;
    }
    let n = buf.len();
    let meta = ParquetMetaDataReader::decode_metadata(&buf[n - 8 - meta_len as usize..n - 8])
        .map_err(|e| bad(e.to_string()))?;
    Ok((meta, etag))
}

/// Parquet files on object storage.
pub struct RemoteParquetSource {
    inner: ParquetSource,
    /// By the inner source's group number.
    objects: Vec<Object>,
    cache: Arc<Cache>,
    prefetch_shards: usize,
    /// Files and row groups, for the log line.
    pub files: usize,
}

impl std::fmt::Debug for RemoteParquetSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteParquetSource")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl RemoteParquetSource {
    /// Lists the files `url` names (in key order), reads every footer by range on up to
    /// `threads` threads (counting rows in `listed`, stopping when `cancel` is set) and checks
    /// it against `opts`. A file whose footer cannot be read or whose columns do not fit is a
    /// listing problem; a store that fails fails the open. Blocking.
    pub fn open(
        hub: &Hub,
        url: &RemoteUrl,
        opts: &ParquetOptions,
        threads: usize,
        cancel: &AtomicBool,
        listed: &AtomicU64,
    ) -> Result<Self, OpenError> {
        let name = url.to_string();
        let store = hub.store(url)?;
        let cache = hub.cache()?;
        let named = pattern::is_pattern(&url.prefix) || names_parquet(url);
        let objects = list_objects(&store, url, ".parquet", named)?.tars;
        let next = AtomicUsize::new(0);
        type Footer = Result<(ParquetMetaData, Option<String>), String>;
        let footers: Vec<Mutex<Option<Footer>>> = objects.iter().map(|_| Mutex::new(None)).collect();
        std::thread::scope(|s| {
            for _ in 0..threads.clamp(1, objects.len().max(1)) {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= objects.len() || cancel.load(Ordering::Relaxed) {
                            return;
                        }
                        let r = read_footer(&store, &objects[i]);
                        *footers[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                    }
                });
            }
        });
        if cancel.load(Ordering::Relaxed) {
            return Err(RemoteError::Other {
                url: name,
                why: "listing was cancelled: every stream that asked for it has gone".into(),
            }
            .into());
        }
        let mut parts: Vec<FileParts> = Vec::with_capacity(objects.len());
        let mut group_objects: Vec<Vec<Option<Object>>> = Vec::with_capacity(objects.len());
        for (o, footer) in objects.iter().zip(footers) {
            let file_url = store.url(&o.key);
            let footer = footer
                .into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .expect("every footer was read");
            // A store that fails (gone, denied, out of retries) fails the open, naming the file;
            // a file that is not Parquet is a listing problem, as locally.
            let (meta, etag) = match footer {
                Ok(m) => m,
                Err(why) if why.starts_with("not a readable Parquet file") => {
                    parts.push((PathBuf::from(&file_url), Err(why)));
                    group_objects.push(Vec::new());
                    continue;
                }
                Err(why) => return Err(RemoteError::Other { url: file_url, why }.into()),
            };
            let meta = Arc::new(meta);
            let leaves = match projection(&meta, opts) {
                Ok(p) => Arc::new(projected_leaves(&meta, &p)),
                Err(why) => {
                    parts.push((PathBuf::from(&file_url), Err(why)));
                    group_objects.push(Vec::new());
                    continue;
                }
            };
            let etag = o.etag.clone().or(etag);
            let version = version_hash(etag.as_deref(), o.size);
            let mut groups = Vec::with_capacity(meta.num_row_groups());
            let mut objs = Vec::with_capacity(meta.num_row_groups());
            for g in 0..meta.num_row_groups() {
                if meta.row_group(g).num_rows() <= 0 {
                    groups.push(None);
                    objs.push(None);
                    continue;
                }
                let ranges = Arc::new(group_ranges(&meta, g, &leaves));
                let len = ranges.iter().map(|r| r.end - r.start).sum();
                let key = format!("{}.rg{g}-{version:016x}", store.cache_key(&o.key));
                cache.check_fits(&key, len).map_err(|e| match e {
                    CacheError::TooLarge { len, limit, .. } => RemoteError::Other {
                        url: file_url.clone(),
                        why: format!(
                            "row group {g} ({len} bytes of the columns read) is larger than the shard cache's bound ({limit} bytes); start the server with a larger --cache-bytes (RINGFEED_CACHE_BYTES), or write the file with smaller row groups"
                        ),
                    },
                    e => RemoteError::Other {
                        url: file_url.clone(),
                        why: e.to_string(),
                    },
                })?;
                let object = Object {
                    check: group_check(
                        Arc::clone(&meta),
                        g,
                        Arc::clone(&leaves),
                        Arc::clone(&ranges),
                        o.size,
                        file_url.clone(),
                    ),
                    key,
                    len,
                    fetch: Arc::new(RangesFetch {
                        store: Arc::clone(&store),
                        key: o.key.clone(),
                        ranges: ranges.to_vec(),
                        etag: etag.clone(),
                        counters: Arc::clone(&hub.counters),
                    }),
                    on_evict: None,
                };
                objs.push(Some(object.clone()));
                groups.push(Some(GroupObject { object, ranges }));
            }
            let rows = CachedGroups {
                cache: Arc::clone(&cache),
                len: o.size,
                groups,
            };
            parts.push((PathBuf::from(&file_url), Ok(Opened::Parquet(meta, Box::new(rows)))));
            group_objects.push(objs);
        }
        let files = parts.len();
        let inner = ParquetSource::from_files(&name, parts, opts, listed);
        let objects = (0..inner.group_count())
            .map(|g| {
                let (f, rg) = inner.group_place(g);
                group_objects[f][rg].clone().expect("a group served has rows")
            })
            .collect();
        Ok(RemoteParquetSource {
            inner,
            objects,
            cache,
            prefetch_shards: hub.config.prefetch_shards,
            files,
        })
    }

    /// Row groups served.
    pub fn group_count(&self) -> usize {
        self.objects.len()
    }

    fn group_of(&self, index: u64) -> Option<u32> {
        self.inner.group_of(index).map(|g| g as u32)
    }
}

/// A short hash of an object's version (its ETag and length), for its row groups' cache keys.
fn version_hash(etag: Option<&str>, len: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in etag.unwrap_or("").bytes().chain(len.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Source for RemoteParquetSource {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn class_names(&self) -> Vec<Vec<u8>> {
        Vec::new()
    }

    fn describe(&self) -> String {
        format!(
            "{} (Parquet on object storage, through the shard cache)",
            self.inner.describe().trim_end_matches(" (Parquet)")
        )
    }

    fn reader(&self) -> Result<Box<dyn SampleReader + '_>, SourceError> {
        self.inner.reader()
    }

    fn listing_problems(&self) -> &[Problem] {
        self.inner.listing_problems()
    }

    fn shard_sizes(&self) -> Option<Vec<u64>> {
        self.inner.shard_sizes()
    }

    fn prefers_shard_order(&self) -> bool {
        true
    }

    fn with_sample(&self, index: u64, f: &mut dyn FnMut(Sample<'_>)) -> Result<(), SourceError> {
        self.inner.with_sample(index, f)
    }

    fn field_kind(&self) -> Option<FieldKind> {
        self.inner.field_kind()
    }

    fn with_sample_extra(&self, index: u64, f: &mut dyn FnMut(Sample<'_>, Extra<'_>)) -> Result<(), SourceError> {
        self.inner.with_sample_extra(index, f)
    }

    fn read_ahead(&self) -> usize {
        if self.prefetch_shards == 0 { 0 } else { 1 << 16 }
    }

    fn will_read(&self, upcoming: &mut dyn Iterator<Item = u64>) {
        self.cache.prefetch_upcoming(
            upcoming,
            self.prefetch_shards,
            self.objects.len(),
            |i| self.group_of(i),
            |g| &self.objects[g as usize],
        );
    }

    fn lease(&self, indices: &[u64]) -> Option<Box<dyn std::any::Any + Send + Sync>> {
        let groups = indices.iter().filter_map(|&i| self.group_of(i));
        let pins = self.cache.lease_objects(groups, |g| &self.objects[g as usize]);
        Some(Box::new(pins))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spliced_copy_serves_its_ranges_and_names_what_it_lacks() {
        let s = Spliced::new(&[4..8, 20..22], Bytes::from_static(b"abcdXY"), 30);
        assert_eq!(s.get_bytes(5, 3).unwrap(), &b"bcd"[..]);
        assert_eq!(s.get_bytes(20, 2).unwrap(), &b"XY"[..]);
        let mut r = s.get_read(6).unwrap();
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut r, &mut out).unwrap();
        assert_eq!(out, b"cd");
        assert_eq!(Length::len(&s), 30);
        for (start, len) in [(0, 1), (8, 1), (6, 4), (22, 1)] {
            let e = s.get_bytes(start, len).unwrap_err().to_string();
            assert!(e.contains("not fetched with its row group"), "{e}");
        }
    }

    #[test]
    fn names_and_versions() {
        let u = |s: &str| RemoteUrl::parse(s).unwrap().unwrap();
        assert!(names_parquet(&u("s3://b/x/part-0.parquet")));
        assert!(names_parquet(&u("s3://b/x/*.PARQUET")));
        assert!(!names_parquet(&u("s3://b/x/ds")));
        assert!(!names_parquet(&u("s3://b/x.parquet/shard-*.tar")));
        assert_ne!(version_hash(Some("\"a\""), 10), version_hash(Some("\"b\""), 10));
        assert_ne!(version_hash(None, 10), version_hash(None, 11));
    }
}
