//! Storage faults: turning SIGBUS on a mapped dataset file into an error.
//!
//! Shards and LMDB data files are read through read-only memory maps. If a file is truncated
//! after it was mapped (or a page of it cannot be read: an I/O error, a network file system that
//! went away), the next load from a lost page raises SIGBUS, whose default action kills the
//! whole server and every client with it. This module makes that fault recoverable:
//!
//! - Each mapping that the readers hand out slices of is registered as a [`Watch`]: its address
//!   range, in a registry that a signal handler can search without locks or allocation.
//! - [`install`] puts a process-wide SIGBUS handler in place (once; later calls do nothing). When
//!   the kernel reports a fault (`BUS_ADRERR`) at an address inside a watched range, the handler
//!   records the offset in the watch, maps anonymous zero pages over the rest of the range
//!   (`mmap(MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS)`, read-only) and returns: the faulting load
//!   runs again and reads zeros. Any other SIGBUS goes to the handler that was there before
//!   (Rust's own stack-overflow handler, usually), or to the default action.
//! - Readers check [`Watch::fault`] after each sample has been used (and before handing one
//!   out): a watch that faulted stays faulted, so the zeros are never served as data and every
//!   later sample of that file fails at once with an error naming the file and the offset.
//!
//! Why these choices:
//! - The fault is recorded in the *watch* (shared atomics), not per thread: after the first fault
//!   the zero pages are visible to every thread, and a thread that reads them takes no fault at
//!   all. Only a mark on the mapping tells that thread its bytes are not the file's.
//! - The whole rest of the range is replaced at once, so a sequential read (a CRC, a decoder)
//!   over a cut record takes one fault rather than one per page, and the mapping is split into
//!   at most two areas.
//! - `mmap` is not on POSIX's list of async-signal-safe functions, but on Linux it is one system
//!   call with no user-space state (glibc's wrapper takes no lock and allocates nothing); the
//!   handler saves and restores `errno`, which the call may set. `sigaction` and `raise`, used
//!   when chaining, are async-signal-safe.
//! - `SA_ONSTACK`: Rust gives every thread it starts an alternate signal stack, for its own
//!   SIGSEGV/SIGBUS stack-overflow handler, which we chain to. Running on that stack keeps the
//!   overflow report working when the SIGBUS is a stack overflow, and our handler needs only a
//!   few hundred bytes. On threads without an alternate stack the flag is ignored.
//! - The handler is installed lazily by the sources ([`ringfeed_source::PackedSource::open`],
//!   [`ringfeed_source::lmdb::LmdbSource::open`]), that is by the server and `pack` (reading an
//!   LMDB), never merely by linking the library. It touches no other signal, so the tokio
//!   SIGINT/SIGTERM handling of `serve` is unaffected.
//!
//! What is not caught: a cut inside a page that stays mapped (the kernel zeroes the tail of the
//! page holding the new end of file, without a fault), and a file rewritten in place with the
//! same length. Both read wrong bytes without a signal; the packed record CRC-32C (`check_crc`,
//! on by default) catches them. See `docs/storage-faults.md`.

use std::cell::UnsafeCell;
use std::io;
use std::mem::MaybeUninit;
use std::path::Path;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Mutex, OnceLock, PoisonError};

/// `Slot::fault` when the watch has not faulted.
const NO_FAULT: u64 = u64::MAX;

/// Slots per registry chunk.
const CHUNK_SLOTS: usize = 64;

/// One registered address range. Written only under [`REGISTER`], read by the signal handler
/// through the sequence lock `seq`.
#[derive(Debug)]
struct Slot {
    /// Sequence lock over `start` and `end`: odd while a writer changes them. The handler reads
    /// the range only between two equal even values.
    seq: AtomicUsize,
    /// First byte of the range.
    start: AtomicUsize,
    /// One past the last byte; `0` when the slot is free.
    end: AtomicUsize,
    /// Offset from `start` of the first fault, or [`NO_FAULT`].
    fault: AtomicU64,
    /// Held by a live [`Watch`] (changed under [`REGISTER`] only).
    used: AtomicBool,
}

impl Slot {
    const fn new() -> Self {
        Slot {
            seq: AtomicUsize::new(0),
            start: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
            fault: AtomicU64::new(NO_FAULT),
            used: AtomicBool::new(false),
        }
    }

    /// Sets the range (`end == 0`: no range). Caller holds [`REGISTER`].
    fn publish(&self, start: usize, end: usize) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        // SYNC POINT: the odd sequence number is visible before any of the new range, so a
        // handler that reads a torn range also reads a changed sequence number and skips it.
        fence(Ordering::Release);
        self.start.store(start, Ordering::Relaxed);
        self.end.store(end, Ordering::Relaxed);
        self.fault.store(NO_FAULT, Ordering::Relaxed);
        // SYNC POINT: Release publishes the range (and the cleared fault) to the handler, which
        // loads this even number with Acquire before reading the range.
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// The range, if it is set and was read consistently. Async-signal-safe.
    fn range(&self) -> Option<(usize, usize)> {
        // SYNC POINT: pairs with the Release store that ends `publish`.
        let before = self.seq.load(Ordering::Acquire);
        if before % 2 == 1 {
            return None;
        }
        let start = self.start.load(Ordering::Relaxed);
        let end = self.end.load(Ordering::Relaxed);
        // SYNC POINT: the range loads complete before the second sequence load.
        fence(Ordering::Acquire);
        let after = self.seq.load(Ordering::Relaxed);
        (before == after && end != 0).then_some((start, end))
    }
}

/// A fixed array of slots; chunks form a list that only grows, so the handler can walk it while
/// another thread registers.
#[derive(Debug)]
struct Chunk {
    slots: [Slot; CHUNK_SLOTS],
    next: AtomicPtr<Chunk>,
}

impl Chunk {
    const fn new() -> Self {
        Chunk {
            slots: [const { Slot::new() }; CHUNK_SLOTS],
            next: AtomicPtr::new(ptr::null_mut()),
        }
    }

    fn next(&self) -> Option<&'static Chunk> {
        // SYNC POINT: Acquire pairs with the Release store that links a new chunk, so its
        // initialised slots are visible.
        let p = self.next.load(Ordering::Acquire);
        // SAFETY: `next` is null or points to a chunk leaked by `Watch::register` (never freed).
        unsafe { p.as_ref() }
    }
}

/// The registry's first chunk; more are leaked as needed (64 mappings each, never freed).
static FIRST: Chunk = Chunk::new();

/// Serialises registration and release; the signal handler never takes it.
static REGISTER: Mutex<()> = Mutex::new(());

/// A registered read-only mapping. Dropping it removes the range from the registry, so it must
/// be dropped before the mapping is unmapped (declare it before the map in a struct).
#[derive(Debug)]
pub struct Watch {
    slot: &'static Slot,
    /// Offset in the file of the range's first byte.
    file_offset: u64,
    /// Length of the range, in bytes.
    len: usize,
}

impl Watch {
    /// Registers the `len` bytes at `start`, which map a file from offset `file_offset`.
    ///
    /// # Safety
    /// `start..start + len` is a read-only mapping of a file, page-aligned at `start`, that stays
    /// mapped until this watch is dropped, and whose readers accept that its bytes become zeros
    /// at any time after a SIGBUS in it (they must check [`Watch::fault`] before trusting what
    /// they read).
    pub unsafe fn register(start: *const u8, len: usize, file_offset: u64) -> Watch {
        let start = start as usize;
        let end = start.saturating_add(len);
        let _held = REGISTER.lock().unwrap_or_else(PoisonError::into_inner);
        let mut chunk: &'static Chunk = &FIRST;
        loop {
            if let Some(slot) = chunk.slots.iter().find(|s| !s.used.load(Ordering::Relaxed)) {
                slot.used.store(true, Ordering::Relaxed);
                slot.publish(start, end);
                return Watch { slot, file_offset, len };
            }
            chunk = match chunk.next() {
                Some(next) => next,
                None => {
                    let new: &'static Chunk = Box::leak(Box::new(Chunk::new()));
                    // SYNC POINT: Release publishes the new chunk's slots to the handler's
                    // Acquire load in `Chunk::next`.
                    chunk.next.store(ptr::from_ref(new).cast_mut(), Ordering::Release);
                    new
                }
            };
        }
    }

    /// Where the first SIGBUS in this mapping happened: the offset in the file. `None` while the
    /// mapping is intact.
    pub fn fault(&self) -> Option<u64> {
        // SYNC POINT: SeqCst pairs with the handler's SeqCst store, which precedes the mmap that
        // puts zeros in place. A thread that read those zeros did so after the mmap, whose TLB
        // shootdown orders it after the store, so it sees the fault here.
        match self.slot.fault.load(Ordering::SeqCst) {
            NO_FAULT => None,
            at => Some(self.file_offset + at),
        }
    }

    /// Length of the watched range when it was registered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the watched range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _held = REGISTER.lock().unwrap_or_else(PoisonError::into_inner);
        self.slot.publish(0, 0);
        self.slot.used.store(false, Ordering::Relaxed);
    }
}

/// Registers every mapping of the file at `path` in this process (found in `/proc/self/maps` by
/// device and inode): for mappings made by C code (LMDB) whose address is not exposed.
///
/// # Safety
/// As for [`Watch::register`], for every mapping of the file that exists now: each is read-only
/// and stays mapped until its watch is dropped.
pub unsafe fn watch_file_mappings(path: &Path) -> io::Result<Vec<Watch>> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)?;
    let (major, minor) = (libc::major(meta.dev()), libc::minor(meta.dev()));
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut watches = Vec::new();
    for line in maps.lines() {
        // "start-end perms offset major:minor inode path"
        let mut fields = line.split_ascii_whitespace();
        let (Some(range), Some(_perms), Some(offset), Some(dev), Some(inode)) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            continue;
        };
        let parsed = (|| {
            let (start, end) = range.split_once('-')?;
            let (maj, min) = dev.split_once(':')?;
            Some((
                usize::from_str_radix(start, 16).ok()?,
                usize::from_str_radix(end, 16).ok()?,
                u64::from_str_radix(offset, 16).ok()?,
                u32::from_str_radix(maj, 16).ok()?,
                u32::from_str_radix(min, 16).ok()?,
                inode.parse::<u64>().ok()?,
            ))
        })();
        let Some((start, end, offset, maj, min, ino)) = parsed else {
            continue;
        };
        if ino == meta.ino() && maj == major && min == minor && end > start {
            // SAFETY: the caller guarantees every current mapping of this file is read-only and
            // outlives its watch; `/proc/self/maps` gives page-aligned ranges.
            watches.push(unsafe { Watch::register(start as *const u8, end - start, offset) });
        }
    }
    Ok(watches)
}

/// The action that was in place before ours, for chaining.
struct PrevAction(UnsafeCell<MaybeUninit<libc::sigaction>>);

// SAFETY: written once, by `install`, before `PREV_SET` is set with Release and before the
// handler that reads it is installed; only read after that.
unsafe impl Sync for PrevAction {}

static PREV: PrevAction = PrevAction(UnsafeCell::new(MaybeUninit::uninit()));
static PREV_SET: AtomicBool = AtomicBool::new(false);
/// The page size, for rounding the faulting address down.
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// Installs the SIGBUS handler described in the module docs. Idempotent and thread-safe: the
/// first call installs it, later calls return the first call's result.
pub fn install() -> io::Result<()> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    let installed = INSTALLED.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        // SAFETY: reads the current action into PREV, which no handler reads yet (PREV_SET
        // is false and ours is not installed).
        if unsafe { libc::sigaction(libc::SIGBUS, ptr::null(), (*PREV.0.get()).as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        // SYNC POINT: Release publishes PREV to the handler's Acquire load of PREV_SET.
        PREV_SET.store(true, Ordering::Release);
        // SAFETY: an all-zero sigaction is a valid value (no handler, empty mask, no flags);
        // every field that matters is set below.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: `sa_mask` is a valid sigset_t owned by `action`; the handler is an
        // `extern "C"` function with the SA_SIGINFO signature.
        let rc = unsafe {
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGBUS, &action, ptr::null_mut())
        };
        if rc != 0 {
            return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        Ok(())
    });
    installed.map_err(io::Error::from_raw_os_error)
}

/// The watched range holding `addr`, if any. Async-signal-safe: atomics only.
fn find(addr: usize) -> Option<(&'static Slot, usize, usize)> {
    let mut chunk: &'static Chunk = &FIRST;
    loop {
        for slot in &chunk.slots {
            if let Some((start, end)) = slot.range()
                && (start..end).contains(&addr)
            {
                return Some((slot, start, end));
            }
        }
        chunk = chunk.next()?;
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: __errno_location returns this thread's errno, always valid.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: the kernel passes a valid siginfo_t for an SA_SIGINFO handler.
    if !unsafe { recover(info) } {
        // SAFETY: forwarding the kernel's own arguments.
        unsafe { chain(sig, info, ctx) };
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Handles a fault inside a watched range; false if the signal is not ours.
///
/// # Safety
/// `info` is null or the siginfo_t of the SIGBUS being handled.
unsafe fn recover(info: *mut libc::siginfo_t) -> bool {
    // SAFETY: caller's contract.
    let Some(info) = (unsafe { info.as_ref() }) else {
        return false;
    };
    // Only a fault the kernel raised for a load from a lost page; not one sent by `kill`
    // (si_code <= 0) nor a hardware memory error.
    if info.si_code != libc::BUS_ADRERR {
        return false;
    }
    // SAFETY: for a kernel-raised SIGBUS, si_addr is the faulting address.
    let addr = unsafe { info.si_addr() } as usize;
    let Some((slot, start, end)) = find(addr) else {
        return false;
    };
    // SYNC POINT: SeqCst, before the mmap below; see `Watch::fault`. Only the first fault is
    // kept: it is the one the error reports.
    let _ = slot
        .fault
        .compare_exchange(NO_FAULT, (addr - start) as u64, Ordering::SeqCst, Ordering::SeqCst);
    let page = PAGE.load(Ordering::Relaxed);
    let from = addr & !(page - 1);
    // SAFETY: `from..end` lies inside a registered read-only file mapping (`from >= start`
    // because `start` is page-aligned), whose owner accepted that it becomes zeros
    // (`Watch::register`'s contract). MAP_FIXED replaces exactly those pages, rounded up to the
    // end of the mapping's last page, which belongs to the same mapping.
    let p = unsafe {
        libc::mmap(
            from as *mut libc::c_void,
            end - from,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    p != libc::MAP_FAILED
}

/// Passes a SIGBUS that is not ours to the previous action.
///
/// # Safety
/// The arguments are those the kernel passed to [`on_sigbus`].
unsafe fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SYNC POINT: Acquire pairs with `install`'s Release store: PREV is fully written.
    let prev = if PREV_SET.load(Ordering::Acquire) {
        // SAFETY: PREV was initialised before PREV_SET was set, and is never written again.
        Some(unsafe { (*PREV.0.get()).assume_init_ref() })
    } else {
        None
    };
    let handler = prev.map_or(libc::SIG_DFL, |p| p.sa_sigaction);
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // SAFETY: `info` is valid (kernel-provided) or null.
        let sent = unsafe { info.as_ref() }.is_none_or(|i| i.si_code <= 0);
        if sent && handler == libc::SIG_IGN {
            return;
        }
        // Back to the default action. A fault then happens again when the handler returns and
        // the load is retried, and kills the process as it would have without us (with a core
        // dump at the right place); a signal sent by `kill` is raised again (it stays pending
        // until this handler returns).
        // SAFETY: sigaction and raise are async-signal-safe; `dfl` is a valid action.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigemptyset(&mut dfl.sa_mask);
            libc::sigaction(libc::SIGBUS, &dfl, ptr::null_mut());
            if sent {
                libc::raise(libc::SIGBUS);
            }
        }
        return;
    }
    let flags = prev.map_or(0, |p| p.sa_flags);
    if flags & libc::SA_SIGINFO != 0 {
        // SAFETY: with SA_SIGINFO, the previous handler has this signature.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: without SA_SIGINFO, the previous handler takes only the signal number.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_grows_and_reuses_slots() {
        let pages: Vec<Vec<u8>> = (0..CHUNK_SLOTS * 2 + 3).map(|_| vec![0u8; 16]).collect();
        // SAFETY: nothing faults in these heap buffers, so nothing is ever replaced; they
        // outlive the watches.
        let watches: Vec<Watch> = pages
            .iter()
            .map(|p| unsafe { Watch::register(p.as_ptr(), p.len(), 0) })
            .collect();
        for (w, p) in watches.iter().zip(&pages) {
            let addr = p.as_ptr() as usize + 3;
            let (slot, start, end) = find(addr).expect("every registered range is found");
            assert!(ptr::eq(slot, w.slot));
            assert_eq!((start, end), (p.as_ptr() as usize, p.as_ptr() as usize + 16));
            assert_eq!(w.fault(), None);
        }
        let gone = pages[5].as_ptr() as usize;
        drop(watches);
        assert!(find(gone).is_none(), "a dropped watch is forgotten");
    }
}
