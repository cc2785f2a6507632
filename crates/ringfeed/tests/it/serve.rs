//! `ringfeed serve` end to end: the real binary, a real Unix socket, a real memfd ring, and a
//! small blocking client written against `proto/control.md` and `proto/ring.md`.

use std::collections::BTreeSet;
use std::io::{IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use ringfeed_format::ring::{SegmentHeader, SlotHeader};
use ringfeed_pack::{Check, PackOptions, ProgressMode, pack};
use serde_json::{Value, json};

use crate::support::{bin, jpeg, write_tree};

/// A server process on a private socket, killed when dropped.
pub struct Server {
    pub child: Child,
    socket: PathBuf,
}

impl Server {
    pub fn start(dir: &Path, threads: usize) -> Server {
        Server::start_args(dir, threads, &[])
    }

    /// A server with `--threads threads` and `extra` flags, once it listens.
    pub fn start_args(dir: &Path, threads: usize, extra: &[&str]) -> Server {
        // A fresh name per server, so no server ever finds another's socket file.
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let socket = dir.join(format!("sock-{threads}-{n}"));
        let child = Command::new(bin())
            .args([
                "serve",
                "--socket",
                socket.to_str().unwrap(),
                "--threads",
                &threads.to_string(),
            ])
            .args(extra)
            .env("RINGFEED_LOG", "warn")
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "the server did not start listening");
            std::thread::sleep(Duration::from_millis(20));
        }
        Server { child, socket }
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.socket)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A blocking client of the control protocol.
pub struct Client {
    sock: UnixStream,
    buf: Vec<u8>,
    fds: Vec<OwnedFd>,
    map: Option<memmap2::MmapMut>,
    /// `start` messages sent: the server numbers runs 1, 2, ... in that order.
    runs: u64,
}

/// One delivered batch: (dataset index, label, image bytes) per sample.
pub type Batch = Vec<(i64, i64, Vec<u8>)>;

impl Client {
    fn connect(path: &Path) -> Client {
        let sock = UnixStream::connect(path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Client {
            sock,
            buf: Vec::new(),
            fds: Vec::new(),
            map: None,
            runs: 0,
        }
    }

    pub fn send(&mut self, m: &Value) {
        self.sock.write_all(&ringfeed_format::control::encode_frame(m)).unwrap();
    }

    /// The next message; `None` at EOF.
    pub fn recv(&mut self) -> Option<Value> {
        loop {
            if self.buf.len() >= 4 {
                let n = u32::from_le_bytes(self.buf[..4].try_into().unwrap()) as usize;
                if self.buf.len() >= 4 + n {
                    let v: Value = serde_json::from_slice(&self.buf[4..4 + n]).unwrap();
                    self.buf.drain(..4 + n);
                    return Some(v);
                }
            }
            let mut data = [0u8; 65536];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
            let mut anc = rustix::net::RecvAncillaryBuffer::new(&mut space);
            let r = match rustix::net::recvmsg(
                &self.sock,
                &mut [IoSliceMut::new(&mut data)],
                &mut anc,
                rustix::net::RecvFlags::empty(),
            ) {
                Ok(r) => r,
                // A peer that died with unread data in its buffer resets the connection.
                Err(rustix::io::Errno::CONNRESET) => return None,
                Err(e) => panic!("recvmsg: {e}"),
            };
            for msg in anc.drain() {
                if let rustix::net::RecvAncillaryMessage::ScmRights(fds) = msg {
                    self.fds.extend(fds);
                }
            }
            if r.bytes == 0 {
                return None;
            }
            self.buf.extend_from_slice(&data[..r.bytes]);
        }
    }

    fn hello(&mut self, minor: u16) {
        self.send(&json!({"type": "hello", "protocol": [1, minor]}));
        assert_eq!(self.recv().unwrap()["type"], "welcome");
    }

    /// hello + open; returns the server's answer (`ring` or `error`), mapping the ring.
    pub fn open(&mut self, open: Value) -> Value {
        let (opening, reply) = self.open_as(0, open);
        assert!(opening.is_empty(), "a 1.0 client gets no `opening`: {opening:?}");
        reply
    }

    /// [`Client::open`] speaking protocol `1.minor`; returns the `opening` messages (1.2) that
    /// came before the answer, and the answer.
    pub fn open_as(&mut self, minor: u16, open: Value) -> (Vec<Value>, Value) {
        self.hello(minor);
        let mut m = open;
        m["type"] = json!("open");
        self.send(&m);
        let mut opening = Vec::new();
        let mut reply = self.recv().unwrap();
        while reply["type"] == "opening" {
            opening.push(reply);
            reply = self.recv().unwrap();
        }
        if reply["type"] == "ring" {
            let fd = self.fds.pop().expect("the ring message carries the memfd");
            let file = std::fs::File::from(fd);
            // SAFETY: a shared mapping of the ring's memfd, which the server sealed against
            // resizing; this test only reads slots it holds.
            self.map = Some(unsafe { memmap2::MmapMut::map_mut(&file) }.unwrap());
        }
        (opening, reply)
    }

    /// Reads the batch in `slot` (image, label, index fields).
    fn read_slot(&self, slot: u32, seq: u64) -> Batch {
        let map = self.map.as_ref().unwrap();
        let h = SegmentHeader::decode(&map[..4096]).unwrap();
        let start = 4096 + u64::from(slot) * h.slot_stride;
        let sh = SlotHeader::decode(&map[start as usize..start as usize + 64]).unwrap();
        assert_eq!(sh.seq, seq, "the slot header carries the ready's seq");
        let field = |n: &str| h.fields.iter().find(|f| f.name == n).unwrap().clone();
        let (img, lab, idx) = (field("image"), field("label"), field("index"));
        let at = |f: &ringfeed_format::ring::FieldDesc, j: u64| (start + f.offset + j * f.sample_bytes) as usize;
        (0..u64::from(sh.count))
            .map(|j| {
                let le = |f: &ringfeed_format::ring::FieldDesc| {
                    i64::from_le_bytes(map[at(f, j)..at(f, j) + 8].try_into().unwrap())
                };
                (
                    le(&idx),
                    le(&lab),
                    map[at(&img, j)..at(&img, j) + img.sample_bytes as usize].to_vec(),
                )
            })
            .collect()
    }

    /// `start`, then every batch until `end` (releasing each); returns the batches and `end`.
    pub fn epoch(&mut self, epoch: u64, first_batch: u64) -> (Vec<Batch>, Value) {
        self.start(epoch, first_batch);
        let mut batches = Vec::new();
        loop {
            let m = self.recv().expect("the server closed the connection mid-epoch");
            let current = m["run"].as_u64().is_none_or(|r| r == self.runs);
            match m["type"].as_str().unwrap() {
                "ready" => {
                    let (slot, seq) = (m["slot"].as_u64().unwrap() as u32, m["seq"].as_u64().unwrap());
                    if current {
                        batches.push(self.read_slot(slot, seq));
                    }
                    // Every ready is released, a stale one unread (ring.md rule 4).
                    self.send(&json!({"type": "release", "slot": slot, "seq": seq}));
                }
                "end" if !current => {}
                _ => return (batches, m),
            }
        }
    }

    fn start(&mut self, epoch: u64, first_batch: u64) {
        self.runs += 1;
        self.send(&json!({"type": "start", "epoch": epoch, "first_batch": first_batch}));
    }

    /// 1.3: [`Client::epoch`] of the rest of an epoch from global `position`.
    pub fn epoch_from(&mut self, epoch: u64, position: u64) -> (Vec<Batch>, Value) {
        self.runs += 1;
        self.send(&json!({"type": "start", "epoch": epoch, "first_batch": 0, "position": position}));
        let mut batches = Vec::new();
        loop {
            let m = self.recv().expect("the server closed the connection mid-epoch");
            match m["type"].as_str().unwrap() {
                "ready" => {
                    let (slot, seq) = (m["slot"].as_u64().unwrap() as u32, m["seq"].as_u64().unwrap());
                    batches.push(self.read_slot(slot, seq));
                    self.send(&json!({"type": "release", "slot": slot, "seq": seq}));
                }
                _ => return (batches, m),
            }
        }
    }
}

/// A packed dataset of `n` small JPEGs in 3 classes; returns its directory.
pub fn dataset(root: &Path, n: usize, bad: &[usize]) -> PathBuf {
    let src = root.join("src");
    let files: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| {
            let mut data = jpeg(40 + i % 13, 30 + i % 7, i as u64);
            if bad.contains(&i) {
                // A valid header over garbage scan data: packs under `--check header`, fails to decode.
                let n = data.len();
                let sos = data.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
                data[sos + 16..n - 2].fill(0xFF);
            }
            (format!("c{}/{i:03}.jpg", i % 3), data)
        })
        .collect();
    let refs: Vec<(&str, Vec<u8>)> = files.iter().map(|(p, d)| (p.as_str(), d.clone())).collect();
    write_tree(&src, &refs);
    let out = root.join("ds");
    let opts = PackOptions {
        progress: ProgressMode::None,
        check: Check::Header,
        ..PackOptions::default()
    };
    pack(&src, &out, &opts, &Arc::new(AtomicBool::new(false))).unwrap();
    out
}

pub fn open_msg(ds: &Path, extra: Value) -> Value {
    let mut m = json!({"dataset": ds.to_str().unwrap(), "batch_size": 8,
        "transform": {"kind": "random_resized_crop", "size": [16, 16]}, "fields": ["image", "label", "index"],
        "drop_last": false, "seed": 11});
    for (k, v) in extra.as_object().unwrap() {
        m[k] = v.clone();
    }
    m
}

#[test]
fn batches_do_not_depend_on_threads_and_cover_each_epoch() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), 37, &[]);
    let mut runs = Vec::new();
    for threads in [1, 3] {
        let server = Server::start(tmp.path(), threads);
        let mut c = server.client();
        let ring = c.open(open_msg(&ds, json!({})));
        assert_eq!(
            (ring["type"].as_str(), ring["batches_per_epoch"].as_u64()),
            (Some("ring"), Some(5))
        );
        assert_eq!(ring["classes"], json!(["c0", "c1", "c2"]));
        let (e0, end) = c.epoch(0, 0);
        assert_eq!(
            (end["type"].as_str(), end["batches"].as_u64(), end["skipped"].as_u64()),
            (Some("end"), Some(5), Some(0))
        );
        let (e1, _) = c.epoch(1, 0);
        for e in [&e0, &e1] {
            let seen: Vec<i64> = e.iter().flatten().map(|s| s.0).collect();
            assert_eq!(seen.len(), 37);
            assert_eq!(
                seen.iter().copied().collect::<BTreeSet<_>>().len(),
                37,
                "each sample exactly once"
            );
            let packed = ringfeed_format::shard::Dataset::open(&ds).unwrap();
            for s in e.iter().flatten() {
                assert_eq!(s.1, packed.sample(s.0 as u64).unwrap().label, "label of sample {}", s.0);
            }
        }
        assert_ne!(
            e0.iter().flatten().map(|s| s.0).collect::<Vec<_>>(),
            e1.iter().flatten().map(|s| s.0).collect::<Vec<_>>()
        );
        runs.push((e0, e1));
    }
    assert!(
        runs[0] == runs[1],
        "1 and 3 decode threads must deliver identical batches"
    );
}

#[test]
fn resume_delivers_exactly_the_rest_of_the_epoch() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), 30, &[]);
    let server = Server::start(tmp.path(), 2);
    let mut c = server.client();
    c.open(open_msg(&ds, json!({})));
    let (full, _) = c.epoch(4, 0);
    let mut d = server.client();
    d.open(open_msg(&ds, json!({})));
    let (rest, end) = d.epoch(4, 2);
    assert_eq!(end["batches"], 2);
    assert!(
        rest == full[2..],
        "resuming at batch 2 gives batches 2.. of the same epoch"
    );
    // A new `start` in the middle of a run replaces it.
    d.start(4, 0);
    let first = d.recv().unwrap();
    assert_eq!(first["type"], "ready");
    let (again, _) = {
        let (slot, seq) = (first["slot"].as_u64().unwrap() as u32, first["seq"].as_u64().unwrap());
        d.send(&json!({"type": "release", "slot": slot, "seq": seq}));
        d.epoch(4, 0)
    };
    assert!(again == full);
}

#[test]
fn a_start_at_a_global_position_restripes_the_rest_of_the_epoch() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), 40, &[]);
    let server = Server::start(tmp.path(), 2);
    let first = |world: u64, rank: u64, batch: u64| {
        let mut c = server.client();
        c.open(open_msg(
            &ds,
            json!({"world_size": world, "rank": rank, "batch_size": batch, "drop_last": true}),
        ));
        c
    };
    // Two ranks take one batch of 8: positions 0..16 of the order. Then three ranks of 4 take
    // the rest from position 16: 24 samples, 2 batches each.
    let mut seen: Vec<i64> = Vec::new();
    for rank in 0..2 {
        let (b, _) = first(2, rank, 8).epoch(1, 0);
        seen.extend(b[0].iter().map(|s| s.0));
    }
    for rank in 0..3 {
        let (b, end) = first(3, rank, 4).epoch_from(1, 16);
        assert_eq!(end["type"], "end", "{end}");
        assert_eq!(end["batches"], 2);
        seen.extend(b.iter().flatten().map(|s| s.0));
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..40).collect::<Vec<i64>>(), "every sample of the epoch once");
    // A position past the epoch is refused, naming the member.
    let mut c = first(1, 0, 4);
    c.send(&json!({"type": "start", "epoch": 0, "position": 41}));
    let r = c.recv().unwrap();
    assert_eq!(r["code"], "bad_request");
    assert!(r["message"].as_str().unwrap().contains("start.position 41"), "{r}");
}

#[test]
fn one_open_refuses_the_other_kinds_members() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), 9, &[]);
    let server = Server::start(tmp.path(), 1);
    let mut c = server.client();
    let r = c.open(open_msg(&ds, json!({"tokens": {"seq_len": 8}})));
    assert_eq!(r["code"], "bad_request");
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .contains("open.tokens is not a member of an image stream"),
        "{r}"
    );
    let mut c = server.client();
    let r = c.open(json!({"sample_kind": "tokens", "dataset": ds.to_str().unwrap(), "batch_size": 1}));
    assert_eq!(r["code"], "bad_request");
    assert!(
        r["message"].as_str().unwrap().contains("open.tokens is required"),
        "{r}"
    );
    let mut c = server.client();
    let r = c.open(json!({"sample_kind": "audio", "dataset": ds.to_str().unwrap(), "batch_size": 1}));
    assert_eq!(r["code"], "bad_request");
    assert!(r["message"].as_str().unwrap().contains("audio"), "{r}");
}

#[test]
fn ranks_cover_the_epoch_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), 31, &[]);
    let server = Server::start(tmp.path(), 2);
    let mut all = Vec::new();
    for rank in 0..3 {
        let mut c = server.client();
        let ring = c.open(open_msg(
            &ds,
            json!({"rank": rank, "world_size": 3, "drop_last": true, "batch_size": 2}),
        ));
        assert_eq!(ring["samples_per_rank"], 10);
        let (batches, _) = c.epoch(2, 0);
        all.extend(batches.iter().flatten().map(|s| s.0));
    }
    assert_eq!(all.len(), 30);
    assert_eq!(all.iter().collect::<BTreeSet<_>>().len(), 30);
}

#[test]
fn a_killed_client_does_not_disturb_another() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), 40, &[]);
    let server = Server::start(tmp.path(), 2);
    let mut a = server.client();
    a.open(open_msg(&ds, json!({})));
    let (reference, _) = a.epoch(0, 0);
    for _ in 0..5 {
        let mut b = server.client();
        b.open(open_msg(&ds, json!({"slots": 2})));
        b.start(0, 0);
        assert_eq!(b.recv().unwrap()["type"], "ready");
        drop(b); // holds a slot and vanishes without releasing it
    }
    let (again, end) = a.epoch(0, 0);
    assert_eq!(end["type"], "end");
    assert!(again == reference);
    let mut c = server.client();
    assert_eq!(c.open(open_msg(&ds, json!({})))["type"], "ring");
}

#[test]
fn bad_requests_get_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), 9, &[]);
    let server = Server::start(tmp.path(), 1);
    let err = |open: Value| {
        let mut c = server.client();
        let r = c.open(open);
        assert_eq!(r["type"], "error", "{r}");
        assert_eq!(r["fatal"], true);
        (
            r["code"].as_str().unwrap().to_owned(),
            r["message"].as_str().unwrap().to_owned(),
        )
    };
    let missing = tmp.path().join("nope");
    let (code, msg) = err(open_msg(&missing, json!({})));
    assert_eq!(code, "dataset");
    assert!(msg.contains(missing.to_str().unwrap()), "{msg}");
    let (code, msg) = err(open_msg(&ds, json!({"batch_size": 64, "drop_last": true})));
    assert_eq!(code, "bad_request");
    assert!(msg.contains("batch_size 64 is larger than the 9 samples"), "{msg}");
    let (code, msg) = err(open_msg(
        &ds,
        json!({"transform": {"kind": "random_resized_crop", "size": [16, 16], "scale": [0.9, 0.1]}}),
    ));
    assert_eq!(code, "bad_request");
    assert!(msg.contains("transform.scale"), "{msg}");
    let (code, msg) = err(open_msg(&ds, json!({"batch_size": "many"})));
    assert_eq!(code, "bad_request");
    assert!(msg.contains("invalid `open` message"), "{msg}");

    let mut c = server.client();
    c.send(&json!({"type": "hello", "protocol": [2, 0]}));
    let r = c.recv().unwrap();
    assert_eq!(
        (r["code"].as_str(), r["fatal"].as_bool()),
        (Some("version"), Some(true))
    );
    let (major, minor) = ringfeed_format::control::PROTOCOL;
    let want = format!("protocol 2.0, this server {major}.{minor}");
    assert!(r["message"].as_str().unwrap().contains(&want), "{r}");
    assert!(c.recv().is_none(), "the server closes after a version error");

    let mut c = server.client();
    c.open(open_msg(&ds, json!({})));
    c.send(&json!({"type": "release", "slot": 0, "seq": 99}));
    let r = c.recv().unwrap();
    assert_eq!(r["code"], "protocol");
    assert!(c.recv().is_none());

    let mut raw = UnixStream::connect(&server.socket).unwrap();
    raw.write_all(&[0, 0, 0, 0]).unwrap();
    let mut reply = Vec::new();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    raw.read_to_end(&mut reply).unwrap();
    assert!(String::from_utf8_lossy(&reply).contains("frame length 0 is outside 1..=65536"));
}

#[test]
fn corrupt_samples_raise_or_are_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), 20, &[5]);
    let server = Server::start(tmp.path(), 2);
    let mut c = server.client();
    c.open(open_msg(&ds, json!({"shuffle": false})));
    let packed = ringfeed_format::shard::Dataset::open(&ds).unwrap();
    let bad = (0..20)
        .find(|&i| packed.sample(i).unwrap().key == b"c2/005.jpg")
        .unwrap();
    let (batches, err) = c.epoch(0, 0);
    assert_eq!(
        batches.len() as u64,
        bad / 8,
        "batches before the corrupt one are delivered"
    );
    assert_eq!(
        (err["type"].as_str(), err["code"].as_str(), err["sample"].as_u64()),
        (Some("error"), Some("sample"), Some(bad))
    );
    assert_eq!(err["key"], "c2/005.jpg");
    assert!(err["message"].as_str().unwrap().contains("on_error=\"skip\""));
    // The stream is still usable: a run starting after the bad batch reaches the end.
    let (_, again) = c.epoch(0, bad / 8 + 1);
    assert_eq!(again["type"], "end");

    let mut s = server.client();
    s.open(open_msg(&ds, json!({"shuffle": false, "on_error": "skip"})));
    let (batches, end) = s.epoch(0, 0);
    assert_eq!(
        (end["skipped"].as_u64(), batches[(bad / 8) as usize].len()),
        (Some(1), 7)
    );
    let seen: Vec<i64> = batches.iter().flatten().map(|s| s.0).collect();
    assert_eq!(seen, (0..20).filter(|&i| i != bad as i64).collect::<Vec<_>>());
}

#[test]
fn a_killed_server_is_noticed_at_once_and_sigterm_is_graceful() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), 20, &[]);
    let mut server = Server::start(tmp.path(), 1);
    let mut c = server.client();
    c.open(open_msg(&ds, json!({})));
    c.start(0, 0);
    assert_eq!(c.recv().unwrap()["type"], "ready");
    server.child.kill().unwrap();
    let t = Instant::now();
    while c.recv().is_some() {}
    assert!(t.elapsed() < Duration::from_secs(1), "EOF took {:?}", t.elapsed());

    let mut server = Server::start(tmp.path(), 1);
    let mut c = server.client();
    c.open(open_msg(&ds, json!({})));
    Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    let r = c.recv().unwrap();
    assert_eq!(
        (r["code"].as_str(), r["fatal"].as_bool()),
        (Some("shutdown"), Some(true))
    );
    assert!(r["message"].as_str().unwrap().contains("shutting down"));
    assert!(server.child.wait().unwrap().success());
    assert!(!server.socket.exists(), "the socket file is removed on shutdown");
}

#[test]
fn ring_size_is_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), 9, &[]);
    let server = Server::start(tmp.path(), 1);
    let mut c = server.client();
    let r = c.open(open_msg(
        &ds,
        json!({"batch_size": 65536, "slots": 64, "drop_last": false,
        "transform": {"kind": "resize", "size": [4096, 4096]}}),
    ));
    assert_eq!(r["code"], "bad_request", "{r}");
    assert!(r["message"].as_str().unwrap().contains("--max-ring-bytes"), "{r}");
}

/// An observer connection's snapshot.
pub fn snapshot(server: &Server) -> Value {
    let mut o = server.client();
    o.send(&json!({"type": "hello", "protocol": [1, 1]}));
    assert_eq!(o.recv().unwrap()["type"], "welcome");
    o.send(&json!({"type": "snapshot"}));
    let s = o.recv().unwrap();
    assert_eq!(s["type"], "snapshot", "{s}");
    s
}

#[test]
fn observers_see_every_stream_its_settings_and_the_clients_wait() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), 40, &[1]);
    let server = Server::start(tmp.path(), 3);
    let empty = snapshot(&server);
    assert_eq!(empty["streams"], json!([]));
    assert_eq!(empty["server"]["threads"], 3);

    // A pinned stream and an autotuned one.
    let mut pinned = server.client();
    let ring = pinned.open(open_msg(
        &ds,
        json!({"autotune": false, "threads": 2, "prefetch": 1, "slots": 3, "on_error": "skip"}),
    ));
    let pinned_id = ring["stream"].as_u64().expect("a 1.1 ring names its stream");
    let mut tuned = server.client();
    let tuned_id = tuned.open(open_msg(&ds, json!({})))["stream"].as_u64().unwrap();
    assert_ne!(pinned_id, tuned_id);

    let (batches, end) = pinned.epoch(0, 0);
    assert_eq!(end["type"], "end");
    tuned.send(&json!({"type": "stats", "steps": 10, "wait_ns": 1_000_000, "compute_ns": 99_000_000}));

    // The tuner publishes the interval's rates every 0.5 s; wait for the client's stats to show.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (p, t) = loop {
        let s = snapshot(&server);
        let find = |id: u64| {
            s["streams"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["stream"] == id)
                .cloned()
        };
        let (p, t) = (
            find(pinned_id).expect("pinned stream listed"),
            find(tuned_id).expect("tuned stream listed"),
        );
        if !t["wait"].is_null() || Instant::now() > deadline {
            break (p, t);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        (p["autotune"].as_bool(), p["threads"].as_u64(), p["depth"].as_u64()),
        (Some(false), Some(2), Some(1))
    );
    let delivered: usize = batches.iter().map(Vec::len).sum();
    assert_eq!(p["samples"].as_u64(), Some(delivered as u64));
    assert_eq!(p["batches"].as_u64(), Some(batches.len() as u64));
    assert_eq!(p["skipped"].as_u64(), Some(1));
    // After `end`, the next epoch is prepared ahead: one batch (prefetch 1) filling or ready.
    let n = |k: &str| p["slots"][k].as_u64().unwrap();
    assert_eq!((n("free"), n("filling") + n("ready"), n("held")), (2, 1, 0), "{p}");
    assert_eq!(p["dataset"].as_str().map(|d| d.contains("ds")), Some(true), "{p}");
    assert_eq!(t["wait"].as_f64(), Some(0.01), "{t}");
    assert_eq!(t["step_ms"].as_f64(), Some(9.9), "{t}");
    assert_eq!(t["autotune"], true);

    // Closing a stream removes it.
    drop(pinned);
    let deadline = Instant::now() + Duration::from_secs(10);
    while snapshot(&server)["streams"].as_array().unwrap().len() != 1 {
        assert!(Instant::now() < deadline, "the closed stream is still listed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_clients_wait_behind_its_gpu_is_shown_apart_and_the_tuner_reads_the_rest() {
    // Protocol 1.2: of 150 ms in `next()` over 12 steps, 120 ms were behind the client's GPU.
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), 40, &[]);
    let server = Server::start(tmp.path(), 2);
    let mut c = server.client();
    let id = c.open(open_msg(&ds, json!({})))["stream"].as_u64().unwrap();
    let (batches, _) = c.epoch(0, 0);
    assert!(!batches.is_empty());
    c.send(&json!({"type": "stats", "steps": 12, "wait_ns": 150_000_000, "compute_ns": 100_000_000, "gpu_wait_ns": 120_000_000}));
    let deadline = Instant::now() + Duration::from_secs(10);
    let t = loop {
        let s = snapshot(&server);
        let t = s["streams"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["stream"] == id)
            .cloned()
            .unwrap();
        if !t["gpu_wait"].is_null() || Instant::now() > deadline {
            break t;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // The wait for data is what is left: 30 of 250 ms; the step the loop's own: 220 ms / 12.
    assert_eq!(
        (t["wait"].as_f64(), t["gpu_wait"].as_f64()),
        (Some(0.12), Some(0.48)),
        "{t}"
    );
    assert_eq!(t["step_ms"].as_f64(), Some(18.33), "{t}");
    let busy = t["busy"].as_f64().expect("a 1.2 snapshot has the busy share");
    assert!((0.0..=1.01).contains(&busy), "{t}");
    assert!(
        t["limit"]
            .as_str()
            .unwrap()
            .contains("the training loop waits for data 12.0% of its time (and 48.0% behind its own GPU work)"),
        "{t}"
    );
}

#[test]
fn observers_may_only_observe_and_streams_may_not_observe() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), 9, &[]);
    let server = Server::start(tmp.path(), 1);
    let mut o = server.client();
    o.hello(0);
    o.send(&json!({"type": "snapshot"}));
    assert_eq!(o.recv().unwrap()["type"], "snapshot");
    o.send(&json!({"type": "start", "epoch": 0}));
    let r = o.recv().unwrap();
    assert_eq!(
        (r["code"].as_str(), r["fatal"].as_bool()),
        (Some("protocol"), Some(true)),
        "{r}"
    );

    let mut c = server.client();
    c.open(open_msg(&ds, json!({})));
    c.send(&json!({"type": "snapshot"}));
    let r = c.recv().unwrap();
    assert_eq!(r["code"], "protocol", "{r}");
    assert!(r["message"].as_str().unwrap().contains("observer"), "{r}");

    for (extra, member) in [
        (json!({"threads": 0}), "open.threads"),
        (json!({"prefetch": 5, "slots": 4}), "open.prefetch"),
        (json!({"local_world_size": 0}), "open.local_world_size"),
        (json!({"autotune": "yes"}), "invalid `open` message"),
    ] {
        let mut c = server.client();
        let r = c.open(open_msg(&ds, extra));
        assert_eq!(r["code"], "bad_request", "{r}");
        assert!(r["message"].as_str().unwrap().contains(member), "{r}");
    }
}

#[test]
fn an_observer_does_not_keep_an_idle_server_alive() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), 9, &[]);
    let mut server = Server::start_args(tmp.path(), 1, &["--exit-when-idle", "0.5"]);
    let socket = server.socket.clone();
    let mut c = Client::connect(&socket);
    c.open(open_msg(&ds, json!({})));
    let mut o = Client::connect(&socket);
    o.hello(0);
    o.send(&json!({"type": "snapshot"}));
    assert_eq!(o.recv().unwrap()["streams"].as_array().unwrap().len(), 1);
    drop(c);
    // The observer stays connected; the server still exits after the grace period.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            assert!(status.success());
            break;
        }
        assert!(Instant::now() < deadline, "an observer kept the idle server alive");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(o);
}

#[test]
fn pinned_decode_threads_each_run_on_one_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start_args(tmp.path(), 2, &["--pin-threads"]);
    let child = &server.child;
    // The socket listens before the pool has started; poll until both threads have pinned
    // themselves.
    let decode_cpus = || {
        let mut pinned = Vec::new();
        for task in std::fs::read_dir(format!("/proc/{}/task", child.id())).unwrap() {
            let dir = task.unwrap().path();
            let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            if name.starts_with("ringfeed-decode") {
                let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
                if let Some(cpus) = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")) {
                    pinned.push(cpus.split(':').nth(1).unwrap().trim().to_owned());
                }
            }
        }
        pinned
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut pinned = decode_cpus();
    while !(pinned.len() == 2 && pinned.iter().all(|c| c.parse::<usize>().is_ok())) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        pinned = decode_cpus();
    }
    drop(server);
    assert_eq!(pinned.len(), 2, "{pinned:?}");
    for cpus in &pinned {
        assert!(
            cpus.parse::<usize>().is_ok(),
            "a decode thread may run on {cpus:?}, not one CPU"
        );
    }
    let online = std::thread::available_parallelism().unwrap().get();
    if online > 1 {
        assert_ne!(pinned[0], pinned[1], "two threads on one CPU: {pinned:?}");
    }
}

#[test]
fn the_next_epoch_prepared_ahead_is_the_epoch_asked_for_or_dropped() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), 29, &[]);
    let server = Server::start(tmp.path(), 2);
    let fresh = |epoch: u64, first: u64| {
        let mut c = server.client();
        c.open(open_msg(&ds, json!({})));
        c.epoch(epoch, first).0
    };
    let mut c = server.client();
    c.open(open_msg(&ds, json!({"slots": 3})));
    let (e0, end) = c.epoch(0, 0);
    assert_eq!(end["run"], 1);
    // Epoch 1 was prepared after epoch 0's end; it is exactly epoch 1, as run 2.
    let (e1, end) = c.epoch(1, 0);
    assert_eq!((end["run"].as_u64(), end["epoch"].as_u64()), (Some(2), Some(1)));
    assert!(e1 == fresh(1, 0));
    assert!(e1 != e0);
    // Epoch 2 was prepared; asking for epoch 5, or for epoch 2 from its middle, drops it.
    let (e5, end) = c.epoch(5, 0);
    assert_eq!(end["run"], 3);
    assert!(e5 == fresh(5, 0));
    let (e6_tail, end) = c.epoch(6, 2);
    assert_eq!(end["run"], 4);
    assert!(e6_tail == fresh(6, 2));
    // And the speculation after a resumed run is the next epoch from its start.
    let (e7, _) = c.epoch(7, 0);
    assert!(e7 == fresh(7, 0));
}

/// The bad-input corpus of the reliability issue, packed as it is (no checks), served under both
/// error policies: every bad sample ends in a `sample` error naming it or in the skip count,
/// every good one (however unusual its encoding) is delivered, and the server serves on.
#[test]
fn a_corpus_of_bad_and_unusual_samples_is_served_or_skipped_never_crashing() {
    use crate::codec::images::{self, JpegOpts};
    let tmp = tempfile::tempdir().unwrap();
    let photo = |w, h, seed| images::photo(w, h, seed);
    let jpeg = |o: JpegOpts| images::jpeg_rgb(&photo(64, 48, 3), 64, 48, &o);
    let good_jpeg = jpeg(JpegOpts::default());
    let mut truncated = good_jpeg.clone();
    truncated.truncate(good_jpeg.len() / 2);
    let mut big_exif = images::with_exif(&good_jpeg, 6, true);
    // An APP1 segment near its 64 KiB maximum, after the real EXIF one.
    let mut app1 = vec![0xFF, 0xE1, 0xFF, 0xF0];
    app1.extend(std::iter::repeat_n(0x41, 0xFFF0 - 2));
    big_exif.splice(2..2, app1);
    let gray_px: Vec<u8> = photo(40, 30, 5).chunks(3).map(|p| p[1]).collect();
    let rows16: Vec<u8> = (0..30 * 40 * 3 * 2).map(|x| (x * 7 % 251) as u8).collect();
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("good.jpg", good_jpeg.clone(), true),
        ("truncated.jpg", truncated, false),
        // Zero-byte files cannot be packed (pack refuses or skips them: pack.rs); the shortest
        // record there can be is one byte.
        ("one-byte.jpg", vec![0xFF], false),
        ("random.jpg", crate::support::Rng(9).bytes(4000), false),
        ("bomb.png", images::png_huge_header(100_000, 100_000), false),
        ("sof-bomb.jpg", images::with_sof_size(&good_jpeg, 60_000, 60_000), false),
        (
            "cmyk.jpg",
            images::jpeg_cmyk(&images::cmyk_content(32, 24), 32, 24, false),
            true,
        ),
        ("gray.jpg", images::jpeg_gray(&gray_px, 40, 30), true),
        ("rgb16.png", images::png(40, 30, 16, 2, &rows16, &[]), true),
        ("big-exif.jpg", big_exif, true),
        (
            "progressive.jpg",
            jpeg(JpegOpts {
                progressive: true,
                ..JpegOpts::default()
            }),
            true,
        ),
        (
            "arithmetic.jpg",
            jpeg(JpegOpts {
                arithmetic: true,
                ..JpegOpts::default()
            }),
            true,
        ),
    ];
    let specs: Vec<crate::support::Spec> = cases
        .iter()
        .enumerate()
        .map(|(i, (key, data, _))| crate::support::Spec {
            key: key.as_bytes().to_vec(),
            label: i as i64,
            meta: Vec::new(),
            data: data.clone(),
        })
        .collect();
    let ds = tmp.path().join("bad");
    crate::support::write_dataset(&ds, &specs, &[], crate::support::small_options());
    let good: BTreeSet<i64> = cases
        .iter()
        .enumerate()
        .filter(|c| c.1.2)
        .map(|(i, _)| i as i64)
        .collect();
    let server = Server::start(tmp.path(), 2);
    let shuffled = |extra: Value| {
        let mut m = open_msg(
            &ds,
            json!({"shuffle": false, "batch_size": 3, "transform": {"kind": "random_resized_crop", "size": [24, 24]}}),
        );
        for (k, v) in extra.as_object().unwrap() {
            m[k] = v.clone();
        }
        m
    };

    let mut skip = server.client();
    skip.open(shuffled(json!({"on_error": "skip"})));
    let (batches, end) = skip.epoch(0, 0);
    assert_eq!(end["type"], "end", "{end}");
    let delivered: BTreeSet<i64> = batches.iter().flatten().map(|s| s.0).collect();
    assert_eq!(delivered, good, "every good sample, and only those");
    assert_eq!(end["skipped"].as_u64(), Some((cases.len() - good.len()) as u64));

    let mut raise = server.client();
    raise.open(shuffled(json!({})));
    let (_, err) = raise.epoch(0, 0);
    assert_eq!(
        (err["type"].as_str(), err["code"].as_str()),
        (Some("error"), Some("sample")),
        "{err}"
    );
    assert_eq!(err["sample"], 1, "the first bad sample in order: {err}");
    assert_eq!(err["key"], "truncated.jpg");
    assert!(err["message"].as_str().unwrap().contains("on_error"), "{err}");

    // The server serves on: the same connection starts again, and a new client gets an epoch.
    let (_, err) = raise.epoch(1, 0);
    assert_eq!(err["code"], "sample");
    let mut again = server.client();
    again.open(shuffled(json!({"on_error": "skip"})));
    assert_eq!(again.epoch(2, 0).1["type"], "end");
}

/// Runs `ringfeed top --once` against `socket` as uid/gid 65534 (nobody); returns its stderr.
fn top_as_nobody(socket: &Path) -> (bool, String) {
    use std::os::unix::process::CommandExt;
    let out = Command::new(bin())
        .args(["top", "--once", "--socket", socket.to_str().unwrap()])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn another_user_is_kept_out_by_the_socket_mode_and_by_the_peer_uid_check() {
    use std::os::unix::fs::PermissionsExt;
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: needs root to run a client as another user");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // A directory the other user may enter, so only the socket's own mode and the uid check
    // stand in the way.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = Server::start(tmp.path(), 1);
    let mode = std::fs::metadata(&server.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let (ok, err) = top_as_nobody(&server.socket);
    assert!(!ok && err.contains("Permission denied"), "{err}");
    // Even with the socket opened to everyone, the server refuses a peer of another uid.
    std::fs::set_permissions(&server.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    // It connects, and the server closes at once: `top` fails reading (EOF) or writing
    // (EPIPE) its hello, whichever comes first; never with a welcome.
    let (ok, err) = top_as_nobody(&server.socket);
    assert!(!ok, "{err}");
    assert!(err.contains("talking to the server on"), "{err}");
    assert!(!err.contains("Permission denied"), "{err}");
    // Its own user is still served.
    let mut c = server.client();
    c.hello(0);
}

#[test]
fn data_root_confines_datasets_whatever_path_the_client_sends() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let inside = dataset(&root, 9, &[]);
    let outside = dataset(&tmp.path().join("elsewhere"), 9, &[]);
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    let server = Server::start_args(tmp.path(), 1, &["--data-root", root.to_str().unwrap()]);
    let socket = server.socket.clone();
    let try_open = |path: PathBuf| {
        let mut c = Client::connect(&socket);
        c.open(open_msg(&path, json!({})))
    };
    assert_eq!(try_open(inside.clone())["type"], "ring");
    for path in [
        outside.clone(),
        root.join("link"),
        root.join("..").join("elsewhere").join("ds"),
    ] {
        let r = try_open(path.clone());
        assert_eq!(r["code"], "dataset", "{} → {r}", path.display());
        assert!(r["message"].as_str().unwrap().contains("--data-root"), "{r}");
    }
}
