//! `ringfeed top`: a running server's streams, refreshed every second.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};

#[derive(clap::Args, Debug)]
pub(crate) struct TopArgs {
    /// The server's socket [default: as for `serve`].
    #[arg(long, value_name = "PATH")]
    pub(crate) socket: Option<PathBuf>,
    /// Print one snapshot and exit (for scripts).
    #[arg(long)]
    pub(crate) once: bool,
    /// Print snapshots as JSON lines (with --once: one line).
    #[arg(long)]
    pub(crate) json: bool,
    /// Seconds between refreshes.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub(crate) interval: f64,
}

pub(crate) fn run_top(a: TopArgs) -> Result<ExitCode> {
    use std::io::{IsTerminal, Write};
    if !(0.05..=3600.0).contains(&a.interval) {
        bail!("--interval {} must be between 0.05 and 3600 seconds", a.interval);
    }
    let socket = a.socket.unwrap_or_else(ringfeed_serve::socket::default_socket_path);
    let mut observer = ringfeed_serve::observe::Observer::connect(&socket)?;
    let live = !a.once && !a.json && std::io::stdout().is_terminal();
    let mut out = std::io::stdout().lock();
    loop {
        let snap = observer.snapshot(&socket)?;
        let text = if a.json {
            serde_json::to_string(&snap)? + "\n"
        } else {
            ringfeed_serve::observe::render(&snap)
        };
        if live {
            // Home, clear, redraw.
            write!(out, "\x1b[H\x1b[2J{text}")?;
        } else {
            write!(out, "{text}")?;
        }
        out.flush()?;
        if a.once {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(a.interval));
    }
}
