//! Message shapes (control.md, "Messages"). Unknown members are ignored on decode; optional
//! members are left out on encode.

use serde::{Deserialize, Serialize};

fn yes() -> bool {
    true
}
fn default_layout() -> String {
    "NHWC".to_owned()
}
fn default_world() -> u32 {
    1
}
fn default_slots() -> u32 {
    4
}
fn default_on_error() -> String {
    "raise".to_owned()
}
fn default_scale() -> [f64; 2] {
    [0.08, 1.0]
}
fn default_ratio() -> [f64; 2] {
    [3.0 / 4.0, 4.0 / 3.0]
}
fn default_flip() -> f64 {
    0.0
}

/// Messages a client sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientMessage {
    Hello {
        protocol: [u16; 2],
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<u64>,
    },
    Open(Box<OpenRequest>),
    /// 1.2: an `open` with `"sample_kind": "tokens"` (control.md, "Token streams"); decoded by
    /// the connection's reader from an `open` message, never sent under a type of its own.
    #[serde(skip)]
    OpenTokens(Box<crate::tokens::serve::TokenOpenRequest>),
    Start {
        epoch: u64,
        #[serde(default)]
        first_batch: u64,
    },
    Release {
        slot: u32,
        seq: u64,
    },
    Stats {
        steps: u64,
        wait_ns: u64,
        compute_ns: u64,
        /// 1.2: of `wait_ns`, the time spent behind the client's own GPU work.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu_wait_ns: Option<u64>,
        /// 1.3: samples the client finished on its GPU, over those steps.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu_samples: Option<u64>,
        /// 1.3: the client's host time on them.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu_decode_ns: Option<u64>,
        /// 1.3: of `gpu_samples`, those its GPU decoder refused (decoded on its CPU).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu_fallbacks: Option<u64>,
    },
    /// 1.1: an observer's request for the server's state.
    Snapshot {},
    Close,
}

/// LMDB options of an `open`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LmdbRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels_key: Option<String>,
}

/// The transform of an `open` (control.md, "Transforms").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TransformRequest {
    RandomResizedCrop {
        size: [u32; 2],
        #[serde(default = "default_scale")]
        scale: [f64; 2],
        #[serde(default = "default_ratio")]
        ratio: [f64; 2],
        #[serde(default = "default_flip")]
        flip: f64,
    },
    CenterCrop {
        size: [u32; 2],
        resize: u32,
    },
    Resize {
        size: [u32; 2],
    },
}

/// The members of an `open` (control.md, "open").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenRequest {
    pub dataset: String,
    #[serde(default)]
    pub lmdb: LmdbRequest,
    pub batch_size: u32,
    /// The 1.1 fixed transform; one of `transform` and `pipeline` is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<TransformRequest>,
    /// 1.2: the op pipeline (control.md, "Pipelines"), parsed by `ops::Pipeline::parse`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<serde_json::Value>,
    #[serde(default = "default_layout")]
    pub layout: String,
    #[serde(default = "yes")]
    pub shuffle: bool,
    #[serde(default)]
    pub seed: u64,
    #[serde(default = "yes")]
    pub drop_last: bool,
    #[serde(default)]
    pub rank: u32,
    #[serde(default = "default_world")]
    pub world_size: u32,
    #[serde(default = "default_slots")]
    pub slots: u32,
    #[serde(default = "default_on_error")]
    pub on_error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields: Option<Vec<String>>,
    #[serde(default = "yes")]
    pub check_crc: bool,
    /// 1.1: let the server's autotuner set threads and depth (absent: yes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autotune: Option<bool>,
    /// 1.1: decode threads (pinned without autotune, a bound with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// 1.1: prefetch depth (fixed without autotune, the starting depth with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<u32>,
    /// 1.1: training processes on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_world_size: Option<u32>,
    /// 1.3: hybrid decode (control.md, "Hybrid decode").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_decode: Option<GpuDecodeRequest>,
    /// 1.3: the sample order, `auto` (absent), `global` or `shard_blocks` (`crate::order`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<String>,
    /// 1.3: shards per shuffle block of the `shard_blocks` order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_block: Option<u64>,
    /// 1.3: samples per stand-in shard, for sources without shard files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_shard: Option<u64>,
    /// 1.3: WebDataset options (`crate::source::wds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webdataset: Option<WdsRequest>,
}

/// `open.gpu_decode` (1.3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuDecodeRequest {
    /// The pinned share, `0..=1`; `None`: the autotuner sets it.
    #[serde(default)]
    pub share: Option<f64>,
    /// Room for encoded bytes per sample of a full batch; `None`: `max(3·H·W, 65536)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_sample: Option<u64>,
}

/// 1.3: the WebDataset options of an `open` (control.md, "WebDataset shards").
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WdsRequest {
    /// Image extensions, `;`-separated, the first present wins (default `jpg;jpeg;png;webp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The label's extension (default `cls`); `""` for no labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The member of a JSON label (required when `label` is a `json` extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_key: Option<String>,
    /// Whether the server may write index files next to the tars (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_index: Option<bool>,
}

/// Error codes (control.md, "error").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    Version,
    Protocol,
    BadRequest,
    Dataset,
    Sample,
    Internal,
    /// 1.1: the server is stopping on purpose (SIGTERM/SIGINT); its successor can be reconnected to.
    Shutdown,
}

/// Messages a server sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMessage {
    Welcome {
        protocol: [u16; 2],
        #[serde(default, skip_serializing_if = "Option::is_none")]
        server: Option<String>,
    },
    Ring {
        segment_len: u64,
        dataset_len: u64,
        samples_per_rank: u64,
        batches_per_epoch: u64,
        classes: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stream: Option<u64>,
        /// 1.3: the order the stream uses (`global` or `shard_blocks`: what `auto` became).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        order: Option<String>,
    },
    Ready {
        run: u32,
        seq: u64,
        slot: u32,
    },
    End {
        run: u32,
        epoch: u64,
        batches: u64,
        skipped: u64,
    },
    Error {
        code: ErrorCode,
        message: String,
        fatal: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sample: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run: Option<u32>,
    },
    /// 1.1: the answer to an observer's `snapshot`.
    Snapshot(Box<crate::stats::Snapshot>),
    /// 1.2: the dataset is still being opened (an image folder or manifest being listed).
    Opening {
        dataset: String,
        listed: u64,
        elapsed_ms: u64,
    },
}

impl ServerMessage {
    /// An error message.
    pub fn error(code: ErrorCode, message: impl Into<String>, fatal: bool) -> Self {
        ServerMessage::Error {
            code,
            message: message.into(),
            fatal,
            sample: None,
            key: None,
            run: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_defaults() {
        let m: ClientMessage = serde_json::from_str(
            r#"{"type":"open","dataset":"/d","batch_size":8,"transform":{"kind":"random_resized_crop","size":[224,224]},"future_member":1}"#,
        )
        .unwrap();
        let ClientMessage::Open(o) = m else { panic!() };
        assert_eq!(
            (o.layout.as_str(), o.shuffle, o.drop_last, o.world_size, o.slots),
            ("NHWC", true, true, 1, 4)
        );
        assert_eq!(
            o.transform.unwrap(),
            TransformRequest::RandomResizedCrop {
                size: [224, 224],
                scale: [0.08, 1.0],
                ratio: [0.75, 4.0 / 3.0],
                flip: 0.0
            }
        );
    }
}
