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
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::mpsc;

use crate::images::prepare_images;
use crate::pool::{BatchTask, StreamCtx};
use crate::segment::Segment;
use crate::shared::{OpenError, Shared};
use crate::wire::{ConnectionEnd, Reply, fail, read_messages, send, send_with_fd};
use ringfeed_format::control::{ClientMessage, ErrorCode, OpenRequest, PROTOCOL, SampleKindRequest, ServerMessage};
use ringfeed_format::ring::{FieldDesc, RingLayout, SlotHeader};
use ringfeed_order::buckets::{BucketPlan, BucketSampler};
use ringfeed_order::sampler::{EpochPlan, Order, SamplerConfig};

/// A run's batches: the sampler's plan, or (1.10) the aspect-bucket order's.
#[derive(Debug)]
enum RunPlan {
    Samples(EpochPlan),
    Buckets(BucketPlan),
}

impl RunPlan {
    fn batches(&self) -> u64 {
        match self {
            RunPlan::Samples(p) => p.batches(),
            RunPlan::Buckets(p) => p.batches(),
        }
    }

    /// Batch `b`'s dataset indices and (bucketed) its bucket.
    fn batch(&self, b: u64) -> (Vec<u64>, Option<u32>) {
        match self {
            RunPlan::Samples(p) => (p.batch(b).collect(), None),
            RunPlan::Buckets(p) => {
                let x = p.batch(b);
                (x.indices.clone(), Some(x.bucket))
            }
        }
    }

    /// The indices of batches `from..to`, in order.
    fn indices(&self, from: u64, to: u64) -> Box<dyn Iterator<Item = u64> + '_> {
        match self {
            RunPlan::Samples(p) => Box::new((from..to).flat_map(|b| p.batch(b))),
            RunPlan::Buckets(p) => Box::new((from..to).flat_map(|b| p.batch(b).indices.iter().copied())),
        }
    }
}

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
        let opened = match open_stream(&open, &shared, done_tx, pid, minor, progress).await {
            Ok(s) => s,
            Err((code, msg)) => return fail(&mut write, code, msg).await,
        };
        let (mut state, ring_msg) = opened;
        shared.registry.insert(Arc::clone(&state.ctx.stats));
        let sent = send_with_fd(&mut write, &ring_msg, state.ctx.segment.fd()).await.map_err(ConnectionEnd::Write);
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
    plan: RunPlan,
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
    order: Option<Arc<ringfeed_order::blocks::ShardBlocks>>,
    /// 1.10: the aspect-bucket order, which then replaces both.
    buckets: Option<BucketSampler>,
}

/// Validates an `open` of any sample kind, opens its data and creates the ring.
async fn open_stream(
    open: &OpenRequest,
    shared: &Arc<Shared>,
    done: mpsc::UnboundedSender<Arc<BatchTask>>,
    pid: u32,
    minor: u16,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<(StreamState, ServerMessage), OpenError> {
    let bad = |m: String| (ErrorCode::BadRequest, m);
    let path = check_open(open)?;
    let prepared = match open.kind() {
        SampleKindRequest::Images => prepare_images(open, shared, &path, minor, progress).await?,
        SampleKindRequest::Tokens => crate::tokens::prepare(open, shared, progress).await?,
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
    let bucket_sampler = prepared.buckets.as_ref().map(|b| BucketSampler {
        buckets: Arc::clone(&b.of),
        config: sampler,
    });
    let (per_rank, batches) = match &bucket_sampler {
        None => sampler.validate(),
        Some(b) => b.validate(),
    }
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
        // 1.11: with the share the tuner's, so are decoded pixels (off until the CPU is the
        // limit at the share's top); with a pinned share they are on whenever asked for.
        stats.pixels_tuned = auto && g.pixels;
        stats
            .pixels_on
            .store(g.pixels && !auto, std::sync::atomic::Ordering::Relaxed);
    }
    let stats = Arc::new(stats);
    let parts = (prepared.finish)(&segment);
    let ctx = Arc::new(StreamCtx {
        views: parts.views,
        label: parts.label,
        index: parts.index,
        crop: parts.crop,
        gpu: parts.gpu,
        fields: parts.fields,
        buckets: prepared.buckets.clone(),
        bucket_fields: parts.bucket_fields,
        targets: parts.targets,
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
        dataset_id: Some({
            let mut id = ringfeed_format::control::DatasetId::new();
            source.identify(&mut id);
            id.hex()
        }),
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
    state.buckets = bucket_sampler;
    Ok((state, ring_msg))
}

/// The members of an `open` every sample kind has, checked; the dataset's path.
fn check_open(open: &OpenRequest) -> Result<PathBuf, OpenError> {
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
    // 1.3: an `s3://` URL names a remote dataset; anything else is a path.
    if !ringfeed_format::control::names_object_storage(&open.dataset) && !path.is_absolute() {
        return Err(bad(format!("open.dataset {:?} must be an absolute path", open.dataset)));
    }
    Ok(path)
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
            buckets: None,
        }
    }

    /// This rank's plan of the rest of `epoch` from global `position`, in the stream's order
    /// (`ringfeed_order::blocks`; the global shuffle without one).
    /// 1.10: or the aspect-bucket order's, which refuses a position off a batch boundary.
    fn plan(&self, epoch: u64, position: u64) -> Result<RunPlan, String> {
        if let Some(b) = &self.buckets {
            return b
                .plan_from(epoch, position)
                .map(RunPlan::Buckets)
                .map_err(|e| e.to_string());
        }
        Ok(RunPlan::Samples(match &self.order {
            Some(o) if self.sampler.shuffle => self.sampler.plan_order(
                Order::Table(Arc::new(o.permutation(self.sampler.seed, epoch))),
                position,
            ),
            _ => self.sampler.plan_from(epoch, position),
        }))
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
                let plan = match self.plan(epoch, position) {
                    Ok(p) => p,
                    Err(m) => return fail(write, ErrorCode::BadRequest, m).await,
                };
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
        let mut upcoming = run.plan.indices(run.next_submit, run.total).take(ahead);
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
            let (indices, bucket) = run.plan.batch(run.next_submit);
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
                pixels: self.ctx.stats.pixels_on.load(std::sync::atomic::Ordering::Relaxed),
                arena_used: AtomicU64::new(0),
                indices,
                failures: Mutex::new(Vec::new()),
                bucket,
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
    fn begin_run(&mut self, id: u32, epoch: u64, plan: RunPlan, first_batch: u64, confirmed: bool) {
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
                // 1.10: a bucketed batch's image size (ring.md).
                height: task.bucket.map_or(0, |_| task.image_size(0).0),
                width: task.bucket.map_or(0, |_| task.image_size(0).1),
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
        // The next epoch's plan from its start: a position of 0 is always a batch boundary.
        if next <= u64::from(u32::MAX)
            && let Ok(plan) = self.plan(next, 0)
        {
            self.begin_run(self.runs + 1, next, plan, 0, false);
            self.fill(shared);
        }
        Ok(())
    }
}

/// Moves the samples that succeeded to the front of every field, in batch order; returns how many
/// there are. A no-op when nothing failed. The `gpu_bytes` arena is not a per-sample field and
/// stays where it is: the moved `gpu_job` records (and their `gpu_ops`) still point into it
/// (ring.md).
fn compact(ctx: &StreamCtx, task: &BatchTask, failures: &[crate::pool::SampleFailure]) -> u32 {
    let n = task.indices.len() as u32;
    if failures.is_empty() {
        return n;
    }
    let failed: std::collections::BTreeSet<u32> = failures.iter().map(|f| f.pos).collect();
    // 1.10: a bucketed batch's images are packed at its bucket's size, not the field's.
    let images: Vec<FieldDesc> = ctx
        .views
        .iter()
        .enumerate()
        .map(|(k, v)| FieldDesc {
            sample_bytes: task.image_bytes(k),
            ..v.image.clone()
        })
        .collect();
    let fields: Vec<&FieldDesc> = images
        .iter()
        .chain(ctx.views.iter().flat_map(|v| v.erase.as_ref()))
        .chain(
            ctx.bucket_fields
                .iter()
                .flat_map(|b| [&b.crop_top_left, &b.original_size]),
        )
        .chain(
            [
                Some(&ctx.label),
                ctx.index.as_ref(),
                ctx.crop.as_ref(),
                ctx.gpu.as_ref().map(|g| &g.job),
                ctx.gpu.as_ref().and_then(|g| g.ops.as_ref()),
            ]
            .into_iter()
            .flatten(),
        )
        // 1.9: a sample's text and metadata move with it; 1.10: its targets too.
        .chain(ctx.fields.iter().flat_map(|f| f.descs()))
        .chain(ctx.targets.iter().flat_map(|t| t.descs()))
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
