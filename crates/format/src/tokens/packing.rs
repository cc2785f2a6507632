//! Packing files (`proto/tokens.md` 1.1, "Packing files"): `DATASET/packing-S.rfp` holds the
//! `pack`-mode windows for `seq_len` S, computed at pack time, so that opening a `pack` stream
//! reads one 64-byte header and maps the tables instead of running best-fit decreasing over
//! every document.
//!
//! Invariants:
//! - A packing file is a cache of a pure function of the document table and `seq_len`
//!   ([`compute`]): `verify` recomputes it and refuses any other packing.
//! - Open is O(1): header, length and identity with `tokens.rft` (counts and its `docs_crc`); a
//!   packing of another dataset is an error, never silently replaced by a computed one.
//! - Every table entry is checked where it is read ([`Packing::bin_range`],
//!   [`Packing::bin_doc`]), so a damaged table fails a batch with its file and offset and
//!   never indexes out of range.

use std::collections::BTreeMap;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::TokenFile;
use crate::shard::reader::Mapped;
use crate::shard::{MAJOR, ShardError, check_struct, crc, le};

pub const PACK_MAGIC: [u8; 8] = *b"RFPACK\0\0";
/// The minor version packing files appeared in, and the one this implementation writes.
pub const PACK_MINOR: u16 = 1;
pub const PACK_HEADER_LEN: usize = 64;
/// The largest `seq_len` a packing is written for (the control protocol's bound).
pub const MAX_SEQ_LEN: u32 = 1 << 20;

/// `packing-S.rfp`.
pub fn file_name(seq_len: u32) -> String {
    format!("packing-{seq_len}.rfp")
}

/// PackHeader (`proto/tokens.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackHeader {
    pub minor: u16,
    pub seq_len: u32,
    pub window_count: u64,
    pub doc_count: u64,
    pub token_count: u64,
    pub cut_tokens: u64,
    pub docs_crc: u32,
    pub tables_crc: u32,
}

impl PackHeader {
    pub fn encode(&self) -> [u8; PACK_HEADER_LEN] {
        let mut b = [0u8; PACK_HEADER_LEN];
        b[..8].copy_from_slice(&PACK_MAGIC);
        le::put_u16(&mut b, 8, MAJOR);
        le::put_u16(&mut b, 10, self.minor);
        le::put_u32(&mut b, 12, self.seq_len);
        le::put_u64(&mut b, 16, self.window_count);
        le::put_u64(&mut b, 24, self.doc_count);
        le::put_u64(&mut b, 32, self.token_count);
        le::put_u64(&mut b, 40, self.cut_tokens);
        le::put_u32(&mut b, 48, self.docs_crc);
        le::put_u32(&mut b, 52, self.tables_crc);
        let c = crc(&b[..60]);
        le::put_u32(&mut b, 60, c);
        b
    }

    /// Where `bins` starts.
    pub fn bins_offset(&self) -> Option<u64> {
        self.window_count
            .checked_add(1)?
            .checked_mul(8)?
            .checked_add(PACK_HEADER_LEN as u64)
    }

    /// The file's length implied by the counts.
    pub fn file_len(&self) -> Option<u64> {
        self.bins_offset()?.checked_add(self.doc_count.checked_mul(8)?)
    }
}

/// An open packing file, checked against its token file.
#[derive(Debug)]
pub struct Packing {
    file: Mapped,
    pub header: PackHeader,
    bins_offset: u64,
}

impl Packing {
    /// Opens `tf`'s packing for `seq_len`, if the dataset has one ("Reading a packing").
    pub fn open(tf: &TokenFile, seq_len: u32) -> Result<Option<Packing>, ShardError> {
        // A token file read from memory has no directory (and so no packing files).
        if tf.dir().as_os_str().is_empty() {
            return Ok(None);
        }
        let path = tf.dir().join(file_name(seq_len));
        if !path.is_file() {
            return Ok(None);
        }
        let file = Mapped::open(&path)?;
        Self::from_mapped(tf, seq_len, file).map(Some)
    }

    fn from_mapped(tf: &TokenFile, seq_len: u32, file: Mapped) -> Result<Packing, ShardError> {
        let path = file.path.clone();
        let b: &[u8] = &file.map;
        if b.len() < PACK_HEADER_LEN {
            return Err(ShardError::truncated(
                &path,
                b.len() as u64,
                format!(
                    "a packing file has at least {PACK_HEADER_LEN} bytes, this one has {}",
                    b.len()
                ),
            ));
        }
        let h = &b[..PACK_HEADER_LEN];
        check_struct(&path, 0, h, "packing header", PACK_MAGIC)?;
        let header = PackHeader {
            minor: le::u16(h, 10),
            seq_len: le::u32(h, 12),
            window_count: le::u64(h, 16),
            doc_count: le::u64(h, 24),
            token_count: le::u64(h, 32),
            cut_tokens: le::u64(h, 40),
            docs_crc: le::u32(h, 48),
            tables_crc: le::u32(h, 52),
        };
        if header.minor == PACK_MINOR && le::u32(h, 56) != 0 {
            return Err(ShardError::corrupt(&path, 56, "non-zero reserved packing header bytes"));
        }
        if header.seq_len != seq_len {
            return Err(ShardError::corrupt(
                &path,
                12,
                format!("the packing is for seq_len {}, its name says {seq_len}", header.seq_len),
            ));
        }
        if header.window_count == 0 {
            return Err(ShardError::corrupt(&path, 16, "window_count is 0"));
        }
        let want = header.file_len();
        if want != Some(b.len() as u64) {
            return Err(ShardError::truncated(
                &path,
                16,
                format!(
                    "{} windows and {} documents need {} bytes, the file has {}",
                    header.window_count,
                    header.doc_count,
                    want.map_or("more than 2^64".into(), |w| w.to_string()),
                    b.len()
                ),
            ));
        }
        let tokens = tf.path().display();
        let stale = |at: u64, what: &str, got: String, want: String| {
            ShardError::corrupt(
                &path,
                at,
                format!(
                    "{what} is {got} but {tokens} has {want}: the packing belongs to another dataset; delete it, or run `ringfeed packing {} --seq-len {seq_len}` again",
                    tf.dir().display()
                ),
            )
        };
        if header.doc_count != tf.doc_count() {
            return Err(stale(
                24,
                "doc_count",
                header.doc_count.to_string(),
                tf.doc_count().to_string(),
            ));
        }
        if header.token_count != tf.token_count() {
            return Err(stale(
                32,
                "token_count",
                header.token_count.to_string(),
                tf.token_count().to_string(),
            ));
        }
        if header.docs_crc != tf.footer.docs_crc {
            return Err(stale(
                48,
                "docs_crc",
                format!("{:#010x}", header.docs_crc),
                format!("{:#010x}", tf.footer.docs_crc),
            ));
        }
        let bins_offset = header.bins_offset().expect("file_len was computed");
        Ok(Packing {
            file,
            header,
            bins_offset,
        })
    }

    /// Checks the tables against `tables_crc` (`verify`'s first check of a packing; also what a
    /// server checks of a packing file it fetched from object storage, besides the open's).
    pub fn check_tables(&self) -> Result<(), ShardError> {
        let computed = crc(&self.file.map[PACK_HEADER_LEN..]);
        if computed != self.header.tables_crc {
            return Err(ShardError::Checksum {
                path: self.path().to_owned(),
                offset: 52,
                what: "packing tables".into(),
                stored: self.header.tables_crc,
                computed,
            });
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.file.path
    }

    pub fn len(&self) -> u64 {
        self.header.window_count
    }

    pub fn is_empty(&self) -> bool {
        self.header.window_count == 0
    }

    fn entry(&self, at: u64) -> u64 {
        le::u64(&self.file.map, at as usize)
    }

    /// The range of `bins` that window `w < len()` holds, checked.
    pub fn bin_range(&self, w: u64) -> Result<Range<u64>, ShardError> {
        let at = PACK_HEADER_LEN as u64 + 8 * w;
        let (s, e) = (self.entry(at), self.entry(at + 8));
        if s >= e || e > self.header.doc_count {
            return Err(ShardError::corrupt(
                self.path(),
                at,
                format!(
                    "window {w} spans bins {s}..{e} of {}; run `ringfeed verify` on the dataset",
                    self.header.doc_count
                ),
            ));
        }
        Ok(s..e)
    }

    /// The document at place `k < doc_count` of `bins`, checked.
    pub fn bin_doc(&self, k: u64) -> Result<u64, ShardError> {
        let at = self.bins_offset + 8 * k;
        let d = self.entry(at);
        if d >= self.header.doc_count {
            return Err(ShardError::corrupt(
                self.path(),
                at,
                format!(
                    "bins[{k}] = {d} is not a document (the dataset has {}); run `ringfeed verify` on the dataset",
                    self.header.doc_count
                ),
            ));
        }
        Ok(d)
    }

    /// The offset of the first SIGBUS in the mapping, if the file changed after it was opened.
    pub fn fault(&self) -> Option<u64> {
        self.file.fault()
    }
}

/// A packing computed from a token file's documents: window starts (`windows + 1` entries),
/// the documents in placement order, and the tokens cut off documents longer than the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Computed {
    pub starts: Vec<u64>,
    pub bins: Vec<u64>,
    pub cut_tokens: u64,
}

/// Best-fit decreasing over the documents' lengths, each capped at `seq_len + 1` (what `pack`
/// mode serves; `proto/control.md`, "Token streams").
pub fn compute(lens: impl Iterator<Item = u64>, seq_len: u32) -> Computed {
    let cap = u64::from(seq_len) + 1;
    let mut cut_tokens = 0;
    let lens: Vec<(u64, u64)> = lens
        .enumerate()
        .map(|(d, n)| {
            cut_tokens += n.saturating_sub(cap);
            (n.min(cap), d as u64)
        })
        .collect();
    let (starts, bins) = best_fit_decreasing(&lens, cap);
    Computed {
        starts,
        bins,
        cut_tokens,
    }
}

/// The document lengths of `tf`, read from its document table (checked, as `doc` checks).
fn doc_lens(tf: &TokenFile) -> Result<Vec<u64>, ShardError> {
    (0..tf.doc_count())
        .map(|d| tf.doc(d).map(|r| r.end - r.start))
        .collect()
}

fn table_bytes(c: &Computed) -> Vec<u8> {
    c.starts.iter().chain(&c.bins).flat_map(|v| v.to_le_bytes()).collect()
}

/// Computes `tf`'s packing for `seq_len` and writes `DATASET/packing-S.rfp` (through a temporary
/// file, synced, then renamed, so a reader never sees part of one).
pub fn write(tf: &TokenFile, seq_len: u32) -> Result<PackHeader, ShardError> {
    let path = tf.dir().join(file_name(seq_len));
    if !(1..=MAX_SEQ_LEN).contains(&seq_len) {
        return Err(ShardError::corrupt(
            &path,
            12,
            format!("--pack-seq-len {seq_len} is outside 1..={MAX_SEQ_LEN}"),
        ));
    }
    if tf.doc_count() == 0 {
        return Err(ShardError::corrupt(
            &path,
            24,
            format!("{} has no documents to pack", tf.path().display()),
        ));
    }
    let c = compute(doc_lens(tf)?.into_iter(), seq_len);
    let tables = table_bytes(&c);
    let header = PackHeader {
        minor: PACK_MINOR,
        seq_len,
        window_count: c.starts.len() as u64 - 1,
        doc_count: tf.doc_count(),
        token_count: tf.token_count(),
        cut_tokens: c.cut_tokens,
        docs_crc: tf.footer.docs_crc,
        tables_crc: crc(&tables),
    };
    let tmp: PathBuf = tf.dir().join(format!(".{}.tmp", file_name(seq_len)));
    let io = |e: std::io::Error| ShardError::io(&tmp, e);
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(&header.encode()).map_err(io)?;
    f.write_all(&tables).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(|e| ShardError::io(&path, e))?;
    Ok(header)
}

/// The seq_lens `dir` holds packing files for, ascending, and any `packing-*.rfp` whose name is
/// not a seq_len.
pub fn list(dir: &Path) -> (Vec<u32>, Vec<PathBuf>) {
    let (mut good, mut bad) = (Vec::new(), Vec::new());
    if dir.as_os_str().is_empty() {
        return (good, bad);
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (good, bad);
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(mid) = name.strip_prefix("packing-").and_then(|n| n.strip_suffix(".rfp")) else {
            continue;
        };
        match mid.parse::<u32>() {
            Ok(s) if s.to_string() == mid => good.push(s),
            _ => bad.push(e.path()),
        }
    }
    good.sort_unstable();
    bad.sort();
    (good, bad)
}

/// `verify` step 9: every packing file of `tf`'s dataset, by increasing seq_len; returns the
/// seq_lens verified.
pub fn verify_all(tf: &TokenFile) -> Result<Vec<u32>, ShardError> {
    let (seq_lens, bad) = list(tf.dir());
    if let Some(p) = bad.first() {
        return Err(ShardError::corrupt(
            p,
            0,
            "a packing file's name must be packing-S.rfp with S a decimal seq_len",
        ));
    }
    if seq_lens.is_empty() {
        return Ok(seq_lens);
    }
    let lens = doc_lens(tf)?;
    for &s in &seq_lens {
        let p = Packing::open(tf, s)?.expect("listed above");
        let r = verify_one(&p, &lens);
        if let Some(off) = p.fault() {
            return Err(p.file.changed(off, "the packing file".into()));
        }
        r?;
    }
    Ok(seq_lens)
}

fn verify_one(p: &Packing, lens: &[u64]) -> Result<(), ShardError> {
    let path = p.path();
    let b: &[u8] = &p.file.map;
    p.check_tables()?;
    let (w, d) = (p.header.window_count, p.header.doc_count);
    let mut prev = 0u64;
    for i in 0..=w {
        let at = PACK_HEADER_LEN as u64 + 8 * i;
        let v = p.entry(at);
        let ok = match i {
            0 => v == 0,
            _ if i == w => v == d && v > prev,
            _ => v > prev && v < d,
        };
        if !ok {
            return Err(ShardError::corrupt(
                path,
                at,
                format!("bin_starts[{i}] = {v} breaks the window table (after {prev}; {d} documents)"),
            ));
        }
        prev = v;
    }
    let want = compute(lens.iter().copied(), p.header.seq_len);
    if want.starts.len() as u64 != w + 1 {
        return Err(ShardError::corrupt(
            path,
            16,
            format!(
                "window_count is {w}, best-fit decreasing makes {} windows of seq_len {}",
                want.starts.len() - 1,
                p.header.seq_len
            ),
        ));
    }
    let table = table_bytes(&want);
    if let Some(i) = (0..table.len() / 8).find(|&i| table[8 * i..8 * i + 8] != b[PACK_HEADER_LEN + 8 * i..][..8]) {
        let at = PACK_HEADER_LEN as u64 + 8 * i as u64;
        return Err(ShardError::corrupt(
            path,
            at,
            format!(
                "the table differs from best-fit decreasing at entry {i} (stored {}, computed {})",
                p.entry(at),
                le::u64(&table, 8 * i)
            ),
        ));
    }
    if want.cut_tokens != p.header.cut_tokens {
        return Err(ShardError::corrupt(
            path,
            40,
            format!(
                "cut_tokens is {}, the documents give {}",
                p.header.cut_tokens, want.cut_tokens
            ),
        ));
    }
    Ok(())
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
