//! Progress for long-running commands: a bar with rate and ETA on a terminal, plain periodic
//! lines otherwise (CI logs, `nohup`), or nothing.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum ProgressMode {
    /// A bar when stderr is a terminal, plain lines otherwise.
    Auto,
    Bar,
    /// One line every 10 seconds on stderr.
    Lines,
    None,
}

/// Interval between plain progress lines.
const LINE_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug)]
enum Inner {
    Bar(ProgressBar),
    Lines(Mutex<LineState>),
    None,
}

#[derive(Debug)]
struct LineState {
    total: u64,
    done: u64,
    started: Instant,
    last: Instant,
}

/// A progress reporter for `total` items.
#[derive(Debug)]
pub struct Progress {
    inner: Inner,
}

impl Progress {
    pub fn new(mode: ProgressMode) -> Self {
        let mode = match mode {
            ProgressMode::Auto if std::io::stderr().is_terminal() => ProgressMode::Bar,
            ProgressMode::Auto => ProgressMode::Lines,
            m => m,
        };
        let now = Instant::now();
        let inner = match mode {
            ProgressMode::Bar => {
                let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
                bar.set_style(
                    ProgressStyle::with_template(
                        "{spinner} {elapsed_precise} [{wide_bar}] {pos}/{len} {per_sec} ETA {eta} {msg}",
                    )
                    .expect("the template is valid")
                    .progress_chars("=> "),
                );
                bar.enable_steady_tick(Duration::from_millis(200));
                Inner::Bar(bar)
            }
            ProgressMode::Lines => Inner::Lines(Mutex::new(LineState {
                total: 0,
                done: 0,
                started: now,
                last: now,
            })),
            ProgressMode::None | ProgressMode::Auto => Inner::None,
        };
        Progress { inner }
    }

    /// A status message for a phase without a count (listing, writing the index).
    pub fn message(&self, msg: &str) {
        match &self.inner {
            Inner::Bar(b) => b.set_message(msg.to_owned()),
            Inner::Lines(_) => eprintln!("{msg}"),
            Inner::None => {}
        }
    }

    /// Starts counting towards `total` items.
    pub fn start(&self, total: u64) {
        match &self.inner {
            Inner::Bar(b) => {
                b.set_length(total);
                b.set_position(0);
                b.reset_elapsed();
                b.set_message("");
            }
            Inner::Lines(s) => {
                let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
                s.total = total;
                s.done = 0;
                s.started = Instant::now();
                s.last = s.started;
            }
            Inner::None => {}
        }
    }

    /// One more item done; `bytes` written so far and `skipped` items so far.
    pub fn advance(&self, bytes: u64, skipped: usize) {
        match &self.inner {
            Inner::Bar(b) => {
                b.inc(1);
                let secs = b.elapsed().as_secs_f64().max(1e-3);
                let skip = if skipped > 0 {
                    format!(", {skipped} skipped")
                } else {
                    String::new()
                };
                if b.position().is_multiple_of(64) || b.position() == b.length().unwrap_or(0) {
                    b.set_message(format!("{:.1} MB/s{skip}", bytes as f64 / 1e6 / secs));
                }
            }
            Inner::Lines(s) => {
                let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
                s.done += 1;
                let now = Instant::now();
                if now.duration_since(s.last) >= LINE_EVERY {
                    s.last = now;
                    eprintln!(
                        "{}",
                        line(s.done, s.total, now.duration_since(s.started), bytes, skipped)
                    );
                }
            }
            Inner::None => {}
        }
    }

    /// Sets the absolute position (verify reports bytes checked so far).
    pub fn set_position(&self, done: u64) {
        match &self.inner {
            Inner::Bar(b) => b.set_position(done),
            Inner::Lines(s) => {
                let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
                s.done = done;
                let now = Instant::now();
                if now.duration_since(s.last) >= LINE_EVERY {
                    s.last = now;
                    eprintln!("{}", line(s.done, s.total, now.duration_since(s.started), 0, 0));
                }
            }
            Inner::None => {}
        }
    }

    /// Clears the bar.
    pub fn finish(&self) {
        if let Inner::Bar(b) = &self.inner {
            b.finish_and_clear();
        }
    }
}

/// A plain progress line: `1200/8000 (15%), 412.0/s, 38.1 MB/s, ETA 16s`.
fn line(done: u64, total: u64, elapsed: Duration, bytes: u64, skipped: usize) -> String {
    let secs = elapsed.as_secs_f64().max(1e-3);
    let rate = done as f64 / secs;
    let pct = if total > 0 {
        done as f64 * 100.0 / total as f64
    } else {
        0.0
    };
    let eta = if rate > 0.0 {
        (total.saturating_sub(done)) as f64 / rate
    } else {
        f64::INFINITY
    };
    let mut s = format!("{done}/{total} ({pct:.0}%), {rate:.1}/s");
    if bytes > 0 {
        s.push_str(&format!(", {:.1} MB/s", bytes as f64 / 1e6 / secs));
    }
    if skipped > 0 {
        s.push_str(&format!(", {skipped} skipped"));
    }
    if eta.is_finite() {
        s.push_str(&format!(", ETA {:.0}s", eta));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_line_has_rate_and_eta() {
        let l = line(100, 400, Duration::from_secs(10), 5_000_000, 2);
        assert_eq!(l, "100/400 (25%), 10.0/s, 0.5 MB/s, 2 skipped, ETA 30s");
    }
}
