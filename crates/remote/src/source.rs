//! A packed dataset on object storage as a [`Source`]: the index is fetched at open and kept in
//! memory; each shard is a file of the [`Cache`], checked against the index before it is used,
//! and read by the same shard reader as a local dataset (`shard::reader`).
//!
//! Reading sample *i* takes a pin on its shard's cached file (downloading it first if it is not
//! there: one download whatever the number of readers), reads the record from the shard's
//! mapping, and drops the pin. A mapping is kept while the file stays in the cache, and dropped
//! when the cache evicts it (so its disk space is freed).
//!
//! Ahead of the reads, the stream tells the source what it will read ([`Source::will_read`]:
//! the order is a pure function of the sampler's inputs, so it is known); the source asks the
//! cache to download the next `--prefetch-shards` shards in order of first use, within the
//! cache's bound and the download slots. The shards of every batch submitted and not yet read
//! are leased ([`Source::lease`]), which keeps them from being evicted for a prefetch.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::cache::{Check, CheckError, Fetch, Object};
use super::{Cache, Hub, RemoteError, RemoteUrl, Store};
use ringfeed_format::shard::reader::Shard;
use ringfeed_format::shard::{Dataset, INDEX_FILE, ShardError, crc};
use ringfeed_source::{Sample, SampleReader, Source, SourceError};

/// Downloads a bucket's objects for the cache, remembering each one's ETag, so a shard rewritten
/// under a running job is reported as such ([`RemoteError::Changed`]).
#[derive(Debug)]
pub struct StoreFetch {
    store: Arc<Store>,
    /// The cache key's prefix ([`Store::cache_prefix`]).
    strip: String,
    etags: Mutex<HashMap<String, String>>,
}

impl StoreFetch {
    pub fn new(store: Arc<Store>) -> Self {
        StoreFetch {
            strip: store.cache_prefix(),
            store,
            etags: Mutex::new(HashMap::new()),
        }
    }
}

impl StoreFetch {
    /// Expects object `key` (without the bucket) to have `etag` (as listed at open): a download
    /// that finds another is [`RemoteError::Changed`].
    pub fn expect(&self, key: &str, etag: &str) {
        self.etags
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_owned(), etag.to_owned());
    }
}

impl Fetch for StoreFetch {
    fn fetch(&self, key: &str, dest: &Path, len: u64) -> Result<(), RemoteError> {
        let key = key.strip_prefix(&self.strip).unwrap_or(key);
        let was = self.etags.lock().unwrap_or_else(|p| p.into_inner()).get(key).cloned();
        let now = self.store.download(key, dest, len, was.as_deref())?;
        if let Some(now) = now {
            self.etags
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.to_owned(), now);
        }
        Ok(())
    }
}

/// A shard's mapping and the cache generation of the file it maps.
type Mapping = Arc<Mutex<Option<(u64, Arc<Shard>)>>>;

/// One shard of the dataset.
struct Slot {
    object: Object,
    /// Its mapping and the cache generation it maps; dropped when the cache evicts the file.
    map: Mapping,
}

/// A remote packed dataset.
pub struct RemoteSource {
    url: RemoteUrl,
    index: Dataset,
    slots: Vec<Slot>,
    cache: Arc<Cache>,
    check_crc: bool,
    prefetch_shards: usize,
}

impl std::fmt::Debug for RemoteSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSource")
            .field("url", &self.url.to_string())
            .field("shards", &self.slots.len())
            .finish_non_exhaustive()
    }
}

/// Why a remote dataset could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// No `index.rfi` at the URL: no packed dataset there (the prefix may hold tars).
    #[error(transparent)]
    NoIndex(RemoteError),
    #[error(transparent)]
    Cache(#[from] super::cache::CacheError),
    #[error(transparent)]
    Shard(#[from] ShardError),
}

impl RemoteSource {
    /// Fetches and checks the index of the dataset at `url`; checks that every shard fits the
    /// cache. Blocking (call it off the control plane).
    pub fn open(hub: &Hub, url: &RemoteUrl, check_crc: bool) -> Result<Self, OpenError> {
        ringfeed_format::fault::install().map_err(|e| ShardError::io(Path::new(&url.to_string()), e))?;
        let store = hub.store(url)?;
        let cache = hub.cache()?;
        let index_key = url.key(INDEX_FILE);
        // A probe: a prefix without `index.rfi` may hold WebDataset tars instead.
        let (bytes, _etag) = match store.probe_bytes(&index_key) {
            Err(RemoteError::Gone { .. }) => {
                return Err(OpenError::NoIndex(RemoteError::Other {
                    url: url.to_string(),
                    why: format!(
                        "no packed dataset there: {} does not exist (`ringfeed pack SRC {url}` makes one)",
                        url.object_url(INDEX_FILE)
                    ),
                }));
            }
            other => other?,
        };
        let index = Dataset::index_only(&PathBuf::from(url.to_string()), bytes)?;
        let fetch: Arc<dyn Fetch> = Arc::new(StoreFetch::new(Arc::clone(&store)));
        let mut slots = Vec::with_capacity(index.shard_count() as usize);
        for n in 0..index.shard_count() {
            let name = index.shard_name(n)?.to_owned();
            let entry = index.shard_entry(n);
            let key = store.cache_key(&url.key(&name));
            cache.check_fits(&key, entry.file_len)?;
            let map: Mapping = Arc::default();
            let on_evict = {
                let map = Arc::clone(&map);
                Arc::new(move || *map.lock().unwrap_or_else(|p| p.into_inner()) = None) as Arc<dyn Fn() + Send + Sync>
            };
            slots.push(Slot {
                object: Object {
                    key,
                    len: entry.file_len,
                    check: shard_check(&index, n),
                    fetch: Arc::clone(&fetch),
                    on_evict: Some(on_evict),
                },
                map,
            });
        }
        Ok(RemoteSource {
            url: url.clone(),
            index,
            slots,
            cache,
            check_crc,
            prefetch_shards: hub.config.prefetch_shards,
        })
    }

    /// The dataset's URL.
    pub fn url(&self) -> &RemoteUrl {
        &self.url
    }

    /// The index (no shard is open in it).
    pub fn index(&self) -> &Dataset {
        &self.index
    }

    /// The shard sample `i` lives in, or `None` past the end or for a damaged entry (the read
    /// reports that).
    fn shard_of(&self, i: u64) -> Option<u32> {
        if i >= self.index.len() {
            return None;
        }
        let (e, _, _) = self.index.sample_entry(i).ok()?;
        ((e.shard as usize) < self.slots.len()).then_some(e.shard)
    }

    /// The mapping of shard `n`, with a pin that keeps its file in place.
    fn open_shard(&self, n: u32) -> Result<(super::cache::Pin, Arc<Shard>), SourceError> {
        let slot = &self.slots[n as usize];
        let pin = self
            .cache
            .get(&slot.object)
            .map_err(|e| remote_err(&self.url, e.to_string()))?;
        let mut map = slot.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((generation, shard)) = &*map
            && *generation == pin.generation()
        {
            return Ok((pin, Arc::clone(shard)));
        }
        let shard = Arc::new(self.index.open_shard_at(n, pin.path())?);
        *map = Some((pin.generation(), Arc::clone(&shard)));
        Ok((pin, shard))
    }
}

fn remote_err(url: &RemoteUrl, why: String) -> SourceError {
    SourceError::Remote {
        dataset: url.to_string(),
        why,
    }
}

/// The check a downloaded (or found) copy of shard `n` must pass: everything `Dataset::open`
/// checks of a shard (length, header, footer, that it belongs to this index), then its body
/// CRC-32C against the index's entry, which covers every byte before the footer.
fn shard_check(index: &Dataset, n: u32) -> Arc<Check> {
    let entry = index.shard_entry(n);
    // A copy of the index's header facts this check needs, without borrowing the index.
    let number = n;
    Arc::new(move |path: &Path| {
        let mapped = ringfeed_format::shard::reader::Mapped::open(path)?;
        let shard = Shard::open(mapped, number, &entry)?;
        let body = shard.file.len() - ringfeed_format::shard::SHARD_FOOTER_LEN as u64;
        let computed = crc(shard.file.slice(0, body, "body")?);
        if let Some(at) = shard.file.fault() {
            return Err(CheckError::Changed { at });
        }
        if computed != entry.body_crc {
            return Err(CheckError::BodyCrc {
                computed,
                expected: entry.body_crc,
            });
        }
        Ok(())
    })
}

impl Source for RemoteSource {
    fn len(&self) -> u64 {
        self.index.len()
    }

    fn class_names(&self) -> Vec<Vec<u8>> {
        (0..self.index.class_count())
            .map(|c| self.index.class_name(c).expect("checked at open").to_vec())
            .collect()
    }

    fn describe(&self) -> String {
        format!("remote packed dataset {} ({} samples)", self.url, self.index.len())
    }

    fn reader(&self) -> Result<Box<dyn SampleReader + '_>, SourceError> {
        Ok(Box::new(RemoteReader {
            source: self,
            held: None,
        }))
    }

    fn with_sample(&self, index: u64, f: &mut dyn FnMut(Sample<'_>)) -> Result<(), SourceError> {
        let len = self.index.len();
        if index >= len {
            return Err(SourceError::OutOfRange {
                index,
                len,
                source_desc: self.describe(),
            });
        }
        let (e, key, _) = self.index.sample_entry(index)?;
        if e.shard as usize >= self.slots.len() {
            return Err(ShardError::corrupt(
                &PathBuf::from(self.url.object_url(INDEX_FILE)),
                0,
                format!("sample {index} refers to shard {} of {}", e.shard, self.slots.len()),
            )
            .into());
        }
        let (_pin, shard) = self.open_shard(e.shard)?;
        let r = shard.record(e.record)?;
        let data = shard.bytes(&r);
        if self.check_crc {
            let computed = crc(data);
            if computed != r.crc {
                return Err(ShardError::Checksum {
                    path: shard.path().to_owned(),
                    offset: r.offset,
                    what: format!("record {} (sample {index})", e.record),
                    stored: r.crc,
                    computed,
                }
                .into());
            }
        }
        f(Sample {
            index,
            key,
            label: e.label,
            data,
        });
        if let Some(at) = shard.file.fault() {
            return Err(shard.file.changed(at, format!("sample {index}")).into());
        }
        Ok(())
    }

    fn shard_sizes(&self) -> Option<Vec<u64>> {
        // Runs of consecutive samples in one shard file (as `PackedSource::shard_sizes`).
        let mut sizes: Vec<u64> = Vec::new();
        let mut current = None;
        for i in 0..self.index.len() {
            let shard = self.index.sample_entry(i).ok().map(|(e, _, _)| e.shard);
            match sizes.last_mut() {
                Some(n) if shard == current => *n += 1,
                _ => sizes.push(1),
            }
            current = shard;
        }
        Some(sizes)
    }

    fn prefers_shard_order(&self) -> bool {
        true
    }

    fn read_ahead(&self) -> usize {
        if self.prefetch_shards == 0 { 0 } else { 1 << 16 }
    }

    fn will_read(&self, upcoming: &mut dyn Iterator<Item = u64>) {
        self.cache.prefetch_upcoming(
            upcoming,
            self.prefetch_shards,
            self.slots.len(),
            |i| self.shard_of(i),
            |n| &self.slots[n as usize].object,
        );
    }

    fn lease(&self, indices: &[u64]) -> Option<Box<dyn std::any::Any + Send + Sync>> {
        let shards = indices.iter().filter_map(|&i| self.shard_of(i));
        let pins = self.cache.lease_objects(shards, |n| &self.slots[n as usize].object);
        Some(Box::new(pins))
    }
}

/// A reader of a remote dataset: keeps the last sample's shard pinned until the next call, which
/// is what the borrowed [`Sample`] needs.
struct RemoteReader<'a> {
    source: &'a RemoteSource,
    held: Option<(super::cache::Pin, Arc<Shard>)>,
}

impl SampleReader for RemoteReader<'_> {
    fn get(&mut self, index: u64) -> Result<Sample<'_>, SourceError> {
        let s = self.source;
        let len = s.index.len();
        if index >= len {
            return Err(SourceError::OutOfRange {
                index,
                len,
                source_desc: s.describe(),
            });
        }
        let (e, key, _) = s.index.sample_entry(index)?;
        if e.shard as usize >= s.slots.len() {
            return Err(remote_err(
                &s.url,
                format!("sample {index} refers to a shard that does not exist"),
            ));
        }
        self.held = None;
        let held = s.open_shard(e.shard)?;
        let r = held.1.record(e.record)?;
        let shard = &self.held.insert(held).1;
        let data = shard.bytes(&r);
        if s.check_crc && crc(data) != r.crc {
            return Err(ShardError::Checksum {
                path: shard.path().to_owned(),
                offset: r.offset,
                what: format!("record {} (sample {index})", e.record),
                stored: r.crc,
                computed: crc(data),
            }
            .into());
        }
        Ok(Sample {
            index,
            key,
            label: e.label,
            data,
        })
    }
}
