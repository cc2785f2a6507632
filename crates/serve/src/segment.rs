//! A ring segment: one sealed, pre-faulted memfd, mapped shared.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use memmap2::MmapMut;
use rustix::fs::{MemfdFlags, SealFlags};

use ringfeed_format::ring::layout::{LayoutError, RingLayout, SLOT_HEADER_LEN, SlotHeader};

/// Why a segment could not be created.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    #[error("creating the ring's memfd ({bytes} bytes): {source}; lower `slots` or `batch_size`")]
    Create { bytes: u64, source: std::io::Error },
    #[error(transparent)]
    Layout(#[from] LayoutError),
}

/// The shared memory of one stream's ring.
///
/// The mapping is written by the decode threads through [`Segment::slot_ptr`] while a slot is
/// FILLING, and read by the client after `ready`. The struct itself never hands out references
/// into slots, so no Rust reference aliases memory another process may write.
#[derive(Debug)]
pub struct Segment {
    layout: RingLayout,
    fd: OwnedFd,
    map: MmapMut,
    /// Base address of `map`, kept as a raw pointer so that threads can write disjoint slot
    /// regions without taking `&mut self`.
    base: *mut u8,
}

// SAFETY: `Segment` owns its mapping for its whole life; the raw `base` pointer is only used to
// derive pointers into disjoint slot regions, whose exclusive use the stream's slot state machine
// guarantees (ring.md rule 1: a FILLING slot is written only by the jobs of its batch, each job
// to its own samples). Sharing the struct between threads is therefore sound.
unsafe impl Send for Segment {}
// SAFETY: as above; `&Segment` gives no safe access to slot memory.
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates, seals, maps and pre-faults a segment for `layout`, and writes its header page.
    pub fn create(layout: RingLayout, name: &str) -> Result<Self, SegmentError> {
        let bytes = layout.header.segment_len;
        let err = |e: std::io::Error| SegmentError::Create { bytes, source: e };
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(|e| err(e.into()))?;
        rustix::fs::ftruncate(&fd, bytes).map_err(|e| err(e.into()))?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(|e| err(e.into()))?;
        let file = File::from(fd.try_clone().map_err(err)?);
        // SAFETY: the memfd was just created by this process and sealed against shrinking, so
        // the mapped length stays valid for the mapping's life; the only other process that
        // maps it is the client, which by protocol writes only slots it holds (ring.md rule 7).
        let mut map = unsafe { MmapMut::map_mut(&file) }.map_err(err)?;
        prefault(&mut map);
        map[..ringfeed_format::ring::layout::HEADER_LEN as usize].copy_from_slice(&layout.header.encode());
        let base = map.as_mut_ptr();
        Ok(Segment { layout, fd, map, base })
    }

    /// The layout this segment was made for.
    pub fn layout(&self) -> &RingLayout {
        &self.layout
    }

    /// The memfd, to pass to the client.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Length of the mapping.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Whether the segment is empty (never: a layout has at least one slot).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Pointer to byte `offset` of slot `slot`, valid for `len` bytes.
    ///
    /// # Panics
    /// If the range is outside the slot: callers compute ranges from the layout, so this is a
    /// bug, not bad input.
    pub fn slot_ptr(&self, slot: u32, offset: u64, len: u64) -> *mut u8 {
        assert!(slot < self.layout.header.slot_count, "slot {slot} out of range");
        assert!(
            offset + len <= self.layout.header.slot_stride,
            "range {offset}+{len} outside the slot"
        );
        let at = self.layout.slot_offset(slot) + offset;
        // SAFETY: `at + len` is inside the mapping (slot_offset + slot_stride <= segment_len,
        // checked by the asserts and the layout's construction), so the pointer stays in bounds.
        unsafe { self.base.add(at as usize) }
    }

    /// Writes the header of `slot`.
    ///
    /// # Safety
    /// The caller must own `slot` exclusively (FILLING, all of its jobs finished), per ring.md
    /// rule 1.
    pub unsafe fn write_slot_header(&self, slot: u32, header: &SlotHeader) {
        let bytes = header.encode();
        let dst = self.slot_ptr(slot, 0, SLOT_HEADER_LEN as u64);
        // SAFETY: `dst` is valid for SLOT_HEADER_LEN bytes (slot_ptr) and the caller owns the
        // slot, so nothing else writes these bytes concurrently.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
    }

    /// Reads back the header of `slot` (tests and diagnostics).
    pub fn read_slot_header(&self, slot: u32) -> Result<SlotHeader, LayoutError> {
        let mut b = [0u8; SLOT_HEADER_LEN];
        let src = self.slot_ptr(slot, 0, SLOT_HEADER_LEN as u64);
        // SAFETY: `src` is valid for SLOT_HEADER_LEN bytes; copying out through a raw pointer
        // creates no reference to memory the client may write.
        unsafe { std::ptr::copy_nonoverlapping(src, b.as_mut_ptr(), b.len()) };
        SlotHeader::decode(&b)
    }
}

/// Touches every page once so that no batch pays for first-touch faults (ring.md rule 8).
fn prefault(map: &mut MmapMut) {
    let len = map.len();
    // SAFETY: the range is exactly the mapping we own; MADV_POPULATE_WRITE only faults pages in.
    let populated =
        unsafe { rustix::mm::madvise(map.as_mut_ptr().cast(), len, rustix::mm::Advice::LinuxPopulateWrite) };
    if populated.is_err() {
        // Kernels before 5.14 lack MADV_POPULATE_WRITE: write one byte per page instead.
        for at in (0..len).step_by(4096) {
            map[at] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringfeed_format::ring::{DType, FieldSpec, SegmentHeader};

    #[test]
    fn create_map_and_read_back() {
        let fields = [FieldSpec {
            name: "image".into(),
            dtype: DType::U8,
            shape: vec![4, 6, 3],
        }];
        let layout = RingLayout::new(&fields, 2, 3).unwrap();
        let seg = Segment::create(layout.clone(), "test").unwrap();
        assert_eq!(seg.len(), layout.header.segment_len);
        // The header page is readable through a second, independent mapping of the fd.
        let file = File::from(seg.fd().try_clone_to_owned().unwrap());
        // SAFETY: a read-only mapping of a sealed memfd that outlives it.
        let other = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        assert_eq!(SegmentHeader::decode(&other[..4096]).unwrap(), layout.header);
        let h = SlotHeader {
            seq: 1,
            run: 1,
            epoch: 0,
            batch: 0,
            count: 2,
            skipped: 0,
            ..Default::default()
        };
        // SAFETY: no other user of slot 2 in this test.
        unsafe { seg.write_slot_header(2, &h) };
        assert_eq!(seg.read_slot_header(2).unwrap(), h);
        let at = layout.slot_offset(2) as usize;
        assert_eq!(SlotHeader::decode(&other[at..at + 64]).unwrap(), h);
    }

    #[test]
    fn the_memfd_is_sealed() {
        let fields = [FieldSpec {
            name: "label".into(),
            dtype: DType::I64,
            shape: vec![],
        }];
        let seg = Segment::create(RingLayout::new(&fields, 1, 1).unwrap(), "test").unwrap();
        assert!(
            rustix::fs::ftruncate(seg.fd(), 1).is_err(),
            "a client must not be able to shrink the ring"
        );
    }
}
