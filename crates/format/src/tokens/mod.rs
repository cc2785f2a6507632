//! The token dataset format, version 1.1 (`proto/tokens.md` is the normative text).
//!
//! One file, `DATASET/tokens.rft`: a page-aligned token array (uint16 or uint32, chosen from the
//! vocabulary), a document table of token offsets, optional prompt lengths (loss masks), per-chunk
//! CRCs, an info JSON object and a footer with the counts; 1.1 adds optional packing files
//! (`packing-S.rfp`, [`packing`]), `pack` mode's windows written at pack time. This module is the single Rust truth
//! for its layout: magics, sizes and offsets are defined here once and checked against the
//! vectors in `proto/vectors/tokens/`.
//!
//! Invariants:
//! - Open is O(1): the header and footer are decoded and every section's place is computed from
//!   the footer's counts; nothing proportional to the tokens or documents is read.
//! - A token id is never narrowed: the writer refuses an id `>= vocab_size`, and the width is the
//!   narrowest that holds `vocab_size` ids.
//! - Errors are [`ShardError`]s with the same kinds as image shards, naming file and offset.

use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::shard::reader::Mapped;
use crate::shard::{MAJOR, ShardError, align_up, check_struct, crc, le};

pub mod external;
pub mod packing;
pub mod verify;
pub mod writer;

pub use external::{FlatDtype, TokenSource};
pub use verify::{TokenReport, verify_tokens};
pub use writer::{TokenWriter, TokenWriterOptions};

/// Minor version written by this implementation.
pub const TOKENS_MINOR: u16 = 0;
/// The file inside a token dataset directory.
pub const TOKENS_FILE: &str = "tokens.rft";
pub const TOKENS_MAGIC: [u8; 8] = *b"RFTOKEN\0";
pub const TOKENS_END_MAGIC: [u8; 8] = *b"RFTOKEND";
pub const TOKENS_HEADER_LEN: usize = 64;
pub const TOKENS_FOOTER_LEN: usize = 128;
/// Where the token array starts: one page, so a window can be handed out without copying.
pub const TOKENS_OFFSET: u64 = 4096;
/// Default chunk size for the token CRCs.
pub const DEFAULT_CHUNK_BYTES: u32 = 1 << 20;
/// `eos_id` when no EOS was appended.
pub const NO_EOS: u32 = u32::MAX;
/// Footer flag: the prompt-length section is present.
pub const FLAG_PROMPTS: u32 = 1;

const _: () = assert!(TOKENS_HEADER_LEN == 64 && TOKENS_FOOTER_LEN == 128);

/// The token width for a vocabulary: 2 bytes when every id fits a uint16, else 4.
pub const fn width_for_vocab(vocab_size: u32) -> u8 {
    if vocab_size <= 1 << 16 { 2 } else { 4 }
}

/// TokenHeader (`proto/tokens.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenHeader {
    pub minor: u16,
    pub width: u8,
    pub vocab_size: u32,
    pub eos_id: u32,
}

impl TokenHeader {
    pub fn encode(&self) -> [u8; TOKENS_HEADER_LEN] {
        let mut b = [0u8; TOKENS_HEADER_LEN];
        b[..8].copy_from_slice(&TOKENS_MAGIC);
        le::put_u16(&mut b, 8, MAJOR);
        le::put_u16(&mut b, 10, self.minor);
        b[12] = self.width;
        le::put_u32(&mut b, 16, self.vocab_size);
        le::put_u32(&mut b, 20, self.eos_id);
        le::put_u64(&mut b, 24, TOKENS_OFFSET);
        let c = crc(&b[..60]);
        le::put_u32(&mut b, 60, c);
        b
    }

    pub fn decode(path: &Path, b: &[u8]) -> Result<Self, ShardError> {
        check_struct(path, 0, b, "token header", TOKENS_MAGIC)?;
        let h = TokenHeader {
            minor: le::u16(b, 10),
            width: b[12],
            vocab_size: le::u32(b, 16),
            eos_id: le::u32(b, 20),
        };
        if h.width != 2 && h.width != 4 {
            return Err(ShardError::corrupt(
                path,
                12,
                format!("token_width {} is not 2 or 4", h.width),
            ));
        }
        if h.vocab_size == 0 || (h.width == 2 && h.vocab_size > 1 << 16) {
            return Err(ShardError::corrupt(
                path,
                16,
                format!("vocab_size {} does not fit token_width {}", h.vocab_size, h.width),
            ));
        }
        if h.eos_id != NO_EOS && h.eos_id >= h.vocab_size {
            return Err(ShardError::corrupt(
                path,
                20,
                format!("eos_id {} is not below vocab_size {}", h.eos_id, h.vocab_size),
            ));
        }
        if le::u64(b, 24) != TOKENS_OFFSET {
            return Err(ShardError::corrupt(
                path,
                24,
                format!("tokens_offset {} is not {TOKENS_OFFSET}", le::u64(b, 24)),
            ));
        }
        Ok(h)
    }
}

/// TokenFooter (`proto/tokens.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenFooter {
    pub minor: u16,
    pub flags: u32,
    pub token_count: u64,
    pub doc_count: u64,
    pub layout: Layout,
    pub info_len: u64,
    pub chunk_bytes: u32,
    pub docs_crc: u32,
    pub prompts_crc: u32,
    pub chunks_crc: u32,
    pub info_crc: u32,
}

/// Where each section of a token file lies, computed from the counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub tokens_end: u64,
    pub docs_offset: u64,
    pub prompts_offset: u64,
    pub prompts_end: u64,
    pub chunks_offset: u64,
    pub chunk_count: u32,
    pub info_offset: u64,
    pub footer_offset: u64,
    pub file_len: u64,
}

impl Layout {
    /// The layout of a file with these counts; `None` when an offset overflows.
    pub fn compute(
        token_count: u64,
        doc_count: u64,
        width: u8,
        prompts: bool,
        chunk_bytes: u32,
        info_len: u64,
    ) -> Option<Layout> {
        let token_bytes = token_count.checked_mul(u64::from(width))?;
        let tokens_end = TOKENS_OFFSET.checked_add(token_bytes)?;
        let docs_offset = align_up(tokens_end, 8)?;
        let prompts_offset = docs_offset.checked_add(doc_count.checked_add(1)?.checked_mul(8)?)?;
        let prompts_end = prompts_offset.checked_add(if prompts { doc_count.checked_mul(4)? } else { 0 })?;
        let chunks_offset = align_up(prompts_end, 8)?;
        let chunk_count = u32::try_from(token_bytes.div_ceil(u64::from(chunk_bytes.max(1)))).ok()?;
        let info_offset = align_up(chunks_offset.checked_add(4 * u64::from(chunk_count))?, 8)?;
        let footer_offset = align_up(info_offset.checked_add(info_len)?, 8)?;
        let file_len = footer_offset.checked_add(TOKENS_FOOTER_LEN as u64)?;
        Some(Layout {
            tokens_end,
            docs_offset,
            prompts_offset,
            prompts_end,
            chunks_offset,
            chunk_count,
            info_offset,
            footer_offset,
            file_len,
        })
    }
}

impl TokenFooter {
    pub fn encode(&self) -> [u8; TOKENS_FOOTER_LEN] {
        let mut b = [0u8; TOKENS_FOOTER_LEN];
        b[..8].copy_from_slice(&TOKENS_END_MAGIC);
        le::put_u16(&mut b, 8, MAJOR);
        le::put_u16(&mut b, 10, self.minor);
        le::put_u32(&mut b, 12, self.flags);
        le::put_u64(&mut b, 16, self.token_count);
        le::put_u64(&mut b, 24, self.doc_count);
        le::put_u64(&mut b, 32, self.layout.docs_offset);
        le::put_u64(&mut b, 40, self.layout.prompts_offset);
        le::put_u64(&mut b, 48, self.layout.chunks_offset);
        le::put_u64(&mut b, 56, self.layout.info_offset);
        le::put_u64(&mut b, 64, self.info_len);
        le::put_u64(&mut b, 72, self.layout.file_len);
        le::put_u32(&mut b, 80, self.chunk_bytes);
        le::put_u32(&mut b, 84, self.layout.chunk_count);
        le::put_u32(&mut b, 88, self.docs_crc);
        le::put_u32(&mut b, 92, self.prompts_crc);
        le::put_u32(&mut b, 96, self.chunks_crc);
        le::put_u32(&mut b, 100, self.info_crc);
        let c = crc(&b[..124]);
        le::put_u32(&mut b, 124, c);
        b
    }

    /// Decodes and checks the footer at `at` of a file of `file_len` bytes ("Open" step 2):
    /// everything but the section offsets, which need the header's width ([`Self::check_layout`]).
    pub fn decode(path: &Path, at: u64, b: &[u8], file_len: u64) -> Result<Self, ShardError> {
        check_struct(path, at, b, "token footer", TOKENS_END_MAGIC)?;
        let minor = le::u16(b, 10);
        let flags = le::u32(b, 12);
        let stored_len = le::u64(b, 72);
        if stored_len != file_len {
            return Err(ShardError::truncated(
                path,
                at + 72,
                format!("the footer says the file has {stored_len} bytes, it has {file_len}"),
            ));
        }
        if minor == 0 && flags & !FLAG_PROMPTS != 0 {
            return Err(ShardError::corrupt(path, at + 12, format!("unknown flags {flags:#x}")));
        }
        let (token_count, doc_count) = (le::u64(b, 16), le::u64(b, 24));
        if (token_count == 0) != (doc_count == 0) || doc_count > token_count {
            return Err(ShardError::corrupt(
                path,
                at + 24,
                format!("doc_count {doc_count} is inconsistent with token_count {token_count}"),
            ));
        }
        let chunk_bytes = le::u32(b, 80);
        if !chunk_bytes.is_power_of_two() || chunk_bytes < 4 {
            return Err(ShardError::corrupt(
                path,
                at + 80,
                format!("chunk_bytes {chunk_bytes} is not a power of two of at least 4"),
            ));
        }
        let empty = Layout::compute(0, 0, 2, false, 4, 0).expect("the empty layout fits");
        Ok(TokenFooter {
            minor,
            flags,
            token_count,
            doc_count,
            layout: empty,
            info_len: le::u64(b, 64),
            chunk_bytes,
            docs_crc: le::u32(b, 88),
            prompts_crc: le::u32(b, 92),
            chunks_crc: le::u32(b, 96),
            info_crc: le::u32(b, 100),
        })
    }

    /// "Open" step 4: the sections' places, computed from the counts and the header's `width`,
    /// must equal the file's length and the offsets the footer `b` (at `at`) stores.
    pub fn check_layout(&mut self, path: &Path, at: u64, b: &[u8], width: u8) -> Result<(), ShardError> {
        let file_len = le::u64(b, 72);
        let prompts = self.flags & FLAG_PROMPTS != 0;
        let (t, d) = (self.token_count, self.doc_count);
        let layout = Layout::compute(t, d, width, prompts, self.chunk_bytes, self.info_len)
            .filter(|l| l.file_len == file_len)
            .ok_or_else(|| {
                ShardError::corrupt(
                    path,
                    at + 16,
                    format!("{t} tokens of {width} bytes and {d} documents do not fit a file of {file_len} bytes"),
                )
            })?;
        let stored = [
            (32, le::u64(b, 32), layout.docs_offset, "docs_offset"),
            (40, le::u64(b, 40), layout.prompts_offset, "prompts_offset"),
            (48, le::u64(b, 48), layout.chunks_offset, "chunks_offset"),
            (56, le::u64(b, 56), layout.info_offset, "info_offset"),
            (
                84,
                u64::from(le::u32(b, 84)),
                u64::from(layout.chunk_count),
                "chunk_count",
            ),
        ];
        for (off, got, want, name) in stored {
            if got != want {
                return Err(ShardError::corrupt(
                    path,
                    at + off,
                    format!("{name} is {got}, the layout puts it at {want}"),
                ));
            }
        }
        self.layout = layout;
        Ok(())
    }
}

/// An open token dataset: the mapped `tokens.rft`.
#[derive(Debug)]
pub struct TokenFile {
    dir: PathBuf,
    pub(crate) file: Mapped,
    pub header: TokenHeader,
    pub footer: TokenFooter,
}

impl TokenFile {
    /// Opens `dir/tokens.rft` in O(1): header, footer and the layout they imply.
    pub fn open(dir: &Path) -> Result<Self, ShardError> {
        let path = dir.join(TOKENS_FILE);
        if !path.exists() {
            return Err(ShardError::Io {
                path: path.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!(
                        "{} is not a ringfeed token dataset (no {TOKENS_FILE}; create one with `ringfeed pack CORPUS.jsonl {} --tokenizer tokenizer.json`)",
                        dir.display(),
                        dir.display()
                    ),
                ),
            });
        }
        let file = Mapped::open(&path)?;
        Self::from_mapped(dir, file)
    }

    /// Reads a token file held in memory (tests and fuzzing).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, ShardError> {
        let file = Mapped {
            path: PathBuf::from(TOKENS_FILE),
            map: crate::shard::reader::Backing::Owned(bytes),
        };
        Self::from_mapped(Path::new(""), file)
    }

    fn from_mapped(dir: &Path, file: Mapped) -> Result<Self, ShardError> {
        let path = file.path.clone();
        let len = file.len();
        let min = TOKENS_OFFSET + TOKENS_FOOTER_LEN as u64;
        if len < min {
            return Err(ShardError::truncated(
                &path,
                len,
                format!("a token file has at least {min} bytes, this one has {len}"),
            ));
        }
        let bytes: &[u8] = &file.map;
        let at = len - TOKENS_FOOTER_LEN as u64;
        let fb = &bytes[at as usize..];
        let mut footer = TokenFooter::decode(&path, at, fb, len)?;
        let header = TokenHeader::decode(&path, &bytes[..TOKENS_HEADER_LEN])?;
        footer.check_layout(&path, at, fb, header.width)?;
        Ok(TokenFile {
            dir: dir.to_owned(),
            file,
            header,
            footer,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn path(&self) -> &Path {
        &self.file.path
    }

    pub fn width(&self) -> u8 {
        self.header.width
    }

    pub fn token_count(&self) -> u64 {
        self.footer.token_count
    }

    pub fn doc_count(&self) -> u64 {
        self.footer.doc_count
    }

    pub fn has_prompts(&self) -> bool {
        self.footer.flags & FLAG_PROMPTS != 0
    }

    pub fn eos_id(&self) -> Option<u32> {
        (self.header.eos_id != NO_EOS).then_some(self.header.eos_id)
    }

    /// The raw token bytes (little-endian, `width` bytes each).
    pub fn token_bytes(&self) -> &[u8] {
        &self.file.map[TOKENS_OFFSET as usize..self.footer.layout.tokens_end as usize]
    }

    /// Token `t` (panics past the end: callers check against [`TokenFile::token_count`]).
    pub fn token(&self, t: u64) -> u32 {
        let w = usize::from(self.header.width);
        let at = TOKENS_OFFSET as usize + t as usize * w;
        let b = &self.file.map[at..at + w];
        if w == 2 {
            u32::from(le::u16(b, 0))
        } else {
            le::u32(b, 0)
        }
    }

    /// Tokens `range` appended to `out` as u32.
    pub fn tokens_into(&self, range: Range<u64>, out: &mut Vec<u32>) {
        let w = usize::from(self.header.width);
        let b = &self.file.map
            [TOKENS_OFFSET as usize + range.start as usize * w..TOKENS_OFFSET as usize + range.end as usize * w];
        if w == 2 {
            out.extend(b.chunks_exact(2).map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))));
        } else {
            out.extend(b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])));
        }
    }

    /// `doc_starts[d]` (raw, unchecked beyond bounds; `d <= doc_count`).
    pub fn doc_start(&self, d: u64) -> u64 {
        le::u64(&self.file.map, (self.footer.layout.docs_offset + 8 * d) as usize)
    }

    /// Document `d`'s token range, checked against its neighbours and the token count.
    pub fn doc(&self, d: u64) -> Result<Range<u64>, ShardError> {
        if d >= self.doc_count() {
            return Err(ShardError::OutOfRange {
                dir: self.dir.clone(),
                index: d,
                len: self.doc_count(),
            });
        }
        let (s, e) = (self.doc_start(d), self.doc_start(d + 1));
        if s >= e || e > self.token_count() {
            return Err(ShardError::corrupt(
                self.path(),
                self.footer.layout.docs_offset + 8 * d,
                format!("document {d} spans tokens {s}..{e} of {}", self.token_count()),
            ));
        }
        Ok(s..e)
    }

    /// The number of prompt tokens at the start of document `d` (0 without prompt lengths).
    pub fn prompt_len(&self, d: u64) -> u32 {
        if !self.has_prompts() || d >= self.doc_count() {
            return 0;
        }
        le::u32(&self.file.map, (self.footer.layout.prompts_offset + 4 * d) as usize)
    }

    /// The document holding token `t`, by binary search of the document table.
    pub fn doc_of(&self, t: u64) -> u64 {
        let (mut lo, mut hi) = (0u64, self.doc_count());
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.doc_start(mid) <= t { lo = mid } else { hi = mid }
        }
        lo
    }

    /// The info JSON text.
    pub fn info(&self) -> Result<&str, ShardError> {
        let l = &self.footer.layout;
        let b = &self.file.map[l.info_offset as usize..(l.info_offset + self.footer.info_len) as usize];
        std::str::from_utf8(b)
            .map_err(|e| ShardError::corrupt(self.path(), l.info_offset, format!("the info is not UTF-8: {e}")))
    }

    /// The offset of the first SIGBUS in the mapping, if the file changed after it was opened.
    pub fn fault(&self) -> Option<u64> {
        self.file.fault()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn width_is_the_narrowest_that_holds_the_vocabulary() {
        assert_eq!(width_for_vocab(1), 2);
        assert_eq!(width_for_vocab(65_536), 2);
        assert_eq!(width_for_vocab(65_537), 4);
        assert_eq!(width_for_vocab(200_000), 4);
    }

    #[test]
    fn an_empty_file_lays_out_its_footer_after_the_first_page() {
        let l = Layout::compute(0, 0, 2, false, DEFAULT_CHUNK_BYTES, 0).unwrap();
        assert_eq!(l.docs_offset, 4096);
        assert_eq!(l.footer_offset, 4096 + 8);
        assert_eq!(l.chunk_count, 0);
        assert!(Layout::compute(u64::MAX / 2, 1, 4, true, 4, 0).is_none());
    }
}
