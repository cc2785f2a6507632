//! Token windows as the server's second sample kind (`proto/control.md`, "Token streams").
//!
//! The seam with the image path is small: a token stream is a [`StreamState`] like any other
//! (same sampler over window indices, same ring, same run loop, `ready`/`release`/`end`), whose
//! [`StreamCtx::kind`] is [`SampleKind::Tokens`]; the pool's job then calls [`fill`] instead of
//! decoding an image. Nothing here runs for an image stream.
//!
//! [`StreamState`]: crate::stream
//! [`StreamCtx::kind`]: crate::pool::StreamCtx

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use serde::{Deserialize, Serialize};

use super::windows::{Mode, Window, WindowSpec, Windows};
use super::{FlatDtype, TokenSource};
use crate::control::{ErrorCode, ServerMessage};
use crate::pool::{BatchTask, SampleKind, StreamCtx};
use crate::ring::{DType, FieldDesc, FieldSpec, RingLayout, Segment};
use crate::sampler::SamplerConfig;
use crate::source::{Sample, SampleReader, Source, SourceError};
use crate::stream::Shared;

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
    "concat".into()
}

/// The `tokens` member of a token stream's `open`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
}

/// An `open` with `"sample_kind": "tokens"` (control.md, "Token streams").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenOpenRequest {
    pub dataset: String,
    pub batch_size: u32,
    pub tokens: TokenOptions,
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autotune: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_world_size: Option<u32>,
}

/// The optional fields a token stream delivers on request, besides `input_ids` and `labels`.
pub const TOKEN_FIELDS: [&str; 4] = ["position_ids", "document_ids", "cu_seqlens", "index"];

/// A token stream's windows and where each field lives in a slot.
#[derive(Debug)]
pub struct TokenKind {
    pub windows: Windows,
    pub path: PathBuf,
    pub input_ids: FieldDesc,
    pub labels: FieldDesc,
    pub position_ids: Option<FieldDesc>,
    pub document_ids: Option<FieldDesc>,
    pub cu_seqlens: Option<FieldDesc>,
    pub index: Option<FieldDesc>,
}

/// The stream's `source`: the windows, counted as samples. Windows are written by [`fill`], so
/// reading one as an encoded sample is an error.
impl Source for TokenKind {
    fn len(&self) -> u64 {
        self.windows.len()
    }
    fn class_names(&self) -> Vec<Vec<u8>> {
        Vec::new()
    }
    fn describe(&self) -> String {
        format!(
            "{} ({} tokens, {} windows of {})",
            self.path.display(),
            self.windows.source.kind(),
            self.windows.len(),
            self.windows.spec.seq_len
        )
    }
    fn reader(&self) -> Result<Box<dyn SampleReader + '_>, SourceError> {
        Ok(Box::new(NoSamples))
    }
}

struct NoSamples;

impl SampleReader for NoSamples {
    fn get(&mut self, index: u64) -> Result<Sample<'_>, SourceError> {
        Err(SourceError::OutOfRange {
            index,
            len: 0,
            source_desc: "token windows (filled by the tokens kind, not read as samples)".into(),
        })
    }
}

thread_local! {
    static WINDOW: RefCell<(Window, Vec<u8>)> = RefCell::new((Window::default(), Vec::new()));
}

/// Writes the window of sample `pos` of `task` into its slot.
pub fn fill(kind: &TokenKind, task: &BatchTask, pos: u32) {
    let w = task.indices[pos as usize];
    WINDOW.with(|cell| {
        let (win, bytes) = &mut *cell.borrow_mut();
        kind.windows.fill(w, win);
        let put = |field: &FieldDesc, bytes: &[u8]| {
            debug_assert_eq!(bytes.len() as u64, field.sample_bytes);
            let at = field.offset + u64::from(pos) * field.sample_bytes;
            let dst = task.stream.segment.slot_ptr(task.slot, at, field.sample_bytes);
            // SAFETY: `dst` is valid for `sample_bytes` bytes (slot_ptr checks the range); this
            // job is the only writer of sample `pos` of this FILLING slot (pool.rs invariants),
            // and the client reads it only after `ready` (ring.md rules 1 and 2).
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
        };
        bytes.clear();
        bytes.extend(win.input_ids.iter().flat_map(|v| v.to_le_bytes()));
        put(&kind.input_ids, bytes);
        bytes.clear();
        bytes.extend(win.labels.iter().flat_map(|v| v.to_le_bytes()));
        put(&kind.labels, bytes);
        for (f, v) in [
            (&kind.position_ids, &win.position_ids),
            (&kind.document_ids, &win.document_ids),
            (&kind.cu_seqlens, &win.cu_seqlens),
        ] {
            if let Some(f) = f {
                bytes.clear();
                bytes.extend(v.iter().flat_map(|x| x.to_le_bytes()));
                put(f, bytes);
            }
        }
        if let Some(f) = &kind.index {
            put(f, &(w as i64).to_le_bytes());
        }
    });
}

type OpenError = (ErrorCode, String);

/// What [`open_token_stream`] hands back to the stream: the context, its sampler and the `ring`
/// message.
pub(crate) type Opened = (Arc<StreamCtx>, SamplerConfig, ServerMessage);

/// Validates a token `open`, opens the token data and its windows, and creates the ring.
pub(crate) async fn open_token_stream(
    open: &TokenOpenRequest,
    shared: &Arc<Shared>,
    done: tokio::sync::mpsc::UnboundedSender<Arc<BatchTask>>,
    pid: u32,
) -> Result<Opened, OpenError> {
    let bad = |m: String| (ErrorCode::BadRequest, m);
    if !(1..=65536).contains(&open.batch_size) {
        return Err(bad(format!("open.batch_size {} is outside 1..=65536", open.batch_size)));
    }
    if !(1..=64).contains(&open.slots) {
        return Err(bad(format!("open.slots {} is outside 1..=64", open.slots)));
    }
    if let Some(p) = open.prefetch.filter(|p| !(1..=open.slots).contains(p)) {
        return Err(bad(format!("open.prefetch {p} is outside 1..=slots ({})", open.slots)));
    }
    let t = &open.tokens;
    if !(1..=1 << 20).contains(&t.seq_len) {
        return Err(bad(format!("open.tokens.seq_len {} is outside 1..=1048576", t.seq_len)));
    }
    let mode = match t.mode.as_str() {
        "concat" => Mode::Concat,
        "pack" => Mode::Pack,
        other => {
            return Err(bad(format!(
                "open.tokens.mode {other:?} must be \"concat\" or \"pack\""
            )));
        }
    };
    let flat = match t.dtype.as_deref() {
        None => None,
        Some("uint16") => Some(FlatDtype::Uint16),
        Some("uint32") => Some(FlatDtype::Uint32),
        Some(other) => {
            return Err(bad(format!(
                "open.tokens.dtype {other:?} must be \"uint16\" or \"uint32\" (a flat token file's dtype)"
            )));
        }
    };
    let fields = open.fields.clone().unwrap_or_default();
    for f in &fields {
        if !TOKEN_FIELDS.contains(&f.as_str()) {
            return Err(bad(format!(
                "open.fields: unknown field {f:?} for a token stream (known: {})",
                TOKEN_FIELDS.join(", ")
            )));
        }
    }
    let path = PathBuf::from(&open.dataset);
    if !path.is_absolute() {
        return Err(bad(format!("open.dataset {:?} must be an absolute path", open.dataset)));
    }
    let dataset_err = |m: String| (ErrorCode::Dataset, m);
    let canonical =
        std::fs::canonicalize(&path).map_err(|e| dataset_err(format!("dataset {}: {e}", path.display())))?;
    if !shared.data_roots.is_empty() && !shared.data_roots.iter().any(|r| canonical.starts_with(r)) {
        return Err(dataset_err(format!(
            "dataset {} is outside the server's --data-root directories; ask the server's operator to add its directory",
            path.display()
        )));
    }
    let (seq_len, max_docs, pad) = (t.seq_len, t.max_docs.unwrap_or(t.seq_len), t.pad_id);
    let shown = path.clone();
    let windows = tokio::task::spawn_blocking(move || -> Result<Windows, OpenError> {
        crate::fault::install().map_err(|e| (ErrorCode::Internal, e.to_string()))?;
        let src = TokenSource::open(&canonical, flat).map_err(|e| (ErrorCode::Dataset, e.to_string()))?;
        let spec = WindowSpec {
            seq_len,
            mode,
            max_docs,
            pad_id: pad.or(src.eos_id()).unwrap_or(0),
        };
        Windows::new(Arc::new(src), spec).map_err(|e| (ErrorCode::BadRequest, format!("{}: {e}", shown.display())))
    })
    .await
    .map_err(|e| (ErrorCode::Internal, e.to_string()))??;
    if windows.is_empty() {
        return Err(bad(format!(
            "{}: {} tokens make no window of seq_len {seq_len} (a window reads seq_len + 1 tokens); lower tokens.seq_len",
            path.display(),
            windows.source.token_count()
        )));
    }
    let sampler = SamplerConfig {
        dataset_len: windows.len(),
        batch_size: u64::from(open.batch_size),
        shuffle: open.shuffle,
        seed: open.seed,
        drop_last: open.drop_last,
        rank: u64::from(open.rank),
        world_size: u64::from(open.world_size),
    };
    let (per_rank, batches) = sampler
        .validate()
        .map_err(|e| bad(format!("{}: {e}", path.display())))?;
    let want = |n: &str| fields.iter().any(|f| f == n);
    let mut specs = vec![
        FieldSpec {
            name: "input_ids".into(),
            dtype: DType::I64,
            shape: vec![seq_len],
        },
        FieldSpec {
            name: "labels".into(),
            dtype: DType::I64,
            shape: vec![seq_len],
        },
    ];
    for name in ["position_ids", "document_ids"] {
        if want(name) {
            specs.push(FieldSpec {
                name: name.into(),
                dtype: DType::I32,
                shape: vec![seq_len],
            });
        }
    }
    if want("cu_seqlens") {
        specs.push(FieldSpec {
            name: "cu_seqlens".into(),
            dtype: DType::I32,
            shape: vec![max_docs + 1],
        });
    }
    if want("index") {
        specs.push(FieldSpec {
            name: "index".into(),
            dtype: DType::I64,
            shape: vec![],
        });
    }
    let ring = RingLayout::new(&specs, open.batch_size, open.slots).map_err(|e| bad(e.to_string()))?;
    if ring.header.segment_len > shared.max_ring_bytes {
        return Err(bad(format!(
            "the ring would take {:.2} GiB ({} slots of {} windows of {seq_len} tokens), more than the server's limit of {:.2} GiB; lower slots or batch_size, or start the server with a larger --max-ring-bytes",
            ring.header.segment_len as f64 / (1u64 << 30) as f64,
            open.slots,
            open.batch_size,
            shared.max_ring_bytes as f64 / (1u64 << 30) as f64
        )));
    }
    let segment = tokio::task::spawn_blocking(move || Segment::create(ring, "ringfeed-ring"))
        .await
        .map_err(|e| (ErrorCode::Internal, e.to_string()))?
        .map_err(|e| bad(e.to_string()))?;
    let field = |n: &str| segment.layout().field(n).cloned();
    let kind = Arc::new(TokenKind {
        input_ids: field("input_ids").expect("always present"),
        labels: field("labels").expect("always present"),
        position_ids: field("position_ids"),
        document_ids: field("document_ids"),
        cu_seqlens: field("cu_seqlens"),
        index: field("index"),
        windows,
        path: path.clone(),
    });
    // Reading windows costs little: one thread unless the client asks for more.
    let pool = shared.pool.threads() as u32;
    let threads = open.threads.unwrap_or(1).min(pool).max(1);
    let depth = open.prefetch.unwrap_or((open.slots - 1).max(1));
    let stats = Arc::new(crate::stats::StreamStats::new(
        shared.registry.next_id(),
        pid,
        kind.describe(),
        open.batch_size,
        open.slots,
        open.autotune != Some(false),
        open.threads,
        open.local_world_size,
        threads,
        depth,
    ));
    let ctx = Arc::new(StreamCtx {
        // The image path's members are not used by a token stream (`kind` decides): no views,
        // and `label` holds the labels field so that slot compaction (which never runs for
        // windows: they do not fail) stays total.
        views: Vec::new(),
        label: kind.labels.clone(),
        index: None,
        crop: None,
        gpu: None,
        source: Arc::clone(&kind) as Arc<dyn Source>,
        segment: Arc::new(segment),
        pipeline: crate::ops::Transform::Resize { size: (1, 1) }.to_pipeline(),
        layout: crate::ops::Layout::Nhwc,
        seed: open.seed,
        current_run: AtomicU32::new(0),
        done,
        stats,
        kind: SampleKind::Tokens(Arc::clone(&kind)),
    });
    let ring_msg = ServerMessage::Ring {
        segment_len: ctx.segment.len(),
        dataset_len: kind.windows.len(),
        samples_per_rank: per_rank,
        batches_per_epoch: batches,
        classes: Vec::new(),
        stream: Some(ctx.stats.id),
        order: None,
    };
    Ok((ctx, sampler, ring_msg))
}
