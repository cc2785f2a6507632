//! Memory-mapped, O(1) random access to a packed dataset.
//!
//! [`Dataset::open`] maps the index and every shard and checks each file's fixed structures
//! (magic, version, CRCs, lengths, section bounds). That costs O(shards): no per-sample table is
//! read at open, so a million-sample dataset opens in milliseconds and in constant memory (the
//! tables stay in the page cache, touched only where sampled).
//!
//! [`Dataset::sample`] then reads one sample entry and one record entry and bounds-checks both
//! before handing out a slice of the mapped shard. The per-record CRC is checked on request
//! ([`Dataset::sample_checked`]); `verify` checks everything else.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::fault::Watch;

use super::{
    CLASS_ENTRY_LEN, ClassEntry, INDEX_FILE, INDEX_FOOTER_LEN, INDEX_HEADER_LEN, IndexFooter, IndexHeader,
    RECORD_ENTRY_LEN, RecordEntry, SAMPLE_ENTRY_LEN, SHARD_ENTRY_LEN, SHARD_FOOTER_LEN, SHARD_HEADER_LEN, SampleEntry,
    ShardEntry, ShardError, ShardFooter, ShardHeader, crc, valid_shard_name,
};

/// The bytes of one file: mapped, or held in memory (for fuzzing and tests).
#[derive(Debug)]
pub enum Backing {
    /// A mapped file. The watch is declared first so that it is dropped (unregistered) before
    /// the map is unmapped.
    Map {
        watch: Option<Watch>,
        map: Mmap,
    },
    Owned(Vec<u8>),
}

impl std::ops::Deref for Backing {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Backing::Map { map, .. } => map,
            Backing::Owned(v) => v,
        }
    }
}

/// A file of the dataset, by path.
#[derive(Debug)]
pub struct Mapped {
    pub path: PathBuf,
    pub map: Backing,
}

impl Mapped {
    pub fn open(path: &Path) -> Result<Self, ShardError> {
        let file = File::open(path).map_err(|e| ShardError::io(path, e))?;
        // SAFETY: the mapping is read-only and private to this process. A packed dataset is
        // immutable once `pack` has renamed it into place; every access below is bounds-checked
        // against the length the file had when it was mapped. If another process truncates the
        // file anyway, touching the lost pages raises SIGBUS: that hazard is inherent to mmap and
        // is what `ringfeed verify` and the record CRCs exist to detect before training, and
        // what the watch below turns into an error where the SIGBUS handler is installed.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| ShardError::io(path, e))?;
        // SAFETY: the map is read-only, page-aligned, and unmapped only after the watch is
        // dropped (`Backing::Map` declares the watch first). Every reader of these bytes checks
        // `Mapped::fault` before trusting them (`PackedSource`, `verify` and `inspect` install
        // the handler and check; a caller of `Dataset` that does not gets a fatal SIGBUS, as
        // with any mapped file).
        let watch = (!map.is_empty()).then(|| unsafe { Watch::register(map.as_ptr(), map.len(), 0) });
        Ok(Mapped {
            path: path.to_owned(),
            map: Backing::Map { watch, map },
        })
    }

    /// The file offset of the first SIGBUS in this mapping, if the file changed on disk after
    /// it was mapped (see [`crate::fault`]).
    pub fn fault(&self) -> Option<u64> {
        match &self.map {
            Backing::Map { watch: Some(w), .. } => w.fault(),
            _ => None,
        }
    }

    /// The error for a mapping that faulted at `offset`; `what` says what was being read.
    pub fn changed(&self, offset: u64, what: String) -> ShardError {
        let was = self.len();
        let now = match std::fs::metadata(&self.path) {
            Ok(m) if m.len() < was => format!(
                "the file is now {} bytes, it had {was} when opened (truncated)",
                m.len()
            ),
            Ok(m) if m.len() == was => format!(
                "the file still has its {was} bytes (it was truncated and rewritten, or could not be read: an i/o error?)"
            ),
            Ok(m) => format!("the file is now {} bytes, it had {was} when opened", m.len()),
            Err(e) => format!("the file cannot be read any more ({e})"),
        };
        ShardError::Changed {
            path: self.path.clone(),
            offset,
            what,
            now,
        }
    }

    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// `len` bytes at `offset`, or a truncation error naming `what`.
    pub fn slice(&self, offset: u64, len: u64, what: &str) -> Result<&[u8], ShardError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(&self.map[offset as usize..end as usize]),
            _ => Err(ShardError::truncated(
                &self.path,
                offset,
                format!(
                    "the {what} ({len} bytes at offset {offset}) runs past the end of the file ({} bytes)",
                    self.len()
                ),
            )),
        }
    }
}

/// One open shard file.
#[derive(Debug)]
pub struct Shard {
    pub file: Mapped,
    pub header: ShardHeader,
    pub footer: ShardFooter,
}

impl Shard {
    /// Maps a shard and checks its header and footer against its index entry.
    pub fn open(file: Mapped, number: u32, entry: &ShardEntry) -> Result<Self, ShardError> {
        let path = &file.path.clone();
        let len = file.len();
        if len < entry.file_len {
            return Err(ShardError::truncated(
                path,
                len,
                format!("the index expects {} bytes, the file has {len}", entry.file_len),
            ));
        }
        if len > entry.file_len {
            return Err(ShardError::corrupt(
                path,
                entry.file_len,
                format!(
                    "the index expects {} bytes, the file has {len}: bytes were appended",
                    entry.file_len
                ),
            ));
        }
        if len < (SHARD_HEADER_LEN + SHARD_FOOTER_LEN) as u64 {
            return Err(ShardError::truncated(
                path,
                len,
                format!(
                    "a shard is at least {} bytes, this file has {len}",
                    SHARD_HEADER_LEN + SHARD_FOOTER_LEN
                ),
            ));
        }
        let footer_at = len - SHARD_FOOTER_LEN as u64;
        let footer = ShardFooter::decode(
            path,
            footer_at,
            file.slice(footer_at, SHARD_FOOTER_LEN as u64, "footer")?,
            len,
        )?;
        let header = ShardHeader::decode(path, file.slice(0, SHARD_HEADER_LEN as u64, "header")?)?;
        if header.shard_number != number {
            return Err(ShardError::corrupt(
                path,
                16,
                format!(
                    "the header says shard {} but the index lists it as shard {number}",
                    header.shard_number
                ),
            ));
        }
        if footer.table_offset < header.data_offset() {
            return Err(ShardError::corrupt(
                path,
                footer_at + 16,
                format!(
                    "record table offset {} is before the first record ({})",
                    footer.table_offset,
                    header.data_offset()
                ),
            ));
        }
        if entry.record_count != footer.record_count
            || entry.file_len != footer.file_len
            || entry.body_crc != footer.body_crc
        {
            return Err(ShardError::corrupt(
                path,
                footer_at,
                format!(
                    "this shard does not belong to the index: the index expects {} records, {} bytes, body crc {:#010x}; the file has {} records, {} bytes, body crc {:#010x}",
                    entry.record_count,
                    entry.file_len,
                    entry.body_crc,
                    footer.record_count,
                    footer.file_len,
                    footer.body_crc
                ),
            ));
        }
        Ok(Shard { file, header, footer })
    }

    pub fn path(&self) -> &Path {
        &self.file.path
    }

    /// Record entry `r`, bounds-checked against the data region.
    pub fn record(&self, r: u32) -> Result<RecordEntry, ShardError> {
        if r >= self.footer.record_count {
            return Err(ShardError::corrupt(
                self.path(),
                self.footer.table_offset,
                format!(
                    "record {r} is past the last record ({} records)",
                    self.footer.record_count
                ),
            ));
        }
        let at = self.footer.table_offset + u64::from(r) * RECORD_ENTRY_LEN as u64;
        // In bounds: the footer check proved the table ends before the footer.
        let e = RecordEntry::decode(&self.file.map[at as usize..at as usize + RECORD_ENTRY_LEN]);
        let in_data = e.offset >= self.header.data_offset()
            && e.length > 0
            && e.offset
                .checked_add(u64::from(e.length))
                .is_some_and(|end| end <= self.footer.table_offset);
        if !in_data {
            return Err(ShardError::corrupt(
                self.path(),
                at,
                format!(
                    "record {r} ({} bytes at offset {}) is outside the data region {}..{}",
                    e.length,
                    e.offset,
                    self.header.data_offset(),
                    self.footer.table_offset
                ),
            ));
        }
        Ok(e)
    }

    /// The bytes of a record whose entry was returned by [`Shard::record`].
    pub fn bytes(&self, e: &RecordEntry) -> &[u8] {
        &self.file.map[e.offset as usize..(e.offset + u64::from(e.length)) as usize]
    }
}

/// An open packed dataset.
#[derive(Debug)]
pub struct Dataset {
    dir: PathBuf,
    pub index: Mapped,
    pub header: IndexHeader,
    pub footer: IndexFooter,
    pub shards: Vec<Shard>,
}

/// One sample of a packed dataset, borrowed from the mapped files.
#[derive(Debug, Clone, Copy)]
pub struct PackedSample<'a> {
    pub index: u64,
    pub label: i64,
    pub key: &'a [u8],
    /// Empty, or a UTF-8 JSON object of extra manifest columns.
    pub meta: &'a [u8],
    pub data: &'a [u8],
    pub shard: u32,
    pub record: u32,
    /// Byte offset of the record in its shard file.
    pub offset: u64,
    /// CRC-32C stored for the record.
    pub crc: u32,
}

impl Dataset {
    /// Opens the dataset in directory `dir` (see the module docs for what is checked).
    pub fn open(dir: &Path) -> Result<Self, ShardError> {
        Self::open_with(dir, &mut Mapped::open)
    }

    /// Opens a dataset held in memory: `index` is the bytes of `index.rfi`, and `shard` returns
    /// the bytes of a shard file by name. Used by the fuzz targets; paths in errors are relative.
    pub fn from_memory(index: Vec<u8>, shard: &dyn Fn(&str) -> Option<Vec<u8>>) -> Result<Self, ShardError> {
        let mut index = Some(index);
        Self::open_with(Path::new(""), &mut |path: &Path| {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let bytes = if name == INDEX_FILE { index.take() } else { shard(name) };
            match bytes {
                Some(b) => Ok(Mapped {
                    path: path.to_owned(),
                    map: Backing::Owned(b),
                }),
                None => Err(ShardError::io(path, std::io::ErrorKind::NotFound.into())),
            }
        })
    }

    fn open_with(dir: &Path, load: &mut dyn FnMut(&Path) -> Result<Mapped, ShardError>) -> Result<Self, ShardError> {
        let ds = Self::open_index(dir, load)?;
        Self::open_shards(ds, &mut |n, name, entry| Shard::open(load(&dir.join(name))?, n, entry))
    }

    /// Maps and checks the index's fixed structures (footer, header, section bounds); no shard.
    fn open_index(dir: &Path, load: &mut dyn FnMut(&Path) -> Result<Mapped, ShardError>) -> Result<Self, ShardError> {
        let path = dir.join(INDEX_FILE);
        let index = match load(&path) {
            Ok(m) => m,
            Err(ShardError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Err(ShardError::NotADataset { dir: dir.to_owned() });
            }
            Err(e) => return Err(e),
        };
        let len = index.len();
        let min = (INDEX_HEADER_LEN + INDEX_FOOTER_LEN) as u64;
        if len < min {
            return Err(ShardError::truncated(
                &path,
                len,
                format!("an index is at least {min} bytes, this file has {len}"),
            ));
        }
        let footer_at = len - INDEX_FOOTER_LEN as u64;
        let footer = IndexFooter::decode(
            &path,
            footer_at,
            index.slice(footer_at, INDEX_FOOTER_LEN as u64, "footer")?,
            len,
        )?;
        let header = IndexHeader::decode(&path, index.slice(0, INDEX_HEADER_LEN as u64, "header")?, footer_at)?;

        let ds = Dataset {
            dir: dir.to_owned(),
            index,
            header,
            footer,
            shards: Vec::with_capacity(header.shard_count as usize),
        };
        Ok(ds)
    }

    /// Checks every shard name and every class name of an index whose fixed structures are
    /// checked, and opens each shard with `open` (its number, file name and index entry).
    fn open_shards(
        mut ds: Dataset,
        open: &mut dyn FnMut(u32, &str, &ShardEntry) -> Result<Shard, ShardError>,
    ) -> Result<Self, ShardError> {
        for n in 0..ds.header.shard_count {
            let entry = ds.shard_entry(n);
            let name = ds.shard_name(n)?.to_owned();
            let shard = open(n, &name, &entry)?;
            ds.shards.push(shard);
        }
        // O(classes): after this, `class_name` cannot fail for an existing class.
        for c in 0..ds.header.class_count {
            ds.class_name(c)?;
        }
        Ok(ds)
    }

    /// An index held in memory whose shards are opened later, one by one, by the caller
    /// (`ringfeed_remote`: shards fetched into a local cache). `name` is what errors call it.
    /// Checks everything [`Dataset::open`] checks of the index itself, shard and class names
    /// included; [`Dataset::sample`] is not available on it (it has no shards), use
    /// `ringfeed_remote`'s reader, which opens each shard with [`Dataset::open_shard_at`].
    pub fn index_only(name: &Path, bytes: Vec<u8>) -> Result<Self, ShardError> {
        let mut bytes = Some(bytes);
        let ds = Self::open_index(name, &mut |p: &Path| match bytes.take() {
            Some(b) => Ok(Mapped {
                path: p.to_owned(),
                map: Backing::Owned(b),
            }),
            None => Err(ShardError::io(p, std::io::ErrorKind::NotFound.into())),
        })?;
        for n in 0..ds.header.shard_count {
            ds.shard_name(n)?;
        }
        for c in 0..ds.header.class_count {
            ds.class_name(c)?;
        }
        Ok(ds)
    }

    /// Shard `n` of this index from the file at `path`, checked as [`Dataset::open`] checks it
    /// (length, header, footer, and that it belongs to this index).
    pub fn open_shard_at(&self, n: u32, path: &Path) -> Result<Shard, ShardError> {
        Shard::open(Mapped::open(path)?, n, &self.shard_entry(n))
    }

    /// The file name of shard `n`, checked (UTF-8, no `/`, not `.` or `..`).
    pub fn shard_name(&self, n: u32) -> Result<&str, ShardError> {
        let entry = self.shard_entry(n);
        let name = self.heap(
            entry.name_offset,
            u64::from(entry.name_len),
            self.shard_entry_offset(n),
            "shard name",
        )?;
        if !valid_shard_name(name) {
            return Err(ShardError::corrupt(
                self.index_path(),
                self.shard_entry_offset(n),
                format!("shard {n} has an invalid file name \"{}\"", name.escape_ascii()),
            ));
        }
        std::str::from_utf8(name).map_err(|_| {
            ShardError::corrupt(
                self.index_path(),
                self.shard_entry_offset(n),
                format!("shard {n} has a non-UTF-8 file name"),
            )
        })
    }

    /// The dataset directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Number of samples.
    pub fn len(&self) -> u64 {
        self.header.sample_count
    }

    /// Whether the dataset has no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Format version of the index, `(major, minor)`.
    pub fn version(&self) -> (u16, u16) {
        (super::MAJOR, self.header.minor)
    }

    /// Number of shard files.
    pub fn shard_count(&self) -> u32 {
        self.header.shard_count
    }

    /// Path, record count and length of shard `n`.
    pub fn shard_info(&self, n: u32) -> Option<(&Path, u32, u64)> {
        self.shards
            .get(n as usize)
            .map(|s| (s.path(), s.footer.record_count, s.footer.file_len))
    }

    /// Number of classes (0 when labels are plain integers).
    pub fn class_count(&self) -> u32 {
        self.header.class_count
    }

    /// Name of class `c`.
    pub fn class_name(&self, c: u32) -> Result<&[u8], ShardError> {
        if c >= self.header.class_count {
            return Err(ShardError::corrupt(
                self.index_path(),
                0,
                format!("class {c} does not exist"),
            ));
        }
        let at = self.header.classes_offset + u64::from(c) * CLASS_ENTRY_LEN as u64;
        let e = ClassEntry::decode(&self.index.map[at as usize..at as usize + CLASS_ENTRY_LEN]);
        self.heap(e.name_offset, u64::from(e.name_len), at, "class name")
    }

    /// The info JSON object written by `pack`.
    pub fn info(&self) -> Result<&str, ShardError> {
        let b = self
            .index
            .slice(self.header.info_offset, self.header.info_len, "info")?;
        std::str::from_utf8(b)
            .map_err(|_| ShardError::corrupt(self.index_path(), self.header.info_offset, "info is not UTF-8"))
    }

    /// Sample `i`, bounds-checked; the record CRC is not checked.
    pub fn sample(&self, i: u64) -> Result<PackedSample<'_>, ShardError> {
        if i >= self.len() {
            return Err(ShardError::OutOfRange {
                dir: self.dir.clone(),
                index: i,
                len: self.len(),
            });
        }
        let (e, key, meta) = self.sample_entry(i)?;
        let at = self.sample_entry_offset(i);
        let shard = self.shards.get(e.shard as usize).ok_or_else(|| {
            ShardError::corrupt(
                self.index_path(),
                at + 24,
                format!(
                    "sample {i} refers to shard {} but there are {} shards",
                    e.shard,
                    self.shards.len()
                ),
            )
        })?;
        if e.record >= shard.footer.record_count {
            return Err(ShardError::corrupt(
                self.index_path(),
                at + 28,
                format!(
                    "sample {i} refers to record {} of {}, which has {} records",
                    e.record,
                    shard.path().display(),
                    shard.footer.record_count
                ),
            ));
        }
        let r = shard.record(e.record)?;
        Ok(PackedSample {
            index: i,
            label: e.label,
            key,
            meta,
            data: shard.bytes(&r),
            shard: e.shard,
            record: e.record,
            offset: r.offset,
            crc: r.crc,
        })
    }

    /// Sample `i`'s entry, key and metadata, bounds-checked against the heap (not against the
    /// shard table: [`Dataset::sample`] does that). `i < len()` is the caller's to check.
    pub fn sample_entry(&self, i: u64) -> Result<(SampleEntry, &[u8], &[u8]), ShardError> {
        let at = self.sample_entry_offset(i);
        let e = SampleEntry::decode(&self.index.map[at as usize..at as usize + SAMPLE_ENTRY_LEN]);
        let kv = self.heap(
            e.heap_offset,
            u64::from(e.key_len) + u64::from(e.meta_len),
            at + 8,
            "sample key",
        )?;
        let (key, meta) = kv.split_at(e.key_len as usize);
        Ok((e, key, meta))
    }

    /// Sample `i` with its record CRC checked.
    pub fn sample_checked(&self, i: u64) -> Result<PackedSample<'_>, ShardError> {
        let s = self.sample(i)?;
        let computed = crc(s.data);
        if computed != s.crc {
            return Err(ShardError::Checksum {
                path: self.shards[s.shard as usize].path().to_owned(),
                offset: s.offset,
                what: format!(
                    "record {} (sample {i}, key {:?})",
                    s.record,
                    s.key.escape_ascii().to_string()
                ),
                stored: s.crc,
                computed,
            });
        }
        Ok(s)
    }

    /// Checks that the files sample `i` was read from did not change on disk since they were
    /// mapped (see [`crate::fault`]): the index, and the shard of `sample` (every shard when the
    /// lookup failed and `sample` is `None`). Call it after the sample's bytes have been used:
    /// bytes read after a fault are zeros, not the file's. A file that faulted fails every later
    /// check, so no sample of it is served again.
    pub fn check_faults(&self, i: u64, sample: Option<&PackedSample<'_>>) -> Result<(), ShardError> {
        if let Some(at) = self.index.fault() {
            return Err(self.index.changed(at, format!("the index entry of sample {i}")));
        }
        let check = |shard: &Shard, what: &dyn Fn() -> String| match shard.file.fault() {
            Some(at) => Err(shard.file.changed(at, what())),
            None => Ok(()),
        };
        match sample {
            Some(s) => check(&self.shards[s.shard as usize], &|| {
                format!(
                    "sample {i} (record {}, bytes {}..{})",
                    s.record,
                    s.offset,
                    s.offset + s.data.len() as u64
                )
            }),
            None => self
                .shards
                .iter()
                .try_for_each(|shard| check(shard, &|| format!("sample {i}"))),
        }
    }

    pub fn index_path(&self) -> &Path {
        &self.index.path
    }

    pub fn sample_entry_offset(&self, i: u64) -> u64 {
        self.header.samples_offset + i * SAMPLE_ENTRY_LEN as u64
    }

    pub fn shard_entry_offset(&self, n: u32) -> u64 {
        self.header.shards_offset + u64::from(n) * SHARD_ENTRY_LEN as u64
    }

    pub fn shard_entry(&self, n: u32) -> ShardEntry {
        let at = self.shard_entry_offset(n) as usize;
        // In bounds: IndexHeader::decode checked the shard table lies inside the file.
        ShardEntry::decode(&self.index.map[at..at + SHARD_ENTRY_LEN])
    }

    /// `len` heap bytes at heap-relative `offset`; `entry_at` locates the referring entry.
    pub fn heap(&self, offset: u64, len: u64, entry_at: u64, what: &str) -> Result<&[u8], ShardError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.header.heap_len => {
                let start = self.header.heap_offset + offset;
                Ok(&self.index.map[start as usize..(start + len) as usize])
            }
            _ => Err(ShardError::corrupt(
                self.index_path(),
                entry_at,
                format!(
                    "{what} ({len} bytes at heap offset {offset}) is outside the heap ({} bytes)",
                    self.header.heap_len
                ),
            )),
        }
    }
}
