//! What the server measures about each stream, and the `snapshot` it shows to observers
//! (control.md, "snapshot"; `ringfeed top`, `--metrics`, `Loader.stats()`).
//!
//! Counters are cumulative atomics written by whoever does the work: the decode threads add their
//! per-stage times, the stream's task its slot counts and deliveries, the client's `stats` its wait
//! and compute times. Every interval the tuner ([`crate::tune`]) reads them, takes differences and
//! stores the interval's rates in [`StreamStats::view`]; a snapshot reads that view. All counters
//! are independent statistics, so `Relaxed` suffices: no reader derives a hand-off from them, and a
//! snapshot may mix values a few microseconds apart.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// Pipeline stages timed per sample (control.md, "snapshot", `stage_us`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Fetching the sample's bytes: mmap page faults, the LMDB lookup.
    Read = 0,
    /// Entropy decoding, IDCT and colour conversion.
    Decode = 1,
    /// Resize, crop and flip into the slot.
    Transform = 2,
    /// The label and extra fields.
    Write = 3,
}

/// Number of [`Stage`]s.
pub const STAGES: usize = 4;

/// One stream's counters and knobs, shared by its task, its jobs, the tuner and observers.
#[derive(Debug)]
pub struct StreamStats {
    pub id: u64,
    /// The client's process id (`SO_PEERCRED`).
    pub pid: u32,
    pub dataset: String,
    pub batch_size: u32,
    pub slots: u32,
    /// Whether the tuner sets `threads` and `depth`.
    pub autotune: bool,
    /// The client's bound on `threads` (with autotune) or its pinned value (without).
    pub max_threads: Option<u32>,
    /// Training processes on the node, as the client reported.
    pub local_world_size: Option<u32>,

    // Knobs: written by the tuner (or fixed at open), read by the pool and the stream's task.
    /// Decode threads the stream may occupy at once.
    pub threads: AtomicU32,
    /// Batches the stream may have in flight (FILLING + READY).
    pub depth: AtomicU32,
    /// Wakes the stream's task when `depth` grew, so it fills the new room.
    pub wake: tokio::sync::Notify,

    // Written by the stream's task.
    pub epoch: AtomicU64,
    pub run: AtomicU32,
    pub filling: AtomicU32,
    pub ready: AtomicU32,
    pub held: AtomicU32,
    pub samples: AtomicU64,
    pub batches: AtomicU64,
    pub skipped: AtomicU64,

    // Written by the decode threads.
    pub stage_ns: [AtomicU64; STAGES],
    /// Samples whose stage times are in `stage_ns`.
    pub timed: AtomicU64,

    // Written by the client's `stats` messages.
    pub reported: AtomicBool,
    pub steps: AtomicU64,
    pub wait_ns: AtomicU64,
    pub compute_ns: AtomicU64,

    /// The last interval's rates and the tuner's last decision, for observers.
    pub view: Mutex<IntervalView>,
}

/// Rates over the tuner's last interval.
#[derive(Debug, Clone, Default)]
pub struct IntervalView {
    pub samples_per_s: f64,
    pub wait: Option<f64>,
    pub step_ms: Option<f64>,
    pub stage_us: [f64; STAGES],
    pub tune: String,
}

impl StreamStats {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        pid: u32,
        dataset: String,
        batch_size: u32,
        slots: u32,
        autotune: bool,
        max_threads: Option<u32>,
        local_world_size: Option<u32>,
        threads: u32,
        depth: u32,
    ) -> Self {
        StreamStats {
            id,
            pid,
            dataset,
            batch_size,
            slots,
            autotune,
            max_threads,
            local_world_size,
            threads: AtomicU32::new(threads),
            depth: AtomicU32::new(depth),
            wake: tokio::sync::Notify::new(),
            epoch: AtomicU64::new(0),
            run: AtomicU32::new(0),
            filling: AtomicU32::new(0),
            ready: AtomicU32::new(0),
            held: AtomicU32::new(0),
            samples: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            stage_ns: Default::default(),
            timed: AtomicU64::new(0),
            reported: AtomicBool::new(false),
            steps: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
            compute_ns: AtomicU64::new(0),
            view: Mutex::new(IntervalView::default()),
        }
    }

    /// Adds one sample's stage times (nanoseconds, by [`Stage`]).
    pub fn add_sample_times(&self, ns: [u64; STAGES]) {
        for (c, v) in self.stage_ns.iter().zip(ns) {
            c.fetch_add(v, Ordering::Relaxed);
        }
        self.timed.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds a client's `stats` message.
    pub fn add_client_stats(&self, steps: u64, wait_ns: u64, compute_ns: u64) {
        self.steps.fetch_add(steps, Ordering::Relaxed);
        self.wait_ns.fetch_add(wait_ns, Ordering::Relaxed);
        self.compute_ns.fetch_add(compute_ns, Ordering::Relaxed);
        self.reported.store(true, Ordering::Relaxed);
    }

    /// The cumulative counters, read together.
    pub fn counters(&self) -> Counters {
        Counters {
            samples: self.samples.load(Ordering::Relaxed),
            stage_ns: std::array::from_fn(|i| self.stage_ns[i].load(Ordering::Relaxed)),
            timed: self.timed.load(Ordering::Relaxed),
            steps: self.steps.load(Ordering::Relaxed),
            wait_ns: self.wait_ns.load(Ordering::Relaxed),
            compute_ns: self.compute_ns.load(Ordering::Relaxed),
        }
    }

    /// This stream as a snapshot entry.
    pub fn snapshot(&self) -> StreamSnapshot {
        let view = self.view.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let filling = self.filling.load(Ordering::Relaxed);
        let ready = self.ready.load(Ordering::Relaxed);
        let held = self.held.load(Ordering::Relaxed);
        let round = |x: f64| (x * 10.0).round() / 10.0;
        StreamSnapshot {
            stream: self.id,
            pid: self.pid,
            dataset: self.dataset.clone(),
            batch_size: self.batch_size,
            epoch: self.epoch.load(Ordering::Relaxed),
            run: self.run.load(Ordering::Relaxed),
            slots: SlotCounts {
                free: self.slots.saturating_sub(filling + ready + held),
                filling,
                ready,
                held,
            },
            autotune: self.autotune,
            threads: self.threads.load(Ordering::Relaxed),
            depth: self.depth.load(Ordering::Relaxed),
            samples: self.samples.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            samples_per_s: round(view.samples_per_s),
            wait: view.wait.map(|w| (w * 10_000.0).round() / 10_000.0),
            step_ms: view.step_ms.map(|s| (s * 100.0).round() / 100.0),
            stage_us: StageTimes {
                read: round(view.stage_us[Stage::Read as usize]),
                decode: round(view.stage_us[Stage::Decode as usize]),
                transform: round(view.stage_us[Stage::Transform as usize]),
                write: round(view.stage_us[Stage::Write as usize]),
            },
            tune: view.tune,
        }
    }
}

/// Cumulative counters of one stream at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub samples: u64,
    pub stage_ns: [u64; STAGES],
    pub timed: u64,
    pub steps: u64,
    pub wait_ns: u64,
    pub compute_ns: u64,
}

impl Counters {
    /// `self - earlier`, per counter.
    pub fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            samples: self.samples.saturating_sub(earlier.samples),
            stage_ns: std::array::from_fn(|i| self.stage_ns[i].saturating_sub(earlier.stage_ns[i])),
            timed: self.timed.saturating_sub(earlier.timed),
            steps: self.steps.saturating_sub(earlier.steps),
            wait_ns: self.wait_ns.saturating_sub(earlier.wait_ns),
            compute_ns: self.compute_ns.saturating_sub(earlier.compute_ns),
        }
    }
}

/// The open streams, by id.
#[derive(Debug, Default)]
pub struct Registry {
    streams: Mutex<std::collections::BTreeMap<u64, Arc<StreamStats>>>,
    next_id: AtomicU64,
}

impl Registry {
    /// A new stream id (1, 2, ...).
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn insert(&self, s: Arc<StreamStats>) {
        self.streams.lock().unwrap_or_else(|p| p.into_inner()).insert(s.id, s);
    }

    pub fn remove(&self, id: u64) {
        self.streams.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }

    /// The open streams, by id.
    pub fn list(&self) -> Vec<Arc<StreamStats>> {
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

/// Slot counts of a stream (ring.md states; `ready`: finished, not yet announced).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotCounts {
    pub free: u32,
    pub filling: u32,
    pub ready: u32,
    pub held: u32,
}

/// Mean microseconds per sample by stage.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StageTimes {
    pub read: f64,
    pub decode: f64,
    pub transform: f64,
    pub write: f64,
}

/// One stream in a `snapshot` (control.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamSnapshot {
    pub stream: u64,
    pub pid: u32,
    pub dataset: String,
    pub batch_size: u32,
    pub epoch: u64,
    pub run: u32,
    pub slots: SlotCounts,
    pub autotune: bool,
    pub threads: u32,
    pub depth: u32,
    pub samples: u64,
    pub batches: u64,
    pub skipped: u64,
    pub samples_per_s: f64,
    pub wait: Option<f64>,
    pub step_ms: Option<f64>,
    pub stage_us: StageTimes,
    pub tune: String,
}

/// The server part of a `snapshot` (control.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerSnapshot {
    pub version: String,
    pub pid: u32,
    pub uptime_s: f64,
    pub cores: u32,
    pub cpu_budget: u32,
    pub threads: u32,
    pub active_threads: u32,
    pub busy: f64,
}

/// A whole `snapshot` message's body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub server: ServerSnapshot,
    pub streams: Vec<StreamSnapshot>,
}
