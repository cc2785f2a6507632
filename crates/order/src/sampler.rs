//! The order of samples: per-epoch permutation, rank partition, batches (control.md, "Order and
//! randomness").
//!
//! Everything here is a pure function of its arguments, so a stream's batches do not depend on
//! threads or timing, and resuming at batch `k` needs nothing but `(seed, epoch, k)`. A plan
//! holds the epoch's order and computes each rank's samples from it on demand: an image stream's
//! shuffle is one table of its indices, a token stream's (and an unshuffled stream's) order is
//! the identity, so its plan takes constant memory whatever the number of windows.

use std::sync::Arc;

/// How one rank walks through an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SamplerConfig {
    pub dataset_len: u64,
    pub batch_size: u64,
    pub shuffle: bool,
    pub seed: u64,
    pub drop_last: bool,
    pub rank: u64,
    pub world_size: u64,
}

/// Why a sampler configuration cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SamplerError {
    #[error("rank {rank} is out of range for world_size {world_size}; ranks are 0..world_size")]
    Rank { rank: u64, world_size: u64 },
    #[error("world_size must be at least 1")]
    World,
    #[error("batch_size must be at least 1")]
    BatchSize,
    #[error("the dataset is empty")]
    Empty,
    #[error(
        "batch_size {batch_size} is larger than the {per_rank} samples each rank gets per epoch ({len} samples over {world} ranks), and drop_last is set, so no batch would be delivered; lower batch_size or set drop_last=False"
    )]
    NoBatches {
        batch_size: u64,
        per_rank: u64,
        len: u64,
        world: u64,
    },
}

/// An epoch's order: the sample at each of its `dataset_len` positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Order {
    /// Position `k` holds sample `k`: no shuffle, or a kind that orders its samples itself (a
    /// token stream computes the window at each position: `tokens::serve`). No memory.
    Identity,
    /// A permutation held in memory (the images' Fisher–Yates, the `shard_blocks` order): 8
    /// bytes per sample, once, whatever the world size.
    Table(Arc<Vec<u64>>),
}

impl Order {
    /// The sample at position `k < dataset_len`.
    fn at(&self, k: u64) -> u64 {
        match self {
            Order::Identity => k,
            Order::Table(t) => t[k as usize],
        }
    }
}

/// One rank's view of one epoch: which sample each of its positions holds, computed on demand
/// from the epoch's [`Order`] (nothing proportional to the samples beyond the order itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochPlan {
    order: Order,
    /// The epoch's samples, `dataset_len`.
    dataset_len: u64,
    /// The global position the plan starts at (`0 ..= dataset_len`).
    from: u64,
    rank: u64,
    world_size: u64,
    /// Samples this rank gets.
    len: u64,
    pub batch_size: u64,
    pub drop_last: bool,
}

impl SamplerConfig {
    /// Checks the configuration; returns samples per rank and batches per epoch.
    pub fn validate(&self) -> Result<(u64, u64), SamplerError> {
        check_shape(self.world_size, self.rank, self.batch_size, self.dataset_len)?;
        let per_rank = self.samples_per_rank();
        let batches = self.batches_per_epoch();
        if batches == 0 {
            return Err(SamplerError::NoBatches {
                batch_size: self.batch_size,
                per_rank,
                len: self.dataset_len,
                world: self.world_size,
            });
        }
        Ok((per_rank, batches))
    }

    /// Samples each rank gets per epoch, as `DistributedSampler` computes it.
    pub fn samples_per_rank(&self) -> u64 {
        self.samples_per_rank_from(0)
    }

    /// Samples each rank gets of the rest of an epoch from global `position` (0 ..= dataset_len).
    pub fn samples_per_rank_from(&self, position: u64) -> u64 {
        let rest = self.dataset_len.saturating_sub(position);
        if self.drop_last {
            rest / self.world_size
        } else {
            rest.div_ceil(self.world_size)
        }
    }

    /// Batches each rank gets per epoch.
    pub fn batches_per_epoch(&self) -> u64 {
        self.batches_from(0)
    }

    /// Batches each rank gets of the rest of an epoch from global `position`.
    pub fn batches_from(&self, position: u64) -> u64 {
        let n = self.samples_per_rank_from(position);
        if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        }
    }

    /// This rank's indices for `epoch`.
    pub fn plan(&self, epoch: u64) -> EpochPlan {
        self.plan_from(epoch, 0)
    }

    /// This rank's indices for the rest of `epoch` from global `position` (0 ..= dataset_len):
    /// the epoch's order from `position` on, padded by repeating the order's start (as often as
    /// needed) or cut, striped over the ranks. Position 0 is the whole epoch; a position that
    /// `world_size * batch_size * k` samples make is exactly batches `k..` of the whole epoch's
    /// plan, so resuming there with the same world gives the same batches, and with another
    /// world or batch size re-stripes the rest (control.md, "Resume by a global position").
    pub fn plan_from(&self, epoch: u64, position: u64) -> EpochPlan {
        let order = if self.shuffle {
            let mut order: Vec<u64> = (0..self.dataset_len).collect();
            shuffle(&mut order, self.seed, epoch);
            Order::Table(Arc::new(order))
        } else {
            Order::Identity
        };
        self.plan_order(order, position)
    }

    /// This rank's indices for the rest of an epoch from global `position`, in the epoch's
    /// `order` of `0..dataset_len` (the global shuffle, another permutation: `crate::blocks`, or
    /// the identity), cut and striped over the ranks as [`Self::plan_from`] describes: the rest
    /// padded by the order's start is position `(position + j) mod dataset_len` at its `j`-th
    /// place, so this rank's `i`-th sample is the order's at `(position + rank + i·world_size)
    /// mod dataset_len`, computed when asked for.
    pub fn plan_order(&self, order: Order, position: u64) -> EpochPlan {
        if let Order::Table(t) = &order {
            debug_assert_eq!(t.len() as u64, self.dataset_len);
        }
        EpochPlan {
            order,
            dataset_len: self.dataset_len,
            from: position.min(self.dataset_len),
            rank: self.rank,
            world_size: self.world_size,
            len: self.samples_per_rank_from(position),
            batch_size: self.batch_size,
            drop_last: self.drop_last,
        }
    }
}

impl EpochPlan {
    /// Samples this rank gets.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The dataset index at this rank's position `i < len()`: O(1).
    pub fn get(&self, i: u64) -> u64 {
        debug_assert!(i < self.len);
        // from ≤ N, rank < W and i·W < N + W (i < ⌈(N − from)/W⌉): no overflow below 2⁶² samples.
        let k = (self.from + self.rank + i * self.world_size) % self.dataset_len;
        self.order.at(k)
    }

    /// Number of batches.
    pub fn batches(&self) -> u64 {
        if self.drop_last {
            self.len / self.batch_size
        } else {
            self.len.div_ceil(self.batch_size)
        }
    }

    /// Dataset indices of batch `b` (the last one may be shorter without `drop_last`).
    pub fn batch(&self, b: u64) -> impl Iterator<Item = u64> + '_ {
        let start = (b * self.batch_size).min(self.len);
        let end = (start + self.batch_size).min(self.len);
        (start..end).map(|i| self.get(i))
    }

    /// Every index of the plan, in order (`len()` of them: for tests and small datasets).
    pub fn indices(&self) -> Vec<u64> {
        (0..self.len).map(|i| self.get(i)).collect()
    }
}

/// The checks every order makes of its ranks, batch size and dataset, in this order.
pub(crate) fn check_shape(world_size: u64, rank: u64, batch_size: u64, len: u64) -> Result<(), SamplerError> {
    if world_size == 0 {
        return Err(SamplerError::World);
    }
    if rank >= world_size {
        return Err(SamplerError::Rank { rank, world_size });
    }
    if batch_size == 0 {
        return Err(SamplerError::BatchSize);
    }
    if len == 0 {
        return Err(SamplerError::Empty);
    }
    Ok(())
}

/// Separates the order's random stream from every sample's augmentation stream (which uses
/// real dataset indices, all below this).
const ORDER_STREAM: u64 = u64::MAX;

/// Fisher–Yates with the generator of `(seed, epoch)`, unbiased (`SampleRng::below`).
pub(crate) fn shuffle(v: &mut [u64], seed: u64, epoch: u64) {
    let mut rng = crate::rng::SampleRng::new(seed, epoch, ORDER_STREAM);
    for i in (1..v.len()).rev() {
        let j = rng.below(i as u64 + 1);
        v.swap(i, j as usize);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The plan as it was built before plans were lazy (and as control.md words it): the order
    /// from `position` on, padded by repeating the order's start or cut, then striped.
    fn materialised(c: &SamplerConfig, order: &[u64], position: u64) -> Vec<u64> {
        let total = (c.samples_per_rank_from(position) * c.world_size) as usize;
        let mut rest: Vec<u64> = order[position.min(c.dataset_len) as usize..].to_vec();
        let mut i = 0usize;
        while rest.len() < total {
            rest.push(order[i % order.len()]);
            i += 1;
        }
        rest.truncate(total);
        rest.into_iter()
            .skip(c.rank as usize)
            .step_by(c.world_size as usize)
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Every rank's lazy plan is the materialised one, for the shuffled (images' Fisher–Yates)
        /// and the identity order, any position (padding wraps several times when the world is
        /// larger than the rest), batch size and drop_last.
        #[test]
        fn a_lazy_plan_is_the_materialised_plan(
            len in 1u64..300,
            world in 1u64..40,
            batch in 1u64..9,
            at in 0u64..=300,
            drop_last: bool,
            shuffle: bool,
            seed: u64,
            epoch in 0u64..5,
        ) {
            let position = at.min(len);
            let mut order: Vec<u64> = (0..len).collect();
            if shuffle {
                super::shuffle(&mut order, seed, epoch);
            }
            for rank in 0..world {
                let c = SamplerConfig { dataset_len: len, batch_size: batch, shuffle, seed, drop_last, rank, world_size: world };
                let plan = c.plan_from(epoch, position);
                let want = materialised(&c, &order, position);
                prop_assert_eq!(plan.len(), want.len() as u64);
                prop_assert_eq!(plan.indices(), want.clone());
                let batches: Vec<u64> = (0..plan.batches()).flat_map(|b| plan.batch(b)).collect();
                let kept = if drop_last { want.len() - want.len() % batch as usize } else { want.len() };
                prop_assert_eq!(batches, want[..kept].to_vec());
            }
        }
    }

    fn cfg(len: u64, world: u64, rank: u64, drop_last: bool) -> SamplerConfig {
        SamplerConfig {
            dataset_len: len,
            batch_size: 4,
            shuffle: true,
            seed: 3,
            drop_last,
            rank,
            world_size: world,
        }
    }

    #[test]
    fn ranks_cover_an_epoch_exactly_once_with_drop_last() {
        let len = 103;
        let mut seen = vec![0u32; len as usize];
        for r in 0..4 {
            for &i in &cfg(len, 4, r, true).plan(5).indices() {
                seen[i as usize] += 1;
            }
        }
        assert_eq!(seen.iter().filter(|&&c| c == 1).count(), 100);
        assert!(seen.iter().all(|&c| c <= 1));
    }

    #[test]
    fn padding_repeats_the_start() {
        let len = 10;
        let mut seen = vec![0u32; len as usize];
        for r in 0..4 {
            let p = cfg(len, 4, r, false).plan(0);
            assert_eq!(p.indices().len(), 3);
            for &i in &p.indices() {
                seen[i as usize] += 1;
            }
        }
        assert!(seen.iter().all(|&c| c >= 1));
        assert_eq!(seen.iter().sum::<u32>(), 12);
    }

    #[test]
    fn permutation_depends_on_seed_and_epoch_only() {
        let a = cfg(50, 1, 0, true).plan(1);
        assert_eq!(a, cfg(50, 1, 0, true).plan(1));
        assert_ne!(a.indices(), cfg(50, 1, 0, true).plan(2).indices());
        let mut sorted = a.indices();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..50).collect::<Vec<u64>>(),
            "a permutation of the whole dataset"
        );
    }

    /// The batches every rank delivers from `position`, flattened.
    fn rest(len: u64, world: u64, batch: u64, position: u64, epoch: u64) -> Vec<u64> {
        let mut out = Vec::new();
        for r in 0..world {
            let c = SamplerConfig {
                batch_size: batch,
                world_size: world,
                rank: r,
                ..cfg(len, world, r, true)
            };
            let p = c.plan_from(epoch, position);
            assert_eq!(p.batches(), c.batches_from(position));
            for b in 0..p.batches() {
                out.extend(p.batch(b));
            }
        }
        out
    }

    #[test]
    fn a_position_resumes_the_same_batches_and_restripes_for_another_world() {
        let len = 1000;
        let whole = |world| SamplerConfig {
            batch_size: 8,
            world_size: world,
            ..cfg(len, world, 0, true)
        };
        // Same world: position 4 ranks * 8 * 5 batches is batches 5.. of the epoch.
        for r in 0..4 {
            let c = SamplerConfig { rank: r, ..whole(4) };
            let full = c.plan(2);
            let from = c.plan_from(2, 4 * 8 * 5);
            assert_eq!(&full.indices()[5 * 8..], &from.indices()[..]);
        }
        // World 4 for 7 steps, then world 3 (batch 8) or world 2 (batch 12): every sample of
        // the epoch once, but the tail drop_last cuts.
        let mut seen: Vec<u64> = (0..4)
            .flat_map(|r| {
                let p = SamplerConfig { rank: r, ..whole(4) }.plan(2);
                p.indices()[..7 * 8].to_vec()
            })
            .collect();
        for (world, batch) in [(3, 8), (2, 12)] {
            let mut all = seen.clone();
            all.extend(rest(len, world, batch, 4 * 8 * 7, 2));
            let n = all.len() as u64;
            all.sort_unstable();
            all.dedup();
            assert_eq!(all.len() as u64, n, "no sample twice");
            assert!(len - n < world * batch, "only the drop_last tail is missing");
        }
        seen.sort_unstable();
        assert_eq!(seen.len(), 4 * 8 * 7);
        assert_eq!(
            SamplerConfig { rank: 0, ..whole(3) }.plan_from(0, len).indices(),
            Vec::<u64>::new()
        );
    }

    #[test]
    fn batches_and_errors() {
        let c = SamplerConfig {
            dataset_len: 10,
            batch_size: 4,
            shuffle: false,
            seed: 0,
            drop_last: false,
            rank: 0,
            world_size: 1,
        };
        let p = c.plan(0);
        assert_eq!((p.batches(), p.batch(2).collect::<Vec<_>>()), (3, vec![8u64, 9]));
        assert_eq!(c.validate(), Ok((10, 3)));
        let big = SamplerConfig {
            batch_size: 11,
            drop_last: true,
            ..c
        };
        assert!(
            big.validate()
                .unwrap_err()
                .to_string()
                .contains("lower batch_size or set drop_last=False")
        );
        assert!(SamplerConfig { rank: 1, ..c }.validate().is_err());
    }
}
