//! The autotuner (control.md, "Autotuning"): every interval it sets each stream's decode threads
//! and prefetch depth from what the training loop measured.
//!
//! The controller is a pure function of its observations and its own state, so it is tested
//! against a simulated clock and a simulated pipeline (see the tests). [`run`] is the thin tokio
//! task that feeds it the server's counters and applies its decisions.
//!
//! How it decides, per stream:
//! - **Model.** The client's compute time per step `C` and the batch size `B` give the rate the
//!   training loop consumes at when it never waits, `B / C` samples/s. The pool's measured cost per
//!   sample `c` (thread time) gives the threads that rate needs: `B c / C`. The stream wants that
//!   times [`Config::headroom`], rounded up.
//! - **Feedback.** Models are wrong in small ways (contention between threads, a step time that
//!   hides a synchronisation). If the loop still waits more than [`Config::wait_high`] of its
//!   time while the stream has what the model wants, the stream gets one thread more when its
//!   threads are saturated, else one batch more of depth (the wait comes from bursts, not from
//!   the rate). With idle threads and every slot in flight the wait is latency (an epoch's first
//!   batch, a client holding its slots), and nothing changes. The extra threads are shed one at a time after [`Config::calm_intervals`]
//!   intervals without waiting.
//! - **Hysteresis.** Growing is immediate; shrinking waits until the model has asked for fewer
//!   threads for [`Config::shrink_intervals`] intervals in a row, and then gives back at most a
//!   quarter of the threads per interval.
//! - **Probing (hill-climbing down).** With the loop fed and nothing changed for
//!   [`Config::probe_after`] intervals, one thread fewer is tried for [`Config::probe_intervals`];
//!   kept if the loop stays fed (the model's estimate is corrected by one), undone at once if it
//!   waits, and then not tried again (`floor`) until the step time moves by more than 20 %.
//! - **Budget.** Pinned streams (`autotune: false`) get what they asked for. The others share the
//!   rest of the CPU budget; when their wants exceed it, in proportion to their wants, and the
//!   threads left over by rounding go to the streams that wait most.

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
    /// A wait share above this is "waiting".
    pub wait_high: f64,
    /// A wait share below this is "not waiting" (a loop's own overhead inside its request for the
    /// next batch is about 1 %: receiving the message, making the views, queueing the copy).
    pub wait_low: f64,
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
}

impl Default for Config {
    fn default() -> Self {
        Config {
            headroom: 1.05,
            wait_high: 0.02,
            wait_low: 0.01,
            calm_intervals: 4,
            shrink_intervals: 3,
            saturated: 0.85,
            alpha: 0.5,
            band: 0.3,
            probe_after: 6,
            probe_intervals: 4,
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
    pub batch_size: u32,
    pub slots: u32,
    /// Settings in force over the interval.
    pub threads: u32,
    pub depth: u32,
    /// Counter differences over the interval.
    pub delta: Counters,
    /// Whether the client has ever sent `stats`.
    pub reported: bool,
}

/// A stream's new settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub id: u64,
    pub threads: u32,
    pub depth: u32,
    /// Why, when something changed.
    pub reason: Option<String>,
    /// The interval's wait share (None without `stats` in the interval).
    pub wait: Option<f64>,
    /// The moving average of the client's compute time per step, in ms.
    pub step_ms: Option<f64>,
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
    /// A probe found this many threads too few: no probe goes below `floor + 1` in this regime.
    floor: u32,
    /// The loop's step time when the probes' corrections were learned.
    regime_step: Option<f64>,
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
        struct Want {
            want: u32,
            depth: u32,
            wait: Option<f64>,
            reason: Option<String>,
        }
        let mut wants = Vec::with_capacity(obs.len());
        for o in obs {
            let st = self.streams.entry(o.id).or_default();
            let d = &o.delta;
            let wait = (d.steps > 0 && d.wait_ns + d.compute_ns > 0)
                .then(|| d.wait_ns as f64 / (d.wait_ns + d.compute_ns) as f64);
            if d.timed > 0 {
                let cost = d.stage_ns.iter().sum::<u64>() as f64 / d.timed as f64;
                st.cost_ns = Some(ewma(st.cost_ns, cost, cfg.alpha));
            }
            if d.steps > 0 {
                st.step_ns = Some(ewma(st.step_ns, d.compute_ns as f64 / d.steps as f64, cfg.alpha));
            }
            if let Some(w) = wait {
                st.wait = Some(ewma(st.wait, w, cfg.alpha));
            }
            let smoothed = wait.and(st.wait);
            if !o.autotune {
                let threads = o.max_threads.unwrap_or(pool).clamp(1, pool);
                wants.push(Want {
                    want: threads,
                    depth: o.depth,
                    wait,
                    reason: (threads != o.threads).then(|| format!("pinned by the client: {threads} threads")),
                });
                continue;
            }
            let cap = o.max_threads.unwrap_or(u32::MAX).clamp(1, free);
            let mut depth = o.depth;
            let mut reason = None;
            let want = match (o.reported, st.cost_ns, st.step_ns) {
                (false, _, _) => {
                    if o.threads != cap {
                        reason = Some(format!("no stats from the client: all {cap} threads of the budget"));
                    }
                    cap
                }
                (true, Some(cost), Some(step)) => {
                    let busy = d.stage_ns.iter().sum::<u64>() as f64 / (interval_ns * f64::from(o.threads.max(1)));
                    let need = f64::from(o.batch_size) * cost / step.max(1.0);
                    // A new regime (the loop's step changed by more than 20 % since the probes
                    // learned their correction) makes the model the authority again.
                    if st.regime_step.is_some_and(|s| (step / s - 1.0).abs() > 0.2) {
                        st.extra = 0;
                        st.floor = 0;
                        st.regime_step = None;
                        st.probe = None;
                    }
                    let want = if let Some(mut probe) = st.probe {
                        match wait {
                            Some(w) if w > cfg.wait_high => {
                                // One thread fewer is too few: back, and never below again in
                                // this regime.
                                st.probe = None;
                                st.floor = o.threads;
                                // The probe's own wait must not read as a need for more.
                                st.wait = None;
                                reason = Some(format!(
                                    "probe: {} threads made the loop wait {:.1}%: back to {}",
                                    o.threads,
                                    w * 100.0,
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
                                    reason = Some(format!("probe: {} threads keep the loop fed", o.threads));
                                }
                                o.threads
                            }
                        }
                    } else {
                        decide(
                            &cfg,
                            st,
                            o,
                            cap,
                            need,
                            cost,
                            step,
                            busy,
                            smoothed,
                            &mut depth,
                            &mut reason,
                        )
                    };
                    // Hill-climb down: with the loop fed and nothing changing for a while, try
                    // one thread fewer than the model's estimate (which carries headroom).
                    let fed = smoothed.is_some_and(|w| w < cfg.wait_low);
                    if want == o.threads && st.probe.is_none() && reason.is_none() {
                        st.stable += 1;
                        if fed && st.stable >= cfg.probe_after && o.threads > 1 && o.threads > st.floor + 1 {
                            st.stable = 0;
                            st.regime_step.get_or_insert(step);
                            st.probe = Some(Probe {
                                from: o.threads,
                                left: cfg.probe_intervals,
                            });
                            reason = Some(format!(
                                "probe: the loop has been fed for {} intervals; trying {} threads",
                                cfg.probe_after,
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
                // Reported, but no sample or step measured yet: keep what it has.
                (true, _, _) => o.threads.clamp(1, cap),
            };
            wants.push(Want {
                want,
                depth: depth.min(o.slots).max(1),
                wait,
                reason,
            });
        }

        // Share the budget.
        let auto: Vec<usize> = (0..obs.len()).filter(|&i| obs[i].autotune).collect();
        let total: u32 = auto.iter().map(|&i| wants[i].want).sum();
        if total > free {
            let mut given = 0;
            for &i in &auto {
                let share = ((u64::from(free) * u64::from(wants[i].want)) / u64::from(total)) as u32;
                wants[i].want = share.max(1);
                given += wants[i].want;
            }
            let mut by_wait = auto.clone();
            by_wait.sort_by(|&a, &b| {
                let (wa, wb) = (wants[a].wait.unwrap_or(1.0), wants[b].wait.unwrap_or(1.0));
                wb.total_cmp(&wa).then(a.cmp(&b))
            });
            for &i in by_wait.iter().cycle().take(free.saturating_sub(given) as usize) {
                wants[i].want += 1;
            }
            for &i in &auto {
                if wants[i].want != obs[i].threads && wants[i].reason.is_none() {
                    wants[i].reason = Some(format!(
                        "{} streams want {total} threads, the budget is {free}: {} → {}",
                        auto.len(),
                        obs[i].threads,
                        wants[i].want
                    ));
                }
            }
        }
        obs.iter()
            .zip(wants)
            .map(|(o, w)| Decision {
                id: o.id,
                threads: w.want,
                depth: w.depth,
                reason: w.reason,
                wait: w.wait,
                step_ms: self.streams.get(&o.id).and_then(|s| s.step_ns).map(|s| s / 1e6),
            })
            .collect()
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
    busy: f64,
    smoothed: Option<f64>,
    depth: &mut u32,
    reason: &mut Option<String>,
) -> u32 {
    let estimate = need * cfg.headroom + f64::from(st.extra);
    let base = (estimate.ceil().max(1.0)) as u32;
    match smoothed {
        Some(w) if w > cfg.wait_high => {
            st.calm = 0;
            if o.threads >= base.min(cap) {
                if busy >= cfg.saturated {
                    if base < cap {
                        st.extra += 1;
                        *reason = Some(format!(
                            "waiting {:.1}% with threads {:.0}% busy: one thread more",
                            w * 100.0,
                            busy * 100.0
                        ));
                    }
                } else if *depth < o.slots {
                    *depth += 1;
                    *reason = Some(format!(
                        "waiting {:.1}% with threads {:.0}% busy: one batch more in flight",
                        w * 100.0,
                        busy * 100.0
                    ));
                }
                // Otherwise the threads idle and every slot may be in flight: the wait is latency
                // (an epoch's first batch, a client holding its slots), which more threads would
                // not remove.
            }
        }
        Some(w) if w < cfg.wait_low => {
            st.calm += 1;
            if st.calm >= cfg.calm_intervals && st.extra > 0 {
                st.extra -= 1;
                st.calm = 0;
                *reason = Some(format!(
                    "no wait for {} intervals: one extra thread less",
                    cfg.calm_intervals
                ));
            }
        }
        _ => st.calm = 0,
    }
    // Grow as soon as the model asks for more; shrink only when it asks for clearly fewer
    // (`band`), so a need near a whole number does not flap.
    let exact = need * cfg.headroom + f64::from(st.extra);
    let grow = (exact.ceil().max(1.0) as u32).clamp(1, cap);
    let keep = ((exact + cfg.band).ceil().max(1.0) as u32).clamp(1, cap);
    let describe = |to: u32| {
        format!(
            "the loop needs {need:.1} threads ({} samples/s at {:.0} µs each): {} → {to}",
            (f64::from(o.batch_size) * 1e9 / step) as u64,
            cost / 1e3,
            o.threads
        )
    };
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
}

/// Runs the controller every `interval` until the future is dropped.
pub async fn run(target: Arc<dyn Target>, config: Config, interval: Duration) {
    let mut tuner = Tuner::new(config);
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
            let c = s.counters();
            let delta = c.since(last.get(&s.id).unwrap_or(&Counters::default()));
            seen.insert(s.id, c);
            busy_ns += delta.stage_ns.iter().sum::<u64>();
            obs.push(Observation {
                id: s.id,
                autotune: s.autotune,
                max_threads: s.max_threads,
                batch_size: s.batch_size,
                slots: s.slots,
                threads: s.threads.load(Ordering::Relaxed),
                depth: s.depth.load(Ordering::Relaxed),
                delta,
                reported: s.reported.load(Ordering::Relaxed),
            });
        }
        last = seen;
        let decisions = tuner.tick(elapsed, target.budget(), target.pool_threads(), &obs);
        let mut active = 0;
        for ((s, o), d) in streams.iter().zip(&obs).zip(decisions) {
            active += d.threads;
            s.threads.store(d.threads, Ordering::Relaxed);
            if d.depth != o.depth {
                s.depth.store(d.depth, Ordering::Relaxed);
                s.wake.notify_one();
            }
            let secs = elapsed.as_secs_f64().max(1e-9);
            let mut view = s.view.lock().unwrap_or_else(|p| p.into_inner());
            view.samples_per_s = o.delta.samples as f64 / secs;
            view.wait = d.wait;
            view.step_ms = d.step_ms;
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
    /// computes `step` per batch of `batch` samples; `depth` batches may be in flight.
    struct Sim {
        cost: Duration,
        step: Duration,
        batch: u32,
        slots: u32,
        noise: u64,
        carry: f64,
    }

    impl Sim {
        /// One interval under `threads`: the counters it produces.
        fn interval(&mut self, threads: u32, interval: Duration) -> Counters {
            let produce = f64::from(threads) / self.cost.as_secs_f64(); // samples/s
            let consume = f64::from(self.batch) / self.step.as_secs_f64();
            let rate = produce.min(consume);
            let secs = interval.as_secs_f64();
            // Whole steps end in an interval; the rest carries over to the next.
            let exact = rate * secs / f64::from(self.batch) + self.carry;
            let steps = exact.floor();
            self.carry = exact - steps;
            let busy_secs = rate * secs / f64::from(self.batch) * self.step.as_secs_f64();
            let compute = steps * self.step.as_secs_f64();
            let wait = (secs - busy_secs).max(0.0);
            // Deterministic ±5 % noise on the cost (contention, page cache).
            self.noise = self
                .noise
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let jitter = 0.95 + 0.1 * ((self.noise >> 33) as f64 / (1u64 << 31) as f64);
            let samples = steps * f64::from(self.batch);
            let busy = samples * self.cost.as_secs_f64() * jitter;
            Counters {
                samples: samples as u64,
                stage_ns: [0, (busy * 1e9) as u64, 0, 0],
                timed: samples as u64,
                steps: steps as u64,
                wait_ns: (wait * 1e9) as u64,
                compute_ns: (compute * 1e9) as u64,
            }
        }
    }

    fn obs(id: u64, threads: u32, depth: u32, delta: Counters, batch: u32, slots: u32) -> Observation {
        Observation {
            id,
            autotune: true,
            max_threads: None,
            batch_size: batch,
            slots,
            threads,
            depth,
            delta,
            reported: true,
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

    #[test]
    fn a_slow_consumer_sheds_threads() {
        let mut sim = Sim {
            cost: Duration::from_micros(1500),
            step: Duration::from_millis(400),
            batch: 256,
            slots: 4,
            noise: 7,
            carry: 0.0,
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
            steps: 1,
            wait_ns: wait_ms * 1_000_000,
            compute_ns: step_ms * 1_000_000,
        };
        // Stream 1 needs 7.7 threads (8.1 with headroom → 9), stream 2 needs 3.84 (4.03 → 5).
        let a = obs(1, 4, 2, busy(50, 0), 256, 4);
        let b = obs(2, 4, 2, busy(100, 300), 256, 4);
        let d = tuner.tick(TICK, 10, 16, &[a, b]);
        assert_eq!(d.iter().map(|d| d.threads).sum::<u32>(), 10);
        // 9:5 of 10 → 6 and 3, and the leftover thread goes to the waiting stream 2.
        assert_eq!((d[0].threads, d[1].threads), (6, 4), "{d:?}");
    }
}
