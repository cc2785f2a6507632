//! The autotuner (control.md, "Autotuning"): every interval it sets each stream's decode threads
//! and prefetch depth from what the training loop measured.
//!
//! The controller is a pure function of its observations and its own state, so it is tested
//! against a simulated clock and a simulated pipeline (see the tests). [`run`] is the thin tokio
//! task that feeds it the server's counters and applies its decisions.
//!
//! The signals, per stream and interval ([`Signals`]):
//! - **wait**: the share of the training loop's time spent waiting for *data* inside `next()`: the
//!   client's whole time in `next()` less the part it reports as spent behind its own GPU work
//!   (`gpu_wait_ns`, protocol 1.2: the copy's event queued behind the model's kernels, a launch
//!   that blocks on a full queue). A GPU-bound loop's `next()` is mostly such back-pressure; more
//!   threads or depth would not shorten it, so the tuner never acts on it. It is reported apart
//!   (**gpu_wait**).
//! - **busy**: the thread-time the pool spent on the stream's jobs (from the moment a thread takes
//!   a job to the moment it is done with it, [`crate::stats::Occupancy`]) over the threads
//!   allotted times the interval, so a stream whose allotted threads all work reads 100 %. (It
//!   used to be the sum of the per-sample stage timers, which leave out everything around them,
//!   and its reason was kept from the interval that made it, e.g. a stream's first, when the
//!   threads had idled until the client's first `start`; see [`Limit`].)
//!
//! Every interval the signals are read as one [`Limit`] (what limits the loop now: nothing, the
//! threads, the CPU budget, the client's GPU decoder, depth, latency), which each knob's rule acts on and which observers see
//! (`snapshot`'s `limit`), so the last change's reason (`tune`) is never the only account.
//!
//! How it decides, per stream:
//! - **Model.** The client's step time `C` (its compute between batches plus the time it waited
//!   behind its own GPU: everything but the wait for data) and the batch size `B` give the rate
//!   the training loop consumes at when it never waits for data, `B / C` samples/s. The pool's
//!   measured cost per sample `c` (thread time) gives the threads that rate needs: `B c / C`. The
//!   stream wants that times [`Config::headroom`], rounded up.
//! - **Wait floor.** A loop's wait inside `next()` never reaches zero: it includes the loop's own
//!   cost of taking a batch (receiving the message, making the views, a GPU loop's wait for its
//!   copy's event), about 0.1 % of the step for a CPU loop and 1.2–1.4 % for ResNet-50 on an
//!   H200. The controller learns it per stream as the lowest smoothed wait of the regime over
//!   intervals in which the feedback below would change nothing (threads not saturated, and depth
//!   full or the wait under [`Config::wait_high`]), outside probes and under
//!   [`Config::floor_max`]; it is forgotten when the step time moves by more than 20 %. "Fed" and
//!   "waiting" are measured from it ([`Bands`]).
//! - **Feedback.** Models are wrong in small ways (contention between threads, a step time that
//!   hides a synchronisation). If the loop still waits (more than [`Bands::waiting`]) while the
//!   stream has what the model wants, the stream gets one thread more when its threads are
//!   saturated, else one batch more of depth (the wait comes from bursts, not from the rate).
//!   With idle threads and every slot in flight the wait is latency (an epoch's first batch, a
//!   client holding its slots), and nothing changes. The extra threads are shed one at a time
//!   after [`Config::calm_intervals`] intervals fed (under [`Bands::fed`]).
//! - **Hysteresis.** Growing is immediate; shrinking waits until the model has asked for fewer
//!   threads for [`Config::shrink_intervals`] intervals in a row, and then gives back at most a
//!   quarter of the threads per interval.
//! - **Probing (hill-climbing down).** With the loop fed and nothing changed for
//!   [`Config::probe_after`] intervals, one thread fewer is tried for [`Config::probe_intervals`];
//!   kept if the loop does not wait (the model's estimate is corrected by one), undone at once if
//!   one interval's wait is above [`Bands::waiting`], and then not tried again (`floor`) until
//!   the step time moves by more than 20 %.
//! - **Budget.** Pinned streams (`autotune: false`) get what they asked for. The others share the
//!   rest of the CPU budget; when their wants exceed it, in proportion to their wants, and the
//!   threads left over by rounding go to the streams that wait most.
//!
//! - **GPU share (hybrid decode, 1.3).** For a stream whose client finishes part of each batch on
//!   its GPU with the share left to the tuner, [`gpu_share`] raises the share on [`Limit::Cpu`]
//!   (the loop waits for data with every thread of its cap saturated), by at most
//!   [`Config::gpu_max_raise`] a change, and, once the loop has not waited for
//!   [`Config::probe_after`] intervals, tries one [`Config::gpu_step`] less. On
//!   [`Limit::GpuDecode`] (1.5: more than half of the loop's wait for data is for its own GPU
//!   decodes) it never raises, and with threads to spare tries one step less at once. Each change
//!   is judged by the loop's time per batch (its step plus its wait for data): a raise after which
//!   a batch takes more than [`Config::gpu_slowdown`] longer is undone, and not tried again in the
//!   regime (GPU decode competes with the model for the GPU and the host thread, and that can cost
//!   more than the wait it saves); a lower share after which a batch takes more than
//!   [`Config::gpu_probe_tolerance`] longer is undone, and not tried again; one that is kept sets a
//!   ceiling at the share it left (whether or not the CPU is now the limit: a CPU-limited batch can
//!   still be the faster one). A regime is the loop's step at the share the tuner settled on
//!   after learning a bound: back at that share with a step more than 20 % away, the bounds are
//!   dropped and the share is searched again. It is carried in [`Decision::gpu_share`] like `depth`.
//!
//! - **Downloads at once (remote datasets).** Server-wide, not per stream: [`FetchTuner`] raises
//!   the number of shard downloads at once while a loop waits for data and the decoders wait for
//!   saturated download slots, and lowers it when every loop is fed with slots to spare, within
//!   what the shard cache's bound holds; `--fetch-concurrency` pins it ([`Target::fetches`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::stats::{Counters, STAGES, StreamStats};

/// The controller's constants.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Threads wanted per thread the model says are needed.
    pub headroom: f64,
    /// A wait share above this is "waiting", whatever the loop's floor (see [`Bands`]).
    pub wait_high: f64,
    /// A wait share below this is "not waiting" ("fed"), whatever the loop's floor.
    pub wait_low: f64,
    /// The least tolerance above the learned wait floor, as a share of step time (see [`Bands`]).
    pub floor_margin: f64,
    /// The tolerance above the learned wait floor, relative to the floor: the floor's own jitter.
    pub floor_jitter: f64,
    /// A wait above this is never learned as the loop's floor.
    pub floor_max: f64,
    /// Intervals without waiting before an extra thread is shed.
    pub calm_intervals: u32,
    /// Intervals the model must ask for fewer threads before any are given back.
    pub shrink_intervals: u32,
    /// Threads busier than this share of their time are saturated.
    pub saturated: f64,
    /// Weight of the newest interval in the moving averages.
    pub alpha: f64,
    /// Threads of need below the current setting before any are given back.
    pub band: f64,
    /// Intervals without change and without waiting before one thread fewer is tried.
    pub probe_after: u32,
    /// Intervals a probe is watched before it is accepted.
    pub probe_intervals: u32,
    /// How much the GPU share moves per change (hybrid decode).
    pub gpu_step: f64,
    /// The most one raise of the GPU share adds (the cost model's jump included).
    pub gpu_max_raise: f64,
    /// A raise of the share after which the loop's time per batch (step and wait) is this much
    /// longer than before it is undone (GPU decode slowed the model more than it fed it), and the
    /// share stays below that for the regime.
    pub gpu_slowdown: f64,
    /// A lower share after which a batch takes this much longer than before is undone, and the
    /// share is not lowered below it again in the regime.
    pub gpu_probe_tolerance: f64,
    /// Intervals after a change of the share before the next (its effect takes an interval to
    /// show in the wait and the step).
    pub gpu_hold: u32,
    /// Readers' wait for downloads (a share of the interval, summed over readers) above which,
    /// with a loop waiting for data, the downloads are the limit ([`FetchTuner`]).
    pub fetch_wait_high: f64,
    /// Readers' wait for downloads below which a fed server may have fewer downloads at once.
    pub fetch_wait_low: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            headroom: 1.05,
            wait_high: 0.015,
            wait_low: 0.01,
            floor_margin: 0.0025,
            floor_jitter: 0.2,
            floor_max: 0.05,
            calm_intervals: 4,
            shrink_intervals: 3,
            saturated: 0.85,
            alpha: 0.5,
            band: 0.3,
            probe_after: 6,
            probe_intervals: 4,
            gpu_step: 0.125,
            gpu_max_raise: 0.25,
            gpu_slowdown: 0.05,
            gpu_probe_tolerance: 0.02,
            gpu_hold: 2,
            fetch_wait_high: 0.05,
            fetch_wait_low: 0.01,
        }
    }
}

/// The wait shares that count as "fed" and as "waiting" for a loop whose own wait floor is
/// `floor` (None: not learned yet, taken as 0).
///
/// With `m = max(floor_margin, floor_jitter × floor)` (0.25 points, or a fifth of the floor when
/// that is more: the H200's ResNet-50 floor reads 1.2–1.4 %, and the learned floor is the low
/// end), the loop is fed below `max(wait_low, floor + m)` and waiting above
/// `max(wait_high, floor + 2m)`. A CPU loop (floor ≈ 0.1 %) keeps 1 % and 1.5 %; a loop whose
/// floor is 1.3 % is fed under 1.56 % and waiting over 1.82 %, so a probe that takes it from
/// 1.3 % to 1.9 % (0.6 points of real starvation) is undone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bands {
    pub fed: f64,
    pub waiting: f64,
}

impl Config {
    pub fn bands(&self, floor: Option<f64>) -> Bands {
        let floor = floor.unwrap_or(0.0).max(0.0);
        let m = self.floor_margin.max(self.floor_jitter * floor);
        Bands {
            fed: self.wait_low.max(floor + m),
            waiting: self.wait_high.max(floor + 2.0 * m),
        }
    }
}

/// What one stream did over one interval.
#[derive(Debug, Clone)]
pub struct Observation {
    pub id: u64,
    pub autotune: bool,
    /// The client's bound on threads (autotune) or its pinned value.
    pub max_threads: Option<u32>,
    /// The threads the stream's kind starts with (None: the budget): kept until the client
    /// reports its loop.
    pub start_threads: Option<u32>,
    pub batch_size: u32,
    pub slots: u32,
    /// Settings in force over the interval.
    pub threads: u32,
    pub depth: u32,
    /// Counter differences over the interval.
    pub delta: Counters,
    /// Whether the client has ever sent `stats`.
    pub reported: bool,
    /// Whether the client reports its wait behind its GPU (`gpu_wait_ns`, 1.2 in CUDA mode).
    pub reports_gpu_wait: bool,
    /// How much of the interval the stream had work (it begins at the client's first `start`);
    /// None: all of it.
    pub active: Option<Duration>,
    /// Hybrid decode (1.3): how the share is set and its value now; None without `gpu_decode`.
    pub gpu: Option<(crate::stats::GpuMode, f64)>,
    /// 1.11: whether the stream's decoded pixels are on now, for a stream whose client asked for
    /// them and whose share the tuner sets; None otherwise.
    pub pixels: Option<bool>,
}

/// A stream's new settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub id: u64,
    pub threads: u32,
    pub depth: u32,
    /// Why, when something changed.
    pub reason: Option<String>,
    /// The interval's share of the loop's time waiting for data, net of back-pressure (None
    /// without `stats` in the interval).
    pub wait: Option<f64>,
    /// The interval's share of the loop's time waiting behind its own GPU (None: not reported).
    pub gpu_wait: Option<f64>,
    /// The interval's busy share of the stream's allotted threads.
    pub busy: Option<f64>,
    /// The moving average of the loop's step time (everything but its wait for data), in ms.
    pub step_ms: Option<f64>,
    /// What limits the loop over the interval, in words (control.md, `snapshot`'s `limit`).
    pub limit: String,
    /// The same reading, as the rules act on it.
    pub kind: Limit,
    /// The share of each batch to offer the client's GPU from now on, when the tuner sets it.
    pub gpu_share: Option<f64>,
    /// 1.11: whether the samples the server decodes go to the client as pixels from now on, for
    /// a stream with [`Observation::pixels`].
    pub pixels: Option<bool>,
}

/// One interval's measurements of a stream, as the rules read them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Signals {
    /// Share of the loop's time spent waiting for data (net of back-pressure).
    pub wait: Option<f64>,
    /// Share of the loop's time spent waiting behind its own GPU work (None: not reported).
    pub gpu_wait: Option<f64>,
    /// Of `wait`, the share of the loop's time spent waiting for its own GPU decodes (1.5,
    /// `gpu_decode_wait_ns`; None: none reported, from an older client or none waited).
    pub decode_wait: Option<f64>,
    /// Share of the allotted threads' time spent on the stream's jobs.
    pub busy: f64,
    /// Threads allotted over the interval.
    pub threads: u32,
}

impl Signals {
    /// From one interval's counters: `threads` allotted over `interval_ns`.
    pub fn of(d: &Counters, threads: u32, interval_ns: f64, reports_gpu_wait: bool) -> Self {
        let total = d.wait_ns + d.compute_ns;
        let share = |ns: u64| (d.steps > 0 && total > 0).then(|| ns as f64 / total as f64);
        Signals {
            wait: share(d.wait_ns - d.gpu_wait_ns.min(d.wait_ns)),
            gpu_wait: share(d.gpu_wait_ns).filter(|_| reports_gpu_wait),
            decode_wait: share(d.gpu_decode_wait_ns).filter(|_| d.gpu_decode_wait_ns > 0),
            busy: d.busy_ns as f64 / (interval_ns * f64::from(threads.max(1))),
            threads,
        }
    }

    /// Whether the interval's wait for data was mostly (more than half) for the loop's own GPU
    /// decodes: the GPU decoder, not the CPU, is what the loop waits for.
    pub fn gpu_decoder_limits(&self) -> bool {
        matches!((self.decode_wait, self.wait), (Some(d), Some(w)) if d > 0.5 * w)
    }

    /// "the training loop waits for data 63.2% of its time; its 15 decode threads are 98% busy",
    /// with `wait` the (smoothed) wait share the rule acted on: who waits, for what, and what the
    /// threads did meanwhile.
    pub fn reading(&self, wait: f64) -> String {
        let gpu = match self.gpu_wait {
            Some(g) => format!(" (and {:.1}% behind its own GPU work)", g * 100.0),
            None => String::new(),
        };
        let decodes = match self.decode_wait {
            Some(d) => format!(", {:.1}% of it for its GPU decodes", d * 100.0),
            None => String::new(),
        };
        format!(
            "the training loop waits for data {:.1}% of its time{decodes}{gpu}; its {} decode thread{} {} {:.0}% busy",
            wait * 100.0,
            self.threads,
            if self.threads == 1 { "" } else { "s" },
            if self.threads == 1 { "is" } else { "are" },
            self.busy * 100.0
        )
    }
}

/// What limits a stream's training loop over one interval: the tuner's reading of [`Signals`],
/// which every knob's rule acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The client sends no `stats`: nothing to read.
    Unmeasured,
    /// The client reports, but no step of its loop ended in the interval (a long step, a pause).
    NoStep,
    /// The stream's first interval of work (its first `start`), or no sample or step measured
    /// yet: nothing to act on.
    Starting,
    /// The loop does not wait for data beyond its floor: the model (or the GPU) is the limit.
    Fed,
    /// Between "fed" and "waiting": nothing is changed.
    Near,
    /// The loop waits for data and the stream's threads are saturated, below its cap: one thread
    /// more.
    Threads,
    /// The loop waits for data and every thread the stream may have (its cap: the CPU budget or
    /// the client's `threads`) is saturated: the CPU is the limit. (GPU decode's knob acts here.)
    Cpu,
    /// The loop waits for data, and more than half of that wait is for its own GPU decodes (1.5):
    /// the GPU decoder is the limit. Neither threads nor depth are added, the share is never
    /// raised, and while the threads have time to spare one step less is tried.
    GpuDecode,
    /// The loop waits for data while threads idle and depth is left: bursts; one batch more.
    Depth,
    /// The loop waits for data while threads idle and every slot is in flight: latency (an
    /// epoch's first batch, a client holding its slots); nothing helps.
    Latency,
}

impl Limit {
    /// The reading in words: what limits the loop, and on what evidence.
    pub fn describe(self, s: &Signals, wait: f64, cap: u32) -> String {
        let reading = s.reading(wait);
        match self {
            Limit::Unmeasured => "the client sends no stats: the training loop's wait is not known".into(),
            Limit::NoStep => format!(
                "no step of the training loop ended in this interval (a long step, or a pause); its {} decode thread{} {:.0}% busy",
                s.threads,
                if s.threads == 1 { " was" } else { "s were" },
                s.busy * 100.0
            ),
            Limit::Starting => format!(
                "starting, too early to act on (the stream's first batches): {}",
                s.reading(s.wait.unwrap_or(0.0))
            ),
            Limit::Fed => match s.gpu_wait {
                Some(g) if g > wait => format!("fed, the GPU is the limit: {reading}"),
                _ => format!("fed: {reading}"),
            },
            Limit::Near => format!("nearly fed: {reading}"),
            Limit::Threads => format!("the decode threads are the limit: {reading}"),
            Limit::Cpu => format!("the CPU is the limit ({cap} decode threads at most): {reading}"),
            Limit::GpuDecode => format!("the GPU decoder is the limit: {reading}"),
            Limit::Depth => format!("bursts: {reading}"),
            Limit::Latency => format!("latency, every slot in flight: {reading}"),
        }
    }
}

#[derive(Debug, Default, Clone)]
struct StreamState {
    cost_ns: Option<f64>,
    step_ns: Option<f64>,
    /// Moving average of the wait share: one interval's spike (an epoch's first batch, a
    /// checkpoint) does not buy a thread.
    wait: Option<f64>,
    /// Threads added (feedback) or taken (successful probes) on top of the model's estimate.
    extra: i32,
    calm: u32,
    shrink: u32,
    /// Intervals without any change.
    stable: u32,
    /// A probe of one thread fewer in progress.
    probe: Option<Probe>,
    /// A probe (or the feedback, adding a thread) found this many threads too few: neither a
    /// probe nor shedding goes below `floor + 1` in this regime.
    floor: u32,
    /// The loop's step time when the probes' corrections were learned.
    regime_step: Option<f64>,
    /// The lowest smoothed wait seen with threads and depth not the limit: the loop's own floor.
    wait_floor: Option<f64>,
    /// The loop's step time when `wait_floor` was first learned.
    floor_step: Option<f64>,
    /// Whether an interval with steps has been seen (the first one holds the run's first batch).
    stepped: bool,
    /// Moving average of the loop's time per batch: its step and its wait for data, everything
    /// a batch costs it (what a change of the GPU share is judged by).
    cycle_ns: Option<f64>,
    /// The last interval's time per batch (None: no step ended in it).
    last_cycle_ns: Option<f64>,
    /// Hybrid decode: the change of the share being judged.
    gpu_trial: Option<GpuTrial>,
    /// A share never raised to again in this regime: one that made a batch slower than the one
    /// below it, or one a probe left without a batch getting slower.
    gpu_ceiling: Option<f64>,
    /// A share the one below which made a batch slower: never lowered below it again in this
    /// regime.
    gpu_floor: Option<f64>,
    /// Intervals the share has stayed as it is with the loop not waiting for data.
    gpu_stable: u32,
    /// Changes of the share judged so far.
    gpu_judged: u32,
    /// Intervals to wait before the share may change again.
    gpu_hold: u32,
    /// The share and the loop's step (ns) where the tuner first settled after learning
    /// `gpu_ceiling` or `gpu_floor`: back at that share with a step more than 20 % away, the
    /// model's regime changed, and the bounds are dropped.
    gpu_bounds_at: Option<(f64, f64)>,
    /// 1.11: decoded pixels on (the tuner's setting; off until the CPU is the limit with the
    /// share at its top).
    pixels: bool,
    /// Turning pixels on made a batch slower: not tried again in this regime.
    pixels_never: bool,
    /// Turning pixels off made a batch slower: kept on in this regime.
    pixels_kept: bool,
}

impl StreamState {
    /// A change of the share away from `from` begins (a raise, else a lower share tried), judged
    /// against `before_ns` once its effect shows; no other change for [`Config::gpu_hold`]
    /// intervals.
    fn start_gpu_trial(&mut self, cfg: &Config, from: f64, before_ns: f64, raise: bool) {
        self.gpu_trial = Some(GpuTrial {
            from,
            pixels: false,
            before_ns,
            raise,
            seen: 0,
            after_ns: None,
        });
        self.gpu_hold = cfg.gpu_hold;
    }

    /// 1.11: decoded pixels turned on (`on`) or off at share `share`, judged as a share's raise
    /// (on) or probe (off) is. Returns the share (unchanged) and why.
    fn switch_pixels(&mut self, cfg: &Config, share: f64, before_ns: f64, on: bool, why: String) -> (f64, String) {
        self.start_gpu_trial(cfg, share, before_ns, on);
        if let Some(t) = self.gpu_trial.as_mut() {
            t.pixels = true;
        }
        self.pixels = on;
        let what = if on {
            "the samples the server decodes go to the client's GPU as pixels (it finishes them)"
        } else {
            "the server finishes the samples it decodes again (decoded pixels off)"
        };
        (share, format!("{why}: {what}"))
    }
}

/// A change of the GPU share, judged once its effect shows.
#[derive(Debug, Clone, Copy)]
struct GpuTrial {
    /// The share before the change: where an undone change goes back to.
    from: f64,
    /// 1.11: the change is of decoded pixels (on when `raise`, else off), not of the share.
    pixels: bool,
    /// The loop's time per batch before it.
    before_ns: f64,
    /// A raise (the CPU was the limit), else a lower share tried.
    raise: bool,
    /// Intervals since the change.
    seen: u32,
    /// The least time per batch of an interval since the change, the first interval after it
    /// left out (batches already in flight were split at the old share). The least, so that one
    /// slow interval (a kernel compiled on first use, a checkpoint) does not undo a change.
    after_ns: Option<f64>,
}

#[derive(Debug, Clone, Copy)]
struct Probe {
    /// The setting before the probe.
    from: u32,
    /// Intervals left to watch.
    left: u32,
}

/// The controller.
#[derive(Debug, Default)]
pub struct Tuner {
    config: Config,
    streams: BTreeMap<u64, StreamState>,
}

fn ewma(old: Option<f64>, new: f64, alpha: f64) -> f64 {
    match old {
        Some(o) => o + alpha * (new - o),
        None => new,
    }
}

impl Tuner {
    pub fn new(config: Config) -> Self {
        Tuner {
            config,
            streams: BTreeMap::new(),
        }
    }

    /// One interval: `budget` threads for all streams, `pool` the most threads that exist.
    pub fn tick(&mut self, interval: Duration, budget: u32, pool: u32, obs: &[Observation]) -> Vec<Decision> {
        let cfg = self.config;
        self.streams.retain(|id, _| obs.iter().any(|o| o.id == *id));
        let interval_ns = interval.as_nanos().max(1) as f64;
        let pinned: u32 = obs
            .iter()
            .filter(|o| !o.autotune)
            .map(|o| o.max_threads.unwrap_or(pool).clamp(1, pool))
            .sum();
        let free = budget.min(pool).saturating_sub(pinned).max(1);

        // Each stream's want, before the budget.
        let mut wants: Vec<Want> = obs
            .iter()
            .map(|o| {
                let st = self.streams.entry(o.id).or_default();
                let m = Measured::update(&cfg, st, o, interval_ns);
                if o.autotune {
                    auto_want(&cfg, st, o, &m, free)
                } else {
                    pinned_want(&cfg, st, o, &m, pool)
                }
            })
            .collect();
        share_budget(&mut wants, obs, free);
        let shares: Vec<Option<(f64, String)>> = obs
            .iter()
            .zip(&wants)
            .map(|(o, w)| {
                let st = self.streams.get_mut(&o.id).expect("every observed stream has a state");
                gpu_share(&cfg, st, o, w.kind, &w.signals)
            })
            .collect();
        obs.iter()
            .zip(wants)
            .zip(shares)
            .map(|((o, w), share)| Decision {
                id: o.id,
                threads: w.want,
                depth: w.depth,
                gpu_share: share.as_ref().map(|(s, _)| *s),
                pixels: o.pixels.map(|_| self.streams.get(&o.id).is_some_and(|s| s.pixels)),
                reason: match (w.reason, share) {
                    (Some(r), Some((_, g))) => Some(format!("{r}; {g}")),
                    (r, g) => r.or(g.map(|(_, g)| g)),
                },
                wait: w.signals.wait,
                gpu_wait: w.signals.gpu_wait,
                busy: Some(w.signals.busy),
                step_ms: self.streams.get(&o.id).and_then(|s| s.step_ns).map(|s| s / 1e6),
                limit: w.limit,
                kind: w.kind,
            })
            .collect()
    }
}

/// One stream's want for the interval, before the budget is shared.
struct Want {
    want: u32,
    depth: u32,
    signals: Signals,
    reason: Option<String>,
    limit: String,
    kind: Limit,
}

/// What one interval's counters say about a stream, once its state has learned from them.
struct Measured {
    /// The interval of the first `start` or the first with steps: its wait is reported, but
    /// neither learned from nor acted on.
    first: bool,
    signals: Signals,
    /// The interval's wait for data, unless `first`.
    wait: Option<f64>,
    /// The smoothed wait, in intervals that have one.
    smoothed: Option<f64>,
}

impl Measured {
    /// Reads the interval's counters and updates the stream's learned costs (thread time per
    /// sample, the loop's own step, its cycle, its smoothed wait).
    fn update(cfg: &Config, st: &mut StreamState, o: &Observation, interval_ns: f64) -> Self {
        let d = &o.delta;
        // The interval of the first `start` (the threads idled before it for want of any work:
        // the busy share counts from it) and the first with steps (the loop's wait in it is
        // its first batch's latency): its wait is reported, but neither learned from nor acted
        // on.
        // (A stream that never started has no work to measure its threads against.)
        let active_ns = match o.active {
            Some(a) if !a.is_zero() => (a.as_nanos() as f64).min(interval_ns),
            _ => interval_ns,
        };
        let first = active_ns < interval_ns || (d.steps > 0 && !st.stepped);
        st.stepped |= d.steps > 0;
        let signals = Signals::of(d, o.threads, active_ns.max(1.0), o.reports_gpu_wait);
        let wait = signals.wait.filter(|_| !first);
        if d.timed > 0 {
            // Thread time per sample: what a sample costs the pool, overheads included (the
            // stage timers alone leave some out; they are for the breakdown only).
            let spent = if d.busy_ns > 0 {
                d.busy_ns
            } else {
                d.stage_ns.iter().sum::<u64>()
            };
            st.cost_ns = Some(ewma(st.cost_ns, spent as f64 / d.timed as f64, cfg.alpha));
        }
        // (A first interval whose only step is the first, which has no compute, says nothing
        // about the step.)
        if d.steps > 0 && (!first || d.compute_ns > 0) {
            // The loop's own step: its compute and its wait behind its GPU, which more data
            // would not shorten (the rate it can consume at is B / this).
            let own = (d.compute_ns + d.gpu_wait_ns.min(d.wait_ns)) as f64 / d.steps as f64;
            st.step_ns = Some(ewma(st.step_ns, own, cfg.alpha));
        }
        st.last_cycle_ns = None;
        if d.steps > 0 && !first {
            let cycle = (d.compute_ns + d.wait_ns) as f64 / d.steps as f64;
            st.cycle_ns = Some(ewma(st.cycle_ns, cycle, cfg.alpha));
            st.last_cycle_ns = Some(cycle);
        }
        if let Some(w) = wait {
            st.wait = Some(ewma(st.wait, w, cfg.alpha));
        }
        let smoothed = wait.and(st.wait);
        Measured {
            first,
            signals,
            wait,
            smoothed,
        }
    }
}

/// A stream whose client pinned its threads: they stay; the limit is still named.
fn pinned_want(cfg: &Config, st: &StreamState, o: &Observation, m: &Measured, pool: u32) -> Want {
    let (signals, smoothed) = (m.signals, m.smoothed);
    let threads = o.max_threads.unwrap_or(pool).clamp(1, pool);
    let bands = cfg.bands(st.wait_floor);
    let limit = match smoothed {
        None if o.reported => Limit::NoStep,
        None => Limit::Unmeasured,
        Some(w) if w > bands.waiting => {
            if signals.gpu_decoder_limits() {
                Limit::GpuDecode
            } else if signals.busy >= cfg.saturated {
                Limit::Cpu
            } else if o.depth < o.slots {
                Limit::Depth
            } else {
                Limit::Latency
            }
        }
        Some(w) if w < bands.fed => Limit::Fed,
        Some(_) => Limit::Near,
    };
    Want {
        want: threads,
        depth: o.depth,
        signals,
        reason: (threads != o.threads).then(|| format!("pinned by the client: {threads} decode threads")),
        limit: format!(
            "{} (pinned by the client)",
            limit.describe(&signals, smoothed.unwrap_or(0.0), threads)
        ),
        kind: limit,
    }
}

/// What an autotuned stream's decision carries besides its threads.
struct Outcome {
    depth: u32,
    reason: Option<String>,
    limit: Limit,
}

/// An autotuned stream: at most `free` threads (the budget less the pinned streams').
fn auto_want(cfg: &Config, st: &mut StreamState, o: &Observation, m: &Measured, free: u32) -> Want {
    let cap = o.max_threads.unwrap_or(u32::MAX).clamp(1, free);
    let mut out = Outcome {
        depth: o.depth,
        reason: None,
        limit: Limit::Unmeasured,
    };
    let want = match (o.reported, st.cost_ns, st.step_ns) {
        (false, _, _) => match o.start_threads {
            // A kind that starts small (tokens: reading, not decoding) stays there until
            // the loop says it waits.
            Some(start) => start.min(cap),
            None => {
                if o.threads != cap {
                    out.reason = Some(format!(
                        "the client sends no stats: all {cap} decode threads of the budget"
                    ));
                }
                cap
            }
        },
        (true, Some(cost), Some(step)) => model_want(cfg, st, o, m, cap, (cost, step), &mut out),
        // Reported, but no sample or step measured yet: keep what it has.
        (true, _, _) => {
            out.limit = Limit::Starting;
            o.threads.clamp(1, cap)
        }
    };
    if m.first && o.reported {
        out.limit = Limit::Starting;
    } else if out.limit == Limit::Unmeasured && o.reported && o.delta.steps == 0 {
        out.limit = Limit::NoStep;
    }
    let kind = out.limit;
    let limit = kind.describe(&m.signals, st.wait.or(m.signals.wait).unwrap_or(0.0), cap);
    Want {
        want,
        depth: out.depth.min(o.slots).max(1),
        signals: m.signals,
        reason: out.reason,
        limit,
        kind,
    }
}

/// The model's want for a stream with a measured cost per sample and step: the threads the
/// rate needs, corrected by the feedback ([`decide`]) or by a running probe, then probed one
/// thread lower once the loop has been fed for a while.
fn model_want(
    cfg: &Config,
    st: &mut StreamState,
    o: &Observation,
    m: &Measured,
    cap: u32,
    (cost, step): (f64, f64),
    out: &mut Outcome,
) -> u32 {
    let (signals, smoothed) = (&m.signals, m.smoothed);
    let busy = signals.busy;
    let need = f64::from(o.batch_size) * cost / step.max(1.0);
    // A new regime (the loop's step changed by more than 20 % since the probes
    // learned their correction) makes the model the authority again.
    if st.regime_step.is_some_and(|s| (step / s - 1.0).abs() > 0.2) {
        st.extra = 0;
        st.floor = 0;
        st.regime_step = None;
        st.probe = None;
    }
    // The wait floor is a share of the step: it belongs to the step's regime too.
    if st.floor_step.is_some_and(|s| (step / s - 1.0).abs() > 0.2) {
        st.wait_floor = None;
        st.floor_step = None;
    }
    // Learn it only from intervals the feedback would do nothing about: threads
    // with time to spare (not starved of threads), and depth full or the wait too
    // small for one batch more (not starved of depth); never during a probe.
    if let Some(s) = smoothed
        && st.probe.is_none()
        && busy < cfg.saturated
        && s < cfg.floor_max
        && (o.depth >= o.slots || s <= cfg.wait_high)
    {
        st.wait_floor = Some(st.wait_floor.map_or(s, |f| f.min(s)));
        st.floor_step.get_or_insert(step);
    }
    let bands = cfg.bands(st.wait_floor);
    let base = ((need * cfg.headroom + f64::from(st.extra)).ceil().max(1.0)) as u32;
    out.limit = limit_of(cfg, o, signals, smoothed, bands, cap, base);
    let want = if let Some(probe) = st.probe {
        probe_step(st, o, probe, m.wait, bands, &mut out.reason)
    } else {
        decide(
            cfg,
            st,
            o,
            cap,
            need,
            cost,
            step,
            signals,
            out.limit,
            smoothed,
            &mut out.depth,
            &mut out.reason,
        )
    };
    // Hill-climb down: with the loop fed and nothing changing for a while, try
    // one thread fewer than the model's estimate (which carries headroom).
    let fed = smoothed.is_some_and(|w| w < bands.fed);
    if want == o.threads && st.probe.is_none() && out.reason.is_none() {
        st.stable += 1;
        if fed && st.stable >= cfg.probe_after && o.threads > 1 && o.threads > st.floor + 1 {
            st.stable = 0;
            st.regime_step.get_or_insert(step);
            st.probe = Some(Probe {
                from: o.threads,
                left: cfg.probe_intervals,
            });
            out.reason = Some(format!(
                "probe: the training loop has not waited for data for {} intervals: trying one decode thread fewer ({} → {})",
                cfg.probe_after,
                o.threads,
                o.threads - 1
            ));
            o.threads - 1
        } else {
            want
        }
    } else {
        st.stable = 0;
        want
    }
}

/// One interval of a running probe (one thread fewer): back to where it came from if the loop
/// waited, else one interval closer to keeping the lower setting.
fn probe_step(
    st: &mut StreamState,
    o: &Observation,
    mut probe: Probe,
    wait: Option<f64>,
    bands: Bands,
    reason: &mut Option<String>,
) -> u32 {
    match wait {
        Some(w) if w > bands.waiting => {
            // One thread fewer is too few: back, and never below again in
            // this regime.
            st.probe = None;
            st.floor = o.threads;
            // The probe's own wait must not read as a need for more.
            st.wait = None;
            *reason = Some(format!(
                "probe: with {} decode threads the training loop waited for data {:.1}% of its time (its floor {:.1}%): back to {}",
                o.threads,
                w * 100.0,
                st.wait_floor.unwrap_or(0.0) * 100.0,
                probe.from
            ));
            probe.from
        }
        _ => {
            probe.left -= 1;
            st.probe = Some(probe);
            if probe.left == 0 {
                st.probe = None;
                st.extra -= 1;
                *reason = Some(format!(
                    "probe: {} decode threads keep the training loop fed",
                    o.threads
                ));
            }
            o.threads
        }
    }
}

/// Shares `free` threads among the autotuned streams when they want more in all: in proportion
/// to their wants, the rest one by one to the streams that wait most.
fn share_budget(wants: &mut [Want], obs: &[Observation], free: u32) {
    let auto: Vec<usize> = (0..obs.len()).filter(|&i| obs[i].autotune).collect();
    let total: u32 = auto.iter().map(|&i| wants[i].want).sum();
    if total <= free {
        return;
    }
    let mut given = 0;
    for &i in &auto {
        let share = ((u64::from(free) * u64::from(wants[i].want)) / u64::from(total)) as u32;
        wants[i].want = share.max(1);
        given += wants[i].want;
    }
    let mut by_wait = auto.clone();
    by_wait.sort_by(|&a, &b| {
        let (wa, wb) = (
            wants[a].signals.wait.unwrap_or(1.0),
            wants[b].signals.wait.unwrap_or(1.0),
        );
        wb.total_cmp(&wa).then(a.cmp(&b))
    });
    for &i in by_wait.iter().cycle().take(free.saturating_sub(given) as usize) {
        wants[i].want += 1;
    }
    for &i in &auto {
        if wants[i].want != obs[i].threads && wants[i].reason.is_none() {
            wants[i].reason = Some(format!(
                "{} streams want {total} decode threads, the budget is {free}: {} → {}",
                auto.len(),
                obs[i].threads,
                wants[i].want
            ));
        }
    }
}

/// What the server's remote downloads did over one interval, for [`FetchTuner`].
#[derive(Debug, Clone, PartialEq)]
pub struct FetchObservation {
    /// Downloads allowed at once over the interval.
    pub concurrency: usize,
    /// The most the cache's bound leaves room for.
    pub max: usize,
    /// Time the stream's readers (decode threads) spent waiting for downloads over the interval,
    /// summed over readers, as a share of the interval (0.5: half a thread's time).
    pub fetch_wait: f64,
    /// The share of the download slots' time (`concurrency` × the interval) spent downloading.
    pub fetch_busy: f64,
    /// Every stream's reading of the interval ([`Decision::kind`]).
    pub limits: Vec<Limit>,
}

/// The fetch knob (docs/remote.md, "How many downloads at once"): how many shard downloads run at once, over every
/// stream of the server. It acts on the same wait signal as the threads and depth:
/// - **Raise** by one, up to [`FetchObservation::max`], when some stream's training loop waits
///   for data (its limit is the threads, the CPU, bursts or latency), its readers waited for
///   downloads more than [`Config::fetch_wait_high`] of the interval, and the download slots are
///   saturated (busy more than [`Config::saturated`]): the downloads are the limit.
/// - **Lower** by one, down to 1, after [`Config::calm_intervals`] intervals in a row in which
///   every stream is fed, readers waited for downloads less than [`Config::fetch_wait_low`], and
///   one slot fewer would have done the interval's downloads below saturation: fewer requests at
///   once for the store, and less of the cache held by downloads. (So a setting the cold epoch
///   needs is kept while it is used, and given back when the data is cached.)
///
/// A setting above `max` (the cache's bound shrank relative to the shards) comes down to it.
#[derive(Debug, Default, Clone)]
pub struct FetchTuner {
    calm: u32,
}

impl FetchTuner {
    /// One interval: the new concurrency and why, when it changes.
    pub fn tick(&mut self, cfg: &Config, o: &FetchObservation) -> Option<(usize, String)> {
        let n = o.concurrency;
        let max = o.max.max(1);
        if n > max {
            self.calm = 0;
            return Some((
                max,
                format!("the shard cache's bound holds {max} of the largest shards: {n} → {max} downloads at once"),
            ));
        }
        let waiting = o
            .limits
            .iter()
            .any(|l| matches!(l, Limit::Threads | Limit::Cpu | Limit::Depth | Limit::Latency));
        let fed = !o.limits.is_empty() && o.limits.iter().all(|l| *l == Limit::Fed);
        let slots_used = o.fetch_busy * n as f64;
        if waiting && o.fetch_wait > cfg.fetch_wait_high && o.fetch_busy >= cfg.saturated {
            self.calm = 0;
            return (n < max).then(|| {
                (
                    n + 1,
                    format!(
                        "the training loop waits for data, the decoders waited for downloads {:.0}% of the interval and the {n} download slots were {:.0}% busy: {n} → {} downloads at once",
                        o.fetch_wait * 100.0,
                        o.fetch_busy * 100.0,
                        n + 1
                    ),
                )
            });
        }
        if fed && o.fetch_wait < cfg.fetch_wait_low && slots_used < (n as f64 - 1.0) * cfg.saturated {
            self.calm += 1;
            if self.calm >= cfg.calm_intervals && n > 1 {
                self.calm = 0;
                return Some((
                    n - 1,
                    format!(
                        "fed for {} intervals without waiting for downloads, {slots_used:.1} of {n} download slots used: {n} → {} downloads at once",
                        cfg.calm_intervals,
                        n - 1
                    ),
                ));
            }
        } else {
            self.calm = 0;
        }
        None
    }
}

/// The third knob (control.md, "Hybrid decode"): the share of each batch offered to the client's
/// GPU, for a stream whose share the tuner sets. Raised while the CPU is the limit (the loop waits
/// for data with every thread of its cap saturated), to the share the cost model leaves to the GPU
/// and at least one step, at most [`Config::gpu_max_raise`]; lowered one step, judged as a probe,
/// while the GPU decoder is the limit (1.5) and the threads have time to spare; lowered one step, as a probe, once the loop has not waited for data for
/// [`Config::probe_after`] intervals (a share above what the CPU needs costs the model GPU and host
/// time for nothing). Each change is judged [`Config::gpu_hold`] intervals later by the loop's time
/// per batch, step and wait together, which is what the training run's rate is: a raise that made
/// it more than [`Config::gpu_slowdown`] longer goes back and sets a ceiling for the regime; a probe
/// that made it more than [`Config::gpu_probe_tolerance`] longer goes back and sets a floor, and
/// one that did not sets a ceiling at the share it left. Returns the new share and why.
fn gpu_share(cfg: &Config, st: &mut StreamState, o: &Observation, limit: Limit, s: &Signals) -> Option<(f64, String)> {
    let Some((crate::stats::GpuMode::Auto, share)) = o.gpu else {
        return None;
    };
    if let Some(t) = st.gpu_trial.as_mut() {
        t.seen += 1;
        if let Some(c) = st.last_cycle_ns.filter(|_| t.seen >= 2) {
            t.after_ns = Some(t.after_ns.map_or(c, |a| a.min(c)));
        }
    }
    let step = st.step_ns?;
    let cycle = st.cycle_ns?;
    if st.gpu_hold > 0 {
        st.gpu_hold -= 1;
        return None;
    }
    let ms = |ns: f64| ns / 1e6;
    // The bounds belong to the regime they were learned in. Recorded once the tuner has settled
    // after learning them (no change being judged, the hold over): the share and the loop's
    // step there. At that share again with a step more than 20 % away (the step also grows with
    // the share, so only the same share compares), the model's cost beside GPU decode is not
    // what it was (another phase, another model): the bounds go.
    if st.gpu_trial.is_none() && (st.gpu_ceiling.is_some() || st.gpu_floor.is_some()) {
        match st.gpu_bounds_at {
            None => st.gpu_bounds_at = Some((share, step)),
            Some((at, was)) if (at - share).abs() < 1e-9 && (step / was - 1.0).abs() > 0.2 => {
                st.gpu_ceiling = None;
                st.gpu_floor = None;
                st.gpu_bounds_at = None;
                st.pixels_never = false;
                st.pixels_kept = false;
            }
            Some(_) => {}
        }
    }
    if let Some(undone) = judge_gpu_trial(cfg, st, share, step, cycle, limit) {
        return Some(undone);
    }
    // 1.11: decoded pixels save the CPU a sample's resample and ops for some GPU time: the rung
    // above the share's top (a GPU-decoded sample saves the CPU its whole decode for about as
    // much GPU time), taken when the CPU is still the limit there, judged as a raise is.
    let pixels_rung = o.pixels.is_some() && !st.pixels && !st.pixels_never;
    if limit == Limit::Cpu {
        let raised = raise_gpu_share(cfg, st, o, s, share, (step, cycle));
        if raised.is_none() && pixels_rung {
            let why = format!(
                "the CPU is the limit at the GPU share's top ({})",
                s.reading(st.wait.unwrap_or(0.0))
            );
            return Some(st.switch_pixels(cfg, share, cycle, true, why));
        }
        return raised;
    }
    // The loop waits for its GPU decodes (1.5): the decoder has more of each batch than it keeps
    // up with. While the threads have time to spare, one step less, judged as a probe is (kept
    // when a batch is no slower, which also makes the share it left a ceiling).
    if limit == Limit::GpuDecode {
        st.gpu_stable = 0;
        let bottom = st.gpu_floor.unwrap_or(0.0);
        let next = (((share - cfg.gpu_step) / cfg.gpu_step).round() * cfg.gpu_step).max(0.0);
        if s.busy >= cfg.saturated && pixels_rung {
            // Both the decoder and the threads are busy: only pixels take work off the CPU.
            let why = format!(
                "the GPU decoder and the CPU are both the limit ({})",
                s.reading(st.wait.unwrap_or(0.0))
            );
            return Some(st.switch_pixels(cfg, share, cycle, true, why));
        }
        if share <= 0.0 || s.busy >= cfg.saturated || next < bottom - 1e-9 {
            return None;
        }
        st.start_gpu_trial(cfg, share, cycle, false);
        return Some((
            next,
            format!(
                "the GPU decoder is the limit ({}): GPU share {share:.3} → {next:.3}",
                s.reading(st.wait.unwrap_or(0.0))
            ),
        ));
    }
    // The loop does not wait (or waits on latency, not on the CPU): a share above what the CPU
    // needs costs the model for nothing, so once it has held for a while, try one step less.
    if !matches!(limit, Limit::Fed | Limit::Near | Limit::Latency) || share <= 0.0 {
        st.gpu_stable = 0;
        return None;
    }
    st.gpu_stable += 1;
    if share <= 0.0 && st.pixels && !st.pixels_kept && st.gpu_stable >= cfg.probe_after {
        // The top rung goes first when the loop is fed at a share of 0: GPU time for nothing
        // if the CPU keeps up without it.
        st.gpu_stable = 0;
        let why = format!(
            "{}; a batch takes {:.2} ms of the training loop: trying without decoded pixels",
            limit.describe(s, st.wait.unwrap_or(0.0), o.threads),
            ms(cycle)
        );
        return Some(st.switch_pixels(cfg, share, cycle, false, why));
    }
    let bottom = st.gpu_floor.unwrap_or(0.0);
    let next = ((share - cfg.gpu_step) / cfg.gpu_step).round().max(0.0) * cfg.gpu_step;
    if st.gpu_stable < cfg.probe_after || next < bottom - 1e-9 {
        return None;
    }
    st.gpu_stable = 0;
    st.start_gpu_trial(cfg, share, cycle, false);
    Some((
        next,
        format!(
            "{}; a batch takes {:.2} ms of the training loop: trying a GPU share one step lower, {share:.3} → {next:.3}",
            limit.describe(s, st.wait.unwrap_or(0.0), o.threads),
            ms(cycle)
        ),
    ))
}

/// The change of the GPU share being judged, once its intervals are in: undone (the share it
/// came from, and why) when it made a batch slower than [`gpu_share`] allows, else kept.
fn judge_gpu_trial(
    cfg: &Config,
    st: &mut StreamState,
    share: f64,
    step: f64,
    cycle: f64,
    limit: Limit,
) -> Option<(f64, String)> {
    let ms = |ns: f64| ns / 1e6;
    if let Some(t) = st.gpu_trial.take_if(|t| t.after_ns.is_some()) {
        let cycle = t.after_ns.unwrap_or(cycle);
        let grew = cycle / t.before_ns - 1.0;
        st.gpu_judged += 1;
        // Whatever the outcome, the share where the tuner settles next is where the bounds'
        // regime is recorded.
        st.gpu_bounds_at = None;
        // A lower share is judged by the time per batch alone: with the CPU now the limit a batch
        // may still be faster (on the H200, ResNet-18 on 6 threads ran 82 % of its ceiling at a
        // share of 0.625 with the CPU the limit, 78 % at 0.75 with it not).
        let undo = if t.raise {
            grew > cfg.gpu_slowdown
        } else {
            grew > cfg.gpu_probe_tolerance
        };
        if t.pixels {
            // 1.11: decoded pixels on (a raise) or off (a probe), undone as a share's change is.
            if !undo {
                return None;
            }
            st.gpu_hold = cfg.gpu_hold;
            st.gpu_stable = 0;
            st.pixels = !t.raise;
            if t.raise {
                st.pixels_never = true;
            } else {
                st.pixels_kept = true;
            }
            return Some((
                share,
                format!(
                    "a batch took {:.2} ms of the training loop {} decoded pixels, {:.2} ms {}: decoded pixels {}",
                    ms(cycle),
                    if t.raise { "with" } else { "without" },
                    ms(t.before_ns),
                    if t.raise { "without" } else { "with" },
                    if t.raise { "off again" } else { "on again" }
                ),
            ));
        }
        if !undo && !t.raise {
            // The share the probe left bought nothing: not raised to it again.
            st.gpu_ceiling = Some(t.from);
        }
        if undo {
            st.gpu_hold = cfg.gpu_hold;
            st.gpu_stable = 0;
            let why = if t.raise {
                // The first GPU batches of a stream start the client's decoder (its buffers grow
                // to the batch): the first raise, undone, may be tried again.
                if st.gpu_judged > 1 {
                    st.gpu_ceiling = Some(share);
                }
                format!(
                    "a batch took {:.2} ms of the training loop with {:.0}% of it decoded on the GPU, {:.2} ms before (its own step {:.2} ms: {})",
                    ms(cycle),
                    share * 100.0,
                    ms(t.before_ns),
                    ms(step),
                    if limit == Limit::GpuDecode {
                        "the loop waits for its GPU decodes, more of each batch than the decoder keeps up with"
                    } else {
                        "GPU decode slows the model more than it feeds it"
                    }
                )
            } else {
                st.gpu_floor = Some(t.from);
                format!(
                    "a batch took {:.2} ms of the training loop with {:.0}% of it decoded on the GPU, {:.2} ms with {:.0}%{}",
                    ms(cycle),
                    share * 100.0,
                    ms(t.before_ns),
                    t.from * 100.0,
                    if limit == Limit::Cpu {
                        " (the CPU is the limit there)"
                    } else {
                        ""
                    }
                )
            };
            return Some((t.from, format!("{why}: GPU share {share:.3} → {:.3}", t.from)));
        }
    }
    None
}

/// The CPU is the limit: a raise of the GPU share to what the cost model leaves the CPU (at
/// least one step, at most [`Config::gpu_max_raise`], under the regime's ceiling), judged later.
fn raise_gpu_share(
    cfg: &Config,
    st: &mut StreamState,
    o: &Observation,
    s: &Signals,
    share: f64,
    (step, cycle): (f64, f64),
) -> Option<(f64, String)> {
    st.gpu_stable = 0;
    let top = st.gpu_ceiling.map_or(1.0, |c| (c - cfg.gpu_step).max(0.0));
    // The model, as for threads: the CPU-decoded samples cost `c / (1 - share)` each (GPU
    // samples cost the pool almost nothing), so `threads` keep up with the loop's `B / C`
    // when at most `threads · C / (B · c_cpu)` of each batch is theirs. Jump there (rounded
    // up to a step, with the threads' headroom), at least one step.
    // The model knows nothing of the GPU decoder's own rate, so a jump goes at most
    // `gpu_max_raise` above the share: a loop with almost no step of its own (a feed with no
    // model) would otherwise be sent all of each batch at once, past what the decoder keeps
    // up with (on the H200's corpus feed, 8,300 img/s at 1.0 against 21,900 at 0.625).
    let c_cpu = st.cost_ns.map(|c| c / (1.0 - share).max(0.05));
    let model = c_cpu.map_or(0.0, |c| {
        let theirs = f64::from(o.threads.max(1)) * step / (f64::from(o.batch_size.max(1)) * c * cfg.headroom);
        ((1.0 - theirs) / cfg.gpu_step).ceil() * cfg.gpu_step
    });
    let next = (share + cfg.gpu_step)
        .max(model)
        .min(share + cfg.gpu_max_raise)
        .min(top);
    if next <= share + 1e-9 {
        return None;
    }
    st.start_gpu_trial(cfg, share, cycle, true);
    Some((
        next,
        format!(
            "the CPU is the limit ({}): GPU share {share:.3} → {next:.3}",
            s.reading(st.wait.unwrap_or(0.0))
        ),
    ))
}

/// The interval's reading: whether the loop waits for data (smoothed, against its floor's
/// bands) and what its threads did meanwhile.
fn limit_of(
    cfg: &Config,
    o: &Observation,
    s: &Signals,
    smoothed: Option<f64>,
    bands: Bands,
    cap: u32,
    base: u32,
) -> Limit {
    match smoothed {
        None => Limit::Unmeasured,
        // Waiting: on average (one interval's spike buys nothing) and now (an average still
        // decaying from an earlier wait, after the stream got what it needed, buys nothing either).
        Some(w) if w > bands.waiting && s.wait.is_some_and(|now| now > bands.waiting) => {
            if s.gpu_decoder_limits() {
                Limit::GpuDecode
            } else if s.busy >= cfg.saturated {
                if base.min(cap) >= cap && o.threads >= cap {
                    Limit::Cpu
                } else {
                    Limit::Threads
                }
            } else if o.depth < o.slots {
                Limit::Depth
            } else {
                Limit::Latency
            }
        }
        Some(w) if w < bands.fed => Limit::Fed,
        Some(_) => Limit::Near,
    }
}

/// The model's setting plus feedback, for a stream with measurements and no probe running.
#[allow(clippy::too_many_arguments)]
fn decide(
    cfg: &Config,
    st: &mut StreamState,
    o: &Observation,
    cap: u32,
    need: f64,
    cost: f64,
    step: f64,
    signals: &Signals,
    limit: Limit,
    smoothed: Option<f64>,
    depth: &mut u32,
    reason: &mut Option<String>,
) -> u32 {
    let estimate = need * cfg.headroom + f64::from(st.extra);
    let base = (estimate.ceil().max(1.0)) as u32;
    let w = smoothed.unwrap_or(0.0);
    match limit {
        Limit::Threads | Limit::Cpu | Limit::Depth | Limit::Latency => {
            st.calm = 0;
            // Below what the model asks for, the model's growth below comes first.
            if o.threads >= base.min(cap) {
                match limit {
                    Limit::Threads if base < cap => {
                        st.extra += 1;
                        // These threads, saturated, leave the loop waiting: too few in this
                        // regime, for shedding and probes alike.
                        st.floor = st.floor.max(o.threads);
                        st.regime_step.get_or_insert(step);
                        *reason = Some(format!("{}: one decode thread more", signals.reading(w)));
                    }
                    Limit::Depth => {
                        *reason = Some(format!(
                            "{}: one batch more in flight (depth {} → {})",
                            signals.reading(w),
                            *depth,
                            *depth + 1
                        ));
                        *depth += 1;
                    }
                    // Cpu: every thread the stream may have is saturated; Latency: the threads
                    // idle and every slot is in flight, so the wait is latency (an epoch's first
                    // batch, a client holding its slots), which more threads would not remove.
                    _ => {}
                }
            }
        }
        Limit::Fed => {
            st.calm += 1;
            if st.calm >= cfg.calm_intervals && st.extra > 0 && o.threads > st.floor + 1 {
                st.extra -= 1;
                st.calm = 0;
                *reason = Some(format!(
                    "the training loop has not waited for data for {} intervals: one of the extra decode threads fewer",
                    cfg.calm_intervals
                ));
            }
        }
        // The GPU decoder is the limit: neither threads nor depth shorten that wait (the share's
        // rule acts on it).
        Limit::GpuDecode | Limit::Near | Limit::Unmeasured | Limit::NoStep | Limit::Starting => st.calm = 0,
    }
    // Grow as soon as the model asks for more; shrink only when it asks for clearly fewer
    // (`band`), so a need near a whole number does not flap.
    let exact = need * cfg.headroom + f64::from(st.extra);
    let grow = (exact.ceil().max(1.0) as u32).clamp(1, cap);
    let keep = ((exact + cfg.band).ceil().max(1.0) as u32).clamp(1, cap);
    let describe = |to: u32| need_reason(need, o.batch_size, step, cost, o.threads, to);
    if grow > o.threads {
        st.shrink = 0;
        reason.get_or_insert_with(|| describe(grow));
        grow
    } else if keep < o.threads {
        st.shrink += 1;
        if st.shrink < cfg.shrink_intervals {
            o.threads
        } else {
            let to = keep.max(o.threads - (o.threads / 4).max(1));
            reason.get_or_insert_with(|| describe(to));
            to
        }
    } else {
        st.shrink = 0;
        o.threads
    }
}

/// The model's reason: what the loop can consume, what a sample costs, the threads that takes.
fn need_reason(need: f64, batch: u32, step_ns: f64, cost_ns: f64, from: u32, to: u32) -> String {
    format!(
        "the training loop can take {} samples/s (a batch of {batch} per {:.1} ms of its own step); at {:.0} µs of thread time per sample that needs {need:.1} decode threads: {from} → {to}",
        (f64::from(batch) * 1e9 / step_ns.max(1.0)) as u64,
        step_ns / 1e6,
        cost_ns / 1e3,
    )
}

/// Where the tuner task reads and writes.
pub trait Target: Send + Sync {
    fn streams(&self) -> Vec<Arc<StreamStats>>;
    /// The CPU budget now (it depends on the clients connected).
    fn budget(&self) -> u32;
    fn pool_threads(&self) -> u32;
    /// Wakes the pool after allotments changed.
    fn kick(&self);
    /// Records the pool's busy share over the interval.
    fn set_busy(&self, busy: f64, active: u32);
    /// The remote shard downloads' knob, once a remote dataset has been opened and unless
    /// `--fetch-concurrency` pins it.
    fn fetches(&self) -> Option<Arc<dyn Fetches>> {
        None
    }
}

/// The server's remote downloads, as the tuner sees them (`ringfeed_remote::Cache`).
pub trait Fetches: Send + Sync {
    /// Downloads allowed at once now.
    fn concurrency(&self) -> usize;
    /// The most the cache's bound leaves room for.
    fn max_concurrency(&self) -> usize;
    fn set_concurrency(&self, n: usize);
    /// Nanoseconds readers have waited for downloads since the server started.
    fn waited_ns(&self) -> u64;
    /// Nanoseconds spent downloading (summed over downloads) since the server started.
    fn busy_ns(&self) -> u64;
}

/// The remote cache is the one fetcher the server has.
#[cfg(feature = "remote")]
impl Fetches for ringfeed_remote::Cache {
    fn concurrency(&self) -> usize {
        ringfeed_remote::Cache::concurrency(self)
    }
    fn max_concurrency(&self) -> usize {
        ringfeed_remote::Cache::max_concurrency(self)
    }
    fn set_concurrency(&self, n: usize) {
        ringfeed_remote::Cache::set_concurrency(self, n);
    }
    fn waited_ns(&self) -> u64 {
        ringfeed_remote::Cache::waited_ns(self)
    }
    fn busy_ns(&self) -> u64 {
        ringfeed_remote::Cache::busy_ns(self)
    }
}

/// Runs the controller every `interval` until the future is dropped.
pub async fn run(target: Arc<dyn Target>, config: Config, interval: Duration) {
    let mut tuner = Tuner::new(config);
    let mut fetch_tuner = FetchTuner::default();
    let mut fetch_last: Option<(u64, u64)> = None;
    let mut last: BTreeMap<u64, Counters> = BTreeMap::new();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut then = tokio::time::Instant::now();
    loop {
        ticker.tick().await;
        let now = tokio::time::Instant::now();
        let elapsed = now - then;
        then = now;
        let streams = target.streams();
        let mut obs = Vec::with_capacity(streams.len());
        let mut busy_ns = 0u64;
        let mut seen = BTreeMap::new();
        for s in &streams {
            let c = s.counters(now.into_std());
            let delta = c.since(last.get(&s.id).unwrap_or(&Counters::default()));
            seen.insert(s.id, c);
            busy_ns += delta.busy_ns;
            obs.push(Observation {
                id: s.id,
                autotune: s.autotune,
                max_threads: s.max_threads,
                start_threads: s.start_threads,
                batch_size: s.batch_size,
                slots: s.slots,
                threads: s.threads.load(Ordering::Relaxed),
                depth: s.depth.load(Ordering::Relaxed),
                delta,
                reported: s.reported.load(Ordering::Relaxed),
                reports_gpu_wait: s.reports_gpu_wait.load(Ordering::Relaxed),
                active: Some(s.active_for(now.into_std())),
                gpu: s.gpu.map(|m| (m, s.share())),
                pixels: s.pixels_tuned.then(|| s.pixels_on.load(Ordering::Relaxed)),
            });
        }
        last = seen;
        let decisions = tuner.tick(elapsed, target.budget(), target.pool_threads(), &obs);
        if let Some(f) = target.fetches() {
            let now_ns = (f.waited_ns(), f.busy_ns());
            let (w0, b0) = fetch_last.unwrap_or(now_ns);
            fetch_last = Some(now_ns);
            let interval_ns = elapsed.as_nanos().max(1) as f64;
            let n = f.concurrency();
            let o = FetchObservation {
                concurrency: n,
                max: f.max_concurrency(),
                fetch_wait: now_ns.0.saturating_sub(w0) as f64 / interval_ns,
                fetch_busy: now_ns.1.saturating_sub(b0) as f64 / (interval_ns * n.max(1) as f64),
                limits: decisions.iter().map(|d| d.kind).collect(),
            };
            if let Some((n, reason)) = fetch_tuner.tick(&config, &o) {
                f.set_concurrency(n);
                tracing::info!(target: "ringfeed::tune", fetch_concurrency = n, "{reason}");
            }
        }
        let mut active = 0;
        for ((s, o), d) in streams.iter().zip(&obs).zip(decisions) {
            active += d.threads;
            s.threads.store(d.threads, Ordering::Relaxed);
            if let Some(share) = d.gpu_share {
                s.set_share(share);
            }
            if let Some(on) = d.pixels {
                // Read by the stream's task when it starts a batch (as the share is).
                s.pixels_on.store(on, Ordering::Relaxed);
            }
            if d.depth != o.depth {
                s.depth.store(d.depth, Ordering::Relaxed);
                s.wake.notify_one();
            }
            let secs = elapsed.as_secs_f64().max(1e-9);
            let mut view = s.view.lock().unwrap_or_else(|p| p.into_inner());
            view.samples_per_s = o.delta.samples as f64 / secs;
            view.wait = d.wait;
            view.gpu_wait = d.gpu_wait;
            view.busy = d.busy;
            view.step_ms = d.step_ms;
            view.limit = d.limit;
            view.gpu_decode_us =
                (o.delta.gpu_samples > 0).then(|| o.delta.gpu_decode_ns as f64 / o.delta.gpu_samples as f64 / 1e3);
            tracing::debug!(
                target: "ringfeed::tune",
                stream = s.id,
                busy = d.busy,
                stage_busy = o.delta.stage_ns.iter().sum::<u64>() as f64 / (secs * 1e9 * f64::from(o.threads.max(1))),
                "{}",
                view.limit
            );
            if o.delta.timed > 0 {
                view.stage_us =
                    std::array::from_fn::<f64, STAGES, _>(|i| o.delta.stage_ns[i] as f64 / o.delta.timed as f64 / 1e3);
            }
            if let Some(reason) = d.reason {
                tracing::info!(
                    target: "ringfeed::tune",
                    stream = s.id,
                    threads = d.threads,
                    depth = d.depth,
                    "{reason}"
                );
                view.tune = reason;
            }
        }
        target.set_busy(busy_ns as f64 / elapsed.as_nanos().max(1) as f64, active);
        target.kick();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A simulated pipeline: `threads` decode threads at `cost` per sample feed a consumer that
    /// computes `step` per batch of `batch` samples; `depth` batches may be in flight. A loop with
    /// a wait `floor` (a GPU loop's copy event) also waits that share of each step, however many
    /// threads feed it; `swing` varies the floor by up to that much either way, per interval.
    /// A GPU-bound loop also waits `gpu` per step inside `next()` behind its own GPU (reported as
    /// `gpu_wait_ns`). The stage timers see `stage_share` of the thread time a sample costs (the
    /// rest is scheduling and hand-off around them).
    struct Sim {
        cost: Duration,
        step: Duration,
        batch: u32,
        slots: u32,
        noise: u64,
        carry: f64,
        floor: f64,
        swing: f64,
        gpu: Duration,
        stage_share: f64,
        /// Hybrid decode: the share of each batch the client decodes on its GPU (the pool's
        /// cost per sample falls by that share), and what each such sample adds to the model's
        /// step (GPU decode competing with it).
        share: f64,
        slow: Duration,
        /// The client's GPU decoder: its time per GPU sample, one after another beside the pool
        /// (zero: it keeps up with any share). When it is slower than the pool's part of a batch,
        /// the loop waits for it, and that wait is reported as `gpu_decode_wait_ns` (1.5).
        engine: Duration,
        /// 1.11: decoded pixels on (`Some`: the stream has them), what they leave of a CPU
        /// sample's cost, and what each such sample adds to the model's step (its resample on
        /// the GPU).
        pixels: Option<bool>,
        pixel_cost: f64,
        pixel_slow: Duration,
    }

    impl Default for Sim {
        fn default() -> Self {
            Sim {
                cost: Duration::from_micros(1500),
                step: Duration::from_millis(100),
                batch: 256,
                slots: 4,
                noise: 1,
                carry: 0.0,
                floor: 0.0,
                swing: 0.0,
                gpu: Duration::ZERO,
                stage_share: 1.0,
                share: 0.0,
                slow: Duration::ZERO,
                engine: Duration::ZERO,
                pixels: None,
                pixel_cost: 0.85,
                pixel_slow: Duration::ZERO,
            }
        }
    }

    impl Sim {
        /// One interval under `threads`: the counters it produces.
        fn interval(&mut self, threads: u32, interval: Duration) -> Counters {
            // Deterministic ±5 % noise on the cost (contention, page cache), and the floor's swing
            // from other bits of the same draw.
            self.noise = self
                .noise
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let jitter = 0.95 + 0.1 * ((self.noise >> 33) as f64 / (1u64 << 31) as f64);
            let floor =
                self.floor + self.swing * (2.0 * ((self.noise >> 13) & 0xfffff) as f64 / (1u64 << 20) as f64 - 1.0);
            // A step lasts its compute and its wait behind the GPU, plus its floor's share of
            // waiting.
            let gpu = self.gpu.as_secs_f64();
            let pixels = self.pixels == Some(true);
            let cpu_part = (1.0 - self.share) * f64::from(self.batch);
            let own = self.step.as_secs_f64()
                + self.share * f64::from(self.batch) * self.slow.as_secs_f64()
                + if pixels {
                    cpu_part * self.pixel_slow.as_secs_f64()
                } else {
                    0.0
                };
            let step = (own + gpu) / (1.0 - floor);
            let cost =
                self.cost.as_secs_f64() * (1.0 - self.share).max(0.02) * if pixels { self.pixel_cost } else { 1.0 };
            let produce = f64::from(threads) / cost; // samples/s
            let consume = f64::from(self.batch) / step;
            let decoder = self.decoder_rate();
            let rate = produce.min(consume).min(decoder);
            // What the loop waits per batch for the decoder beyond what it would wait anyway.
            let behind = (f64::from(self.batch) / decoder - f64::from(self.batch) / produce.min(consume)).max(0.0);
            let secs = interval.as_secs_f64();
            // Whole steps end in an interval; the rest carries over to the next.
            let exact = rate * secs / f64::from(self.batch) + self.carry;
            let steps = exact.floor();
            self.carry = exact - steps;
            let busy_secs = rate * secs / f64::from(self.batch) * step;
            let compute = steps * own;
            let wait = (secs - busy_secs).max(0.0) + (steps * (step - own));
            let samples = steps * f64::from(self.batch);
            // Stage times arrive with finished samples; the threads' occupancy is what they spent
            // in the interval (stats::Occupancy counts running jobs up to the tick).
            let timed = samples * cost * jitter;
            let busy = rate * secs * cost * jitter;
            Counters {
                samples: samples as u64,
                stage_ns: [0, (timed * self.stage_share * 1e9) as u64, 0, 0],
                timed: samples as u64,
                busy_ns: (busy * 1e9) as u64,
                steps: steps as u64,
                wait_ns: (wait * 1e9) as u64,
                compute_ns: (compute * 1e9) as u64,
                gpu_wait_ns: (steps * gpu * 1e9) as u64,
                gpu_samples: (samples * self.share) as u64,
                gpu_decode_ns: (samples * self.share * 90e3) as u64,
                gpu_decode_wait_ns: ((steps * behind).min(wait) * 1e9) as u64,
            }
        }

        /// The samples/s (of whole batches) the GPU decoder keeps up with at the share.
        fn decoder_rate(&self) -> f64 {
            let per_sample = self.share * self.engine.as_secs_f64();
            if per_sample > 0.0 {
                1.0 / per_sample
            } else {
                f64::INFINITY
            }
        }
    }

    fn obs(id: u64, threads: u32, depth: u32, delta: Counters, batch: u32, slots: u32) -> Observation {
        Observation {
            id,
            autotune: true,
            max_threads: None,
            start_threads: None,
            batch_size: batch,
            slots,
            threads,
            depth,
            delta,
            reported: true,
            reports_gpu_wait: delta.gpu_wait_ns > 0,
            active: None,
            gpu: None,
            pixels: None,
        }
    }

    const TICK: Duration = Duration::from_millis(500);

    /// Runs one simulated stream for `ticks`, returning (threads, wait) per tick.
    fn drive(tuner: &mut Tuner, sim: &mut Sim, mut threads: u32, ticks: usize, budget: u32) -> Vec<(u32, f64)> {
        let mut out = Vec::new();
        let mut depth = 3;
        for _ in 0..ticks {
            let c = sim.interval(threads, TICK);
            let wait = c.wait_ns as f64 / (c.wait_ns + c.compute_ns) as f64;
            let d = tuner.tick(TICK, budget, 16, &[obs(1, threads, depth, c, sim.batch, sim.slots)]);
            threads = d[0].threads;
            depth = d[0].depth;
            out.push((threads, wait));
        }
        out
    }

    /// The fewest threads that keep a consumer of `step` per `batch` fed at `cost` per sample.
    fn fewest(cost: Duration, step: Duration, batch: u32) -> u32 {
        (f64::from(batch) * cost.as_secs_f64() / step.as_secs_f64()).ceil() as u32
    }

    #[test]
    fn converges_to_the_fewest_threads_that_keep_the_wait_near_zero() {
        // 1.5 ms per sample, 256 per batch, 100 ms steps: 3.84 threads needed.
        let mut sim = Sim {
            cost: Duration::from_micros(1500),
            step: Duration::from_millis(100),
            batch: 256,
            slots: 6,
            noise: 1,
            carry: 0.0,
            floor: 0.0,
            swing: 0.0,
            ..Sim::default()
        };
        let mut tuner = Tuner::new(Config::default());
        let trace = drive(&mut tuner, &mut sim, 15, 60, 15);
        let need = fewest(sim.cost, sim.step, sim.batch);
        let (threads, _) = *trace.last().unwrap();
        // The model (with headroom) settles one above; probing finds the fewest.
        assert_eq!(threads, need, "settled at {threads} threads, needs {need}: {trace:?}");
        // Within 30 s (60 ticks) the wait is near zero and stays there, but for the one interval
        // of the probe that found one thread fewer too few.
        assert!(
            trace[20..].iter().filter(|&&(_, w)| w >= 0.02).count() <= 1,
            "{trace:?}"
        );
        // No oscillation once settled: the failed probe is not repeated.
        let changes = trace[30..].windows(2).filter(|w| w[0].0 != w[1].0).count();
        assert_eq!(changes, 0, "{trace:?}");
    }

    /// A token stream (control.md, "Token streams"): the cost of a window is reading it, tens of
    /// microseconds for 2048 tokens, against a GPT step of tens of milliseconds. Started where a
    /// token stream starts (one thread) it never grows; started at the whole budget (a client's
    /// `threads` bound, an old server's habit) it sheds down to one. The wait stays near zero.
    #[test]
    fn a_token_stream_settles_at_one_thread() {
        for (start, step_ms, batch) in [(1, 100, 16), (15, 100, 16), (1, 20, 64), (15, 20, 64)] {
            let mut sim = Sim {
                cost: Duration::from_micros(40),
                step: Duration::from_millis(step_ms),
                batch,
                slots: 4,
                noise: 11,
                ..Sim::default()
            };
            let mut tuner = Tuner::new(Config::default());
            let trace = drive(&mut tuner, &mut sim, start, 60, 15);
            assert_eq!(trace.last().unwrap().0, 1, "start {start}: {trace:?}");
            if start == 1 {
                assert!(trace.iter().all(|&(t, _)| t == 1), "never grows: {trace:?}");
            }
            assert!(trace[2..].iter().all(|&(_, w)| w < 0.02), "start {start}: {trace:?}");
        }
    }

    #[test]
    fn a_slow_consumer_sheds_threads() {
        let mut sim = Sim {
            cost: Duration::from_micros(1500),
            step: Duration::from_millis(400),
            batch: 256,
            slots: 4,
            noise: 7,
            carry: 0.0,
            floor: 0.0,
            swing: 0.0,
            ..Sim::default()
        };
        let mut tuner = Tuner::new(Config::default());
        let trace = drive(&mut tuner, &mut sim, 15, 40, 15);
        // 0.96 threads needed: the model says 2 (with headroom), a probe finds 1 enough.
        assert_eq!(trace.last().unwrap().0, 1, "{trace:?}");
        assert!(trace.iter().all(|&(_, w)| w < 0.02), "{trace:?}");
    }

    #[test]
    fn a_consumer_that_speeds_up_stops_waiting_within_30_s() {
        let mut sim = Sim {
            cost: Duration::from_micros(1500),
            step: Duration::from_millis(400),
            batch: 256,
            slots: 4,
            noise: 3,
            carry: 0.0,
            floor: 0.0,
            swing: 0.0,
            ..Sim::default()
        };
        let mut tuner = Tuner::new(Config::default());
        let before = drive(&mut tuner, &mut sim, 15, 30, 15);
        sim.step = Duration::from_millis(50); // 7.7 threads needed
        let after = drive(&mut tuner, &mut sim, before.last().unwrap().0, 60, 15);
        let recovered = after.iter().position(|&(_, w)| w < 0.02).expect("recovers");
        // The step time's moving average needs a few intervals to follow a 8x change.
        assert!(recovered <= 10, "took {recovered} ticks: {after:?}");
        // Fed from then on, but for at most one interval: a probe of one thread too few.
        assert!(
            after[recovered..].iter().filter(|&&(_, w)| w >= 0.02).count() <= 1,
            "{after:?}"
        );
        let need = fewest(sim.cost, sim.step, sim.batch);
        let settled = after.last().unwrap().0;
        assert!(settled >= need && settled <= need + 1, "{settled} vs {need}: {after:?}");
    }

    #[test]
    fn when_the_model_underestimates_feedback_adds_threads() {
        // The client's compute time hides part of its step (it measures 100 ms, but consumes as
        // if it took 60 ms): the model asks too little, the wait tells.
        let mut tuner = Tuner::new(Config::default());
        let mut sim = Sim {
            cost: Duration::from_micros(1500),
            step: Duration::from_millis(60),
            batch: 256,
            slots: 4,
            noise: 5,
            carry: 0.0,
            floor: 0.0,
            swing: 0.0,
            ..Sim::default()
        };
        let mut threads = 2;
        let mut depth = 3;
        for _ in 0..40 {
            let mut c = sim.interval(threads, TICK);
            c.compute_ns = c.compute_ns * 100 / 60; // misreported
            let d = tuner.tick(TICK, 15, 16, &[obs(1, threads, depth, c, 256, 4)]);
            threads = d[0].threads;
            depth = d[0].depth;
        }
        let c = sim.interval(threads, TICK);
        let wait = c.wait_ns as f64 / (c.wait_ns + c.compute_ns) as f64;
        assert!(wait < 0.02, "still waiting {wait} with {threads} threads");
    }

    #[test]
    fn without_stats_a_stream_gets_the_whole_budget_and_pinned_streams_are_kept() {
        let mut tuner = Tuner::new(Config::default());
        let mut silent = obs(1, 1, 2, Counters::default(), 64, 4);
        silent.reported = false;
        let mut pinned = obs(2, 1, 2, Counters::default(), 64, 4);
        pinned.autotune = false;
        pinned.max_threads = Some(3);
        let d = tuner.tick(TICK, 12, 16, &[silent, pinned]);
        assert_eq!((d[0].threads, d[1].threads), (9, 3));
        assert!(d[0].reason.as_deref().unwrap().contains("no stats"));
    }

    #[test]
    fn streams_over_the_budget_share_it_in_proportion_and_the_waiting_one_gets_the_rest() {
        let mut tuner = Tuner::new(Config::default());
        let busy = |step_ms: u64, wait_ms: u64| Counters {
            samples: 256,
            stage_ns: [0, 256 * 1_500_000, 0, 0],
            timed: 256,
            busy_ns: 256 * 1_500_000,
            steps: 1,
            wait_ns: wait_ms * 1_000_000,
            compute_ns: step_ms * 1_000_000,
            gpu_wait_ns: 0,
            gpu_samples: 0,
            gpu_decode_ns: 0,
            gpu_decode_wait_ns: 0,
        };
        // Stream 1 needs 7.7 threads (8.1 with headroom → 9), stream 2 needs 3.84 (4.03 → 5).
        let a = obs(1, 4, 2, busy(50, 0), 256, 4);
        let b = obs(2, 4, 2, busy(100, 300), 256, 4);
        // The first interval with steps holds the first batch: its wait is not acted on.
        tuner.tick(TICK, 10, 16, &[a.clone(), b.clone()]);
        let d = tuner.tick(TICK, 10, 16, &[a, b]);
        assert_eq!(d.iter().map(|d| d.threads).sum::<u32>(), 10);
        // 9:5 of 10 → 6 and 3, and the leftover thread goes to the waiting stream 2.
        assert_eq!((d[0].threads, d[1].threads), (6, 4), "{d:?}");
    }
    /// A loop that waits `floor` of each step however it is fed: 1.3 %, a GPU loop's copy event.
    fn floored(cost_us: u64, step_ms: u64, floor: f64, swing: f64, noise: u64) -> Sim {
        Sim {
            cost: Duration::from_micros(cost_us),
            step: Duration::from_millis(step_ms),
            batch: 256,
            slots: 6,
            noise,
            carry: 0.0,
            floor,
            swing,
            ..Sim::default()
        }
    }

    /// The fewest threads that keep `sim` fed at its highest floor (the floor lengthens the step).
    fn fewest_floored(sim: &Sim) -> u32 {
        let step = sim.step.as_secs_f64() / (1.0 - sim.floor - sim.swing);
        (f64::from(sim.batch) * sim.cost.as_secs_f64() / step).ceil() as u32
    }

    #[test]
    fn with_a_wait_floor_converges_to_the_fewest_threads_that_keep_the_loop_fed() {
        // As `converges_to_…`, but the loop waits 1.3 % of each step even when fed, above
        // `wait_low`: the loop is fed relative to its floor, so the probe still happens.
        // 1.56 ms per sample, 256 per batch, 100 ms of compute and 1.3 ms of floor per step: 3.94
        // threads needed, 3.99 by the compute time alone, so the model (with headroom) says 5.
        for noise in [1, 2, 3] {
            let mut sim = floored(1560, 100, 0.013, 0.0, noise);
            let mut tuner = Tuner::new(Config::default());
            let trace = drive(&mut tuner, &mut sim, 15, 60, 15);
            let need = fewest_floored(&sim);
            assert_eq!(need, 4);
            // The model settles one above; probing finds 4.
            let probed = trace.iter().position(|&(t, _)| t == 4).expect("reaches 4");
            assert!(trace[probed - 3..probed].iter().all(|&(t, _)| t == 5), "{trace:?}");
            assert_eq!(trace.last().unwrap().0, need, "{trace:?}");
            // Fed (the floor and no more) from 10 s on, but for the one interval of the probe
            // that found 3 threads too few.
            assert!(
                trace[20..].iter().filter(|&&(_, w)| w > 0.0135).count() <= 1,
                "{trace:?}"
            );
            let changes = trace[30..].windows(2).filter(|w| w[0].0 != w[1].0).count();
            assert_eq!(changes, 0, "{trace:?}");
        }
    }

    #[test]
    fn with_a_wait_floor_a_probe_that_starves_the_loop_a_little_is_undone() {
        // 3.02 threads needed: the model gives 4, and a probe of 3 starves the loop by only
        // 0.5–0.6 % of its time, on top of its 1.3 % floor (under the old fixed 2 %).
        let mut sim = floored(1194, 100, 0.013, 0.0, 11);
        let mut tuner = Tuner::new(Config::default());
        let trace = drive(&mut tuner, &mut sim, 15, 60, 15);
        assert_eq!(fewest_floored(&sim), 4);
        let probes: Vec<usize> = (0..trace.len()).filter(|&i| trace[i].0 == 3).collect();
        assert_eq!(probes.len(), 1, "one probe of 3 threads, undone at once: {trace:?}");
        let (back, starved) = trace[probes[0] + 1];
        assert_eq!(back, 4, "{trace:?}");
        assert!(
            starved > 0.018 && starved < 0.02,
            "the probe's interval waited {starved}: {trace:?}"
        );
        // Every other interval from 10 s on reads the floor alone, and 4 threads stay.
        assert!(
            trace[20..]
                .iter()
                .enumerate()
                .all(|(i, &(_, w))| i + 20 == probes[0] + 1 || w < 0.0135),
            "{trace:?}"
        );
        assert_eq!(trace.last().unwrap().0, 4, "{trace:?}");
    }

    #[test]
    fn with_a_jittering_wait_floor_the_setting_does_not_oscillate() {
        // The floor reads 1.2–1.4 % from one interval to the next (as measured on the H200), over
        // several loops and noise seeds: settled at the fewest threads, nothing moves any more.
        for (cost_us, step_ms) in [(1500, 100), (1194, 100), (1500, 400), (1500, 50)] {
            for noise in [1, 2, 3, 4] {
                let mut sim = floored(cost_us, step_ms, 0.013, 0.001, noise);
                let mut tuner = Tuner::new(Config::default());
                let trace = drive(&mut tuner, &mut sim, 15, 120, 15);
                let need = fewest_floored(&sim);
                let settled = trace.last().unwrap().0;
                assert_eq!(settled, need, "{cost_us} µs, {step_ms} ms, seed {noise}: {trace:?}");
                let changes = trace[40..].windows(2).filter(|w| w[0].0 != w[1].0).count();
                assert_eq!(changes, 0, "{cost_us} µs, {step_ms} ms, seed {noise}: {trace:?}");
                // At most one probe below the setting after the start, and no thread added back
                // and shed again (each setting is entered once).
                let below = trace[10..].iter().filter(|&&(t, _)| t < settled).count();
                assert!(below <= 1, "{cost_us} µs, {step_ms} ms, seed {noise}: {trace:?}");
                let entered = trace
                    .windows(2)
                    .filter(|w| w[0].0 != settled && w[1].0 == settled)
                    .count();
                assert!(entered <= 2, "{cost_us} µs, {step_ms} ms, seed {noise}: {trace:?}");
            }
        }
    }

    #[test]
    fn a_wait_floor_is_learned_only_from_waits_the_feedback_would_not_act_on() {
        // 4 threads `busy` of their time over 500 ms, 5 steps of 100 ms, `wait` of the loop's time.
        let interval = |busy: f64, wait: f64| {
            let compute = 500_000_000u64;
            Counters {
                samples: 1280,
                stage_ns: [0, (busy * 4.0 * 5e8) as u64, 0, 0],
                timed: 1280,
                busy_ns: (busy * 4.0 * 5e8) as u64,
                steps: 5,
                wait_ns: (compute as f64 * wait / (1.0 - wait)) as u64,
                compute_ns: compute,
                gpu_wait_ns: 0,
                gpu_samples: 0,
                gpu_decode_ns: 0,
                gpu_decode_wait_ns: 0,
            }
        };
        let learned = |busy: f64, depth: u32, wait: f64| {
            let mut tuner = Tuner::new(Config::default());
            for _ in 0..2 {
                tuner.tick(TICK, 15, 16, &[obs(1, 4, depth, interval(busy, wait), 256, 4)]);
            }
            tuner.streams[&1].wait_floor
        };
        // Spare threads, every slot in flight: the loop's own floor.
        let floor = learned(0.5, 4, 0.013).expect("learned");
        assert!((floor - 0.013).abs() < 1e-6, "{floor}");
        // Spare threads, depth to spare, a wait too small for one batch more: also the floor.
        assert!(learned(0.5, 2, 0.013).is_some());
        // Saturated threads: the wait may be starvation, however small.
        assert_eq!(learned(0.99, 4, 0.013), None);
        // A wait the depth feedback acts on (one batch more) is not a floor.
        assert_eq!(learned(0.5, 2, 0.03), None);
        // Nor is a wait of 6 %, whatever the threads and depth.
        assert_eq!(learned(0.5, 4, 0.06), None);
    }

    #[test]
    fn bands_follow_the_floor() {
        let cfg = Config::default();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // No floor, or a CPU loop's: the fixed bands.
        for floor in [None, Some(0.001)] {
            let b = cfg.bands(floor);
            assert!(close(b.fed, 0.01) && close(b.waiting, 0.015), "{b:?}");
        }
        // A GPU loop's 1.3 %: fed under 1.56 %, waiting over 1.82 %.
        let b = cfg.bands(Some(0.013));
        assert!(close(b.fed, 0.0156) && close(b.waiting, 0.0182), "{b:?}");
        // A large floor: a fifth of it either way.
        let b = cfg.bands(Some(0.04));
        assert!(close(b.fed, 0.048) && close(b.waiting, 0.056), "{b:?}");
    }

    /// `drive`, returning every decision (for its reasons and readings) and the depths.
    fn drive_all(
        tuner: &mut Tuner,
        sim: &mut Sim,
        mut threads: u32,
        ticks: usize,
        budget: u32,
    ) -> Vec<(Decision, u32)> {
        let mut out = Vec::new();
        let mut depth = 3;
        for _ in 0..ticks {
            let c = sim.interval(threads, TICK);
            let d = tuner.tick(TICK, budget, 16, &[obs(1, threads, depth, c, sim.batch, sim.slots)]);
            threads = d[0].threads;
            depth = d[0].depth;
            out.push((d[0].clone(), threads));
        }
        out
    }

    #[test]
    fn a_cpu_bound_stream_whose_stage_timers_see_44_percent_still_reads_saturated_and_grows_threads() {
        // The H200 case's shape: a loop that waits for data with every allotted thread working,
        // while the per-sample stage timers account for only 44 % of the threads' time. The busy
        // share comes from the threads' occupancy, so the feedback adds threads (and not depth).
        // The client's compute hides part of its step, so the model asks too little.
        let mut sim = Sim {
            step: Duration::from_millis(60),
            noise: 5,
            stage_share: 0.44,
            ..Sim::default()
        };
        let mut tuner = Tuner::new(Config::default());
        let mut threads = 2;
        let mut depth = 3;
        let mut reasons = Vec::new();
        let mut trace = Vec::new();
        for _ in 0..40 {
            let mut c = sim.interval(threads, TICK);
            c.compute_ns = c.compute_ns * 100 / 60; // misreported
            let d = tuner.tick(TICK, 15, 16, &[obs(1, threads, depth, c, 256, 4)]);
            assert_eq!(d[0].depth, 3, "depth must not grow for a CPU-bound stream: {d:?}");
            if let Some(r) = &d[0].reason {
                reasons.push(r.clone());
            }
            threads = d[0].threads;
            depth = d[0].depth;
            trace.push(threads);
        }
        // The thread the feedback added is not shed again into the same wait (no 6 ↔ 7 cycle).
        assert!(trace[20..].iter().all(|&t| t == threads), "{trace:?}: {reasons:?}");
        assert!(
            reasons.iter().any(|r| r.ends_with("% busy: one decode thread more")),
            "{reasons:?}"
        );
        assert!(reasons.iter().all(|r| !r.contains("batch more")), "{reasons:?}");
        let c = sim.interval(threads, TICK);
        let wait = c.wait_ns as f64 / (c.wait_ns + c.compute_ns) as f64;
        assert!(wait < 0.02, "still waiting {wait} with {threads} threads: {reasons:?}");
        assert!(threads >= fewest(sim.cost, sim.step, sim.batch), "{threads}");
    }

    #[test]
    fn a_cpu_bound_stream_at_its_budget_reads_the_cpu_as_the_limit_every_interval() {
        // 7.7 threads needed, 4 in the budget: the loop waits for data with all 4 saturated. The
        // tuner cannot help, changes nothing, and says so every interval (not only when it acts).
        let mut sim = Sim {
            step: Duration::from_millis(50),
            ..Sim::default()
        };
        let mut tuner = Tuner::new(Config::default());
        let trace = drive_all(&mut tuner, &mut sim, 4, 20, 4);
        for (d, threads) in &trace[2..] {
            assert_eq!((*threads, d.depth), (4, 3), "{d:?}");
            assert!(d.busy.unwrap() > 0.95, "{d:?}");
            assert!(
                d.limit
                    .starts_with("the CPU is the limit (4 decode threads at most): the training loop waits for data"),
                "{}",
                d.limit
            );
            assert!(d.limit.contains("; its 4 decode threads are "), "{}", d.limit);
        }
    }

    #[test]
    fn a_gpu_bound_loop_waiting_behind_its_gpu_gets_no_more_threads_or_depth() {
        // ResNet on a busy GPU: 6 ms of host compute per step, then 14 ms inside next() behind
        // the GPU (the copy's event queued behind the model's kernels), with data always there.
        // 70 % of the loop's time is in next(), none of it for data: the loop consumes 64 samples
        // per 20 ms, which 3.2 threads at 1 ms per sample cover.
        for noise in [1, 2, 3] {
            let mut sim = Sim {
                cost: Duration::from_millis(1),
                step: Duration::from_millis(6),
                gpu: Duration::from_millis(14),
                batch: 64,
                slots: 6,
                noise,
                ..Sim::default()
            };
            let mut tuner = Tuner::new(Config::default());
            let trace = drive_all(&mut tuner, &mut sim, 15, 60, 15);
            for (d, _) in &trace {
                assert_eq!(d.depth, 3, "depth grew: {d:?}");
                let reason = d.reason.as_deref().unwrap_or("");
                assert!(
                    !reason.contains("thread more") && !reason.contains("batch more"),
                    "{d:?}"
                );
            }
            // From 15 threads down to the model's 4; a probe of 3 is undone (3 are too few).
            assert!(
                trace
                    .windows(2)
                    .all(|w| w[1].1 <= w[0].1 || w[1].0.reason.as_deref().unwrap_or("").starts_with("probe: with 3")),
                "{trace:?}"
            );
            let (last, threads) = trace.last().unwrap();
            assert_eq!(*threads, 4, "{last:?}");
            assert!(last.gpu_wait.unwrap() > 0.6 && last.wait.unwrap() < 0.01, "{last:?}");
            assert!(
                last.limit
                    .starts_with("fed, the GPU is the limit: the training loop waits for data 0."),
                "{}",
                last.limit
            );
            assert!(last.limit.contains("% behind its own GPU work)"), "{}", last.limit);
            assert!((last.step_ms.unwrap() - 20.0).abs() < 0.5, "{last:?}");
        }
    }

    #[test]
    fn a_client_without_the_split_reads_back_pressure_as_waiting() {
        // The same GPU-bound loop from a client that does not report `gpu_wait_ns` (1.1): its
        // back-pressure reads as a wait for data, and the tuner grows depth on it (what the
        // split above prevents).
        let mut sim = Sim {
            cost: Duration::from_millis(1),
            step: Duration::from_millis(6),
            gpu: Duration::from_millis(14),
            batch: 64,
            slots: 6,
            ..Sim::default()
        };
        let mut tuner = Tuner::new(Config::default());
        let (mut threads, mut depth) = (15, 3);
        for _ in 0..10 {
            let mut c = sim.interval(threads, TICK);
            c.gpu_wait_ns = 0;
            let d = tuner.tick(TICK, 15, 16, &[obs(1, threads, depth, c, 64, 6)]);
            (threads, depth) = (d[0].threads, d[0].depth);
        }
        assert!(depth > 3, "{depth}");
    }

    #[test]
    fn the_first_interval_of_a_stream_is_read_but_not_acted_on() {
        // The interval of the client's first `start`: the threads idled before it (11 % busy over
        // the interval), and the loop waited for its first batch (100 %, no compute yet). Acted
        // on, it read "waiting 100.0% with threads 11% busy: one batch more in flight".
        let mut tuner = Tuner::new(Config::default());
        let c = Counters {
            samples: 64,
            stage_ns: [0, 220_000_000, 0, 0],
            timed: 64,
            busy_ns: 220_000_000,
            steps: 1,
            wait_ns: 400_000_000,
            compute_ns: 0,
            gpu_wait_ns: 0,
            gpu_samples: 0,
            gpu_decode_ns: 0,
            gpu_decode_wait_ns: 0,
        };
        let mut o = obs(1, 4, 2, c, 64, 4);
        o.active = Some(Duration::from_millis(100));
        let d = tuner.tick(TICK, 15, 16, &[o]);
        assert_eq!(
            (d[0].threads, d[0].depth, d[0].reason.as_deref()),
            (4, 2, None),
            "{d:?}"
        );
        // Its busy share counts from the start: 220 ms of thread time in 4 × 100 ms.
        assert!((d[0].busy.unwrap() - 0.55).abs() < 1e-9, "{d:?}");
        assert!(
            d[0].limit.starts_with(
                "starting, too early to act on (the stream's first batches): the training loop waits for data 100.0% of its time"
            ),
            "{}",
            d[0].limit
        );
    }

    #[test]
    fn reasons_say_who_waits_for_what() {
        // The wording of every reason and reading, pinned: the training loop waits for data (or
        // behind its own GPU), the decode threads are busy; never a bare "waiting".
        let s = Signals {
            wait: Some(0.632),
            gpu_wait: Some(0.021),
            decode_wait: None,
            busy: 0.98,
            threads: 15,
        };
        assert_eq!(
            s.reading(0.632),
            "the training loop waits for data 63.2% of its time (and 2.1% behind its own GPU work); its 15 decode threads are 98% busy"
        );
        let one = Signals {
            wait: Some(1.0),
            gpu_wait: None,
            decode_wait: None,
            busy: 0.11,
            threads: 1,
        };
        assert_eq!(
            one.reading(1.0),
            "the training loop waits for data 100.0% of its time; its 1 decode thread is 11% busy"
        );
        assert_eq!(
            Limit::Cpu.describe(&s, 0.632, 15),
            "the CPU is the limit (15 decode threads at most): the training loop waits for data 63.2% of its time (and 2.1% behind its own GPU work); its 15 decode threads are 98% busy"
        );
        assert!(
            Limit::Depth
                .describe(&one, 1.0, 4)
                .starts_with("bursts: the training loop waits for data")
        );
        assert_eq!(
            Limit::NoStep.describe(&one, 0.0, 4),
            "no step of the training loop ended in this interval (a long step, or a pause); its 1 decode thread was 11% busy"
        );
        assert!(
            Limit::Latency
                .describe(&one, 1.0, 4)
                .starts_with("latency, every slot in flight: the training loop waits for data")
        );
        let decoder = Signals {
            decode_wait: Some(0.5),
            ..s
        };
        assert_eq!(
            Limit::GpuDecode.describe(&decoder, 0.632, 15),
            "the GPU decoder is the limit: the training loop waits for data 63.2% of its time, 50.0% of it for its GPU decodes (and 2.1% behind its own GPU work); its 15 decode threads are 98% busy"
        );
        let gpu = Signals {
            wait: Some(0.002),
            gpu_wait: Some(0.7),
            decode_wait: None,
            busy: 0.3,
            threads: 4,
        };
        assert_eq!(
            Limit::Fed.describe(&gpu, 0.002, 15),
            "fed, the GPU is the limit: the training loop waits for data 0.2% of its time (and 70.0% behind its own GPU work); its 4 decode threads are 30% busy"
        );
        assert_eq!(
            need_reason(5.4, 256, 53.11e6, 1124e3, 7, 6),
            "the training loop can take 4820 samples/s (a batch of 256 per 53.1 ms of its own step); at 1124 µs of thread time per sample that needs 5.4 decode threads: 7 → 6"
        );

        // And the reasons the tuner gives when it acts, from a run: depth for bursts, threads when
        // saturated, the probes.
        let mut tuner = Tuner::new(Config::default());
        let interval = |busy: f64, wait: f64| Counters {
            samples: 1280,
            stage_ns: [0, (busy * 4.0 * 5e8) as u64, 0, 0],
            timed: 1280,
            busy_ns: (busy * 4.0 * 5e8) as u64,
            steps: 5,
            wait_ns: (5e8 * wait / (1.0 - wait)) as u64,
            compute_ns: 500_000_000,
            gpu_wait_ns: 0,
            gpu_samples: 0,
            gpu_decode_ns: 0,
            gpu_decode_wait_ns: 0,
        };
        // 1280 samples at 0.2 × 4 × 0.5 s: 625 µs each; 5 steps of 100 ms: 1.6 threads needed.
        tuner.tick(TICK, 15, 16, &[obs(1, 4, 2, interval(0.2, 0.3), 256, 4)]);
        let d = tuner.tick(TICK, 15, 16, &[obs(1, 4, 2, interval(0.2, 0.3), 256, 4)]);
        assert_eq!(
            d[0].reason.as_deref(),
            Some(
                "the training loop waits for data 30.0% of its time; its 4 decode threads are 20% busy: one batch more in flight (depth 2 → 3)"
            ),
            "{d:?}"
        );
    }

    /// Runs a hybrid-decode stream whose share the tuner sets, under a `budget` of threads;
    /// returns (threads, share, wait) per tick.
    fn drive_gpu(sim: &mut Sim, budget: u32, ticks: usize) -> Vec<(u32, f64, f64)> {
        drive_gpu_with(sim, budget, ticks, |_, _| {})
    }

    /// The same, with `tamper(counters, share)` changing each interval's counters before the
    /// tuner reads them (a slow interval, say).
    fn drive_gpu_with(
        sim: &mut Sim,
        budget: u32,
        ticks: usize,
        tamper: impl FnMut(&mut Counters, f64),
    ) -> Vec<(u32, f64, f64)> {
        drive_gpu_phases(sim, budget, ticks, |_, _| {}, tamper)
    }

    /// The same under one tuner, with `phase(tick, sim)` called before each interval (to change
    /// the model's regime mid-run).
    fn drive_gpu_phases(
        sim: &mut Sim,
        budget: u32,
        ticks: usize,
        mut phase: impl FnMut(usize, &mut Sim),
        mut tamper: impl FnMut(&mut Counters, f64),
    ) -> Vec<(u32, f64, f64)> {
        let mut tuner = Tuner::new(Config::default());
        let (mut threads, mut depth) = (budget, 3);
        let mut out = Vec::new();
        for tick in 0..ticks {
            phase(tick, sim);
            let mut delta = sim.interval(threads, TICK);
            tamper(&mut delta, sim.share);
            let mut o = obs(1, threads, depth, delta, sim.batch, sim.slots);
            o.gpu = Some((crate::stats::GpuMode::Auto, sim.share));
            o.pixels = sim.pixels;
            let d = tuner.tick(TICK, budget, 64, &[o]).remove(0);
            threads = d.threads;
            depth = d.depth;
            if let Some(s) = d.gpu_share {
                sim.share = s;
            }
            assert_eq!(
                d.pixels.is_some(),
                sim.pixels.is_some(),
                "a setting only for a stream that has them"
            );
            if d.pixels.is_some() {
                sim.pixels = d.pixels;
            }
            let total = (delta.wait_ns + delta.compute_ns).max(1) as f64;
            out.push((threads, sim.share, (delta.wait_ns - delta.gpu_wait_ns) as f64 / total));
        }
        out
    }

    #[test]
    fn the_gpu_shares_bounds_belong_to_their_regime() {
        // First GPU decode costs the model 300 µs a sample (the share settles low, with a bound
        // learned above it); then the model's regime changes (its decode no longer competes:
        // 10 µs), so that at the settled share its step is less than half what it was. The
        // bounds learned in the first regime no longer hold: the share rises to where the CPU
        // can feed the loop (at least 0.69, as with no competition from the start).
        let mut sim = Sim {
            step: Duration::from_millis(20),
            slow: Duration::from_micros(300),
            ..Sim::default()
        };
        let run: Vec<f64> = drive_gpu_phases(
            &mut sim,
            6,
            240,
            |tick, sim| {
                if tick == 120 {
                    sim.slow = Duration::from_micros(10);
                }
            },
            |_, _| {},
        )
        .iter()
        .map(|r| r.1)
        .collect();
        assert!(
            run[90..120].iter().all(|&s| (0.25 - 1e-9..=0.5 + 1e-9).contains(&s)),
            "{run:?}"
        );
        let best = best_pinned_rate(&sim, 6);
        let end = *run.last().unwrap();
        assert!(end >= 0.625 - 1e-9, "stuck at {end}: {:?}", &run[110..]);
        assert!(pinned_rate(&sim, 6, end) >= 0.95 * best, "{end}: {:?}", &run[110..]);
    }

    #[test]
    fn the_gpu_share_rises_while_the_cpu_is_the_limit_until_the_loop_is_fed() {
        // 6 threads at 1.5 ms a sample feed 4,000 samples/s; the loop takes 12,800 (256 per
        // 20 ms). GPU decode costs the model nothing here: only a share of at least 0.69 feeds it.
        let mut sim = Sim {
            step: Duration::from_millis(20),
            ..Sim::default()
        };
        let run = drive_gpu(&mut sim, 6, 80);
        let (_, share, wait) = *run.last().unwrap();
        assert!((0.69..=0.875).contains(&share), "share {share}: {run:?}");
        assert!(wait < 0.02, "the loop still waits {wait}: {run:?}");
        // The cost model took it there in few changes (raises of at most `gpu_max_raise`: 0.25,
        // 0.5, 0.75, then the probe down and back), and it settled.
        let changes = run.windows(2).filter(|w| w[1].1 != w[0].1).count();
        assert!(changes <= 5, "{changes} changes: {run:?}");
        assert!(run[60..].windows(2).all(|w| w[1].1 == w[0].1), "{run:?}");
    }

    /// The sim's rate (samples/s) at a share pinned at `share` with `threads`: what the best
    /// setting could reach.
    fn pinned_rate(sim: &Sim, threads: u32, share: f64) -> f64 {
        let own = sim.step.as_secs_f64() + share * f64::from(sim.batch) * sim.slow.as_secs_f64();
        let cost = sim.cost.as_secs_f64() * (1.0 - share).max(0.02);
        let decoder = Sim { share, ..*sim }.decoder_rate();
        (f64::from(threads) / cost).min(f64::from(sim.batch) / own).min(decoder)
    }

    /// The best of [`pinned_rate`] over the shares in eighths.
    fn best_pinned_rate(sim: &Sim, threads: u32) -> f64 {
        (0..=8)
            .map(|k| pinned_rate(sim, threads, f64::from(k) / 8.0))
            .fold(0.0, f64::max)
    }

    #[test]
    fn the_gpu_share_settles_where_a_batch_is_fastest_when_gpu_decode_slows_the_model() {
        // 6 threads at 1.5 ms a sample; the loop's 20 ms step grows by `slow` per GPU sample
        // (GPU decode competing with the model). The best share balances the CPU's part of a
        // batch against the longer step: about 0.70 at 10 µs (the step grows 9 % there, and a
        // batch still takes a third of what the CPU alone needs), about 0.31 at 300 µs.
        for (slow_us, lo, hi) in [(10, 0.625, 0.875), (300, 0.25, 0.5)] {
            let mut sim = Sim {
                step: Duration::from_millis(20),
                slow: Duration::from_micros(slow_us),
                ..Sim::default()
            };
            let run = drive_gpu(&mut sim, 6, 120);
            let tail = &run[90..];
            assert!(
                tail.iter().all(|r| (lo - 1e-9..=hi + 1e-9).contains(&r.1)),
                "slow {slow_us} µs: {tail:?}"
            );
            // What it ends on is within 5 % of the best pinned share's rate (in eighths).
            let best = best_pinned_rate(&sim, 6);
            let got = pinned_rate(&sim, 6, run.last().unwrap().1);
            assert!(got >= 0.95 * best, "slow {slow_us} µs: {got} of {best}: {run:?}");
            // And it settled: the tail has at most the one probe down and back.
            let changes = tail.windows(2).filter(|w| w[1].1 != w[0].1).count();
            assert!(changes <= 2, "slow {slow_us} µs: {changes} changes: {tail:?}");
        }
    }

    #[test]
    fn decoded_pixels_come_on_when_the_cpu_is_the_limit_at_the_shares_top_and_stay_where_they_feed() {
        // 6 threads at 1 ms a sample, a 20 ms step (12,800 samples/s wanted): the GPU decoder
        // keeps up with 13,300 samples/s at a share of 0.5 and 10,700 at 0.625, so the share's top
        // is 0.5, where the CPU (12,000) is still the limit. Decoded pixels take 15 % off a CPU
        // sample for 1 µs of the step each: on, the loop is fed better, and they stay on.
        let mut sim = Sim {
            cost: Duration::from_millis(1),
            step: Duration::from_millis(20),
            engine: Duration::from_micros(150),
            pixels: Some(false),
            pixel_slow: Duration::from_micros(1),
            ..Sim::default()
        };
        let run = drive_gpu(&mut sim, 6, 160);
        assert_eq!(sim.pixels, Some(true), "{run:?}");
        assert!((sim.share - 0.5).abs() < 1e-9, "{run:?}");
        let tail = &run[120..];
        assert!(tail.iter().all(|r| (r.1 - 0.5).abs() < 1e-9), "{tail:?}");
        // Better than the share's top without them.
        let mut without = Sim {
            pixels: Some(false),
            share: 0.5,
            ..sim
        };
        let mut with = Sim {
            pixels: Some(true),
            share: 0.5,
            ..sim
        };
        let rate = |s: &mut Sim| (0..8).map(|_| s.interval(6, TICK).samples).sum::<u64>();
        assert!(rate(&mut with) > rate(&mut without));
    }

    #[test]
    fn a_loop_the_cpu_feeds_never_gets_decoded_pixels_and_ones_that_cost_more_go_off_again() {
        // A 100 ms step the 6 threads feed at a share of 0: the CPU is never the limit, so the
        // GPU's time is not spent on pixels.
        let mut sim = Sim {
            cost: Duration::from_millis(1),
            pixels: Some(false),
            pixel_slow: Duration::from_micros(1),
            ..Sim::default()
        };
        let run = drive_gpu(&mut sim, 6, 80);
        assert_eq!(sim.pixels, Some(false), "{run:?}");
        assert!(run[40..].iter().all(|r| r.1 == 0.0), "{run:?}");
        // Pixels whose GPU work costs the step more than they save the CPU (40 µs a sample):
        // turned on at the share's top, undone, and not tried again.
        let mut sim = Sim {
            cost: Duration::from_millis(1),
            step: Duration::from_millis(20),
            engine: Duration::from_micros(150),
            pixels: Some(false),
            pixel_slow: Duration::from_micros(40),
            ..Sim::default()
        };
        let run = drive_gpu(&mut sim, 6, 160);
        assert_eq!(sim.pixels, Some(false), "{run:?}");
        let mut on = 0;
        let mut seen = Sim {
            pixels: Some(false),
            ..sim
        };
        let mut tuner = Tuner::new(Config::default());
        let (mut threads, mut depth) = (6, 3);
        for _ in 0..160 {
            let delta = seen.interval(threads, TICK);
            let mut o = obs(1, threads, depth, delta, seen.batch, seen.slots);
            o.gpu = Some((crate::stats::GpuMode::Auto, seen.share));
            o.pixels = seen.pixels;
            let d = tuner.tick(TICK, 6, 64, &[o]).remove(0);
            (threads, depth) = (d.threads, d.depth);
            if let Some(s) = d.gpu_share {
                seen.share = s;
            }
            if d.pixels == Some(true) && seen.pixels == Some(false) {
                on += 1;
            }
            seen.pixels = d.pixels;
        }
        assert!(on <= 1, "turned on {on} times");
    }

    #[test]
    fn a_gpu_share_above_what_the_cpu_needs_is_probed_down_and_kept_where_the_cpu_can_feed() {
        // GPU decode costs the model nothing here. The cost model's jump lands on 0.75, which
        // feeds the loop (the CPU alone feeds a third of it); the probe tries 0.625, finds the
        // CPU the limit there, goes back and stays.
        let mut sim = Sim {
            step: Duration::from_millis(20),
            ..Sim::default()
        };
        let run = drive_gpu(&mut sim, 6, 120);
        assert!(run[100..].iter().all(|r| (r.1 - 0.75).abs() < 1e-9), "{run:?}");
        assert!(
            run.iter().any(|r| r.1 <= 0.625 + 1e-9 && r.1 > 0.0),
            "no probe below: {run:?}"
        );
    }

    #[test]
    fn a_lower_share_that_makes_the_cpu_the_limit_is_kept_when_a_batch_is_faster() {
        // 6 threads at 1.684 ms a sample; the step grows 40 µs per GPU sample. At 0.75 the CPU
        // keeps up and a batch takes the model's 27.7 ms; at 0.625 the CPU is the limit (the loop
        // waits 2 %), yet a batch takes its 26.9 ms: 2.7 % faster. The probe to 0.625 stays (it
        // used to go back because the CPU had become the limit), and the share is not raised back.
        let mut sim = Sim {
            step: Duration::from_millis(20),
            slow: Duration::from_micros(40),
            cost: Duration::from_micros(1684),
            ..Sim::default()
        };
        let run = drive_gpu(&mut sim, 6, 120);
        assert!(run.iter().any(|r| (r.1 - 0.75).abs() < 1e-9), "never at 0.75: {run:?}");
        assert!(run[100..].iter().all(|r| (r.1 - 0.625).abs() < 1e-9), "{run:?}");
        assert!(pinned_rate(&sim, 6, 0.625) > 1.02 * pinned_rate(&sim, 6, 0.75));
    }

    #[test]
    fn a_feed_with_no_step_of_its_own_settles_where_the_cpu_and_the_gpu_decoder_share_the_batch() {
        // The H200's corpus feed with no model (hybrid_feed.py, 2026-12-02): 15 threads at 1.3 ms
        // a sample (11,500 samples/s alone), a GPU decoder at 69 µs a sample (14,500/s alone),
        // and a loop that takes a batch every 0.5 ms. The cost model, seeing no step, asks for all
        // of each batch on the GPU; before 1.5 the tuner went 0 → 1.0 at once and stayed there
        // (8,300 img/s against 21,900 at 0.625). Now a raise goes at most 0.25 at a time, the
        // loop's wait for its GPU decodes reads as the decoder's limit, and the share comes back
        // to where the two share the batch (0.5 or 0.625: 23,000 samples/s).
        let mut sim = Sim {
            step: Duration::from_micros(500),
            cost: Duration::from_micros(1300),
            engine: Duration::from_micros(69),
            ..Sim::default()
        };
        let run = drive_gpu(&mut sim, 15, 120);
        let best = best_pinned_rate(&sim, 15);
        let tail = &run[80..];
        for r in tail {
            let got = pinned_rate(&sim, 15, r.1);
            assert!(got >= 0.95 * best, "share {}: {got} of {best}: {run:?}", r.1);
        }
        assert!(run.iter().all(|r| r.1 < 1.0 - 1e-9), "{run:?}");
        // It settled: at most a probe down and back in the tail.
        let changes = tail.windows(2).filter(|w| w[1].1 != w[0].1).count();
        assert!(changes <= 2, "{changes} changes: {tail:?}");
    }

    #[test]
    fn a_share_the_gpu_decoder_cannot_keep_up_with_comes_down_and_is_not_raised_again() {
        // A model's loop (20 ms a step, 12,800 samples/s) fed by 6 threads at 1.5 ms a sample
        // (4,000/s) and a GPU decoder at 150 µs a sample (6,700/s alone): the CPU alone starves
        // the loop, all of it on the decoder starves it too. The best share in eighths is 0.625
        // (the CPU's 10,700/s, the decoder's 10,700/s); at 0.875 or 1.0 the loop waits for its
        // GPU decodes. Whatever the cost model asks for, the share ends within 5 % of the best,
        // and while the decoder is the limit the share is never raised.
        let mut sim = Sim {
            step: Duration::from_millis(20),
            engine: Duration::from_micros(150),
            ..Sim::default()
        };
        let mut tuner = Tuner::new(Config::default());
        let (mut threads, mut depth) = (6, 3);
        let (mut run, mut reasons) = (Vec::new(), Vec::new());
        for _ in 0..120 {
            let delta = sim.interval(threads, TICK);
            let mut o = obs(1, threads, depth, delta, sim.batch, sim.slots);
            o.gpu = Some((crate::stats::GpuMode::Auto, sim.share));
            let d = tuner.tick(TICK, 6, 16, &[o]).remove(0);
            if d.kind == Limit::GpuDecode {
                assert!(d.gpu_share.is_none_or(|s| s < sim.share), "raised by {d:?}");
                assert!(d.limit.starts_with("the GPU decoder is the limit"), "{}", d.limit);
                assert!(d.limit.contains("of it for its GPU decodes"), "{}", d.limit);
            }
            threads = d.threads;
            depth = d.depth;
            if let Some(s) = d.gpu_share {
                sim.share = s;
            }
            run.push((sim.share, d.kind));
            reasons.extend(d.reason);
        }
        assert!(run.iter().any(|r| r.1 == Limit::GpuDecode), "{run:?}");
        // The changes say why: the decoder, not the model.
        assert!(
            reasons.iter().any(|r| r.contains("the GPU decoder is the limit")
                || r.contains("the loop waits for its GPU decodes")),
            "{reasons:?}"
        );
        let best = best_pinned_rate(&sim, 6);
        let end = run.last().unwrap().0;
        assert!(pinned_rate(&sim, 6, end) >= 0.95 * best, "{end}: {run:?}");
    }

    #[test]
    fn a_client_that_does_not_report_its_decode_wait_is_read_as_before() {
        // The same counters without `gpu_decode_wait_ns` (a 1.4 client): the wait is the CPU's.
        let base = Signals {
            wait: Some(0.3),
            gpu_wait: Some(0.01),
            decode_wait: None,
            busy: 0.99,
            threads: 6,
        };
        assert!(!base.gpu_decoder_limits());
        assert!(
            !Signals {
                decode_wait: Some(0.15),
                ..base
            }
            .gpu_decoder_limits()
        );
        assert!(
            Signals {
                decode_wait: Some(0.16),
                ..base
            }
            .gpu_decoder_limits()
        );
        let c = Counters {
            steps: 10,
            wait_ns: 300,
            compute_ns: 700,
            gpu_decode_wait_ns: 200,
            ..Counters::default()
        };
        let s = Signals::of(&c, 6, 1e9, false);
        assert_eq!(s.decode_wait, Some(0.2));
        assert!(s.gpu_decoder_limits());
        assert_eq!(
            Signals::of(
                &Counters {
                    gpu_decode_wait_ns: 0,
                    ..c
                },
                6,
                1e9,
                false
            )
            .decode_wait,
            None
        );
    }

    #[test]
    fn one_slow_interval_after_a_raise_does_not_undo_it() {
        // The first batches with GPU samples compile the finishing kernel and start the decoder:
        // one interval right after the first raise holds 3 s more of the loop's compute. The
        // raise takes a batch from 64 ms (the CPU alone) to 40 ms (the model's step); averaged,
        // that interval would read as a slower batch. The raise stays.
        let mut sim = Sim {
            step: Duration::from_millis(40),
            ..Sim::default()
        };
        let mut spiked = false;
        let run = drive_gpu_with(&mut sim, 6, 40, |delta, share| {
            if share > 0.0 && !spiked {
                spiked = true;
                delta.compute_ns += 3_000_000_000;
                delta.steps = delta.steps.max(1);
            }
        });
        let shares: Vec<f64> = run.iter().map(|r| r.1).collect();
        assert!(spiked);
        let first = shares.iter().position(|&s| s > 0.0).unwrap();
        // (0.375 is where the CPU's part of a batch takes the model's 40 ms: the probes find it.)
        assert!(shares[first..].iter().all(|&s| s >= 0.25), "{shares:?}");
        assert!(shares[30..].iter().all(|&s| s == 0.375), "{shares:?}");
    }

    #[test]
    fn a_first_raise_undone_by_the_decoders_start_may_be_tried_again() {
        // The client's decoder starts with the first GPU batches: for 1.5 s after the first
        // raise every batch is slow. That raise is undone, but sets no ceiling: the next raise
        // goes as high, and stays.
        let mut sim = Sim {
            step: Duration::from_millis(20),
            ..Sim::default()
        };
        let mut slow_left = 3;
        let run = drive_gpu_with(&mut sim, 6, 40, |delta, share| {
            if share > 0.0 && slow_left > 0 {
                // Two steps ended in the interval, each much longer than the model's.
                slow_left -= 1;
                delta.compute_ns += 1_000_000_000;
                delta.steps = 2;
            }
        });
        let shares: Vec<f64> = run.iter().map(|r| r.1).collect();
        let first = shares.iter().position(|&s| s > 0.0).unwrap();
        let undone = first
            + shares[first..]
                .iter()
                .position(|&s| s == 0.0)
                .unwrap_or_else(|| panic!("the first raise is undone: {shares:?}"));
        let top = shares[..undone].iter().copied().fold(0.0, f64::max);
        assert!(shares[30..].iter().all(|&s| s >= top - 1e-9), "{shares:?}");
    }

    #[test]
    fn a_stream_that_starts_small_keeps_its_start_until_the_client_reports() {
        // A token stream starts at one thread; before its first stats it is not given the
        // budget (an image stream is), and once the loop reports, the rules take over.
        let mut tuner = Tuner::new(Config::default());
        let idle = Counters::default();
        let mut tok = obs(1, 1, 3, idle, 16, 8);
        tok.reported = false;
        tok.start_threads = Some(1);
        let mut img = obs(2, 1, 3, idle, 256, 8);
        img.reported = false;
        let d = tuner.tick(TICK, 12, 16, &[tok, img]);
        assert_eq!((d[0].threads, d[1].threads), (1, 11), "{d:?}");
        // Reported: a loop that waits with its one thread saturated gets more.
        let mut sim = Sim::default();
        let mut tok = obs(1, 1, 3, sim.interval(1, TICK), 16, 8);
        tok.start_threads = Some(1);
        let mut threads = 1;
        for _ in 0..6 {
            tok.threads = threads;
            tok.delta = sim.interval(threads, TICK);
            threads = tuner.tick(TICK, 12, 16, std::slice::from_ref(&tok))[0].threads;
        }
        assert!(threads > 1, "{threads}");
    }

    #[test]
    fn a_fed_loop_or_a_pinned_share_is_left_alone() {
        // 6 threads feed a 200 ms step easily: the share never leaves 0.
        let mut sim = Sim::default();
        let run = drive_gpu(&mut sim, 6, 40);
        assert!(run.iter().all(|r| r.1 == 0.0), "{run:?}");
        // A pinned share is the client's: the tuner sends none.
        let mut sim = Sim {
            step: Duration::from_millis(20),
            ..Sim::default()
        };
        let mut tuner = Tuner::new(Config::default());
        for _ in 0..20 {
            let delta = sim.interval(6, TICK);
            let mut o = obs(1, 6, 3, delta, sim.batch, sim.slots);
            o.gpu = Some((crate::stats::GpuMode::Pinned, 0.25));
            assert_eq!(tuner.tick(TICK, 6, 64, &[o]).remove(0).gpu_share, None);
        }
    }

    /// The fetch knob against a simulated store: each download slot brings 0.5 shards/s; a cold
    /// epoch's loop needs `need` shards/s (0: everything is cached). Each simulated second, the
    /// loop waits for the share of its need the slots do not bring, its 4 readers wait with it,
    /// and the slots are busy with what they bring.
    #[test]
    fn fetch_concurrency_rises_while_downloads_starve_the_loop_and_falls_when_fed() {
        let cfg = Config::default();
        let bands = cfg.bands(None);
        let sim = |n: usize, need: f64, max: usize| {
            let brought = (n as f64 * 0.5).min(need);
            let wait = if need > 0.0 { 1.0 - brought / need } else { 0.0 };
            FetchObservation {
                concurrency: n,
                max,
                fetch_wait: wait * 4.0,
                fetch_busy: brought / 0.5 / n as f64,
                limits: vec![if wait > bands.waiting {
                    Limit::Threads
                } else {
                    Limit::Fed
                }],
            }
        };
        let run = |tuner: &mut FetchTuner, n: &mut usize, need: f64, max: usize, secs: u32| {
            let mut seen = Vec::new();
            for _ in 0..secs {
                if let Some((next, why)) = tuner.tick(&cfg, &sim(*n, need, max)) {
                    assert!(next.abs_diff(*n) == 1 || next == max, "{why}");
                    *n = next;
                }
                seen.push(*n);
            }
            seen
        };
        // A cold epoch needing 3 shards/s: from 2 slots up to the 6 that bring it, one a second,
        // then kept (every slot is used).
        let (mut t, mut n) = (FetchTuner::default(), 2);
        let seen = run(&mut t, &mut n, 3.0, 32, 30);
        assert_eq!(&seen[..5], &[3, 4, 5, 6, 6]);
        assert!(seen[5..].iter().all(|&x| x == 6), "{seen:?}");
        // The cache's bound holds only 4 of the shards: never more, and a setting above comes down.
        let (mut t, mut n) = (FetchTuner::default(), 2);
        assert!(run(&mut t, &mut n, 3.0, 4, 30).iter().all(|&x| x <= 4));
        assert_eq!(n, 4);
        let mut high = 8;
        assert_eq!(run(&mut FetchTuner::default(), &mut high, 3.0, 4, 1), [4]);
        // Fed with slots to spare (a later epoch from the cache, or a need of 1 shard/s): one
        // fewer every `calm_intervals` seconds, down to what is used (1 slot; for 1 shard/s, the
        // 2 it takes and one of headroom).
        let mut n = 6;
        let seen = run(&mut t, &mut n, 0.0, 32, 40);
        assert_eq!(seen[cfg.calm_intervals as usize - 1], 5);
        assert_eq!(n, 1);
        let mut n = 6;
        run(&mut FetchTuner::default(), &mut n, 1.0, 32, 40);
        assert_eq!(
            n, 3,
            "two slots would be saturated by 1 shard/s: one of headroom is kept"
        );
        // A loop fed from the cache while slots are busy prefetching keeps them.
        let mut busy = sim(4, 0.0, 32);
        busy.fetch_busy = 0.9;
        let mut t = FetchTuner::default();
        assert!((0..20).all(|_| t.tick(&cfg, &busy).is_none()));
    }
}
