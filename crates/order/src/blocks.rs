//! Sample orders (control.md, "Order and randomness"): the epoch's permutation of dataset
//! indices, before the rank partition of [`crate::sampler`].
//!
//! Two orders:
//! - **global** (the default for local data): one Fisher–Yates shuffle of `0..len` by the
//!   generator of `(seed, epoch)`; [`crate::sampler::SamplerConfig::plan`] computes it.
//! - **shard blocks** ([`ShardBlocks`]): for storage where touching a shard costs much more than
//!   reading a sample from it (object storage, a cold disk, a tar read in place). The shards are
//!   shuffled, cut into blocks of `block` consecutive shards of that shuffled order, and the
//!   samples of each block are shuffled among themselves (MosaicML Streaming's "shuffle blocks").
//!   Ranks still take every `world_size`-th index of the result, so all ranks of a node read the
//!   same block at the same time and one download of a shard serves all of them.
//!
//! Invariants:
//! - The permutation is a pure function of `(shard sizes, block, seed, epoch)`, so batches are a
//!   pure function of `(seed, epoch, rank, world_size, batch)` as with the global order; a resume
//!   needs nothing more.
//! - Every index of `0..len` appears exactly once (the shards cover `0..len`, contiguously, in
//!   order).
//! - Positions `[b·W, (b+1)·W)` of the permutation, `W` the samples of the blocks before block
//!   `b + 1`, hold only indices of block `b`'s shards: a run of `n` consecutive positions lies in
//!   at most `ceil(n / min_block_samples) + 1` blocks. A rank's batch of `B` samples spans
//!   `B · world_size` positions.
//!
//! Shards are the dataset's own files where it has any (a packed dataset's shard files, a
//! WebDataset's tars, one tar one shard); elsewhere (LMDBs, files in place) contiguous index
//! ranges of `order_shard` samples stand in for them.

use crate::rng::SampleRng;

/// The generator streams of the shard-blocks order, apart from the global order's
/// (`u64::MAX`, in `sampler.rs`) and from every sample's augmentation stream (dataset indices).
const SHARD_STREAM: u64 = u64::MAX - 1;
const BLOCK_STREAM: u64 = u64::MAX - 2;

/// Default shards per shuffle block (`open.order_block`).
pub const DEFAULT_BLOCK: u64 = 16;
/// Default samples per stand-in shard for sources without shard files (`open.order_shard`).
pub const DEFAULT_SHARD_SAMPLES: u64 = 1024;

/// Which order an `open` asks for (`open.order`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderKind {
    /// The source decides: shard blocks for remote sources, global for local ones.
    Auto,
    Global,
    ShardBlocks,
}

/// `open.order` names no [`OrderKind`]; holds what it named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("open.order {0:?} must be \"auto\", \"global\" or \"shard_blocks\"")]
pub struct UnknownOrder(pub String);

impl std::str::FromStr for OrderKind {
    type Err = UnknownOrder;
    fn from_str(s: &str) -> Result<Self, UnknownOrder> {
        match s {
            "auto" => Ok(OrderKind::Auto),
            "global" => Ok(OrderKind::Global),
            "shard_blocks" => Ok(OrderKind::ShardBlocks),
            other => Err(UnknownOrder(other.to_owned())),
        }
    }
}

/// The shard-blocks order over a dataset's shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardBlocks {
    /// `ends[s]`: one past the last index of shard `s`; shard `s` is `ends[s-1]..ends[s]`.
    ends: Vec<u64>,
    /// Shards per block, at least 1.
    block: u64,
}

impl ShardBlocks {
    /// The order over shards of `sizes` samples each (in index order; zero sizes allowed), in
    /// blocks of `block` shards (at least 1).
    pub fn new(sizes: &[u64], block: u64) -> Self {
        let mut end = 0u64;
        let ends = sizes
            .iter()
            .map(|&n| {
                end += n;
                end
            })
            .collect();
        ShardBlocks {
            ends,
            block: block.max(1),
        }
    }

    /// The order over `len` samples cut into stand-in shards of `shard` samples (the last one
    /// shorter), for sources without shard files.
    pub fn ranges(len: u64, shard: u64, block: u64) -> Self {
        let shard = shard.max(1);
        let sizes: Vec<u64> = (0..len.div_ceil(shard)).map(|s| shard.min(len - s * shard)).collect();
        ShardBlocks::new(&sizes, block)
    }

    /// Samples in all shards.
    pub fn len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of shards.
    pub fn shards(&self) -> usize {
        self.ends.len()
    }

    /// The shard holding index `i` (`i < len()`).
    pub fn shard_of(&self, i: u64) -> usize {
        self.ends.partition_point(|&e| e <= i)
    }

    fn range(&self, s: usize) -> std::ops::Range<u64> {
        let start = if s == 0 { 0 } else { self.ends[s - 1] };
        start..self.ends[s]
    }

    /// The permutation of `0..len()` for `(seed, epoch)` (the module docs; control.md, "Order
    /// and randomness", gives the exact steps).
    pub fn permutation(&self, seed: u64, epoch: u64) -> Vec<u64> {
        let mut shards: Vec<u64> = (0..self.ends.len() as u64).collect();
        fisher_yates(&mut shards, &mut SampleRng::new(seed, epoch, SHARD_STREAM));
        let blocks = SampleRng::new(seed, epoch, BLOCK_STREAM);
        let mut out = Vec::with_capacity(self.len() as usize);
        for (b, group) in shards.chunks(self.block as usize).enumerate() {
            let start = out.len();
            for &s in group {
                out.extend(self.range(s as usize));
            }
            fisher_yates(&mut out[start..], &mut blocks.fork(b as u64));
        }
        out
    }
}

/// Largest `open.order_block`.
pub const MAX_BLOCK: u64 = 1 << 20;
/// Largest `open.order_shard`.
pub const MAX_SHARD_SAMPLES: u64 = 1 << 32;

/// Fisher–Yates from the back, as `sampler.rs` shuffles: `j = below(i + 1)` for `i = n-1 ..= 1`.
fn fisher_yates(v: &mut [u64], rng: &mut SampleRng) {
    for i in (1..v.len()).rev() {
        let j = rng.below(i as u64 + 1);
        v.swap(i, j as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::sampler::{Order, SamplerConfig};

    fn sampler(len: u64, batch: u64, world: u64, rank: u64, drop_last: bool) -> SamplerConfig {
        SamplerConfig {
            dataset_len: len,
            batch_size: batch,
            shuffle: true,
            seed: 5,
            drop_last,
            rank,
            world_size: world,
        }
    }

    #[test]
    fn a_permutation_of_every_index_whatever_the_shards() {
        for sizes in [vec![10], vec![3, 0, 7, 1, 9], vec![0, 0, 4], vec![1; 17]] {
            for block in [1, 2, 3, 100] {
                let o = ShardBlocks::new(&sizes, block);
                let mut p = o.permutation(3, 1);
                assert_eq!(p, o.permutation(3, 1), "a pure function of seed and epoch");
                p.sort_unstable();
                assert_eq!(p, (0..o.len()).collect::<Vec<_>>(), "{sizes:?} block {block}");
            }
        }
        let o = ShardBlocks::ranges(2500, 1000, 2);
        assert_eq!(
            (o.shards(), o.len(), o.shard_of(999), o.shard_of(1000)),
            (3, 2500, 0, 1)
        );
        assert_ne!(o.permutation(0, 0), o.permutation(0, 1));
        assert_ne!(o.permutation(0, 0), o.permutation(1, 0));
    }

    #[test]
    fn ranks_see_every_sample_exactly_once_per_epoch() {
        let sizes = [37, 50, 12, 50, 50, 1, 44];
        let o = ShardBlocks::new(&sizes, 2);
        let len = o.len();
        for (world, drop_last) in [(1, true), (3, true), (4, false), (8, true)] {
            let mut seen = vec![0u32; len as usize];
            for r in 0..world {
                let s = sampler(len, 4, world, r, drop_last);
                for i in s
                    .plan_order(Order::Table(Arc::new(o.permutation(s.seed, 2))), 0)
                    .indices()
                {
                    seen[i as usize] += 1;
                }
            }
            let per_rank = sampler(len, 4, world, 0, drop_last).samples_per_rank();
            assert_eq!(u64::from(seen.iter().sum::<u32>()), per_rank * world);
            if drop_last {
                assert!(seen.iter().all(|&c| c <= 1), "world {world}: a sample twice");
                assert_eq!(seen.iter().filter(|&&c| c == 1).count() as u64, len - len % world);
            } else {
                assert!(seen.iter().all(|&c| c >= 1), "world {world}: a sample missing");
            }
        }
    }

    /// Per-batch quality of an order, over every batch of every rank of one epoch.
    struct Quality {
        /// Mean and largest number of distinct shards a batch reads.
        shards_mean: f64,
        shards_max: usize,
        /// The chance that two samples of one batch have the same label (the within-batch label
        /// correlation; `1 / classes` for a full shuffle of balanced labels).
        same_label: f64,
        /// Lag-1 autocorrelation of the labels along each batch (0 for exchangeable orders).
        lag1: f64,
    }

    fn quality(perm: &[u64], shards: &ShardBlocks, labels: &[u32], batch: u64, world: u64) -> Quality {
        let (mut n, mut sum_shards, mut max_shards) = (0usize, 0usize, 0usize);
        let (mut pairs, mut same) = (0u64, 0u64);
        let mean = labels.iter().map(|&l| f64::from(l)).sum::<f64>() / labels.len() as f64;
        let var = labels.iter().map(|&l| (f64::from(l) - mean).powi(2)).sum::<f64>() / labels.len() as f64;
        let (mut lag_sum, mut lag_n) = (0.0, 0u64);
        for r in 0..world {
            let plan =
                sampler(perm.len() as u64, batch, world, r, true).plan_order(Order::Table(Arc::new(perm.to_vec())), 0);
            for b in 0..plan.batches() {
                let idx: Vec<u64> = plan.batch(b).collect();
                let mut s: Vec<usize> = idx.iter().map(|&i| shards.shard_of(i)).collect();
                s.sort_unstable();
                s.dedup();
                n += 1;
                sum_shards += s.len();
                max_shards = max_shards.max(s.len());
                let mut counts = std::collections::BTreeMap::<u32, u64>::new();
                for &i in &idx {
                    *counts.entry(labels[i as usize]).or_default() += 1;
                }
                let k = idx.len() as u64;
                pairs += k * (k - 1) / 2;
                same += counts.values().map(|c| c * (c - 1) / 2).sum::<u64>();
                for w in idx.windows(2) {
                    lag_sum += (f64::from(labels[w[0] as usize]) - mean) * (f64::from(labels[w[1] as usize]) - mean);
                    lag_n += 1;
                }
            }
        }
        Quality {
            shards_mean: sum_shards as f64 / n as f64,
            shards_max: max_shards,
            same_label: same as f64 / pairs as f64,
            lag1: lag_sum / lag_n as f64 / var,
        }
    }

    /// The trade-off docs/order.md states, with its bounds: 64 shards of 500 samples, 10
    /// balanced classes, blocks of 4 shards, batches of 64 on 4 ranks.
    #[test]
    fn shard_blocks_read_few_shards_per_batch_and_keep_labels_mixed_when_shards_are() {
        let shards = ShardBlocks::ranges(32_000, 500, 4);
        let (batch, world) = (64, 4);
        let full = sampler(32_000, batch, 1, 0, true).plan(7).indices();
        // Labels drawn independently of position: shards written from a shuffled list (how
        // WebDataset shards and a pack of a shuffled manifest are made).
        let mut rng = SampleRng::new(99, 0, 0);
        let iid: Vec<u32> = (0..32_000).map(|_| rng.below(10) as u32).collect();
        let g = quality(&full, &shards, &iid, batch, world);
        let sb = quality(&shards.permutation(5, 7), &shards, &iid, batch, world);
        eprintln!(
            "iid labels: full shuffle {:.1} shards/batch (max {}), same-label {:.4}, lag-1 {:.3}; shard blocks {:.1} (max {}), {:.4}, {:.3}",
            g.shards_mean, g.shards_max, g.same_label, g.lag1, sb.shards_mean, sb.shards_max, sb.same_label, sb.lag1
        );
        // A batch spans 256 positions, inside one block of 2000 samples or across two: at most
        // 8 shards. A full shuffle reads ~40 of the 64 shards per batch.
        assert!(
            sb.shards_max <= 8,
            "shard blocks read {} shards in a batch",
            sb.shards_max
        );
        assert!(g.shards_mean > 35.0, "full shuffle: {} shards per batch", g.shards_mean);
        // Same-label pairs at the full shuffle's rate (0.1 ± sampling noise) and no lag-1
        // correlation: the order inside a block is a uniform shuffle.
        assert!(
            (sb.same_label - g.same_label).abs() < 0.006,
            "{} vs {}",
            sb.same_label,
            g.same_label
        );
        assert!((g.same_label - 0.1).abs() < 0.006, "{}", g.same_label);
        assert!(
            sb.lag1.abs() < 0.03 && g.lag1.abs() < 0.03,
            "lag-1 {} / {}",
            sb.lag1,
            g.lag1
        );

        // Labels sorted by shard (a pack of an ImageFolder: 6.4 shards per class): a batch sees
        // only the classes of its few shards, so same-label pairs are several times as likely.
        // This is the price of the order, and why docs/order.md says to shuffle before packing.
        let sorted: Vec<u32> = (0..32_000u32).map(|i| i / 3200).collect();
        let g = quality(&full, &shards, &sorted, batch, world);
        let sb = quality(&shards.permutation(5, 7), &shards, &sorted, batch, world);
        eprintln!(
            "sorted labels: full shuffle {:.1} shards/batch, same-label {:.4}, lag-1 {:.3}; shard blocks {:.1} (max {}), {:.4}, {:.3}",
            g.shards_mean, g.same_label, g.lag1, sb.shards_mean, sb.shards_max, sb.same_label, sb.lag1
        );
        assert!((g.same_label - 0.1).abs() < 0.006, "{}", g.same_label);
        assert!(
            sb.same_label > 2.0 * g.same_label,
            "{} vs {}",
            sb.same_label,
            g.same_label
        );
        assert!(sb.same_label < 0.6, "{}", sb.same_label);
        // Measured against the dataset's mean label, neighbours in a batch are then strongly
        // correlated (both come from the batch's few classes); a full shuffle shows none.
        assert!(g.lag1.abs() < 0.03, "{}", g.lag1);
        assert!(sb.lag1 > 0.08, "{}", sb.lag1);
    }
}
