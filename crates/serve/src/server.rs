//! `ringfeed serve`: the sidecar. Listens on a Unix socket, checks each peer's uid, and runs one
//! [`stream`](crate::stream) per connection over one shared decode [`Pool`].
//!
//! Shutdown: SIGINT/SIGTERM (or the caller's `shutdown` future) stops accepting, tells every
//! connection to end (each client gets a fatal `error`), waits for them, and removes the socket.
//! With `exit_when_idle`, the server also stops once its last client has left and no new one
//! arrived within the grace period.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::UnixListener;

use crate::pool::Pool;
use crate::shared::Shared;
use crate::stream::serve_connection;
use ringfeed_decode::Limits;

/// A validated server configuration.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub socket: PathBuf,
    /// Decode threads (0: all cores).
    pub threads: usize,
    pub limits: Limits,
    /// Stop when the last client has left and none came back within this long.
    pub exit_when_idle: Option<Duration>,
    /// Only datasets under these directories may be opened (empty: any).
    pub data_roots: Vec<PathBuf>,
    /// Largest ring (shared memory) one stream may ask for, in bytes.
    pub max_ring_bytes: u64,
    /// Decode threads all autotuned streams may use together (None: cores minus one per
    /// training process).
    pub cpu_budget: Option<u32>,
    /// Serve Prometheus metrics over HTTP on this address.
    pub metrics: Option<std::net::SocketAddr>,
    /// Pin each decode thread to its own CPU.
    pub pin_threads: bool,
    /// How often a client waiting for a long open (an image folder being listed) hears of its
    /// progress (`opening`, control.md 1.2).
    pub open_progress: Duration,
    /// Remote datasets: the shard cache and fetching (`ringfeed_remote`).
    #[cfg(feature = "remote")]
    pub remote: ringfeed_remote::RemoteConfig,
}

/// How long connections get to end after SIGTERM/SIGINT.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// How often the autotuner looks at the streams.
pub const TUNE_INTERVAL: Duration = Duration::from_millis(500);

/// Default `max_ring_bytes`: 16 GiB, room for 8 slots of 256 images at 448x448.
pub const DEFAULT_MAX_RING_BYTES: u64 = 16 << 30;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "{} is owned by uid {owner}, not by this user (uid {me}); choose another --socket directory",
        path.display()
    )]
    Owner { path: PathBuf, owner: u32, me: u32 },
    #[error("another ringfeed server is already listening on {}; stop it or pass another --socket", path.display())]
    InUse { path: PathBuf },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ServeError + '_ {
    move |source| ServeError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Creates the socket's directory (0700, ours) and binds the socket (0600), replacing a stale one.
pub fn bind(path: &Path) -> Result<UnixListener, ServeError> {
    let me = rustix::process::getuid().as_raw();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
        }
        let meta = std::fs::metadata(dir).map_err(io(dir))?;
        if meta.uid() != me {
            return Err(ServeError::Owner {
                path: dir.to_owned(),
                owner: meta.uid(),
                me,
            });
        }
    }
    if path.exists() {
        // A live server answers; a stale socket file from a crash does not.
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ServeError::InUse { path: path.to_owned() });
        }
        std::fs::remove_file(path).map_err(io(path))?;
    }
    let listener = UnixListener::bind(path).map_err(io(path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io(path))?;
    Ok(listener)
}

/// Runs the server on `listener` until `shutdown` completes, a signal arrives, or (with
/// `exit_when_idle`) the last client has gone.
pub async fn run(
    config: ServeConfig,
    listener: UnixListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let threads = match config.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let mut shared = Shared::new(
        Pool::new(threads, config.limits, config.pin_threads)?,
        config.limits,
        config.data_roots.clone(),
        config.max_ring_bytes,
    );
    shared.cpu_budget = config.cpu_budget;
    shared.open_progress = config.open_progress;
    #[cfg(feature = "remote")]
    {
        shared.remote = Arc::new(ringfeed_remote::Hub::new(config.remote.clone()));
    }
    let shared = Arc::new(shared);
    tracing::info!(socket = %config.socket.display(), threads, "ringfeed serving");
    let metrics = match config.metrics {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| std::io::Error::new(e.kind(), format!("--metrics {addr}: {e}; choose another port")))?;
            // The bound address, so `--metrics 0` (a port the system picks) says which it got.
            let bound = listener.local_addr()?;
            tracing::info!(%bound, "metrics on http://{bound}/metrics");
            let source = Arc::clone(&shared);
            Some(tokio::spawn(crate::observe::serve_metrics(
                listener,
                Arc::new(move || source.snapshot()),
            )))
        }
        None => None,
    };
    let tuner = tokio::spawn(crate::tune::run(
        Arc::clone(&shared) as Arc<dyn crate::tune::Target>,
        crate::tune::Config::default(),
        TUNE_INTERVAL,
    ));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    let me = rustix::process::getuid().as_raw();
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::pin!(shutdown);
    let mut served_any = false;

    loop {
        // Resolves to `true` once the server has been idle for the whole grace period, and to
        // `false` when the last client has just left (the loop then starts the grace timer).
        let idle_wait = async {
            match config.exit_when_idle {
                Some(grace) if served_any && shared.connections.load(Ordering::Acquire) == 0 => {
                    tokio::time::sleep(grace).await;
                    true
                }
                Some(_) => {
                    shared.idle.notified().await;
                    false
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(a) => a,
                    Err(e) => { tracing::warn!("accept failed: {e}"); continue; }
                };
                match stream.peer_cred() {
                    Ok(cred) if cred.uid() == me => {}
                    Ok(cred) => { tracing::warn!(uid = cred.uid(), "refused a connection from another user"); continue; }
                    Err(e) => { tracing::warn!("cannot read the peer's credentials: {e}"); continue; }
                }
                served_any = true;
                shared.connections.fetch_add(1, Ordering::AcqRel);
                let (shared, stop_rx) = (Arc::clone(&shared), stop_rx.clone());
                tasks.spawn(async move {
                    serve_connection(stream, Arc::clone(&shared), stop_rx).await;
                    shared.leave();
                });
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            expired = idle_wait => {
                if expired && shared.connections.load(Ordering::Acquire) == 0 {
                    tracing::info!("no client for the whole grace period; exiting (--exit-when-idle)");
                    break;
                }
            }
            _ = tokio::signal::ctrl_c() => { tracing::info!("SIGINT: shutting down"); break; }
            _ = sigterm.recv() => { tracing::info!("SIGTERM: shutting down"); break; }
            () = &mut shutdown => break,
        }
    }
    let _ = stop_tx.send(true);
    // A responsive client has its `shutdown` error within milliseconds; a task still running
    // after the grace period is blocked writing to a client that does not read (or creating a
    // ring), and is dropped with the runtime.
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async { while tasks.join_next().await.is_some() {} }).await;
    tuner.abort();
    if let Some(m) = metrics {
        m.abort();
    }
    let _ = std::fs::remove_file(&config.socket);
    Ok(())
}
