//! The sample orders' vectors (`proto/vectors/order/cases.json`, control.md "Order and
//! randomness"): the first and last indices of one rank's epoch for several `(order, shards,
//! block, seed, epoch, world_size, rank, drop_last)`, which the Python reference
//! (`client-py/tests/_order.py`) checks too.
//!
//! `RINGFEED_BLESS=1 cargo test -p ringfeed --test it order_vectors` regenerates them.

use std::path::Path;
use std::sync::Arc;

use ringfeed_order::blocks::ShardBlocks;
use ringfeed_order::sampler::{Order, SamplerConfig};
use serde_json::{Value, json};

/// (name, order, shard sizes, block, seed, epoch, world_size, rank, drop_last)
type Case = (&'static str, &'static str, Vec<u64>, u64, u64, u64, u64, u64, bool);

fn cases() -> Vec<Case> {
    let ranges = |len: u64, n: u64| -> Vec<u64> { (0..len.div_ceil(n)).map(|s| n.min(len - s * n)).collect() };
    vec![
        ("global, ten samples", "global", vec![10], 16, 0, 0, 1, 0, true),
        (
            "global, four ranks, padded",
            "global",
            vec![1000],
            16,
            7,
            3,
            4,
            1,
            false,
        ),
        (
            "shard blocks of 2 over 8 equal shards",
            "shard_blocks",
            vec![100; 8],
            2,
            0,
            0,
            1,
            0,
            true,
        ),
        (
            "shard blocks, uneven and empty shards, three ranks, padded",
            "shard_blocks",
            vec![37, 50, 12, 0, 50, 1, 44],
            3,
            42,
            5,
            3,
            2,
            false,
        ),
        (
            "shard blocks over stand-in ranges of 1024, largest seed and epoch, eight ranks",
            "shard_blocks",
            ranges(10_000, 1024),
            4,
            (1 << 53) - 1,
            u64::from(u32::MAX),
            8,
            7,
            true,
        ),
        (
            "blocks of one shard",
            "shard_blocks",
            vec![5, 5, 5],
            1,
            1,
            1,
            1,
            0,
            true,
        ),
        (
            "one block larger than the dataset",
            "shard_blocks",
            vec![10, 20],
            16,
            3,
            2,
            2,
            0,
            true,
        ),
    ]
}

fn plan(case: &Case) -> Vec<u64> {
    let (_, order, sizes, block, seed, epoch, world, rank, drop_last) = case;
    let len: u64 = sizes.iter().sum();
    let sampler = SamplerConfig {
        dataset_len: len,
        batch_size: 1,
        shuffle: true,
        seed: *seed,
        drop_last: *drop_last,
        rank: *rank,
        world_size: *world,
    };
    match *order {
        "global" => sampler.plan(*epoch).indices(),
        _ => {
            let perm = ShardBlocks::new(sizes, *block).permutation(*seed, *epoch);
            sampler.plan_order(Order::Table(Arc::new(perm)), 0).indices()
        }
    }
}

fn vectors() -> Value {
    let cases: Vec<Value> = cases()
        .iter()
        .map(|c| {
            let p = plan(c);
            json!({"name": c.0, "order": c.1, "shards": c.2, "block": c.3, "seed": c.4, "epoch": c.5,
                "world_size": c.6, "rank": c.7, "drop_last": c.8, "samples_per_rank": p.len(),
                "first": p[..p.len().min(16)], "last": p[p.len().saturating_sub(8)..],
                "sum": p.iter().sum::<u64>()})
        })
        .collect();
    json!({"description": "first and last dataset indices of one rank's epoch (control.md, \"Order and randomness\"); regenerate with RINGFEED_BLESS=1 cargo test -p ringfeed --test it order_vectors", "cases": cases})
}

#[test]
fn order_vectors_are_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto/vectors/order/cases.json");
    let text = serde_json::to_string_pretty(&vectors()).unwrap() + "\n";
    crate::support::pinned(&path, text.as_bytes());
}

/// The aspect-bucket order's vectors (`proto/vectors/order/buckets.json`, control.md
/// "Aspect-ratio buckets (1.10)"): each rank's batches, `[bucket, indices...]`, for small
/// datasets whose samples' buckets are listed, with and without `drop_last`, and from a resume
/// position. The client computes none of it (the server sends each batch), so only this side
/// checks them; they pin the order against accidental change.
fn bucket_vectors() -> Value {
    use ringfeed_order::buckets::BucketSampler;
    // (name, buckets by sample, batch_size, seed, epoch, world_size, drop_last, position)
    type BucketCase = (&'static str, Vec<u32>, u64, u64, u64, u64, bool, u64);
    let mixed: Vec<u32> = (0..40u32).map(|i| (i * 7 + i / 3) % 4).collect();
    let cases: Vec<BucketCase> = vec![
        ("one bucket, one rank", vec![0; 10], 3, 0, 0, 1, true, 0),
        ("four buckets, two ranks, drop_last", mixed.clone(), 4, 7, 1, 2, true, 0),
        (
            "four buckets, two ranks, leftovers delivered",
            mixed.clone(),
            4,
            7,
            1,
            2,
            false,
            0,
        ),
        (
            "four buckets, three ranks, resumed at global batch 3",
            mixed,
            4,
            9,
            2,
            3,
            false,
            12,
        ),
    ];
    let cases: Vec<Value> = cases
        .into_iter()
        .map(|(name, buckets, batch_size, seed, epoch, world, drop_last, position)| {
            let ranks: Vec<Value> = (0..world)
                .map(|rank| {
                    let config = SamplerConfig {
                        dataset_len: buckets.len() as u64,
                        batch_size,
                        shuffle: true,
                        seed,
                        drop_last,
                        rank,
                        world_size: world,
                    };
                    let s = BucketSampler {
                        buckets: Arc::new(buckets.clone()),
                        config,
                    };
                    let plan = s.plan_from(epoch, position).unwrap();
                    json!(
                        plan.all()
                            .iter()
                            .map(|b| {
                                let mut v = vec![u64::from(b.bucket)];
                                v.extend(&b.indices);
                                v
                            })
                            .collect::<Vec<_>>()
                    )
                })
                .collect();
            json!({"name": name, "buckets": buckets, "batch_size": batch_size, "seed": seed, "epoch": epoch,
                "world_size": world, "drop_last": drop_last, "position": position, "ranks": ranks})
        })
        .collect();
    json!({"description": "each rank's batches ([bucket, dataset indices...]) of the aspect-bucket order (control.md, \"Aspect-ratio buckets (1.10)\"); regenerate with RINGFEED_BLESS=1 cargo test -p ringfeed --test it order_vectors", "cases": cases})
}

#[test]
fn order_vectors_for_buckets_are_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto/vectors/order/buckets.json");
    let text = serde_json::to_string_pretty(&bucket_vectors()).unwrap() + "\n";
    crate::support::pinned(&path, text.as_bytes());
}
