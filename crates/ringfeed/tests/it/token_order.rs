//! The token stream order's vectors (`proto/vectors/tokens/order.json`, control.md "Token
//! streams", "Order"): `permute` at several `(n, key)`, and for several streams the first and
//! last `(dataset, window)` of one rank's rest of an epoch, computed the way the server does
//! (`tokens::mix::Mix`, one dataset being the mix of one, striped by the sampler's plan of the
//! identity order). The Python reference (`client-py/tests/_tokorder.py`) checks them too.
//!
//! `RINGFEED_BLESS=1 cargo test -p ringfeed --test it token_order_vectors` regenerates them.

use std::path::Path;

use ringfeed_order::mix::{Mix, permute, quantise};
use ringfeed_order::sampler::SamplerConfig;
use serde_json::{Value, json};

/// (name, windows per dataset, weights (none: one dataset), seed, epoch, shuffle, world_size,
/// rank, drop_last, position)
type Case = (
    &'static str,
    Vec<u64>,
    Option<Vec<f64>>,
    u64,
    u64,
    bool,
    u64,
    u64,
    bool,
    u64,
);

fn cases() -> Vec<Case> {
    vec![
        ("one dataset, ten windows", vec![10], None, 0, 0, true, 1, 0, true, 0),
        (
            "one dataset, four ranks, padded",
            vec![1000],
            None,
            7,
            3,
            true,
            4,
            1,
            false,
            0,
        ),
        (
            "one dataset, resumed near the end, padding wraps",
            vec![1001],
            None,
            42,
            5,
            true,
            3,
            2,
            false,
            996,
        ),
        (
            "one dataset, world larger than the rest",
            vec![5],
            None,
            9,
            1,
            true,
            8,
            7,
            false,
            3,
        ),
        ("one dataset, not shuffled", vec![50], None, 3, 0, false, 4, 3, false, 0),
        // 10 B tokens in windows of 2048: the 10 B-token benchmark's stream (only its ends listed).
        (
            "one dataset, 4,882,812 windows, resumed",
            vec![4_882_812],
            None,
            1234,
            2,
            true,
            8,
            5,
            true,
            1_000_000,
        ),
        (
            "mix of three, padded, resumed",
            vec![100, 30, 7],
            Some(vec![0.5, 0.3, 0.2]),
            5,
            1,
            true,
            2,
            1,
            false,
            10,
        ),
        (
            "mix with a period of 4, up-sampled passes",
            vec![1000, 3000, 50],
            Some(vec![0.5, 0.25, 0.25]),
            11,
            4,
            true,
            3,
            0,
            true,
            0,
        ),
        (
            "mix, not shuffled",
            vec![20, 9],
            Some(vec![1.0, 3.0]),
            0,
            0,
            false,
            1,
            0,
            false,
            0,
        ),
    ]
}

/// This rank's `(dataset, window)` pairs for the rest of the epoch from `position`.
fn rest(case: &Case) -> Vec<(usize, u64)> {
    let (_, sizes, weights, seed, epoch, shuffle, world, rank, drop_last, position) = case;
    let q = match weights {
        None => vec![1],
        Some(w) => quantise(&w.iter().map(|&x| ("d".to_string(), x)).collect::<Vec<_>>()).unwrap(),
    };
    let mix = Mix::new(sizes.clone(), q);
    let sampler = SamplerConfig {
        dataset_len: mix.len(),
        batch_size: 1,
        // A token stream orders its windows itself: the sampler's order is the identity.
        shuffle: false,
        seed: *seed,
        drop_last: *drop_last,
        rank: *rank,
        world_size: *world,
    };
    let plan = sampler.plan_from(*epoch, *position);
    (0..plan.len())
        .map(|i| mix.window(plan.get(i), *seed, *epoch, *shuffle))
        .collect()
}

fn vectors() -> Value {
    let mut permutes = Vec::new();
    for n in [1u64, 2, 3, 5, 16, 17, 1000, 4_882_812, (1 << 40) + 7] {
        for key in [0u64, 1, 0x0123_4567_89ab_cdef, u64::MAX] {
            let xs: Vec<u64> = if n <= 17 {
                (0..n).collect()
            } else {
                vec![0, 1, 2, 3, n / 3, n / 2, n - 2, n - 1]
            };
            let ys: Vec<u64> = xs.iter().map(|&x| permute(n, key, x)).collect();
            permutes.push(json!({"n": n, "key": key, "x": xs, "y": ys}));
        }
    }
    let streams: Vec<Value> = cases()
        .iter()
        .map(|c| {
            let r = rest(c);
            let pair = |&(d, w): &(usize, u64)| json!([d, w]);
            let mut v = json!({"name": c.0, "windows": c.1, "weights": c.2, "seed": c.3, "epoch": c.4,
                "shuffle": c.5, "world_size": c.6, "rank": c.7, "drop_last": c.8, "position": c.9,
                "count": r.len(),
                "first": r[..r.len().min(16)].iter().map(pair).collect::<Vec<_>>(),
                "last": r[r.len().saturating_sub(8)..].iter().map(pair).collect::<Vec<_>>()});
            if r.len() <= 10_000 {
                v["window_sum"] = json!(r.iter().map(|p| p.1).sum::<u64>());
                v["dataset_sum"] = json!(r.iter().map(|p| p.0 as u64).sum::<u64>());
            }
            v
        })
        .collect();
    json!({"description": "a token stream's window order (control.md, \"Token streams\", \"Order\"): permute(n, key, x) at the listed x, and per stream the first and last (dataset, window) of one rank's rest of the epoch from position, its count and (up to 10,000) the sums of its windows and datasets; regenerate with RINGFEED_BLESS=1 cargo test -p ringfeed --test it token_order_vectors",
        "permute": permutes, "streams": streams})
}

#[test]
fn token_order_vectors_are_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto/vectors/tokens/order.json");
    let text = serde_json::to_string_pretty(&vectors()).unwrap() + "\n";
    crate::support::pinned(&path, text.as_bytes());
}

/// Every window of a one-dataset stream's epoch once over all ranks (drop_last: but the tail),
/// and a resume at any position with another world size gives exactly the rest: the order is a
/// permutation of the windows, whatever the count (around powers of four, where the Feistel
/// network's domain grows).
#[test]
fn a_token_order_is_a_permutation_and_resumes_with_another_world() {
    for n in [1u64, 2, 3, 4, 15, 16, 17, 63, 64, 65, 1000, 4097] {
        for (w1, w2, at) in [(1, 1, 0), (4, 3, n / 3), (2, 5, n / 2), (3, 8, n.saturating_sub(1))] {
            let case =
                |world, rank, position| -> Case { ("", vec![n], None, 17, 3, true, world, rank, true, position) };
            let mut got: Vec<u64> = Vec::new();
            // World w1 up to `at` (only positions that world consumed: whole rounds of w1).
            let at = at - at % w1;
            for r in 0..w1 {
                got.extend(rest(&case(w1, r, 0)).iter().take((at / w1) as usize).map(|p| p.1));
            }
            for r in 0..w2 {
                got.extend(rest(&case(w2, r, at)).iter().map(|p| p.1));
            }
            let kept = got.len() as u64;
            got.sort_unstable();
            got.dedup();
            assert_eq!(got.len() as u64, kept, "n {n}: a window twice");
            assert!(n - kept < w2, "n {n}: only the drop_last tail is missing");
        }
    }
}
