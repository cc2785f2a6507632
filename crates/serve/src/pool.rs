//! The decode pool: worker threads shared by every stream of the server.
//!
//! A stream submits one [`Job`] per sample of a batch; the job decodes and transforms the sample
//! straight into its place in the batch's FILLING slot. The last job of a batch to finish hands
//! the batch back to its stream, which sends `ready` in order.
//!
//! Scheduling: each stream has its own FIFO of jobs and an allotment of threads
//! ([`StreamStats::threads`], set by the tuner). A free worker takes the next job of the stream
//! that is closest to starving (fewest batches announced to its client and not yet released)
//! among the streams running fewer jobs than their allotment; ties go round-robin. So a stream
//! never occupies more threads than it was given, one client's backlog cannot starve another's,
//! and workers beyond the allotments sleep.
//!
//! Invariants:
//! - Each job writes only its own sample's bytes in each field of its batch's slot, so jobs of
//!   one batch never write the same byte, and no job writes a slot that is not FILLING.
//! - `BatchTask::remaining` counts unfinished jobs. Each job's writes happen before its
//!   decrement (Release); the thread that takes the count to zero (AcqRel) therefore sees every
//!   write of the batch before it hands the batch to the stream.
//! - A job whose run was cancelled (the stream's `current_run` moved on) skips the work but still
//!   counts down, so every batch comes back exactly once.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use ringfeed_decode::Limits;
use ringfeed_format::ring::{FieldDesc, gpu_ops};
use ringfeed_ops::{Layout, Pipeline, Processor, Sink, Targets, Trace};
use ringfeed_order::rng::SampleRng;

use crate::segment::Segment;
use crate::stats::{STAGES, Stage, StreamStats};
use ringfeed_source::Source;

/// Everything a job needs to know about its stream. Shared by the stream and its jobs.
pub struct StreamCtx {
    pub source: Arc<dyn Source>,
    pub segment: Arc<Segment>,
    pub pipeline: Pipeline,
    pub layout: Layout,
    pub seed: u64,
    /// Each view's fields, in the pipeline's order.
    pub views: Vec<ViewFields>,
    pub label: FieldDesc,
    pub index: Option<FieldDesc>,
    pub crop: Option<FieldDesc>,
    /// 1.3, hybrid decode: the `gpu_job` records and the `gpu_bytes` arena (ring.md).
    pub gpu: Option<GpuFields>,
    /// 1.9: the sample fields (text, tokens, metadata), read with each sample's image.
    pub fields: Option<Arc<crate::fields::SampleFields>>,
    /// 1.10: the samples' aspect buckets and their conditioning fields; each batch is then one
    /// bucket (`BatchTask::bucket`).
    pub buckets: Option<Arc<crate::buckets::Buckets>>,
    pub bucket_fields: Option<BucketFields>,
    /// 1.10: the detection and segmentation targets, read with each sample's image and moved
    /// with it by the ops.
    pub targets: Option<Arc<crate::targets::StreamTargets>>,
    /// The run whose jobs should do their work; jobs of any other run are skipped.
    pub current_run: AtomicU32,
    /// Where finished batches go.
    pub done: tokio::sync::mpsc::UnboundedSender<Arc<BatchTask>>,
    /// Counters and knobs (threads allotted, depth).
    pub stats: Arc<StreamStats>,
    /// What a job of this stream makes: an image (the members above), or a token window.
    pub kind: SampleKind,
}

/// The kinds of sample a stream delivers. A job calls its kind's fill; everything else (sampler,
/// ring, run loop) is shared.
#[derive(Debug, Clone)]
pub enum SampleKind {
    /// Decoded and transformed images (`source`, `transform`, `image`, `label`, ...), made by the
    /// pool's own per-thread decoder.
    Image,
    /// Samples the kind writes itself, such as token windows (`crate::tokens`): they need no
    /// decoder, and their time counts as the read stage.
    Filled(Arc<dyn Fill>),
}

/// A sample kind that writes a batch's samples into the ring itself. The pool owns this trait
/// (it calls it); a kind above the pool implements it.
pub trait Fill: Send + Sync + std::fmt::Debug {
    /// Writes sample `pos` of `task` into its slot; the error is the sample's name and what went
    /// wrong.
    fn fill(&self, task: &BatchTask, pos: u32) -> Result<(), (String, String)>;
}

impl std::fmt::Debug for StreamCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamCtx")
            .field("source", &self.source.describe())
            .finish_non_exhaustive()
    }
}

/// The ring fields of one view: its images, and its erasing boxes when it erases.
#[derive(Debug, Clone)]
pub struct ViewFields {
    pub image: FieldDesc,
    pub erase: Option<FieldDesc>,
}

/// The ring fields of hybrid decode (ring.md, `gpu_job`, `gpu_bytes` and `gpu_ops`).
#[derive(Debug, Clone)]
pub struct GpuFields {
    pub job: FieldDesc,
    /// Not per sample: the payload of a whole batch is one arena of encoded bytes.
    pub bytes: FieldDesc,
    /// 1.8: each GPU sample's tail steps, for a view with per-image ops after its geometry.
    pub ops: Option<FieldDesc>,
}

/// 1.10: an aspect-bucketed stream's conditioning fields (ring.md).
#[derive(Debug, Clone)]
pub struct BucketFields {
    /// `(top, left)` of the bucket's crop in the resized image.
    pub crop_top_left: FieldDesc,
    /// `(height, width)` of the decoded, oriented image.
    pub original_size: FieldDesc,
}

/// The outputs of sample `pos` of a FILLING slot, for [`Processor::run`].
struct SlotSink<'a> {
    task: &'a BatchTask,
    pos: u32,
}

impl BatchTask {
    /// The `(h, w)` of view `view`'s images in this batch: its bucket's in a bucketed stream
    /// (whose samples are then packed `h·w·3` bytes apart: ring.md, 1.10), else the view's.
    pub fn image_size(&self, view: usize) -> (u32, u32) {
        match (&self.stream.buckets, self.bucket) {
            (Some(b), Some(k)) if view == 0 => b.size(k),
            _ => self.stream.pipeline.views[view].size,
        }
    }

    /// Bytes of one sample of view `view`'s field in this batch.
    pub fn image_bytes(&self, view: usize) -> u64 {
        match (&self.stream.buckets, self.bucket) {
            (Some(_), Some(_)) if view == 0 => {
                let (h, w) = self.image_size(view);
                u64::from(h) * u64::from(w) * 3
            }
            _ => self.stream.views[view].image.sample_bytes,
        }
    }
}

impl SlotSink<'_> {
    /// Bytes `[k * len, (k + 1) * len)` of sample `pos` of the field at `offset` whose samples
    /// are `sample_bytes` long.
    fn part(&mut self, (offset, sample_bytes): (u64, u64), k: u32, len: u64) -> &mut [u8] {
        let at = offset + u64::from(self.pos) * sample_bytes + u64::from(k) * len;
        let dst = self.task.stream.segment.slot_ptr(self.task.slot, at, len);
        // SAFETY: `dst` is valid for `len` bytes inside the sample's part of the field
        // (slot_ptr checks the range; `k * len` stays inside `sample_bytes` because a view's
        // field holds `count` images of `len` bytes). This job is the only writer of sample
        // `pos` in this FILLING slot (module invariants), the client does not touch a slot
        // before `ready` (ring.md rules 1 and 2), and the returned borrow of `self` keeps two
        // parts from being alive at once.
        unsafe { std::slice::from_raw_parts_mut(dst, len as usize) }
    }
}

impl Sink for SlotSink<'_> {
    fn image(&mut self, view: usize, rep: u32) -> &mut [u8] {
        let ctx = &self.task.stream;
        let (h, w) = self.task.image_size(view);
        let f = &ctx.views[view].image;
        let field = (f.offset, self.task.image_bytes(view));
        self.part(field, rep, u64::from(h) * u64::from(w) * 3)
    }

    fn erase(&mut self, view: usize, rep: u32, boxes: &[[i32; 4]]) {
        let Some(f) = &self.task.stream.views[view].erase else {
            return;
        };
        let field = (f.offset, f.sample_bytes);
        let out = self.part(field, rep, boxes.len() as u64 * 16);
        for (o, b) in out.chunks_exact_mut(16).zip(boxes) {
            for (k, v) in b.iter().enumerate() {
                o[4 * k..4 * k + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

/// A sample that could not be delivered.
#[derive(Debug, Clone)]
pub struct SampleFailure {
    /// Position in the batch.
    pub pos: u32,
    pub index: u64,
    pub key: String,
    pub message: String,
}

/// One batch being filled.
#[derive(Debug)]
pub struct BatchTask {
    pub stream: Arc<StreamCtx>,
    pub run: u32,
    pub epoch: u64,
    pub batch: u64,
    pub slot: u32,
    /// Dataset indices, in batch order.
    pub indices: Vec<u64>,
    /// Jobs not yet finished.
    pub remaining: AtomicUsize,
    pub failures: Mutex<Vec<SampleFailure>>,
    /// The share of this batch offered to the client's GPU (read once, when it was started).
    pub gpu_share: f64,
    /// 1.11: whether this batch's server-decoded samples go to the client as pixels (read once,
    /// when it was started).
    pub pixels: bool,
    /// Bytes of the `gpu_bytes` arena taken by this batch's GPU samples so far.
    pub arena_used: AtomicU64,
    /// 1.10: the bucket of every sample of the batch, in a bucketed stream.
    pub bucket: Option<u32>,
}

impl BatchTask {
    /// Takes `len` bytes of the batch's `gpu_bytes` arena; their offset, or `None` when they
    /// do not fit (the sample is then decoded on the CPU).
    fn reserve(&self, gpu: &GpuFields, len: u64) -> Option<u64> {
        let cap = gpu.bytes.sample_bytes * u64::from(self.stream.segment.layout().header.batch_size);
        // Relaxed: the counter only divides the arena into disjoint ranges; the bytes written
        // into them are published with the batch's completion count (`run`), like every field.
        self.arena_used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                (used + len <= cap).then_some(used + len)
            })
            .ok()
    }
}

/// One sample of one batch.
#[derive(Debug)]
pub struct Job {
    pub batch: Arc<BatchTask>,
    pub pos: u32,
}

/// One stream's pending jobs.
#[derive(Debug)]
struct Queue<J> {
    stats: Arc<StreamStats>,
    jobs: VecDeque<J>,
    running: u32,
}

/// The streams' queues (generic over the job, so the policy is testable without decoding).
#[derive(Debug)]
struct Sched<J> {
    queues: Vec<Queue<J>>,
    /// Where the round-robin tie-break starts.
    cursor: usize,
    stop: bool,
}

impl<J> Default for Sched<J> {
    fn default() -> Self {
        Sched {
            queues: Vec::new(),
            cursor: 0,
            stop: false,
        }
    }
}

impl<J> Sched<J> {
    /// Appends `jobs` to `stats`'s stream's queue.
    fn push(&mut self, stats: &Arc<StreamStats>, jobs: impl Iterator<Item = J>) {
        let i = match self.queues.iter().position(|q| Arc::ptr_eq(&q.stats, stats)) {
            Some(i) => i,
            None => {
                self.queues.push(Queue {
                    stats: Arc::clone(stats),
                    jobs: VecDeque::new(),
                    running: 0,
                });
                self.queues.len() - 1
            }
        };
        self.queues[i].jobs.extend(jobs);
    }

    /// The next job to run, if any stream may run one more.
    fn pick(&mut self) -> Option<J> {
        let n = self.queues.len();
        let mut best: Option<(usize, u32)> = None;
        for k in 0..n {
            let i = (self.cursor + k) % n;
            let q = &self.queues[i];
            if q.jobs.is_empty() || q.running >= q.stats.threads.load(Ordering::Relaxed).max(1) {
                continue;
            }
            let lead = q.stats.held.load(Ordering::Relaxed);
            if best.is_none_or(|(_, l)| lead < l) {
                best = Some((i, lead));
            }
        }
        let (i, _) = best?;
        self.cursor = (i + 1) % n.max(1);
        let q = &mut self.queues[i];
        q.running += 1;
        q.jobs.pop_front()
    }

    /// Takes every queued job of `stats`'s stream out (a running job finishes on its own).
    fn purge(&mut self, stats: &Arc<StreamStats>) -> VecDeque<J> {
        let Some(i) = self.queues.iter().position(|q| Arc::ptr_eq(&q.stats, stats)) else {
            return VecDeque::new();
        };
        let jobs = std::mem::take(&mut self.queues[i].jobs);
        if self.queues[i].running == 0 {
            self.queues.swap_remove(i);
        }
        jobs
    }

    /// A job of `stats`'s stream finished: frees its place, and drops an idle queue.
    fn finished(&mut self, stats: &Arc<StreamStats>) {
        if let Some(i) = self.queues.iter().position(|q| Arc::ptr_eq(&q.stats, stats)) {
            self.queues[i].running -= 1;
            if self.queues[i].running == 0 && self.queues[i].jobs.is_empty() {
                self.queues.swap_remove(i);
            }
        }
    }
}

#[derive(Debug, Default)]
struct Shared {
    sched: Mutex<Sched<Job>>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Sched<Job>> {
        self.sched.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The worker threads.
#[derive(Debug)]
pub struct Pool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Pool {
    /// Starts `threads` workers, each with its own decoder limited by `limits`. With `pin`, worker
    /// `n` runs only on the `n`-th CPU of the process's affinity mask counted from the last one
    /// (the first CPUs are where the training processes and the control plane usually start).
    pub fn new(threads: usize, limits: Limits, pin: bool) -> std::io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let cpus: Vec<usize> = if pin {
            let mask = rustix::thread::sched_getaffinity(None)?;
            (0..rustix::thread::CpuSet::MAX_CPU)
                .rev()
                .filter(|&c| mask.is_set(c))
                .collect()
        } else {
            Vec::new()
        };
        let mut handles = Vec::with_capacity(threads);
        for n in 0..threads.max(1) {
            let shared = Arc::clone(&shared);
            let cpu = (!cpus.is_empty()).then(|| cpus[n % cpus.len()]);
            handles.push(
                std::thread::Builder::new()
                    .name(format!("ringfeed-decode-{n}"))
                    .spawn(move || {
                        if let Some(cpu) = cpu {
                            let mut set = rustix::thread::CpuSet::new();
                            set.set(cpu);
                            if let Err(e) = rustix::thread::sched_setaffinity(None, &set) {
                                tracing::warn!("--pin-threads: decode thread {n} cannot be pinned to CPU {cpu}: {e}; it runs unpinned");
                            }
                        }
                        worker(&shared, limits)
                    })?,
            );
        }
        Ok(Pool {
            shared,
            threads: handles,
        })
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Queues every sample of `task`.
    pub fn submit(&self, task: Arc<BatchTask>) {
        let stats = Arc::clone(&task.stream.stats);
        let mut sched = self.shared.lock();
        sched.push(
            &stats,
            (0..task.indices.len() as u32).map(|pos| Job {
                batch: Arc::clone(&task),
                pos,
            }),
        );
        drop(sched);
        self.shared.wake.notify_all();
    }

    /// Drops the queued jobs of a stream whose connection has ended. Nobody waits for its batches
    /// any more; without this, its jobs (which would only skip their work) could wait behind the
    /// other streams for as long as those have work, holding the stream's ring.
    pub fn purge(&self, stats: &Arc<StreamStats>) {
        let dropped = {
            let mut sched = self.shared.lock();
            sched.purge(stats)
        };
        drop(dropped); // outside the lock: the last job may free the ring
    }

    /// Wakes the workers after allotments changed.
    pub fn kick(&self) {
        self.shared.wake.notify_all();
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn worker(shared: &Shared, limits: Limits) {
    let mut processor = match Processor::new(limits) {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::error!("a decode thread could not start its decoder: {e}; its jobs fail");
            None
        }
    };
    loop {
        let job = {
            let mut sched = shared.lock();
            loop {
                if sched.stop {
                    return;
                }
                if let Some(job) = sched.pick() {
                    break job;
                }
                sched = shared.wake.wait(sched).unwrap_or_else(|p| p.into_inner());
            }
        };
        // The stream's busy share counts the whole time this thread is the job's (stats::Occupancy).
        let stats = Arc::clone(&job.batch.stream.stats);
        let started = stats.job_started(Instant::now());
        run(&mut processor, &job);
        stats.job_ended(started, Instant::now());
        let mut sched = shared.lock();
        sched.finished(&job.batch.stream.stats);
        // This stream may run one more job now; a sleeping worker may take it.
        let more = sched.queues.iter().any(|q| !q.jobs.is_empty());
        drop(sched);
        if more {
            shared.wake.notify_one();
        }
        // Outside the lock: the last job of a closed stream frees its ring here.
        drop(job);
    }
}

/// Runs one job and counts it down.
fn run(processor: &mut Option<Processor>, job: &Job) {
    let task = &job.batch;
    let ctx = &task.stream;
    // Acquire: pairs with the stream's Release store of a new run, so a cancelled run is
    // seen as soon as possible (a stale read only costs wasted work, never wrong output).
    if ctx.current_run.load(Ordering::Acquire) == task.run {
        let result = match (&ctx.kind, processor.as_mut()) {
            (SampleKind::Filled(kind), _) => {
                let t0 = Instant::now();
                let r = kind.fill(task, job.pos);
                let mut times = [0u64; STAGES];
                times[Stage::Read as usize] = t0.elapsed().as_nanos() as u64;
                ctx.stats.add_sample_times(times);
                r
            }
            (SampleKind::Image, Some(p)) => run_job(p, job),
            (SampleKind::Image, None) => Err(("?".to_owned(), "the decoder failed to start".to_owned())),
        };
        if let Err((key, message)) = result {
            let failure = SampleFailure {
                pos: job.pos,
                index: task.indices[job.pos as usize],
                key,
                message,
            };
            task.failures.lock().unwrap_or_else(|p| p.into_inner()).push(failure);
        }
    }
    // SYNC POINT: Release makes this job's slot writes visible to whoever takes the count to
    // zero; AcqRel on that last decrement acquires every other job's writes.
    if task.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
        let _ = ctx.done.send(Arc::clone(task));
    }
}

/// Writes `v` (little-endian bytes) at the `pos`-th sample of `field` in the task's slot.
///
/// # Safety
/// The caller is the job for sample `pos` of a FILLING slot (see the module invariants).
unsafe fn put(task: &BatchTask, field: &FieldDesc, pos: u32, bytes: &[u8]) {
    debug_assert_eq!(bytes.len() as u64, field.sample_bytes);
    let at = field.offset + u64::from(pos) * field.sample_bytes;
    let dst = task.stream.segment.slot_ptr(task.slot, at, field.sample_bytes);
    // SAFETY: `dst` is valid for `sample_bytes` bytes (slot_ptr checks the range), and only this
    // job writes sample `pos` of this FILLING slot (caller's contract).
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
}

/// Decodes one sample into the slot. On failure returns the sample's key and the reason.
fn run_job(processor: &mut Processor, job: &Job) -> Result<(), (String, String)> {
    let task = &job.batch;
    let ctx = &task.stream;
    let index = task.indices[job.pos as usize];
    let mut outcome: Result<(), (String, String)> = Ok(());
    let mut times = [0u64; STAGES];
    let t0 = Instant::now();
    if ctx.fields.is_none() && ctx.targets.is_none() {
        ctx.source.with_sample(index, &mut |sample| {
            times[Stage::Read as usize] = t0.elapsed().as_nanos() as u64;
            outcome = write_sample(processor, job, index, sample, None, None, &mut times)
        })
    } else {
        // 1.9: the fields (1.10: the targets) come from the same read as the image, so they
        // follow it everywhere; they are read first, so a sample whose field fails is not
        // decoded for nothing.
        ctx.source.with_sample_extra(index, &mut |sample, extra| {
            let key = || String::from_utf8_lossy(sample.key).into_owned();
            let encoded = match &ctx.fields {
                Some(fields) => fields.encode(&extra).map_err(|e| (key(), e)),
                None => Ok(Vec::new()),
            };
            // The header probed for the size below, handed on to the ops (which would probe it
            // again): it is `sample.data`'s, read within this same borrow of it.
            let mut probed = None;
            let targets = match &ctx.targets {
                Some(t) => {
                    let (mut read, mut png) = (Targets::default(), Vec::new());
                    // The stored image's size, from its header (no decode), for WebDataset
                    // instance masks, which are rasterised at it as `pack --coco` does.
                    let mut size = || {
                        let info = processor.probe(sample.data).map_err(|e| e.to_string())?;
                        probed = Some(info);
                        Ok((info.width, info.height))
                    };
                    t.read(ctx.source.as_ref(), index, &extra, &mut size, &mut read, &mut png)
                        .map(|()| Some(read))
                        .map_err(|e| (key(), e))
                }
                None => Ok(None),
            };
            times[Stage::Read as usize] = t0.elapsed().as_nanos() as u64;
            outcome = encoded.and_then(|encoded| {
                let mut targets = targets?;
                write_sample(processor, job, index, sample, targets.as_mut(), probed, &mut times)?;
                let descs = ctx.fields.as_ref().map_or(&[][..], |f| f.descs());
                for (desc, bytes) in descs.iter().zip(&encoded) {
                    // SAFETY: this job owns sample `pos` of the FILLING slot (module invariants);
                    // `encode` gives each field exactly its sample bytes.
                    unsafe { put(task, desc, job.pos, bytes) };
                }
                Ok(())
            });
        })
    }
    .map_err(|e| (format!("#{index}"), e.to_string()))?;
    ctx.stats.add_sample_times(times);
    outcome
}

/// Decodes and transforms one sample into the slot, with its label and extras; with `targets`
/// (1.10, in the stored image's pixels), moves them with the image and writes their fields.
/// `probed` is `sample.data`'s header when it was probed already (for WebDataset instance masks).
#[allow(clippy::too_many_arguments)]
fn write_sample(
    processor: &mut Processor,
    job: &Job,
    index: u64,
    sample: ringfeed_source::Sample<'_>,
    mut targets: Option<&mut Targets>,
    probed: Option<ringfeed_decode::ImageInfo>,
    times: &mut [u64; STAGES],
) -> Result<(), (String, String)> {
    let task = &job.batch;
    let ctx = &task.stream;
    let key = || String::from_utf8_lossy(sample.key).into_owned();
    let rng = SampleRng::new(ctx.seed, task.epoch, index);
    let t0 = Instant::now();
    let mut sink = SlotSink { task, pos: job.pos };
    // 1.10: the bucket's covering resize and crop go before the view's ops, for this image's size.
    let mut bucketed = None;
    let pipeline = match (&ctx.buckets, task.bucket) {
        (Some(b), Some(k)) => {
            let (width, height) = b.sizes[index as usize];
            let bucket = b.size(k);
            let (head, offsets) = b.spec.head(bucket, width, height, &rng);
            let mut p = ctx.pipeline.clone();
            p.views[0].ops.splice(0..0, head);
            p.views[0].size = bucket;
            bucketed = Some((offsets, (height, width)));
            std::borrow::Cow::Owned(p)
        }
        _ => std::borrow::Cow::Borrowed(&ctx.pipeline),
    };
    let handed = match &ctx.gpu {
        Some(g) => to_client(
            processor,
            task,
            job.pos,
            g,
            pipeline.as_ref(),
            sample.data,
            &rng,
            &mut sink,
            targets.as_deref_mut(),
        )
        .map_err(|e| (key(), e.to_string()))?,
        None => None,
    };
    let crop = match handed {
        Some((crop, _)) => crop,
        None => {
            let (data, pipeline, layout, trace) = (sample.data, pipeline.as_ref(), ctx.layout, &mut Trace::off());
            let crop = match (targets.as_deref_mut(), &ctx.targets) {
                (Some(t), Some(s)) => {
                    processor.run_targets(data, probed, pipeline, rng, layout, &mut sink, trace, t, &s.options)
                }
                _ => processor.run(data, pipeline, rng, layout, &mut sink, trace),
            }
            .map_err(|e| (key(), e.to_string()))?;
            if let Some(g) = &ctx.gpu {
                // All-zero records (one per output, 1.10) say the server decoded it (ring.md).
                sink.part((g.job.offset, g.job.sample_bytes), 0, g.job.sample_bytes)
                    .fill(0);
            }
            crop
        }
    };
    let t1 = Instant::now();
    let total = (t1 - t0).as_nanos() as u64;
    let decode = if handed.is_some_and(|(_, decoded_here)| !decoded_here) {
        0
    } else {
        processor.last_decode_ns().min(total)
    };
    times[Stage::Decode as usize] = decode;
    times[Stage::Transform as usize] = total - decode;
    // SAFETY: for each `put`, this job owns sample `pos` of the FILLING slot, as above.
    unsafe {
        put(task, &ctx.label, job.pos, &sample.label.to_le_bytes());
        if let Some(f) = &ctx.index {
            put(task, f, job.pos, &(index as i64).to_le_bytes());
        }
        if let Some(f) = &ctx.crop {
            let v = [
                crop.top as i32,
                crop.left as i32,
                crop.height as i32,
                crop.width as i32,
                i32::from(crop.flipped),
            ];
            let mut b = [0u8; 20];
            for (k, x) in v.iter().enumerate() {
                b[4 * k..4 * k + 4].copy_from_slice(&x.to_le_bytes());
            }
            put(task, f, job.pos, &b);
        }
        if let (Some(f), Some(((top, left), (height, width)))) = (&ctx.bucket_fields, bucketed) {
            let pair = |a: u32, b: u32| {
                let mut out = [0u8; 8];
                out[..4].copy_from_slice(&(a as i32).to_le_bytes());
                out[4..].copy_from_slice(&(b as i32).to_le_bytes());
                out
            };
            put(task, &f.crop_top_left, job.pos, &pair(top, left));
            put(task, &f.original_size, job.pos, &pair(height, width));
        }
    }
    if let (Some(t), Some(stream)) = (targets, &ctx.targets) {
        /// The sample's part of each target field in the slot.
        struct Fields<'a, 'b>(&'a mut SlotSink<'b>, &'a [FieldDesc]);
        impl crate::targets::FieldBytes for Fields<'_, '_> {
            fn field(&mut self, k: usize) -> &mut [u8] {
                let d = &self.1[k];
                self.0.part((d.offset, d.sample_bytes), 0, d.sample_bytes)
            }
        }
        stream
            .write(t, &mut Fields(&mut sink, stream.descs()))
            .map_err(|e| (key(), e))?;
    }
    times[Stage::Write as usize] = t1.elapsed().as_nanos() as u64;
    Ok(())
}

/// How sample `pos` of the batch goes to the client, if it does: its JPEG bytes where it is
/// offered to the GPU decoder and the GPU path takes it, else (1.11, where the batch has decoded
/// pixels on) its decoded pixels where the geometry allows. Returns its `crop`, and whether the
/// server decoded it (pixels), or `None` when the server finishes it; each attempt that does not
/// take the sample leaves `rng` to the next, which draws the sample again.
#[allow(clippy::too_many_arguments)]
fn to_client(
    processor: &mut Processor,
    task: &BatchTask,
    pos: u32,
    gpu: &GpuFields,
    pipeline: &Pipeline,
    data: &[u8],
    rng: &SampleRng,
    sink: &mut SlotSink<'_>,
    mut targets: Option<&mut Targets>,
) -> Result<Option<(ringfeed_ops::Crop, bool)>, ringfeed_ops::OpError> {
    if ringfeed_ops::gpu::offered(pos, task.gpu_share)
        && let Some(crop) = to_gpu(
            processor,
            task,
            gpu,
            pipeline,
            data,
            rng.clone(),
            sink,
            targets.as_deref_mut(),
        )?
    {
        return Ok(Some((crop, false)));
    }
    if task.pixels {
        return Ok(to_pixels(processor, task, gpu, pipeline, data, rng.clone(), sink, targets)?.map(|c| (c, true)));
    }
    Ok(None)
}

/// Hands the sample of `sink` to the client's GPU when it can go there: plans it under `pipeline` (the
/// stream's, or 1.10's bucketed one with the bucket's covering resize and crop in front), copies
/// its bytes into the batch's arena and writes a `gpu_job` record per output (1.10: views and
/// images in order, each with its own geometry, all reading the one encoded image); 1.10: moves
/// its `targets` through the planned geometry (known before any pixel is decoded). Returns its
/// `crop`, or `None` when the CPU must decode it (not a plain JPEG, geometry the GPU does not
/// finish for some output, no room in the arena).
#[allow(clippy::too_many_arguments)]
fn to_gpu(
    processor: &mut Processor,
    task: &BatchTask,
    gpu: &GpuFields,
    pipeline: &Pipeline,
    data: &[u8],
    rng: SampleRng,
    sink: &mut SlotSink<'_>,
    targets: Option<&mut Targets>,
) -> Result<Option<ringfeed_ops::Crop>, ringfeed_ops::OpError> {
    let ctx = &task.stream;
    let max_steps = max_steps(gpu, pipeline);
    let Some(crop) = processor.plan_gpu(data, pipeline, rng, max_steps, sink, &mut Trace::off())? else {
        return Ok(None);
    };
    let len = data.len() as u64;
    let Some(offset) = task.reserve(gpu, len) else {
        return Ok(None);
    };
    if let (Some(t), Some(stream)) = (targets, &ctx.targets) {
        // Only once the sample surely goes to the GPU: the CPU path moves the stored targets
        // itself. (A sample whose targets fail leaves its arena bytes unused, as a failed
        // sample's room always is.)
        processor.gpu_targets(t, &stream.options)?;
    }
    let dst = ctx.segment.slot_ptr(task.slot, gpu.bytes.offset + offset, len);
    // SAFETY: `dst` is valid for `len` bytes inside the slot's arena (slot_ptr checks the range;
    // `reserve` keeps `offset + len` within the field's payload), and this job is the only
    // writer of `[offset, offset + len)`: `reserve` hands every range out once per batch.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
    write_records(processor, gpu, pipeline, sink, max_steps, |job| {
        job.record(offset as u32, len as u32)
    });
    ctx.stats.gpu_handed.fetch_add(1, Ordering::Relaxed);
    Ok(Some(crop))
}

/// 1.11: hands the sample of `sink` to the client's GPU as its decoded pixels (control.md,
/// "Decoded pixels (1.11)"): plans it under `pipeline` as [`to_gpu`] does, decodes the
/// rectangle its outputs read straight into the batch's arena, and writes a `gpu_job` record
/// (bit 8 set) and the steps per output; 1.10: moves its `targets` through the planned geometry.
/// Returns its `crop`, or `None` when the server must finish it (geometry the GPU does not
/// finish, no room left in the arena).
#[allow(clippy::too_many_arguments)]
fn to_pixels(
    processor: &mut Processor,
    task: &BatchTask,
    gpu: &GpuFields,
    pipeline: &Pipeline,
    data: &[u8],
    rng: SampleRng,
    sink: &mut SlotSink<'_>,
    targets: Option<&mut Targets>,
) -> Result<Option<ringfeed_ops::Crop>, ringfeed_ops::OpError> {
    let ctx = &task.stream;
    let max_steps = max_steps(gpu, pipeline);
    let has_targets = targets.is_some();
    let Some(plan) = processor.plan_pixels(data, pipeline, rng, max_steps, has_targets, sink, &mut Trace::off())?
    else {
        return Ok(None);
    };
    let rect = plan.rect;
    let len = u64::from(rect.width) * u64::from(rect.height) * 3;
    let Some(offset) = task.reserve(gpu, len) else {
        return Ok(None);
    };
    if let (Some(t), Some(stream)) = (targets, &ctx.targets) {
        processor.gpu_targets(t, &stream.options)?;
    }
    let dst = ctx.segment.slot_ptr(task.slot, gpu.bytes.offset + offset, len);
    // SAFETY: as in `to_gpu`: `dst` is valid for `len` bytes inside the slot's arena, and this
    // job is the only writer of `[offset, offset + len)`, which `reserve` handed out once.
    let out = unsafe { std::slice::from_raw_parts_mut(dst, len as usize) };
    // A sample that fails to decode is a failed sample, as on the CPU path (its arena bytes
    // stay unused).
    processor.decode_pixels(data, &plan, out)?;
    write_records(processor, gpu, pipeline, sink, max_steps, |job| {
        job.pixel_record(offset as u32, rect)
    });
    ctx.stats.pixel_samples.fetch_add(1, Ordering::Relaxed);
    Ok(Some(plan.crop))
}

/// The most tail steps a `gpu_ops` record table holds per output.
fn max_steps(gpu: &GpuFields, pipeline: &Pipeline) -> usize {
    let outputs = u64::from(pipeline.outputs().max(1));
    gpu.ops
        .as_ref()
        .map_or(0, |f| (f.sample_bytes / outputs) as usize / gpu_ops::RECORD_BYTES)
}

/// Writes a planned sample's `gpu_job` record (`record` of each output's job) and `gpu_ops`
/// steps, output `j` into part `j` of each field.
fn write_records(
    processor: &Processor,
    gpu: &GpuFields,
    pipeline: &Pipeline,
    sink: &mut SlotSink<'_>,
    max_steps: usize,
    record: impl Fn(&ringfeed_ops::gpu::GpuJob) -> [i32; ringfeed_ops::gpu::RECORD_LEN],
) {
    const RECORD_BYTES: usize = ringfeed_ops::gpu::RECORD_LEN * 4;
    let (job_field, ops_field) = (
        (gpu.job.offset, gpu.job.sample_bytes),
        gpu.ops.as_ref().map(|f| (f.offset, f.sample_bytes)),
    );
    let mut j = 0u32;
    for view in &pipeline.views {
        for _ in 0..view.count {
            let out = sink.part(job_field, j, RECORD_BYTES as u64);
            for (o, x) in out.chunks_exact_mut(4).zip(record(&processor.gpu_jobs()[j as usize])) {
                o.copy_from_slice(&x.to_le_bytes());
            }
            if let Some(field) = ops_field {
                // Every record: the steps, then zeros (ring.md: kind 0 ends them, and the rest
                // are 0). Steps map images of the output's size (`pipeline`'s: a bucketed
                // sample's is its bucket).
                let (h, w) = view.size;
                let out = sink.part(field, j, (max_steps * gpu_ops::RECORD_BYTES) as u64);
                out.fill(0);
                for (o, s) in out
                    .chunks_exact_mut(gpu_ops::RECORD_BYTES)
                    .zip(processor.gpu_steps(j as usize))
                {
                    o.copy_from_slice(&s.record((w, h)).to_le_bytes());
                }
            }
            j += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(id: u64, threads: u32) -> Arc<StreamStats> {
        Arc::new(StreamStats::new(
            id,
            1,
            format!("d{id}"),
            8,
            4,
            true,
            None,
            None,
            threads,
            2,
        ))
    }

    #[test]
    fn a_stream_never_runs_more_jobs_than_its_threads() {
        let a = stream(1, 2);
        let mut s = Sched::default();
        s.push(&a, 0..10u32);
        assert_eq!((s.pick(), s.pick(), s.pick()), (Some(0), Some(1), None));
        s.finished(&a);
        assert_eq!(s.pick(), Some(2));
        // More threads allotted: more run at once.
        a.threads.store(4, Ordering::Relaxed);
        assert_eq!((s.pick(), s.pick(), s.pick()), (Some(3), Some(4), None));
    }

    #[test]
    fn streams_take_turns_and_the_starving_one_goes_first() {
        let (a, b) = (stream(1, 8), stream(2, 8));
        let mut s = Sched::default();
        s.push(&a, [10u32, 11, 12, 13].into_iter());
        s.push(&b, [20u32, 21, 22, 23].into_iter());
        // A backlog of a's jobs does not hold b back: they alternate.
        let order: Vec<_> = (0..4).map(|_| s.pick().unwrap()).collect();
        assert_eq!(order, [10, 20, 11, 21]);
        // a's client holds two batches to consume, b's none: b is closer to starving.
        a.held.store(2, Ordering::Relaxed);
        assert_eq!((s.pick(), s.pick(), s.pick()), (Some(22), Some(23), Some(12)));
    }

    #[test]
    fn a_gone_stream_is_purged_even_while_another_always_has_work() {
        let (gone, busy) = (stream(1, 8), stream(2, 8));
        gone.held.store(1, Ordering::Relaxed); // frozen at its last value when the client died
        let mut s = Sched::default();
        s.push(&gone, [10u32, 11].into_iter());
        s.push(&busy, [20u32, 21].into_iter());
        assert_eq!(s.pick(), Some(20), "the starving stream goes first");
        assert_eq!(s.purge(&gone), [10, 11]);
        assert_eq!(s.queues.len(), 1);
        assert_eq!(s.pick(), Some(21));
        assert_eq!(s.pick(), None);
    }

    #[test]
    fn an_idle_queue_is_dropped_once_its_jobs_finished() {
        let a = stream(1, 1);
        let mut s = Sched::default();
        s.push(&a, [1u32].into_iter());
        assert_eq!(s.pick(), Some(1));
        assert_eq!(s.queues.len(), 1);
        s.finished(&a);
        assert!(s.queues.is_empty());
    }
}
