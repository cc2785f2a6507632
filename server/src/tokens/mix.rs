//! Mixing several token datasets into one stream by weight (`proto/control.md`, "Mixing").
//!
//! A mixed stream's epoch is a sequence of `N = Σ nᵢ` window slots (nᵢ: the windows of dataset
//! *i*). Slot *k* goes to the dataset that the **quota method** (Balinski & Young, 1975) picks for
//! house size `k + 1`: among the datasets still under their upper quota (`cᵢ < pᵢ·(k+1)`, with
//! `cᵢ` the slots dataset *i* already has), the one with the largest `pᵢ / (cᵢ + 1)`, ties to the
//! lower index. It stays within quota at every prefix, which the greedy "largest sampling error
//! first" rule (Megatron's) does not for three or more datasets: after any `n` slots every
//! dataset has `⌊pᵢ·n⌋` or `⌈pᵢ·n⌉` of them. Weights are quantised to integers (`qᵢ =
//! ⌊wᵢ / max w · 2³² + ½⌋`) and the rule runs in exact integer arithmetic, so it is the same in
//! every language.
//!
//! The slot sequence is the same every epoch (it depends on the weights only); the sampler then
//! stripes slots over ranks in order, so every global prefix of the stream (what all ranks have
//! consumed together) holds the weights' proportions, and a resume by global position keeps
//! them. Shuffling happens inside each dataset: the *j*-th slot of dataset *i* is window
//! `πᵢ(j mod nᵢ)` where `πᵢ` is a permutation of `0..nᵢ` keyed by `(seed, epoch, i, ⌊j / nᵢ⌋)`
//! (each pass over an up-sampled dataset is a new permutation), so a window repeats only when
//! its dataset's weight asks for more than it has.
//!
//! Open is O(N·D) time and about `N·(1 + 8D/64)` bytes (the slot sequence and a checkpoint of
//! the counts every 64 slots); a slot's dataset and rank are found in O(64).

/// Slots between two checkpoints of the per-dataset counts.
const CHECKPOINT: u64 = 64;
/// Weight quantisation: the largest weight becomes 2³².
const SCALE: f64 = 4_294_967_296.0;

/// Why a mix cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MixError {
    #[error("tokens.mix: weight {weight} of {dataset} must be a positive finite number")]
    Weight { dataset: String, weight: String },
    #[error(
        "tokens.mix: weight {weight} of {dataset} is below 2^-32 of the largest weight; raise it or leave the dataset out"
    )]
    Tiny { dataset: String, weight: String },
    #[error("tokens.mix: at most 255 datasets can be mixed, got {0}")]
    TooMany(usize),
}

/// The integer weights of `weights` (`qᵢ = ⌊wᵢ / max w · 2³² + ½⌋`), each checked.
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
    weights
        .iter()
        .map(|(d, w)| {
            let q = (w / max * SCALE + 0.5).floor() as u64;
            if q == 0 {
                Err(MixError::Tiny {
                    dataset: d.clone(),
                    weight: w.to_string(),
                })
            } else {
                Ok(q)
            }
        })
        .collect()
}

/// The slot sequence of a mix and what finds a slot's place in it.
#[derive(Debug)]
pub struct Mix {
    /// Windows per dataset.
    pub sizes: Vec<u64>,
    /// The integer weights.
    pub weights: Vec<u64>,
    /// The dataset of every slot.
    slots: Vec<u8>,
    /// Slots each dataset had before slot `c * CHECKPOINT`, `D` per checkpoint.
    counts: Vec<u64>,
}

impl Mix {
    /// The mix of datasets with `sizes` windows and integer `weights`: `Σ sizes` slots.
    pub fn new(sizes: Vec<u64>, weights: Vec<u64>) -> Self {
        assert_eq!(sizes.len(), weights.len());
        let d = sizes.len();
        let len: u64 = sizes.iter().sum();
        let total: u128 = weights.iter().map(|&q| u128::from(q)).sum();
        let mut slots = Vec::with_capacity(len as usize);
        let mut counts = Vec::with_capacity((len / CHECKPOINT + 1) as usize * d);
        let mut c = vec![0u64; d];
        for k in 0..len {
            if k % CHECKPOINT == 0 {
                counts.extend_from_slice(&c);
            }
            let n = u128::from(k + 1);
            let mut best: Option<usize> = None;
            for i in 0..d {
                // Under the upper quota at house size n: cᵢ < pᵢ·n, i.e. cᵢ·Q < qᵢ·n.
                if u128::from(c[i]) * total >= u128::from(weights[i]) * n {
                    continue;
                }
                // Largest qᵢ / (cᵢ + 1): qᵢ·(c_b + 1) > q_b·(cᵢ + 1); ties keep the lower index.
                let better = best.is_none_or(|b| {
                    u128::from(weights[i]) * u128::from(c[b] + 1) > u128::from(weights[b]) * u128::from(c[i] + 1)
                });
                if better {
                    best = Some(i);
                }
            }
            // Σ cᵢ = k < n = Σ pᵢ·n, so some dataset is under its upper quota.
            let b = best.expect("a dataset is always under its upper quota");
            c[b] += 1;
            slots.push(b as u8);
        }
        Mix {
            sizes,
            weights,
            slots,
            counts,
        }
    }

    /// Slots per epoch.
    pub fn len(&self) -> u64 {
        self.slots.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Slot `k`'s dataset, and how many slots that dataset had before it.
    pub fn locate(&self, k: u64) -> (usize, u64) {
        let d = self.sizes.len();
        let i = self.slots[k as usize];
        let c = (k / CHECKPOINT) as usize;
        let from = c as u64 * CHECKPOINT;
        let before = self.slots[from as usize..k as usize]
            .iter()
            .filter(|&&s| s == i)
            .count() as u64;
        (i as usize, self.counts[c * d + i as usize] + before)
    }

    /// Slot `k`'s dataset and window in it, for `(seed, epoch)`.
    pub fn window(&self, k: u64, seed: u64, epoch: u64, shuffle: bool) -> (usize, u64) {
        let (i, j) = self.locate(k);
        let n = self.sizes[i];
        let (pass, r) = (j / n, j % n);
        if !shuffle {
            return (i, r);
        }
        let key = mix64(mix64(mix64(seed ^ 0x6d69_785f_7065_726d) ^ epoch) ^ ((i as u64) << 40 | pass));
        (i, permute(n, key, r))
    }
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
    use super::*;

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
