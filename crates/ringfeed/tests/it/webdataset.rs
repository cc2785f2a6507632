//! WebDataset tars served in place by the real server (control.md, "WebDataset shards"): the
//! image folder's samples, labels and pixels from tars in WebDataset's layout, `ringfeed index`,
//! the `shard_blocks` order with one shard per tar, and damaged tars under `on_error`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::serve::{Batch, Server, open_msg};
use crate::support::{bin, jpeg, png, write_tree};

/// A ustar archive of `members` (names under 100 bytes), ending with two zero blocks.
pub(crate) fn tar(members: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in members {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..107].copy_from_slice(b"0000644");
        h[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
        h[136..147].copy_from_slice(b"14000000000");
        h[156] = b'0';
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].fill(b' ');
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// 18 images in 3 classes as an image folder, and as 3 tars holding them in the folder's order
/// (`KEY.jpg`/`KEY.png` + `KEY.cls`, plus a `KEY.txt` the server ignores).
fn corpus(root: &Path) -> (PathBuf, PathBuf) {
    let mut files: Vec<(String, Vec<u8>, usize)> = Vec::new();
    for c in 0..3usize {
        for j in 0..6usize {
            let (ext, data) = if j == 4 {
                ("png", png(30 + j as u32, 26, (c * 10 + j) as u64))
            } else {
                ("jpg", jpeg(32 + 3 * j, 28 + c, (c * 10 + j) as u64))
            };
            files.push((format!("c{c}/{j:02}.{ext}"), data, c));
        }
    }
    let folder = root.join("folder");
    let refs: Vec<(&str, Vec<u8>)> = files.iter().map(|(p, d, _)| (p.as_str(), d.clone())).collect();
    write_tree(&folder, &refs);
    let tars = root.join("tars");
    std::fs::create_dir_all(&tars).unwrap();
    for (s, chunk) in files.chunks(6).enumerate() {
        let mut members = Vec::new();
        for (path, data, class) in chunk {
            let key = path.rsplit_once('.').unwrap().0;
            members.push((format!("{key}.txt"), b"a caption".to_vec()));
            members.push((path.clone(), data.clone()));
            members.push((format!("{key}.cls"), format!("{class}").into_bytes()));
        }
        std::fs::write(tars.join(format!("s-{s}.tar")), tar(&members)).unwrap();
    }
    (folder, tars)
}

fn epochs(server: &Server, ds: &str, extra: Value) -> (Value, Vec<Vec<Batch>>) {
    let mut c = server.client();
    let mut m = open_msg(Path::new(ds), extra);
    m["dataset"] = json!(ds);
    let ring = c.open(m);
    assert_eq!(ring["type"], "ring", "{ds}: {ring}");
    let batches = (0..2)
        .map(|e| {
            let (b, end) = c.epoch(e, 0);
            assert_eq!(end["type"], "end", "{end}");
            b
        })
        .collect();
    (ring, batches)
}

#[test]
fn tars_serve_what_the_image_folder_serves_and_are_one_shard_each() {
    let tmp = tempfile::tempdir().unwrap();
    let (folder, tars) = corpus(tmp.path());
    let server = Server::start(tmp.path(), 2);
    let (_, want) = epochs(&server, folder.to_str().unwrap(), json!({}));
    let (ring, got) = epochs(&server, tars.to_str().unwrap(), json!({}));
    assert_eq!(
        (&ring["dataset_len"], &ring["classes"], &ring["order"]),
        (&json!(18), &json!([]), &json!("global"))
    );
    assert_eq!(got, want, "same indices, labels and pixels as the folder in place");
    let pattern = format!("{}/s-{{0..2}}.tar", tars.display());
    assert_eq!(epochs(&server, &pattern, json!({})).1, want);
    assert!(
        tars.join("s-1.tar.rfidx").is_file(),
        "the first open writes index files"
    );

    // shard_blocks with blocks of one tar: each batch of 6 comes from one tar, in shuffled order.
    let (ring, got) = epochs(
        &server,
        tars.to_str().unwrap(),
        json!({"order": "shard_blocks", "order_block": 1, "batch_size": 6}),
    );
    assert_eq!(ring["order"], "shard_blocks");
    for epoch in &got {
        let mut tars_seen: Vec<i64> = epoch.iter().map(|b| b[0].0 / 6).collect();
        for b in epoch {
            assert!(
                b.iter().all(|s| s.0 / 6 == b[0].0 / 6),
                "a batch from one tar: {:?}",
                b.iter().map(|s| s.0).collect::<Vec<_>>()
            );
        }
        tars_seen.sort_unstable();
        assert_eq!(tars_seen, [0, 1, 2]);
    }
    assert_ne!(got[0], got[1], "a new order every epoch");
}

#[test]
fn ringfeed_index_writes_index_files_and_names_damaged_tars() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, tars) = corpus(tmp.path());
    let run = |args: &[&str]| Command::new(bin()).arg("index").args(args).output().unwrap();
    let out = run(&[tars.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("18 members, index written").count(), 3, "{text}");
    let again = run(&[&format!("{}/s-*.tar", tars.display())]);
    assert_eq!(
        String::from_utf8_lossy(&again.stdout)
            .matches("index valid, kept")
            .count(),
        3
    );
    let inspect = Command::new(bin())
        .args(["inspect", tars.to_str().unwrap(), "--sample", "16"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(inspect.status.success(), "{}", String::from_utf8_lossy(&inspect.stderr));
    assert!(
        text.contains("webdataset dataset") && text.contains("samples:  18"),
        "{text}"
    );
    assert!(
        text.contains("key:   c2/04") && text.contains("label: 2") && text.contains("image: png"),
        "{text}"
    );
    // Cut the last tar inside its third member.
    let t = tars.join("s-2.tar");
    let bytes = std::fs::read(&t).unwrap();
    std::fs::write(&t, &bytes[..512 * 6 + 100]).unwrap();
    let cut = run(&[t.to_str().unwrap()]);
    assert!(!cut.status.success());
    let err = String::from_utf8_lossy(&cut.stderr);
    assert!(err.contains("s-2.tar") && err.contains("cut short"), "{err}");
}

#[test]
fn damaged_tars_and_bad_samples_follow_on_error() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let server = Server::start(root, 1);
    let d = root.join("bad");
    std::fs::create_dir_all(&d).unwrap();
    let good = |k: &str, label: &str| {
        vec![
            (format!("{k}.jpg"), jpeg(24, 20, 1)),
            (format!("{k}.cls"), label.as_bytes().to_vec()),
        ]
    };
    let mut members = good("a", "0");
    members.push(("b.cls".into(), b"1".to_vec())); // no image
    members.extend(good("c", "x7")); // not an integer
    members.extend(good("d", "3"));
    std::fs::write(d.join("t.tar"), tar(&members)).unwrap();
    std::fs::write(d.join("u.tar"), b"not a tar file, just text\n".repeat(40)).unwrap();
    let open = |on_error: &str| {
        let mut c = server.client();
        let r = c.open(open_msg(
            &d,
            json!({"on_error": on_error, "batch_size": 1, "shuffle": false}),
        ));
        (c, r)
    };
    let (_, r) = open("raise");
    assert_eq!(r["code"], "dataset", "{r}");
    let m = r["message"].as_str().unwrap();
    assert!(
        m.contains("u.tar") && m.contains("not a tar file") && m.contains("on_error=\"skip\""),
        "{m}"
    );

    let (mut c, r) = open("skip");
    assert_eq!(r["dataset_len"], 4, "{r}");
    let (batches, end) = c.epoch(0, 0);
    assert_eq!((&end["type"], &end["skipped"]), (&json!("end"), &json!(2)), "{end}");
    let labels: Vec<i64> = batches.iter().flatten().map(|s| s.1).collect();
    assert_eq!(labels, [0, 3]);

    // Without the non-tar file, `raise` opens and fails at the first bad sample, naming it.
    std::fs::remove_file(d.join("u.tar")).unwrap();
    let (mut c, r) = open("raise");
    assert_eq!(r["type"], "ring", "{r}");
    let (_, err) = c.epoch(0, 0);
    assert_eq!((&err["code"], &err["sample"]), (&json!("sample"), &json!(1)), "{err}");
    let m = err["message"].as_str().unwrap();
    assert!(
        m.contains("t.tar: sample \"b\": no image member (looked for jpg, jpeg, png, webp; it has cls)"),
        "{m}"
    );
}

fn wds_vectors() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto/vectors/webdataset")
}

/// The shared index-file vectors (`proto/vectors/webdataset/`, `proto/webdataset.md` 1.1): a tar,
/// its index as a local file (no ETag) and as an object of a store (with its ETag), and what
/// they hold. The writer must reproduce them byte for byte and the reader must read them back;
/// `client-py/tests/test_webdataset.py` reads the same files with its own parser.
/// `RINGFEED_BLESS=1` regenerates them.
#[test]
fn index_file_vectors_are_current_and_read_back() {
    use ringfeed_source::wds::{index, tar as wtar};
    let members = vec![
        ("train/0001.jpg".to_owned(), vec![0xFFu8, 0xD8, 0xFF, 0xE0, 1, 2, 3]),
        ("train/0001.cls".to_owned(), b"7".to_vec()),
        ("train/0002.seg.png".to_owned(), vec![0x89u8; 700]),
    ];
    let tar_bytes = tar(&members);
    let scan = wtar::scan(&tar_bytes, &mut |_| {});
    let stamp = index::Stamp {
        len: tar_bytes.len() as u64,
        mtime_ns: 1_700_000_000_123_456_789,
    };
    let etag = b"\"5d41402abc4b2a76b9719d911017c592\"";
    let local = index::encode(&scan, stamp);
    let stored = index::encode_with(&scan, stamp, Some(etag));
    let expected = json!({
        "tar": "v1.tar",
        "len": stamp.len,
        "mtime_ns": stamp.mtime_ns,
        "etag": String::from_utf8_lossy(etag),
        "end": "complete",
        "members": scan.members.iter().map(|m| json!({
            "name": String::from_utf8_lossy(&m.name),
            "offset": m.offset,
            "size": m.size,
        })).collect::<Vec<_>>(),
        "files": {"local": "v1-local.tar.rfidx", "store": "v1-store.tar.rfidx"},
    });
    let dir = wds_vectors();
    let files = [
        ("v1.tar", tar_bytes.clone()),
        ("v1-local.tar.rfidx", local.clone()),
        ("v1-store.tar.rfidx", stored.clone()),
        (
            "expected.json",
            (serde_json::to_string_pretty(&expected).unwrap() + "\n").into_bytes(),
        ),
    ];
    for (name, bytes) in &files {
        crate::support::pinned(&dir.join(name), bytes);
    }
    // The reader: both read back to the scan; the stored one carries its ETag.
    let l = index::parse(&local).unwrap();
    let s = index::parse(&stored).unwrap();
    assert_eq!((&l.scan, l.made, &l.etag), (&scan, stamp, &None));
    assert_eq!((&s.scan, s.made, s.etag.as_deref()), (&scan, stamp, Some(&etag[..])));
    assert_eq!(index::decode(&local, stamp, &tar_bytes).unwrap(), scan);
    assert_eq!(u16::from_le_bytes([stored[10], stored[11]]), 1, "minor version 1");
    // A 1.0 reader's rule 4 (nothing after the last member but the CRC) holds for the local one.
    let mut as_10 = local.clone();
    as_10[10] = 0;
    let n = as_10.len() - 4;
    let crc = crc32c::crc32c(&as_10[..n]).to_le_bytes();
    as_10[n..].copy_from_slice(&crc);
    assert_eq!(index::parse(&as_10).unwrap().scan, scan, "a 1.0 index is read");
}

/// 1.9: a tokenizer is a file the server reads, so `--data-root` confines it as it confines
/// datasets; inside the roots the same stream opens, with its ring fields.
#[test]
fn a_tokenizer_outside_the_data_roots_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let members = vec![
        ("k0.jpg".to_owned(), jpeg(20, 16, 1)),
        ("k0.txt".to_owned(), b"a b".to_vec()),
    ];
    std::fs::write(root.join("s.tar"), tar(&members)).unwrap();
    let tokenizer = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
        "pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
        "model":{"type":"WordLevel","vocab":{"[UNK]":0,"a":1,"b":2,"<pad>":3},"unk_token":"[UNK]"}}"#;
    let outside = tmp.path().join("tokenizer.json");
    let inside = root.join("tokenizer.json");
    std::fs::write(&outside, tokenizer).unwrap();
    std::fs::write(&inside, tokenizer).unwrap();
    let server = Server::start_args(tmp.path(), 1, &["--data-root", root.to_str().unwrap()]);
    let open = |tok: &Path| {
        let text = json!([{"name": "text", "source": "txt", "tokenizer": tok.to_str().unwrap(), "max_length": 4}]);
        server.client().open(open_msg(
            &root.join("s.tar"),
            json!({"batch_size": 1, "webdataset": {"label": ""}, "text": text}),
        ))
    };
    let r = open(&outside);
    assert_eq!(r["code"], "bad_request", "{r}");
    let msg = r["message"].as_str().unwrap();
    assert!(msg.contains("open.text \"text\"") && msg.contains("--data-root"), "{r}");
    let r = open(&inside);
    assert_eq!(r["type"], "ring", "{r}");
}
