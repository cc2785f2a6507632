//! The packed dataset format, version 1.0 (`proto/shard.md` is the normative text).
//!
//! This module is the single Rust truth for the on-disk layout: magics, versions, structure sizes
//! and field offsets are defined here once, checked against the spec by `const` assertions and the
//! vectors in `proto/vectors/shard/`, and used by the [`writer`], the [`reader`] and [`verify`].
//!
//! Invariants:
//! - Structures are decoded from byte slices with explicit little-endian reads, never by casting
//!   pointers, so a reader is correct on any alignment and any host byte order.
//! - Decoding a structure checks its magic, major version and CRC before any other field is used.
//! - Every error names the file and, where there is one, the byte offset of the problem.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

pub mod reader;
pub mod verify;
pub mod writer;

pub use reader::{Dataset, PackedSample};
pub use verify::{SampleCheckError, VerifyError, VerifyOptions, VerifyReport, verify, verify_dataset};
pub use writer::{DatasetWriter, WriteSummary, WriterOptions};

/// Major version written and read by this implementation.
pub const MAJOR: u16 = 1;
/// Minor version written by this implementation; any minor of [`MAJOR`] is read.
pub const MINOR: u16 = 0;

/// File name of the dataset index inside a dataset directory.
pub const INDEX_FILE: &str = "index.rfi";
/// Extension of shard files.
pub const SHARD_EXT: &str = "rfs";
/// Default record alignment: one page, so a record never shares a page with the previous one.
pub const DEFAULT_RECORD_ALIGN: u32 = 4096;
/// Smallest allowed record alignment.
pub const MIN_RECORD_ALIGN: u32 = 8;
/// Largest allowed record alignment.
pub const MAX_RECORD_ALIGN: u32 = 1 << 20;
/// Longest allowed shard file name.
pub const MAX_SHARD_NAME: usize = 255;

pub const SHARD_MAGIC: [u8; 8] = *b"RFSHARD\0";
pub const SHARD_END_MAGIC: [u8; 8] = *b"RFSHEND\0";
pub const INDEX_MAGIC: [u8; 8] = *b"RFINDEX\0";
pub const INDEX_END_MAGIC: [u8; 8] = *b"RFIXEND\0";

pub const SHARD_HEADER_LEN: usize = 64;
pub const SHARD_FOOTER_LEN: usize = 64;
pub const RECORD_ENTRY_LEN: usize = 16;
pub const INDEX_HEADER_LEN: usize = 128;
pub const INDEX_FOOTER_LEN: usize = 32;
pub const SHARD_ENTRY_LEN: usize = 32;
pub const CLASS_ENTRY_LEN: usize = 16;
pub const SAMPLE_ENTRY_LEN: usize = 32;

// The spec's tables, restated: each structure's CRC field is its last 4 bytes.
const _: () = assert!(SHARD_HEADER_LEN == 64 && SHARD_FOOTER_LEN == 64);
const _: () = assert!(INDEX_HEADER_LEN == 128 && INDEX_FOOTER_LEN == 32);
const _: () = assert!(RECORD_ENTRY_LEN == 8 + 4 + 4);
const _: () = assert!(SHARD_ENTRY_LEN == 8 + 4 + 4 + 8 + 4 + 4);
const _: () = assert!(CLASS_ENTRY_LEN == 8 + 4 + 4);
const _: () = assert!(SAMPLE_ENTRY_LEN == 8 + 8 + 4 + 4 + 4 + 4);

/// Rounds `x` up to a multiple of `a` (a power of two). `None` on overflow.
pub const fn align_up(x: u64, a: u64) -> Option<u64> {
    match x.checked_add(a - 1) {
        Some(v) => Some(v & !(a - 1)),
        None => None,
    }
}

/// CRC-32C (Castagnoli) of `bytes`, the checksum used everywhere in the format.
pub fn crc(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// Why a packed dataset could not be read, or failed verification.
///
/// Each variant maps to one of the spec's error kinds ([`ShardError::kind`]); the vectors in
/// `proto/vectors/shard/cases.json` pin which kind each damage produces.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{}", not_a_dataset(dir))]
    NotADataset { dir: PathBuf },
    #[error("{} at byte {offset}: bad magic in the {what}: expected {:?}, found {:?}", path.display(), Bytes(expected), Bytes(found))]
    BadMagic {
        path: PathBuf,
        offset: u64,
        what: &'static str,
        expected: [u8; 8],
        found: [u8; 8],
    },
    #[error(
        "{} at byte {offset}: the {what} has format version {major}.{minor}, but this ringfeed reads version {MAJOR}.x only; repack the dataset with this ringfeed (`ringfeed pack`) or use a ringfeed release that reads version {major}",
        path.display()
    )]
    UnsupportedVersion {
        path: PathBuf,
        /// Where the version field is.
        offset: u64,
        what: &'static str,
        major: u16,
        minor: u16,
    },
    #[error("{} at byte {offset}: {what} checksum mismatch: stored {stored:#010x}, computed {computed:#010x}", path.display())]
    Checksum {
        path: PathBuf,
        offset: u64,
        what: String,
        stored: u32,
        computed: u32,
    },
    #[error("{} at byte {offset}: truncated: {detail}", path.display())]
    Truncated { path: PathBuf, offset: u64, detail: String },
    #[error("{} at byte {offset}: {detail}", path.display())]
    Corrupt { path: PathBuf, offset: u64, detail: String },
    #[error("sample {index} is out of range: {} has {len} samples", dir.display())]
    OutOfRange { dir: PathBuf, index: u64, len: u64 },
    /// A mapped file changed on disk after it was opened: reading it raised SIGBUS (see
    /// [`crate::fault`]). `offset` is where the first fault in the file happened.
    #[error(
        "{} at byte {offset}: the file changed on disk after it was opened, reading it failed (SIGBUS) while reading {what}; {now}. Re-pack or restore the dataset, then open it again (a server keeps the open dataset until every stream reading it has ended)",
        path.display()
    )]
    Changed {
        path: PathBuf,
        offset: u64,
        what: String,
        now: String,
    },
}

impl ShardError {
    /// The spec's error kind: `io`, `bad_magic`, `unsupported_version`, `checksum`, `truncated`,
    /// `corrupt` (and `out_of_range` for a bad sample index, which is a caller error).
    pub fn kind(&self) -> &'static str {
        match self {
            ShardError::Io { .. } | ShardError::NotADataset { .. } => "io",
            ShardError::BadMagic { .. } => "bad_magic",
            ShardError::UnsupportedVersion { .. } => "unsupported_version",
            ShardError::Checksum { .. } => "checksum",
            ShardError::Truncated { .. } | ShardError::Changed { .. } => "truncated",
            ShardError::Corrupt { .. } => "corrupt",
            ShardError::OutOfRange { .. } => "out_of_range",
        }
    }

    /// The file and byte offset the error points at, where it has them.
    pub fn location(&self) -> (Option<&Path>, Option<u64>) {
        match self {
            ShardError::Io { path, .. } => (Some(path), None),
            ShardError::NotADataset { dir } | ShardError::OutOfRange { dir, .. } => (Some(dir), None),
            ShardError::BadMagic { path, offset, .. }
            | ShardError::UnsupportedVersion { path, offset, .. }
            | ShardError::Checksum { path, offset, .. }
            | ShardError::Truncated { path, offset, .. }
            | ShardError::Corrupt { path, offset, .. }
            | ShardError::Changed { path, offset, .. } => (Some(path), Some(*offset)),
        }
    }

    pub fn io(path: &Path, source: io::Error) -> Self {
        ShardError::Io {
            path: path.to_owned(),
            source,
        }
    }

    pub fn corrupt(path: &Path, offset: u64, detail: impl Into<String>) -> Self {
        ShardError::Corrupt {
            path: path.to_owned(),
            offset,
            detail: detail.into(),
        }
    }

    pub fn truncated(path: &Path, offset: u64, detail: impl Into<String>) -> Self {
        ShardError::Truncated {
            path: path.to_owned(),
            offset,
            detail: detail.into(),
        }
    }
}

/// The message for a path that holds no `index.rfi`. A directory of images is the usual case (an
/// ImageFolder given where its packed copy was meant), so the hint packs that directory, as
/// `SRC`, into a sibling `NAME.rf` and names what to open then.
fn not_a_dataset(dir: &Path) -> String {
    if dir.is_dir() {
        let packed = match dir.file_name() {
            Some(name) => {
                let mut name = name.to_owned();
                name.push(".rf");
                dir.with_file_name(name).display().to_string()
            }
            None => "OUT".to_owned(),
        };
        format!(
            "{} is not a packed ringfeed dataset: it has no {INDEX_FILE} (if it holds images, pack them \
             with `ringfeed pack {} {packed}` and open {packed})",
            dir.display(),
            dir.display(),
        )
    } else {
        format!("no dataset at {}: no such directory", dir.display())
    }
}

/// Prints a magic number as an escaped byte string.
struct Bytes<'a>(&'a [u8]);

impl fmt::Debug for Bytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b\"{}\"", self.0.escape_ascii())
    }
}

/// Little-endian field access on a structure's bytes. Callers pass a slice of exactly the
/// structure's length, so the fixed offsets below are always in bounds.
pub(crate) mod le {
    pub(crate) fn u16(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes([b[at], b[at + 1]])
    }
    pub(crate) fn u32(b: &[u8], at: usize) -> u32 {
        let mut v = [0; 4];
        v.copy_from_slice(&b[at..at + 4]);
        u32::from_le_bytes(v)
    }
    pub(crate) fn u64(b: &[u8], at: usize) -> u64 {
        let mut v = [0; 8];
        v.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(v)
    }
    pub(crate) fn i64(b: &[u8], at: usize) -> i64 {
        u64(b, at) as i64
    }
    pub(crate) fn magic(b: &[u8]) -> [u8; 8] {
        let mut v = [0; 8];
        v.copy_from_slice(&b[..8]);
        v
    }
    pub(crate) fn put_u16(b: &mut [u8], at: usize, v: u16) {
        b[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn put_u32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn put_u64(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
}

/// Checks magic, major version and the trailing CRC of one fixed-size structure.
///
/// `bytes` is exactly the structure; `offset` is where it starts in `path`. The CRC covers every
/// byte before the last four. The version is checked before the CRC, so a file from a future
/// major version is reported as such rather than as corrupt.
pub(crate) fn check_struct(
    path: &Path,
    offset: u64,
    bytes: &[u8],
    what: &'static str,
    magic: [u8; 8],
) -> Result<(), ShardError> {
    let found = le::magic(bytes);
    if found != magic {
        return Err(ShardError::BadMagic {
            path: path.to_owned(),
            offset,
            what,
            expected: magic,
            found,
        });
    }
    let n = bytes.len();
    let stored = le::u32(bytes, n - 4);
    let computed = crc(&bytes[..n - 4]);
    let (major, minor) = (le::u16(bytes, 8), le::u16(bytes, 10));
    if major != MAJOR {
        // A flipped bit in the version field also lands here; the CRC says which it is.
        if stored == computed {
            return Err(ShardError::UnsupportedVersion {
                path: path.to_owned(),
                offset: offset + 8,
                what,
                major,
                minor,
            });
        }
    }
    if stored != computed {
        return Err(ShardError::Checksum {
            path: path.to_owned(),
            offset: offset + (n as u64 - 4),
            what: what.to_owned(),
            stored,
            computed,
        });
    }
    Ok(())
}

/// Shard header (`proto/shard.md`, "ShardHeader").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardHeader {
    pub minor: u16,
    pub record_align: u32,
    pub shard_number: u32,
}

impl ShardHeader {
    pub fn encode(&self) -> [u8; SHARD_HEADER_LEN] {
        let mut b = [0u8; SHARD_HEADER_LEN];
        b[..8].copy_from_slice(&SHARD_MAGIC);
        le::put_u16(&mut b, 8, MAJOR);
        le::put_u16(&mut b, 10, self.minor);
        le::put_u32(&mut b, 12, self.record_align);
        le::put_u32(&mut b, 16, self.shard_number);
        let c = crc(&b[..60]);
        le::put_u32(&mut b, 60, c);
        b
    }

    pub fn decode(path: &Path, b: &[u8]) -> Result<Self, ShardError> {
        check_struct(path, 0, b, "shard header", SHARD_MAGIC)?;
        let h = ShardHeader {
            minor: le::u16(b, 10),
            record_align: le::u32(b, 12),
            shard_number: le::u32(b, 16),
        };
        let a = h.record_align;
        if !a.is_power_of_two() || !(MIN_RECORD_ALIGN..=MAX_RECORD_ALIGN).contains(&a) {
            return Err(ShardError::corrupt(
                path,
                12,
                format!("record_align {a} is not a power of two in {MIN_RECORD_ALIGN}..={MAX_RECORD_ALIGN}"),
            ));
        }
        Ok(h)
    }

    /// Where the first record starts.
    pub fn data_offset(&self) -> u64 {
        // Cannot overflow: record_align is at most 1 MiB.
        align_up(SHARD_HEADER_LEN as u64, u64::from(self.record_align)).unwrap_or(u64::MAX)
    }
}

/// Shard footer (`proto/shard.md`, "ShardFooter").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardFooter {
    pub minor: u16,
    pub record_count: u32,
    pub table_offset: u64,
    pub file_len: u64,
    pub table_crc: u32,
    pub body_crc: u32,
}

impl ShardFooter {
    pub fn encode(&self) -> [u8; SHARD_FOOTER_LEN] {
        let mut b = [0u8; SHARD_FOOTER_LEN];
        b[..8].copy_from_slice(&SHARD_END_MAGIC);
        le::put_u16(&mut b, 8, MAJOR);
        le::put_u16(&mut b, 10, self.minor);
        le::put_u32(&mut b, 12, self.record_count);
        le::put_u64(&mut b, 16, self.table_offset);
        le::put_u64(&mut b, 24, self.file_len);
        le::put_u32(&mut b, 32, self.table_crc);
        le::put_u32(&mut b, 36, self.body_crc);
        let c = crc(&b[..60]);
        le::put_u32(&mut b, 60, c);
        b
    }

    /// Decodes the footer found at `offset` and checks it against the file's real length.
    pub fn decode(path: &Path, offset: u64, b: &[u8], actual_len: u64) -> Result<Self, ShardError> {
        check_struct(path, offset, b, "shard footer", SHARD_END_MAGIC)?;
        let f = ShardFooter {
            minor: le::u16(b, 10),
            record_count: le::u32(b, 12),
            table_offset: le::u64(b, 16),
            file_len: le::u64(b, 24),
            table_crc: le::u32(b, 32),
            body_crc: le::u32(b, 36),
        };
        if f.file_len != actual_len {
            return Err(ShardError::truncated(
                path,
                offset + 24,
                format!("the footer records {} bytes but the file has {actual_len}", f.file_len),
            ));
        }
        let table_end = u64::from(f.record_count)
            .checked_mul(RECORD_ENTRY_LEN as u64)
            .and_then(|n| n.checked_add(f.table_offset))
            .and_then(|n| align_up(n, 8));
        if table_end != Some(offset) {
            return Err(ShardError::corrupt(
                path,
                offset + 16,
                format!(
                    "record table at {} with {} entries does not end where the footer starts ({offset})",
                    f.table_offset, f.record_count
                ),
            ));
        }
        Ok(f)
    }
}

/// One entry of a shard's record table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordEntry {
    pub offset: u64,
    pub length: u32,
    pub crc: u32,
}

impl RecordEntry {
    pub fn encode(&self) -> [u8; RECORD_ENTRY_LEN] {
        let mut b = [0u8; RECORD_ENTRY_LEN];
        le::put_u64(&mut b, 0, self.offset);
        le::put_u32(&mut b, 8, self.length);
        le::put_u32(&mut b, 12, self.crc);
        b
    }

    pub fn decode(b: &[u8]) -> Self {
        RecordEntry {
            offset: le::u64(b, 0),
            length: le::u32(b, 8),
            crc: le::u32(b, 12),
        }
    }
}

/// Index header (`proto/shard.md`, "IndexHeader").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IndexHeader {
    pub minor: u16,
    pub flags: u32,
    pub sample_count: u64,
    pub shard_count: u32,
    pub class_count: u32,
    pub shards_offset: u64,
    pub classes_offset: u64,
    pub samples_offset: u64,
    pub heap_offset: u64,
    pub heap_len: u64,
    pub info_offset: u64,
    pub info_len: u64,
}

impl IndexHeader {
    pub fn encode(&self) -> [u8; INDEX_HEADER_LEN] {
        let mut b = [0u8; INDEX_HEADER_LEN];
        b[..8].copy_from_slice(&INDEX_MAGIC);
        le::put_u16(&mut b, 8, MAJOR);
        le::put_u16(&mut b, 10, self.minor);
        le::put_u32(&mut b, 12, self.flags);
        le::put_u64(&mut b, 16, self.sample_count);
        le::put_u32(&mut b, 24, self.shard_count);
        le::put_u32(&mut b, 28, self.class_count);
        le::put_u64(&mut b, 32, self.shards_offset);
        le::put_u64(&mut b, 40, self.classes_offset);
        le::put_u64(&mut b, 48, self.samples_offset);
        le::put_u64(&mut b, 56, self.heap_offset);
        le::put_u64(&mut b, 64, self.heap_len);
        le::put_u64(&mut b, 72, self.info_offset);
        le::put_u64(&mut b, 80, self.info_len);
        let c = crc(&b[..124]);
        le::put_u32(&mut b, 124, c);
        b
    }

    /// Decodes the header and checks that every section lies inside `0..body_end`.
    pub fn decode(path: &Path, b: &[u8], body_end: u64) -> Result<Self, ShardError> {
        check_struct(path, 0, b, "index header", INDEX_MAGIC)?;
        let h = IndexHeader {
            minor: le::u16(b, 10),
            flags: le::u32(b, 12),
            sample_count: le::u64(b, 16),
            shard_count: le::u32(b, 24),
            class_count: le::u32(b, 28),
            shards_offset: le::u64(b, 32),
            classes_offset: le::u64(b, 40),
            samples_offset: le::u64(b, 48),
            heap_offset: le::u64(b, 56),
            heap_len: le::u64(b, 64),
            info_offset: le::u64(b, 72),
            info_len: le::u64(b, 80),
        };
        let sections: [(&str, u64, u64, Option<u64>); 5] = [
            (
                "shard table",
                32,
                h.shards_offset,
                u64::from(h.shard_count).checked_mul(SHARD_ENTRY_LEN as u64),
            ),
            (
                "class table",
                40,
                h.classes_offset,
                u64::from(h.class_count).checked_mul(CLASS_ENTRY_LEN as u64),
            ),
            (
                "sample table",
                48,
                h.samples_offset,
                h.sample_count.checked_mul(SAMPLE_ENTRY_LEN as u64),
            ),
            ("heap", 56, h.heap_offset, Some(h.heap_len)),
            ("info", 72, h.info_offset, Some(h.info_len)),
        ];
        for (what, field_at, start, len) in sections {
            let end = len.and_then(|l| start.checked_add(l));
            match end {
                Some(end) if start >= INDEX_HEADER_LEN as u64 && end <= body_end => {}
                _ => {
                    return Err(ShardError::corrupt(
                        path,
                        field_at,
                        format!(
                            "the {what} (offset {start}, {} bytes) lies outside the index body (0..{body_end})",
                            len.map_or("an overflowing number of".to_owned(), |l| l.to_string())
                        ),
                    ));
                }
            }
        }
        Ok(h)
    }
}

/// Index footer (`proto/shard.md`, "IndexFooter").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexFooter {
    pub minor: u16,
    pub body_crc: u32,
    pub file_len: u64,
}

impl IndexFooter {
    pub fn encode(&self) -> [u8; INDEX_FOOTER_LEN] {
        let mut b = [0u8; INDEX_FOOTER_LEN];
        b[..8].copy_from_slice(&INDEX_END_MAGIC);
        le::put_u16(&mut b, 8, MAJOR);
        le::put_u16(&mut b, 10, self.minor);
        le::put_u32(&mut b, 12, self.body_crc);
        le::put_u64(&mut b, 16, self.file_len);
        let c = crc(&b[..28]);
        le::put_u32(&mut b, 28, c);
        b
    }

    pub fn decode(path: &Path, offset: u64, b: &[u8], actual_len: u64) -> Result<Self, ShardError> {
        check_struct(path, offset, b, "index footer", INDEX_END_MAGIC)?;
        let f = IndexFooter {
            minor: le::u16(b, 10),
            body_crc: le::u32(b, 12),
            file_len: le::u64(b, 16),
        };
        if f.file_len != actual_len {
            return Err(ShardError::truncated(
                path,
                offset + 16,
                format!("the footer records {} bytes but the file has {actual_len}", f.file_len),
            ));
        }
        Ok(f)
    }
}

/// One entry of the index's shard table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardEntry {
    pub name_offset: u64,
    pub name_len: u32,
    pub record_count: u32,
    pub file_len: u64,
    pub body_crc: u32,
}

impl ShardEntry {
    pub fn encode(&self) -> [u8; SHARD_ENTRY_LEN] {
        let mut b = [0u8; SHARD_ENTRY_LEN];
        le::put_u64(&mut b, 0, self.name_offset);
        le::put_u32(&mut b, 8, self.name_len);
        le::put_u32(&mut b, 12, self.record_count);
        le::put_u64(&mut b, 16, self.file_len);
        le::put_u32(&mut b, 24, self.body_crc);
        b
    }

    pub fn decode(b: &[u8]) -> Self {
        ShardEntry {
            name_offset: le::u64(b, 0),
            name_len: le::u32(b, 8),
            record_count: le::u32(b, 12),
            file_len: le::u64(b, 16),
            body_crc: le::u32(b, 24),
        }
    }
}

/// One entry of the index's class table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassEntry {
    pub name_offset: u64,
    pub name_len: u32,
}

impl ClassEntry {
    pub fn encode(&self) -> [u8; CLASS_ENTRY_LEN] {
        let mut b = [0u8; CLASS_ENTRY_LEN];
        le::put_u64(&mut b, 0, self.name_offset);
        le::put_u32(&mut b, 8, self.name_len);
        b
    }

    pub fn decode(b: &[u8]) -> Self {
        ClassEntry {
            name_offset: le::u64(b, 0),
            name_len: le::u32(b, 8),
        }
    }
}

/// One entry of the index's sample table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleEntry {
    pub label: i64,
    pub heap_offset: u64,
    pub key_len: u32,
    pub meta_len: u32,
    pub shard: u32,
    pub record: u32,
}

impl SampleEntry {
    pub fn encode(&self) -> [u8; SAMPLE_ENTRY_LEN] {
        let mut b = [0u8; SAMPLE_ENTRY_LEN];
        le::put_u64(&mut b, 0, self.label as u64);
        le::put_u64(&mut b, 8, self.heap_offset);
        le::put_u32(&mut b, 16, self.key_len);
        le::put_u32(&mut b, 20, self.meta_len);
        le::put_u32(&mut b, 24, self.shard);
        le::put_u32(&mut b, 28, self.record);
        b
    }

    pub fn decode(b: &[u8]) -> Self {
        SampleEntry {
            label: le::i64(b, 0),
            heap_offset: le::u64(b, 8),
            key_len: le::u32(b, 16),
            meta_len: le::u32(b, 20),
            shard: le::u32(b, 24),
            record: le::u32(b, 28),
        }
    }
}

/// Checks a shard file name from the index: a plain file name inside the dataset directory.
pub(crate) fn valid_shard_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SHARD_NAME
        && name != b"."
        && name != b".."
        && !name.iter().any(|&c| c == b'/' || c == 0)
}

/// The shard file name `pack` gives shard `n`.
pub fn shard_file_name(n: u32) -> String {
    format!("shard-{n:06}.{SHARD_EXT}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_check_value() {
        // The spec's check value pins the polynomial and reflection.
        assert_eq!(crc(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn structures_round_trip() {
        let p = Path::new("x");
        let h = ShardHeader {
            minor: 0,
            record_align: 4096,
            shard_number: 7,
        };
        assert_eq!(ShardHeader::decode(p, &h.encode()).unwrap(), h);
        let e = SampleEntry {
            label: -1,
            heap_offset: 9,
            key_len: 3,
            meta_len: 2,
            shard: 1,
            record: 5,
        };
        assert_eq!(SampleEntry::decode(&e.encode()), e);
    }

    #[test]
    fn future_major_is_reported_as_a_version_not_as_corruption() {
        let mut b = ShardHeader {
            minor: 0,
            record_align: 4096,
            shard_number: 0,
        }
        .encode();
        le::put_u16(&mut b, 8, 2);
        let c = crc(&b[..60]);
        le::put_u32(&mut b, 60, c);
        let err = ShardHeader::decode(Path::new("s.rfs"), &b).unwrap_err();
        assert_eq!(err.kind(), "unsupported_version");
        assert!(err.to_string().contains("version 2.0"), "{err}");
        assert!(err.to_string().contains("reads version 1.x"), "{err}");
    }

    #[test]
    fn newer_minor_is_read() {
        let h = ShardHeader {
            minor: 9,
            record_align: 64,
            shard_number: 0,
        };
        assert_eq!(ShardHeader::decode(Path::new("s"), &h.encode()).unwrap().minor, 9);
    }

    #[test]
    fn shard_names() {
        assert!(valid_shard_name(b"shard-000001.rfs"));
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b", &[b'a'; 256]] {
            assert!(!valid_shard_name(bad));
        }
    }
}
