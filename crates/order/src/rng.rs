//! The per-sample random generator: splitmix64 seeded by `(seed, epoch, index)`.
//!
//! `proto/control.md` ("Order and randomness") requires each sample's random numbers to depend
//! only on the stream's seed, the epoch and the sample's dataset index, never on the thread or
//! batch that processes it. So the generator is a pure function of those three numbers, small
//! enough to build per sample (one `u64` of state, no allocation), and simple enough to port:
//!
//! ```text
//! mix(z)  = z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB; z ^ (z >> 31)
//! state   = mix(mix(mix(seed ^ 0x72696E6766656564) ^ epoch) ^ index)      // "ringfeed"
//! fork(j) = mix(state ^ mix(j ^ 0x76696577666F726B))                      // "viewfork"
//! next()  = state += 0x9E3779B97F4A7C15; mix(state)                         // splitmix64
//! uniform(lo, hi) = lo + (hi - lo) * (next() >> 11) * 2^-53
//! below(n)        = Lemire's multiply-shift with rejection: unbiased in 0..n
//! ```
//!
//! `mix` is a bijection, so for a fixed seed and epoch distinct indices give distinct states.

/// splitmix64's increment (the golden ratio in 64-bit fixed point).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
/// Separates these streams from any other use of splitmix64 on the same seed: "ringfeed".
const DOMAIN: u64 = 0x7269_6E67_6665_6564;

/// Separates forked generators from the sample's own: "viewfork".
const FORK: u64 = 0x7669_6577_666F_726B;

/// splitmix64's output function (Stafford's "mix13"), a bijection on `u64`.
#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A deterministic generator for one sample's augmentation; see the module docs for the exact
/// algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleRng {
    state: u64,
}

impl SampleRng {
    /// The generator of sample `index` in `epoch` of a stream seeded with `seed`.
    pub fn new(seed: u64, epoch: u64, index: u64) -> Self {
        SampleRng {
            state: mix(mix(mix(seed ^ DOMAIN) ^ epoch) ^ index),
        }
    }

    /// An independent generator for output `j` of the same sample (control.md, "Pipelines"):
    /// `state' = mix(state ^ mix(j ^ FORK))`, a bijection of the state for each `j`.
    pub fn fork(&self, j: u64) -> SampleRng {
        SampleRng {
            state: mix(self.state ^ mix(j ^ FORK)),
        }
    }

    /// 64 uniformly distributed bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix(self.state)
    }

    /// A uniform `f64` in `[lo, hi)` (53 random bits; like `torch.empty(1).uniform_(lo, hi)`).
    /// Rounding can make it equal `hi` when the interval is tiny; with `lo > hi` the interval
    /// is simply mirrored.
    #[inline]
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let unit = (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
        lo + (hi - lo) * unit
    }

    /// A uniform integer in `0..n` without modulo bias (like `torch.randint(0, n)`); 0 when `n`
    /// is 0.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Lemire, "Fast random integer generation in an interval" (2019).
        let mut m = u128::from(self.next_u64()) * u128::from(n);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = u128::from(self.next_u64()) * u128::from(n);
            }
        }
        (m >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference splitmix64 sequence for state 0 (Vigna's `splitmix64.c` seeded with 0),
    /// so a port to another language can check itself against the same numbers.
    #[test]
    fn splitmix64_reference_values() {
        let mut r = SampleRng { state: 0 };
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(r.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn streams_depend_on_every_input() {
        let first = |s, e, i| SampleRng::new(s, e, i).next_u64();
        let base = first(0, 0, 0);
        assert_ne!(base, first(1, 0, 0));
        assert_ne!(base, first(0, 1, 0));
        assert_ne!(base, first(0, 0, 1));
        // Swapping epoch and index gives another stream.
        assert_ne!(first(0, 1, 2), first(0, 2, 1));
        assert_eq!(SampleRng::new(5, 6, 7), SampleRng::new(5, 6, 7));
    }

    #[test]
    fn uniform_stays_in_range() {
        let mut r = SampleRng::new(1, 2, 3);
        for _ in 0..10_000 {
            let v = r.uniform(0.08, 1.0);
            assert!((0.08..1.0).contains(&v), "{v}");
        }
        assert_eq!(r.uniform(2.0, 2.0), 2.0);
    }

    #[test]
    fn below_is_in_range_and_unbiased() {
        let mut r = SampleRng::new(9, 9, 9);
        assert_eq!(r.below(0), 0);
        assert_eq!(r.below(1), 0);
        let n = 6u64;
        let mut counts = [0u32; 6];
        let draws = 60_000;
        for _ in 0..draws {
            counts[r.below(n) as usize] += 1;
        }
        // Chi-square with 5 degrees of freedom; 20.5 is the 0.999 quantile.
        let e = f64::from(draws) / n as f64;
        let chi2: f64 = counts.iter().map(|&c| (f64::from(c) - e).powi(2) / e).sum();
        assert!(chi2 < 20.5, "{counts:?} chi2={chi2}");
        // A range just above a power of two exercises the rejection branch.
        let big = (1u64 << 63) + 1;
        for _ in 0..1000 {
            assert!(r.below(big) < big);
        }
    }
}
