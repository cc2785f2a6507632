//! Mixing several token datasets into one stream by weight (`proto/control.md`, "Mixing").
//!
//! A mixed stream's epoch is a sequence of `N = Σ nᵢ` window slots (nᵢ: the windows of dataset
//! *i*). Slot *k* goes to the dataset that the **quota method** (Balinski & Young, 1975) picks for
//! house size `k + 1`: among the datasets still under their upper quota (`cᵢ < pᵢ·(k+1)`, with
//! `cᵢ` the slots dataset *i* already has), the one with the largest `pᵢ / (cᵢ + 1)`, ties to the
//! lower index. It stays within quota at every prefix, which the greedy "largest sampling error
//! first" rule (Megatron's) does not for three or more datasets: after any `n` slots every
//! dataset has `⌊pᵢ·n⌋` or `⌈pᵢ·n⌉` of them. Weights are quantised to integers `rᵢ` whose total
//! `R` is about 2²⁰ ([`quantise`]) and the rule runs in exact integer arithmetic, so it is the same
//! in every language.
//!
//! **The schedule is periodic with period `R`** (the proof is in control.md, "Mixing"): after `R`
//! slots every dataset has exactly `rᵢ`, and from there the rule's comparisons are those of house
//! size 0 again (both sides of `rᵢ·(c_b + 1) > r_b·(cᵢ + 1)` gain `rᵢ·r_b`). So the open computes
//! one period (or the epoch, if shorter): `min(N, R)` slots, each with its dataset and its rank
//! among that dataset's slots of the period, in O(min(N, R)·log D) time and 5 bytes per slot
//! (at most about 5 MiB, whatever the datasets' sizes). Slot *k* is then found by arithmetic:
//! dataset `i = slot[k mod R]`, its `(⌊k / R⌋·rᵢ + rank[k mod R])`-th slot.
//!
//! The slot sequence is the same every epoch (it depends on the weights only); the sampler then
//! stripes slots over ranks in order, so every global prefix of the stream (what all ranks have
//! consumed together) holds the weights' proportions, and a resume by global position keeps
//! them. Shuffling happens inside each dataset: the *j*-th slot of dataset *i* is window
//! `πᵢ(j mod nᵢ)` where `πᵢ` is a permutation of `0..nᵢ` keyed by `(seed, epoch, i, ⌊j / nᵢ⌋)`
//! (each pass over an up-sampled dataset is a new permutation), so a window repeats only when
//! its dataset's weight asks for more than it has.
//!
//! A stream of one dataset is ordered the same way, as a mix of one: the window at position `k`
//! is `π₀(k)`, computed when a batch asks for it, so no token stream holds anything
//! proportional to its windows (the sampler's plan of a token stream is the identity).

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// Weight quantisation, first step: the largest weight becomes 2³².
const SCALE: f64 = 4_294_967_296.0;
/// Second step: the quantised weights are rescaled to a total of about 2²⁰ (the period).
pub const PERIOD_BITS: u32 = 20;

/// Why a mix cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MixError {
    #[error("tokens.mix: weight {weight} of {dataset} must be a positive finite number")]
    Weight { dataset: String, weight: String },
    #[error(
        "tokens.mix: weight {weight} of {dataset} is below 2^-21 of the weights' total; raise it or leave the dataset out"
    )]
    Tiny { dataset: String, weight: String },
    #[error("tokens.mix: at most 255 datasets can be mixed, got {0}")]
    TooMany(usize),
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The integer weights of `weights`, each checked (control.md, "Mixing"): `qᵢ = ⌊wᵢ / max w ·
/// 2³² + ½⌋` (IEEE double), then `rᵢ = ⌊(qᵢ·2²¹ + Q) / 2Q⌋` with `Q = Σ qᵢ` (`qᵢ·2²⁰/Q` rounded
/// half up, exact integers), divided by their greatest common divisor.
pub fn quantise(weights: &[(String, f64)]) -> Result<Vec<u64>, MixError> {
    if weights.len() > 255 {
        return Err(MixError::TooMany(weights.len()));
    }
    for (d, w) in weights {
        if !(w.is_finite() && *w > 0.0) {
            return Err(MixError::Weight {
                dataset: d.clone(),
                weight: w.to_string(),
            });
        }
    }
    let max = weights.iter().map(|(_, w)| *w).fold(0.0, f64::max);
    let q: Vec<u128> = weights
        .iter()
        .map(|(_, w)| u128::from((w / max * SCALE + 0.5).floor() as u64))
        .collect();
    let total: u128 = q.iter().sum();
    let mut r = Vec::with_capacity(q.len());
    for ((d, w), qi) in weights.iter().zip(&q) {
        let ri = ((qi << (PERIOD_BITS + 1)) + total) / (2 * total);
        if ri == 0 {
            return Err(MixError::Tiny {
                dataset: d.clone(),
                weight: w.to_string(),
            });
        }
        r.push(ri as u64);
    }
    let g = r.iter().fold(0, |g, &x| gcd(g, x));
    Ok(r.into_iter().map(|x| x / g).collect())
}

/// A dataset waiting for its next slot in the quota method: `next = cᵢ + 1`, weight `rᵢ`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Claim {
    next: u64,
    weight: u64,
    i: usize,
}

impl Ord for Claim {
    /// Greater is chosen first: the larger `rᵢ / (cᵢ + 1)`, ties to the lower index.
    fn cmp(&self, o: &Self) -> Ordering {
        let (a, b) = (
            u128::from(self.weight) * u128::from(o.next),
            u128::from(o.weight) * u128::from(self.next),
        );
        a.cmp(&b).then(o.i.cmp(&self.i))
    }
}

impl PartialOrd for Claim {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// The slot sequence of a mix and what finds a slot's place in it.
#[derive(Debug)]
pub struct Mix {
    /// Windows per dataset.
    pub sizes: Vec<u64>,
    /// The integer weights `rᵢ` (their total is the period).
    pub weights: Vec<u64>,
    /// Slots per epoch, `Σ sizes`.
    len: u64,
    /// `R = Σ rᵢ`.
    period: u64,
    /// The dataset of each of the first `min(len, period)` slots.
    slots: Vec<u8>,
    /// Each of those slots' rank among its dataset's slots.
    ranks: Vec<u32>,
}

impl Mix {
    /// The mix of datasets with `sizes` windows and integer `weights` (as [`quantise`] makes
    /// them: at most 255, each ≥ 1, a total below 2³²): `Σ sizes` slots.
    pub fn new(sizes: Vec<u64>, weights: Vec<u64>) -> Self {
        assert_eq!(sizes.len(), weights.len());
        assert!(weights.len() <= 255 && weights.iter().all(|&r| r >= 1));
        let len: u64 = sizes.iter().sum();
        let period: u64 = weights.iter().sum();
        assert!(period < 1 << 32, "the period's ranks are u32");
        let n = len.min(period) as usize;
        let mut slots = Vec::with_capacity(n);
        let mut ranks = Vec::with_capacity(n);
        // The quota method, one slot per house size h = k + 1. Dataset i's next slot is under
        // its upper quota once cᵢ·R < rᵢ·h, that is from h = ⌊cᵢ·R / rᵢ⌋ + 1 on (and stays so
        // until it is taken): `waiting` holds each dataset's claim by that house size, `ready`
        // the claims under quota, best first.
        let release = |c: u64, r: u64| (u128::from(c) * u128::from(period) / u128::from(r)) as u64 + 1;
        let mut waiting: BinaryHeap<Reverse<(u64, usize)>> = (0..weights.len()).map(|i| Reverse((1, i))).collect();
        let mut ready: BinaryHeap<Claim> = BinaryHeap::with_capacity(weights.len());
        let mut c = vec![0u64; weights.len()];
        for h in 1..=n as u64 {
            while let Some(&Reverse((at, i))) = waiting.peek() {
                if at > h {
                    break;
                }
                waiting.pop();
                ready.push(Claim {
                    next: c[i] + 1,
                    weight: weights[i],
                    i,
                });
            }
            // Σ cᵢ = h - 1 < h = Σ rᵢ·h / R, so some dataset is under its upper quota.
            let best = ready.pop().expect("a dataset is always under its upper quota");
            let i = best.i;
            slots.push(i as u8);
            ranks.push(c[i] as u32);
            c[i] += 1;
            waiting.push(Reverse((release(c[i], weights[i]), i)));
        }
        Mix {
            sizes,
            weights,
            len,
            period,
            slots,
            ranks,
        }
    }

    /// Slots per epoch.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The schedule's period `R` (slots after which every dataset has had exactly `rᵢ`).
    pub fn period(&self) -> u64 {
        self.period
    }

    /// Slot `k`'s dataset, and how many slots that dataset had before it: O(1).
    pub fn locate(&self, k: u64) -> (usize, u64) {
        let (turn, at) = (k / self.period, (k % self.period) as usize);
        let i = usize::from(self.slots[at]);
        (i, turn * self.weights[i] + u64::from(self.ranks[at]))
    }

    /// Slot `k`'s dataset and window in it, for `(seed, epoch)`.
    pub fn window(&self, k: u64, seed: u64, epoch: u64, shuffle: bool) -> (usize, u64) {
        let (i, j) = self.locate(k);
        let n = self.sizes[i];
        let (pass, r) = (j / n, j % n);
        if !shuffle {
            return (i, r);
        }
        (i, permute(n, pass_key(seed, epoch, i, pass), r))
    }
}

/// The key of dataset `i`'s permutation for its pass `pass` over its windows in `(seed, epoch)`
/// (control.md, "Token streams", "Order"): `mix64(mix64(mix64(seed ^ "mix_perm") ^ epoch) ^ (i·2⁴⁰
/// + pass))`. In a stream of one dataset (a mix of one: weight 1, period 1) position `k` is
/// dataset 0's slot `k`, pass 0: window `permute(n, pass_key(seed, epoch, 0, 0), k)`.
fn pass_key(seed: u64, epoch: u64, i: usize, pass: u64) -> u64 {
    mix64(mix64(mix64(seed ^ 0x6d69_785f_7065_726d) ^ epoch) ^ ((i as u64) << 40).wrapping_add(pass))
}

/// splitmix64's finaliser.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A permutation of `0..n` keyed by `key`, evaluated at `x < n` in O(1) expected time: a 4-round
/// Feistel network on the smallest even number of bits that holds `n`, cycle-walked into `0..n`.
pub fn permute(n: u64, key: u64, x: u64) -> u64 {
    debug_assert!(x < n);
    if n <= 1 {
        return x;
    }
    let bits = (64 - (n - 1).leading_zeros()).max(2).next_multiple_of(2);
    let half = bits / 2;
    let mask = (1u64 << half) - 1;
    let mut y = x;
    loop {
        let (mut l, mut r) = (y >> half, y & mask);
        for round in 0..4u64 {
            let f = mix64(r ^ mix64(key ^ round)) & mask;
            (l, r) = (r, l ^ f);
        }
        y = (l << half) | r;
        // A bijection of 0..2^bits: walking its cycle from x comes back into 0..n.
        if y < n {
            return y;
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The quota method simulated slot by slot over every dataset (the implementation before
    /// the period was used, and the rule as control.md words it): each slot's dataset.
    fn reference(weights: &[u64], n: u64) -> Vec<usize> {
        let total: u128 = weights.iter().map(|&q| u128::from(q)).sum();
        let mut c = vec![0u64; weights.len()];
        let mut out = Vec::with_capacity(n as usize);
        for k in 0..n {
            let h = u128::from(k + 1);
            let mut best: Option<usize> = None;
            for i in 0..weights.len() {
                if u128::from(c[i]) * total >= u128::from(weights[i]) * h {
                    continue;
                }
                let better = best.is_none_or(|b| {
                    u128::from(weights[i]) * u128::from(c[b] + 1) > u128::from(weights[b]) * u128::from(c[i] + 1)
                });
                if better {
                    best = Some(i);
                }
            }
            let b = best.expect("under quota");
            c[b] += 1;
            out.push(b);
        }
        out
    }

    /// Every slot's (dataset, rank) of `mix`, against the reference schedule.
    fn check_against_reference(mix: &Mix) {
        let want = reference(&mix.weights, mix.len());
        let mut c = vec![0u64; mix.weights.len()];
        for (k, &i) in want.iter().enumerate() {
            assert_eq!(mix.locate(k as u64), (i, c[i]), "slot {k} of {:?}", mix.weights);
            c[i] += 1;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Small weights: short periods, so an epoch wraps around the period many times.
        #[test]
        fn the_periodic_schedule_is_the_quota_method(
            weights in prop::collection::vec(1u64..40, 1..7),
            sizes in prop::collection::vec(0u64..300, 7),
        ) {
            let sizes = sizes[..weights.len()].to_vec();
            check_against_reference(&Mix::new(sizes, weights));
        }

        /// Weights as `quantise` makes them from arbitrary floats (periods near 2^20, epochs
        /// shorter or, with few large weights, longer than the period).
        #[test]
        fn quantised_weights_keep_the_quota_method(
            w in prop::collection::vec(0.001f64..1.0, 1..5),
            len in 1u64..3000,
        ) {
            let named: Vec<(String, f64)> = w.iter().map(|&x| ("d".to_string(), x)).collect();
            let q = quantise(&named).unwrap();
            let mut sizes = vec![0; q.len()];
            sizes[0] = len;
            check_against_reference(&Mix::new(sizes, q));
        }
    }

    #[test]
    fn the_schedule_repeats_with_the_weights_total_as_period() {
        // 0.5/0.25/0.25: quantised and reduced to 2/1/1, a period of 4.
        let named: Vec<(String, f64)> = [0.5, 0.25, 0.25].iter().map(|&x| ("d".to_string(), x)).collect();
        assert_eq!(quantise(&named).unwrap(), [2, 1, 1]);
        let mix = Mix::new(vec![10, 3, 3], vec![2, 1, 1]);
        assert_eq!(mix.period(), 4);
        let ds: Vec<usize> = (0..16).map(|k| mix.locate(k).0).collect();
        assert_eq!(ds, [0, 1, 0, 2, 0, 1, 0, 2, 0, 1, 0, 2, 0, 1, 0, 2]);
        assert_eq!(mix.locate(13), (1, 3));
        // A period longer than the epoch: only the epoch is computed, and it is the reference.
        let mix = Mix::new(vec![5, 5], vec![700_001, 300_000]);
        assert_eq!(mix.slots.len(), 10);
        check_against_reference(&mix);
        // The open's memory is bounded by the period, not the epoch.
        let named: Vec<(String, f64)> = [0.6, 0.3, 0.1].iter().map(|&x| ("d".to_string(), x)).collect();
        let q = quantise(&named).unwrap();
        assert_eq!(q, [629_146, 314_573, 104_858]);
        let mix = Mix::new(vec![1 << 40, 1 << 40, 1 << 40], q);
        assert_eq!(mix.slots.len() as u64, mix.period());
        assert!(mix.period() <= (1 << PERIOD_BITS) + 2);
    }

    #[test]
    fn every_prefix_is_within_quota() {
        for (sizes, w) in [
            (vec![100u64, 50, 7], vec![0.5, 0.3, 0.2]),
            (vec![10, 10, 10, 10, 10], vec![1.0, 2.0, 3.0, 4.0, 5.0]),
            (vec![3, 400], vec![0.9, 0.1]),
        ] {
            let named: Vec<(String, f64)> = w.iter().map(|&x| ("d".to_string(), x)).collect();
            let q = quantise(&named).unwrap();
            let mix = Mix::new(sizes.clone(), q.clone());
            let total: u64 = q.iter().sum();
            let mut c = vec![0u64; sizes.len()];
            for k in 0..mix.len() {
                let (i, j) = mix.locate(k);
                assert_eq!(j, c[i], "slot {k}: the rank of its dataset's slot");
                c[i] += 1;
                let n = k + 1;
                for (ci, qi) in c.iter().zip(&q) {
                    let (lo, hi) = ((qi * n) / total, (qi * n).div_ceil(total));
                    assert!((lo..=hi).contains(ci), "slot {k}: {ci} outside [{lo}, {hi}]");
                }
            }
        }
    }

    #[test]
    fn a_permutation_is_a_bijection_per_key() {
        for n in [1u64, 2, 3, 5, 64, 1000, 4097] {
            for key in [0u64, 7, u64::MAX] {
                let mut seen: Vec<u64> = (0..n).map(|x| permute(n, key, x)).collect();
                seen.sort_unstable();
                assert_eq!(seen, (0..n).collect::<Vec<_>>());
            }
        }
        assert_ne!(
            (0..50).map(|x| permute(50, 1, x)).collect::<Vec<_>>(),
            (0..50).map(|x| permute(50, 2, x)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn each_pass_over_a_dataset_uses_every_window_once() {
        let mix = Mix::new(vec![5, 20], vec![3, 1]);
        let mut small = Vec::new();
        for k in 0..mix.len() {
            let (i, w) = mix.window(k, 9, 2, true);
            if i == 0 {
                small.push(w);
            }
        }
        // Dataset 0 gets 3/4 of 25 slots, about 19: passes of 5 each use all 5 windows.
        for pass in small.chunks(5).filter(|c| c.len() == 5) {
            let mut p = pass.to_vec();
            p.sort_unstable();
            assert_eq!(p, [0, 1, 2, 3, 4]);
        }
        assert!(quantise(&[("a".into(), 0.0)]).is_err());
        assert!(quantise(&[("a".into(), 1.0), ("b".into(), 1e-12)]).is_err());
    }
}
