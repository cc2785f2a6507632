//! Dataset files that change on disk after they were opened (`docs/storage-faults.md`): a cut
//! file raises SIGBUS on the mapping, which must become an error naming the file and the offset,
//! never a dead process; a same-length rewrite must fail the record CRC.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

use heed::types::Bytes;
use heed::{CommitOrAbort, EnvOpenOptions};
use ringfeed_format::shard::{Dataset, ShardError, VerifyOptions, WriterOptions, verify_dataset};
use ringfeed_source::lmdb::{Layout, LmdbOptions, LmdbSource};
use ringfeed_source::{PackedSource, Source, SourceError};
use serde_json::json;

use crate::serve::{Server, dataset, open_msg};
use crate::support::{Rng, Spec, write_dataset};

/// 12 samples of 5 pages each, 4 KiB-aligned records, 3 records per shard: 4 shards.
fn paged_dataset(dir: &Path) -> Vec<Spec> {
    let mut rng = Rng(99);
    let specs: Vec<Spec> = (0..12)
        .map(|i| Spec {
            key: format!("s{i:02}").into_bytes(),
            label: i,
            meta: Vec::new(),
            // No zero byte, so data read as zeros is told apart from the file's.
            data: rng.bytes(20_000).into_iter().map(|b| b | 1).collect(),
        })
        .collect();
    let opts = WriterOptions {
        target_shard_bytes: 3 * 20_480 + 4096 + 256,
        record_align: 4096,
    };
    write_dataset(dir, &specs, &[], opts);
    specs
}

/// Reads sample `i` through `with_sample` (as a decode thread does), returning the bytes the
/// callback saw, and the call's result.
fn read(src: &dyn Source, i: u64) -> (Vec<u8>, Result<(), SourceError>) {
    let mut seen = Vec::new();
    let r = src.with_sample(i, &mut |s| seen = s.data.to_vec());
    (seen, r)
}

/// (shard, record, offset) of sample `i`.
fn place(src: &PackedSource, i: u64) -> (u32, u32, u64) {
    let s = src.dataset().sample(i).unwrap();
    (s.shard, s.record, s.offset)
}

#[test]
fn a_shard_cut_under_an_open_source_is_an_error_naming_the_file_and_offset() {
    for check_crc in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let specs = paged_dataset(tmp.path());
        let src = PackedSource::open(tmp.path(), check_crc).unwrap();
        assert_eq!(src.dataset().shard_count(), 4);
        let shards: Vec<u32> = (0..12).map(|i| place(&src, i).0).collect();
        // Sample 4 is record 1 of shard 1; cut the shard where that record starts.
        let (shard, record, offset) = place(&src, 4);
        assert_eq!((shard, record), (1, 1));
        let shard_path = src.dataset().shard_info(1).unwrap().0.to_owned();
        OpenOptions::new()
            .write(true)
            .open(&shard_path)
            .unwrap()
            .set_len(offset)
            .unwrap();

        // The record table is at the end of the shard, so the lookup itself faults.
        let err = read(&src, 4).1.expect_err("a record past the cut must not be served");
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("{} at byte ", shard_path.display())),
            "check_crc={check_crc}: {msg}"
        );
        assert!(msg.contains("changed on disk after it was opened"), "{msg}");
        assert!(msg.contains("(truncated)") && msg.contains("sample 4"), "{msg}");
        let SourceError::Shard(e @ ShardError::Changed { offset: at, .. }) = &err else {
            panic!("expected a Changed error, got {err:?}")
        };
        assert_eq!(e.kind(), "truncated");
        assert!(*at >= offset, "fault at {at}, cut at {offset}");
        // The shard stays bad: its first record, before the cut, fails too, with the same error.
        let (_, r) = read(&src, 3);
        let msg = r.expect_err("a shard that faulted is not read again").to_string();
        assert!(msg.contains("changed on disk") && msg.contains(&shard_path.display().to_string()));

        // Every other shard still reads back exactly.
        for i in (0..12).filter(|&i| shards[i as usize] != 1) {
            let (seen, r) = read(&src, i);
            r.unwrap();
            assert_eq!(seen, specs[i as usize].data, "sample {i}");
        }
        // Opening the dataset again is refused, naming the cut shard.
        let reopened = PackedSource::open(tmp.path(), check_crc).unwrap_err().to_string();
        assert!(reopened.contains(&shard_path.display().to_string()) && reopened.contains("truncated"));
    }
}

#[test]
fn a_shard_cut_while_a_sample_is_decoded_is_an_error_not_zeros() {
    for check_crc in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let specs = paged_dataset(tmp.path());
        let src = PackedSource::open(tmp.path(), check_crc).unwrap();
        let (shard, record, offset) = place(&src, 7);
        let shard_path = src.dataset().shard_info(shard).unwrap().0.to_owned();
        let mut seen = Vec::new();
        let r = src.with_sample(7, &mut |s| {
            // The lookup (and the CRC) passed; the file is cut while the "decoder" runs.
            OpenOptions::new()
                .write(true)
                .open(&shard_path)
                .unwrap()
                .set_len(offset)
                .unwrap();
            seen = s.data.to_vec();
        });
        // The callback ran on the zeros the handler put in place of the lost pages...
        assert_eq!(seen.len(), specs[7].data.len());
        assert!(seen.iter().all(|&b| b == 0), "lost pages read as zeros");
        // ...and the call says so, naming the file, the fault's offset and the sample's record.
        let msg = r.expect_err("bytes read after a fault are not the file's").to_string();
        let end = offset + specs[7].data.len() as u64;
        assert!(
            msg.starts_with(&format!("{} at byte {offset}: ", shard_path.display()))
                && msg.contains(&format!("sample 7 (record {record}, bytes {offset}..{end})")),
            "check_crc={check_crc}: {msg}"
        );
    }
}

#[test]
fn a_record_rewritten_in_place_fails_its_crc() {
    let tmp = tempfile::tempdir().unwrap();
    let specs = paged_dataset(tmp.path());
    let checked = PackedSource::open(tmp.path(), true).unwrap();
    let unchecked = PackedSource::open(tmp.path(), false).unwrap();
    let (_, _, offset) = place(&checked, 7);
    let shard_path = checked.dataset().shard_info(place(&checked, 7).0).unwrap().0.to_owned();
    // Same length, other bytes: no SIGBUS, the mapping shows the new bytes.
    File::options()
        .write(true)
        .open(&shard_path)
        .unwrap()
        .write_at(b"rewritten", offset + 100)
        .unwrap();

    let err = read(&checked, 7).1.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!("{} at byte {offset}: ", shard_path.display())) && msg.contains("checksum mismatch"),
        "{msg}"
    );
    assert!(matches!(err, SourceError::Shard(ShardError::Checksum { .. })));
    // Without the CRC check, the rewritten bytes are served: why check_crc is on by default.
    let (seen, r) = read(&unchecked, 7);
    r.unwrap();
    assert_ne!(seen, specs[7].data);
    assert_eq!(&seen[100..109], b"rewritten");
    // Other samples are unaffected.
    for i in [0, 6, 8, 11] {
        let (seen, r) = read(&checked, i);
        r.unwrap();
        assert_eq!(seen, specs[i as usize].data);
    }
}

/// Writes an LMDB of `n` raw values of 40 KiB (overflow pages), returning them.
/// `verify` of a dataset whose shard is cut while it is open (as by a copy that is still being
/// written, or storage that went away) reports the cut file and where, instead of dying of
/// SIGBUS. (nextest runs this test in a process of its own, so nothing else installed the
/// handler first.)
#[test]
fn verify_of_a_shard_cut_while_open_names_the_file_not_a_sigbus() {
    let tmp = tempfile::tempdir().unwrap();
    paged_dataset(tmp.path());
    let ds = Dataset::open(tmp.path()).unwrap();
    let s = ds.sample(4).unwrap();
    let shard_path = ds.shard_info(s.shard).unwrap().0.to_owned();
    OpenOptions::new()
        .write(true)
        .open(&shard_path)
        .unwrap()
        .set_len(s.offset)
        .unwrap();
    let err = verify_dataset(&ds, &VerifyOptions::default()).expect_err("a cut shard does not verify");
    let msg = err.to_string();
    assert!(msg.contains(&shard_path.display().to_string()), "{msg}");
    assert!(msg.contains("changed on disk") && msg.contains("(truncated)"), "{msg}");
    assert!(msg.contains("for verification"), "{msg}");
}

fn write_lmdb(dir: &Path, n: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng(5);
    let values: Vec<Vec<u8>> = (0..n).map(|_| rng.bytes(40_000)).collect();
    let env = {
        let mut options = EnvOpenOptions::new();
        options.map_size(64 << 20);
        // SAFETY: a fresh temporary directory, written by this test only, before it is read.
        unsafe { options.open(dir) }.unwrap()
    };
    let wtxn = env.write_txn().unwrap();
    env.create_databases_and_commit(wtxn, |opener, wtxn| -> heed::Result<_> {
        let db = opener.create_database::<Bytes, Bytes>(wtxn, None)?;
        for (i, v) in values.iter().enumerate() {
            db.put(wtxn, format!("k{i:03}").as_bytes(), v)?;
        }
        Ok(CommitOrAbort::<_, ()>::Commit(()))
    })
    .unwrap();
    env.prepare_for_closing().wait();
    values
}

#[test]
fn an_lmdb_cut_under_an_open_source_is_an_error_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let values = write_lmdb(tmp.path(), 16);
    let opts = LmdbOptions {
        layout: Layout::Raw,
        ..Default::default()
    };
    let src = LmdbSource::open(tmp.path(), &opts).unwrap();
    for i in 0..16 {
        let (seen, r) = read(&src, i);
        r.unwrap();
        assert_eq!(seen, values[i as usize]);
    }
    let data = tmp.path().join("data.mdb").canonicalize().unwrap();
    let len = std::fs::metadata(&data).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&data)
        .unwrap()
        .set_len(len / 2)
        .unwrap();

    let results: Vec<String> = (0..16)
        .filter_map(|i| read(&src, i).1.err())
        .map(|e| e.to_string())
        .collect();
    // The last values written lie past the cut; once one faulted, every read fails.
    let first = results.first().expect("reading past the cut is an error");
    assert!(
        first.starts_with(&format!("lmdb {}: sample ", tmp.path().display())),
        "{first}"
    );
    assert!(
        first.contains(&format!(
            "{} changed on disk after it was opened: reading byte ",
            data.display()
        )) && first.contains("(truncated)"),
        "{first}"
    );
    let (_, r) = read(&src, 0);
    assert!(
        r.unwrap_err().to_string().contains("changed on disk"),
        "the lmdb stays bad"
    );
    // The per-thread reader path (used by `pack`) fails the same way.
    let mut reader = src.reader().unwrap();
    assert!(reader.get(1).unwrap_err().to_string().contains("changed on disk"));
}

/// Child half of `a_sigbus_outside_watched_maps_still_kills`: recovers a watched fault, then
/// touches a cut page of an unwatched map, which must kill the process with SIGBUS.
#[test]
fn sigbus_child() {
    let Ok(dir) = std::env::var("RINGFEED_TEST_SIGBUS_CHILD") else {
        return; // only meaningful when run by the test below
    };
    ringfeed_format::fault::install().unwrap();
    let path = Path::new(&dir).join("f");
    std::fs::write(&path, vec![7u8; 3 * 4096]).unwrap();
    let file = OpenOptions::new().read(true).write(true).open(&path).unwrap();
    // SAFETY: a private temporary file; this test truncates it on purpose and reads only
    // through volatile loads, after registering (or, on purpose, not registering) the map.
    let watched = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    // SAFETY: `watched` is a read-only file map, unmapped after the watch (dropped at the end).
    let watch = unsafe { ringfeed_format::fault::Watch::register(watched.as_ptr(), watched.len(), 0) };
    // SAFETY: as above.
    let unwatched = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    file.set_len(4096).unwrap();
    // SAFETY: in bounds of the map; the page is lost, the handler replaces it with zeros.
    let v = unsafe { std::ptr::read_volatile(watched.as_ptr().add(2 * 4096 + 5)) };
    assert_eq!((v, watch.fault()), (0, Some(2 * 4096 + 5)));
    eprintln!("watched fault recovered");
    // SAFETY: in bounds of the map; the page is lost and not watched: this load kills us.
    let v = unsafe { std::ptr::read_volatile(unwatched.as_ptr().add(2 * 4096)) };
    eprintln!("still alive, read {v}");
    std::process::exit(0);
}

#[test]
fn a_sigbus_outside_watched_maps_still_kills() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["storage::sigbus_child", "--exact", "--nocapture"])
        .env("RINGFEED_TEST_SIGBUS_CHILD", tmp.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("watched fault recovered"), "{stderr}");
    assert_eq!(out.status.signal(), Some(libc::SIGBUS), "{:?}: {stderr}", out.status);
}

#[test]
fn serve_reports_a_shard_cut_under_a_stream_and_keeps_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let ds = dataset(&a, 40, &[]);
    let other = dataset(&b, 24, &[]);
    let server = Server::start(tmp.path(), 2);

    let mut c = server.client();
    assert_eq!(c.open(open_msg(&ds, json!({"shuffle": false})))["type"], "ring");
    // Cut the (only) shard where sample 20's record starts, after the server mapped it.
    let packed = ringfeed_format::shard::Dataset::open(&ds).unwrap();
    let (cut_shard, cut_offset) = packed.sample(20).map(|s| (s.shard, s.offset)).unwrap();
    let shard = packed.shard_info(cut_shard).unwrap().0.to_owned();
    drop(packed);
    OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len(cut_offset)
        .unwrap();

    let (_, err) = c.epoch(0, 0);
    assert_eq!(
        (err["type"].as_str(), err["code"].as_str()),
        (Some("error"), Some("sample")),
        "{err}"
    );
    let msg = err["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!("{} at byte ", shard.display())) && msg.contains("changed on disk"),
        "{msg}"
    );
    assert!(server_alive(&server), "the server survived the SIGBUS");

    // Another client, another dataset: served in full.
    let mut d = server.client();
    assert_eq!(d.open(open_msg(&other, json!({"shuffle": false})))["type"], "ring");
    let (batches, end) = d.epoch(0, 0);
    assert_eq!(end["type"], "end", "{end}");
    assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), 24);
}

fn server_alive(server: &Server) -> bool {
    // `try_wait` needs `&mut`; the pid answers without reaping.
    Path::new(&format!("/proc/{}", server.child.id())).exists()
        && !std::fs::read_to_string(format!("/proc/{}/stat", server.child.id()))
            .unwrap_or_default()
            .contains(") Z ")
}
