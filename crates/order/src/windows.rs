//! Windows of `seq_len` tokens over a [`TokenSource`] (`proto/control.md`, "Token streams"):
//! what window *w* holds is a pure function of the source, the spec and *w*; the sampler
//! shuffles and stripes window indices exactly as it does image indices.
//!
//! - `concat`: window *w* is tokens `w*seq_len ..= w*seq_len + seq_len` of the concatenated
//!   stream (seq_len + 1 read: inputs and labels are the shift of one array), so the windows of
//!   an epoch cover the stream once; nothing is computed at open.
//! - `pack`: whole documents placed into windows of `seq_len + 1` tokens by best-fit decreasing,
//!   never split; a document longer than `seq_len + 1` is cut to that length; the rest of a
//!   window is padding. The packing is read from the dataset's packing file for `seq_len`
//!   (`proto/tokens.md` 1.1; O(1) at open) when it has one, else computed at open (O(D log D)
//!   for D documents, logged with the command that writes the file).
//!
//! Boundary fields: `position_ids` restart at 0 at each document start; `document_ids` number
//! the documents of the window from 0 (padding: -1); `cu_seqlens` are the cumulative sequence
//! lengths (FlashAttention varlen) padded to `max_docs + 1` entries with `seq_len`, so a batch's
//! shape never changes (a varying length makes `torch.compile` recompile). A window with more than
//! `max_docs` sequences has its last ones merged into one entry. Labels are `-100` where no loss is
//! taken: prompt tokens (prompt/completion data), padding, and in `pack` mode the label across a
//! document boundary.

use std::sync::Arc;
use std::time::Instant;

use ringfeed_format::shard::ShardError;
use ringfeed_format::tokens::TokenSource;
use ringfeed_format::tokens::packing::{self, Packing};

/// The label of a position that carries no loss (PyTorch's `ignore_index`).
pub const IGNORE: i64 = -100;

/// How windows are cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Concat,
    Pack,
}

/// What a token stream asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSpec {
    pub seq_len: u32,
    pub mode: Mode,
    pub max_docs: u32,
    /// The token id of padding (`pack` mode).
    pub pad_id: u32,
}

/// One window's fields, filled by [`Windows::fill`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Window {
    pub input_ids: Vec<i64>,
    pub labels: Vec<i64>,
    pub position_ids: Vec<i32>,
    pub document_ids: Vec<i32>,
    pub cu_seqlens: Vec<i32>,
    scratch: Vec<u32>,
    docs: Vec<u64>,
}

/// Where a `pack`-mode stream's windows come from.
#[derive(Debug)]
pub enum PackTable {
    /// `concat` mode: none.
    None,
    /// The dataset's packing file for the stream's `seq_len` (mapped; O(1) at open).
    Stored(Packing),
    /// Computed at open: window *w* is documents `bins[starts[w]..starts[w+1]]`.
    Computed { starts: Vec<u64>, bins: Vec<u64> },
}

/// Why a source's windows cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum WindowsError {
    /// The request's settings (a `bad_request`).
    #[error("{0}")]
    Spec(String),
    /// The dataset's files (a `dataset` error).
    #[error(transparent)]
    Dataset(#[from] ShardError),
}

/// The windows of one source.
#[derive(Debug)]
pub struct Windows {
    pub source: Arc<TokenSource>,
    pub spec: WindowSpec,
    pub table: PackTable,
    count: u64,
    /// `pack` mode: tokens left out of documents longer than `seq_len + 1`.
    pub cut_tokens: u64,
}

impl Windows {
    pub fn new(source: Arc<TokenSource>, spec: WindowSpec) -> Result<Self, WindowsError> {
        if spec.seq_len == 0 {
            return Err(WindowsError::Spec("tokens.seq_len must be at least 1".into()));
        }
        if spec.max_docs == 0 || spec.max_docs > spec.seq_len {
            return Err(WindowsError::Spec(format!(
                "tokens.max_docs {} must be in 1..=seq_len ({})",
                spec.max_docs, spec.seq_len
            )));
        }
        let mut w = Windows {
            source,
            spec,
            table: PackTable::None,
            count: 0,
            cut_tokens: 0,
        };
        match spec.mode {
            Mode::Concat => {
                let t = w.source.token_count();
                w.count = t.saturating_sub(1) / u64::from(spec.seq_len);
            }
            Mode::Pack => {
                let stored = match &*w.source {
                    TokenSource::Packed(tf) => Packing::open(tf, spec.seq_len)?,
                    _ => None,
                };
                if let Some(p) = stored {
                    w.count = p.len();
                    w.cut_tokens = p.header.cut_tokens;
                    w.table = PackTable::Stored(p);
                } else {
                    let t0 = Instant::now();
                    let docs = w.source.doc_count();
                    let lens = (0..docs)
                        .map(|d| w.source.doc(d).map(|r| r.end - r.start))
                        .collect::<Result<Vec<u64>, ShardError>>()?;
                    let c = packing::compute(lens.into_iter(), spec.seq_len);
                    w.count = c.starts.len() as u64 - 1;
                    w.cut_tokens = c.cut_tokens;
                    w.table = PackTable::Computed {
                        starts: c.starts,
                        bins: c.bins,
                    };
                    w.log_computed(t0.elapsed());
                }
            }
        }
        Ok(w)
    }

    /// The log line of a packing computed at open: how long it took and what avoids it.
    fn log_computed(&self, took: std::time::Duration) {
        let s = self.spec.seq_len;
        let docs = self.source.doc_count();
        let ms = took.as_secs_f64() * 1e3;
        match &*self.source {
            TokenSource::Packed(tf) => {
                let (stored, _) = packing::list(tf.dir());
                let have = if stored.is_empty() {
                    "none".to_owned()
                } else {
                    stored.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
                };
                let dir = tf.dir().display();
                let msg = format!(
                    "{dir}: pack mode computed the best-fit-decreasing packing of {docs} documents for seq_len {s} at open in {ms:.1} ms (packing files for seq_len: {have}); `ringfeed packing {dir} --seq-len {s}` (or `ringfeed pack ... --pack-seq-len {s}`) stores it so the open reads it instead"
                );
                if took.as_secs() >= 1 {
                    tracing::warn!("{msg}");
                } else {
                    tracing::info!("{msg}");
                }
            }
            other => tracing::info!(
                "pack mode computed the best-fit-decreasing packing of {docs} documents of a {} source for seq_len {s} at open in {ms:.1} ms (only ringfeed token datasets hold packing files)",
                other.kind()
            ),
        }
    }

    /// Windows per epoch (before rank striping).
    pub fn len(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The documents of `pack` window `w`, in placement order, appended to `out`.
    pub fn bin_into(&self, w: u64, out: &mut Vec<u64>) -> Result<(), ShardError> {
        match &self.table {
            PackTable::None => {}
            PackTable::Computed { starts, bins } => {
                out.extend_from_slice(&bins[starts[w as usize] as usize..starts[w as usize + 1] as usize]);
            }
            PackTable::Stored(p) => {
                for k in p.bin_range(w)? {
                    out.push(p.bin_doc(k)?);
                }
            }
        }
        Ok(())
    }

    /// The documents of `pack` window `w`.
    pub fn bin(&self, w: u64) -> Result<Vec<u64>, ShardError> {
        let mut v = Vec::new();
        self.bin_into(w, &mut v)?;
        Ok(v)
    }

    /// Fills `out` with window `w` (`w < len()`); fails only on a damaged packing file or
    /// document table.
    pub fn fill(&self, w: u64, out: &mut Window) -> Result<(), ShardError> {
        let n = self.spec.seq_len as usize;
        out.input_ids.clear();
        out.labels.clear();
        out.position_ids.clear();
        out.document_ids.clear();
        let mut buf = std::mem::take(&mut out.scratch);
        buf.clear();
        let mut docs = std::mem::take(&mut out.docs);
        docs.clear();
        // Per position 0..=n: (document of the window, position in it, loss on this token).
        let mut meta: Vec<(i32, i32, bool)> = Vec::with_capacity(n + 1);
        let src = &*self.source;
        match self.spec.mode {
            Mode::Concat => {
                let start = w * u64::from(self.spec.seq_len);
                let end = start + n as u64 + 1;
                src.tokens_into(start..end, &mut buf);
                let mut d = doc_of(src, start);
                let first = d;
                let mut r = src.doc(d).unwrap_or(start..end);
                for t in start..end {
                    while t >= r.end {
                        d += 1;
                        r = src.doc(d).unwrap_or(r.end..end);
                    }
                    let pos = t - r.start;
                    let loss = pos >= u64::from(src.prompt_len(d));
                    meta.push(((d - first) as i32, pos as i32, loss));
                }
            }
            Mode::Pack => {
                if let Err(e) = self.bin_into(w, &mut docs) {
                    out.scratch = buf;
                    out.docs = docs;
                    return Err(e);
                }
                for (k, &d) in docs.iter().enumerate() {
                    let r = match src.doc(d) {
                        Ok(r) => r,
                        Err(e) => {
                            out.scratch = buf;
                            out.docs = docs;
                            return Err(e);
                        }
                    };
                    let take = (r.end - r.start).min(n as u64 + 1);
                    src.tokens_into(r.start..r.start + take, &mut buf);
                    let prompt = u64::from(src.prompt_len(d));
                    meta.extend((0..take).map(|p| (k as i32, p as i32, p >= prompt)));
                }
                let pad = buf.len();
                buf.resize(n + 1, self.spec.pad_id);
                meta.extend((0..(n + 1 - pad)).map(|p| (-1, p as i32, false)));
            }
        }
        for i in 0..n {
            out.input_ids.push(i64::from(buf[i]));
            let (doc, pos, _) = meta[i];
            let (next_doc, _, next_loss) = meta[i + 1];
            // Concat: the stream is one text, the label is the next token (Megatron's default);
            // pack: no label across documents or into padding.
            let crosses = self.spec.mode == Mode::Pack && (next_doc != doc || doc < 0);
            out.labels.push(if next_loss && !crosses {
                i64::from(buf[i + 1])
            } else {
                IGNORE
            });
            out.position_ids.push(pos);
            out.document_ids.push(doc);
        }
        // cu_seqlens: a sequence starts at 0 and wherever a position restarts.
        out.cu_seqlens.clear();
        out.cu_seqlens.push(0);
        let max = self.spec.max_docs as usize;
        for i in 1..n {
            if out.position_ids[i] == 0 && out.cu_seqlens.len() < max {
                out.cu_seqlens.push(i as i32);
            }
        }
        out.cu_seqlens.resize(max + 1, n as i32);
        out.scratch = buf;
        out.docs = docs;
        Ok(())
    }
}

/// The document holding token `t`.
fn doc_of(src: &TokenSource, t: u64) -> u64 {
    match src {
        TokenSource::Packed(f) => f.doc_of(t),
        _ => {
            let (mut lo, mut hi) = (0u64, src.doc_count());
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if src.doc(mid).map_or(u64::MAX, |r| r.start) <= t {
                    lo = mid
                } else {
                    hi = mid
                }
            }
            lo
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringfeed_format::tokens::{TOKENS_FILE, TokenFile, TokenWriter, TokenWriterOptions};

    /// Documents of lengths 3, 5, 2 (ids 10.., EOS 0 last), the second with a 2-token prompt.
    fn source() -> Arc<TokenSource> {
        // The file stays mapped after its directory is removed.
        source_in(tempfile::tempdir().unwrap().path())
    }

    fn source_in(dir: &std::path::Path) -> Arc<TokenSource> {
        let mut opts = TokenWriterOptions::new(100);
        opts.eos_id = Some(0);
        opts.prompts = true;
        let mut w = TokenWriter::create(&dir.join(TOKENS_FILE), opts).unwrap();
        w.push(&[10, 11, 0], 0).unwrap();
        w.push(&[20, 21, 22, 23, 0], 2).unwrap();
        w.push(&[30, 0], 0).unwrap();
        w.finish("{}").unwrap();
        Arc::new(TokenSource::Packed(TokenFile::open(dir).unwrap()))
    }

    #[test]
    fn concat_windows_restart_positions_and_mask_prompts() {
        let spec = WindowSpec {
            seq_len: 4,
            mode: Mode::Concat,
            max_docs: 3,
            pad_id: 0,
        };
        let w = Windows::new(source(), spec).unwrap();
        assert_eq!(w.len(), 2); // 10 tokens: (10 - 1) / 4
        let mut out = Window::default();
        w.fill(0, &mut out).unwrap();
        assert_eq!(out.input_ids, [10, 11, 0, 20]);
        // The label of 0 -> 20 and of 20 -> 21 are prompt tokens of document 1: no loss.
        assert_eq!(out.labels, [11, 0, IGNORE, IGNORE]);
        assert_eq!(out.position_ids, [0, 1, 2, 0]);
        assert_eq!(out.document_ids, [0, 0, 0, 1]);
        assert_eq!(out.cu_seqlens, [0, 3, 4, 4]);
        w.fill(1, &mut out).unwrap();
        assert_eq!(out.input_ids, [21, 22, 23, 0]);
        assert_eq!(out.labels, [22, 23, 0, 30]);
        assert_eq!(out.position_ids, [1, 2, 3, 4]);
    }

    fn pack_spec(seq_len: u32) -> WindowSpec {
        WindowSpec {
            seq_len,
            mode: Mode::Pack,
            max_docs: seq_len,
            pad_id: 0,
        }
    }

    fn all_windows(w: &Windows) -> Vec<Window> {
        (0..w.len())
            .map(|i| {
                let mut out = Window::default();
                w.fill(i, &mut out).unwrap();
                out
            })
            .collect()
    }

    #[test]
    fn a_stored_packing_serves_the_windows_computed_at_open() {
        let tmp = tempfile::tempdir().unwrap();
        let src = source_in(tmp.path());
        let TokenSource::Packed(tf) = &*src else { unreachable!() };
        for seq_len in [1u32, 2, 4, 5, 9] {
            let computed = Windows::new(Arc::clone(&src), pack_spec(seq_len)).unwrap();
            assert!(matches!(computed.table, PackTable::Computed { .. }));
            ringfeed_format::tokens::packing::write(tf, seq_len).unwrap();
            let stored = Windows::new(Arc::clone(&src), pack_spec(seq_len)).unwrap();
            assert!(matches!(stored.table, PackTable::Stored(_)), "seq_len {seq_len}");
            assert_eq!((stored.len(), stored.cut_tokens), (computed.len(), computed.cut_tokens));
            assert_eq!(all_windows(&stored), all_windows(&computed), "seq_len {seq_len}");
        }
        // Another seq_len has no file: computed at open, the same windows as before.
        let other = Windows::new(Arc::clone(&src), pack_spec(3)).unwrap();
        assert!(matches!(other.table, PackTable::Computed { .. }));
    }

    #[test]
    fn the_server_reads_the_stored_table_and_checks_what_it_reads() {
        use ringfeed_format::tokens::packing::{PACK_HEADER_LEN, file_name};
        let tmp = tempfile::tempdir().unwrap();
        let src = source_in(tmp.path());
        let TokenSource::Packed(tf) = &*src else { unreachable!() };
        ringfeed_format::tokens::packing::write(tf, 5).unwrap();
        let path = tmp.path().join(file_name(5));
        // Windows [1] and [0, 2]: swap the two documents of window 1 and refresh the CRCs. The
        // stream follows the file (it is not recomputed), and verify refuses it.
        let mut b = std::fs::read(&path).unwrap();
        let bins = PACK_HEADER_LEN + 8 * 3;
        b[bins + 8..bins + 16].copy_from_slice(&2u64.to_le_bytes());
        b[bins + 16..bins + 24].copy_from_slice(&0u64.to_le_bytes());
        let refresh = |b: &mut Vec<u8>| {
            let t = ringfeed_format::shard::crc(&b[PACK_HEADER_LEN..]);
            b[52..56].copy_from_slice(&t.to_le_bytes());
            let h = ringfeed_format::shard::crc(&b[..60]);
            b[60..64].copy_from_slice(&h.to_le_bytes());
        };
        refresh(&mut b);
        std::fs::write(&path, &b).unwrap();
        let w = Windows::new(Arc::clone(&src), pack_spec(5)).unwrap();
        assert_eq!(w.bin(1).unwrap(), [2, 0]);
        let err = ringfeed_format::tokens::verify_tokens(tmp.path()).unwrap_err();
        assert_eq!(
            (err.kind(), err.location().1),
            ("corrupt", Some(bins as u64 + 8)),
            "{err}"
        );
        // A document id past the table fails the window that reads it, naming the offset.
        b[bins + 8..bins + 16].copy_from_slice(&7u64.to_le_bytes());
        refresh(&mut b);
        std::fs::write(&path, &b).unwrap();
        let w = Windows::new(Arc::clone(&src), pack_spec(5)).unwrap();
        let err = w.fill(1, &mut Window::default()).unwrap_err();
        assert_eq!(err.location().1, Some(bins as u64 + 8), "{err}");
        w.fill(0, &mut Window::default()).unwrap();
        // A packing of another dataset (its docs_crc) refuses the open.
        b[48] ^= 1;
        refresh(&mut b);
        std::fs::write(&path, &b).unwrap();
        let err = Windows::new(Arc::clone(&src), pack_spec(5)).unwrap_err();
        assert!(err.to_string().contains("belongs to another dataset"), "{err}");
    }

    #[test]
    fn pack_windows_hold_whole_documents_and_pad() {
        let spec = WindowSpec {
            seq_len: 5,
            mode: Mode::Pack,
            max_docs: 5,
            pad_id: 0,
        };
        let w = Windows::new(source(), spec).unwrap();
        // Capacity 6: [5-token doc] then [3 + 2].
        assert_eq!(w.len(), 2);
        assert_eq!((w.bin(0).unwrap(), w.bin(1).unwrap()), (vec![1u64], vec![0u64, 2]));
        let mut out = Window::default();
        w.fill(1, &mut out).unwrap();
        assert_eq!(out.input_ids, [10, 11, 0, 30, 0]);
        assert_eq!(out.labels, [11, 0, IGNORE, 0, IGNORE]);
        assert_eq!(out.document_ids, [0, 0, 0, 1, 1]);
        assert_eq!(out.cu_seqlens, [0, 3, 5, 5, 5, 5]);
        w.fill(0, &mut out).unwrap();
        assert_eq!(out.input_ids, [20, 21, 22, 23, 0]);
        assert_eq!(out.labels, [IGNORE, 22, 23, 0, IGNORE]);
        assert_eq!(out.document_ids, [0, 0, 0, 0, 0]);
    }
}
