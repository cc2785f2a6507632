//! Token windows as the server's second sample kind (`proto/control.md`, "Token streams").
//!
//! The seam with the image path is small: a token stream is opened by the same `open` and
//! `stream::open_stream` as an image stream ([`prepare`] is its kind's part) and is a
//! [`StreamState`] like any other (same sampler over window indices, same ring, same run loop,
//! `ready`/`release`/`end`), whose
//! [`StreamCtx::kind`] is [`SampleKind::Filled`] with a [`TokenKind`]; the pool's job then calls its
//! [`Fill`](crate::pool::Fill) instead of decoding an image. Nothing here runs for an image stream.
//!
//! [`StreamState`]: crate::stream
//! [`StreamCtx::kind`]: crate::pool::StreamCtx

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::unix::OwnedWriteHalf;

use ringfeed_format::control::{ErrorCode, OpenRequest, TokenOptions};
use ringfeed_format::ring::{DType, FieldDesc, FieldSpec};
use ringfeed_format::tokens::{FlatDtype, TokenSource};
use ringfeed_order::mix::Mix;
use ringfeed_order::windows::{Mode, Window, WindowSpec, Windows, WindowsError};
use ringfeed_source::{Sample, SampleReader, Source, SourceError};

use crate::pool::{BatchTask, SampleKind};
use crate::segment::Segment;
use crate::shared::{KindParts, OpenError, Prepared, Shared};

/// The optional fields a token stream delivers on request, besides `input_ids` and `labels`.
pub const TOKEN_FIELDS: [&str; 5] = ["position_ids", "document_ids", "cu_seqlens", "index", "dataset_index"];

/// A token stream's windows, counted as the stream's samples: one dataset's, or several mixed.
#[derive(Debug)]
pub struct TokenWindows {
    /// Each dataset's path (as the client named it) and windows: `open.dataset` first, then
    /// `tokens.mix` in order.
    pub parts: Vec<(PathBuf, Windows)>,
    /// The stream's order: the mix of `parts` (1.3), or for one dataset the mix of one (every
    /// slot is dataset 0: its windows in the order of its keyed permutation).
    pub mix: Mix,
    /// Whether the windows are shuffled: by the keyed permutations of `locate`, never by the
    /// sampler (whose order for a token stream is the identity).
    pub shuffle: bool,
    pub seed: u64,
    /// 1.7: what keeps the files of the stream's remote (`s3://`) datasets in the server's
    /// cache while the stream reads them ([`remote_copy`]); dropped with the windows.
    pub held: Vec<Hold>,
}

impl TokenWindows {
    /// The window at position `k` of `epoch`'s order (control.md, "Token streams": a slot of the
    /// mix, or for one dataset, a mix of one, its window `π₀(k)`): its dataset and window, in
    /// O(1) time and memory.
    pub fn locate(&self, k: u64, epoch: u64) -> (usize, u64) {
        self.mix.window(k, self.seed, epoch, self.shuffle)
    }
}

/// A token stream's windows and where each field lives in a slot.
#[derive(Debug)]
pub struct TokenKind {
    pub windows: Arc<TokenWindows>,
    pub input_ids: FieldDesc,
    pub labels: FieldDesc,
    pub position_ids: Option<FieldDesc>,
    pub document_ids: Option<FieldDesc>,
    pub cu_seqlens: Option<FieldDesc>,
    pub index: Option<FieldDesc>,
    pub dataset_index: Option<FieldDesc>,
}

/// The stream's `source`: the windows, counted as samples. Windows are written by [`fill`], so
/// reading one as an encoded sample is an error.
impl Source for TokenWindows {
    /// After the common part (windows, no classes, no shards): the window shape (`seq_len` as a
    /// `u32`, the mode as a `u8`: 0 `concat`, 1 `pack`), then a `u32` count of datasets and for
    /// each its tokens, documents, windows and quantised weight, as `u64`s (control.md, "Dataset
    /// identity").
    fn identify(&self, id: &mut ringfeed_format::control::DatasetId) {
        id.samples(self.len(), &[], None);
        let spec = self.parts[0].1.spec;
        let mode = match spec.mode {
            Mode::Concat => 0,
            Mode::Pack => 1,
        };
        id.u32(spec.seq_len).u8(mode).u32(self.parts.len() as u32);
        for ((_, w), &weight) in self.parts.iter().zip(&self.mix.weights) {
            id.u64(w.source.token_count())
                .u64(w.source.doc_count())
                .u64(w.len())
                .u64(weight);
        }
    }

    fn len(&self) -> u64 {
        self.mix.len()
    }
    fn class_names(&self) -> Vec<Vec<u8>> {
        Vec::new()
    }
    fn describe(&self) -> String {
        let one = |(path, w): &(PathBuf, Windows)| {
            format!(
                "{} ({} tokens, {} windows of {})",
                path.display(),
                w.source.kind(),
                w.len(),
                w.spec.seq_len
            )
        };
        if self.parts.len() == 1 {
            return one(&self.parts[0]);
        }
        let m = &self.mix;
        let total: u64 = m.weights.iter().sum();
        let parts: Vec<String> = self
            .parts
            .iter()
            .zip(&m.weights)
            .map(|(p, &q)| format!("{} x{:.3}", one(p), q as f64 / total as f64))
            .collect();
        format!("a mix of {} windows: {}", m.len(), parts.join(", "))
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

/// Writes the window of sample `pos` of `task` into its slot. Fails (with the window's name and
/// the damage) only when a packing file or document table read on the way is damaged.
impl crate::pool::Fill for TokenKind {
    fn fill(&self, task: &BatchTask, pos: u32) -> Result<(), (String, String)> {
        fill(self, task, pos)
    }
}

/// Writes the window of sample `pos` of `task` into its slot (see [`TokenKind`]'s `Fill`).
fn fill(kind: &TokenKind, task: &BatchTask, pos: u32) -> Result<(), (String, String)> {
    let (d, w) = kind.windows.locate(task.indices[pos as usize], task.epoch);
    WINDOW.with(|cell| {
        let (win, bytes) = &mut *cell.borrow_mut();
        let (path, windows) = &kind.windows.parts[d];
        windows
            .fill(w, win)
            .map_err(|e| (format!("{} window {w}", path.display()), e.to_string()))?;
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
        if let Some(f) = &kind.dataset_index {
            put(f, &(d as i32).to_le_bytes());
        }
        Ok(())
    })
}

/// The token kind of an `open` (control.md, "Token streams"): checks `tokens` and `fields`, opens
/// the token data and its windows, and names the ring's fields. The stream's set-up is
/// `stream::open_stream`'s, as for images.
pub(crate) async fn prepare(
    open: &OpenRequest,
    shared: &Arc<Shared>,
    mut progress: Option<&mut OwnedWriteHalf>,
) -> Result<Prepared, OpenError> {
    let TokenOpen {
        t,
        mode,
        flat,
        fields,
        named,
        weights,
    } = check_open(open)?;
    let mut parts = Vec::with_capacity(named.len());
    let mut held = Vec::new();
    for (dataset, _) in &named {
        // 1.7: an `s3://` dataset is fetched into the server's cache first, then read from there
        // exactly as a local copy; `None` for a local path.
        let local = match remote_copy(shared, dataset, &t, mode, flat, progress.as_deref_mut()).await? {
            Some((dir, hold)) => {
                held.push(hold);
                Some(dir)
            }
            None => None,
        };
        parts.push(open_windows(shared, &t, mode, flat, PathBuf::from(dataset), local).await?);
    }
    let (seq_len, max_docs) = (t.seq_len, t.max_docs.unwrap_or(t.seq_len));
    // The mix's schedule is computed off the tokio workers, as the windows are.
    // One dataset is the mix of one (weight 1: a period of one slot).
    let sizes: Vec<u64> = parts.iter().map(|(_, w)| w.len()).collect();
    let q = weights.unwrap_or_else(|| vec![1]);
    let mix = tokio::task::spawn_blocking(move || Mix::new(sizes, q))
        .await
        .map_err(|e| (ErrorCode::Internal, e.to_string()))?;
    let specs = field_specs(seq_len, max_docs, &fields);
    let windows = Arc::new(TokenWindows {
        parts,
        mix,
        shuffle: open.shuffle,
        seed: open.seed,
        held,
    });
    Ok(prepared(windows, specs, seq_len))
}

/// A token `open`'s members, checked.
struct TokenOpen {
    t: TokenOptions,
    mode: Mode,
    flat: Option<FlatDtype>,
    fields: Vec<String>,
    /// `open.dataset`, then the mix's, each with its weight.
    named: Vec<(String, f64)>,
    /// The quantised weights of a mix; `None` for one dataset.
    weights: Option<Vec<u64>>,
}

/// Checks `open.tokens` and `open.fields` before anything is opened.
fn check_open(open: &OpenRequest) -> Result<TokenOpen, OpenError> {
    let bad = |m: String| (ErrorCode::BadRequest, m);
    let Some(t) = open.tokens.clone() else {
        return Err(bad(
            "open.tokens is required for a token stream (\"sample_kind\": \"tokens\"): at least {\"seq_len\": N}"
                .into(),
        ));
    };
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
    if t.weight.is_some() && t.mix.is_none() {
        return Err(bad(
            "open.tokens.weight is the weight of open.dataset in a mix; give tokens.mix too, or leave weight out"
                .into(),
        ));
    }
    // The datasets: open.dataset, then the mix's, each with its weight (1.3, control.md "Mixing").
    let mut named = vec![(open.dataset.clone(), t.weight.unwrap_or(1.0))];
    for (i, m) in t.mix.iter().flatten().enumerate() {
        if !Path::new(&m.dataset).is_absolute() && !ringfeed_format::control::names_object_storage(&m.dataset) {
            return Err(bad(format!(
                "open.tokens.mix[{i}].dataset {:?} must be an absolute path or an s3://, gs:// or az:// URL",
                m.dataset
            )));
        }
        named.push((m.dataset.clone(), m.weight));
    }
    let weights = if t.mix.is_some() {
        Some(ringfeed_order::mix::quantise(&named).map_err(|e| bad(e.to_string()))?)
    } else {
        None
    };
    Ok(TokenOpen {
        t,
        mode,
        flat,
        fields,
        named,
        weights,
    })
}

/// What keeps a remote token dataset's files in the server's cache while a stream reads them.
type Hold = Box<dyn std::any::Any + Send + Sync>;

/// A server built without object storage refuses a remote token dataset, naming the feature.
#[cfg(not(feature = "remote"))]
async fn remote_copy(
    _shared: &Arc<Shared>,
    dataset: &str,
    _t: &TokenOptions,
    _mode: Mode,
    _flat: Option<FlatDtype>,
    _progress: Option<&mut OwnedWriteHalf>,
) -> Result<Option<(PathBuf, Hold)>, OpenError> {
    if ringfeed_format::control::names_object_storage(dataset) {
        return Err((
            ErrorCode::Dataset,
            crate::remote_not_built(&format!("dataset {dataset}")),
        ));
    }
    Ok(None)
}

/// 1.7: a remote token dataset (`open.dataset` or a mix member naming `s3://bucket/prefix`):
/// its files fetched into the server's cache and checked (`ringfeed_remote::tokens`), off the
/// tokio workers, with `opening` progress to `progress` (a 1.2+ client) meanwhile; returns the
/// directory that reads as its local copy and the hold that keeps the files there. `None` for a
/// local path.
#[cfg(feature = "remote")]
async fn remote_copy(
    shared: &Arc<Shared>,
    dataset: &str,
    t: &TokenOptions,
    mode: Mode,
    flat: Option<FlatDtype>,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<Option<(PathBuf, Hold)>, OpenError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Instant;

    use ringfeed_format::control::ServerMessage;

    use crate::wire::send;

    let dataset_err = |m: String| (ErrorCode::Dataset, m);
    let Some(url) = ringfeed_remote::RemoteUrl::parse(dataset) else {
        return Ok(None);
    };
    let url = url.map_err(|e| dataset_err(e.to_string()))?;
    if flat.is_some() {
        return Err((
            ErrorCode::BadRequest,
            format!(
                "open.tokens.dtype is a local flat token file's; {url} is a remote ringfeed token dataset: leave dtype out"
            ),
        ));
    }
    if !shared.data_roots.is_empty() {
        return Err(dataset_err(format!(
            "dataset {url}: this server confines datasets to its --data-root directories, so it serves no remote dataset; ask its operator"
        )));
    }
    let hub = Arc::clone(&shared.remote);
    let pack_seq_len = (mode == Mode::Pack).then_some(t.seq_len);
    let fetched = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&fetched);
    let job =
        tokio::task::spawn_blocking(move || ringfeed_remote::RemoteTokens::open(&hub, &url, pack_seq_len, &counter));
    tokio::pin!(job);
    let (mut progress, every, started) = (progress, shared.open_progress, Instant::now());
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let copy = loop {
        tokio::select! {
            r = &mut job => break r,
            _ = tick.tick() => if let Some(w) = progress.as_deref_mut() {
                let msg = ServerMessage::Opening {
                    dataset: dataset.to_owned(),
                    listed: fetched.load(Ordering::Relaxed),
                    elapsed_ms: started.elapsed().as_millis() as u64,
                };
                // The client has gone: the fetch finishes on its own and its hold is dropped.
                send(w, &msg).await.map_err(|e| (ErrorCode::Internal, e.to_string()))?;
            },
        }
    };
    let copy = copy
        .map_err(|e| (ErrorCode::Internal, e.to_string()))?
        .map_err(|e| dataset_err(e.to_string()))?;
    Ok(Some((copy.dir().to_owned(), Box::new(copy))))
}

/// Opens one dataset of a token stream and cuts it into windows, off the tokio workers. `path`
/// is the dataset as the client named it; `local`, where a remote one's copy is ([`remote_copy`]).
async fn open_windows(
    shared: &Arc<Shared>,
    t: &TokenOptions,
    mode: Mode,
    flat: Option<FlatDtype>,
    path: PathBuf,
    local: Option<PathBuf>,
) -> Result<(PathBuf, Windows), OpenError> {
    let bad = |m: String| (ErrorCode::BadRequest, m);
    {
        let canonical = match local {
            Some(dir) => dir,
            None => crate::shared::admit(shared, &path)?,
        };
        let (seq_len, max_docs, pad) = (t.seq_len, t.max_docs.unwrap_or(t.seq_len), t.pad_id);
        let shown = path.clone();
        let windows = tokio::task::spawn_blocking(move || -> Result<Windows, OpenError> {
            ringfeed_format::fault::install().map_err(|e| (ErrorCode::Internal, e.to_string()))?;
            let src = TokenSource::open(&canonical, flat).map_err(|e| (ErrorCode::Dataset, e.to_string()))?;
            let spec = WindowSpec {
                seq_len,
                mode,
                max_docs,
                pad_id: pad.or(src.eos_id()).unwrap_or(0),
            };
            Windows::new(Arc::new(src), spec).map_err(|e| match e {
                WindowsError::Spec(m) => (ErrorCode::BadRequest, format!("{}: {m}", shown.display())),
                WindowsError::Dataset(e) => (ErrorCode::Dataset, e.to_string()),
            })
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
        Ok((path, windows))
    }
}

/// The ring's fields of a token stream: `input_ids` and `labels`, then those `fields` asks for.
fn field_specs(seq_len: u32, max_docs: u32, fields: &[String]) -> Vec<FieldSpec> {
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
    if want("dataset_index") {
        specs.push(FieldSpec {
            name: "dataset_index".into(),
            dtype: DType::I32,
            shape: vec![],
        });
    }
    specs
}

/// What the stream's set-up needs of a token stream: its windows as the source, its fields, and
/// how the kind is finished once the ring is made.
fn prepared(windows: Arc<TokenWindows>, specs: Vec<FieldSpec>, seq_len: u32) -> Prepared {
    let source = Arc::clone(&windows) as Arc<dyn Source>;
    Prepared {
        source,
        specs,
        // Windows do not fail one by one: a token file that cannot be read fails the open.
        skip_errors: false,
        // Token streams order their windows themselves (`TokenWindows::locate`: a mix keeps its
        // schedule, every prefix holding the weights; windows are shuffled by keyed
        // permutations), so the sampler's plan is the identity: no table of windows.
        own_order: true,
        gpu: None,
        order: None,
        reports_order: false,
        // Reading windows costs little: one thread unless the client or the tuner asks for more.
        start_threads: Some(1),
        per_sample: format!("windows of {seq_len} tokens"),
        buckets: None,
        finish: Box::new(move |segment: &Segment| {
            let field = |n: &str| segment.layout().field(n).cloned();
            let kind = Arc::new(TokenKind {
                input_ids: field("input_ids").expect("always present"),
                labels: field("labels").expect("always present"),
                position_ids: field("position_ids"),
                document_ids: field("document_ids"),
                cu_seqlens: field("cu_seqlens"),
                index: field("index"),
                dataset_index: field("dataset_index"),
                windows,
            });
            KindParts {
                // The image members are not used by a token stream (`kind` decides): no views,
                // and `label` holds the labels field so that slot compaction (which never runs
                // for windows: they do not fail) stays total.
                views: Vec::new(),
                label: kind.labels.clone(),
                index: None,
                crop: None,
                gpu: None,
                fields: None,
                bucket_fields: None,
                targets: None,
                pipeline: ringfeed_ops::Transform::Resize { size: (1, 1) }.to_pipeline(),
                layout: ringfeed_ops::Layout::Nhwc,
                kind: SampleKind::Filled(kind),
            }
        }),
    }
}
