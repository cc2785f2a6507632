//! The aspect-bucket order (control.md, "Aspect-ratio buckets (1.10)"): every batch holds
//! samples of one bucket, as a pure function of `(seed, epoch, rank, world_size, batch_size)`
//! and each sample's bucket.
//!
//! The epoch's **global batch list** `L`:
//! 1. the epoch's order of `0..N`: the `global` Fisher–Yates of `crate::sampler` (the identity
//!    without `shuffle`);
//! 2. each bucket's samples, in that order (buckets by number);
//! 3. each bucket's samples cut into full batches of `B`, buckets by number; with `shuffle`,
//!    those full batches shuffled by Fisher–Yates with `G(seed, epoch, 2^64-4)`;
//! 4. then each bucket's leftover (its last `n mod B` samples, fewer than `B`), buckets by number.
//!
//! From global batch `g` (0 at the epoch's start), the rest `R = L[g..]` is dealt to the ranks:
//! with `drop_last`, only its full batches, cut to a multiple of `world_size`; without, all of it.
//! Rank `r` takes `R[r], R[r + W], ...`. So each sample comes at most once per epoch (exactly
//! once without `drop_last`), every rank gets the same number of batches with `drop_last`, and
//! without it the ranks' counts differ by at most one (the leftovers are dealt on round-robin
//! as the full batches are).
//!
//! Invariants: all full batches come before every partial one, so after every rank took `k`
//! batches from `g`, the ranks consumed `L[g .. g + k·W]`, whose batches are all full while any
//! full batch remains; a resume names `g` by the global position `g·B` (a multiple of `B`).

use std::sync::Arc;

use crate::sampler::{SamplerConfig, SamplerError};

/// Separates the batches' shuffle from the samples' (`2^64-1`) and the shard blocks'
/// (`2^64-2`, `2^64-3`).
const BATCH_STREAM: u64 = u64::MAX - 3;

/// One batch of a bucket order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketBatch {
    /// The bucket every sample of the batch is in.
    pub bucket: u32,
    /// Dataset indices, in batch order.
    pub indices: Vec<u64>,
}

/// How one rank walks through an epoch of a bucketed stream: the sampler's settings (its
/// `dataset_len` is the number of samples) and each sample's bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketSampler {
    /// Each sample's bucket, by dataset index.
    pub buckets: Arc<Vec<u32>>,
    pub config: SamplerConfig,
}

/// Why a bucket stream cannot start where it was asked to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BucketError {
    /// A resume position that is not a batch boundary of this batch size.
    #[error(
        "start.position {position} is not a multiple of batch_size {batch_size}: an aspect-bucketed stream resumes at a global batch (position = batches · batch_size), so resume with the batch_size the state was saved with"
    )]
    Position { position: u64, batch_size: u64 },
}

impl BucketSampler {
    /// Samples in the dataset.
    pub fn dataset_len(&self) -> u64 {
        self.buckets.len() as u64
    }

    /// Checks the configuration as [`crate::sampler::SamplerConfig::validate`] does; returns
    /// this rank's samples and batches in epoch 0 (its batches are the same in every epoch; its
    /// samples too with `drop_last`).
    pub fn validate(&self) -> Result<(u64, u64), SamplerError> {
        crate::sampler::check_shape(
            self.config.world_size,
            self.config.rank,
            self.config.batch_size,
            self.dataset_len(),
        )?;
        let plan = self.plan_from(0, 0).expect("position 0 is a batch boundary");
        if plan.batches() == 0 {
            return Err(SamplerError::NoBatches {
                batch_size: self.config.batch_size,
                per_rank: 0,
                len: self.dataset_len(),
                world: self.config.world_size,
            });
        }
        Ok((plan.samples(), plan.batches()))
    }

    /// The epoch's global batch list `L` (module docs): full batches (shuffled), then each
    /// bucket's leftover.
    pub fn global(&self, epoch: u64) -> Vec<BucketBatch> {
        let n = self.dataset_len();
        let mut order: Vec<u64> = (0..n).collect();
        if self.config.shuffle {
            crate::sampler::shuffle(&mut order, self.config.seed, epoch);
        }
        let count = self.buckets.iter().copied().max().map_or(0, |m| m as usize + 1);
        let mut by_bucket: Vec<Vec<u64>> = vec![Vec::new(); count];
        for i in order {
            by_bucket[self.buckets[i as usize] as usize].push(i);
        }
        let b = self.config.batch_size as usize;
        let mut full = Vec::new();
        let mut partial = Vec::new();
        for (bucket, samples) in by_bucket.into_iter().enumerate() {
            let mut chunks = samples.chunks_exact(b);
            for c in chunks.by_ref() {
                full.push(BucketBatch {
                    bucket: bucket as u32,
                    indices: c.to_vec(),
                });
            }
            if !chunks.remainder().is_empty() {
                partial.push(BucketBatch {
                    bucket: bucket as u32,
                    indices: chunks.remainder().to_vec(),
                });
            }
        }
        if self.config.shuffle {
            let mut rng = crate::rng::SampleRng::new(self.config.seed, epoch, BATCH_STREAM);
            for i in (1..full.len()).rev() {
                let j = rng.below(i as u64 + 1);
                full.swap(i, j as usize);
            }
        }
        full.extend(partial);
        full
    }

    /// This rank's batches of the rest of `epoch` from global `position` (`g · batch_size` for
    /// global batch `g`, or the dataset's length: the epoch is done).
    pub fn plan_from(&self, epoch: u64, position: u64) -> Result<BucketPlan, BucketError> {
        let n = self.dataset_len();
        let b = self.config.batch_size;
        if position < n && !position.is_multiple_of(b) {
            return Err(BucketError::Position {
                position,
                batch_size: b,
            });
        }
        let global = self.global(epoch);
        let from = if position >= n {
            global.len()
        } else {
            ((position / b) as usize).min(global.len())
        };
        let mut rest: Vec<BucketBatch> = global.into_iter().skip(from).collect();
        if self.config.drop_last {
            let full = rest.iter().take_while(|x| x.indices.len() as u64 == b).count();
            let w = self.config.world_size as usize;
            rest.truncate(full - full % w);
        }
        let mine = rest
            .into_iter()
            .skip(self.config.rank as usize)
            .step_by(self.config.world_size as usize)
            .collect();
        Ok(BucketPlan { batches: mine })
    }
}

/// One rank's batches of (the rest of) one epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketPlan {
    batches: Vec<BucketBatch>,
}

impl BucketPlan {
    /// Number of batches.
    pub fn batches(&self) -> u64 {
        self.batches.len() as u64
    }

    /// Samples over all batches.
    pub fn samples(&self) -> u64 {
        self.batches.iter().map(|b| b.indices.len() as u64).sum()
    }

    /// Batch `k < batches()`.
    pub fn batch(&self, k: u64) -> &BucketBatch {
        &self.batches[k as usize]
    }

    /// Every batch, in order.
    pub fn all(&self) -> &[BucketBatch] {
        &self.batches
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn sampler(buckets: Vec<u32>, b: u64, drop_last: bool, rank: u64, world: u64) -> BucketSampler {
        BucketSampler {
            config: SamplerConfig {
                dataset_len: buckets.len() as u64,
                batch_size: b,
                shuffle: true,
                seed: 7,
                drop_last,
                rank,
                world_size: world,
            },
            buckets: Arc::new(buckets),
        }
    }

    proptest! {
        /// Every batch is one bucket; over all ranks each sample comes at most once (exactly
        /// once without drop_last); with drop_last the ranks get equal counts, without it counts
        /// differ by at most one.
        #[test]
        fn batches_are_one_bucket_and_samples_come_once(
            buckets in proptest::collection::vec(0u32..5, 1..300),
            b in 1u64..9, world in 1u64..5, drop_last: bool, epoch in 0u64..3,
        ) {
            let mut seen = vec![0u32; buckets.len()];
            let mut counts = Vec::new();
            for r in 0..world {
                let s = sampler(buckets.clone(), b, drop_last, r, world);
                let plan = s.plan_from(epoch, 0).unwrap();
                counts.push(plan.batches());
                for batch in plan.all() {
                    prop_assert!(!batch.indices.is_empty() && batch.indices.len() as u64 <= b);
                    for &i in &batch.indices {
                        prop_assert_eq!(buckets[i as usize], batch.bucket);
                        seen[i as usize] += 1;
                    }
                }
            }
            prop_assert!(seen.iter().all(|&c| c <= 1));
            if !drop_last {
                prop_assert!(seen.iter().all(|&c| c == 1));
            }
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            prop_assert!(hi - lo <= u64::from(!drop_last));
        }

        /// Resuming at the position every rank's first `k` batches make gives exactly the rest
        /// of the plan (the same world and batch size).
        #[test]
        fn resume_at_a_position_is_the_rest(
            buckets in proptest::collection::vec(0u32..4, 1..200),
            b in 1u64..6, world in 1u64..4, drop_last: bool, k in 0u64..20,
        ) {
            for r in 0..world {
                let s = sampler(buckets.clone(), b, drop_last, r, world);
                let whole = s.plan_from(2, 0).unwrap();
                let k = k.min(whole.batches());
                let position = (k * b * world).min(s.dataset_len());
                // The client's position (control.md): capped at the dataset's length.
                if k * b * world >= s.dataset_len() && k < whole.batches() {
                    continue;
                }
                let rest = s.plan_from(2, position).unwrap();
                prop_assert_eq!(rest.all(), &whole.all()[k as usize..]);
            }
        }
    }

    #[test]
    fn a_position_off_a_batch_boundary_is_refused() {
        let s = sampler(vec![0; 10], 4, true, 0, 1);
        assert_eq!(
            s.plan_from(0, 3).unwrap_err(),
            BucketError::Position {
                position: 3,
                batch_size: 4
            }
        );
        assert_eq!(s.plan_from(0, 10).unwrap().batches(), 0);
    }

    #[test]
    fn without_shuffle_batches_follow_the_buckets() {
        let mut s = sampler(vec![1, 0, 1, 0, 1, 0, 2], 2, false, 0, 1);
        s.config.shuffle = false;
        let got: Vec<(u32, Vec<u64>)> = s
            .plan_from(0, 0)
            .unwrap()
            .all()
            .iter()
            .map(|b| (b.bucket, b.indices.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, vec![1, 3]),
                (1, vec![0, 2]),
                (0, vec![5]),
                (1, vec![4]),
                (2, vec![6])
            ]
        );
    }
}
