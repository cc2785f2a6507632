//! Streaming writer of a packed dataset.
//!
//! Samples are pushed in their final order; the writer appends each to the current shard file and
//! starts a new shard when the next record would take the current one past the target size. Each
//! shard is written front to back exactly once, with its `body_crc` computed on the way, so the
//! writer never seeks and never reads back. The index is written last, by [`DatasetWriter::finish`].
//!
//! The output depends only on the sequence of pushes and the options: no timestamps, no
//! randomness, no absolute paths. That is what makes `ringfeed pack` deterministic whatever its
//! thread count.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::{
    ClassEntry, DEFAULT_RECORD_ALIGN, INDEX_FILE, INDEX_FOOTER_LEN, INDEX_HEADER_LEN, IndexFooter, IndexHeader,
    MAX_RECORD_ALIGN, MIN_RECORD_ALIGN, MINOR, RECORD_ENTRY_LEN, RecordEntry, SHARD_ENTRY_LEN, SHARD_FOOTER_LEN,
    SampleEntry, ShardEntry, ShardError, ShardFooter, ShardHeader, align_up, crc, shard_file_name,
};

/// How a dataset is laid out on disk.
#[derive(Debug, Clone, Copy)]
pub struct WriterOptions {
    /// A shard is closed before a record would take it past this many bytes (a shard always
    /// holds at least one record, so a single larger record makes a larger shard).
    pub target_shard_bytes: u64,
    /// Alignment of every record inside a shard; a power of two in 8..=1 MiB.
    pub record_align: u32,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            target_shard_bytes: 256 << 20,
            record_align: DEFAULT_RECORD_ALIGN,
        }
    }
}

/// What [`DatasetWriter::finish`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteSummary {
    pub samples: u64,
    pub shards: u32,
    pub classes: u32,
    /// Total bytes of all files, index included.
    pub bytes: u64,
    /// Sum of the records' lengths (the encoded images alone).
    pub payload_bytes: u64,
}

/// Writes a packed dataset into an existing, empty directory.
#[derive(Debug)]
pub struct DatasetWriter {
    dir: PathBuf,
    opts: WriterOptions,
    current: Option<ShardWriter>,
    /// Finished shards: (entry with the name's heap offset still unset, name).
    shards: Vec<(ShardEntry, String)>,
    samples: Vec<SampleEntry>,
    /// Keys and metadata of the samples, in push order; names are appended by `finish`.
    heap: Vec<u8>,
    payload_bytes: u64,
    shard_bytes: u64,
}

impl DatasetWriter {
    /// Starts a dataset in `dir`, which must exist (the caller chooses a temporary name and
    /// renames it when `finish` has returned).
    pub fn create(dir: &Path, opts: WriterOptions) -> Result<Self, ShardError> {
        let a = opts.record_align;
        if !a.is_power_of_two() || !(MIN_RECORD_ALIGN..=MAX_RECORD_ALIGN).contains(&a) {
            return Err(ShardError::corrupt(
                dir,
                0,
                format!("record alignment {a} must be a power of two in {MIN_RECORD_ALIGN}..={MAX_RECORD_ALIGN}"),
            ));
        }
        Ok(DatasetWriter {
            dir: dir.to_owned(),
            opts,
            current: None,
            shards: Vec::new(),
            samples: Vec::new(),
            heap: Vec::new(),
            payload_bytes: 0,
            shard_bytes: 0,
        })
    }

    /// Number of samples pushed so far.
    pub fn len(&self) -> u64 {
        self.samples.len() as u64
    }

    /// Whether no sample has been pushed yet.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Bytes written to shard files so far (for progress reports).
    pub fn bytes_written(&self) -> u64 {
        self.shard_bytes + self.current.as_ref().map_or(0, |s| s.pos)
    }

    /// Appends one sample. `meta` is empty or a UTF-8 JSON object.
    pub fn push(&mut self, key: &[u8], label: i64, meta: &[u8], data: &[u8]) -> Result<(), ShardError> {
        if data.is_empty() {
            return Err(ShardError::corrupt(
                &self.dir,
                0,
                format!(
                    "sample {:?} has no bytes; empty records are not allowed",
                    key.escape_ascii().to_string()
                ),
            ));
        }
        let length = u32::try_from(data.len()).map_err(|_| {
            ShardError::corrupt(
                &self.dir,
                0,
                format!(
                    "sample {:?} is {} bytes; records are limited to 4 GiB",
                    key.escape_ascii().to_string(),
                    data.len()
                ),
            )
        })?;
        let key_len =
            u32::try_from(key.len()).map_err(|_| ShardError::corrupt(&self.dir, 0, "key longer than 4 GiB"))?;
        let meta_len =
            u32::try_from(meta.len()).map_err(|_| ShardError::corrupt(&self.dir, 0, "metadata longer than 4 GiB"))?;

        let rollover = match &self.current {
            Some(s) => s.record_count() > 0 && s.size_with(length) > self.opts.target_shard_bytes,
            None => false,
        };
        if rollover {
            self.close_shard()?;
        }
        if self.current.is_none() {
            let number = u32::try_from(self.shards.len())
                .map_err(|_| ShardError::corrupt(&self.dir, 0, "more than 2^32 shards"))?;
            let name = shard_file_name(number);
            self.current = Some(ShardWriter::create(
                &self.dir.join(&name),
                name,
                number,
                self.opts.record_align,
            )?);
        }
        let shard = self.current.as_mut().expect("a shard is open after the check above");
        let record = shard.record_count();
        shard.append(data, length)?;

        let heap_offset = self.heap.len() as u64;
        self.heap.extend_from_slice(key);
        self.heap.extend_from_slice(meta);
        self.samples.push(SampleEntry {
            label,
            heap_offset,
            key_len,
            meta_len,
            shard: shard.number,
            record,
        });
        self.payload_bytes += u64::from(length);
        Ok(())
    }

    fn close_shard(&mut self) -> Result<(), ShardError> {
        if let Some(s) = self.current.take() {
            let (entry, name) = s.finish()?;
            self.shard_bytes += entry.file_len;
            self.shards.push((entry, name));
        }
        Ok(())
    }

    /// Closes the last shard and writes `index.rfi`. `classes` are the class names by label;
    /// `info` is the info JSON object. Every file is synced before this returns.
    pub fn finish(mut self, classes: &[Vec<u8>], info: &str) -> Result<WriteSummary, ShardError> {
        self.close_shard()?;
        let class_count =
            u32::try_from(classes.len()).map_err(|_| ShardError::corrupt(&self.dir, 0, "more than 2^32 classes"))?;
        let out_of_range = |s: &&SampleEntry| s.label < -1 || (class_count > 0 && s.label >= i64::from(class_count));
        if let Some((i, s)) = self.samples.iter().enumerate().find(|(_, s)| out_of_range(s)) {
            return Err(ShardError::corrupt(
                &self.dir,
                0,
                format!(
                    "sample {i} has label {}; labels are -1 (none) or 0..{class_count} when there are classes, and never below -1",
                    s.label
                ),
            ));
        }

        // Names go into the heap after the keys, so sample heap offsets stay as pushed.
        let mut shard_entries = Vec::with_capacity(self.shards.len());
        for (mut e, name) in std::mem::take(&mut self.shards) {
            e.name_offset = self.heap.len() as u64;
            self.heap.extend_from_slice(name.as_bytes());
            shard_entries.push(e);
        }
        let mut class_entries = Vec::with_capacity(classes.len());
        for name in classes {
            let name_len = u32::try_from(name.len())
                .map_err(|_| ShardError::corrupt(&self.dir, 0, "class name longer than 4 GiB"))?;
            class_entries.push(ClassEntry {
                name_offset: self.heap.len() as u64,
                name_len,
            });
            self.heap.extend_from_slice(name);
        }

        let a8 = |x: u64| align_up(x, 8).expect("index sizes are far below u64::MAX");
        let shards_offset = INDEX_HEADER_LEN as u64;
        let classes_offset = a8(shards_offset + (shard_entries.len() * SHARD_ENTRY_LEN) as u64);
        let samples_offset = a8(classes_offset + (class_entries.len() * super::CLASS_ENTRY_LEN) as u64);
        let heap_offset = a8(samples_offset + (self.samples.len() * super::SAMPLE_ENTRY_LEN) as u64);
        let info_offset = a8(heap_offset + self.heap.len() as u64);
        let footer_offset = a8(info_offset + info.len() as u64);
        let header = IndexHeader {
            minor: MINOR,
            flags: 0,
            sample_count: self.samples.len() as u64,
            shard_count: shard_entries.len() as u32,
            class_count,
            shards_offset,
            classes_offset,
            samples_offset,
            heap_offset,
            heap_len: self.heap.len() as u64,
            info_offset,
            info_len: info.len() as u64,
        };

        let path = self.dir.join(INDEX_FILE);
        let mut out = CrcWriter::create(&path)?;
        out.write(&header.encode())?;
        for e in &shard_entries {
            out.write(&e.encode())?;
        }
        out.pad_to(classes_offset)?;
        for e in &class_entries {
            out.write(&e.encode())?;
        }
        out.pad_to(samples_offset)?;
        for e in &self.samples {
            out.write(&e.encode())?;
        }
        out.pad_to(heap_offset)?;
        out.write(&self.heap)?;
        out.pad_to(info_offset)?;
        out.write(info.as_bytes())?;
        out.pad_to(footer_offset)?;
        let footer = IndexFooter {
            minor: MINOR,
            body_crc: out.crc,
            file_len: footer_offset + INDEX_FOOTER_LEN as u64,
        };
        out.write(&footer.encode())?;
        let index_len = out.finish()?;

        Ok(WriteSummary {
            samples: self.samples.len() as u64,
            shards: header.shard_count,
            classes: class_count,
            bytes: self.shard_bytes + index_len,
            payload_bytes: self.payload_bytes,
        })
    }
}

/// A file written front to back, with the CRC-32C of everything written so far.
#[derive(Debug)]
struct CrcWriter {
    path: PathBuf,
    out: BufWriter<File>,
    pos: u64,
    crc: u32,
}

const ZEROS: [u8; 4096] = [0; 4096];

impl CrcWriter {
    fn create(path: &Path) -> Result<Self, ShardError> {
        let file = File::create_new(path).map_err(|e| ShardError::io(path, e))?;
        Ok(CrcWriter {
            path: path.to_owned(),
            out: BufWriter::with_capacity(1 << 20, file),
            pos: 0,
            crc: 0,
        })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), ShardError> {
        self.out.write_all(bytes).map_err(|e| ShardError::io(&self.path, e))?;
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Writes zeros up to absolute offset `to`.
    fn pad_to(&mut self, to: u64) -> Result<(), ShardError> {
        debug_assert!(to >= self.pos);
        while self.pos < to {
            let n = (to - self.pos).min(ZEROS.len() as u64) as usize;
            self.write(&ZEROS[..n])?;
        }
        Ok(())
    }

    /// Flushes and syncs; returns the file's length.
    fn finish(self) -> Result<u64, ShardError> {
        let file = self
            .out
            .into_inner()
            .map_err(|e| ShardError::io(&self.path, e.into_error()))?;
        file.sync_all().map_err(|e| ShardError::io(&self.path, e))?;
        Ok(self.pos)
    }
}

/// One shard file being written.
#[derive(Debug)]
struct ShardWriter {
    out: CrcWriter,
    name: String,
    number: u32,
    header: ShardHeader,
    table: Vec<RecordEntry>,
    pos: u64,
}

impl ShardWriter {
    fn create(path: &Path, name: String, number: u32, record_align: u32) -> Result<Self, ShardError> {
        let mut out = CrcWriter::create(path)?;
        let header = ShardHeader {
            minor: MINOR,
            record_align,
            shard_number: number,
        };
        out.write(&header.encode())?;
        out.pad_to(header.data_offset())?;
        let pos = out.pos;
        Ok(ShardWriter {
            out,
            name,
            number,
            header,
            table: Vec::new(),
            pos,
        })
    }

    fn record_count(&self) -> u32 {
        self.table.len() as u32
    }

    fn align(&self) -> u64 {
        u64::from(self.header.record_align)
    }

    /// The file's length if a record of `length` bytes were appended and the shard closed.
    fn size_with(&self, length: u32) -> u64 {
        let a = self.align();
        let table_offset = align_up(self.pos + u64::from(length), a).unwrap_or(u64::MAX);
        let table_end = table_offset + (self.table.len() as u64 + 1) * RECORD_ENTRY_LEN as u64;
        align_up(table_end, 8).unwrap_or(u64::MAX) + SHARD_FOOTER_LEN as u64
    }

    fn append(&mut self, data: &[u8], length: u32) -> Result<(), ShardError> {
        let offset = self.pos;
        self.out.write(data)?;
        let end = align_up(offset + u64::from(length), self.align())
            .ok_or_else(|| ShardError::corrupt(&self.out.path, offset, "shard offset overflow"))?;
        self.out.pad_to(end)?;
        self.pos = end;
        self.table.push(RecordEntry {
            offset,
            length,
            crc: crc(data),
        });
        Ok(())
    }

    fn finish(mut self) -> Result<(ShardEntry, String), ShardError> {
        let table_offset = self.pos;
        let mut table = Vec::with_capacity(self.table.len() * RECORD_ENTRY_LEN);
        for e in &self.table {
            table.extend_from_slice(&e.encode());
        }
        self.out.write(&table)?;
        let footer_offset = align_up(self.out.pos, 8).expect("shard sizes are far below u64::MAX");
        self.out.pad_to(footer_offset)?;
        let footer = ShardFooter {
            minor: MINOR,
            record_count: self.record_count(),
            table_offset,
            file_len: footer_offset + SHARD_FOOTER_LEN as u64,
            table_crc: crc(&table),
            body_crc: self.out.crc,
        };
        self.out.write(&footer.encode())?;
        let file_len = self.out.finish()?;
        debug_assert_eq!(file_len, footer.file_len);
        let entry = ShardEntry {
            name_offset: 0,
            name_len: self.name.len() as u32,
            record_count: footer.record_count,
            file_len,
            body_crc: footer.body_crc,
        };
        Ok((entry, self.name))
    }
}
