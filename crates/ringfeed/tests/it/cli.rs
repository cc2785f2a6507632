//! The `ringfeed` binary: exit codes and the exact error messages a user sees.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use crate::support::{bin, jpeg, small_options, small_specs, write_dataset, write_tree};

fn run(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .env("RINGFEED_LOG", "off")
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn pack_missing_source() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("nope");
    let o = run(&["pack", p(&src), p(&tmp.path().join("out")), "--progress", "none"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        format!("error: {}: no such file or directory\n", src.display())
    );
}

#[test]
fn pack_existing_output() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &[("a/1.jpg", jpeg(8, 8, 1))]);
    let out = tmp.path().join("out");
    fs::create_dir(&out).unwrap();
    let o = run(&["pack", p(&src), p(&out), "--progress", "none"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        format!(
            "error: {} already exists; pass --force to replace it, or choose another output directory\n",
            out.display()
        )
    );
}

#[test]
fn pack_bad_file_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &[("a/1.jpg", jpeg(8, 8, 1)), ("a/2.jpg", Vec::new())]);
    let out = tmp.path().join("out");
    let o = run(&["pack", p(&src), p(&out), "--progress", "none"]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.starts_with("error: a/2.jpg: "), "{e}");
    assert!(
        e.ends_with("(pass `--on-error skip` to leave such files out and list them in a report)\n"),
        "{e}"
    );
    assert!(!out.exists());
}

/// `--on-error` takes the words of Python's `on_error=`: `raise` (the default) stops at a bad
/// file; the old `fail` still does, with a note on stderr naming `raise`; other words are refused,
/// listing `raise` and `skip` only.
#[test]
fn pack_on_error_takes_pythons_words() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &[("a/1.jpg", jpeg(8, 8, 1)), ("a/2.jpg", Vec::new())]);
    for word in ["raise", "fail"] {
        let out = tmp.path().join(word);
        let o = run(&["pack", p(&src), p(&out), "--on-error", word, "--progress", "none"]);
        assert_eq!(o.status.code(), Some(1));
        let e = stderr(&o);
        assert!(e.contains("error: a/2.jpg: "), "{e}");
        let note = "ringfeed: --on-error fail is deprecated: use --on-error raise";
        assert_eq!(e.contains(note), word == "fail", "{e}");
        assert!(!out.exists());
    }
    let o = run(&["pack", p(&src), p(&tmp.path().join("x")), "--on-error", "ignore"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("[possible values: raise, skip]"), "{e}");
}

#[test]
fn pack_summary_and_skip_report() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(
        &src,
        &[
            ("a/1.jpg", jpeg(8, 8, 1)),
            ("a/2.jpg", Vec::new()),
            ("b/3.jpg", jpeg(8, 8, 3)),
        ],
    );
    let out = tmp.path().join("out");
    let summary = tmp.path().join("summary.json");
    let o = run(&[
        "pack",
        p(&src),
        p(&out),
        "--on-error",
        "skip",
        "--progress",
        "none",
        "--summary-json",
        p(&summary),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.starts_with(&format!(
            "packed 2 samples from {} (imagefolder) into {}: 1 shard, 2 classes",
            src.display(),
            out.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("skipped 1 (listed in {})", out.join("skipped.tsv").display())),
        "{stdout}"
    );
    let j: serde_json::Value = serde_json::from_str(&fs::read_to_string(summary).unwrap()).unwrap();
    assert_eq!(
        (j["samples"].as_u64(), j["skipped"].as_u64(), j["classes"].as_u64()),
        (Some(2), Some(1), Some(2))
    );
}

#[test]
fn pack_bad_flags() {
    let o = run(&["pack", "a", "b", "--shard-size", "12parsecs"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("invalid size unit \"parsecs\""), "{}", stderr(&o));
    let o = run(&["pack", "a", "b", "--align", "3"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "error: --align 3 must be a power of two between 8 and 1048576\n"
    );
    let o = run(&["pack", "a", "b", "--quality", "90"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "--quality without --reencode is a usage error"
    );
}

#[test]
fn verify_not_a_dataset() {
    let tmp = tempfile::tempdir().unwrap();
    let o = run(&["verify", p(tmp.path()), "--progress", "none"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        format!(
            "error: verify failed (io): {0} is not a packed ringfeed dataset: it has no index.rfi (if it \
             holds images, pack them with `ringfeed pack {0} {0}.rf` and open {0}.rf)\n",
            tmp.path().display()
        )
    );
    let missing = tmp.path().join("missing");
    let o = run(&["inspect", p(&missing)]);
    assert_eq!(
        stderr(&o),
        format!("error: no dataset at {}: no such directory\n", missing.display())
    );
}

#[test]
fn verify_reports_file_and_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ds");
    let (samples, classes) = small_specs();
    write_dataset(&dir, &samples, &classes, small_options());
    let o = run(&["verify", p(&dir), "--progress", "none"]);
    assert!(o.status.success());
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "ok: 7 samples in 2 shards, 3 classes, 0.0 MB checked\n"
    );
    let shard = dir.join("shard-000000.rfs");
    let mut b = fs::read(&shard).unwrap();
    b[64] ^= 0x20; // first byte of record 0
    fs::write(&shard, &b).unwrap();
    let o = run(&["verify", p(&dir), "--progress", "none"]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.starts_with(&format!(
            "error: verify failed (checksum): {} at byte 64: record 0 checksum mismatch: stored 0x",
            shard.display()
        )),
        "{e}"
    );
}

#[test]
fn inspect_prints_counts_and_a_sample() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &[("ant/1.jpg", jpeg(40, 30, 1)), ("bee/2.jpg", jpeg(8, 8, 2))]);
    let out = tmp.path().join("out");
    assert!(run(&["pack", p(&src), p(&out), "--progress", "none"]).status.success());
    let o = run(&["inspect", p(&out), "--sample", "0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    for needle in [
        "samples:  2",
        "classes:  2",
        "ant  1",
        "key:   ant/1.jpg",
        "label: 0 (ant)",
        "image: jpeg 40x30",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    let o = run(&["inspect", p(&out), "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["samples"], 2);
    assert_eq!(j["formats"]["jpeg"], 2);
    let o = run(&["inspect", p(&out), "--sample", "5"]);
    assert_eq!(
        stderr(&o),
        "error: sample 5 is out of range: the dataset has 2 samples\n"
    );
}

/// SIGINT mid-pack: exit status 130, no output, no temporary directory.
#[test]
fn interrupted_pack_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let img = jpeg(512, 512, 1);
    let files: Vec<(String, Vec<u8>)> = (0..3000).map(|i| (format!("a/{i:05}.jpg"), img.clone())).collect();
    let refs: Vec<(&str, Vec<u8>)> = files.iter().map(|(p, d)| (p.as_str(), d.clone())).collect();
    write_tree(&src, &refs);
    let out = tmp.path().join("out");
    let child = Command::new(bin())
        .args(["pack", p(&src), p(&out), "--threads", "1", "--progress", "none"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(400));
    // The `kill` utility sends the signal, so the test needs no unsafe libc call.
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(130),
        "pack finished before the signal? {}",
        stderr(&o)
    );
    assert_eq!(stderr(&o), "ringfeed: pack interrupted; no output was written\n");
    let left: Vec<_> = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["src"]);
}

#[test]
fn pack_output_parent_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_tree(&src, &[("a/1.jpg", jpeg(8, 8, 1))]);
    let out = tmp.path().join("no/such/dir/out");
    let o = run(&["pack", p(&src), p(&out), "--progress", "none"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        format!(
            "error: {}: the output's parent directory {} does not exist\n",
            out.display(),
            out.parent().unwrap().display()
        )
    );
}
