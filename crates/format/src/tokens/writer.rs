//! Streams one token file: header, tokens (chunk CRCs computed on the way), then the tables,
//! info and footer at [`TokenWriter::finish`]. The document table is the only thing held in
//! memory (8 bytes per document, 4 more with prompt lengths).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::{
    DEFAULT_CHUNK_BYTES, FLAG_PROMPTS, Layout, NO_EOS, TOKENS_FOOTER_LEN, TOKENS_MINOR, TOKENS_OFFSET, TokenFooter,
    TokenHeader, width_for_vocab,
};
use crate::shard::{ShardError, crc};

/// How a token file is laid out.
#[derive(Debug, Clone, Copy)]
pub struct TokenWriterOptions {
    pub vocab_size: u32,
    /// The id appended after each document, if any (recorded in the header; the caller appends).
    pub eos_id: Option<u32>,
    /// Whether documents carry prompt lengths (loss masks).
    pub prompts: bool,
    pub chunk_bytes: u32,
}

impl TokenWriterOptions {
    pub fn new(vocab_size: u32) -> Self {
        TokenWriterOptions {
            vocab_size,
            eos_id: None,
            prompts: false,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
        }
    }
}

/// Writes `tokens.rft`.
#[derive(Debug)]
pub struct TokenWriter {
    path: PathBuf,
    out: BufWriter<File>,
    header: TokenHeader,
    opts: TokenWriterOptions,
    doc_starts: Vec<u64>,
    prompt_lens: Vec<u32>,
    chunk_crcs: Vec<u32>,
    /// CRC and length of the chunk being filled.
    chunk_crc: u32,
    chunk_len: u32,
    token_count: u64,
    scratch: Vec<u8>,
}

/// A document the writer refused.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("token id {id} is not below the vocabulary size {vocab_size}")]
    IdOutOfRange { id: u32, vocab_size: u32 },
    #[error("a document has no tokens")]
    Empty,
    #[error("the prompt has {prompt} of the document's {len} tokens: nothing would carry loss")]
    PromptTooLong { prompt: u32, len: usize },
    #[error(transparent)]
    Write(#[from] ShardError),
}

impl TokenWriter {
    pub fn create(path: &Path, opts: TokenWriterOptions) -> Result<Self, ShardError> {
        assert!(opts.chunk_bytes.is_power_of_two() && opts.chunk_bytes >= 4);
        let file = File::create(path).map_err(|e| ShardError::io(path, e))?;
        let header = TokenHeader {
            minor: TOKENS_MINOR,
            width: width_for_vocab(opts.vocab_size),
            vocab_size: opts.vocab_size,
            eos_id: opts.eos_id.unwrap_or(NO_EOS),
        };
        let mut w = TokenWriter {
            path: path.to_owned(),
            out: BufWriter::with_capacity(1 << 20, file),
            header,
            opts,
            doc_starts: vec![0],
            prompt_lens: Vec::new(),
            chunk_crcs: Vec::new(),
            chunk_crc: 0,
            chunk_len: 0,
            token_count: 0,
            scratch: Vec::new(),
        };
        let mut page = vec![0u8; TOKENS_OFFSET as usize];
        page[..64].copy_from_slice(&header.encode());
        w.write(&page)?;
        Ok(w)
    }

    pub fn width(&self) -> u8 {
        self.header.width
    }

    pub fn token_count(&self) -> u64 {
        self.token_count
    }

    pub fn doc_count(&self) -> u64 {
        self.doc_starts.len() as u64 - 1
    }

    fn write(&mut self, b: &[u8]) -> Result<(), ShardError> {
        self.out.write_all(b).map_err(|e| ShardError::io(&self.path, e))
    }

    /// Appends one document (its EOS included, if it has one). `prompt_len` counts the leading
    /// tokens that carry no loss; it must be 0 unless the writer was made with `prompts`.
    pub fn push(&mut self, tokens: &[u32], prompt_len: u32) -> Result<(), PushError> {
        if tokens.is_empty() {
            return Err(PushError::Empty);
        }
        if let Some(&id) = tokens.iter().find(|&&t| t >= self.opts.vocab_size) {
            return Err(PushError::IdOutOfRange {
                id,
                vocab_size: self.opts.vocab_size,
            });
        }
        if prompt_len as usize >= tokens.len() && prompt_len > 0 {
            return Err(PushError::PromptTooLong {
                prompt: prompt_len,
                len: tokens.len(),
            });
        }
        let mut bytes = std::mem::take(&mut self.scratch);
        bytes.clear();
        if self.header.width == 2 {
            // The id check above makes the narrowing exact.
            bytes.extend(tokens.iter().flat_map(|&t| (t as u16).to_le_bytes()));
        } else {
            bytes.extend(tokens.iter().flat_map(|&t| t.to_le_bytes()));
        }
        self.write_tokens(&bytes)?;
        self.scratch = bytes;
        self.token_count += tokens.len() as u64;
        self.doc_starts.push(self.token_count);
        if self.opts.prompts {
            self.prompt_lens.push(prompt_len);
        }
        Ok(())
    }

    /// Writes token bytes and folds them into the chunk CRCs.
    fn write_tokens(&mut self, mut b: &[u8]) -> Result<(), ShardError> {
        self.write(b)?;
        while !b.is_empty() {
            let room = (self.opts.chunk_bytes - self.chunk_len) as usize;
            let n = room.min(b.len());
            self.chunk_crc = crc32c::crc32c_append(self.chunk_crc, &b[..n]);
            self.chunk_len += n as u32;
            if self.chunk_len == self.opts.chunk_bytes {
                self.chunk_crcs.push(self.chunk_crc);
                self.chunk_crc = 0;
                self.chunk_len = 0;
            }
            b = &b[n..];
        }
        Ok(())
    }

    fn pad_to(&mut self, at: u64, to: u64) -> Result<(), ShardError> {
        let zeros = vec![0u8; (to - at) as usize];
        self.write(&zeros)
    }

    /// Writes the tables, the info and the footer, and syncs the file.
    pub fn finish(mut self, info: &str) -> Result<TokenFooter, ShardError> {
        if self.chunk_len > 0 {
            self.chunk_crcs.push(self.chunk_crc);
        }
        let doc_count = self.doc_count();
        let layout = Layout::compute(
            self.token_count,
            doc_count,
            self.header.width,
            self.opts.prompts,
            self.opts.chunk_bytes,
            info.len() as u64,
        )
        .ok_or_else(|| ShardError::corrupt(&self.path, 0, "the token file would exceed 2^64 bytes"))?;
        debug_assert_eq!(layout.chunk_count as usize, self.chunk_crcs.len());
        self.pad_to(layout.tokens_end, layout.docs_offset)?;
        let docs: Vec<u8> = if doc_count == 0 {
            // An empty file has the one entry `doc_starts[0] = 0`.
            0u64.to_le_bytes().to_vec()
        } else {
            self.doc_starts.iter().flat_map(|d| d.to_le_bytes()).collect()
        };
        self.write(&docs)?;
        let prompts: Vec<u8> = self.prompt_lens.iter().flat_map(|p| p.to_le_bytes()).collect();
        self.write(&prompts)?;
        self.pad_to(layout.prompts_end, layout.chunks_offset)?;
        let chunks: Vec<u8> = self.chunk_crcs.iter().flat_map(|c| c.to_le_bytes()).collect();
        self.write(&chunks)?;
        self.pad_to(layout.chunks_offset + chunks.len() as u64, layout.info_offset)?;
        self.write(info.as_bytes())?;
        self.pad_to(layout.info_offset + info.len() as u64, layout.footer_offset)?;
        let footer = TokenFooter {
            minor: TOKENS_MINOR,
            flags: if self.opts.prompts { FLAG_PROMPTS } else { 0 },
            token_count: self.token_count,
            doc_count,
            layout,
            info_len: info.len() as u64,
            chunk_bytes: self.opts.chunk_bytes,
            docs_crc: crc(&docs),
            prompts_crc: crc(&prompts),
            chunks_crc: crc(&chunks),
            info_crc: crc(info.as_bytes()),
        };
        self.write(&footer.encode())?;
        let file = self
            .out
            .into_inner()
            .map_err(|e| ShardError::io(&self.path, e.into_error()))?;
        file.sync_all().map_err(|e| ShardError::io(&self.path, e))?;
        debug_assert_eq!(layout.file_len, layout.footer_offset + TOKENS_FOOTER_LEN as u64);
        Ok(footer)
    }
}
