//! Vectors for the control protocol and the ring layout (`proto/vectors/control/`,
//! `proto/vectors/ring/`): the Rust side writes them in bless mode, and checks on every run that
//! its encoders still produce them byte for byte and its decoders read them back.
//!
//! `RINGFEED_BLESS=1 cargo test -p ringfeed --test it wire_vectors` regenerates them.

use std::fs;
use std::path::{Path, PathBuf};

use ringfeed_format::control::{ClientMessage, ServerMessage, decode_frame, encode_frame, frame::check_length};
use ringfeed_format::ring::{DType, FieldSpec, RingLayout, SegmentHeader, SlotHeader};
use serde_json::{Value, json};

use crate::support::pinned;

fn vectors() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto/vectors")
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn messages() -> Vec<(&'static str, Value)> {
    vec![
        (
            "hello",
            json!({"type": "hello", "protocol": [1, 0], "client": "ringfeed-py 0.1.0", "pid": 4242}),
        ),
        ("hello, minimal", json!({"type": "hello", "protocol": [1, 0]})),
        (
            "welcome",
            json!({"type": "welcome", "protocol": [1, 0], "server": "ringfeed 0.1.0"}),
        ),
        (
            "open, everything",
            json!({"type": "open", "dataset": "/data/imagenet-train", "lmdb": {}, "batch_size": 256,
                "transform": {"kind": "random_resized_crop", "size": [224, 224], "scale": [0.08, 1.0], "ratio": [0.75, 4.0 / 3.0], "flip": 0.5},
                "layout": "NCHW", "shuffle": true, "seed": 7, "drop_last": false, "rank": 1, "world_size": 8, "slots": 6,
                "on_error": "skip", "fields": ["image", "label", "index", "crop"], "check_crc": true}),
        ),
        (
            "open, eval on an lmdb",
            json!({"type": "open", "dataset": "/data/val.lmdb", "lmdb": {"layout": "raw", "labels": "/data/val.csv"}, "batch_size": 100,
                "transform": {"kind": "center_crop", "size": [224, 224], "resize": 256},
                "layout": "NHWC", "shuffle": false, "seed": 0, "drop_last": false, "rank": 0, "world_size": 1, "slots": 4,
                "on_error": "raise", "check_crc": false}),
        ),
        (
            "open, 1.1 pinned threads and prefetch",
            json!({"type": "open", "dataset": "/data/imagenet-train", "lmdb": {}, "batch_size": 64,
                "transform": {"kind": "resize", "size": [128, 128]},
                "layout": "NHWC", "shuffle": true, "seed": 0, "drop_last": true, "rank": 0, "world_size": 1, "slots": 4,
                "on_error": "raise", "check_crc": true,
                "autotune": false, "threads": 6, "prefetch": 3, "local_world_size": 8}),
        ),
        ("hello, 1.1", json!({"type": "hello", "protocol": [1, 1]})),
        ("hello, 1.2", json!({"type": "hello", "protocol": [1, 2]})),
        (
            "open, 1.2 pipeline with two views",
            json!({"type": "open", "dataset": "/data/imagenet-train", "lmdb": {}, "batch_size": 128,
                "pipeline": {"views": [
                    {"name": "global", "count": 2, "ops": [
                        {"op": "random_resized_crop", "size": [224, 224], "scale": [0.4, 1.0], "ratio": [0.75, 4.0 / 3.0], "interpolation": "bicubic", "antialias": true},
                        {"op": "horizontal_flip", "p": 0.5},
                        {"op": "random_apply", "p": 0.8, "ops": [{"op": "color_jitter", "brightness": [0.6, 1.4], "hue": [-0.1, 0.1]}]},
                        {"op": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
                        {"op": "random_erasing", "p": 0.25, "scale": [0.02, 0.33], "ratio": [0.3, 3.3], "value": "random"}]},
                    {"name": "local", "count": 8, "ops": [
                        {"op": "random_resized_crop", "size": [96, 96], "scale": [0.05, 0.4], "ratio": [0.75, 4.0 / 3.0], "interpolation": "bicubic", "antialias": true},
                        {"op": "trivial_augment_wide", "num_magnitude_bins": 31, "interpolation": "nearest", "fill": [124.0, 116.0, 104.0]}]}]},
                "layout": "NCHW", "shuffle": true, "seed": 3, "drop_last": true, "rank": 0, "world_size": 1, "slots": 4,
                "on_error": "raise", "fields": ["global", "local", "label"], "check_crc": true}),
        ),
        ("snapshot request", json!({"type": "snapshot"})),
        (
            "snapshot",
            json!({"type": "snapshot",
                "server": {"version": "ringfeed 0.1.0", "pid": 4100, "uptime_s": 12.5, "cores": 16, "cpu_budget": 14,
                    "threads": 16, "active_threads": 6, "busy": 5.71},
                "streams": [{"stream": 3, "pid": 4242, "dataset": "/data/imagenet-train (312 shards, 1281167 samples)",
                    "batch_size": 256, "epoch": 2, "run": 3, "slots": {"free": 1, "filling": 2, "ready": 0, "held": 1},
                    "autotune": true, "threads": 6, "depth": 3, "samples": 512000, "batches": 2000, "skipped": 2,
                    "samples_per_s": 4712.5, "wait": 0.0042, "step_ms": 53.11,
                    "stage_us": {"read": 3.1, "decode": 1002.4, "transform": 171.9, "write": 0.4},
                    "tune": "the loop needs 5.4 threads (4820 samples/s at 1124 µs each): 7 → 6"}]}),
        ),
        ("hello, 1.2", json!({"type": "hello", "protocol": [1, 2]})),
        (
            "snapshot, 1.2 busy, gpu wait and limit",
            json!({"type": "snapshot",
                "server": {"version": "ringfeed 0.1.0", "pid": 4100, "uptime_s": 30.0, "cores": 16, "cpu_budget": 15,
                    "threads": 15, "active_threads": 15, "busy": 14.82},
                "streams": [{"stream": 1, "pid": 4242, "dataset": "/data/imagenet-train (312 shards, 1281167 samples)",
                    "batch_size": 256, "epoch": 0, "run": 1, "slots": {"free": 0, "filling": 5, "ready": 0, "held": 1},
                    "autotune": true, "threads": 15, "depth": 5, "samples": 320000, "batches": 1250, "skipped": 0,
                    "samples_per_s": 10764.0, "wait": 0.112, "gpu_wait": 0.02, "step_ms": 20.81, "busy": 0.988,
                    "stage_us": {"read": 2.0, "decode": 1001.5, "transform": 380.2, "write": 0.3},
                    "tune": "the training loop can take 12302 samples/s (a batch of 256 per 20.8 ms of its own step); at 1394 µs of thread time per sample that needs 17.1 decode threads: 12 → 15",
                    "limit": "the CPU is the limit (15 decode threads at most): the training loop waits for data 11.2% of its time (and 2.0% behind its own GPU work); its 15 decode threads are 99% busy"}]}),
        ),
        ("hello, 1.3", json!({"type": "hello", "protocol": [1, 3]})),
        (
            "open, 1.3 hybrid decode, the tuner sets the share",
            json!({"type": "open", "dataset": "/data/imagenet-train", "lmdb": {}, "batch_size": 256,
                "pipeline": {"views": [{"name": "image", "count": 1, "ops": [
                    {"op": "random_resized_crop", "size": [224, 224], "scale": [0.08, 1.0], "ratio": [0.75, 4.0 / 3.0], "interpolation": "bilinear", "antialias": true},
                    {"op": "horizontal_flip", "p": 0.5},
                    {"op": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}]}]},
                "layout": "NCHW", "shuffle": true, "seed": 0, "drop_last": true, "rank": 0, "world_size": 1, "slots": 4,
                "on_error": "raise", "check_crc": true, "threads": 6,
                "gpu_decode": {"share": null}}),
        ),
        (
            "open, 1.3 hybrid decode, pinned share and arena",
            json!({"type": "open", "dataset": "/data/val", "lmdb": {}, "batch_size": 100,
                "pipeline": {"views": [{"name": "image", "count": 1, "ops": [
                    {"op": "resize", "size": [256], "interpolation": "bilinear", "antialias": true},
                    {"op": "center_crop", "size": [224, 224]}]}]},
                "layout": "NHWC", "shuffle": false, "seed": 0, "drop_last": false, "rank": 0, "world_size": 1, "slots": 4,
                "on_error": "skip", "check_crc": true,
                "gpu_decode": {"share": 0.5, "bytes_per_sample": 1048576}}),
        ),
        (
            "open, 1.11 decoded pixels",
            json!({"type": "open", "dataset": "/data/imagenet-train", "lmdb": {}, "batch_size": 256,
                "pipeline": {"views": [{"name": "image", "count": 1, "ops": [
                    {"op": "random_resized_crop", "size": [224, 224], "scale": [0.08, 1.0], "ratio": [0.75, 4.0 / 3.0], "interpolation": "bilinear", "antialias": true},
                    {"op": "horizontal_flip", "p": 0.5},
                    {"op": "trivial_augment_wide"}]}]},
                "layout": "NCHW", "shuffle": true, "seed": 0, "drop_last": true, "rank": 0, "world_size": 1, "slots": 6,
                "on_error": "raise", "check_crc": true, "threads": 6,
                "gpu_decode": {"share": 0.5, "pixels": true}}),
        ),
        (
            "stats, 1.3 with gpu decode",
            json!({"type": "stats", "steps": 12, "wait_ns": 150000000, "compute_ns": 100000000, "gpu_wait_ns": 20000000,
                "gpu_samples": 1536, "gpu_decode_ns": 138000000, "gpu_fallbacks": 2}),
        ),
        (
            "stats, 1.5 with gpu decode wait",
            json!({"type": "stats", "steps": 12, "wait_ns": 150000000, "compute_ns": 100000000, "gpu_wait_ns": 20000000,
                "gpu_samples": 1536, "gpu_decode_ns": 138000000, "gpu_fallbacks": 2, "gpu_decode_wait_ns": 90000000}),
        ),
        (
            "snapshot, 1.3 gpu share",
            json!({"type": "snapshot",
                "server": {"version": "ringfeed 0.1.0", "pid": 4100, "uptime_s": 30.0, "cores": 16, "cpu_budget": 6,
                    "threads": 6, "active_threads": 6, "busy": 5.9},
                "streams": [{"stream": 1, "pid": 4242, "dataset": "/data/imagenet-train (312 shards, 1281167 samples)",
                    "batch_size": 256, "epoch": 0, "run": 1, "slots": {"free": 0, "filling": 3, "ready": 0, "held": 1},
                    "autotune": true, "threads": 6, "depth": 3, "samples": 320000, "batches": 1250, "skipped": 0,
                    "samples_per_s": 12100.0, "wait": 0.004, "gpu_wait": 0.03, "step_ms": 20.4, "busy": 0.97,
                    "stage_us": {"read": 2.0, "decode": 701.5, "transform": 180.2, "write": 0.3},
                    "tune": "the CPU is the limit (the training loop waits for data 21.0% of its time; its 6 decode threads are 99% busy): GPU share 0.500 → 0.625",
                    "limit": "fed: the training loop waits for data 0.4% of its time (and 3.0% behind its own GPU work); its 6 decode threads are 97% busy",
                    "gpu_share": 0.625, "gpu_samples": 190000, "gpu_decode_us": 21.5}]}),
        ),
        (
            "snapshot, 1.11 decoded pixels",
            json!({"type": "snapshot",
                "server": {"version": "ringfeed 0.1.0", "pid": 4100, "uptime_s": 30.0, "cores": 16, "cpu_budget": 6,
                    "threads": 6, "active_threads": 6, "busy": 5.9},
                "streams": [{"stream": 1, "pid": 4242, "dataset": "/data/imagenet-train (312 shards, 1281167 samples)",
                    "batch_size": 256, "epoch": 0, "run": 1, "slots": {"free": 0, "filling": 3, "ready": 0, "held": 1},
                    "autotune": true, "threads": 6, "depth": 5, "samples": 320000, "batches": 1250, "skipped": 0,
                    "samples_per_s": 10700.0, "wait": 0.3, "gpu_wait": 0.015, "step_ms": 20.4, "busy": 0.99,
                    "stage_us": {"read": 11.0, "decode": 525.9, "transform": 6.9, "write": 0.1},
                    "tune": "the CPU is the limit at the GPU share's top (the training loop waits for data 30.0% of its time; its 6 decode threads are 99% busy): the samples the server decodes go to the client's GPU as pixels (it finishes them)",
                    "limit": "the CPU is the limit (6 decode threads at most): the training loop waits for data 30.0% of its time; its 6 decode threads are 99% busy",
                    "gpu_share": 0.375, "gpu_samples": 120000, "gpu_decode_us": 26.1, "pixel_samples": 200000}]}),
        ),
        (
            "open, 1.3 remote dataset",
            json!({"type": "open", "dataset": "s3://training-data/imagenet/train.rf", "lmdb": {}, "batch_size": 256,
                "pipeline": {"views": [{"name": "image", "count": 1, "ops": [
                    {"op": "random_resized_crop", "size": [224, 224], "scale": [0.08, 1.0], "ratio": [0.75, 4.0 / 3.0], "interpolation": "bilinear", "antialias": true},
                    {"op": "horizontal_flip", "p": 0.5}]}]},
                "layout": "NCHW", "shuffle": true, "seed": 0, "drop_last": true, "rank": 3, "world_size": 8, "slots": 4,
                "on_error": "raise", "check_crc": true}),
        ),
        (
            "snapshot, 1.3 remote",
            json!({"type": "snapshot",
                "server": {"version": "ringfeed 0.1.0", "pid": 4100, "uptime_s": 95.5, "cores": 16, "cpu_budget": 14,
                    "threads": 16, "active_threads": 14, "busy": 13.2,
                    "remote": {"fetches": 41, "bytes": 10871635968u64, "retries": 3, "errors": 0, "hits": 1180442, "misses": 37,
                        "prefetches": 39, "evictions": 9, "reused": 2, "rejected": 1, "wait_s": 4.125,
                        "cache_bytes": 8589934592u64, "cache_limit": 10737418240u64,
                        "fetch_concurrency": 6, "fetch_pinned": false}},
                "streams": []}),
        ),
        ("start", json!({"type": "start", "epoch": 3, "first_batch": 120})),
        ("hello, 1.3", json!({"type": "hello", "protocol": [1, 3]})),
        (
            "open, 1.2 token stream",
            json!({"type": "open", "sample_kind": "tokens", "dataset": "/data/fineweb.tok", "batch_size": 16,
                "tokens": {"seq_len": 2048, "mode": "concat", "max_docs": 64},
                "shuffle": true, "seed": 0, "drop_last": true, "rank": 1, "world_size": 8, "slots": 4,
                "fields": ["position_ids", "cu_seqlens"], "autotune": true}),
        ),
        (
            "open, 1.9 sample fields",
            json!({"type": "open", "dataset": "/data/laion/{00000..00099}.tar", "batch_size": 256,
                "transform": {"kind": "resize", "size": [224, 224]},
                "layout": "NHWC", "shuffle": true, "seed": 1, "drop_last": true, "rank": 0, "world_size": 1, "slots": 4,
                "on_error": "skip", "webdataset": {"label": ""},
                "text": [{"name": "text", "source": "txt", "max_bytes": 1024},
                    {"name": "caption", "source": "json:caption", "tokenizer": "/models/clip/tokenizer.json", "max_length": 77}],
                "meta": [{"name": "aesthetic", "source": "json:aesthetic", "dtype": "float32"},
                    {"name": "width", "source": "json:width", "dtype": "int32"},
                    {"name": "nsfw", "source": "json:nsfw", "dtype": "bool"}]}),
        ),
        (
            "open, 1.9 parquet",
            json!({"type": "open", "dataset": "/data/hf/train", "batch_size": 256,
                "transform": {"kind": "resize", "size": [224, 224]},
                "layout": "NHWC", "shuffle": true, "seed": 1, "drop_last": true, "rank": 0, "world_size": 1, "slots": 4,
                "on_error": "skip", "parquet": {"image": "jpg", "label": ""},
                "text": [{"name": "text", "source": "caption", "max_bytes": 1024}],
                "meta": [{"name": "width", "source": "meta:width", "dtype": "int32"}]}),
        ),
        (
            "open, 1.3 token mix",
            json!({"type": "open", "sample_kind": "tokens", "dataset": "/data/web.tok", "batch_size": 8,
                "tokens": {"seq_len": 1024, "mode": "concat", "max_docs": 1024, "weight": 0.7,
                    "mix": [{"dataset": "/data/code.tok", "weight": 0.2}, {"dataset": "/data/math.tok", "weight": 0.1}]},
                "shuffle": true, "seed": 5, "drop_last": true, "rank": 0, "world_size": 2, "slots": 4,
                "fields": [], "autotune": true}),
        ),
        (
            "start, 1.3 at a global position",
            json!({"type": "start", "epoch": 1, "first_batch": 2, "position": 4096}),
        ),
        ("release", json!({"type": "release", "slot": 2, "seq": 9})),
        (
            "stats",
            json!({"type": "stats", "steps": 20, "wait_ns": 1500000, "compute_ns": 2000000000}),
        ),
        (
            "stats, 1.2 with gpu wait",
            json!({"type": "stats", "steps": 12, "wait_ns": 150000000, "compute_ns": 100000000, "gpu_wait_ns": 120000000}),
        ),
        ("close", json!({"type": "close"})),
        (
            "ring",
            json!({"type": "ring", "segment_len": 157294592, "dataset_len": 1281167, "samples_per_rank": 160146,
                "batches_per_epoch": 625, "classes": ["n01440764", "caf\u{e9}"]}),
        ),
        (
            "ring, 1.1",
            json!({"type": "ring", "segment_len": 4096, "dataset_len": 10, "samples_per_rank": 10,
                "batches_per_epoch": 2, "classes": [], "stream": 7}),
        ),
        (
            "opening (1.2)",
            json!({"type": "opening", "dataset": "/data/imagenet/train", "listed": 412000, "elapsed_ms": 3000}),
        ),
        ("ready", json!({"type": "ready", "run": 1, "seq": 1, "slot": 0})),
        (
            "end",
            json!({"type": "end", "run": 2, "epoch": 3, "batches": 625, "skipped": 1}),
        ),
        (
            "error, sample",
            json!({"type": "error", "code": "sample", "message": "sample 17 (key \"a/b.jpg\") does not decode: corrupt jpeg image: Premature end of JPEG file", "fatal": false, "sample": 17, "key": "a/b.jpg", "run": 3}),
        ),
        (
            "error, shutdown (1.1)",
            json!({"type": "error", "code": "shutdown", "message": "the ringfeed server is shutting down (SIGTERM or SIGINT); a Loader with reconnect=N resumes on its successor", "fatal": true}),
        ),
        (
            "error, version",
            json!({"type": "error", "code": "version", "message": "client speaks protocol 2.0, this server 1.0", "fatal": true}),
        ),
        ("hello, 1.3", json!({"type": "hello", "protocol": [1, 3]})),
        (
            "open, 1.3 shard-blocks order over WebDataset tars",
            json!({"type": "open", "dataset": "/data/laion/shards-{000000..000099}.tar", "lmdb": {}, "batch_size": 256,
                "transform": {"kind": "resize", "size": [224, 224]},
                "layout": "NHWC", "shuffle": true, "seed": 1, "drop_last": true, "rank": 3, "world_size": 8, "slots": 4,
                "on_error": "skip", "check_crc": true, "order": "shard_blocks", "order_block": 8, "order_shard": 4096,
                "webdataset": {"image": "webp;jpg", "label": "json", "label_key": "class_id", "write_index": false}}),
        ),
        (
            "ring, 1.3 with its order",
            json!({"type": "ring", "segment_len": 4096, "dataset_len": 10, "samples_per_rank": 10,
                "batches_per_epoch": 2, "classes": [], "stream": 2, "order": "shard_blocks"}),
        ),
        (
            "ring, 1.6 with its dataset id",
            json!({"type": "ring", "segment_len": 4096, "dataset_len": 10, "samples_per_rank": 10,
                "batches_per_epoch": 2, "classes": ["cat", "dog"], "stream": 3, "order": "global",
                "dataset_id": "0123456789abcdef"}),
        ),
    ]
}

#[test]
fn control_frames() {
    let mut out = Vec::new();
    for (name, msg) in messages() {
        // Every message round-trips through the typed decoders and encodes to the same bytes.
        let frame = encode_frame(&msg);
        let (kind, value) = decode_frame(&frame[4..]).unwrap();
        assert_eq!(value, msg, "{name}");
        let client = ["hello", "open", "start", "release", "stats", "close"].contains(&kind.as_str())
            || (kind == "snapshot" && msg.get("server").is_none());
        let typed_frame = if client {
            encode_frame(&serde_json::from_value::<ClientMessage>(msg.clone()).unwrap())
        } else {
            encode_frame(&serde_json::from_value::<ServerMessage>(msg.clone()).unwrap())
        };
        assert_eq!(hex(&typed_frame), hex(&frame), "{name}: typed encoding differs");
        out.push(json!({"name": name, "message": msg, "frame": hex(&frame)}));
    }
    pinned(
        &vectors().join("control/frames.json"),
        (serde_json::to_string_pretty(&out).unwrap() + "\n").as_bytes(),
    );

    let bad: Vec<(&str, Vec<u8>, &str)> = vec![
        ("zero length", vec![0, 0, 0, 0], "length"),
        ("length above 65536", 65537u32.to_le_bytes().to_vec(), "length"),
        ("not JSON", [&5u32.to_le_bytes()[..], b"hello"].concat(), "json"),
        ("invalid UTF-8", [&2u32.to_le_bytes()[..], b"\"\xff"].concat(), "json"),
        ("an array", [&2u32.to_le_bytes()[..], b"[]"].concat(), "not_object"),
        ("no type", [&2u32.to_le_bytes()[..], b"{}"].concat(), "no_type"),
        (
            "type not a string",
            [&10u32.to_le_bytes()[..], br#"{"type":1}"#].concat(),
            "no_type",
        ),
    ];
    let mut out = Vec::new();
    for (name, frame, reason) in bad {
        let err = check_length(frame[..4].try_into().unwrap())
            .err()
            .or_else(|| decode_frame(&frame[4..]).err());
        let got = match err {
            Some(ringfeed_format::control::FrameError::Length(_)) => "length",
            Some(ringfeed_format::control::FrameError::Json(_)) => "json",
            Some(ringfeed_format::control::FrameError::NotObject(_)) => "not_object",
            Some(ringfeed_format::control::FrameError::NoType) => "no_type",
            None => "accepted",
        };
        assert_eq!(got, reason, "{name}");
        out.push(json!({"name": name, "frame": hex(&frame), "reason": reason}));
    }
    pinned(
        &vectors().join("control/bad_frames.json"),
        (serde_json::to_string_pretty(&out).unwrap() + "\n").as_bytes(),
    );
}

#[test]
fn ring_layout() {
    let fields = [
        FieldSpec {
            name: "image".into(),
            dtype: DType::U8,
            shape: vec![4, 6, 3],
        },
        FieldSpec {
            name: "label".into(),
            dtype: DType::I64,
            shape: vec![],
        },
        FieldSpec {
            name: "index".into(),
            dtype: DType::I64,
            shape: vec![],
        },
    ];
    let layout = RingLayout::new(&fields, 2, 3).unwrap();
    let header = layout.header.encode();
    assert_eq!(SegmentHeader::decode(&header).unwrap(), layout.header);
    let slot = SlotHeader {
        seq: 5,
        run: 2,
        epoch: 1,
        batch: 3,
        count: 2,
        skipped: 0,
        ..Default::default()
    };
    // 1.10: a batch of an aspect-bucketed stream carries its image size in bytes 32..40.
    let bucket = SlotHeader {
        seq: 7,
        run: 2,
        epoch: 1,
        batch: 5,
        count: 2,
        skipped: 0,
        height: 768,
        width: 1344,
    };
    // A batch whose every sample was skipped is announced with count 0 (ring.md, "Slot header").
    let all_skipped = SlotHeader {
        seq: 6,
        run: 2,
        epoch: 1,
        batch: 4,
        count: 0,
        skipped: 2,
        ..Default::default()
    };
    let h = &layout.header;
    let expected = json!({
        "description": "ring segment header page and one slot header, written by crates/ringfeed/tests/it/wire_vectors.rs",
        "segment": {
            "major": 1, "minor": h.minor, "header_len": 4096, "slot_count": h.slot_count, "batch_size": h.batch_size,
            "slot_stride": h.slot_stride, "segment_len": h.segment_len,
            "fields": h.fields.iter().map(|f| json!({
                "name": f.name, "dtype": f.dtype.code(), "shape": f.shape, "offset": f.offset, "sample_bytes": f.sample_bytes,
            })).collect::<Vec<_>>(),
        },
        "slot": {"seq": slot.seq, "run": slot.run, "epoch": slot.epoch, "batch": slot.batch, "count": slot.count, "skipped": slot.skipped, "height": 0, "width": 0},
        "slot_all_skipped": {"seq": all_skipped.seq, "run": all_skipped.run, "epoch": all_skipped.epoch, "batch": all_skipped.batch, "count": 0, "skipped": all_skipped.skipped, "height": 0, "width": 0},
        "slot_bucket": {"seq": bucket.seq, "run": bucket.run, "epoch": bucket.epoch, "batch": bucket.batch, "count": bucket.count, "skipped": 0, "height": bucket.height, "width": bucket.width},
        "slot_offsets": (0..h.slot_count).map(|s| layout.slot_offset(s)).collect::<Vec<_>>(),
    });
    pinned(&vectors().join("ring/segment.bin"), &header);
    pinned(&vectors().join("ring/slot.bin"), &slot.encode());
    pinned(&vectors().join("ring/slot-all-skipped.bin"), &all_skipped.encode());
    pinned(&vectors().join("ring/slot-bucket.bin"), &bucket.encode());
    pinned(
        &vectors().join("ring/expected.json"),
        (serde_json::to_string_pretty(&expected).unwrap() + "\n").as_bytes(),
    );
    assert_eq!(
        SlotHeader::decode(&fs::read(vectors().join("ring/slot.bin")).unwrap()).unwrap(),
        slot
    );
    assert_eq!(
        SlotHeader::decode(&fs::read(vectors().join("ring/slot-all-skipped.bin")).unwrap()).unwrap(),
        all_skipped
    );
    assert_eq!(
        SlotHeader::decode(&fs::read(vectors().join("ring/slot-bucket.bin")).unwrap()).unwrap(),
        bucket
    );
}

#[test]
fn protocol_version_is_the_specs() {
    let spec = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto/control.md")).unwrap();
    let title = spec.lines().next().unwrap();
    let version = title.rsplit("version ").next().unwrap();
    let (major, minor) = version.split_once('.').unwrap();
    assert_eq!(
        ringfeed_format::control::PROTOCOL,
        (major.parse().unwrap(), minor.parse().unwrap()),
        "{title}"
    );
}

/// `proto/vectors/control/hybrid.json` (control.md, "Hybrid decode"; ring.md, `gpu_job`): which
/// batch positions a share offers, and `gpu_job` records with their members by name, which the
/// Python client reads with its own column table.
#[test]
fn hybrid_vectors() {
    use ringfeed_decode::{Chroma, Rect};
    use ringfeed_ops::gpu::{GpuJob, RECORD_LEN, chroma_code, flags, offered};

    let mut cases = Vec::new();
    for (share, batch) in [
        (0.0, 8u32),
        (0.5, 8),
        (0.25, 10),
        (1.0 / 3.0, 9),
        (0.9, 12),
        (1.0, 5),
        (0.125, 64),
    ] {
        let positions: Vec<u32> = (0..batch).filter(|&p| offered(p, share)).collect();
        assert_eq!(positions.len() as f64, (f64::from(batch) * share).floor());
        cases.push(json!({"share": share, "batch": batch, "positions": positions}));
    }
    let names = [
        "offset",
        "length",
        "src_width",
        "src_height",
        "pre_left",
        "pre_top",
        "pre_width",
        "pre_height",
        "resize_width",
        "resize_height",
        "win_left",
        "win_top",
        "valid_left",
        "valid_top",
        "valid_width",
        "valid_height",
        "flags",
        "fill",
    ];
    assert_eq!(names.len(), RECORD_LEN);
    let jobs = [
        // RandomResizedCrop(224) + a drawn horizontal flip on a 500x375 photo.
        (
            GpuJob {
                src: (500, 375),
                pre: Rect {
                    left: 37,
                    top: 12,
                    width: 301,
                    height: 280,
                },
                resize: (224, 224),
                win: (0, 0),
                valid: (0, 0, 224, 224),
                flags: flags::FLIP_X | (1 << flags::INTERPOLATION_SHIFT) | flags::ANTIALIAS,
                fill: [0, 0, 0],
                chroma: Chroma::Half,
            },
            (1_048_576, 110_233),
        ),
        // CenterCrop(80) of a 60x50 image, padded with a fill, no resize, flipped top to bottom.
        (
            GpuJob {
                src: (60, 50),
                pre: Rect {
                    left: 0,
                    top: 0,
                    width: 60,
                    height: 50,
                },
                resize: (0, 0),
                win: (-10, -15),
                valid: (0, 0, 60, 50),
                flags: flags::FLIP_Y,
                fill: [124, 116, 104],
                chroma: Chroma::HalfWidth,
            },
            (0, 4_017),
        ),
    ];
    let records: Vec<Value> = jobs
        .iter()
        .map(|(job, (offset, len))| {
            let r = job.record(*offset, *len);
            let fields: serde_json::Map<String, Value> =
                names.iter().zip(r).map(|(n, v)| ((*n).to_owned(), json!(v))).collect();
            json!({"record": r.to_vec(), "fields": fields})
        })
        .collect();
    // 1.11: the same two jobs as pixel samples (control.md, "Decoded pixels (1.11)"): their
    // decoded rectangles' records, with the rectangle (`r`, in the source) and the record
    // before the move, so the client checks its reading of bit 8 and of the moved coordinates.
    let rects = [
        Rect {
            left: 32,
            top: 8,
            width: 310,
            height: 288,
        },
        Rect {
            left: 0,
            top: 0,
            width: 60,
            height: 50,
        },
    ];
    let pixel_records: Vec<Value> = jobs
        .iter()
        .zip(rects)
        .map(|((job, (offset, _)), rect)| {
            let r = job.pixel_record(*offset, rect);
            let fields: serde_json::Map<String, Value> =
                names.iter().zip(r).map(|(n, v)| ((*n).to_owned(), json!(v))).collect();
            json!({"rect": [rect.left, rect.top, rect.width, rect.height], "source_record": job.record(*offset, 0).to_vec(),
                "record": r.to_vec(), "fields": fields, "pixels_bit": flags::PIXELS})
        })
        .collect();
    // Every chroma code of `gpu_job[16]` bits 5-7 (1.4), by the name ring.md gives it: the client
    // reads them with its own table.
    let chroma: Vec<Value> = [
        (Chroma::Gray, "grey"),
        (Chroma::Full, "4:4:4"),
        (Chroma::HalfWidth, "4:2:2"),
        (Chroma::Half, "4:2:0"),
        (Chroma::HalfHeight, "4:4:0"),
        (Chroma::Other, "other"),
    ]
    .into_iter()
    .map(|(c, name)| json!({"name": name, "code": chroma_code(c), "flags_bits": chroma_code(c) << flags::CHROMA_SHIFT}))
    .collect();
    // Which pipelines the GPU can finish (`gpu::finishable`): the client decides `gpu_decode="auto"`
    // from the same rule before it asks (loader.py, `_gpu_pipeline_problem`), and its tests read
    // these verdicts.
    let pipelines = [
        json!({"views": [{"ops": [{"op": "random_resized_crop", "size": [224]}, {"op": "horizontal_flip"},
            {"op": "normalize", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}]}]}),
        json!({"views": [{"ops": [{"op": "resize", "size": [256]}, {"op": "center_crop", "size": [224]}]}]}),
        json!({"views": [{"ops": [{"op": "random_crop", "size": [32], "padding": [4]}, {"op": "horizontal_flip"}]}]}),
        json!({"views": [{"ops": [{"op": "resize", "size": [64, 48]}, {"op": "vertical_flip", "p": 0.3}]}]}),
        json!({"views": [{"ops": [{"op": "random_resized_crop", "size": [224]}, {"op": "horizontal_flip"},
            {"op": "random_erasing", "p": 0.25}]}]}),
        json!({"views": [{"ops": [{"op": "random_resized_crop", "size": [224]}, {"op": "color_jitter", "brightness": [0.6, 1.4]}]}]}),
        json!({"views": [{"ops": [{"op": "random_resized_crop", "size": [224]}, {"op": "trivial_augment_wide"}]}]}),
        json!({"views": [{"ops": [{"op": "resize", "size": [256]}, {"op": "random_resized_crop", "size": [224]}]}]}),
        json!({"views": [{"ops": [{"op": "random_resized_crop", "size": [224]}, {"op": "horizontal_flip"},
            {"op": "rand_augment", "num_ops": 2, "magnitude": 9}, {"op": "random_erasing", "p": 0.25}]}]}),
        json!({"views": [{"ops": [{"op": "random_resized_crop", "size": [224]}, {"op": "auto_augment"},
            {"op": "random_apply", "p": 0.8, "ops": [{"op": "color_jitter", "brightness": [0.6, 1.4],
            "contrast": [0.6, 1.4], "saturation": [0.6, 1.4], "hue": [-0.1, 0.1]}]},
            {"op": "grayscale", "p": 0.2}, {"op": "gaussian_blur", "kernel_size": [23], "sigma": [0.1, 2.0]}]}]}),
        json!({"views": [{"ops": [{"op": "random_resized_crop", "size": [224]}, {"op": "invert"},
            {"op": "center_crop", "size": [200]}]}]}),
        json!({"views": [{"ops": [{"op": "random_resized_crop", "size": [224]},
            {"op": "random_apply", "p": 0.5, "ops": [{"op": "random_crop", "size": [224], "padding": [4]}]}]}]}),
        json!({"views": [{"count": 2, "ops": [{"op": "random_resized_crop", "size": [96]}]}]}),
        json!({"views": [{"name": "global", "ops": [{"op": "random_resized_crop", "size": [224]}]},
            {"name": "local", "ops": [{"op": "random_resized_crop", "size": [96]}]}]}),
        // DINO-like (1.10): two global crops with colour ops, several local ones.
        json!({"views": [{"name": "global", "count": 2, "ops": [{"op": "random_resized_crop", "size": [224], "scale": [0.32, 1.0]},
            {"op": "horizontal_flip"}, {"op": "random_apply", "p": 0.8, "ops": [{"op": "color_jitter",
            "brightness": [0.6, 1.4], "contrast": [0.6, 1.4], "saturation": [0.8, 1.2], "hue": [-0.1, 0.1]}]},
            {"op": "grayscale", "p": 0.2}, {"op": "gaussian_blur", "kernel_size": [23], "sigma": [0.1, 2.0]},
            {"op": "normalize", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}]},
            {"name": "local", "count": 6, "ops": [{"op": "random_resized_crop", "size": [96], "scale": [0.05, 0.32]},
            {"op": "horizontal_flip"}, {"op": "solarize", "threshold": 128, "p": 0.2}]}]}),
        // A second view whose tail changes the size: named by its view and op.
        json!({"views": [{"name": "global", "ops": [{"op": "random_resized_crop", "size": [224]}]},
            {"name": "local", "ops": [{"op": "random_resized_crop", "size": [96]}, {"op": "invert"},
            {"op": "center_crop", "size": [64]}]}]}),
        // Aspect buckets (1.10): the bucket's covering resize and crop are the prefix.
        json!({"views": [{"ops": [{"op": "aspect_buckets", "area": 65536, "step": 64}, {"op": "horizontal_flip"},
            {"op": "color_jitter", "brightness": [0.6, 1.4]}]}]}),
    ];
    let finishable: Vec<Value> = pipelines
        .into_iter()
        .map(|p| {
            // `finishable`: a 1.10 session's verdict (every view and image; per-image ops after
            // the geometry, with the `gpu_ops` field's steps per output, 0: no field);
            // `finishable_1_9`: 1.8 and 1.9 (one view of one image); `finishable_1_7`: before 1.8.
            let pipeline = ringfeed_ops::Pipeline::parse(&p).unwrap();
            let now = ringfeed_ops::gpu::finishable(&pipeline, 10);
            let one_view = ringfeed_ops::gpu::finishable(&pipeline, 9);
            let before = ringfeed_ops::gpu::finishable(&pipeline, 7);
            json!({"pipeline": p, "finishable": now.is_ok(), "steps": now.unwrap_or(0),
                "finishable_1_9": one_view.is_ok(), "finishable_1_7": before.is_ok()})
        })
        .collect();
    let doc = json!({
        "description": "hybrid decode (control.md, \"Hybrid decode\"; ring.md, gpu_job), written by crates/ringfeed/tests/it/wire_vectors.rs",
        "offered": cases,
        "records": records,
        "pixel_records": pixel_records,
        "chroma": chroma,
        "finishable": finishable,
    });
    let mut text = serde_json::to_string_pretty(&doc).unwrap();
    text.push('\n');
    pinned(&vectors().join("control/hybrid.json"), text.as_bytes());
}

/// `proto/vectors/control/dataset_id.json` (control.md, "Dataset identity"): descriptions and the
/// `ring.dataset_id` each gives, which the Python tests recompute with their own FNV-1a.
#[test]
fn dataset_id_vectors() {
    use ringfeed_format::control::DatasetId;
    let image = |len: u64, classes: &[&str], shards: Option<&[u64]>| {
        let classes: Vec<Vec<u8>> = classes.iter().map(|c| c.as_bytes().to_vec()).collect();
        let mut id = DatasetId::new();
        id.samples(len, &classes, shards);
        id.hex()
    };
    let mut cases = vec![
        json!({"name": "no samples", "len": 0, "classes": [], "shards": null, "id": image(0, &[], None)}),
        json!({"name": "integer labels, no shard files", "len": 1000, "classes": [], "shards": null,
            "id": image(1000, &[], None)}),
        json!({"name": "classes and shards", "len": 10, "classes": ["cat", "dog"], "shards": [4, 6],
            "id": image(10, &["cat", "dog"], Some(&[4, 6]))}),
        json!({"name": "the same with its shards cut otherwise", "len": 10, "classes": ["cat", "dog"],
            "shards": [5, 5], "id": image(10, &["cat", "dog"], Some(&[5, 5]))}),
        json!({"name": "non-ASCII class", "len": 3, "classes": ["caf\u{e9}"], "shards": [3],
            "id": image(3, &["caf\u{e9}"], Some(&[3]))}),
    ];
    // A token stream of two datasets: (tokens, documents, windows, weight) each, seq_len 128, pack.
    let mut id = DatasetId::new();
    id.samples(300, &[], None).u32(128).u8(1).u32(2);
    for (tokens, docs, windows, weight) in [(20000u64, 310u64, 200u64, 699051u64), (9000, 120, 100, 349525)] {
        id.u64(tokens).u64(docs).u64(windows).u64(weight);
    }
    cases.push(
        json!({"name": "a token mix of two", "len": 300, "classes": [], "shards": null,
        "tokens": {"seq_len": 128, "mode": 1, "parts": [[20000, 310, 200, 699051], [9000, 120, 100, 349525]]},
        "id": id.hex()}),
    );
    let ids: Vec<&str> = cases.iter().map(|c| c["id"].as_str().unwrap()).collect();
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "every case has its own id: {ids:?}");
    let doc = json!({
        "description": "ring.dataset_id (control.md, \"Dataset identity\"): FNV-1a 64 of the description, written by crates/ringfeed/tests/it/wire_vectors.rs",
        "cases": cases,
    });
    pinned(
        &vectors().join("control/dataset_id.json"),
        (serde_json::to_string_pretty(&doc).unwrap() + "\n").as_bytes(),
    );
}

/// `proto/vectors/ring/gpu_ops.json` (ring.md, "`gpu_ops`", control 1.8): one step of each kind
/// on a 32x24 image, as its 16 int32 and as the kind, argument and parameters they mean. The
/// Python side decodes the records with its own reader and compares.
#[test]
fn gpu_ops_vectors() {
    use ringfeed_format::ring::gpu_ops::Kind;
    use ringfeed_ops::spec::Interpolation;
    use ringfeed_ops::steps::{Remap, Step};
    let size = (32u32, 24u32);
    let shear = [1.0, -0.3, 3.6, 0.0, 1.0, 0.0];
    let steps = [
        Step::Remap(Remap::FlipX),
        Step::Remap(Remap::FlipY),
        Step::Remap(Remap::Rot180),
        Step::Brightness(1.286),
        Step::Contrast(0.61),
        Step::Saturation(1.9),
        Step::Hue(-0.05),
        Step::Grayscale,
        Step::Solarize(128.0),
        Step::Posterize(3),
        Step::Invert,
        Step::Autocontrast,
        Step::Equalize,
        Step::Sharpness(1.45),
        Step::Blur {
            kernel: (5, 7),
            sigma: 1.3,
        },
        Step::Affine {
            matrix: shear,
            interp: Interpolation::Nearest,
            fill: None,
        },
        Step::Affine {
            matrix: shear,
            interp: Interpolation::Bilinear,
            fill: Some([128.0, 64.5, 0.0]),
        },
    ];
    let mut seen = std::collections::BTreeSet::new();
    let cases: Vec<Value> = steps
        .iter()
        .map(|s| {
            let r = s.record(size);
            seen.insert(r.kind.code());
            json!({
                "step": format!("{s:?}"),
                "record": r.to_ints().to_vec(),
                "kind": r.kind.name(),
                "code": r.kind.code(),
                "arg": r.arg,
                // As f64 (exact for f32): what the bit patterns mean.
                "params": r.params.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
            })
        })
        .collect();
    assert_eq!(seen.len(), Kind::ALL.len(), "every kind has a vector");
    let kinds: Vec<Value> = Kind::ALL
        .iter()
        .map(|k| json!({"code": k.code(), "name": k.name()}))
        .collect();
    let doc = json!({
        "description": "gpu_ops records (ring.md, \"gpu_ops\", control 1.8) of steps on a 32x24 image, written by crates/ringfeed/tests/it/wire_vectors.rs",
        "size": [size.0, size.1],
        "record_ints": ringfeed_format::ring::gpu_ops::RECORD_INTS,
        "max_steps": ringfeed_format::ring::gpu_ops::MAX_STEPS,
        "kinds": kinds,
        "steps": cases,
    });
    let mut text = serde_json::to_string_pretty(&doc).unwrap();
    text.push('\n');
    pinned(&vectors().join("ring/gpu_ops.json"), text.as_bytes());
}
