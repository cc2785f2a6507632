//! The order of samples: per-epoch permutation, rank partition, batches (control.md, "Order and
//! randomness").
//!
//! Everything here is a pure function of its arguments, so a stream's batches do not depend on
//! threads or timing, and resuming at batch `k` needs nothing but `(seed, epoch, k)`.

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

/// One rank's view of one epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochPlan {
    /// Dataset indices this rank sees, in order.
    pub indices: Vec<u64>,
    pub batch_size: u64,
    pub drop_last: bool,
}

impl SamplerConfig {
    /// Checks the configuration; returns samples per rank and batches per epoch.
    pub fn validate(&self) -> Result<(u64, u64), SamplerError> {
        if self.world_size == 0 {
            return Err(SamplerError::World);
        }
        if self.rank >= self.world_size {
            return Err(SamplerError::Rank {
                rank: self.rank,
                world_size: self.world_size,
            });
        }
        if self.batch_size == 0 {
            return Err(SamplerError::BatchSize);
        }
        if self.dataset_len == 0 {
            return Err(SamplerError::Empty);
        }
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
        if self.drop_last {
            self.dataset_len / self.world_size
        } else {
            self.dataset_len.div_ceil(self.world_size)
        }
    }

    /// Batches each rank gets per epoch.
    pub fn batches_per_epoch(&self) -> u64 {
        let n = self.samples_per_rank();
        if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        }
    }

    /// This rank's indices for `epoch`.
    pub fn plan(&self, epoch: u64) -> EpochPlan {
        let len = self.dataset_len;
        let mut order: Vec<u64> = (0..len).collect();
        if self.shuffle {
            shuffle(&mut order, self.seed, epoch);
        }
        self.plan_from(order)
    }

    /// This rank's indices from an epoch's permutation `order` of `0..dataset_len` (another
    /// order than the global shuffle: `crate::order`), split over the ranks as [`Self::plan`]
    /// splits its own.
    pub fn plan_from(&self, mut order: Vec<u64>) -> EpochPlan {
        debug_assert_eq!(order.len() as u64, self.dataset_len);
        let per_rank = self.samples_per_rank();
        let total = per_rank * self.world_size;
        // Pad by repeating the start of the order (as often as needed), or cut the tail.
        let mut i = 0usize;
        while (order.len() as u64) < total {
            order.push(order[i]);
            i += 1;
        }
        order.truncate(total as usize);
        let indices = order
            .into_iter()
            .skip(self.rank as usize)
            .step_by(self.world_size as usize)
            .collect();
        EpochPlan {
            indices,
            batch_size: self.batch_size,
            drop_last: self.drop_last,
        }
    }
}

impl EpochPlan {
    /// Number of batches.
    pub fn batches(&self) -> u64 {
        let n = self.indices.len() as u64;
        if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        }
    }

    /// Dataset indices of batch `b` (the last one may be shorter without `drop_last`).
    pub fn batch(&self, b: u64) -> &[u64] {
        let start = (b * self.batch_size) as usize;
        let end = (start + self.batch_size as usize).min(self.indices.len());
        &self.indices[start.min(end)..end]
    }
}

/// Separates the order's random stream from every sample's augmentation stream (which uses
/// real dataset indices, all below this).
const ORDER_STREAM: u64 = u64::MAX;

/// Fisher–Yates with the generator of `(seed, epoch)`, unbiased (`SampleRng::below`).
fn shuffle(v: &mut [u64], seed: u64, epoch: u64) {
    let mut rng = crate::ops::SampleRng::new(seed, epoch, ORDER_STREAM);
    for i in (1..v.len()).rev() {
        let j = rng.below(i as u64 + 1);
        v.swap(i, j as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            for &i in &cfg(len, 4, r, true).plan(5).indices {
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
            assert_eq!(p.indices.len(), 3);
            for &i in &p.indices {
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
        assert_ne!(a.indices, cfg(50, 1, 0, true).plan(2).indices);
        let mut sorted = a.indices.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..50).collect::<Vec<u64>>(),
            "a permutation of the whole dataset"
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
        assert_eq!((p.batches(), p.batch(2)), (3, &[8u64, 9][..]));
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
