//! Seeing what the server does: `ringfeed top` (a table of every stream, refreshed) and the
//! Prometheus text endpoint of `ringfeed serve --metrics ADDR`. Both render a
//! [`Snapshot`](ringfeed_format::control::Snapshot), the same state an observer connection gets
//! (control.md, "snapshot").

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ringfeed_format::control::{
    ClientMessage, PROTOCOL, ServerMessage, decode_frame, encode_frame, frame::check_length,
};
use ringfeed_format::control::{RemoteSnapshot, ServerSnapshot, Snapshot, StreamSnapshot};

/// A blocking observer connection to a server.
#[derive(Debug)]
pub struct Observer {
    sock: UnixStream,
}

/// Why a snapshot could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    #[error("no ringfeed server listens on {path}: {source}; start one with `ringfeed serve`, or pass its --socket")]
    Connect { path: String, source: std::io::Error },
    #[error("talking to the server on {path}: {message}")]
    Protocol { path: String, message: String },
}

impl Observer {
    /// Connects and says hello.
    pub fn connect(path: &Path) -> Result<Self, ObserveError> {
        let sock = UnixStream::connect(path).map_err(|source| ObserveError::Connect {
            path: path.display().to_string(),
            source,
        })?;
        let _ = sock.set_read_timeout(Some(Duration::from_secs(10)));
        let mut o = Observer { sock };
        let hello = ClientMessage::Hello {
            protocol: [PROTOCOL.0, PROTOCOL.1],
            client: Some(concat!("ringfeed-top ", env!("CARGO_PKG_VERSION")).into()),
            pid: Some(u64::from(std::process::id())),
        };
        o.send(&hello, path)?;
        match o.recv(path)? {
            ServerMessage::Welcome { protocol, .. } if protocol >= [1, 1] => Ok(o),
            ServerMessage::Welcome { protocol, .. } => Err(ObserveError::Protocol {
                path: path.display().to_string(),
                message: format!(
                    "the server speaks protocol {}.{}, which has no snapshots; upgrade it",
                    protocol[0], protocol[1]
                ),
            }),
            other => Err(unexpected(path, &other)),
        }
    }

    /// The server's state now.
    pub fn snapshot(&mut self, path: &Path) -> Result<Snapshot, ObserveError> {
        self.send(&ClientMessage::Snapshot {}, path)?;
        match self.recv(path)? {
            ServerMessage::Snapshot(s) => Ok(*s),
            other => Err(unexpected(path, &other)),
        }
    }

    fn send(&mut self, m: &ClientMessage, path: &Path) -> Result<(), ObserveError> {
        self.sock
            .write_all(&encode_frame(m))
            .map_err(|e| ObserveError::Protocol {
                path: path.display().to_string(),
                message: e.to_string(),
            })
    }

    fn recv(&mut self, path: &Path) -> Result<ServerMessage, ObserveError> {
        let err = |message: String| ObserveError::Protocol {
            path: path.display().to_string(),
            message,
        };
        let mut prefix = [0u8; 4];
        self.sock
            .read_exact(&mut prefix)
            .map_err(|e| err(format!("the server closed the connection ({e})")))?;
        let len = check_length(prefix).map_err(|e| err(e.to_string()))?;
        let mut payload = vec![0u8; len];
        self.sock.read_exact(&mut payload).map_err(|e| err(e.to_string()))?;
        let (_, value) = decode_frame(&payload).map_err(|e| err(e.to_string()))?;
        serde_json::from_value(value).map_err(|e| err(format!("unexpected message: {e}")))
    }
}

fn unexpected(path: &Path, m: &ServerMessage) -> ObserveError {
    let message = match m {
        ServerMessage::Error { message, .. } => format!("the server refused: {message}"),
        other => format!("unexpected answer {other:?}"),
    };
    ObserveError::Protocol {
        path: path.display().to_string(),
        message,
    }
}

fn opt(v: Option<f64>, scale: f64, digits: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |x| format!("{:.*}", digits, x * scale))
}

/// The snapshot as a text table (what `ringfeed top` shows).
pub fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    let sv = &s.server;
    let _ = writeln!(
        out,
        "{} pid {} up {:.0}s | cores {} budget {} pool {} | threads allotted {} busy {:.1}",
        sv.version, sv.pid, sv.uptime_s, sv.cores, sv.cpu_budget, sv.threads, sv.active_threads, sv.busy
    );
    if let Some(r) = &sv.remote {
        let _ = writeln!(
            out,
            "remote: {} fetches {:.1} MB, {} at once ({}) | retries {} errors {} | hits {} misses {} prefetches {} | cache {:.1}/{:.1} MB, {} evicted, {} reused, {} rejected | waited {:.1} s",
            r.fetches,
            r.bytes as f64 / 1e6,
            r.fetch_concurrency,
            if r.fetch_pinned { "pinned" } else { "tuned" },
            r.retries,
            r.errors,
            r.hits,
            r.misses,
            r.prefetches,
            r.cache_bytes as f64 / 1e6,
            r.cache_limit as f64 / 1e6,
            r.evictions,
            r.reused,
            r.rejected,
            r.wait_s
        );
    }
    if s.streams.is_empty() {
        out.push_str("no streams\n");
        return out;
    }
    let _ = writeln!(
        out,
        "{:>6} {:>7} {:>5} {:>9} {:>6} {:>6} {:>6} {:>7} {:>5} {:>5} {:>13} {:>9} {:>9} {:>8} {:>8} {:>7}  dataset / limit / last change",
        "stream",
        "pid",
        "epoch",
        "img/s",
        "data%",
        "gpu%",
        "stepms",
        "threads",
        "busy%",
        "depth",
        "F/Fi/R/H",
        "read_us",
        "decode_us",
        "xform_us",
        "write_us",
        "skipped"
    );
    for t in &s.streams {
        let slots = format!(
            "{}/{}/{}/{}",
            t.slots.free, t.slots.filling, t.slots.ready, t.slots.held
        );
        let threads = format!("{}{}", t.threads, if t.autotune { "" } else { "*" });
        let _ = writeln!(
            out,
            "{:>6} {:>7} {:>5} {:>9.1} {:>6} {:>6} {:>6} {:>7} {:>5} {:>5} {:>13} {:>9.1} {:>9.1} {:>8.1} {:>8.1} {:>7}  {}",
            t.stream,
            t.pid,
            t.epoch,
            t.samples_per_s,
            opt(t.wait, 100.0, 1),
            opt(t.gpu_wait, 100.0, 1),
            opt(t.step_ms, 1.0, 1),
            threads,
            opt(t.busy, 100.0, 0),
            t.depth,
            slots,
            t.stage_us.read,
            t.stage_us.decode,
            t.stage_us.transform,
            t.stage_us.write,
            t.skipped,
            t.dataset
        );
        if let Some(share) = t.gpu_share {
            let _ = writeln!(
                out,
                "{:>6} gpu decode: share {:.0}%, {} samples handed to the client's GPU, {} us of its host time each",
                "",
                share * 100.0,
                t.gpu_samples.unwrap_or(0),
                opt(t.gpu_decode_us, 1.0, 1)
            );
        }
        if !t.limit.is_empty() {
            let _ = writeln!(out, "{:>6} limit: {}", "", t.limit);
        }
        if !t.tune.is_empty() {
            let _ = writeln!(out, "{:>6} tune: {}", "", t.tune);
        }
    }
    out.push_str("data%: the training loop's time waiting for data; gpu%: waiting behind its own GPU (not for data); busy%: of the stream's threads' time\n");
    out.push_str("slots F/Fi/R/H: free/filling/ready/held; threads* pinned by the client (autotune off)\n");
    out
}

/// Escapes a Prometheus label value.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Metric families being written in the Prometheus text exposition format.
#[derive(Default)]
struct Exposition {
    out: String,
}

impl Exposition {
    /// One family: its help and type lines, then one line per `(labels, value)` sample.
    fn metric(&mut self, name: &str, kind: &str, help: &str, samples: Vec<(String, f64)>) {
        let out = &mut self.out;
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, v) in samples {
            if labels.is_empty() {
                let _ = writeln!(out, "{name} {v}");
            } else {
                let _ = writeln!(out, "{name}{{{labels}}} {v}");
            }
        }
    }
}

/// The snapshot in the Prometheus text exposition format, version 0.0.4.
pub fn prometheus(s: &Snapshot) -> String {
    let mut e = Exposition::default();
    server_metrics(&mut e, &s.server);
    if let Some(r) = &s.server.remote {
        remote_metrics(&mut e, r);
    }
    stream_metrics(&mut e, &s.streams);
    e.out
}

/// The server's and its pool's families.
fn server_metrics(e: &mut Exposition, sv: &ServerSnapshot) {
    e.metric(
        "ringfeed_uptime_seconds",
        "gauge",
        "Seconds since the server started.",
        vec![(String::new(), sv.uptime_s)],
    );
    e.metric(
        "ringfeed_cores",
        "gauge",
        "CPUs the server may run on.",
        vec![(String::new(), f64::from(sv.cores))],
    );
    e.metric(
        "ringfeed_cpu_budget_threads",
        "gauge",
        "Decode threads the autotuner may use for all streams together.",
        vec![(String::new(), f64::from(sv.cpu_budget))],
    );
    e.metric(
        "ringfeed_pool_threads",
        "gauge",
        "Decode threads in the pool.",
        vec![(String::new(), f64::from(sv.threads))],
    );
    e.metric(
        "ringfeed_pool_allotted_threads",
        "gauge",
        "Decode threads allotted to streams.",
        vec![(String::new(), f64::from(sv.active_threads))],
    );
    e.metric(
        "ringfeed_pool_busy_threads",
        "gauge",
        "Threads' worth of decode work over the last interval.",
        vec![(String::new(), sv.busy)],
    );
}

/// Object storage's and the shard cache's families.
fn remote_metrics(e: &mut Exposition, r: &RemoteSnapshot) {
    for (name, kind, help, v) in [
        (
            "ringfeed_remote_fetches_total",
            "counter",
            "Objects downloaded completely from object storage.",
            r.fetches as f64,
        ),
        (
            "ringfeed_remote_bytes_total",
            "counter",
            "Bytes received from object storage.",
            r.bytes as f64,
        ),
        (
            "ringfeed_remote_retries_total",
            "counter",
            "Remote requests or downloads repeated after a failure.",
            r.retries as f64,
        ),
        (
            "ringfeed_remote_errors_total",
            "counter",
            "Remote objects that failed for good.",
            r.errors as f64,
        ),
        (
            "ringfeed_remote_hits_total",
            "counter",
            "Shard reads that found their shard in the cache.",
            r.hits as f64,
        ),
        (
            "ringfeed_remote_misses_total",
            "counter",
            "Shard reads that waited for a download.",
            r.misses as f64,
        ),
        (
            "ringfeed_remote_evictions_total",
            "counter",
            "Cached shards removed to make room.",
            r.evictions as f64,
        ),
        (
            "ringfeed_remote_rejected_total",
            "counter",
            "Cached or downloaded shards that failed their check.",
            r.rejected as f64,
        ),
        (
            "ringfeed_remote_wait_seconds_total",
            "counter",
            "Time readers waited for downloads.",
            r.wait_s,
        ),
        (
            "ringfeed_remote_cache_bytes",
            "gauge",
            "Bytes in the shard cache.",
            r.cache_bytes as f64,
        ),
        (
            "ringfeed_remote_cache_limit_bytes",
            "gauge",
            "The shard cache's bound.",
            r.cache_limit as f64,
        ),
        (
            "ringfeed_remote_fetch_concurrency",
            "gauge",
            "Shard downloads allowed at once (the autotuner's, or --fetch-concurrency).",
            r.fetch_concurrency as f64,
        ),
    ] {
        e.metric(name, kind, help, vec![(String::new(), v)]);
    }
}

/// One family per stream figure, labelled by stream, pid and dataset.
fn stream_metrics(e: &mut Exposition, streams: &[StreamSnapshot]) {
    let ids: Vec<String> = streams
        .iter()
        .map(|t| {
            format!(
                "stream=\"{}\",pid=\"{}\",dataset=\"{}\"",
                t.stream,
                t.pid,
                label(&t.dataset)
            )
        })
        .collect();
    let per = |f: &dyn Fn(&StreamSnapshot) -> Option<f64>| -> Vec<(String, f64)> {
        streams
            .iter()
            .zip(&ids)
            .filter_map(|(t, l)| f(t).map(|v| (l.clone(), v)))
            .collect()
    };
    e.metric(
        "ringfeed_stream_samples_total",
        "counter",
        "Samples delivered.",
        per(&|t| Some(t.samples as f64)),
    );
    e.metric(
        "ringfeed_stream_batches_total",
        "counter",
        "Batches delivered.",
        per(&|t| Some(t.batches as f64)),
    );
    e.metric(
        "ringfeed_stream_skipped_total",
        "counter",
        "Samples left out under on_error=skip.",
        per(&|t| Some(t.skipped as f64)),
    );
    e.metric(
        "ringfeed_stream_samples_per_second",
        "gauge",
        "Samples delivered per second over the last interval.",
        per(&|t| Some(t.samples_per_s)),
    );
    e.metric(
        "ringfeed_stream_wait_ratio",
        "gauge",
        "Share of the training loop's time spent waiting for data, net of its wait behind its own GPU (client-measured).",
        per(&|t| t.wait),
    );
    e.metric(
        "ringfeed_stream_gpu_wait_ratio",
        "gauge",
        "Share of the training loop's time spent waiting behind its own GPU inside next(), not for data (client-measured).",
        per(&|t| t.gpu_wait),
    );
    e.metric(
        "ringfeed_stream_gpu_decode_share",
        "gauge",
        "Share of each batch offered to the client's GPU decoder (hybrid decode).",
        per(&|t| t.gpu_share),
    );
    e.metric(
        "ringfeed_stream_gpu_decoded_samples_total",
        "counter",
        "Samples handed to the client's GPU decoder since the stream opened.",
        per(&|t| t.gpu_samples.map(|n| n as f64)),
    );
    e.metric(
        "ringfeed_stream_gpu_decode_seconds_per_sample",
        "gauge",
        "The client's host time per GPU-decoded sample over the last interval.",
        per(&|t| t.gpu_decode_us.map(|u| u / 1e6)),
    );
    e.metric(
        "ringfeed_stream_busy_ratio",
        "gauge",
        "Share of the stream's allotted decode threads' time spent on its samples over the last interval.",
        per(&|t| t.busy),
    );
    e.metric(
        "ringfeed_stream_step_seconds",
        "gauge",
        "The training loop's compute time per step (client-measured).",
        per(&|t| t.step_ms.map(|m| m / 1e3)),
    );
    e.metric(
        "ringfeed_stream_threads",
        "gauge",
        "Decode threads allotted to the stream.",
        per(&|t| Some(f64::from(t.threads))),
    );
    e.metric(
        "ringfeed_stream_depth",
        "gauge",
        "Batches the stream may have in flight.",
        per(&|t| Some(f64::from(t.depth))),
    );
    e.metric(
        "ringfeed_stream_epoch",
        "gauge",
        "The current epoch.",
        per(&|t| Some(t.epoch as f64)),
    );
    let mut slots = Vec::new();
    let mut stages = Vec::new();
    for (t, l) in streams.iter().zip(&ids) {
        for (state, n) in [
            ("free", t.slots.free),
            ("filling", t.slots.filling),
            ("ready", t.slots.ready),
            ("held", t.slots.held),
        ] {
            slots.push((format!("{l},state=\"{state}\""), f64::from(n)));
        }
        for (stage, us) in [
            ("read", t.stage_us.read),
            ("decode", t.stage_us.decode),
            ("transform", t.stage_us.transform),
            ("write", t.stage_us.write),
        ] {
            stages.push((format!("{l},stage=\"{stage}\""), us / 1e6));
        }
    }
    e.metric("ringfeed_stream_slots", "gauge", "Ring slots by state.", slots);
    e.metric(
        "ringfeed_stream_stage_seconds",
        "gauge",
        "Mean time per sample in each pipeline stage over the last interval.",
        stages,
    );
}

/// A `--metrics` address that names no socket address.
#[derive(Debug, thiserror::Error)]
pub enum MetricsAddrError {
    /// `HOST:PORT` did not resolve.
    #[error("--metrics {given:?}: {source}; give PORT (on 127.0.0.1) or HOST:PORT")]
    Resolve { given: String, source: std::io::Error },
    /// It resolved to nothing.
    #[error("--metrics {0:?} resolves to no address")]
    NoAddress(String),
}

/// Parses `--metrics`: `PORT` (loopback) or `HOST:PORT`.
pub fn metrics_addr(s: &str) -> Result<std::net::SocketAddr, MetricsAddrError> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    use std::net::ToSocketAddrs;
    s.to_socket_addrs()
        .map_err(|source| MetricsAddrError::Resolve {
            given: s.to_owned(),
            source,
        })?
        .next()
        .ok_or_else(|| MetricsAddrError::NoAddress(s.to_owned()))
}

/// Serves `GET /metrics` on `listener` until dropped.
pub async fn serve_metrics(listener: tokio::net::TcpListener, snapshot: Arc<dyn Fn() -> Snapshot + Send + Sync>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            continue;
        };
        let snapshot = Arc::clone(&snapshot);
        tokio::spawn(async move {
            // One request per connection; its head must fit in 8 KiB and arrive within 5 s.
            let mut buf = vec![0u8; 8192];
            let mut n = 0;
            let head = tokio::time::timeout(Duration::from_secs(5), async {
                while n < buf.len() {
                    match conn.read(&mut buf[n..]).await {
                        Ok(0) | Err(_) => return false,
                        Ok(k) => n += k,
                    }
                    if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                        return true;
                    }
                }
                false
            })
            .await;
            if head != Ok(true) {
                return;
            }
            let line = buf[..n].split(|&b| b == b'\r').next().unwrap_or_default();
            let (status, kind, body) = if line.starts_with(b"GET /metrics ") || line.starts_with(b"GET /metrics?") {
                (
                    "200 OK",
                    "text/plain; version=0.0.4; charset=utf-8",
                    prometheus(&snapshot()),
                )
            } else {
                (
                    "404 Not Found",
                    "text/plain; charset=utf-8",
                    "ringfeed serves GET /metrics only\n".to_owned(),
                )
            };
            let reply = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(reply.as_bytes()).await;
            let _ = conn.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringfeed_format::control::{ServerSnapshot, SlotCounts, StageTimes, StreamSnapshot};

    fn sample() -> Snapshot {
        Snapshot {
            server: ServerSnapshot {
                version: "ringfeed 0.1.0".into(),
                pid: 10,
                uptime_s: 3.5,
                cores: 16,
                cpu_budget: 15,
                threads: 16,
                active_threads: 6,
                busy: 5.5,
                remote: None,
            },
            streams: vec![StreamSnapshot {
                stream: 2,
                pid: 42,
                dataset: "/d/\"x\"".into(),
                batch_size: 256,
                epoch: 1,
                run: 2,
                slots: SlotCounts {
                    free: 1,
                    filling: 2,
                    ready: 0,
                    held: 1,
                },
                autotune: false,
                threads: 6,
                depth: 3,
                samples: 100,
                batches: 4,
                skipped: 1,
                samples_per_s: 4000.0,
                wait: None,
                gpu_wait: Some(0.25),
                busy: Some(0.97),
                step_ms: Some(50.0),
                stage_us: StageTimes {
                    read: 1.0,
                    decode: 900.0,
                    transform: 150.0,
                    write: 0.5,
                },
                tune: "pinned".into(),
                limit: "fed, the GPU is the limit: ...".into(),
                gpu_share: Some(0.25),
                gpu_samples: Some(640),
                gpu_decode_us: Some(91.0),
                pixel_samples: None,
            }],
        }
    }

    #[test]
    fn the_table_shows_each_stream() {
        let t = render(&sample());
        assert!(t.contains("budget 15"), "{t}");
        assert!(t.contains("6*"), "pinned threads are marked: {t}");
        assert!(t.contains("1/2/0/1"), "{t}");
        assert!(t.contains("gpu decode: share 25%, 640 samples"), "{t}");
        assert!(t.contains("tune: pinned"), "{t}");
        assert!(t.contains("limit: fed, the GPU is the limit"), "{t}");
        assert!(t.contains(" 25.0 "), "the wait behind the GPU, apart: {t}");
        assert!(t.contains(" 97 "), "the busy share: {t}");
    }

    #[test]
    fn the_fetch_concurrency_is_in_top_and_the_metrics() {
        let mut s = sample();
        s.server.remote = Some(RemoteSnapshot {
            fetch_concurrency: 6,
            ..Default::default()
        });
        let t = render(&s);
        assert!(t.contains("6 at once (tuned)"), "{t}");
        assert!(prometheus(&s).contains("ringfeed_remote_fetch_concurrency 6"));
        s.server.remote.as_mut().unwrap().fetch_pinned = true;
        assert!(render(&s).contains("6 at once (pinned)"));
    }

    #[test]
    fn prometheus_text_escapes_labels_and_leaves_out_unknown_values() {
        let p = prometheus(&sample());
        assert!(p.contains(r#"dataset="/d/\"x\"""#), "{p}");
        assert!(
            !p.contains("ringfeed_stream_wait_ratio{"),
            "no wait without client stats: {p}"
        );
        assert!(p.contains("ringfeed_stream_step_seconds{stream=\"2\",pid=\"42\",dataset=\"/d/\\\"x\\\"\"} 0.05"));
        assert!(p.contains("state=\"filling\"} 2"), "{p}");
        assert!(p.contains("ringfeed_stream_gpu_wait_ratio{stream=\"2\""), "{p}");
        assert!(p.contains("ringfeed_stream_gpu_decode_share{stream=\"2\""), "{p}");
        assert!(
            p.contains("ringfeed_stream_busy_ratio{stream=\"2\",pid=\"42\",dataset=\"/d/\\\"x\\\"\"} 0.97"),
            "{p}"
        );
    }

    #[test]
    fn metrics_addresses_default_to_loopback() {
        assert_eq!(metrics_addr("9464").unwrap().to_string(), "127.0.0.1:9464");
        assert_eq!(metrics_addr("0.0.0.0:80").unwrap().to_string(), "0.0.0.0:80");
        assert!(metrics_addr("nope").unwrap_err().to_string().contains("--metrics"));
    }
}
