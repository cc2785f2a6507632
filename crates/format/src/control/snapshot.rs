//! The `snapshot` an observer gets (`proto/control.md`, "snapshot"): plain data that the server's
//! statistics and remote cache fill in and `ringfeed top`, `--metrics` and `Loader.stats()` read.
//! The counters behind them live with the server; only the shapes on the wire live here.

use serde::{Deserialize, Serialize};

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
    /// The loop's wait for data, net of back-pressure (1.2) when the client reports it.
    pub wait: Option<f64>,
    /// 1.2: the loop's wait behind its own GPU work (absent from older servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_wait: Option<f64>,
    /// 1.2: the allotted threads' busy share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy: Option<f64>,
    pub step_ms: Option<f64>,
    pub stage_us: StageTimes,
    pub tune: String,
    /// 1.2: what limits the loop over the last interval, in words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub limit: String,
    /// 1.3: the share offered to the client's GPU (absent without `gpu_decode`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_share: Option<f64>,
    /// 1.3: samples handed to the client's GPU since `open` (absent without `gpu_decode`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_samples: Option<u64>,
    /// 1.3: the client's host µs per GPU-finished sample over the last interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_decode_us: Option<f64>,
    /// 1.11: samples the server decoded and handed to the client's GPU as pixels since `open`
    /// (absent without `gpu_decode.pixels`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pixel_samples: Option<u64>,
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
    /// 1.3: what remote fetching has done (absent until a remote dataset was opened).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteSnapshot>,
}

/// A whole `snapshot` message's body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub server: ServerSnapshot,
    pub streams: Vec<StreamSnapshot>,
}

/// The `server.remote` member of a snapshot (control.md 1.3).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RemoteSnapshot {
    pub fetches: u64,
    pub bytes: u64,
    pub retries: u64,
    pub errors: u64,
    pub hits: u64,
    pub misses: u64,
    pub prefetches: u64,
    pub evictions: u64,
    pub reused: u64,
    pub rejected: u64,
    pub wait_s: f64,
    pub cache_bytes: u64,
    pub cache_limit: u64,
    /// 1.3: downloads allowed at once now, and whether `--fetch-concurrency` pins it (else the
    /// autotuner sets it).
    #[serde(default)]
    pub fetch_concurrency: u64,
    #[serde(default)]
    pub fetch_pinned: bool,
}
