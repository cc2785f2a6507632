//! Remote packed datasets (`ringfeed_remote`) against real S3 servers on 127.0.0.1: `s3s-fs`
//! and `moto_server`, started here. A dataset written by the library is uploaded with
//! `remote::tools::upload`; its samples read through the cache must be the local copy's, the
//! cache must hold its bound, and a restarted cache must check what it finds.
//!
//! The servers are installed by `scripts/bootstrap`; without them these tests print why and pass,
//! except in CI (`CI=true`), where a missing server fails them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::aws::AmazonS3Builder;
use ringfeed_format::shard::WriterOptions;
use ringfeed_remote::{Counters, Hub, RemoteConfig, RemoteSource, RemoteUrl, Store};
use ringfeed_source::{PackedSource, Source};

use crate::support::{Rng, Spec, write_dataset};

pub(crate) const KEY: &str = "ringfeedtest";
pub(crate) const SECRET: &str = "ringfeedtestsecret";
pub(crate) const BUCKET: &str = "rf-it";

/// A running S3 server process.
pub(crate) struct Server {
    child: Child,
    pub(crate) port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The program's path, or `None` (and a note) when it is missing outside CI.
fn need(program: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{program} is not installed; scripts/bootstrap installs it"
        );
        eprintln!("skipped: {program} is not installed (scripts/bootstrap installs it)");
    }
    found
}

fn wait_port(port: u16, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(child.try_wait().unwrap().is_none(), "the S3 server exited");
        assert!(Instant::now() < deadline, "the S3 server did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `s3s-fs` or `moto_server`, with the bucket made.
pub(crate) fn start(kind: &str) -> Option<Server> {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut cmd = match kind {
        "s3s-fs" => {
            let exe = need("s3s-fs")?;
            std::fs::create_dir(dir.path().join(BUCKET)).unwrap();
            let mut c = Command::new(exe);
            c.args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--access-key",
                KEY,
                "--secret-key",
                SECRET,
            ])
            .arg(dir.path());
            c
        }
        _ => {
            let exe = need("moto_server")?;
            let mut c = Command::new(exe);
            c.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
            c
        }
    };
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_port(port, &mut child);
    let server = Server { child, port, _dir: dir };
    if kind == "moto" {
        // moto checks no signatures by default: a bare PUT makes the bucket.
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            s,
            "PUT /{BUCKET} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    Some(server)
}

pub(crate) fn config(cache: &Path, bytes: u64) -> RemoteConfig {
    RemoteConfig {
        cache_dir: cache.to_owned(),
        cache_bytes: bytes,
        concurrency: 3,
        concurrency_pinned: true,
        prefetch_shards: 2,
        timeout: Duration::from_secs(10),
        retries: 2,
        backoff: Duration::from_millis(50),
    }
}

pub(crate) fn store(server: &Server, config: &RemoteConfig) -> Store {
    store_counting(server, config, Arc::new(Counters::default()))
}

fn store_counting(server: &Server, config: &RemoteConfig, counters: Arc<Counters>) -> Store {
    let endpoint = format!("http://127.0.0.1:{}", server.port);
    let builder = AmazonS3Builder::new()
        .with_endpoint(&endpoint)
        .with_access_key_id(KEY)
        .with_secret_access_key(SECRET);
    Store::from_builder(builder, BUCKET, &endpoint, config, counters).unwrap()
}

/// A hub whose store for the bucket is the test server's, counting in the hub's counters.
pub(crate) fn hub(server: &Server, config: RemoteConfig) -> Hub {
    let h = Hub::new(config.clone());
    h.add_store(store_counting(server, &config, Arc::clone(&h.counters)));
    h
}

/// 60 samples of 200..1200 random bytes over about ten shards, written and uploaded.
fn dataset(server: &Server, root: &Path) -> (PathBuf, RemoteUrl) {
    let mut rng = Rng(11);
    let samples: Vec<Spec> = (0..60u64)
        .map(|i| {
            let len = 200 + (rng.next() % 1000) as usize;
            Spec {
                key: format!("c{}/{i:03}.jpg", i % 4).into_bytes(),
                label: (i % 4) as i64,
                meta: Vec::new(),
                data: rng.bytes(len),
            }
        })
        .collect();
    let classes: Vec<Vec<u8>> = (0..4).map(|c| format!("c{c}").into_bytes()).collect();
    let local = root.join("ds");
    write_dataset(
        &local,
        &samples,
        &classes,
        WriterOptions {
            target_shard_bytes: 4096,
            record_align: 64,
        },
    );
    let url = RemoteUrl::parse(&format!("s3://{BUCKET}/sets/ds")).unwrap().unwrap();
    let s = store(server, &config(&root.join("unused"), 1 << 30));
    let (files, _) = ringfeed_pack::remote::upload(&s, &local, &url).unwrap();
    assert_eq!(files, std::fs::read_dir(&local).unwrap().count());
    (local, url)
}

fn largest_shard(local: &Path) -> u64 {
    std::fs::read_dir(local)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rfs"))
        .map(|p| p.metadata().unwrap().len())
        .max()
        .unwrap()
}

fn dir_bytes(d: &Path) -> u64 {
    std::fs::read_dir(d)
        .map(|r| r.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum())
        .unwrap_or(0)
}

/// Every sample, in `order`, as (key, label, data).
fn read_all(src: &dyn Source, order: &[u64], each: &mut dyn FnMut()) -> Vec<(Vec<u8>, i64, Vec<u8>)> {
    order
        .iter()
        .map(|&i| {
            let mut got = None;
            src.with_sample(i, &mut |s| got = Some((s.key.to_vec(), s.label, s.data.to_vec())))
                .unwrap();
            each();
            got.unwrap()
        })
        .collect()
}

fn shuffled(n: u64, seed: u64) -> Vec<u64> {
    let mut rng = Rng(seed);
    let mut v: Vec<u64> = (0..n).collect();
    for i in (1..v.len()).rev() {
        v.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    v
}

#[test]
fn remote_samples_are_the_local_copys_on_both_servers() {
    for kind in ["s3s-fs", "moto"] {
        let Some(server) = start(kind) else { continue };
        let root = tempfile::tempdir().unwrap();
        let (local, url) = dataset(&server, root.path());
        let h = hub(&server, config(&root.path().join("cache"), 1 << 30));
        let remote = RemoteSource::open(&h, &url, true).unwrap();
        let packed = PackedSource::open(&local, true).unwrap();
        assert_eq!(remote.len(), packed.len());
        assert_eq!(remote.class_names(), packed.class_names());
        let order = shuffled(packed.len(), 3);
        assert_eq!(
            read_all(&remote, &order, &mut || ()),
            read_all(&packed, &order, &mut || ()),
            "{kind}"
        );
        // Per-thread readers see the same.
        let mut r = remote.reader().unwrap();
        let s = r.get(17).unwrap();
        assert_eq!(s.data, packed.dataset().sample(17).unwrap().data);
        let c = h.counters.snapshot();
        assert!(c.fetches >= 2 && c.errors == 0, "{kind}: {c:?}");
    }
}

#[test]
fn the_cache_holds_its_bound_while_every_sample_is_read() {
    let Some(server) = start("s3s-fs") else { return };
    let root = tempfile::tempdir().unwrap();
    let (local, url) = dataset(&server, root.path());
    let cache = root.path().join("cache");
    let bound = largest_shard(&local) * 5 / 2;
    let h = hub(&server, config(&cache, bound));
    let remote = RemoteSource::open(&h, &url, true).unwrap();
    let packed = PackedSource::open(&local, true).unwrap();
    let order = shuffled(packed.len(), 9);
    let mut peak = 0;
    let got = read_all(&remote, &order, &mut || peak = peak.max(dir_bytes(&cache)));
    assert_eq!(got, read_all(&packed, &order, &mut || ()));
    assert!(peak > 0 && peak <= bound, "{peak} > {bound}");
    let c = h.counters.snapshot();
    assert!(c.evictions > 0 && c.cache_bytes <= bound, "{c:?}");

    // A bound below the largest shard is refused at open, naming the setting.
    let small = Hub::new(config(&root.path().join("small"), largest_shard(&local) - 1));
    small.add_store(store(&server, &small.config));
    let err = RemoteSource::open(&small, &url, true).unwrap_err().to_string();
    assert!(err.contains("--cache-bytes") && err.contains(".rfs"), "{err}");
}

#[test]
fn a_restarted_cache_reuses_good_files_and_replaces_a_tampered_one() {
    let Some(server) = start("s3s-fs") else { return };
    let root = tempfile::tempdir().unwrap();
    let (local, url) = dataset(&server, root.path());
    let cache = root.path().join("cache");
    let packed = PackedSource::open(&local, true).unwrap();
    let order: Vec<u64> = (0..packed.len()).collect();
    let want = read_all(&packed, &order, &mut || ());
    let mut cfg = config(&cache, 1 << 30);
    cfg.prefetch_shards = 0;
    {
        let h = hub(&server, cfg.clone());
        let remote = RemoteSource::open(&h, &url, true).unwrap();
        assert_eq!(read_all(&remote, &order, &mut || ()), want);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&cache).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let n = files.len() as u64;
    assert_eq!(n, u64::from(packed.dataset().shard_count()));
    let mut bytes = std::fs::read(&files[2]).unwrap();
    bytes[100] ^= 0x80;
    std::fs::write(&files[2], &bytes).unwrap();

    let h = hub(&server, cfg);
    let remote = RemoteSource::open(&h, &url, false).unwrap();
    assert_eq!(read_all(&remote, &order, &mut || ()), want);
    let c = h.counters.snapshot();
    assert_eq!((c.reused, c.rejected), (n - 1, 1), "{c:?}");
    // The index, and the tampered shard again.
    assert_eq!(c.fetches, 2, "{c:?}");
}

/// Four WebDataset tars (5 samples each, random "images", `cls` labels) written locally and
/// uploaded under `wds/`; the second also with an index file made locally (`ringfeed index`'s
/// `write_index`), as a user would upload it, and the third with the fourth's index under its
/// name. Returns the local paths.
fn tars(server: &Server, root: &Path) -> Vec<PathBuf> {
    let dir = root.join("tars");
    std::fs::create_dir_all(&dir).unwrap();
    let mut rng = Rng(5);
    let s = store(server, &config(&root.join("unused"), 1 << 30));
    let mut paths = Vec::new();
    for t in 0..4 {
        let mut members = Vec::new();
        for j in 0..5 {
            let key = format!("k{t}{j:02}");
            let len = 300 + (rng.next() % 900) as usize;
            members.push((format!("{key}.jpg"), rng.bytes(len)));
            members.push((format!("{key}.cls"), format!("{}", (t + j) % 3).into_bytes()));
        }
        let p = dir.join(format!("s-{t}.tar"));
        std::fs::write(&p, crate::webdataset::tar(&members)).unwrap();
        s.put_file(&format!("wds/s-{t}.tar"), &p).unwrap();
        paths.push(p);
    }
    let listed = std::sync::atomic::AtomicU64::new(0);
    ringfeed_source::wds::write_index(&paths[1], &listed).unwrap();
    s.put_file("wds/s-1.tar.rfidx", &dir.join("s-1.tar.rfidx")).unwrap();
    // Another tar's index beside s-2: not its own (another length, other headers), so unused.
    ringfeed_source::wds::write_index(&paths[3], &listed).unwrap();
    s.put_file("wds/s-2.tar.rfidx", &dir.join("s-3.tar.rfidx")).unwrap();
    for t in [1, 3] {
        std::fs::remove_file(dir.join(format!("s-{t}.tar.rfidx"))).unwrap();
    }
    paths
}

fn open_wds(h: &Hub, url: &str) -> Result<ringfeed_remote::RemoteWdsSource, String> {
    let url = RemoteUrl::parse(url).unwrap().unwrap();
    let (cancel, listed) = (
        std::sync::atomic::AtomicBool::new(false),
        std::sync::atomic::AtomicU64::new(0),
    );
    ringfeed_remote::RemoteWdsSource::open(h, &url, &Default::default(), 3, &cancel, &listed).map_err(|e| e.to_string())
}

fn open_local_wds(paths: &[PathBuf]) -> ringfeed_source::wds::WdsSource {
    let (cancel, listed) = (
        std::sync::atomic::AtomicBool::new(false),
        std::sync::atomic::AtomicU64::new(0),
    );
    let opts = ringfeed_source::wds::WdsOptions {
        write_index: false,
        ..Default::default()
    };
    ringfeed_source::wds::WdsSource::open("local", paths, &opts, 2, &cancel, &listed).unwrap()
}

fn files_bytes(d: &Path) -> u64 {
    std::fs::read_dir(d)
        .map(|r| {
            r.filter_map(|e| e.ok()?.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn webdataset_tars_on_s3_serve_the_local_tars_samples_in_every_order() {
    // moto lists ETags (the cached indexes are then matched by ETag); s3s-fs does not (by the
    // headers they name, read with ranged GETs).
    for kind in ["s3s-fs", "moto"] {
        tars_on(kind);
    }
}

fn tars_on(kind: &str) {
    let Some(server) = start(kind) else { return };
    let root = tempfile::tempdir().unwrap();
    let paths = tars(&server, root.path());
    let local = open_local_wds(&paths);
    let cache = root.path().join("cache");
    let largest = paths.iter().map(|p| p.metadata().unwrap().len()).max().unwrap();
    let bound = largest * 2;
    let h = hub(&server, config(&cache, bound));
    let url = format!("s3://{BUCKET}/wds/s-{{0..3}}.tar");
    let remote = open_wds(&h, &url).unwrap();
    assert_eq!((remote.from_store, remote.scanned, remote.from_cache), (1, 3, 0));
    assert_eq!(remote.len(), 20);
    assert!(
        remote.prefers_shard_order(),
        "order=auto is shard_blocks for remote tars"
    );
    assert_eq!(remote.shard_sizes(), local.shard_sizes());
    // Orders: the tars' own, a full shuffle, and shard blocks cut into ranks.
    let blocks = ringfeed_order::blocks::ShardBlocks::new(&remote.shard_sizes().unwrap(), 2);
    let mut orders: Vec<Vec<u64>> = vec![(0..20).collect(), shuffled(20, 4)];
    for (seed, world) in [(1u64, 1usize), (2, 2), (3, 3)] {
        let perm = blocks.permutation(seed, 0);
        for rank in 0..world {
            orders.push(perm.iter().copied().skip(rank).step_by(world).collect());
        }
    }
    let mut peak = 0;
    for order in &orders {
        let got = read_all(&remote, order, &mut || peak = peak.max(files_bytes(&cache)));
        assert_eq!(got, read_all(&local, order, &mut || ()), "{order:?}");
    }
    assert!(peak > 0 && peak <= bound, "{peak} > {bound}");
    let mut r = remote.reader().unwrap();
    assert_eq!(r.get(13).unwrap().data, {
        let mut want = Vec::new();
        local.with_sample(13, &mut |s| want = s.data.to_vec()).unwrap();
        want
    });
    drop(r);

    // The next open finds every member table in the cache's index files: no tar downloaded,
    // no index fetched from the store.
    let h2 = hub(&server, config(&cache, bound));
    let again = open_wds(&h2, &format!("s3://{BUCKET}/wds/*.tar")).unwrap();
    assert_eq!((again.from_cache, again.from_store, again.scanned), (4, 0, 0));
    let c = h2.counters.snapshot();
    assert_eq!(c.fetches, 0);
    if kind == "moto" {
        assert_eq!(c.bytes, 0, "matched by the listed ETags: nothing read");
    } else {
        assert_eq!(c.bytes, 4 * 2 * 512, "two member headers per tar, by ranged GETs");
    }
    assert_eq!(
        read_all(&again, &orders[1], &mut || ()),
        read_all(&local, &orders[1], &mut || ())
    );
    // A prefix of tars (no index.rfi there) names them all, in key order.
    assert_eq!(open_wds(&h2, &format!("s3://{BUCKET}/wds")).unwrap().len(), 20);
    let err = open_wds(&h2, &format!("s3://{BUCKET}/wds/q-*.tar")).unwrap_err();
    assert!(err.contains("no .tar object matches"), "{err}");
    assert_eq!(h2.counters.snapshot().errors, 0, "probing for index.rfi is no error");

    // A tar rewritten under a running job: its next download finds another ETag than the one
    // listed at open, and its samples fail naming it (s-1 was never downloaded: its index came
    // from the store).
    let h3 = hub(&server, config(&root.path().join("cache3"), bound));
    let open3 = open_wds(&h3, &url).unwrap();
    let changed = root.path().join("changed.tar");
    let mut bytes = std::fs::read(&paths[1]).unwrap();
    let last = bytes.len() - 1100;
    bytes[last] ^= 1;
    std::fs::write(&changed, &bytes).unwrap();
    store(&server, &config(&root.path().join("unused"), 1 << 30))
        .put_file("wds/s-1.tar", &changed)
        .unwrap();
    let err = open3.with_sample(5, &mut |_| ()).unwrap_err().to_string();
    assert!(
        err.contains("wds/s-1.tar") && err.contains("changed while this server used it"),
        "{err}"
    );
}

#[test]
fn a_malformed_tar_on_s3_follows_the_corrupt_sample_policy() {
    let Some(server) = start("s3s-fs") else { return };
    let root = tempfile::tempdir().unwrap();
    let s = store(&server, &config(&root.path().join("unused"), 1 << 30));
    let good = |k: &str| {
        vec![
            (format!("{k}.jpg"), vec![1u8; 600]),
            (format!("{k}.cls"), b"2".to_vec()),
        ]
    };
    let mut members = good("a");
    members.push(("b.cls".to_owned(), b"1".to_vec())); // no image
    members.extend(good("c"));
    let t = root.path().join("t.tar");
    std::fs::write(&t, crate::webdataset::tar(&members)).unwrap();
    s.put_file("bad/t.tar", &t).unwrap();
    // A tar cut short inside its second member.
    let cut = root.path().join("u.tar");
    let whole = crate::webdataset::tar(&[good("d"), good("e")].concat());
    std::fs::write(&cut, &whole[..512 * 6 + 100]).unwrap();
    s.put_file("bad/u.tar", &cut).unwrap();

    let h = hub(&server, config(&root.path().join("cache"), 1 << 20));
    let src = open_wds(&h, &format!("s3://{BUCKET}/bad/*.tar")).unwrap();
    // The cut tar is a listing problem (a stream under on_error="raise" refuses to open).
    let problems = src.listing_problems();
    assert_eq!(problems.len(), 1);
    assert!(
        String::from_utf8_lossy(&problems[0].key).ends_with("bad/u.tar") && problems[0].reason.contains("cut short"),
        "{problems:?}"
    );
    // The key without an image fails by itself, naming the tar and the key; the others serve.
    let mut labels = Vec::new();
    let mut errors = Vec::new();
    for i in 0..src.len() {
        match src.with_sample(i, &mut |x| labels.push(x.label)) {
            Ok(()) => {}
            Err(e) => errors.push(e.to_string()),
        }
    }
    assert_eq!(labels, [2, 2, 2], "a, c and d");
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0].contains("bad/t.tar: sample \"b\": no image member"),
        "{errors:?}"
    );
    assert!(
        errors[1].contains("u.tar") && errors[1].contains("cut off"),
        "{errors:?}"
    );
}

#[test]
fn index_objects_writes_the_indexes_a_server_then_opens_from_and_binds_them_to_the_etag() {
    for kind in ["s3s-fs", "moto"] {
        index_on(kind);
    }
}

fn index_on(kind: &str) {
    use ringfeed_remote::wds::{ObjectIndexReport, index_objects};
    let Some(server) = start(kind) else { return };
    let root = tempfile::tempdir().unwrap();
    let paths = tars(&server, root.path());
    let s = store(&server, &config(&root.path().join("unused"), 1 << 30));
    let url = RemoteUrl::parse(&format!("s3://{BUCKET}/wds")).unwrap().unwrap();
    let tmp = root.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let run = || -> Vec<ObjectIndexReport> { index_objects(&s, &url, 2, &tmp, &|_, _, _, _| (), &|_| ()).unwrap() };
    let first = run();
    let fresh: Vec<bool> = first.iter().map(|r| r.fresh).collect();
    // s-1's index (made locally, uploaded) is kept; s-2's is another tar's, rebuilt; the others written.
    assert_eq!(fresh, [false, true, false, false]);
    assert!(first[2].rebuilt.is_some() && first[0].rebuilt.is_none());
    assert_eq!(
        first.iter().map(|r| r.read).sum::<u64>(),
        files_bytes(&root.path().join("tars")) - { paths[1].metadata().unwrap().len() }
    );
    assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0, "every download is deleted");
    // The indexes written are the local scan's members, stamped with the download's ETag.
    for (t, p) in paths.iter().enumerate().filter(|(t, _)| *t != 1) {
        let (bytes, _) = s.get_bytes(&format!("wds/s-{t}.tar.rfidx")).unwrap();
        let parsed = ringfeed_source::wds::index::parse(&bytes).unwrap();
        let local = ringfeed_source::wds::tar::scan(&std::fs::read(p).unwrap(), &mut |_| {});
        assert_eq!(parsed.scan, local, "s-{t}");
        assert!(parsed.etag.is_some(), "s-{t}");
    }
    // A fresh server opens every tar from the store's indexes: nothing downloaded and scanned.
    let h = hub(&server, config(&root.path().join("cache"), 1 << 30));
    let opened = open_wds(&h, &format!("s3://{BUCKET}/wds/*.tar")).unwrap();
    assert_eq!((opened.from_store, opened.scanned, opened.from_cache), (4, 0, 0));
    // s-0 rewritten with the same layout (one byte of a member's data): only its ETag tells. Its
    // index is stale (by the listing's ETag on moto, by the ranged reads' on s3s-fs) and rebuilt.
    let mut bytes = std::fs::read(&paths[0]).unwrap();
    bytes[600] ^= 1;
    let changed = root.path().join("changed.tar");
    std::fs::write(&changed, &bytes).unwrap();
    s.put_file("wds/s-0.tar", &changed).unwrap();
    let again = run();
    assert_eq!(
        again.iter().map(|r| r.fresh).collect::<Vec<_>>(),
        [false, true, true, true]
    );
    let why = again[0].rebuilt.as_deref().unwrap();
    assert!(why.contains("etag"), "{why}");
    assert_eq!(again[0].read, bytes.len() as u64);
}
