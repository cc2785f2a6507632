//! Token data read in place, without repacking: Megatron-LM indexed datasets (`PREFIX.bin` +
//! `PREFIX.idx`) and flat token files (nanoGPT's `train.bin`), beside ringfeed's own
//! `tokens.rft`, all behind one [`TokenSource`]. The layouts are in `proto/tokens.md`, "Foreign
//! token files".
//!
//! Opening is O(1) for each: a fixed header is parsed and the files are mapped; the Megatron
//! tables are read where a document is asked for, never scanned at open.

use std::ops::Range;
use std::path::{Path, PathBuf};

use super::TokenFile;
use crate::shard::reader::Mapped;
use crate::shard::{ShardError, le};

/// Megatron's index magic (`_INDEX_HEADER` in Megatron-Core's `indexed_dataset.py`).
pub const MEGATRON_MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";
/// Bytes before Megatron's sequence-length table: magic, u64 version, u8 dtype, two u64 counts.
const MEGATRON_HEADER_LEN: usize = 9 + 8 + 1 + 8 + 8;

/// The token type of a flat token file (`--dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum FlatDtype {
    Uint16,
    Uint32,
}

impl FlatDtype {
    pub fn width(self) -> u8 {
        match self {
            FlatDtype::Uint16 => 2,
            FlatDtype::Uint32 => 4,
        }
    }
}

/// A Megatron-LM indexed dataset, mapped.
#[derive(Debug)]
pub struct Megatron {
    idx: Mapped,
    bin: Mapped,
    /// Bytes per token: 1 (uint8), 2 (uint16) or 4 (int32).
    width: u8,
    signed: bool,
    sequences: u64,
    /// Entries of `document_indices` (documents + 1).
    doc_entries: u64,
    lengths_at: u64,
    pointers_at: u64,
    docs_at: u64,
}

impl Megatron {
    /// Opens `PREFIX.idx` and `PREFIX.bin` (`prefix` may name either file or the bare prefix).
    pub fn open(prefix: &Path) -> Result<Self, ShardError> {
        let base = strip_ext(prefix);
        let idx_path = with_ext(&base, "idx");
        let bin_path = with_ext(&base, "bin");
        let idx = Mapped::open(&idx_path)?;
        let bin = Mapped::open(&bin_path)?;
        let b: &[u8] = &idx.map;
        if b.len() < MEGATRON_HEADER_LEN {
            return Err(ShardError::truncated(
                &idx_path,
                b.len() as u64,
                "a Megatron index has at least 34 bytes",
            ));
        }
        if &b[..9] != MEGATRON_MAGIC {
            return Err(ShardError::BadMagic {
                path: idx_path,
                offset: 0,
                what: "Megatron index",
                expected: *b"MMIDIDX\0",
                found: le::magic(b),
            });
        }
        let version = le::u64(b, 9);
        if version != 1 {
            return Err(ShardError::corrupt(
                &idx_path,
                9,
                format!("Megatron index version {version}; ringfeed reads version 1"),
            ));
        }
        let (width, signed) = match b[17] {
            1 => (1, false),
            8 => (2, false),
            4 => (4, true),
            code => {
                return Err(ShardError::corrupt(
                    &idx_path,
                    17,
                    format!(
                        "Megatron dtype code {code} is not a token type ringfeed serves (1 uint8, 8 uint16, 4 int32)"
                    ),
                ));
            }
        };
        let sequences = le::u64(b, 18);
        let doc_entries = le::u64(b, 26);
        let lengths_at = MEGATRON_HEADER_LEN as u64;
        let pointers_at = sequences.checked_mul(4).and_then(|x| x.checked_add(lengths_at));
        let docs_at = pointers_at.and_then(|p| sequences.checked_mul(8).and_then(|x| x.checked_add(p)));
        let end = docs_at.and_then(|d| doc_entries.checked_mul(8).and_then(|x| x.checked_add(d)));
        match end {
            Some(e) if e <= b.len() as u64 && doc_entries >= 1 => {}
            _ => {
                return Err(ShardError::truncated(
                    &idx_path,
                    b.len() as u64,
                    format!("{sequences} sequences and {doc_entries} document entries do not fit the index"),
                ));
            }
        }
        let m = Megatron {
            idx,
            bin,
            width,
            signed,
            sequences,
            doc_entries,
            lengths_at,
            pointers_at: pointers_at.unwrap_or(0),
            docs_at: docs_at.unwrap_or(0),
        };
        if m.doc_index(0) != 0 || m.doc_index(doc_entries - 1) != sequences {
            return Err(ShardError::corrupt(
                m.idx_path(),
                m.docs_at,
                "document_indices must start at 0 and end at the sequence count",
            ));
        }
        if !m.bin.len().is_multiple_of(u64::from(width)) {
            return Err(ShardError::corrupt(
                m.bin_path(),
                m.bin.len(),
                format!("the .bin's length is not a multiple of the token width {width}"),
            ));
        }
        Ok(m)
    }

    pub fn idx_path(&self) -> &Path {
        &self.idx.path
    }

    pub fn bin_path(&self) -> &Path {
        &self.bin.path
    }

    fn doc_index(&self, d: u64) -> u64 {
        le::u64(&self.idx.map, (self.docs_at + 8 * d) as usize)
    }

    fn seq_len(&self, s: u64) -> u64 {
        u64::from(le::u32(&self.idx.map, (self.lengths_at + 4 * s) as usize))
    }

    fn seq_pointer(&self, s: u64) -> u64 {
        le::u64(&self.idx.map, (self.pointers_at + 8 * s) as usize)
    }

    /// Document `d`'s token range in the `.bin` (sequences must be contiguous, as Megatron writes
    /// them).
    fn doc(&self, d: u64) -> Result<Range<u64>, ShardError> {
        let (s0, s1) = (self.doc_index(d), self.doc_index(d + 1));
        let w = u64::from(self.width);
        if s0 >= s1 || s1 > self.sequences {
            return Err(ShardError::corrupt(
                self.idx_path(),
                self.docs_at + 8 * d,
                format!("document {d} spans sequences {s0}..{s1} of {}", self.sequences),
            ));
        }
        let start = self.seq_pointer(s0);
        let last = s1 - 1;
        let end = self.seq_pointer(last) + self.seq_len(last) * w;
        if !start.is_multiple_of(w) || end > self.bin.len() || start >= end {
            return Err(ShardError::corrupt(
                self.idx_path(),
                self.pointers_at + 8 * s0,
                format!(
                    "document {d} points at bytes {start}..{end} of a {}-byte .bin",
                    self.bin.len()
                ),
            ));
        }
        Ok(start / w..end / w)
    }

    /// Checks every table entry: lengths, contiguous pointers, increasing document ranges, ids
    /// non-negative (int32). O(sequences + tokens): what `verify` runs, never `open`.
    pub fn verify(&self) -> Result<(), ShardError> {
        let w = u64::from(self.width);
        let mut expect = 0u64;
        for s in 0..self.sequences {
            let p = self.seq_pointer(s);
            if p != expect {
                return Err(ShardError::corrupt(
                    self.idx_path(),
                    self.pointers_at + 8 * s,
                    format!("sequence {s} starts at byte {p}, expected {expect} (sequences must be contiguous)"),
                ));
            }
            expect = p + self.seq_len(s) * w;
        }
        if expect != self.bin.len() {
            return Err(ShardError::corrupt(
                self.bin_path(),
                expect,
                format!("the sequences cover {expect} bytes of a {}-byte .bin", self.bin.len()),
            ));
        }
        for d in 0..self.doc_entries - 1 {
            self.doc(d)?;
        }
        if self.signed {
            let bad = self
                .bin
                .map
                .chunks_exact(4)
                .position(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) < 0);
            if let Some(t) = bad {
                return Err(ShardError::corrupt(
                    self.bin_path(),
                    4 * t as u64,
                    "a negative token id",
                ));
            }
        }
        Ok(())
    }
}

fn strip_ext(p: &Path) -> PathBuf {
    match p.extension().and_then(|e| e.to_str()) {
        Some("bin" | "idx") => p.with_extension(""),
        _ => p.to_owned(),
    }
}

fn with_ext(base: &Path, ext: &str) -> PathBuf {
    let mut s = base.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    PathBuf::from(s)
}

/// Tokens from any supported file, with documents where the file records them.
#[derive(Debug)]
pub enum TokenSource {
    Packed(TokenFile),
    Megatron(Megatron),
    /// A flat token file: one document, the whole file.
    Flat(FlatFile),
}

/// A flat token file (nanoGPT's `train.bin`), mapped.
#[derive(Debug)]
pub struct FlatFile {
    file: Mapped,
    width: u8,
}

impl TokenSource {
    /// Opens `path`: a token dataset directory, a Megatron `.bin`/`.idx` (or prefix), or, with
    /// `flat`, a flat token file of that dtype.
    pub fn open(path: &Path, flat: Option<FlatDtype>) -> Result<Self, ShardError> {
        if let Some(dtype) = flat {
            let file = Mapped::open(path)?;
            let width = dtype.width();
            if !file.len().is_multiple_of(u64::from(width)) || file.is_empty() {
                return Err(ShardError::corrupt(
                    path,
                    file.len(),
                    format!(
                        "a flat {dtype:?} token file's length must be a non-zero multiple of {width}; is --dtype right?"
                    ),
                ));
            }
            return Ok(TokenSource::Flat(FlatFile { file, width }));
        }
        if path.is_dir() {
            return Ok(TokenSource::Packed(TokenFile::open(path)?));
        }
        let base = strip_ext(path);
        if with_ext(&base, "idx").is_file() {
            return Ok(TokenSource::Megatron(Megatron::open(&base)?));
        }
        Err(ShardError::Io {
            path: path.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "not a token dataset: expected a directory with tokens.rft, a Megatron PREFIX.bin + PREFIX.idx, or a flat token file with --dtype",
            ),
        })
    }

    pub fn kind(&self) -> &'static str {
        match self {
            TokenSource::Packed(_) => "ringfeed-tokens",
            TokenSource::Megatron(_) => "megatron",
            TokenSource::Flat(_) => "flat",
        }
    }

    pub fn width(&self) -> u8 {
        match self {
            TokenSource::Packed(t) => t.width(),
            TokenSource::Megatron(m) => m.width,
            TokenSource::Flat(f) => f.width,
        }
    }

    pub fn token_count(&self) -> u64 {
        match self {
            TokenSource::Packed(t) => t.token_count(),
            TokenSource::Megatron(m) => m.bin.len() / u64::from(m.width),
            TokenSource::Flat(f) => f.file.len() / u64::from(f.width),
        }
    }

    pub fn doc_count(&self) -> u64 {
        match self {
            TokenSource::Packed(t) => t.doc_count(),
            TokenSource::Megatron(m) => m.doc_entries - 1,
            TokenSource::Flat(_) => 1,
        }
    }

    /// Document `d`'s token range.
    pub fn doc(&self, d: u64) -> Result<Range<u64>, ShardError> {
        match self {
            TokenSource::Packed(t) => t.doc(d),
            TokenSource::Megatron(m) if d < m.doc_entries - 1 => m.doc(d),
            TokenSource::Flat(_) if d == 0 => Ok(0..self.token_count()),
            _ => Err(ShardError::OutOfRange {
                dir: PathBuf::from(self.kind()),
                index: d,
                len: self.doc_count(),
            }),
        }
    }

    /// The prompt tokens at the start of document `d` (only ringfeed's own files record them).
    pub fn prompt_len(&self, d: u64) -> u32 {
        match self {
            TokenSource::Packed(t) => t.prompt_len(d),
            _ => 0,
        }
    }

    pub fn eos_id(&self) -> Option<u32> {
        match self {
            TokenSource::Packed(t) => t.eos_id(),
            _ => None,
        }
    }

    /// Tokens `range` appended to `out` as u32.
    pub fn tokens_into(&self, range: Range<u64>, out: &mut Vec<u32>) {
        let (bytes, w): (&[u8], u8) = match self {
            TokenSource::Packed(t) => return t.tokens_into(range, out),
            TokenSource::Megatron(m) => (&m.bin.map, m.width),
            TokenSource::Flat(f) => (&f.file.map, f.width),
        };
        let wu = usize::from(w);
        let b = &bytes[range.start as usize * wu..range.end as usize * wu];
        match w {
            1 => out.extend(b.iter().map(|&x| u32::from(x))),
            2 => out.extend(b.chunks_exact(2).map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))),
            _ => out.extend(b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        }
    }

    /// Verifies every byte the format lets it check.
    pub fn verify(&self) -> Result<(), ShardError> {
        match self {
            TokenSource::Packed(t) => {
                super::verify::verify_file(t)?;
                super::packing::verify_all(t).map(|_| ())
            }
            TokenSource::Megatron(m) => m.verify(),
            TokenSource::Flat(_) => Ok(()),
        }
    }
}
