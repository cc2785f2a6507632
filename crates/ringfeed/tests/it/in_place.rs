//! Image folders and manifests served in place by the real server: the same samples, labels,
//! order and pixels as the dataset `ringfeed pack` makes from them, and `pack`'s policies for bad
//! trees.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use ringfeed_pack::{OnError, PackOptions, ProgressMode, pack};
use serde_json::{Value, json};

use crate::serve::{Batch, Server, open_msg, snapshot};
use crate::support::{jpeg, png, write_tree};

fn packed(src: &Path, out: &Path, on_error: OnError) -> Result<PathBuf, ringfeed_pack::PackError> {
    let opts = PackOptions {
        progress: ProgressMode::None,
        on_error,
        ..PackOptions::default()
    };
    pack(src, out, &opts, &Arc::new(AtomicBool::new(false))).map(|_| out.to_owned())
}

/// Two epochs of `ds` (every batch), and the `ring` it was opened with.
fn two_epochs(server: &Server, ds: &Path, extra: Value) -> (Value, Vec<Vec<Batch>>) {
    let mut c = server.client();
    let ring = c.open(open_msg(ds, extra));
    assert_eq!(ring["type"], "ring", "{}: {ring}", ds.display());
    let epochs = (0..2)
        .map(|e| {
            let (batches, end) = c.epoch(e, 0);
            assert_eq!(end["type"], "end", "{}: {end}", ds.display());
            batches
        })
        .collect();
    (ring, epochs)
}

#[test]
fn an_image_folder_and_its_manifests_serve_what_the_packed_dataset_serves() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("train");
    // Classes created out of order, upper and lower case (bytewise: "B" < "a"), one nested
    // directory, a PNG, and a file that is not an image.
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for (i, class) in ["b", "a", "B", "c"].iter().enumerate() {
        for j in 0..6 {
            let name = format!("{class}/{}{j}.jpg", if j % 2 == 0 { "x" } else { "sub/y" });
            files.push((name, jpeg(48 + 7 * j, 40 + 5 * i, (i * 10 + j) as u64)));
        }
    }
    files.push(("a/z.png".into(), png(50, 44, 99)));
    files.push(("a/notes.txt".into(), b"not an image".to_vec()));
    let refs: Vec<(&str, Vec<u8>)> = files.iter().map(|(p, d)| (p.as_str(), d.clone())).collect();
    write_tree(&src, &refs);
    let ds = packed(&src, &tmp.path().join("train.rf"), OnError::Fail).unwrap();

    // Manifests listing the folder's files in the packed dataset's order, labels as class names.
    let index = ringfeed_format::shard::Dataset::open(&ds).unwrap();
    let mut csv = String::from("path,label,extra\n");
    let mut jsonl = String::new();
    for i in 0..index.len() {
        let s = index.sample(i).unwrap();
        let key = String::from_utf8(s.key.to_vec()).unwrap();
        let class = String::from_utf8(index.class_name(s.label as u32).unwrap().to_vec()).unwrap();
        csv += &format!("train/{key},{class},{i}\n");
        jsonl += &format!("{}\n", json!({"path": format!("train/{key}"), "label": class}));
    }
    std::fs::write(tmp.path().join("train.csv"), csv).unwrap();
    std::fs::write(tmp.path().join("train.jsonl"), jsonl).unwrap();

    let server = Server::start(tmp.path(), 2);
    let extra = json!({"transform": {"kind": "random_resized_crop", "size": [24, 24], "flip": 0.5}, "batch_size": 5});
    let (ring, want) = two_epochs(&server, &ds, extra.clone());
    assert_eq!(
        ring["classes"],
        json!(["B", "a", "b", "c"]),
        "torchvision's class order"
    );
    assert_eq!(ring["dataset_len"], 25);
    for input in [
        src.clone(),
        tmp.path().join("train.csv"),
        tmp.path().join("train.jsonl"),
    ] {
        let (r, got) = two_epochs(&server, &input, extra.clone());
        for m in ["classes", "dataset_len", "batches_per_epoch", "samples_per_rank"] {
            assert_eq!(r[m], ring[m], "{}: `{m}`", input.display());
        }
        assert!(
            got == want,
            "{}: indices, labels and pixels must equal the packed dataset's",
            input.display()
        );
    }
    // An evaluation transform too (whole-image decodes, not region decodes).
    let eval = json!({"transform": {"kind": "center_crop", "size": [20, 20], "resize": 24}, "shuffle": false});
    assert!(two_epochs(&server, &src, eval.clone()).1 == two_epochs(&server, &ds, eval).1);
}

#[test]
fn bad_trees_follow_packs_policies() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let server = Server::start(root, 1);
    let open = |ds: &Path, on_error: &str| {
        let mut c = server.client();
        let r = c.open(open_msg(ds, json!({"on_error": on_error, "batch_size": 1})));
        (c, r)
    };

    // An empty class: an error under `raise` (as torchvision and `pack` do); under `skip` the
    // class is kept, so labels still match torchvision's, as `pack --on-error skip` keeps it.
    let empty = root.join("empty");
    write_tree(&empty, &[("a/1.jpg", jpeg(20, 20, 1)), ("c/2.jpg", jpeg(20, 20, 2))]);
    std::fs::create_dir(empty.join("b")).unwrap();
    let (_, r) = open(&empty, "raise");
    assert_eq!(r["code"], "dataset", "{r}");
    let m = r["message"].as_str().unwrap();
    assert!(m.contains("\"b\"") && m.contains("on_error=\"skip\""), "{m}");
    assert!(packed(&empty, &root.join("empty.rf"), OnError::Fail).is_err());
    let (mut c, r) = open(&empty, "skip");
    let ds = packed(&empty, &root.join("empty.rf"), OnError::Skip).unwrap();
    let (mut p, pr) = open(&ds, "skip");
    assert_eq!((&r["classes"], &r["dataset_len"]), (&json!(["a", "b", "c"]), &json!(2)));
    assert_eq!((&r["classes"], &r["dataset_len"]), (&pr["classes"], &pr["dataset_len"]));
    assert!(c.epoch(0, 0).0 == p.epoch(0, 0).0);

    // Unreadable files (a dangling symlink, a FIFO named .jpg): per sample, through `on_error`,
    // as `pack` treats them per file (and never blocking on the FIFO).
    let unreadable = root.join("unreadable");
    write_tree(
        &unreadable,
        &[("a/1.jpg", jpeg(20, 20, 1)), ("a/4.jpg", jpeg(20, 20, 4))],
    );
    std::os::unix::fs::symlink(root.join("nowhere.jpg"), unreadable.join("a/2.jpg")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        unreadable.join("a/3.jpg"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let (c, r) = open(&unreadable, "raise");
    assert_eq!(r["dataset_len"], 4, "{r}");
    let mut c2 = server.client();
    c2.open(open_msg(
        &unreadable,
        json!({"on_error": "raise", "batch_size": 1, "shuffle": false}),
    ));
    let (batches, err) = c2.epoch(0, 0);
    assert_eq!(batches.len(), 1, "sample 0 is served, sample 1 fails");
    assert_eq!(
        (err["type"].as_str(), err["sample"].as_u64()),
        (Some("error"), Some(1)),
        "{err}"
    );
    let m = err["message"].as_str().unwrap();
    assert!(m.contains("cannot read") && m.contains("a/2.jpg"), "{m}");
    drop(c);
    let (mut c, _) = open(&unreadable, "skip");
    let (batches, end) = c.epoch(0, 0);
    assert_eq!(end["skipped"], 2, "{end}");
    let mut seen: Vec<i64> = batches.iter().flatten().map(|s| s.0).collect();
    seen.sort_unstable();
    assert_eq!(seen, [0, 3]);

    // A symlink loop: the tree cannot be listed, whatever the policy (as `pack` fails).
    let looped = root.join("looped");
    write_tree(&looped, &[("a/1.jpg", jpeg(20, 20, 1))]);
    std::os::unix::fs::symlink(looped.join("a"), looped.join("a/again")).unwrap();
    for policy in ["raise", "skip"] {
        let (_, r) = open(&looped, policy);
        assert_eq!(r["code"], "dataset", "{r}");
        assert!(r["message"].as_str().unwrap().contains("symlink loop"), "{r}");
    }
    assert!(packed(&looped, &root.join("looped.rf"), OnError::Skip).is_err());

    // A manifest listing a path twice: an error under `raise`; under `skip` the repeat is left out.
    write_tree(root, &[("m/1.jpg", jpeg(20, 20, 1)), ("m/2.jpg", jpeg(20, 20, 2))]);
    std::fs::write(root.join("m.csv"), "path,label\nm/1.jpg,0\nm/2.jpg,1\nm/1.jpg,0\n").unwrap();
    let (_, r) = open(&root.join("m.csv"), "raise");
    assert!(r["message"].as_str().unwrap().contains("line 4: duplicate path"), "{r}");
    let (_, r) = open(&root.join("m.csv"), "skip");
    assert_eq!(r["dataset_len"], 2, "{r}");

    // Neither a packed dataset, an LMDB, an image folder nor a manifest.
    let flat = root.join("flat");
    write_tree(&flat, &[("1.jpg", jpeg(20, 20, 1))]);
    std::fs::create_dir(root.join("nothing")).unwrap();
    for dir in [flat, root.join("nothing")] {
        let (_, r) = open(&dir, "raise");
        assert_eq!(r["code"], "dataset", "{r}");
        let m = r["message"].as_str().unwrap();
        assert!(
            m.contains("is neither a packed ringfeed dataset") && m.contains("no class sub-directories"),
            "{m}"
        );
    }
    std::fs::write(root.join("notes.txt"), "hi").unwrap();
    let (_, r) = open(&root.join("notes.txt"), "raise");
    assert!(r["message"].as_str().unwrap().contains("neither a manifest"), "{r}");
}

#[test]
fn a_long_listing_reports_progress_to_1_2_clients_and_holds_up_no_one() {
    let tmp = tempfile::tempdir().unwrap();
    // 40,000 manifest lines: long enough to list that a 1 ms progress interval fires.
    let mut jsonl = String::new();
    for i in 0..40_000 {
        jsonl += &format!("{{\"path\": \"img/{i:05}.jpg\", \"label\": {}}}\n", i % 10);
    }
    let manifest = tmp.path().join("big.jsonl");
    std::fs::write(&manifest, jsonl).unwrap();
    let server = Server::start_args(tmp.path(), 1, &["--open-progress", "0.001"]);

    let opener = {
        let mut c = server.client();
        let msg = open_msg(&manifest, json!({}));
        std::thread::spawn(move || {
            let r = c.open_as(2, msg);
            (c, r)
        })
    };
    // While it lists, the control plane answers: an observer gets its snapshot.
    assert!(snapshot(&server)["server"]["threads"].as_u64().is_some());
    let (_holder, (opening, ring)) = opener.join().unwrap();
    assert_eq!(ring["dataset_len"], 40_000, "{ring}");
    assert!(!opening.is_empty(), "a 1.2 client hears of the listing while it waits");
    let listed: Vec<u64> = opening.iter().map(|m| m["listed"].as_u64().unwrap()).collect();
    assert!(
        listed.windows(2).all(|w| w[0] <= w[1]),
        "progress only grows: {listed:?}"
    );
    assert!(listed.iter().all(|&n| n <= 40_000));
    for m in &opening {
        assert_eq!(m["dataset"], manifest.to_str().unwrap());
        assert!(m["elapsed_ms"].is_u64());
    }
    // A 1.0 client gets none (`Client::open` checks), and while a stream holds the listed
    // source, another open shares it.
    let mut c = server.client();
    let again = c.open(open_msg(&manifest, json!({})));
    assert_eq!(again["dataset_len"], 40_000);
}
