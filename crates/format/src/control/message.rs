//! Message shapes (control.md, "Messages"). Unknown members are ignored on decode; optional
//! members are left out on encode.

use serde::{Deserialize, Serialize};

fn yes() -> bool {
    true
}
fn default_world() -> u32 {
    1
}
fn default_slots() -> u32 {
    4
}
fn default_mode() -> String {
    "concat".to_owned()
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
    /// An `open` of either sample kind (`OpenRequest::sample_kind`).
    Open(Box<OpenRequest>),
    Start {
        epoch: u64,
        #[serde(default)]
        first_batch: u64,
        /// 1.3: where in the epoch's order this run's striping starts: the samples all ranks
        /// consumed before it (control.md, "Resume by a global position").
        #[serde(default, skip_serializing_if = "Option::is_none")]
        position: Option<u64>,
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
        /// 1.5: of the wait for data (`wait_ns - gpu_wait_ns`), the time spent waiting for the
        /// client's own GPU decodes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu_decode_wait_ns: Option<u64>,
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

/// What an `open` asks for (control.md, "open", "Token streams").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SampleKindRequest {
    /// Decoded images (the default, and all there was before 1.2).
    #[default]
    Images,
    /// 1.2: windows of token data.
    Tokens,
}

/// The `tokens` member of a token stream's `open` (control.md, "Token streams").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenOptions {
    pub seq_len: u32,
    #[serde(default = "default_mode")]
    pub mode: String,
    /// Entries of `cu_seqlens` minus one (default: `seq_len`, which always fits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_docs: Option<u32>,
    /// Padding id in `pack` mode (default: the dataset's EOS, else 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_id: Option<u32>,
    /// A flat token file's dtype: `uint16` or `uint32`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// 1.3: more token datasets mixed into the stream with `open.dataset` (control.md, "Mixing").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mix: Option<Vec<MixEntry>>,
    /// 1.3: the weight of `open.dataset` in a mix (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
}

/// One more dataset of a token mix (1.3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MixEntry {
    pub dataset: String,
    pub weight: f64,
}

/// The members of an `open` (control.md, "open"), for every sample kind. Members of one kind
/// only are optional here so that a typed decode and encode gives back exactly what was sent;
/// [`OpenRequest::layout`] and its siblings apply the defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenRequest {
    /// 1.2: `"images"` (absent) or `"tokens"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_kind: Option<SampleKindRequest>,
    pub dataset: String,
    /// Images: LMDB options (default `{}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lmdb: Option<LmdbRequest>,
    pub batch_size: u32,
    /// Images: the 1.1 fixed transform; one of `transform` and `pipeline` is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<TransformRequest>,
    /// Images, 1.2: the op pipeline (control.md, "Pipelines"), parsed by `ops::Pipeline::parse`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<serde_json::Value>,
    /// Tokens, 1.2: seq_len, mode and the rest (control.md, "Token streams").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenOptions>,
    /// Images: `NHWC` (default) or `NCHW`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
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
    /// Images: `raise` (default) or `skip`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields: Option<Vec<String>>,
    /// Images: check each packed record's CRC (default yes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_crc: Option<bool>,
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
    /// 1.3: the sample order, `auto` (absent), `global` or `shard_blocks` (`ringfeed_order::blocks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<String>,
    /// 1.3: shards per shuffle block of the `shard_blocks` order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_block: Option<u64>,
    /// 1.3: samples per stand-in shard, for sources without shard files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_shard: Option<u64>,
    /// 1.3: WebDataset options (`ringfeed_source::wds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webdataset: Option<WdsRequest>,
    /// 1.9: Parquet options (control.md, "Parquet datasets (1.9)").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parquet: Option<ParquetRequest>,
    /// 1.9: text fields of each sample (control.md, "Sample fields (1.9)").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<Vec<TextFieldRequest>>,
    /// 1.9: typed metadata fields of each sample (control.md, "Sample fields (1.9)").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Vec<MetaFieldRequest>>,
    /// 1.10: detection and segmentation targets (control.md, "Detection and segmentation
    /// targets (1.10)").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets: Option<TargetsRequest>,
}

/// 1.10: `open.targets`: where each sample's boxes and label map come from, and how they are
/// delivered. Bounds are checked by the server when it opens the stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetsRequest {
    /// `"stored"` (a packed dataset's `targets.rft`), or a WebDataset JSON member `EXT` /
    /// `EXT:KEY` holding a list of COCO annotation objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boxes: Option<String>,
    /// `"stored"`, or a WebDataset PNG member's extension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<String>,
    /// Room per sample for boxes, `1 ..= 4096`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_boxes: Option<u32>,
    /// `SanitizeBoundingBoxes`' `min_size` (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_size: Option<f64>,
    /// `SanitizeBoundingBoxes`' `min_area` (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_area: Option<f64>,
    /// The label of mask pixels no source pixel covers (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_fill: Option<u32>,
    /// Each box's instance mask (ring field `instance_masks`, bit-packed); needs stored boxes
    /// with instance masks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_masks: Option<bool>,
    /// Keypoints per box, `K` (ring field `keypoints` `[max_boxes, K, 3]`); must equal the stored
    /// count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keypoints: Option<u32>,
}

/// 1.9: one of `open.text` (control.md, "Sample fields (1.9)"): raw UTF-8, or token ids when it
/// names a `tokenizer`. Bounds and names are checked by the server when it opens the stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextFieldRequest {
    /// The field's name in the batch.
    pub name: String,
    /// Where it comes from: a member `EXT`, a JSON member `EXT:KEY`, or a manifest column.
    pub source: String,
    /// Raw text: room per sample for its UTF-8 bytes (default 1024).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// Tokenised: the absolute path of a Hugging Face `tokenizer.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// Tokenised: tokens per sample (default 77).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<u64>,
}

/// 1.9: one of `open.meta` (control.md, "Sample fields (1.9)"): a typed scalar per sample.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetaFieldRequest {
    /// The field's name in the batch.
    pub name: String,
    /// Where it comes from, as a text field's `source`.
    pub source: String,
    /// `float32`, `int32`, `int64` or `bool`.
    pub dtype: String,
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
    /// 1.11: the client also finishes the samples the server decodes, from their decoded pixels
    /// (control.md, "Decoded pixels (1.11)"); a 1.10 server ignores it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pixels: bool,
}

/// The URL scheme of a dataset on S3-compatible storage (control.md, "open", 1.3): an
/// `open.dataset` that starts with it is sent unchanged and fetched by the server.
pub const REMOTE_SCHEME: &str = "s3://";

/// Every URL scheme of a dataset on object storage: S3 (1.3), Google Cloud Storage and Azure
/// Blob Storage (1.9, "Other object stores"). An `open.dataset` that starts with one is fetched
/// by the server; anything else is a path. The one list every side checks URLs against.
pub const REMOTE_SCHEMES: [&str; 3] = [REMOTE_SCHEME, "gs://", "az://"];

/// The scheme of [`REMOTE_SCHEMES`] that `dataset` starts with, if any.
pub fn object_storage_scheme(dataset: &str) -> Option<&'static str> {
    REMOTE_SCHEMES.into_iter().find(|s| dataset.starts_with(s))
}

/// Whether `dataset` names a dataset on object storage rather than a local path.
pub fn names_object_storage(dataset: &str) -> bool {
    object_storage_scheme(dataset).is_some()
}

impl OpenRequest {
    /// The sample kind asked for (absent: images).
    pub fn kind(&self) -> SampleKindRequest {
        self.sample_kind.unwrap_or_default()
    }
    /// The image layout (default `NHWC`).
    pub fn layout(&self) -> &str {
        self.layout.as_deref().unwrap_or("NHWC")
    }
    /// The per-sample error policy (default `raise`).
    pub fn on_error(&self) -> &str {
        self.on_error.as_deref().unwrap_or("raise")
    }
    /// Whether packed records' CRCs are checked (default yes).
    pub fn check_crc(&self) -> bool {
        self.check_crc.unwrap_or(true)
    }
    /// The LMDB options (default none).
    pub fn lmdb(&self) -> LmdbRequest {
        self.lmdb.clone().unwrap_or_default()
    }
    /// The members given that the sample kind does not take, by name (control.md, "Token
    /// streams": a token `open` has no image members; an image `open` no `tokens`).
    pub fn foreign_members(&self) -> Vec<&'static str> {
        let present: Vec<(&'static str, bool)> = match self.kind() {
            SampleKindRequest::Images => vec![("tokens", self.tokens.is_some())],
            SampleKindRequest::Tokens => vec![
                ("transform", self.transform.is_some()),
                ("pipeline", self.pipeline.is_some()),
                ("layout", self.layout.is_some()),
                ("lmdb", self.lmdb.is_some()),
                ("on_error", self.on_error.is_some()),
                ("check_crc", self.check_crc.is_some()),
                ("gpu_decode", self.gpu_decode.is_some()),
                ("order", self.order.is_some()),
                ("order_block", self.order_block.is_some()),
                ("order_shard", self.order_shard.is_some()),
                ("webdataset", self.webdataset.is_some()),
            ],
        };
        present.into_iter().filter(|(_, p)| *p).map(|(n, _)| n).collect()
    }
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

/// 1.9: the Parquet options of an `open` (control.md, "Parquet datasets (1.9)").
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ParquetRequest {
    /// The image column (default `image`): binary, or a struct with a binary member `bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The integer label column (default `label`); `""` for no labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
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
        /// 1.6: the fingerprint of what the stream serves (`DatasetId`, control.md "Dataset
        /// identity"), which a client's state records.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dataset_id: Option<String>,
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
    Snapshot(Box<crate::control::Snapshot>),
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
            (o.layout(), o.shuffle, o.drop_last, o.world_size, o.slots),
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
