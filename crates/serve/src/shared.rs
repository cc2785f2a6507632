//! What every connection shares (the decode pool, the open sources, the remote hub, the streams'
//! registry), and what each sample kind hands [`crate::stream`] when it opens.
//!
//! A source is shared by every stream over the same dataset and options: the map holds weak
//! references, so a dataset no stream holds any more is closed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::pool::{Pool, ViewFields};
use crate::segment::Segment;
use ringfeed_format::control::ErrorCode;
use ringfeed_format::ring::{FieldDesc, FieldSpec};
use ringfeed_ops::{Layout, Pipeline};
use ringfeed_source::Source;

/// What every connection shares: the pool and the open datasets.
pub struct Shared {
    pub pool: Pool,
    pub limits: ringfeed_decode::Limits,
    /// Open sources by (path, options), so streams over one dataset share one mapping.
    sources: Mutex<BTreeMap<String, std::sync::Weak<dyn Source>>>,
    /// Open connections, for `--exit-when-idle`.
    pub connections: AtomicUsize,
    /// Datasets outside these roots are refused (empty: no restriction).
    pub data_roots: Vec<PathBuf>,
    /// Largest ring one stream may ask for, in bytes.
    pub max_ring_bytes: u64,
    /// Open streams' counters and knobs.
    pub registry: crate::stats::Registry,
    /// CPUs this server may run on.
    pub cores: u32,
    /// `--cpu-budget`: decode threads all streams may use together (None: cores minus one per
    /// training process).
    pub cpu_budget: Option<u32>,
    /// When the server started.
    pub started: std::time::Instant,
    /// The pool's busy share and the threads allotted, over the tuner's last interval.
    pub busy: Mutex<(f64, u32)>,
    /// Notified when the last connection left (for `--exit-when-idle`).
    pub idle: tokio::sync::Notify,
    /// Image folders and manifests being listed (`crate::opening`).
    pub openings: Arc<crate::opening::Openings>,
    /// 1.10: image sizes probed for aspect buckets, per open source.
    pub sizes: crate::buckets::SizeCache,
    /// How often a client waiting for a listing gets an `opening` message.
    pub open_progress: std::time::Duration,
    /// Remote datasets: the settings, the shard cache and the stores (`ringfeed_remote`).
    #[cfg(feature = "remote")]
    pub remote: Arc<ringfeed_remote::Hub>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub fn new(pool: Pool, limits: ringfeed_decode::Limits, data_roots: Vec<PathBuf>, max_ring_bytes: u64) -> Self {
        Shared {
            pool,
            limits,
            sources: Mutex::new(BTreeMap::new()),
            connections: AtomicUsize::new(0),
            data_roots,
            max_ring_bytes,
            registry: Default::default(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()) as u32,
            cpu_budget: None,
            started: std::time::Instant::now(),
            busy: Mutex::new((0.0, 0)),
            idle: tokio::sync::Notify::new(),
            openings: Default::default(),
            sizes: Default::default(),
            open_progress: crate::opening::PROGRESS_EVERY,
            #[cfg(feature = "remote")]
            remote: Arc::new(ringfeed_remote::Hub::new(ringfeed_remote::RemoteConfig::defaults())),
        }
    }

    /// A connection ends (or turns out to be an observer, which does not keep the server alive).
    pub fn leave(&self) {
        if self.connections.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_one();
        }
    }

    /// Decode threads all autotuned streams may use together: `--cpu-budget`, else the cores
    /// minus one per training process on the node (the most of the streams' `local_world_size`
    /// and the number of distinct client processes), at least 1, at most the pool.
    pub fn budget(&self) -> u32 {
        let pool = self.pool.threads() as u32;
        if let Some(b) = self.cpu_budget {
            return b.clamp(1, pool);
        }
        let streams = self.registry.list();
        let mut pids: Vec<u32> = streams.iter().map(|s| s.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        let declared = streams.iter().filter_map(|s| s.local_world_size).max().unwrap_or(0);
        let ranks = (pids.len() as u32).max(declared).max(1);
        self.cores.saturating_sub(ranks).clamp(1, pool)
    }

    /// The server's state, for an observer.
    pub fn snapshot(&self) -> ringfeed_format::control::Snapshot {
        let (busy, active) = *self.busy.lock().unwrap_or_else(|p| p.into_inner());
        let streams: Vec<_> = self.registry.list().iter().map(|s| s.snapshot()).collect();
        ringfeed_format::control::Snapshot {
            server: ringfeed_format::control::ServerSnapshot {
                version: concat!("ringfeed ", env!("CARGO_PKG_VERSION")).into(),
                pid: std::process::id(),
                uptime_s: (self.started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
                cores: self.cores,
                cpu_budget: self.budget(),
                threads: self.pool.threads() as u32,
                active_threads: active.min(self.pool.threads() as u32),
                busy: (busy * 100.0).round() / 100.0,
                #[cfg(feature = "remote")]
                remote: self.remote.snapshot(),
                #[cfg(not(feature = "remote"))]
                remote: None,
            },
            streams,
        }
    }
}

impl crate::tune::Target for Shared {
    fn streams(&self) -> Vec<Arc<crate::stats::StreamStats>> {
        self.registry.list()
    }
    fn budget(&self) -> u32 {
        Shared::budget(self)
    }
    fn pool_threads(&self) -> u32 {
        self.pool.threads() as u32
    }
    fn kick(&self) {
        self.pool.kick();
    }
    fn set_busy(&self, busy: f64, active: u32) {
        *self.busy.lock().unwrap_or_else(|p| p.into_inner()) = (busy, active);
    }
    #[cfg(feature = "remote")]
    fn fetches(&self) -> Option<Arc<dyn crate::tune::Fetches>> {
        let cache = self.remote.opened_cache()?;
        let pinned = cache.pinned();
        (!pinned).then_some(cache as Arc<dyn crate::tune::Fetches>)
    }
}

/// Why an `open` is refused: the error code and the message.
pub(crate) type OpenError = (ErrorCode, String);

/// What one sample kind opened, before the ring exists: its samples, its ring fields, and how
/// it finishes its `StreamCtx` once the ring is there. Everything else of a stream's set-up
/// (bounds, the sampler, the ring, the stats, the `ring` answer) is [`open_stream`]'s, shared by
/// every kind.
pub(crate) struct Prepared {
    /// The samples (images, or token windows), counted by the sampler.
    pub source: Arc<dyn Source>,
    /// The ring's fields.
    pub specs: Vec<FieldSpec>,
    /// `on_error = skip`.
    pub skip_errors: bool,
    /// The kind orders its samples itself (a token mix): the sampler does not shuffle them.
    pub own_order: bool,
    /// 1.3: hybrid decode (images only).
    pub gpu: Option<ringfeed_format::control::message::GpuDecodeRequest>,
    /// 1.3: the shard-aware order (`ringfeed_order::blocks`); `None`: the global order.
    pub order: Option<Arc<ringfeed_order::blocks::ShardBlocks>>,
    /// Whether the `ring` answer names the order (images; a token stream keeps its own).
    pub reports_order: bool,
    /// Threads to start with when the `open` names none (`None`: the budget, or the pool
    /// without autotune).
    pub start_threads: Option<u32>,
    /// A batch's samples in words, for the ring-size error ("256 samples of 2 images").
    pub per_sample: String,
    /// Builds the kind's members of the stream's context from the ring.
    pub finish: Box<dyn FnOnce(&Segment) -> KindParts + Send>,
    /// 1.10: the samples' aspect buckets; the stream then uses the bucket order.
    pub buckets: Option<Arc<crate::buckets::Buckets>>,
}

/// The sample kind's members of a `StreamCtx`.
pub(crate) struct KindParts {
    pub views: Vec<ViewFields>,
    pub label: FieldDesc,
    pub index: Option<FieldDesc>,
    pub crop: Option<FieldDesc>,
    /// 1.3: hybrid decode's ring fields (images only).
    pub gpu: Option<crate::pool::GpuFields>,
    /// 1.9: the sample fields (images only).
    pub fields: Option<Arc<crate::fields::SampleFields>>,
    /// 1.10: the aspect buckets' conditioning fields (images only).
    pub bucket_fields: Option<crate::pool::BucketFields>,
    /// 1.10: the detection and segmentation targets (images only).
    pub targets: Option<Arc<crate::targets::StreamTargets>>,
    pub pipeline: Pipeline,
    pub layout: Layout,
    pub kind: crate::pool::SampleKind,
}

/// The canonical path of a dataset the server may serve: it exists, and it lies under one of
/// the server's `--data-root` directories when there are any.
pub(crate) fn admit(shared: &Shared, path: &Path) -> Result<PathBuf, OpenError> {
    let dataset_err = |m: String| (ErrorCode::Dataset, m);
    let canonical = std::fs::canonicalize(path).map_err(|e| dataset_err(format!("dataset {}: {e}", path.display())))?;
    if !shared.data_roots.is_empty() && !shared.data_roots.iter().any(|r| canonical.starts_with(r)) {
        return Err(dataset_err(format!(
            "dataset {} is outside the server's --data-root directories; ask the server's operator to add its directory",
            path.display()
        )));
    }
    Ok(canonical)
}

impl Shared {
    /// The open source a stream holds under `key`, if any (see [`Shared::cache_source`]).
    pub(crate) fn cached_source(&self, key: &str) -> Option<Arc<dyn Source>> {
        let sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        sources.get(key).and_then(|w| w.upgrade())
    }

    /// Remembers an open source, so later streams over the same dataset share it.
    pub(crate) fn cache_source(&self, key: String, source: &Arc<dyn Source>) {
        let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        // Entries of datasets no stream holds any more go, so the map stays as small as the open
        // set (clients choose the keys).
        sources.retain(|_, w| w.strong_count() > 0);
        sources.insert(key, Arc::downgrade(source));
    }
}
