//! `verify` for token datasets: every byte, in the order `proto/tokens.md` gives, first problem
//! reported with its file and offset; then (1.1) every packing file.

use std::path::Path;

use super::{TOKENS_FOOTER_LEN, TOKENS_OFFSET, TokenFile};
use crate::shard::{ShardError, crc, le};

/// What a successful verification saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenReport {
    pub tokens: u64,
    pub documents: u64,
    pub width: u8,
    pub chunks: u32,
    pub bytes: u64,
    /// The seq_lens whose packing files were verified (1.1).
    pub packings: Vec<u32>,
}

fn zero(path: &Path, b: &[u8], from: u64, to: u64, what: &str) -> Result<(), ShardError> {
    match b[from as usize..to as usize].iter().position(|&x| x != 0) {
        None => Ok(()),
        Some(i) => Err(ShardError::corrupt(path, from + i as u64, format!("non-zero {what}"))),
    }
}

fn check_crc(path: &Path, at: u64, bytes: &[u8], stored: u32, what: &str) -> Result<(), ShardError> {
    let computed = crc(bytes);
    if computed != stored {
        return Err(ShardError::Checksum {
            path: path.to_owned(),
            offset: at,
            what: what.to_owned(),
            stored,
            computed,
        });
    }
    Ok(())
}

/// Verifies the token dataset in `dir`.
pub fn verify_tokens(dir: &Path) -> Result<TokenReport, ShardError> {
    let tf = TokenFile::open(dir)?;
    crate::fault::install().map_err(|e| ShardError::io(tf.path(), e))?;
    let r = verify_file(&tf);
    if let Some(off) = tf.fault() {
        return Err(tf.file.changed(off, "the token file".into()));
    }
    let mut report = r?;
    // 9. The packing files (1.1).
    report.packings = super::packing::verify_all(&tf)?;
    Ok(report)
}

/// Verifies an open token file (steps 2 to 8 of "Verification order").
pub fn verify_file(tf: &TokenFile) -> Result<TokenReport, ShardError> {
    let path = tf.path();
    let b: &[u8] = &tf.file.map;
    let (h, f, l) = (&tf.header, &tf.footer, &tf.footer.layout);
    let footer_at = l.footer_offset;
    // 2. Reserved bytes and the header's padding page.
    if h.minor == 0 {
        zero(path, b, 13, 16, "reserved header bytes")?;
        zero(path, b, 32, 60, "reserved header bytes")?;
        zero(path, b, 64, TOKENS_OFFSET, "padding after the header")?;
    }
    if f.minor == 0 {
        zero(path, b, footer_at + 104, footer_at + 124, "reserved footer bytes")?;
    }
    // 3. The document table.
    let docs = &b[l.docs_offset as usize..l.prompts_offset as usize];
    check_crc(path, footer_at + 88, docs, f.docs_crc, "document table")?;
    let mut prev = 0u64;
    for d in 0..=f.doc_count {
        let v = le::u64(docs, 8 * d as usize);
        let at = l.docs_offset + 8 * d;
        let ok = if d == 0 {
            v == 0
        } else if d == f.doc_count {
            v == f.token_count && v > prev
        } else {
            v > prev && v < f.token_count
        };
        if !ok {
            return Err(ShardError::corrupt(
                path,
                at,
                format!(
                    "doc_starts[{d}] = {v} breaks the document table (after {prev}; {} tokens)",
                    f.token_count
                ),
            ));
        }
        prev = v;
    }
    // 4. Prompt lengths.
    let prompts = &b[l.prompts_offset as usize..l.prompts_end as usize];
    check_crc(path, footer_at + 92, prompts, f.prompts_crc, "prompt lengths")?;
    if tf.has_prompts() {
        for d in 0..f.doc_count {
            let p = u64::from(le::u32(prompts, 4 * d as usize));
            let len = le::u64(docs, 8 * (d as usize + 1)) - le::u64(docs, 8 * d as usize);
            if p >= len {
                return Err(ShardError::corrupt(
                    path,
                    l.prompts_offset + 4 * d,
                    format!("document {d} has {len} tokens and a prompt of {p}: no token would carry loss"),
                ));
            }
        }
    }
    // 5. Chunk CRCs.
    let chunks_end = l.chunks_offset + 4 * u64::from(l.chunk_count);
    let table = &b[l.chunks_offset as usize..chunks_end as usize];
    check_crc(path, footer_at + 96, table, f.chunks_crc, "chunk CRC table")?;
    let cb = u64::from(f.chunk_bytes);
    for c in 0..u64::from(l.chunk_count) {
        let start = TOKENS_OFFSET + c * cb;
        let end = (start + cb).min(l.tokens_end);
        check_crc(
            path,
            start,
            &b[start as usize..end as usize],
            le::u32(table, 4 * c as usize),
            &format!("token chunk {c}"),
        )?;
    }
    // 6. Token ids and EOS placement.
    let w = u64::from(h.width);
    let vocab = h.vocab_size;
    let bad = match h.width {
        2 => tf
            .token_bytes()
            .chunks_exact(2)
            .position(|c| u32::from(u16::from_le_bytes([c[0], c[1]])) >= vocab),
        _ => tf
            .token_bytes()
            .chunks_exact(4)
            .position(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) >= vocab),
    };
    if let Some(t) = bad {
        let t = t as u64;
        return Err(ShardError::corrupt(
            path,
            TOKENS_OFFSET + t * w,
            format!("token {t} is {}, not below vocab_size {vocab}", tf.token(t)),
        ));
    }
    if let Some(eos) = tf.eos_id() {
        for d in 0..f.doc_count {
            let last = le::u64(docs, 8 * (d as usize + 1)) - 1;
            if tf.token(last) != eos {
                return Err(ShardError::corrupt(
                    path,
                    TOKENS_OFFSET + last * w,
                    format!("document {d} ends with token {}, not the EOS {eos}", tf.token(last)),
                ));
            }
        }
    }
    // 7. Padding between sections.
    zero(path, b, l.tokens_end, l.docs_offset, "padding after the tokens")?;
    zero(
        path,
        b,
        l.prompts_end,
        l.chunks_offset,
        "padding after the prompt lengths",
    )?;
    zero(path, b, chunks_end, l.info_offset, "padding after the chunk CRC table")?;
    let info_end = l.info_offset + f.info_len;
    zero(path, b, info_end, l.footer_offset, "padding after the info")?;
    // 8. The info.
    check_crc(
        path,
        footer_at + 100,
        &b[l.info_offset as usize..info_end as usize],
        f.info_crc,
        "info",
    )?;
    let info = tf.info()?;
    match serde_json::from_str::<serde_json::Value>(info) {
        Ok(serde_json::Value::Object(_)) => {}
        _ => {
            return Err(ShardError::corrupt(
                path,
                l.info_offset,
                "the info is not a JSON object",
            ));
        }
    }
    debug_assert_eq!(l.file_len, l.footer_offset + TOKENS_FOOTER_LEN as u64);
    Ok(TokenReport {
        tokens: f.token_count,
        documents: f.doc_count,
        width: h.width,
        chunks: l.chunk_count,
        bytes: l.file_len,
        packings: Vec::new(),
    })
}
