//! What the server measures about each stream, and the `snapshot` it shows to observers
//! (control.md, "snapshot"; `ringfeed top`, `--metrics`, `Loader.stats()`).
//!
//! Counters are cumulative atomics written by whoever does the work: the decode threads add their
//! per-stage times, the stream's task its slot counts and deliveries, the client's `stats` its wait
//! and compute times. Every interval the tuner ([`crate::tune`]) reads them, takes differences and
//! stores the interval's rates in [`StreamStats::view`]; a snapshot reads that view. All counters
//! are independent statistics, so `Relaxed` suffices: no reader derives a hand-off from them, and a
//! snapshot may mix values a few microseconds apart.
//!
//! The one exception is [`Occupancy`], the thread-time the pool spends on a stream's jobs: it is
//! integrated under a small lock, so a reader between two jobs' ends still sees whole numbers (the
//! jobs running at that moment count up to the moment of reading).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ringfeed_format::control::{SlotCounts, StageTimes, StreamSnapshot};

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
    /// The threads the stream's kind starts with (token streams: 1; None: the budget), which
    /// the tuner keeps until the client reports its loop.
    pub start_threads: Option<u32>,

    // Knobs: written by the tuner (or fixed at open), read by the pool and the stream's task.
    /// Decode threads the stream may occupy at once.
    pub threads: AtomicU32,
    /// Batches the stream may have in flight (FILLING + READY).
    pub depth: AtomicU32,
    /// Wakes the stream's task when `depth` grew, so it fills the new room.
    pub wake: tokio::sync::Notify,

    // Written by the stream's task.
    /// When the client's first `start` arrived: before it the stream has no work, so its threads'
    /// idle time then is nobody's shortage (the busy share counts from it).
    pub first_start: Mutex<Option<Instant>>,
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
    /// Thread-time the pool's threads spent on this stream's jobs, from the moment a thread took a
    /// job to the moment it was done with it (everything the stage times cover, and the rest:
    /// scheduling, the countdown, handing the batch back). The autotuner's `busy` divides it by
    /// the threads allotted times the interval.
    pub occupancy: Mutex<Occupancy>,

    // Written by the client's `stats` messages.
    pub reported: AtomicBool,
    pub steps: AtomicU64,
    pub wait_ns: AtomicU64,
    pub compute_ns: AtomicU64,
    /// 1.2: of `wait_ns`, the time the loop waited behind its own GPU work (back-pressure).
    pub gpu_wait_ns: AtomicU64,
    /// Whether the client has ever reported `gpu_wait_ns` (a 1.2 client in CUDA mode).
    pub reports_gpu_wait: AtomicBool,

    /// 1.3, hybrid decode: whether the stream has `gpu_decode`, and whether the tuner sets its
    /// share (control.md, "Hybrid decode"). Fixed at open.
    pub gpu: Option<GpuMode>,
    /// 1.11: the tuner turns the stream's decoded pixels on and off (the client asked for them,
    /// the share is the tuner's). Fixed at open.
    pub pixels_tuned: bool,
    /// 1.11: whether the samples the server decodes go to the client as pixels now (the tuner
    /// writes it where `pixels_tuned`; the stream's task reads it when it starts a batch).
    pub pixels_on: AtomicBool,
    /// The share of each batch offered to the client's GPU, in millionths (the tuner writes it,
    /// the stream's task reads it when it starts a batch).
    pub gpu_share: AtomicU32,
    /// Samples the decode threads handed to the client's GPU.
    pub gpu_handed: AtomicU64,
    /// 1.11: samples the decode threads decoded and handed to the client's GPU as pixels.
    pub pixel_samples: AtomicU64,
    /// Written by the client's `stats` (1.3): samples it finished on its GPU, its host time on
    /// them, and those its GPU decoder refused.
    pub gpu_samples: AtomicU64,
    pub gpu_decode_ns: AtomicU64,
    pub gpu_fallbacks: AtomicU64,
    /// Written by the client's `stats` (1.5): the part of its wait for data spent waiting for its
    /// own GPU decodes.
    pub gpu_decode_wait_ns: AtomicU64,

    /// The last interval's rates and the tuner's last decision, for observers.
    pub view: Mutex<IntervalView>,
}

/// How a stream with `gpu_decode` sets its share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuMode {
    /// The client pinned it.
    Pinned,
    /// The autotuner sets it.
    Auto,
}

/// Rates over the tuner's last interval.
#[derive(Debug, Clone, Default)]
pub struct IntervalView {
    pub samples_per_s: f64,
    /// The loop's wait for data (net of back-pressure when the client reports it).
    pub wait: Option<f64>,
    /// The loop's wait behind its own GPU (None: the client does not report it).
    pub gpu_wait: Option<f64>,
    pub step_ms: Option<f64>,
    /// The allotted threads' busy share (None: no threads allotted, or no interval yet).
    pub busy: Option<f64>,
    pub stage_us: [f64; STAGES],
    /// The tuner's last change and why.
    pub tune: String,
    /// The tuner's reading of the last interval: what limits the loop.
    pub limit: String,
    /// The client's host time per GPU-finished sample over the interval, in µs (1.3).
    pub gpu_decode_us: Option<f64>,
}

/// The thread-time a stream's jobs occupy pool threads: the integral over time of the number of
/// its jobs running. Jobs report their start and end ([`Occupancy::start`], [`Occupancy::end`]);
/// [`Occupancy::busy_ns`] counts the running ones up to the moment asked, so an interval's
/// difference is exact even when jobs are long against the interval.
#[derive(Debug)]
pub struct Occupancy {
    /// The clock's origin: instants are kept as nanoseconds since it.
    origin: Instant,
    /// Thread-nanoseconds of the jobs that ended.
    ended_ns: u128,
    /// Jobs running now.
    running: u64,
    /// The sum of the running jobs' start times (ns since `origin`).
    started_ns: u128,
}

impl Occupancy {
    pub fn new(origin: Instant) -> Self {
        Occupancy {
            origin,
            ended_ns: 0,
            running: 0,
            started_ns: 0,
        }
    }

    fn ns(&self, t: Instant) -> u128 {
        t.saturating_duration_since(self.origin).as_nanos()
    }

    /// A thread took a job at `now`; returns the start to hand to [`Occupancy::end`].
    pub fn start(&mut self, now: Instant) -> Instant {
        self.running += 1;
        self.started_ns += self.ns(now);
        now
    }

    /// The job that [`Occupancy::start`]ed at `started` is done at `now`.
    pub fn end(&mut self, started: Instant, now: Instant) {
        let (s, e) = (self.ns(started), self.ns(now));
        debug_assert!(self.running > 0, "a job ended that never started");
        self.running = self.running.saturating_sub(1);
        self.started_ns = self.started_ns.saturating_sub(s);
        self.ended_ns += e.saturating_sub(s);
    }

    /// Thread-nanoseconds spent on the stream's jobs up to `now` (running jobs count until `now`).
    pub fn busy_ns(&self, now: Instant) -> u64 {
        let running = (u128::from(self.running) * self.ns(now)).saturating_sub(self.started_ns);
        (self.ended_ns + running).min(u128::from(u64::MAX)) as u64
    }
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
            start_threads: None,
            threads: AtomicU32::new(threads),
            depth: AtomicU32::new(depth),
            wake: tokio::sync::Notify::new(),
            first_start: Mutex::new(None),
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
            occupancy: Mutex::new(Occupancy::new(Instant::now())),
            reported: AtomicBool::new(false),
            steps: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
            compute_ns: AtomicU64::new(0),
            gpu_wait_ns: AtomicU64::new(0),
            reports_gpu_wait: AtomicBool::new(false),
            gpu: None,
            pixels_tuned: false,
            pixels_on: AtomicBool::new(false),
            gpu_share: AtomicU32::new(0),
            gpu_handed: AtomicU64::new(0),
            pixel_samples: AtomicU64::new(0),
            gpu_samples: AtomicU64::new(0),
            gpu_decode_ns: AtomicU64::new(0),
            gpu_fallbacks: AtomicU64::new(0),
            gpu_decode_wait_ns: AtomicU64::new(0),
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

    /// Adds a client's `stats` message. `gpu_wait_ns` (1.2) is the part of `wait_ns` spent behind
    /// the client's own GPU work; it is clamped to `wait_ns`. `gpu_decode_wait_ns` (1.5) is the
    /// part of the rest (the wait for data) spent waiting for its own GPU decodes; it is clamped
    /// to that rest (control.md, `stats`).
    pub fn add_client_stats(
        &self,
        steps: u64,
        wait_ns: u64,
        compute_ns: u64,
        gpu_wait_ns: Option<u64>,
        gpu_decode_wait_ns: Option<u64>,
    ) {
        self.steps.fetch_add(steps, Ordering::Relaxed);
        self.wait_ns.fetch_add(wait_ns, Ordering::Relaxed);
        self.compute_ns.fetch_add(compute_ns, Ordering::Relaxed);
        let gpu = gpu_wait_ns.map_or(0, |g| g.min(wait_ns));
        if gpu_wait_ns.is_some() {
            self.gpu_wait_ns.fetch_add(gpu, Ordering::Relaxed);
            self.reports_gpu_wait.store(true, Ordering::Relaxed);
        }
        if let Some(d) = gpu_decode_wait_ns {
            self.gpu_decode_wait_ns
                .fetch_add(d.min(wait_ns - gpu), Ordering::Relaxed);
        }
        self.reported.store(true, Ordering::Relaxed);
    }

    /// Adds a client's 1.3 `stats` members about the samples it finished on its GPU.
    pub fn add_client_gpu_stats(&self, samples: u64, decode_ns: u64, fallbacks: u64) {
        self.gpu_samples.fetch_add(samples, Ordering::Relaxed);
        self.gpu_decode_ns.fetch_add(decode_ns, Ordering::Relaxed);
        self.gpu_fallbacks.fetch_add(fallbacks.min(samples), Ordering::Relaxed);
    }

    /// The share of each batch offered to the client's GPU now (0 without `gpu_decode`).
    pub fn share(&self) -> f64 {
        if self.gpu.is_none() {
            return 0.0;
        }
        f64::from(self.gpu_share.load(Ordering::Relaxed)) / 1e6
    }

    /// Sets the share offered to the client's GPU, clamped to `0..=1`.
    pub fn set_share(&self, share: f64) {
        let v = (share.clamp(0.0, 1.0) * 1e6).round() as u32;
        self.gpu_share.store(v, Ordering::Relaxed);
    }

    /// The client sent `start` at `now`; only the first one is kept.
    pub fn started(&self, now: Instant) {
        self.first_start
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(now);
    }

    /// How long, up to `now`, the stream has had work (since its first `start`); zero before it.
    pub fn active_for(&self, now: Instant) -> std::time::Duration {
        let first = *self.first_start.lock().unwrap_or_else(|p| p.into_inner());
        first.map_or(std::time::Duration::ZERO, |t| now.saturating_duration_since(t))
    }

    /// A pool thread took one of this stream's jobs at `now` (see [`Occupancy`]).
    pub fn job_started(&self, now: Instant) -> Instant {
        self.occupancy.lock().unwrap_or_else(|p| p.into_inner()).start(now)
    }

    /// The job started at `started` is done at `now`.
    pub fn job_ended(&self, started: Instant, now: Instant) {
        self.occupancy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .end(started, now);
    }

    /// The cumulative counters at `now`, read together.
    pub fn counters(&self, now: Instant) -> Counters {
        Counters {
            samples: self.samples.load(Ordering::Relaxed),
            stage_ns: std::array::from_fn(|i| self.stage_ns[i].load(Ordering::Relaxed)),
            timed: self.timed.load(Ordering::Relaxed),
            busy_ns: self.occupancy.lock().unwrap_or_else(|p| p.into_inner()).busy_ns(now),
            steps: self.steps.load(Ordering::Relaxed),
            wait_ns: self.wait_ns.load(Ordering::Relaxed),
            compute_ns: self.compute_ns.load(Ordering::Relaxed),
            gpu_wait_ns: self.gpu_wait_ns.load(Ordering::Relaxed),
            gpu_samples: self.gpu_samples.load(Ordering::Relaxed),
            gpu_decode_ns: self.gpu_decode_ns.load(Ordering::Relaxed),
            gpu_decode_wait_ns: self.gpu_decode_wait_ns.load(Ordering::Relaxed),
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
            gpu_wait: view.gpu_wait.map(|w| (w * 10_000.0).round() / 10_000.0),
            busy: view.busy.map(|b| (b * 1000.0).round() / 1000.0),
            step_ms: view.step_ms.map(|s| (s * 100.0).round() / 100.0),
            stage_us: StageTimes {
                read: round(view.stage_us[Stage::Read as usize]),
                decode: round(view.stage_us[Stage::Decode as usize]),
                transform: round(view.stage_us[Stage::Transform as usize]),
                write: round(view.stage_us[Stage::Write as usize]),
            },
            tune: view.tune,
            limit: view.limit,
            gpu_share: self.gpu.map(|_| (self.share() * 1000.0).round() / 1000.0),
            gpu_samples: self.gpu.map(|_| self.gpu_handed.load(Ordering::Relaxed)),
            gpu_decode_us: view.gpu_decode_us.map(round),
            pixel_samples: Some(self.pixel_samples.load(Ordering::Relaxed)).filter(|&n| n > 0),
        }
    }
}

/// Cumulative counters of one stream at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub samples: u64,
    pub stage_ns: [u64; STAGES],
    pub timed: u64,
    /// Thread-time on the stream's jobs ([`Occupancy`]).
    pub busy_ns: u64,
    pub steps: u64,
    /// Time inside the loop's request for a batch, all of it (back-pressure included).
    pub wait_ns: u64,
    pub compute_ns: u64,
    /// Of `wait_ns`, the time behind the loop's own GPU work (1.2; 0 from older clients).
    pub gpu_wait_ns: u64,
    /// Samples the client finished on its GPU, and its host time on them (1.3).
    pub gpu_samples: u64,
    pub gpu_decode_ns: u64,
    /// Of the wait for data (`wait_ns - gpu_wait_ns`), the time the loop waited for its own GPU
    /// decodes (1.5; 0 from older clients).
    pub gpu_decode_wait_ns: u64,
}

impl Counters {
    /// `self - earlier`, per counter.
    pub fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            samples: self.samples.saturating_sub(earlier.samples),
            stage_ns: std::array::from_fn(|i| self.stage_ns[i].saturating_sub(earlier.stage_ns[i])),
            timed: self.timed.saturating_sub(earlier.timed),
            busy_ns: self.busy_ns.saturating_sub(earlier.busy_ns),
            steps: self.steps.saturating_sub(earlier.steps),
            wait_ns: self.wait_ns.saturating_sub(earlier.wait_ns),
            compute_ns: self.compute_ns.saturating_sub(earlier.compute_ns),
            gpu_wait_ns: self.gpu_wait_ns.saturating_sub(earlier.gpu_wait_ns),
            gpu_samples: self.gpu_samples.saturating_sub(earlier.gpu_samples),
            gpu_decode_ns: self.gpu_decode_ns.saturating_sub(earlier.gpu_decode_ns),
            gpu_decode_wait_ns: self.gpu_decode_wait_ns.saturating_sub(earlier.gpu_decode_wait_ns),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn occupancy_counts_running_jobs_up_to_the_moment_asked() {
        let t0 = Instant::now();
        let mut o = Occupancy::new(t0);
        let a = o.start(t0);
        let b = o.start(t0 + ms(10));
        // Mid-job: 30 ms of one and 20 ms of the other so far.
        assert_eq!(o.busy_ns(t0 + ms(30)), 50_000_000);
        o.end(a, t0 + ms(40));
        assert_eq!(o.busy_ns(t0 + ms(40)), 70_000_000);
        o.end(b, t0 + ms(50));
        // Nothing runs: the count stays.
        assert_eq!(o.busy_ns(t0 + ms(500)), 80_000_000);
    }

    #[test]
    fn a_stream_whose_allotted_threads_all_work_reads_fully_busy() {
        // Two threads, each taking one job after another with a 50 µs gap between jobs (the lock,
        // the countdown) that no stage timer covers, for 500 ms; the tuner reads at 250 ms and
        // 500 ms, while jobs are running.
        let s = StreamStats::new(1, 1, "d".into(), 8, 4, true, None, None, 2, 2);
        let t0 = Instant::now();
        *s.occupancy.lock().unwrap() = Occupancy::new(t0);
        let job = Duration::from_micros(1_200);
        let gap = Duration::from_micros(50);
        let mut reads = Vec::new();
        let mut next_read = t0 + ms(250);
        let mut at = [t0, t0 + Duration::from_micros(600)];
        loop {
            let k = if at[0] <= at[1] { 0 } else { 1 };
            let start = at[k];
            if start >= t0 + ms(500) {
                break;
            }
            while next_read <= start + job {
                reads.push(s.counters(next_read));
                next_read += ms(250);
            }
            let t = s.job_started(start);
            s.job_ended(t, start + job);
            s.add_sample_times([0, (job.as_nanos() as u64) / 2, 0, 0]);
            at[k] = start + job + gap;
        }
        let first = reads[0];
        let second = reads[1].since(&first);
        for d in [first, second] {
            let busy = d.busy_ns as f64 / (250e6 * 2.0);
            assert!((busy - 1200.0 / 1250.0).abs() < 0.01, "{busy}");
            // What the stage timers saw is half of it: they are not the busy share.
            let staged = d.stage_ns.iter().sum::<u64>() as f64 / (250e6 * 2.0);
            assert!(staged < 0.55, "{staged}");
        }
    }

    #[test]
    fn the_clients_gpu_wait_stays_within_its_wait() {
        let s = StreamStats::new(1, 1, "d".into(), 8, 4, true, None, None, 2, 2);
        s.add_client_stats(4, 100, 50, None, None);
        assert!(!s.reports_gpu_wait.load(Ordering::Relaxed));
        s.add_client_stats(4, 100, 50, Some(250), None);
        let c = s.counters(Instant::now());
        assert_eq!((c.steps, c.wait_ns, c.compute_ns, c.gpu_wait_ns), (8, 200, 100, 100));
        assert!(s.reports_gpu_wait.load(Ordering::Relaxed));
    }

    #[test]
    fn the_clients_gpu_decode_wait_stays_within_its_wait_for_data() {
        // 1.5: of 100 ns waited, 30 behind the GPU; of the 70 left (the wait for data) at most 70
        // were for GPU decodes, whatever the client says.
        let s = StreamStats::new(1, 1, "d".into(), 8, 4, true, None, None, 2, 2);
        s.add_client_stats(4, 100, 50, Some(30), Some(40));
        assert_eq!(s.counters(Instant::now()).gpu_decode_wait_ns, 40);
        s.add_client_stats(4, 100, 50, Some(30), Some(500));
        assert_eq!(s.counters(Instant::now()).gpu_decode_wait_ns, 110);
        s.add_client_stats(4, 100, 50, None, Some(500));
        assert_eq!(s.counters(Instant::now()).gpu_decode_wait_ns, 210);
    }

    #[test]
    fn the_busy_share_counts_from_the_first_start() {
        let s = StreamStats::new(1, 1, "d".into(), 8, 4, true, None, None, 2, 2);
        let t0 = Instant::now();
        assert_eq!(s.active_for(t0), Duration::ZERO);
        s.started(t0);
        s.started(t0 + ms(100)); // a later `start` does not move it
        assert_eq!(s.active_for(t0 + ms(300)), ms(300));
    }
}
