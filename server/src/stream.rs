//! One client connection: handshake, `open`, then the stream's slot state machine
//! (ring.md, "Slot states and ownership"; control.md, "Session").
//!
//! A reader task turns the socket's frames into messages; this task owns all writes to the
//! socket and all slot states, and reacts to client messages and finished batches alike. Batches
//! may finish in any order; `ready` goes out strictly in batch order.
//!
//! Invariants:
//! - A slot is FILLING from submission until its batch comes back from the pool, then HELD from
//!   `ready` until the client's matching `release`, and FREE otherwise. Only FREE slots are
//!   given to new batches.
//! - When the connection ends for any reason, the run is cancelled; the segment is freed when
//!   the last in-flight job drops its reference to it.

use std::collections::BTreeMap;
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

use crate::control::frame::check_length;
use crate::control::{
    ClientMessage, ErrorCode, OpenRequest, PROTOCOL, SampleKindRequest, ServerMessage, TransformRequest, decode_frame,
    encode_frame,
};
use crate::ops::{Layout, Pipeline, Transform};
use crate::pack::input::InputKind;
use crate::pool::{BatchTask, Pool, StreamCtx, ViewFields};
use crate::ring::{DType, FieldDesc, FieldSpec, RingLayout, Segment, SlotHeader};
use crate::sampler::{EpochPlan, Order, SamplerConfig};
use crate::source::files::ServedKind;
use crate::source::lmdb::{LabelSource, LmdbOptions};
use crate::source::{PackedSource, Source};

/// What every connection shares: the pool and the open datasets.
pub struct Shared {
    pub pool: Pool,
    pub limits: crate::codec::Limits,
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
    /// How often a client waiting for a listing gets an `opening` message.
    pub open_progress: std::time::Duration,
    /// Remote datasets: the settings, the shard cache and the stores (`crate::remote`).
    pub remote: Arc<crate::remote::Hub>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub fn new(pool: Pool, limits: crate::codec::Limits, data_roots: Vec<PathBuf>, max_ring_bytes: u64) -> Self {
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
            open_progress: crate::opening::PROGRESS_EVERY,
            remote: Arc::new(crate::remote::Hub::new(crate::remote::RemoteConfig::defaults())),
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
    pub fn snapshot(&self) -> crate::stats::Snapshot {
        let (busy, active) = *self.busy.lock().unwrap_or_else(|p| p.into_inner());
        let streams: Vec<_> = self.registry.list().iter().map(|s| s.snapshot()).collect();
        crate::stats::Snapshot {
            server: crate::stats::ServerSnapshot {
                version: concat!("ringfeed ", env!("CARGO_PKG_VERSION")).into(),
                pid: std::process::id(),
                uptime_s: (self.started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
                cores: self.cores,
                cpu_budget: self.budget(),
                threads: self.pool.threads() as u32,
                active_threads: active.min(self.pool.threads() as u32),
                busy: (busy * 100.0).round() / 100.0,
                remote: self.remote.snapshot(),
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
    fn fetches(&self) -> Option<Arc<dyn crate::tune::Fetches>> {
        let cache = self.remote.opened_cache()?;
        let pinned = cache.pinned();
        (!pinned).then_some(cache as Arc<dyn crate::tune::Fetches>)
    }
}

/// A message for the client, or the reason the connection must end.
type Reply = Result<(), String>;

/// Serves one connection until the client closes it, breaks the protocol, or `shutdown` fires.
pub async fn serve_connection(
    stream: UnixStream,
    shared: Arc<Shared>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let stream_pid = stream.peer_cred().ok().and_then(|c| c.pid()).map(|p| p as u32);
    let (read, mut write) = stream.into_split();
    let (msg_tx, mut msg_rx) = mpsc::channel::<Result<ClientMessage, (ErrorCode, String)>>(64);
    let reader = tokio::spawn(read_messages(read, msg_tx));

    let result: Reply = async {
        // Handshake.
        let hello = match msg_rx.recv().await {
            Some(Ok(m)) => m,
            Some(Err((code, msg))) => return fail(&mut write, code, msg).await,
            None => return Ok(()),
        };
        let ClientMessage::Hello { protocol, .. } = hello else {
            return fail(&mut write, ErrorCode::Protocol, "the first message must be `hello`".into()).await;
        };
        if protocol[0] != PROTOCOL.0 {
            let msg = format!(
                "this client speaks protocol {}.{}, this server {}.{}; install matching versions of the ringfeed Python package and server",
                protocol[0], protocol[1], PROTOCOL.0, PROTOCOL.1
            );
            return fail(&mut write, ErrorCode::Version, msg).await;
        }
        send(&mut write, &ServerMessage::Welcome { protocol: [PROTOCOL.0, PROTOCOL.1], server: Some(concat!("ringfeed ", env!("CARGO_PKG_VERSION")).into()) })
            .await?;

        // Open, or observe.
        let open = match msg_rx.recv().await {
            Some(Ok(ClientMessage::Open(o))) => o,
            Some(Ok(ClientMessage::Snapshot {})) => return observe(&shared, &mut write, &mut msg_rx, &mut shutdown).await,
            Some(Ok(ClientMessage::Close)) | None => return Ok(()),
            Some(Ok(_)) => return fail(&mut write, ErrorCode::Protocol, "expected `open` after `hello`".into()).await,
            Some(Err((code, msg))) => return fail(&mut write, code, msg).await,
        };
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let pid = stream_pid.unwrap_or(0);
        // 1.2: a long open (an image folder being listed) sends `opening` while the client waits.
        let minor = protocol[1].min(PROTOCOL.1);
        let progress = if minor >= 2 { Some(&mut write) } else { None };
        let opened = match open_stream(&open, &shared, done_tx, pid, progress).await {
            Ok(s) => s,
            Err((code, msg)) => return fail(&mut write, code, msg).await,
        };
        let (mut state, ring_msg) = opened;
        shared.registry.insert(Arc::clone(&state.ctx.stats));
        let sent = send_with_fd(&mut write, &ring_msg, state.ctx.segment.fd()).await.map_err(|e| e.to_string());
        let result = match sent {
            Ok(()) => state.run_loop(&shared, &mut write, &mut msg_rx, done_rx, &mut shutdown).await,
            Err(e) => Err(e),
        };
        shared.registry.remove(state.ctx.stats.id);
        // The run was cancelled when the loop ended; its queued jobs go now, not when the pool
        // gets round to them (they would hold the ring until then).
        shared.pool.purge(&state.ctx.stats);
        result
    }
    .await;
    if let Err(e) = result {
        tracing::debug!("connection ended: {e}");
    }
    reader.abort();
}

/// An observer connection: answers every `snapshot` until the client leaves. Observers do not
/// keep an idle server alive.
async fn observe(
    shared: &Arc<Shared>,
    write: &mut OwnedWriteHalf,
    msgs: &mut mpsc::Receiver<Result<ClientMessage, (ErrorCode, String)>>,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
) -> Reply {
    shared.leave();
    let result = async {
        send(write, &ServerMessage::Snapshot(Box::new(shared.snapshot()))).await?;
        loop {
            tokio::select! {
                msg = msgs.recv() => match msg {
                    None | Some(Ok(ClientMessage::Close)) => return Ok(()),
                    Some(Ok(ClientMessage::Snapshot {})) => {
                        send(write, &ServerMessage::Snapshot(Box::new(shared.snapshot()))).await?;
                    }
                    Some(Ok(_)) => {
                        return fail(write, ErrorCode::Protocol, "an observer connection may only send `snapshot` and `close`".into()).await;
                    }
                    Some(Err((code, m))) => return fail(write, code, m).await,
                },
                _ = shutdown.changed() => return Ok(()),
            }
        }
    }
    .await;
    shared.connections.fetch_add(1, Ordering::AcqRel);
    result
}

/// Sends a fatal error and ends the connection.
async fn fail(write: &mut OwnedWriteHalf, code: ErrorCode, message: String) -> Reply {
    let _ = send(write, &ServerMessage::error(code, message.clone(), true)).await;
    Err(message)
}

async fn send(write: &mut OwnedWriteHalf, msg: &ServerMessage) -> Reply {
    write
        .write_all(&encode_frame(msg))
        .await
        .map_err(|e| format!("writing to the client: {e}"))
}

/// Sends `msg` with `fd` attached to its first byte (control.md, "Framing").
async fn send_with_fd(
    write: &mut OwnedWriteHalf,
    msg: &ServerMessage,
    fd: std::os::fd::BorrowedFd<'_>,
) -> std::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    let frame = encode_frame(msg);
    let stream: &UnixStream = write.as_ref();
    let sent = loop {
        stream.writable().await?;
        let attempt = stream.try_io(tokio::io::Interest::WRITABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut ancillary = SendAncillaryBuffer::new(&mut space);
            let fds = [fd];
            ancillary.push(SendAncillaryMessage::ScmRights(&fds));
            sendmsg(stream, &[IoSlice::new(&frame)], &mut ancillary, SendFlags::NOSIGNAL).map_err(std::io::Error::from)
        });
        match attempt {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    write.write_all(&frame[sent..]).await
}

/// Reads frames until EOF or a protocol error, forwarding decoded messages.
async fn read_messages(mut read: OwnedReadHalf, tx: mpsc::Sender<Result<ClientMessage, (ErrorCode, String)>>) {
    loop {
        let mut prefix = [0u8; 4];
        if read.read_exact(&mut prefix).await.is_err() {
            return; // EOF or a broken socket: the client is gone.
        }
        let len = match check_length(prefix) {
            Ok(n) => n,
            Err(e) => {
                let _ = tx.send(Err((ErrorCode::Protocol, e.to_string()))).await;
                return;
            }
        };
        let mut payload = vec![0u8; len];
        if read.read_exact(&mut payload).await.is_err() {
            return;
        }
        let parsed = decode_frame(&payload)
            .map_err(|e| (ErrorCode::Protocol, e.to_string()))
            .and_then(|(kind, value)| {
                serde_json::from_value::<ClientMessage>(value).map_err(|e| {
                    let code = if kind == "open" {
                        ErrorCode::BadRequest
                    } else {
                        ErrorCode::Protocol
                    };
                    (code, format!("invalid `{kind}` message: {e}"))
                })
            });
        let stop = parsed.is_err();
        if tx.send(parsed).await.is_err() || stop {
            return;
        }
    }
}

/// A slot's state, as the server sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Free,
    Filling,
    Held { seq: u64 },
}

/// The run in progress.
#[derive(Debug)]
struct Run {
    /// The protocol's run number (control.md, `start`); for a speculative run, the number it
    /// will have if the client's next `start` confirms it.
    id: u32,
    /// The generation its jobs carry (`StreamCtx::current_run`); unique per stream, never reused,
    /// so a cancelled speculation's jobs can never pass for a later run's.
    generation: u32,
    /// False while the run is speculative: the next epoch, prepared before the client asked for
    /// it. Its batches are decoded but nothing is sent until a `start` confirms it.
    confirmed: bool,
    epoch: u64,
    plan: EpochPlan,
    next_submit: u64,
    next_send: u64,
    total: u64,
    delivered: u64,
    skipped: u64,
    finished: BTreeMap<u64, Arc<BatchTask>>,
}

/// A stream after `open`.
struct StreamState {
    ctx: Arc<StreamCtx>,
    sampler: SamplerConfig,
    slots: Vec<Slot>,
    seq: u64,
    runs: u32,
    /// Run generations handed out (see `Run::generation`).
    gens: u32,
    run: Option<Run>,
    skip_errors: bool,
    /// What each batch in flight keeps at hand (`Source::lease`: a remote dataset's shards), by
    /// (run generation, batch); dropped when the batch comes back.
    leases: BTreeMap<(u32, u64), Box<dyn std::any::Any + Send + Sync>>,
    /// 1.3: the `shard_blocks` order; `None`: the global order (`sampler.plan`).
    order: Option<Arc<crate::order::ShardBlocks>>,
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
    pub gpu: Option<crate::control::message::GpuDecodeRequest>,
    /// 1.3: the shard-aware order (`crate::order`); `None`: the global order.
    pub order: Option<Arc<crate::order::ShardBlocks>>,
    /// Whether the `ring` answer names the order (images; a token stream keeps its own).
    pub reports_order: bool,
    /// Threads to start with when the `open` names none (`None`: the budget, or the pool
    /// without autotune).
    pub start_threads: Option<u32>,
    /// A batch's samples in words, for the ring-size error ("256 samples of 2 images").
    pub per_sample: String,
    /// Builds the kind's members of the stream's context from the ring.
    pub finish: Box<dyn FnOnce(&Segment) -> KindParts + Send>,
}

/// The sample kind's members of a `StreamCtx`.
pub(crate) struct KindParts {
    pub views: Vec<ViewFields>,
    pub label: FieldDesc,
    pub index: Option<FieldDesc>,
    pub crop: Option<FieldDesc>,
    /// 1.3: hybrid decode's ring fields (images only).
    pub gpu: Option<crate::pool::GpuFields>,
    pub pipeline: Pipeline,
    pub layout: Layout,
    pub kind: crate::pool::SampleKind,
}

/// Validates an `open` of any sample kind, opens its data and creates the ring.
async fn open_stream(
    open: &OpenRequest,
    shared: &Arc<Shared>,
    done: mpsc::UnboundedSender<Arc<BatchTask>>,
    pid: u32,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<(StreamState, ServerMessage), OpenError> {
    let bad = |m: String| (ErrorCode::BadRequest, m);
    if !(1..=65536).contains(&open.batch_size) {
        return Err(bad(format!("open.batch_size {} is outside 1..=65536", open.batch_size)));
    }
    if !(1..=64).contains(&open.slots) {
        return Err(bad(format!("open.slots {} is outside 1..=64", open.slots)));
    }
    if let Some(t) = open.threads.filter(|t| !(1..=1024).contains(t)) {
        return Err(bad(format!("open.threads {t} is outside 1..=1024")));
    }
    if let Some(p) = open.prefetch.filter(|p| !(1..=open.slots).contains(p)) {
        return Err(bad(format!(
            "open.prefetch {p} is outside 1..=slots ({}); raise slots or lower prefetch",
            open.slots
        )));
    }
    if let Some(n) = open.local_world_size.filter(|n| !(1..=4096).contains(n)) {
        return Err(bad(format!("open.local_world_size {n} is outside 1..=4096")));
    }
    let kind = open.kind();
    if let Some(m) = open.foreign_members().first() {
        let (what, other) = match kind {
            SampleKindRequest::Images => ("an image stream", "\"sample_kind\": \"tokens\""),
            SampleKindRequest::Tokens => ("a token stream", "an image stream"),
        };
        return Err(bad(format!(
            "open.{m} is not a member of {what} (it belongs to {other})"
        )));
    }
    let path = PathBuf::from(&open.dataset);
    // 1.3: an `s3://` URL names a remote packed dataset (images only); anything else is a path.
    let remote = crate::remote::RemoteUrl::parse(&open.dataset).is_some();
    if !remote && !path.is_absolute() {
        return Err(bad(format!("open.dataset {:?} must be an absolute path", open.dataset)));
    }
    let prepared = match kind {
        SampleKindRequest::Images => prepare_images(open, shared, &path, progress).await?,
        SampleKindRequest::Tokens => crate::tokens::serve::prepare(open, shared).await?,
    };
    let source = prepared.source;
    let sampler = SamplerConfig {
        dataset_len: source.len(),
        batch_size: u64::from(open.batch_size),
        shuffle: open.shuffle && !prepared.own_order,
        seed: open.seed,
        drop_last: open.drop_last,
        rank: u64::from(open.rank),
        world_size: u64::from(open.world_size),
    };
    let (per_rank, batches) = sampler
        .validate()
        .map_err(|e| bad(format!("{}: {e}", path.display())))?;
    let ring = RingLayout::new(&prepared.specs, open.batch_size, open.slots).map_err(|e| bad(e.to_string()))?;
    if ring.header.segment_len > shared.max_ring_bytes {
        return Err(bad(format!(
            "the ring would take {:.2} GiB ({} slots of {} {}), more than the server's limit of {:.2} GiB; lower slots or batch_size, or start the server with a larger --max-ring-bytes",
            ring.header.segment_len as f64 / (1u64 << 30) as f64,
            open.slots,
            open.batch_size,
            prepared.per_sample,
            shared.max_ring_bytes as f64 / (1u64 << 30) as f64
        )));
    }
    let segment = tokio::task::spawn_blocking(move || Segment::create(ring, "ringfeed-ring"))
        .await
        .map_err(|e| (ErrorCode::Internal, e.to_string()))?
        .map_err(|e| bad(e.to_string()))?;
    let pool = shared.pool.threads() as u32;
    let (threads, depth) = if open.autotune != Some(false) {
        // Until the tuner has measured the loop: the kind's start (images: as many threads as
        // the budget allows), within the client's bound.
        let start = prepared.start_threads.unwrap_or(u32::MAX);
        (
            open.threads.unwrap_or(u32::MAX).min(start).min(shared.budget()).max(1),
            open.prefetch.unwrap_or((open.slots - 1).max(1)),
        )
    } else {
        (
            open.threads.or(prepared.start_threads).unwrap_or(pool).min(pool).max(1),
            open.prefetch.unwrap_or(open.slots),
        )
    };
    let mut stats = crate::stats::StreamStats::new(
        shared.registry.next_id(),
        pid,
        source.describe(),
        open.batch_size,
        open.slots,
        open.autotune != Some(false),
        open.threads,
        open.local_world_size,
        threads,
        depth,
    );
    stats.start_threads = prepared.start_threads;
    if let Some(g) = &prepared.gpu {
        let auto = g.share.is_none() && open.autotune != Some(false);
        stats.gpu = Some(if auto {
            crate::stats::GpuMode::Auto
        } else {
            crate::stats::GpuMode::Pinned
        });
        stats.set_share(g.share.unwrap_or(0.0));
    }
    let stats = Arc::new(stats);
    let parts = (prepared.finish)(&segment);
    let ctx = Arc::new(StreamCtx {
        views: parts.views,
        label: parts.label,
        index: parts.index,
        crop: parts.crop,
        gpu: parts.gpu,
        source: Arc::clone(&source),
        segment: Arc::new(segment),
        pipeline: parts.pipeline,
        layout: parts.layout,
        seed: open.seed,
        current_run: AtomicU32::new(0),
        done,
        stats,
        kind: parts.kind,
    });
    let ring_msg = ServerMessage::Ring {
        segment_len: ctx.segment.len(),
        dataset_len: source.len(),
        samples_per_rank: per_rank,
        batches_per_epoch: batches,
        classes: source
            .class_names()
            .iter()
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect(),
        stream: Some(ctx.stats.id),
        order: prepared.reports_order.then(|| {
            if prepared.order.is_some() {
                "shard_blocks"
            } else {
                "global"
            }
            .to_owned()
        }),
    };
    let mut state = StreamState::new(ctx, sampler, open.slots, prepared.skip_errors);
    state.order = prepared.order;
    Ok((state, ring_msg))
}

/// The image kind: the pipeline, the layout, the dataset (`open_source`) and the image fields.
async fn prepare_images(
    open: &OpenRequest,
    shared: &Arc<Shared>,
    path: &Path,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<Prepared, OpenError> {
    let bad = |m: String| (ErrorCode::BadRequest, m);
    let layout = match open.layout() {
        "NHWC" => Layout::Nhwc,
        "NCHW" => Layout::Nchw,
        other => return Err(bad(format!("open.layout {other:?} must be \"NHWC\" or \"NCHW\""))),
    };
    let skip_errors = match open.on_error() {
        "raise" => false,
        "skip" => true,
        other => return Err(bad(format!("open.on_error {other:?} must be \"raise\" or \"skip\""))),
    };
    let pipeline = pipeline_from(open).map_err(bad)?;
    let fields = open.fields.clone().unwrap_or_default();
    for f in &fields {
        if !["image", "label", "index", "crop"].contains(&f.as_str()) && !pipeline.views.iter().any(|v| v.name == *f) {
            return Err(bad(format!(
                "open.fields: unknown field {f:?} (known: the views, label, index, crop)"
            )));
        }
    }
    let source = match crate::remote::RemoteUrl::parse(&open.dataset) {
        Some(url) => open_remote(shared, url, open, progress).await?,
        None => open_source(shared, path, open, progress).await?,
    };
    if let Some(p) = source.listing_problems().first().filter(|_| !skip_errors) {
        return Err((
            ErrorCode::Dataset,
            format!(
                "{}: {}: {}; pass on_error=\"skip\" to serve it without them (what `ringfeed pack --on-error skip` would pack)",
                source.describe(),
                String::from_utf8_lossy(&p.key),
                p.reason
            ),
        ));
    }
    // 1.3: the shard-aware order, when asked for (or chosen automatically for this source).
    let order = crate::order::for_open(open, source.as_ref()).map_err(bad)?;
    let mut specs = Vec::new();
    for v in &pipeline.views {
        let (h, w) = v.size;
        let mut shape = match layout {
            Layout::Nhwc => vec![h, w, 3],
            Layout::Nchw => vec![3, h, w],
        };
        if v.count > 1 {
            shape.insert(0, v.count);
        }
        specs.push(FieldSpec {
            name: v.name.clone().into(),
            dtype: DType::U8,
            shape,
        });
        if !v.erasing.is_empty() {
            let mut shape = vec![v.erasing.len() as u32, 4];
            if v.count > 1 {
                shape.insert(0, v.count);
            }
            specs.push(FieldSpec {
                name: format!("{}_erase", v.name).into(),
                dtype: DType::I32,
                shape,
            });
        }
    }
    specs.push(FieldSpec {
        name: "label".into(),
        dtype: DType::I64,
        shape: vec![],
    });
    if fields.iter().any(|f| f == "index") {
        specs.push(FieldSpec {
            name: "index".into(),
            dtype: DType::I64,
            shape: vec![],
        });
    }
    if fields.iter().any(|f| f == "crop") {
        specs.push(FieldSpec {
            name: "crop".into(),
            dtype: DType::I32,
            shape: vec![5],
        });
    }
    let gpu = match &open.gpu_decode {
        None => None,
        Some(g) => {
            crate::ops::gpu::finishable(&pipeline)
                .map_err(|e| bad(format!("open.gpu_decode: {e}; leave gpu_decode off for this pipeline")))?;
            if let Some(s) = g.share.filter(|s| !(0.0..=1.0).contains(s)) {
                return Err(bad(format!("open.gpu_decode.share {s} is outside 0..=1")));
            }
            let (h, w) = pipeline.views[0].size;
            let per = g
                .bytes_per_sample
                .unwrap_or((3 * u64::from(h) * u64::from(w)).max(65536));
            if !(4096..=64 << 20).contains(&per) {
                return Err(bad(format!(
                    "open.gpu_decode.bytes_per_sample {per} is outside 4096..=67108864"
                )));
            }
            if per * u64::from(open.batch_size) > i32::MAX as u64 {
                return Err(bad(format!(
                    "open.gpu_decode: {} bytes of encoded samples per batch ({per} per sample) do not fit the ring's 31-bit offsets; lower bytes_per_sample or batch_size",
                    per * u64::from(open.batch_size)
                )));
            }
            specs.push(FieldSpec {
                name: "gpu_job".into(),
                dtype: DType::I32,
                shape: vec![crate::ops::gpu::RECORD_LEN as u32],
            });
            specs.push(FieldSpec {
                name: "gpu_bytes".into(),
                dtype: DType::U8,
                shape: vec![per as u32],
            });
            Some(g.clone())
        }
    };
    let per_sample = format!("samples of {} images", pipeline.outputs());
    Ok(Prepared {
        source,
        specs,
        skip_errors,
        own_order: false,
        gpu,
        order,
        reports_order: true,
        start_threads: None,
        per_sample,
        finish: Box::new(move |segment: &Segment| {
            let field = |n: &str| segment.layout().field(n).cloned();
            let views = pipeline
                .views
                .iter()
                .map(|v| ViewFields {
                    image: field(&v.name).expect("every view has its field"),
                    erase: field(&format!("{}_erase", v.name)),
                })
                .collect();
            KindParts {
                views,
                label: field("label").expect("the label field is always present"),
                index: field("index"),
                crop: field("crop"),
                gpu: field("gpu_job")
                    .zip(field("gpu_bytes"))
                    .map(|(job, bytes)| crate::pool::GpuFields { job, bytes }),
                pipeline,
                layout,
                kind: crate::pool::SampleKind::Image,
            }
        }),
    })
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

impl StreamState {
    /// A stream that has opened its ring and not started a run.
    fn new(ctx: Arc<StreamCtx>, sampler: SamplerConfig, slots: u32, skip_errors: bool) -> Self {
        StreamState {
            slots: vec![Slot::Free; slots as usize],
            ctx,
            sampler,
            seq: 0,
            runs: 0,
            gens: 0,
            run: None,
            skip_errors,
            leases: BTreeMap::new(),
            order: None,
        }
    }

    /// This rank's plan of the rest of `epoch` from global `position`, in the stream's order
    /// (`crate::order`; the global shuffle without one).
    fn plan(&self, epoch: u64, position: u64) -> EpochPlan {
        match &self.order {
            Some(o) if self.sampler.shuffle => self.sampler.plan_order(
                Order::Table(Arc::new(o.permutation(self.sampler.seed, epoch))),
                position,
            ),
            _ => self.sampler.plan_from(epoch, position),
        }
    }
}

/// The stream's pipeline: the 1.2 `pipeline` member, or the 1.1 `transform` as the pipeline it
/// means (validated by `ops::Transform::validate`, which holds the bounds of control.md,
/// "Transforms").
fn pipeline_from(open: &OpenRequest) -> Result<Pipeline, String> {
    match (&open.pipeline, &open.transform) {
        (Some(_), Some(_)) => Err("open: give either pipeline (1.2) or transform (1.1), not both".to_owned()),
        (Some(p), None) => Pipeline::parse(p),
        (None, Some(t)) => {
            let transform = match *t {
                TransformRequest::RandomResizedCrop {
                    size,
                    scale,
                    ratio,
                    flip,
                } => Transform::RandomResizedCrop {
                    size: (size[0], size[1]),
                    scale: (scale[0], scale[1]),
                    ratio: (ratio[0], ratio[1]),
                    flip,
                },
                TransformRequest::CenterCrop { size, resize } => Transform::CenterCrop {
                    size: (size[0], size[1]),
                    resize,
                },
                TransformRequest::Resize { size } => Transform::Resize {
                    size: (size[0], size[1]),
                },
            };
            transform.validate()?;
            Ok(transform.to_pipeline())
        }
        (None, None) => Err("open: a pipeline (1.2) or a transform (1.1) is required".to_owned()),
    }
}

/// Opens (or reuses) the dataset at `path`: a packed dataset, an LMDB, an image folder or a
/// manifest (`ServedKind::detect`). Folders and manifests are listed by `crate::opening`; while
/// that runs, `progress` (a 1.2 client's socket) gets an `opening` message every second.
async fn open_source(
    shared: &Arc<Shared>,
    path: &Path,
    open: &OpenRequest,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<Arc<dyn Source>, (ErrorCode, String)> {
    let dataset_err = |m: String| (ErrorCode::Dataset, m);
    if !path.exists() && crate::source::wds::pattern::is_pattern(&open.dataset) {
        // 1.3: a brace/glob pattern of WebDataset tars names no single path.
        return open_webdataset(shared, open, progress).await;
    }
    let canonical = admit(shared, path)?;
    let kind = ServedKind::detect(&canonical).map_err(dataset_err)?;
    let key = match kind {
        ServedKind::Packed | ServedKind::Lmdb => {
            format!(
                "{}|{}|{:?}|{}",
                canonical.display(),
                open.check_crc(),
                open.lmdb(),
                kind.name()
            )
        }
        // Listed files: no CRC, no LMDB options.
        ServedKind::Folder | ServedKind::Manifest => format!("{}|{}", canonical.display(), kind.name()),
        ServedKind::WebDataset => return open_webdataset(shared, open, progress).await,
    };
    if let Some(s) = shared.cached_source(&key) {
        return Ok(s);
    }
    let opened = match kind {
        ServedKind::Folder | ServedKind::Manifest => {
            let input = if kind == ServedKind::Folder {
                InputKind::Folder
            } else {
                InputKind::Manifest
            };
            let publisher = Arc::clone(shared);
            let cache_key = key.clone();
            let waiter = shared.openings.join(&key, canonical, input, move |s| {
                publisher.cache_source(cache_key, s);
            });
            return wait_for_listing(shared, waiter, open, progress).await;
        }
        ServedKind::WebDataset => unreachable!("opened above"),
        ServedKind::Packed | ServedKind::Lmdb => {
            let lmdb = &open.lmdb();
            let lmdb_opts = LmdbOptions {
                layout: match &lmdb.layout {
                    Some(l) => l
                        .parse()
                        .map_err(|e| (ErrorCode::BadRequest, format!("open.lmdb.layout: {e}")))?,
                    None => Default::default(),
                },
                labels: match (&lmdb.labels, &lmdb.labels_key) {
                    (Some(f), _) => LabelSource::File(PathBuf::from(f)),
                    (None, Some(k)) => LabelSource::Key(k.as_bytes().to_vec()),
                    (None, None) => LabelSource::None,
                },
            };
            let check_crc = open.check_crc();
            tokio::task::spawn_blocking(move || -> Result<Arc<dyn Source>, String> {
                if kind == ServedKind::Lmdb {
                    crate::source::lmdb::LmdbSource::open(&canonical, &lmdb_opts)
                        .map(|s| Arc::new(s) as Arc<dyn Source>)
                        .map_err(|e| e.to_string())
                } else {
                    PackedSource::open(&canonical, check_crc)
                        .map(|s| Arc::new(s) as Arc<dyn Source>)
                        .map_err(|e| e.to_string())
                }
            })
            .await
            .map_err(|e| (ErrorCode::Internal, e.to_string()))?
            .map_err(dataset_err)?
        }
    };
    shared.cache_source(key, &opened);
    Ok(opened)
}

/// Opens (or reuses) the remote dataset at `url` (1.3, `crate::remote`): a packed dataset, its
/// index fetched on a blocking thread, or WebDataset tars (a pattern, a `.tar` key, a prefix of
/// tars without `index.rfi`, or any URL opened with `webdataset` options), indexed as a
/// listing; their shards come through the server's cache.
async fn open_remote(
    shared: &Arc<Shared>,
    url: Result<crate::remote::RemoteUrl, crate::remote::RemoteError>,
    open: &OpenRequest,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<Arc<dyn Source>, (ErrorCode, String)> {
    let dataset_err = |m: String| (ErrorCode::Dataset, m);
    let url = url.map_err(|e| dataset_err(e.to_string()))?;
    if !shared.data_roots.is_empty() {
        return Err(dataset_err(format!(
            "dataset {url}: this server confines datasets to its --data-root directories, so it serves no remote dataset; ask its operator"
        )));
    }
    if crate::remote::wds::names_tars(&url) || open.webdataset.is_some() {
        return open_remote_webdataset(shared, url, open, progress).await;
    }
    let key = format!("{url}|{}|remote", open.check_crc());
    if let Some(s) = shared.cached_source(&key) {
        return Ok(s);
    }
    let hub = Arc::clone(&shared.remote);
    let check_crc = open.check_crc();
    let for_open = url.clone();
    let opened = tokio::task::spawn_blocking(move || {
        match crate::remote::RemoteSource::open(&hub, &for_open, check_crc) {
            Ok(s) => Ok(Some(Arc::new(s) as Arc<dyn Source>)),
            // No packed dataset: the prefix may hold tars.
            Err(crate::remote::source::OpenError::NoIndex(_)) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
    .map_err(|e| (ErrorCode::Internal, e.to_string()))?
    .map_err(dataset_err)?;
    let Some(opened) = opened else {
        return open_remote_webdataset(shared, url, open, progress).await;
    };
    shared.cache_source(key, &opened);
    Ok(opened)
}

/// 1.3: opens (or reuses) WebDataset tars on object storage (`crate::remote::wds`), indexed
/// like a local WebDataset's tars, with `opening` progress (members indexed).
async fn open_remote_webdataset(
    shared: &Arc<Shared>,
    url: crate::remote::RemoteUrl,
    open: &OpenRequest,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<Arc<dyn Source>, (ErrorCode, String)> {
    use crate::source::wds::WdsOptions;
    let opts = WdsOptions::from_request(&open.webdataset.clone().unwrap_or_default())
        .map_err(|m| (ErrorCode::BadRequest, m))?;
    let key = format!("webdataset|{opts:?}|{url}|remote");
    if let Some(s) = shared.cached_source(&key) {
        return Ok(s);
    }
    let hub = Arc::clone(&shared.remote);
    let threads = (hub.config.concurrency * 2).clamp(1, 16);
    let index = move |cancel: &std::sync::atomic::AtomicBool,
                      listed: &std::sync::atomic::AtomicU64,
                      started: std::time::Instant| {
        crate::remote::RemoteWdsSource::open(&hub, &url, &opts, threads, cancel, listed)
            .map(|s| {
                tracing::info!(
                    "indexed {url} in {:.1} s: {} tars ({} from cached index files, {} from the store's, {} downloaded and scanned), {} samples",
                    started.elapsed().as_secs_f64(),
                    s.tar_count(),
                    s.from_cache,
                    s.from_store,
                    s.scanned,
                    s.len()
                );
                Arc::new(s) as Arc<dyn Source>
            })
            .map_err(|e| e.to_string())
    };
    join_listing(shared, key, index, open, progress).await
}

/// Joins the indexing of the tars under `key` (or starts it with `index`), publishes the source
/// to the open sources once it is done, and waits for it with `opening` progress.
async fn join_listing(
    shared: &Arc<Shared>,
    key: String,
    index: impl FnOnce(
        &std::sync::atomic::AtomicBool,
        &std::sync::atomic::AtomicU64,
        std::time::Instant,
    ) -> Result<Arc<dyn Source>, String>
    + Send
    + 'static,
    open: &OpenRequest,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<Arc<dyn Source>, (ErrorCode, String)> {
    let publisher = Arc::clone(shared);
    let cache_key = key.clone();
    let waiter = shared
        .openings
        .join_with(&key, index, move |s| publisher.cache_source(cache_key, s));
    wait_for_listing(shared, waiter, open, progress).await
}

/// Waits for a listing the stream joined, sending `opening` to `progress` (a 1.2 client) every
/// `shared.open_progress` meanwhile.
async fn wait_for_listing(
    shared: &Arc<Shared>,
    waiter: crate::opening::Waiter<'_>,
    open: &OpenRequest,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<Arc<dyn Source>, (ErrorCode, String)> {
    let opening = Arc::clone(&waiter.opening);
    let result = opening.result();
    tokio::pin!(result);
    let mut progress = progress;
    let every = shared.open_progress;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let opened = loop {
        tokio::select! {
            r = &mut result => break r,
            _ = tick.tick() => if let Some(w) = progress.as_deref_mut() {
                let msg = ServerMessage::Opening {
                    dataset: open.dataset.clone(),
                    listed: opening.listed(),
                    elapsed_ms: opening.elapsed().as_millis() as u64,
                };
                // The client has gone: stop waiting (the last waiter cancels the listing).
                send(w, &msg).await.map_err(|e| (ErrorCode::Internal, e))?;
            },
        }
    };
    drop(waiter);
    opened.map_err(|m| (ErrorCode::Dataset, m))
}

/// 1.3: opens (or reuses) the WebDataset tars `open.dataset` names (a directory, a `.tar`, a
/// pattern), each inside `--data-root`; indexing them runs like a folder's listing, with
/// `opening` progress (members indexed).
async fn open_webdataset(
    shared: &Arc<Shared>,
    open: &OpenRequest,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<Arc<dyn Source>, (ErrorCode, String)> {
    use crate::source::wds::{WdsOptions, WdsSource, pattern};
    let opts = WdsOptions::from_request(&open.webdataset.clone().unwrap_or_default())
        .map_err(|m| (ErrorCode::BadRequest, m))?;
    let tars = pattern::tars(&open.dataset).map_err(|m| (ErrorCode::Dataset, m))?;
    let mut canonical = Vec::with_capacity(tars.len());
    for t in &tars {
        canonical.push(admit(shared, t)?);
    }
    let mut key = format!("webdataset|{opts:?}");
    for c in &canonical {
        key.push('|');
        key.push_str(&c.to_string_lossy());
    }
    if let Some(s) = shared.cached_source(&key) {
        return Ok(s);
    }
    let name = open.dataset.clone();
    let threads = shared.cores.clamp(1, 16) as usize;
    let index = move |cancel: &std::sync::atomic::AtomicBool,
                      listed: &std::sync::atomic::AtomicU64,
                      started: std::time::Instant| {
        WdsSource::open(&name, &canonical, &opts, threads, cancel, listed)
            .map(|s| {
                tracing::info!(
                    "indexed {} in {:.1} s: {} tars ({} from index files, {} scanned), {} samples",
                    name,
                    started.elapsed().as_secs_f64(),
                    s.tar_count(),
                    s.indexes_read,
                    s.scanned,
                    s.len()
                );
                Arc::new(s) as Arc<dyn Source>
            })
            .map_err(|e| e.to_string())
    };
    join_listing(shared, key, index, open, progress).await
}

impl Shared {
    /// The open source a stream holds under `key`, if any (see [`Shared::cache_source`]).
    fn cached_source(&self, key: &str) -> Option<Arc<dyn Source>> {
        let sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        sources.get(key).and_then(|w| w.upgrade())
    }

    /// Remembers an open source, so later streams over the same dataset share it.
    fn cache_source(&self, key: String, source: &Arc<dyn Source>) {
        let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        // Entries of datasets no stream holds any more go, so the map stays as small as the open
        // set (clients choose the keys).
        sources.retain(|_, w| w.strong_count() > 0);
        sources.insert(key, Arc::downgrade(source));
    }
}

impl StreamState {
    async fn run_loop(
        &mut self,
        shared: &Arc<Shared>,
        write: &mut OwnedWriteHalf,
        msgs: &mut mpsc::Receiver<Result<ClientMessage, (ErrorCode, String)>>,
        mut done: mpsc::UnboundedReceiver<Arc<BatchTask>>,
        shutdown: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Reply {
        let result = loop {
            tokio::select! {
                msg = msgs.recv() => match msg {
                    None | Some(Ok(ClientMessage::Close)) => break Ok(()),
                    Some(Err((code, m))) => break fail(write, code, m).await,
                    Some(Ok(m)) => {
                        if let Err(e) = self.on_message(m, shared, write).await {
                            break Err(e);
                        }
                    }
                },
                Some(task) = done.recv() => {
                    if let Err(e) = self.on_finished(task, shared, write).await {
                        break Err(e);
                    }
                }
                () = self.ctx.stats.wake.notified() => self.fill(shared),
                _ = shutdown.changed() => {
                    break fail(write, ErrorCode::Shutdown, "the ringfeed server is shutting down (SIGTERM or SIGINT); a Loader with reconnect=N resumes on its successor".into()).await;
                }
            }
        };
        // Cancel whatever is in flight; jobs skip their work and drop their references.
        self.ctx.current_run.store(0, Ordering::Release);
        result
    }

    async fn on_message(&mut self, m: ClientMessage, shared: &Arc<Shared>, write: &mut OwnedWriteHalf) -> Reply {
        match m {
            ClientMessage::Start {
                epoch,
                first_batch,
                position,
            } => {
                if epoch > u64::from(u32::MAX) {
                    return fail(
                        write,
                        ErrorCode::BadRequest,
                        format!("start.epoch {epoch} is above 2^32-1"),
                    )
                    .await;
                }
                let position = position.unwrap_or(0);
                if position > self.sampler.dataset_len {
                    return fail(
                        write,
                        ErrorCode::BadRequest,
                        format!(
                            "start.position {position} is past the {} samples of an epoch",
                            self.sampler.dataset_len
                        ),
                    )
                    .await;
                }
                let plan = self.plan(epoch, position);
                let total = plan.batches();
                if first_batch > total {
                    return fail(
                        write,
                        ErrorCode::BadRequest,
                        format!("start.first_batch {first_batch} is past the {total} batches of an epoch"),
                    )
                    .await;
                }
                let speculated = self
                    .run
                    .as_ref()
                    .is_some_and(|r| !r.confirmed && r.epoch == epoch && r.next_send == first_batch && position == 0);
                if speculated {
                    // The epoch this stream prepared ahead is the one asked for: confirm it and
                    // send what is ready.
                    self.runs += 1;
                    let run = self.run.as_mut().expect("checked above");
                    debug_assert_eq!(run.id, self.runs);
                    run.id = self.runs;
                    run.confirmed = true;
                } else {
                    self.cancel_run();
                    self.runs += 1;
                    self.begin_run(self.runs, epoch, plan, first_batch, true);
                }
                self.ctx.stats.started(std::time::Instant::now());
                self.ctx.stats.run.store(self.runs, Ordering::Relaxed);
                self.ctx.stats.epoch.store(epoch, Ordering::Relaxed);
                self.fill(shared);
                self.send_ready(write).await?;
                self.fill(shared);
                self.maybe_end(shared, write).await
            }
            ClientMessage::Release { slot, seq } => {
                match self.slots.get(slot as usize) {
                    Some(Slot::Held { seq: held }) if *held == seq => {}
                    _ => {
                        return fail(
                            write,
                            ErrorCode::Protocol,
                            format!("release of slot {slot} seq {seq}, which the client does not hold"),
                        )
                        .await;
                    }
                }
                self.slots[slot as usize] = Slot::Free;
                self.fill(shared);
                Ok(())
            }
            ClientMessage::Stats {
                steps,
                wait_ns,
                compute_ns,
                gpu_wait_ns,
                gpu_samples,
                gpu_decode_ns,
                gpu_fallbacks,
                gpu_decode_wait_ns,
            } => {
                let stats = &self.ctx.stats;
                stats.add_client_stats(steps, wait_ns, compute_ns, gpu_wait_ns, gpu_decode_wait_ns);
                if let Some(n) = gpu_samples {
                    stats.add_client_gpu_stats(n, gpu_decode_ns.unwrap_or(0), gpu_fallbacks.unwrap_or(0));
                }
                Ok(())
            }
            ClientMessage::Snapshot {} => {
                fail(
                    write,
                    ErrorCode::Protocol,
                    "`snapshot` is for observer connections (send it instead of `open`)".into(),
                )
                .await
            }
            ClientMessage::Hello { .. } | ClientMessage::Open(_) => {
                fail(
                    write,
                    ErrorCode::Protocol,
                    "`hello` and `open` are only valid once, at the start".into(),
                )
                .await
            }
            ClientMessage::Close => Ok(()),
        }
    }

    /// Publishes the slot counts to the stream's stats.
    fn publish(&self) {
        let stats = &self.ctx.stats;
        let ready = self.run.as_ref().map_or(0, |r| r.finished.len()) as u32;
        let filling = self.slots.iter().filter(|s| **s == Slot::Filling).count() as u32;
        let held = self.slots.iter().filter(|s| matches!(s, Slot::Held { .. })).count() as u32;
        stats.filling.store(filling.saturating_sub(ready), Ordering::Relaxed);
        stats.ready.store(ready, Ordering::Relaxed);
        stats.held.store(held, Ordering::Relaxed);
    }

    /// Gives FREE slots to the next batches of the run, up to the stream's depth (batches in
    /// flight: FILLING, and finished but not yet announced).
    fn fill(&mut self, shared: &Arc<Shared>) {
        self.fill_slots(shared);
        self.publish();
        self.read_ahead();
    }

    /// Tells the source what the run reads next, from the next batch to submit on (a remote
    /// source fetches ahead of it).
    fn read_ahead(&self) {
        let ahead = self.ctx.source.read_ahead();
        let Some(run) = self.run.as_ref().filter(|_| ahead > 0) else {
            return;
        };
        let mut upcoming = (run.next_submit..run.total).flat_map(|b| run.plan.batch(b)).take(ahead);
        self.ctx.source.will_read(&mut upcoming);
    }

    fn fill_slots(&mut self, shared: &Arc<Shared>) {
        let depth = self.ctx.stats.depth.load(Ordering::Relaxed).max(1) as usize;
        let Some(run) = self.run.as_mut() else { return };
        while run.next_submit < run.total {
            let in_flight = self.slots.iter().filter(|s| **s == Slot::Filling).count();
            if in_flight >= depth {
                return;
            }
            let Some(slot) = self.slots.iter().position(|s| *s == Slot::Free) else {
                return;
            };
            self.slots[slot] = Slot::Filling;
            let indices: Vec<u64> = run.plan.batch(run.next_submit).collect();
            if let Some(lease) = self.ctx.source.lease(&indices) {
                self.leases.insert((run.generation, run.next_submit), lease);
            }
            let task = Arc::new(BatchTask {
                stream: Arc::clone(&self.ctx),
                run: run.generation,
                epoch: run.epoch,
                batch: run.next_submit,
                slot: slot as u32,
                remaining: AtomicUsize::new(indices.len()),
                gpu_share: self.ctx.stats.share(),
                arena_used: AtomicU64::new(0),
                indices,
                failures: Mutex::new(Vec::new()),
            });
            run.next_submit += 1;
            shared.pool.submit(task);
        }
    }

    async fn on_finished(&mut self, task: Arc<BatchTask>, shared: &Arc<Shared>, write: &mut OwnedWriteHalf) -> Reply {
        self.leases.remove(&(task.run, task.batch));
        let Some(run) = self.run.as_mut().filter(|r| r.generation == task.run) else {
            // A batch of a cancelled run: its slot is free again.
            self.slots[task.slot as usize] = Slot::Free;
            self.fill(shared);
            return Ok(());
        };
        run.finished.insert(task.batch, task);
        self.send_ready(write).await?;
        self.fill(shared);
        self.maybe_end(shared, write).await
    }

    /// Starts run `id` (generation: a new one) of `epoch` at `first_batch`.
    fn begin_run(&mut self, id: u32, epoch: u64, plan: EpochPlan, first_batch: u64, confirmed: bool) {
        self.gens += 1;
        let generation = self.gens;
        // SYNC POINT: Release pairs with the workers' Acquire load; jobs of older runs that start
        // after this store skip their work.
        self.ctx.current_run.store(generation, Ordering::Release);
        let total = plan.batches();
        self.run = Some(Run {
            id,
            generation,
            confirmed,
            epoch,
            plan,
            next_submit: first_batch,
            next_send: first_batch,
            total,
            delivered: 0,
            skipped: 0,
            finished: BTreeMap::new(),
        });
    }

    /// Sends every finished batch that is next in order (nothing while the run is speculative).
    async fn send_ready(&mut self, write: &mut OwnedWriteHalf) -> Reply {
        if !self.run.as_ref().is_some_and(|r| r.confirmed) {
            return Ok(());
        }
        loop {
            let task = {
                let run = self.run.as_mut().expect("the run is current");
                match run.finished.remove(&run.next_send) {
                    Some(t) => {
                        run.next_send += 1;
                        t
                    }
                    None => break,
                }
            };
            let slot = task.slot;
            let mut failures = std::mem::take(&mut *task.failures.lock().unwrap_or_else(|p| p.into_inner()));
            if !failures.is_empty() && !self.skip_errors {
                failures.sort_by_key(|f| f.pos);
                let f = &failures[0];
                let msg = ServerMessage::Error {
                    code: ErrorCode::Sample,
                    message: format!(
                        "sample {} (key {:?}) of {} cannot be delivered: {}; pass on_error=\"skip\" to leave such samples out",
                        f.index,
                        f.key,
                        self.ctx.source.describe(),
                        f.message
                    ),
                    fatal: false,
                    sample: Some(f.index),
                    key: Some(f.key.clone()),
                    run: Some(self.run.as_ref().map_or(0, |r| r.id)),
                };
                // The run is over: cancel its other jobs and free the slots it no longer needs;
                // batches still in flight free theirs when they come back.
                self.cancel_run();
                self.slots[slot as usize] = Slot::Free;
                self.publish();
                return send(write, &msg).await;
            }
            let count = compact(&self.ctx, &task, &failures);
            let run = self.run.as_mut().expect("the run is current");
            run.skipped += failures.len() as u64;
            let stats = &self.ctx.stats;
            stats.skipped.fetch_add(failures.len() as u64, Ordering::Relaxed);
            if count > 0 {
                stats.samples.fetch_add(u64::from(count), Ordering::Relaxed);
                stats.batches.fetch_add(1, Ordering::Relaxed);
            }
            // A batch whose every sample was skipped is still announced, with count 0, so the
            // client's batch numbering (and its resume point) stays that of the epoch.
            self.seq += 1;
            let header = SlotHeader {
                seq: self.seq,
                run: run.id,
                epoch: run.epoch as u32,
                batch: task.batch,
                count,
                skipped: failures.len() as u32,
            };
            // SAFETY: the slot is FILLING and every job of its batch has finished (the task came
            // back through the pool's completion path), so this thread owns it.
            unsafe { self.ctx.segment.write_slot_header(slot, &header) };
            self.slots[slot as usize] = Slot::Held { seq: self.seq };
            run.delivered += 1;
            let ready = ServerMessage::Ready {
                run: run.id,
                seq: self.seq,
                slot,
            };
            send(write, &ready).await?;
        }
        Ok(())
    }

    /// Ends the current run: its jobs stop working, and the slots of its finished but unsent
    /// batches are free again.
    fn cancel_run(&mut self) {
        // SYNC POINT: Release pairs with the workers' Acquire load of `current_run`.
        self.ctx.current_run.store(0, Ordering::Release);
        if let Some(old) = self.run.take() {
            for t in old.finished.values() {
                self.slots[t.slot as usize] = Slot::Free;
            }
        }
    }

    /// Sends `end` once every batch of the run has been sent, then prepares the next epoch
    /// speculatively: a training loop almost always asks for it next, and its first batches are
    /// then ready at once instead of stalling the loop at every epoch boundary. A `start` of
    /// anything else cancels the speculation; its cost is at most `depth` batches of decoding.
    async fn maybe_end(&mut self, shared: &Arc<Shared>, write: &mut OwnedWriteHalf) -> Reply {
        let Some(run) = &self.run else { return Ok(()) };
        if !run.confirmed || run.next_send < run.total {
            return Ok(());
        }
        let msg = ServerMessage::End {
            run: run.id,
            epoch: run.epoch,
            batches: run.delivered,
            skipped: run.skipped,
        };
        let next = run.epoch + 1;
        self.run = None;
        send(write, &msg).await?;
        if next <= u64::from(u32::MAX) {
            let plan = self.plan(next, 0);
            self.begin_run(self.runs + 1, next, plan, 0, false);
            self.fill(shared);
        }
        Ok(())
    }
}

/// Moves the samples that succeeded to the front of every field, in batch order; returns how many
/// there are. A no-op when nothing failed. The `gpu_bytes` arena is not a per-sample field and
/// stays where it is: the moved `gpu_job` records still point into it (ring.md).
fn compact(ctx: &StreamCtx, task: &BatchTask, failures: &[crate::pool::SampleFailure]) -> u32 {
    let n = task.indices.len() as u32;
    if failures.is_empty() {
        return n;
    }
    let failed: std::collections::BTreeSet<u32> = failures.iter().map(|f| f.pos).collect();
    let fields: Vec<&FieldDesc> = ctx
        .views
        .iter()
        .flat_map(|v| std::iter::once(&v.image).chain(v.erase.as_ref()))
        .chain(
            [
                Some(&ctx.label),
                ctx.index.as_ref(),
                ctx.crop.as_ref(),
                ctx.gpu.as_ref().map(|g| &g.job),
            ]
            .into_iter()
            .flatten(),
        )
        .collect();
    let mut to = 0u32;
    for from in 0..n {
        if failed.contains(&from) {
            continue;
        }
        if from != to {
            for f in &fields {
                let src = ctx
                    .segment
                    .slot_ptr(task.slot, f.offset + u64::from(from) * f.sample_bytes, f.sample_bytes);
                let dst = ctx
                    .segment
                    .slot_ptr(task.slot, f.offset + u64::from(to) * f.sample_bytes, f.sample_bytes);
                // SAFETY: both ranges are inside the slot (slot_ptr checks), the slot is owned by
                // this thread (all jobs done, not yet sent), and `ptr::copy` allows overlap.
                unsafe { std::ptr::copy(src, dst, f.sample_bytes as usize) };
            }
        }
        to += 1;
    }
    to
}
