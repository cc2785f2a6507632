//! Windows of `seq_len` tokens over a [`TokenSource`] (`proto/control.md`, "Token streams"):
//! what window *w* holds is a pure function of the source, the spec and *w*; the sampler
//! shuffles and stripes window indices exactly as it does image indices.
//!
//! - `concat`: window *w* is tokens `w*seq_len ..= w*seq_len + seq_len` of the concatenated
//!   stream (seq_len + 1 read: inputs and labels are the shift of one array), so the windows of
//!   an epoch cover the stream once; nothing is computed at open.
//! - `pack`: whole documents placed into windows of `seq_len + 1` tokens by best-fit decreasing,
//!   computed once at open (O(D log D) for D documents), never split; a document longer than
//!   `seq_len + 1` is cut to that length; the rest of a window is padding.
//!
//! Boundary fields: `position_ids` restart at 0 at each document start; `document_ids` number
//! the documents of the window from 0 (padding: -1); `cu_seqlens` are the cumulative sequence
//! lengths (FlashAttention varlen) padded to `max_docs + 1` entries with `seq_len`, so a batch's
//! shape never changes (a varying length makes `torch.compile` recompile). A window with more than
//! `max_docs` sequences has its last ones merged into one entry. Labels are `-100` where no loss is
//! taken: prompt tokens (prompt/completion data), padding, and in `pack` mode the label across a
//! document boundary.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::TokenSource;

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
}

/// The windows of one source.
#[derive(Debug)]
pub struct Windows {
    pub source: Arc<TokenSource>,
    pub spec: WindowSpec,
    /// `pack` mode: window *w* is documents `bins[bin_starts[w]..bin_starts[w+1]]`.
    bin_starts: Vec<u64>,
    bins: Vec<u64>,
    count: u64,
    /// `pack` mode: tokens left out of documents longer than `seq_len + 1`.
    pub cut_tokens: u64,
}

impl Windows {
    pub fn new(source: Arc<TokenSource>, spec: WindowSpec) -> Result<Self, String> {
        if spec.seq_len == 0 {
            return Err("tokens.seq_len must be at least 1".into());
        }
        if spec.max_docs == 0 || spec.max_docs > spec.seq_len {
            return Err(format!(
                "tokens.max_docs {} must be in 1..=seq_len ({})",
                spec.max_docs, spec.seq_len
            ));
        }
        let cap = u64::from(spec.seq_len) + 1;
        let mut w = Windows {
            source,
            spec,
            bin_starts: Vec::new(),
            bins: Vec::new(),
            count: 0,
            cut_tokens: 0,
        };
        match spec.mode {
            Mode::Concat => {
                let t = w.source.token_count();
                w.count = t.saturating_sub(1) / u64::from(spec.seq_len);
            }
            Mode::Pack => {
                let docs = w.source.doc_count();
                let mut lens = Vec::with_capacity(docs as usize);
                for d in 0..docs {
                    let r = w.source.doc(d).map_err(|e| e.to_string())?;
                    let n = r.end - r.start;
                    w.cut_tokens += n.saturating_sub(cap);
                    lens.push((n.min(cap), d));
                }
                let (starts, bins) = best_fit_decreasing(&lens, cap);
                w.count = starts.len() as u64 - 1;
                w.bin_starts = starts;
                w.bins = bins;
            }
        }
        Ok(w)
    }

    /// Windows per epoch (before rank striping).
    pub fn len(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The documents of `pack` window `w`.
    pub fn bin(&self, w: u64) -> &[u64] {
        &self.bins[self.bin_starts[w as usize] as usize..self.bin_starts[w as usize + 1] as usize]
    }

    /// Fills `out` with window `w` (`w < len()`).
    pub fn fill(&self, w: u64, out: &mut Window) {
        let n = self.spec.seq_len as usize;
        out.input_ids.clear();
        out.labels.clear();
        out.position_ids.clear();
        out.document_ids.clear();
        let mut buf = std::mem::take(&mut out.scratch);
        buf.clear();
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
                for (k, &d) in self.bin(w).iter().enumerate() {
                    let r = src.doc(d).expect("documents were checked at open");
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

/// Best-fit decreasing: documents `(len, id)` sorted by length, longest first (ties by id), each
/// into the open bin with the least room that still fits it, else a new bin. Returns bin starts
/// (`bins + 1` entries) and the documents of every bin in placement order.
pub fn best_fit_decreasing(lens: &[(u64, u64)], cap: u64) -> (Vec<u64>, Vec<u64>) {
    let mut order: Vec<(u64, u64)> = lens.to_vec();
    order.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut bins: Vec<Vec<u64>> = Vec::new();
    // Room left -> bins with that much room, lowest bin number first.
    let mut room: BTreeMap<u64, std::collections::BTreeSet<usize>> = BTreeMap::new();
    for (len, id) in order {
        let fit = room
            .range(len..)
            .next()
            .map(|(&r, set)| (r, *set.iter().next().expect("no empty sets")));
        let (b, left) = match fit {
            Some((r, b)) => {
                let set = room.get_mut(&r).expect("just found");
                set.remove(&b);
                if set.is_empty() {
                    room.remove(&r);
                }
                (b, r - len)
            }
            None => {
                bins.push(Vec::new());
                (bins.len() - 1, cap - len)
            }
        };
        bins[b].push(id);
        room.entry(left).or_default().insert(b);
    }
    let mut starts = vec![0u64];
    let mut flat = Vec::new();
    for b in bins {
        flat.extend(&b);
        starts.push(flat.len() as u64);
    }
    (starts, flat)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::{TOKENS_FILE, TokenFile, TokenWriter, TokenWriterOptions};

    /// Documents of lengths 3, 5, 2 (ids 10.., EOS 0 last), the second with a 2-token prompt.
    fn source() -> Arc<TokenSource> {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = TokenWriterOptions::new(100);
        opts.eos_id = Some(0);
        opts.prompts = true;
        let mut w = TokenWriter::create(&dir.path().join(TOKENS_FILE), opts).unwrap();
        w.push(&[10, 11, 0], 0).unwrap();
        w.push(&[20, 21, 22, 23, 0], 2).unwrap();
        w.push(&[30, 0], 0).unwrap();
        w.finish("{}").unwrap();
        Arc::new(TokenSource::Packed(TokenFile::open(dir.path()).unwrap()))
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
        w.fill(0, &mut out);
        assert_eq!(out.input_ids, [10, 11, 0, 20]);
        // The label of 0 -> 20 and of 20 -> 21 are prompt tokens of document 1: no loss.
        assert_eq!(out.labels, [11, 0, IGNORE, IGNORE]);
        assert_eq!(out.position_ids, [0, 1, 2, 0]);
        assert_eq!(out.document_ids, [0, 0, 0, 1]);
        assert_eq!(out.cu_seqlens, [0, 3, 4, 4]);
        w.fill(1, &mut out);
        assert_eq!(out.input_ids, [21, 22, 23, 0]);
        assert_eq!(out.labels, [22, 23, 0, 30]);
        assert_eq!(out.position_ids, [1, 2, 3, 4]);
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
        assert_eq!((w.bin(0), w.bin(1)), (&[1u64][..], &[0u64, 2][..]));
        let mut out = Window::default();
        w.fill(1, &mut out);
        assert_eq!(out.input_ids, [10, 11, 0, 30, 0]);
        assert_eq!(out.labels, [11, 0, IGNORE, 0, IGNORE]);
        assert_eq!(out.document_ids, [0, 0, 0, 1, 1]);
        assert_eq!(out.cu_seqlens, [0, 3, 5, 5, 5, 5]);
        w.fill(0, &mut out);
        assert_eq!(out.input_ids, [20, 21, 22, 23, 0]);
        assert_eq!(out.labels, [IGNORE, 22, 23, 0, IGNORE]);
        assert_eq!(out.document_ids, [0, 0, 0, 0, 0]);
    }

    #[test]
    fn best_fit_decreasing_never_overfills_and_places_every_document_once() {
        let lens: Vec<(u64, u64)> = [5u64, 3, 7, 2, 2, 9, 1, 4]
            .iter()
            .enumerate()
            .map(|(i, &l)| (l, i as u64))
            .collect();
        let (starts, bins) = best_fit_decreasing(&lens, 10);
        let mut seen: Vec<u64> = bins.clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..8).collect::<Vec<_>>());
        for w in starts.windows(2) {
            let total: u64 = bins[w[0] as usize..w[1] as usize]
                .iter()
                .map(|&d| lens[d as usize].0)
                .sum();
            assert!(total <= 10);
        }
        // 9+1 | 7+3 | 5+4 | 2+2: the 1 goes to the fullest bin it fits, the first of two.
        assert_eq!(starts, [0, 2, 4, 6, 8]);
        assert_eq!(bins, [5, 6, 2, 1, 0, 7, 3, 4]);
    }
}
