//! Listing an image folder or manifest for serving: off the control plane, once however many
//! streams ask for it, with progress for the clients that wait.
//!
//! Listing a large tree takes seconds to minutes (ImageNet's 1.28 M files on a network
//! filesystem). It runs on a blocking thread (`spawn_blocking`), so the runtime that serves every
//! other connection, observer and ring is never held up by it. The first stream to open a tree
//! starts its listing; others opening the same tree meanwhile (the ranks of a node start
//! together) wait for that one instead of listing again. While they wait, each sends its client
//! an `opening` message about every second (control.md, protocol 1.2), which tells a person how
//! far the listing is and keeps the client's receive timeout from firing.
//!
//! Invariants:
//! - An [`Opening`] is in [`Openings`] from the moment its listing starts until it finishes or
//!   every waiter has gone; `waiters` changes only under the map's lock, so a stream never joins
//!   a listing that has been cancelled.
//! - When the last waiter goes before the listing ends (every client disconnected, or the server
//!   is shutting down), the listing is cancelled: it stops at its next directory.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ringfeed_source::listing::{InputError, InputKind};
use ringfeed_source::{FilesSource, Source};

/// Why a listing gave no source: one value, cloned for every stream that waited for it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ListingError {
    /// Every stream that asked for the listing went away before it ended.
    #[error("listing {} was cancelled: every stream that asked for it has gone", .0.display())]
    Cancelled(PathBuf),
    /// Listing the files or indexing the tars failed.
    #[error(transparent)]
    Failed(Arc<dyn std::error::Error + Send + Sync>),
}

impl ListingError {
    /// The failure `e` of a listing or indexing.
    pub fn failed(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        ListingError::Failed(Arc::new(e))
    }
}

/// What a listing ends with.
pub type Listed = Result<Arc<dyn Source>, ListingError>;

/// How often a waiting client hears of the listing's progress (`serve --open-progress`).
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Listings in progress, by the same key as the server's open sources.
#[derive(Debug, Default)]
pub struct Openings {
    map: Mutex<BTreeMap<String, Arc<Opening>>>,
}

/// One listing in progress.
#[derive(Debug)]
pub struct Opening {
    /// Files (or manifest lines) listed so far.
    listed: AtomicU64,
    /// Set when no stream waits any more: the listing stops.
    cancel: AtomicBool,
    /// Streams waiting for the result. Changed only under [`Openings::map`]'s lock.
    waiters: Mutex<usize>,
    result: OnceLock<Listed>,
    /// Becomes `true` once `result` is set.
    done: tokio::sync::watch::Sender<bool>,
    started: Instant,
}

impl Opening {
    /// Files (or manifest lines) listed so far.
    pub fn listed(&self) -> u64 {
        self.listed.load(Ordering::Relaxed)
    }

    /// Time since the listing started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Waits until the listing has finished and returns its result.
    pub async fn result(&self) -> Listed {
        let mut rx = self.done.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|done| *done).await;
        self.result.get().expect("`done` is set after `result`").clone()
    }
}

/// A stream's place among an opening's waiters; leaving last cancels the listing.
#[derive(Debug)]
pub struct Waiter<'a> {
    openings: &'a Openings,
    key: String,
    pub opening: Arc<Opening>,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut map = self.openings.map.lock().unwrap_or_else(|p| p.into_inner());
        let mut waiters = self.opening.waiters.lock().unwrap_or_else(|p| p.into_inner());
        *waiters -= 1;
        if *waiters == 0 && self.opening.result.get().is_none() {
            self.opening.cancel.store(true, Ordering::Relaxed);
            if map.get(&self.key).is_some_and(|o| Arc::ptr_eq(o, &self.opening)) {
                map.remove(&self.key);
            }
        }
    }
}

impl Openings {
    /// Joins the listing of `path` under `key`, starting it on a blocking thread if none is in
    /// progress (with `columns`, a manifest keeps its rows' other columns for 1.9's fields).
    /// `publish` runs on that thread with a successful result, before the listing
    /// leaves the map (the caller caches the source there, so a later open finds one or the
    /// other).
    pub fn join(
        self: &Arc<Self>,
        key: &str,
        path: PathBuf,
        kind: InputKind,
        columns: bool,
        publish: impl FnOnce(&Arc<dyn Source>) + Send + 'static,
    ) -> Waiter<'_> {
        let list = move |cancel: &AtomicBool, listed: &AtomicU64, started: Instant| match FilesSource::open_with_columns(
            &path, kind, columns, cancel, listed,
        ) {
            Ok(s) => {
                tracing::info!(
                    "listed {} in {:.1} s: {} samples, {} classes{}",
                    path.display(),
                    started.elapsed().as_secs_f64(),
                    s.len(),
                    s.class_names().len(),
                    match s.ignored() {
                        0 => String::new(),
                        n => format!(", {n} files ignored for their extension"),
                    }
                );
                Ok(Arc::new(s) as Arc<dyn Source>)
            }
            Err(InputError::Interrupted) => Err(ListingError::Cancelled(path.clone())),
            Err(e) => Err(ListingError::failed(e)),
        };
        self.join_with(key, list, publish)
    }

    /// [`Openings::join`] for any source: `open(cancel, listed, started)` runs on the blocking
    /// thread, adds what it has listed to `listed` and stops early once `cancel` is set (1.3:
    /// WebDataset tars being indexed).
    pub fn join_with(
        self: &Arc<Self>,
        key: &str,
        open: impl FnOnce(&AtomicBool, &AtomicU64, Instant) -> Listed + Send + 'static,
        publish: impl FnOnce(&Arc<dyn Source>) + Send + 'static,
    ) -> Waiter<'_> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(o) = map.get(key) {
            *o.waiters.lock().unwrap_or_else(|p| p.into_inner()) += 1;
            return Waiter {
                openings: self,
                key: key.to_owned(),
                opening: Arc::clone(o),
            };
        }
        let opening = Arc::new(Opening {
            listed: AtomicU64::new(0),
            cancel: AtomicBool::new(false),
            waiters: Mutex::new(1),
            result: OnceLock::new(),
            done: tokio::sync::watch::channel(false).0,
            started: Instant::now(),
        });
        map.insert(key.to_owned(), Arc::clone(&opening));
        drop(map);
        let (o, openings, k) = (Arc::clone(&opening), Arc::clone(self), key.to_owned());
        tokio::task::spawn_blocking(move || {
            let result = open(&o.cancel, &o.listed, o.started);
            if let Ok(s) = &result {
                publish(s);
            }
            let _ = o.result.set(result);
            o.done.send_replace(true);
            let mut map = openings.map.lock().unwrap_or_else(|p| p.into_inner());
            if map.get(&k).is_some_and(|x| Arc::ptr_eq(x, &o)) {
                map.remove(&k);
            }
        });
        Waiter {
            openings: self,
            key: key.to_owned(),
            opening,
        }
    }

    /// Listings in progress (for tests).
    pub fn in_progress(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}
