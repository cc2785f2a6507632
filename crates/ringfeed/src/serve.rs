//! `ringfeed serve`: the sidecar.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use ringfeed_decode::Limits;

use crate::common::parse_size;
use crate::remote::RemoteArgs;

#[derive(clap::Args, Debug)]
pub(crate) struct ServeArgs {
    /// Socket path [default: $RINGFEED_SOCKET, else $XDG_RUNTIME_DIR/ringfeed/ringfeed.sock, else
    /// /tmp/ringfeed-$UID/ringfeed.sock].
    #[arg(long, value_name = "PATH")]
    pub(crate) socket: Option<PathBuf>,
    /// Decode threads in the pool shared by all clients: the most that can ever run (default:
    /// all cores). The autotuner decides how many of them work.
    #[arg(long, short = 'j', value_name = "N", default_value_t = 0)]
    pub(crate) threads: usize,
    /// Decode threads the autotuner may use for all streams together [default: the cores minus
    /// one per training process on the node].
    #[arg(long, value_name = "N")]
    pub(crate) cpu_budget: Option<u32>,
    /// Largest image accepted, in pixels.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_pixels)]
    pub(crate) max_pixels: u64,
    /// Exit once the last client has left and none came back within SECS seconds (what a
    /// sidecar started by the Python client uses).
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "5")]
    pub(crate) exit_when_idle: Option<f64>,
    /// Only serve datasets under this directory (repeatable).
    #[arg(long, value_name = "DIR")]
    pub(crate) data_root: Vec<PathBuf>,
    /// Pin each decode thread to its own CPU, from the last CPU of the process's affinity mask
    /// down (with --threads N, N CPUs; run the training processes on the others).
    #[arg(long)]
    pub(crate) pin_threads: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics; ADDR is PORT (on 127.0.0.1) or HOST:PORT.
    #[arg(long, value_name = "ADDR", value_parser = ringfeed_serve::observe::metrics_addr)]
    pub(crate) metrics: Option<std::net::SocketAddr>,
    /// Largest shared-memory ring one client may ask for, e.g. 16GiB.
    #[arg(long, value_name = "SIZE", default_value = "16GiB", value_parser = parse_size)]
    pub(crate) max_ring_bytes: u64,
    /// While an image folder or manifest is being listed for a client, tell the client how far
    /// the listing is every SECS seconds.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub(crate) open_progress: f64,
    #[command(flatten)]
    pub(crate) remote: RemoteArgs,
}

pub(crate) fn run_serve(a: ServeArgs) -> Result<ExitCode> {
    let socket = a.socket.unwrap_or_else(ringfeed_serve::socket::default_socket_path);
    let data_roots = a
        .data_root
        .iter()
        .map(|d| std::fs::canonicalize(d).with_context(|| format!("--data-root {}", d.display())))
        .collect::<Result<Vec<_>>>()?;
    if let Some(s) = a.exit_when_idle.filter(|s| !(0.0..=86400.0).contains(s)) {
        bail!("--exit-when-idle {s} must be between 0 and 86400 seconds");
    }
    if !(0.001..=3600.0).contains(&a.open_progress) {
        bail!(
            "--open-progress {} must be between 0.001 and 3600 seconds",
            a.open_progress
        );
    }
    let config = ringfeed_serve::server::ServeConfig {
        open_progress: std::time::Duration::from_secs_f64(a.open_progress),
        socket: socket.clone(),
        threads: a.threads,
        limits: Limits {
            max_pixels: a.max_pixels,
        },
        exit_when_idle: a.exit_when_idle.map(std::time::Duration::from_secs_f64),
        data_roots,
        max_ring_bytes: a.max_ring_bytes,
        cpu_budget: a.cpu_budget,
        metrics: a.metrics,
        pin_threads: a.pin_threads,
        #[cfg(feature = "remote")]
        remote: a.remote.config()?,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ringfeed-control")
        .enable_all()
        .build()
        .context("starting the control runtime")?;
    runtime.block_on(async {
        let listener = ringfeed_serve::server::bind(&socket)?;
        eprintln!("ringfeed: serving on {}", socket.display());
        ringfeed_serve::server::run(config, listener, std::future::pending()).await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
