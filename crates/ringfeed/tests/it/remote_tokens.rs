//! Token datasets on S3 (`ringfeed_remote::tokens`, control.md "Remote token datasets (1.7)")
//! against real S3 servers (`s3s-fs`, `moto_server`, started by `remote.rs`): a dataset written
//! by the library and uploaded as `ringfeed pack` uploads it serves exactly the windows of its
//! local copy, in both modes, with and without a stored packing; a prefix without a dataset,
//! refused credentials, a dataset larger than the cache, a corrupted object and an unreachable
//! store are errors that name the URL and what is wrong, within the fetch deadlines.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use object_store::aws::AmazonS3Builder;
use ringfeed_format::tokens::packing;
use ringfeed_format::tokens::{TOKENS_FILE, TokenFile, TokenSource, TokenWriter, TokenWriterOptions};
use ringfeed_order::windows::{Mode, PackTable, Window, WindowSpec, Windows};
use ringfeed_remote::tokens::{RemoteTokens, TokensError};
use ringfeed_remote::{Counters, Hub, RemoteConfig, RemoteUrl, Store};

use crate::remote::{BUCKET, KEY, Server, config, hub, start, store};
use crate::support::Rng;

/// The seq_len the dataset has a packing file for.
const PACKED: u32 = 16;

/// 150 documents of 1..60 tokens (ids 1..1000, EOS 0 last), chunks of 256 bytes, with the
/// packing file for `PACKED`; written to `root/tok` and uploaded to `s3://BUCKET/sets/tok`.
fn dataset(server: &Server, root: &Path) -> (PathBuf, RemoteUrl) {
    let local = root.join("tok");
    std::fs::create_dir_all(&local).unwrap();
    let mut opts = TokenWriterOptions::new(1000);
    opts.eos_id = Some(0);
    opts.chunk_bytes = 256;
    let mut w = TokenWriter::create(&local.join(TOKENS_FILE), opts).unwrap();
    let mut rng = Rng(5);
    for _ in 0..150 {
        let n = 1 + (rng.next() % 60) as usize;
        let mut doc: Vec<u32> = (0..n).map(|_| 1 + (rng.next() % 999) as u32).collect();
        doc.push(0);
        w.push(&doc, 0).unwrap();
    }
    w.finish("{}").unwrap();
    packing::write(&TokenFile::open(&local).unwrap(), PACKED).unwrap();
    let url = RemoteUrl::parse(&format!("s3://{BUCKET}/sets/tok")).unwrap().unwrap();
    let s = store(server, &config(&root.join("unused"), 1 << 30));
    let (files, _) = ringfeed_pack::remote::upload(&s, &local, &url).unwrap();
    assert_eq!(files, 2);
    (local, url)
}

fn windows(dir: &Path, mode: Mode, seq_len: u32) -> Windows {
    let src = Arc::new(TokenSource::open(dir, None).unwrap());
    let spec = WindowSpec {
        seq_len,
        mode,
        max_docs: seq_len,
        pad_id: 0,
    };
    Windows::new(src, spec).unwrap()
}

/// Asserts that `got` has `want`'s windows, naming the first that differs.
fn assert_same_windows(got: &Windows, want: &Windows, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    let (mut a, mut b) = (Window::default(), Window::default());
    for i in 0..got.len() {
        got.fill(i, &mut a).unwrap();
        want.fill(i, &mut b).unwrap();
        assert_eq!(a, b, "{what}: window {i}");
    }
}

/// A hub whose store for the bucket is at `127.0.0.1:port`, signing with `secret`.
fn hub_with_secret(port: u16, secret: &str, cfg: RemoteConfig) -> Hub {
    let endpoint = format!("http://127.0.0.1:{port}");
    let builder = AmazonS3Builder::new()
        .with_endpoint(&endpoint)
        .with_access_key_id(KEY)
        .with_secret_access_key(secret);
    let h = Hub::new(cfg.clone());
    h.add_store(Store::from_builder(builder, BUCKET, &endpoint, &cfg, Arc::new(Counters::default())).unwrap());
    h
}

fn open(h: &Hub, url: &str, pack: Option<u32>) -> Result<RemoteTokens, TokensError> {
    let url = RemoteUrl::parse(url).unwrap().unwrap();
    RemoteTokens::open(h, &url, pack, &AtomicU64::new(0))
}

#[test]
fn remote_token_windows_are_the_local_copys_on_both_servers() {
    for kind in ["s3s-fs", "moto"] {
        let Some(server) = start(kind) else { continue };
        let root = tempfile::tempdir().unwrap();
        let (local, url) = dataset(&server, root.path());
        let cache = root.path().join("cache");
        let h = hub(&server, config(&cache, 1 << 30));
        for (mode, seq_len, stored) in [
            (Mode::Concat, PACKED, false),
            (Mode::Pack, PACKED, true),
            (Mode::Pack, 7, false),
        ] {
            let fetched = AtomicU64::new(0);
            let pack = (mode == Mode::Pack).then_some(seq_len);
            let remote = RemoteTokens::open(&h, &url, pack, &fetched).unwrap();
            assert_eq!(fetched.load(Ordering::Relaxed), 1 + u64::from(stored), "{kind}");
            assert_eq!(
                std::fs::read(remote.dir().join(TOKENS_FILE)).unwrap(),
                std::fs::read(local.join(TOKENS_FILE)).unwrap()
            );
            let (got, want) = (windows(remote.dir(), mode, seq_len), windows(&local, mode, seq_len));
            assert_eq!(
                matches!(got.table, PackTable::Stored(_)),
                stored,
                "{kind}: the packing file is read exactly when the prefix has the stream's"
            );
            assert!(got.len() > 10);
            assert_same_windows(&got, &want, &format!("{kind} {mode:?} {seq_len}"));
            let view = remote.dir().to_owned();
            drop(remote);
            assert!(!view.exists(), "the view goes with its holder");
        }
        let c = h.counters.snapshot();
        // tokens.rft once, the packing once: every later open found them in the cache.
        assert_eq!((c.fetches, c.errors), (2, 0), "{kind}: {c:?}");
        assert!(c.hits >= 2, "{kind}: {c:?}");
    }
}

#[test]
fn a_restarted_cache_rechecks_its_copy_and_removes_stale_views() {
    let Some(server) = start("s3s-fs") else { return };
    let root = tempfile::tempdir().unwrap();
    let (local, url) = dataset(&server, root.path());
    let cache = root.path().join("cache");
    {
        let h = hub(&server, config(&cache, 1 << 30));
        drop(RemoteTokens::open(&h, &url, None, &AtomicU64::new(0)).unwrap());
    }
    // A view left by a killed server, and a copy damaged on disk since.
    std::fs::create_dir(cache.join(".view-1-1")).unwrap();
    let cached = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with("tokens.rft"))
        .unwrap();
    let mut bytes = std::fs::read(&cached).unwrap();
    bytes[4096 + 3] ^= 0x40;
    std::fs::write(&cached, bytes).unwrap();
    let h = hub(&server, config(&cache, 1 << 30));
    let remote = RemoteTokens::open(&h, &url, None, &AtomicU64::new(0)).unwrap();
    assert!(!cache.join(".view-1-1").exists());
    let c = h.counters.snapshot();
    assert_eq!(
        (c.rejected, c.fetches),
        (1, 1),
        "the damaged copy is fetched again: {c:?}"
    );
    assert_same_windows(
        &windows(remote.dir(), Mode::Concat, 9),
        &windows(&local, Mode::Concat, 9),
        "after the restart",
    );
}

#[test]
fn remote_token_errors_name_the_url_and_what_is_missing() {
    let Some(server) = start("s3s-fs") else { return };
    let root = tempfile::tempdir().unwrap();
    let (local, url) = dataset(&server, root.path());
    let s = store(&server, &config(&root.path().join("unused"), 1 << 30));
    let h = hub(&server, config(&root.path().join("cache"), 1 << 30));
    let err = |r: Result<RemoteTokens, TokensError>| r.map(drop).unwrap_err().to_string();

    let e = err(open(&h, &format!("s3://{BUCKET}/nothing"), None));
    assert!(
        e.contains(&format!("s3://{BUCKET}/nothing")) && e.contains("nothing is stored"),
        "{e}"
    );

    s.put_bytes("sets/images/index.rfi", b"not a token dataset").unwrap();
    let e = err(open(&h, &format!("s3://{BUCKET}/sets/images"), None));
    assert!(
        e.contains(&format!("s3://{BUCKET}/sets/images/tokens.rft does not exist")) && e.contains("index.rfi"),
        "{e}"
    );

    // A token byte flipped in the stored copy: every download fails its chunk CRC.
    let mut bytes = std::fs::read(local.join(TOKENS_FILE)).unwrap();
    bytes[4096 + 10] ^= 1;
    s.put_bytes("sets/bad/tokens.rft", &bytes).unwrap();
    let e = err(open(&h, &format!("s3://{BUCKET}/sets/bad"), None));
    assert!(
        e.contains("sets/bad/tokens.rft") && e.contains("failed their check"),
        "{e}"
    );
    assert!(e.contains("chunk"), "the check names the chunk: {e}");

    // Larger than the cache's bound.
    let small = hub(&server, config(&root.path().join("small"), 1000));
    let e = err(RemoteTokens::open(&small, &url, Some(PACKED), &AtomicU64::new(0)));
    assert!(
        e.contains(&url.to_string()) && e.contains("--cache-bytes") && e.contains("packing-16.rfp"),
        "{e}"
    );

    // Refused credentials.
    let cfg = config(&root.path().join("denied"), 1 << 30);
    let denied = hub_with_secret(server.port, "not-the-secret", cfg);
    let e = err(RemoteTokens::open(&denied, &url, None, &AtomicU64::new(0)));
    assert!(
        e.contains("access denied") && e.contains("AWS_SECRET_ACCESS_KEY"),
        "{e}"
    );
}

#[test]
fn an_unreachable_store_is_an_error_within_the_deadlines() {
    let root = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = config(&root.path().join("cache"), 1 << 30);
    cfg.timeout = Duration::from_secs(2);
    cfg.retries = 1;
    let h = hub_with_secret(port, "x", cfg);
    let started = Instant::now();
    let e = open(&h, &format!("s3://{BUCKET}/sets/tok"), None)
        .unwrap_err()
        .to_string();
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    assert!(e.contains("2 attempts failed") && e.contains("--fetch-retries"), "{e}");
}
