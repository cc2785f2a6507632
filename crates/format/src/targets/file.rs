//! The packed targets file `targets.rft`, version 1.1 (`proto/targets.md` is the normative text):
//! its layout, [`TargetsWriter`], [`TargetsFile`] (the reader) and [`verify_targets`].
//!
//! Invariants:
//! - Structures are decoded with explicit little-endian reads; the footer and header are checked
//!   (magic, version, CRC) before any other field is used.
//! - A record is checked against its entry (bounds, `len = 8 + 24·n + m` plus, in 1.1, the
//!   keypoints and instance masks it has, `n <= max_boxes`)
//!   before its boxes are read, so a damaged file is an error naming the file and offset, never
//!   a panic or a read out of bounds.
//! - Errors are [`ShardError`]s: the same kinds `shard.md` defines, the same messages' shape.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::{LabelMap, Targets};
use crate::shard::reader::Mapped;
use crate::shard::{MAJOR, ShardError, align_up, crc};

/// File name of the targets file inside a dataset directory.
pub const TARGETS_FILE: &str = "targets.rft";
/// Minor version written by this implementation when a file has instance masks or keypoints
/// (a file with neither is written as 1.0, which every reader reads); any minor of [`MAJOR`] is
/// read.
pub const TARGETS_MINOR: u16 = 1;

pub const TARGETS_MAGIC: [u8; 8] = *b"RFTARGS\0";
pub const TARGETS_END_MAGIC: [u8; 8] = *b"RFTGEND\0";
pub const TARGETS_HEADER_LEN: usize = 64;
pub const TARGETS_FOOTER_LEN: usize = 32;
pub const TARGETS_ENTRY_LEN: usize = 16;
/// A record's fixed part: `box_count` and `mask_len`.
pub const RECORD_HEAD_LEN: usize = 8;

/// Header flag: the file has boxes.
pub const FLAG_BOXES: u32 = 1;
/// Header flag: every record has a mask.
pub const FLAG_MASKS: u32 = 2;
/// Header flag (1.1): every record has an instance mask per box.
pub const FLAG_INSTANCES: u32 = 4;
/// Header flag (1.1): every record has `keypoints` points per box.
pub const FLAG_KEYPOINTS: u32 = 8;

const _: () = assert!(TARGETS_ENTRY_LEN == 8 + 4 + 4);
const _: () = assert!(TARGETS_FOOTER_LEN == 8 + 8 + 4 + 4 + 4 + 4);

/// The PNG signature every stored mask starts with.
const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The header's members (`proto/targets.md`, "TargetsHeader").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetsHeader {
    pub minor: u16,
    pub flags: u32,
    pub sample_count: u64,
    pub max_boxes: u32,
    pub categories_len: u32,
    pub categories_offset: u64,
    pub table_offset: u64,
    /// 1.1: keypoints per box (0: none; 1.0 files have zero here, a reserved field then).
    pub keypoints: u32,
}

impl TargetsHeader {
    pub fn has_boxes(&self) -> bool {
        self.flags & FLAG_BOXES != 0
    }

    pub fn has_masks(&self) -> bool {
        self.flags & FLAG_MASKS != 0
    }

    /// 1.1: whether every record has an instance mask per box.
    pub fn has_instances(&self) -> bool {
        self.flags & FLAG_INSTANCES != 0
    }

    fn encode(&self) -> [u8; TARGETS_HEADER_LEN] {
        let mut b = [0u8; TARGETS_HEADER_LEN];
        b[0..8].copy_from_slice(&TARGETS_MAGIC);
        b[8..10].copy_from_slice(&MAJOR.to_le_bytes());
        b[10..12].copy_from_slice(&self.minor.to_le_bytes());
        b[12..16].copy_from_slice(&self.flags.to_le_bytes());
        b[16..24].copy_from_slice(&self.sample_count.to_le_bytes());
        b[24..28].copy_from_slice(&self.max_boxes.to_le_bytes());
        b[28..32].copy_from_slice(&self.categories_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.categories_offset.to_le_bytes());
        b[40..48].copy_from_slice(&self.table_offset.to_le_bytes());
        b[48..52].copy_from_slice(&self.keypoints.to_le_bytes());
        let c = crc(&b[..60]);
        b[60..64].copy_from_slice(&c.to_le_bytes());
        b
    }

    fn decode(path: &Path, b: &[u8]) -> Result<Self, ShardError> {
        if b[0..8] != TARGETS_MAGIC {
            return Err(ShardError::BadMagic {
                path: path.to_owned(),
                offset: 0,
                what: "targets header",
                expected: TARGETS_MAGIC,
                found: b[0..8].try_into().expect("8 bytes"),
            });
        }
        let (stored, computed) = (u32_at(b, 60), crc(&b[..60]));
        if stored != computed {
            return Err(ShardError::Checksum {
                path: path.to_owned(),
                offset: 60,
                what: "targets header".to_owned(),
                stored,
                computed,
            });
        }
        let (major, minor) = (u16_at(b, 8), u16_at(b, 10));
        if major != MAJOR {
            return Err(ShardError::UnsupportedVersion {
                path: path.to_owned(),
                offset: 8,
                what: "targets file",
                major,
                minor,
            });
        }
        Ok(TargetsHeader {
            minor,
            flags: u32_at(b, 12),
            sample_count: u64_at(b, 16),
            max_boxes: u32_at(b, 24),
            categories_len: u32_at(b, 28),
            categories_offset: u64_at(b, 32),
            table_offset: u64_at(b, 40),
            keypoints: if minor >= 1 { u32_at(b, 48) } else { 0 },
        })
    }
}

/// Writes `targets.rft` in one pass: records as they come, then the categories, the table, the
/// footer, and last the header (whose counts are known only then).
#[derive(Debug)]
pub struct TargetsWriter {
    path: PathBuf,
    out: BufWriter<File>,
    flags: u32,
    /// Bytes written so far (the header's 64 included, as zeros until [`TargetsWriter::finish`]).
    pos: u64,
    /// CRC-32C of the bytes after the header, for `body_crc` (combined with the header's at the end).
    rest_crc: u32,
    entries: Vec<u8>,
    samples: u64,
    max_boxes: u32,
    /// 1.1: keypoints per box (0: none).
    keypoints: u32,
    record: Vec<u8>,
}

/// One sample's instance masks as [`TargetsWriter::push_all`] takes them: the stored image's
/// `(width, height)` and each box's runs already encoded ([`super::rle::encode_runs`]).
#[derive(Debug, Clone, Copy)]
pub struct InstancesIn<'a> {
    pub width: u32,
    pub height: u32,
    pub runs: &'a [Vec<u8>],
}

impl TargetsWriter {
    /// Creates `path`; `boxes` and `masks` set the header's flags, which every record must follow.
    pub fn create(path: &Path, boxes: bool, masks: bool) -> Result<Self, ShardError> {
        Self::create_with(path, boxes, masks, false, 0)
    }

    /// [`TargetsWriter::create`] for a 1.1 file: `instances` sets the instance-masks flag,
    /// `keypoints` (> 0) the keypoints flag and the points per box. Both need `boxes`.
    pub fn create_with(
        path: &Path,
        boxes: bool,
        masks: bool,
        instances: bool,
        keypoints: u32,
    ) -> Result<Self, ShardError> {
        let file = File::create(path).map_err(|e| ShardError::io(path, e))?;
        let mut out = BufWriter::new(file);
        out.write_all(&[0u8; TARGETS_HEADER_LEN])
            .map_err(|e| ShardError::io(path, e))?;
        Ok(TargetsWriter {
            path: path.to_owned(),
            out,
            flags: (u32::from(boxes) * FLAG_BOXES)
                | (u32::from(masks) * FLAG_MASKS)
                | (u32::from(boxes && instances) * FLAG_INSTANCES)
                | (u32::from(boxes && keypoints > 0) * FLAG_KEYPOINTS),
            pos: TARGETS_HEADER_LEN as u64,
            rest_crc: 0,
            entries: Vec::new(),
            samples: 0,
            max_boxes: 0,
            keypoints: if boxes { keypoints } else { 0 },
            record: Vec::new(),
        })
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), ShardError> {
        self.out.write_all(bytes).map_err(|e| ShardError::io(&self.path, e))?;
        self.rest_crc = crc32c::crc32c_append(self.rest_crc, bytes);
        self.pos += bytes.len() as u64;
        Ok(())
    }

    fn pad_to_8(&mut self) -> Result<(), ShardError> {
        let aligned = align_up(self.pos, 8).expect("a file offset far below u64::MAX");
        let zeros = [0u8; 8];
        self.put(&zeros[..(aligned - self.pos) as usize])
    }

    /// Appends the next sample's record: its boxes and labels (`boxes.len() == labels.len()`) and
    /// its mask as 8-bit greyscale PNG bytes. A record that does not fit the flags (boxes
    /// without the boxes flag, a mask missing or extra), non-finite or unordered boxes are
    /// refused as `corrupt`, naming the sample.
    pub fn push(&mut self, boxes: &[[f32; 4]], labels: &[i64], mask_png: Option<&[u8]>) -> Result<(), ShardError> {
        self.push_all(boxes, labels, mask_png, None, &[])
    }

    /// [`TargetsWriter::push`] with 1.1's parts: each box's instance mask (required exactly when
    /// the file has them, one per box) and its keypoints (`boxes.len() * keypoints`, required
    /// exactly when the file has them).
    pub fn push_all(
        &mut self,
        boxes: &[[f32; 4]],
        labels: &[i64],
        mask_png: Option<&[u8]>,
        instances: Option<InstancesIn<'_>>,
        keypoints: &[[f32; 3]],
    ) -> Result<(), ShardError> {
        let sample = self.samples;
        let refuse = |detail: String| ShardError::corrupt(&self.path, self.pos, format!("sample {sample}: {detail}"));
        if boxes.len() != labels.len() {
            return Err(refuse(format!("{} boxes but {} labels", boxes.len(), labels.len())));
        }
        if !boxes.is_empty() && self.flags & FLAG_BOXES == 0 {
            return Err(refuse("boxes given to a targets file without boxes".to_owned()));
        }
        if mask_png.is_some() != (self.flags & FLAG_MASKS != 0) {
            return Err(refuse(if mask_png.is_some() {
                "a mask given to a targets file without masks".to_owned()
            } else {
                "no mask given to a targets file with masks".to_owned()
            }));
        }
        if let Some(b) = boxes.iter().find(|b| !box_is_valid(b)) {
            return Err(refuse(format!(
                "box {b:?} is not finite or has a negative size (xyxy: x0 <= x1, y0 <= y1)"
            )));
        }
        if instances.is_some() != (self.flags & FLAG_INSTANCES != 0)
            || instances.is_some_and(|i| i.runs.len() != boxes.len())
        {
            return Err(refuse(format!(
                "{} instance masks for {} boxes in a targets file {} instance masks",
                instances.map_or(0, |i| i.runs.len()),
                boxes.len(),
                if self.flags & FLAG_INSTANCES != 0 {
                    "with"
                } else {
                    "without"
                }
            )));
        }
        if keypoints.len() != boxes.len() * self.keypoints as usize {
            return Err(refuse(format!(
                "{} keypoints for {} boxes, the file has {} per box",
                keypoints.len(),
                boxes.len(),
                self.keypoints
            )));
        }
        let mask = mask_png.unwrap_or_default();
        let count = u32::try_from(boxes.len()).map_err(|_| refuse("too many boxes".to_owned()))?;
        let mask_len = u32::try_from(mask.len()).map_err(|_| refuse("the mask is over 4 GiB".to_owned()))?;
        let mut record = std::mem::take(&mut self.record);
        record.clear();
        record.extend_from_slice(&count.to_le_bytes());
        record.extend_from_slice(&mask_len.to_le_bytes());
        for b in boxes {
            for v in b {
                record.extend_from_slice(&v.to_le_bytes());
            }
        }
        for l in labels {
            record.extend_from_slice(&l.to_le_bytes());
        }
        record.extend_from_slice(mask);
        for p in keypoints {
            for v in p {
                record.extend_from_slice(&v.to_le_bytes());
            }
        }
        if let Some(inst) = instances {
            record.extend_from_slice(&inst.width.to_le_bytes());
            record.extend_from_slice(&inst.height.to_le_bytes());
            for r in inst.runs {
                let l = u32::try_from(r.len()).map_err(|_| refuse("an instance mask is over 4 GiB".to_owned()))?;
                record.extend_from_slice(&l.to_le_bytes());
            }
            for r in inst.runs {
                record.extend_from_slice(r);
            }
        }
        let len = u32::try_from(record.len()).map_err(|_| refuse("the record is over 4 GiB".to_owned()))?;
        let offset = self.pos;
        self.put(&record)?;
        self.pad_to_8()?;
        self.entries.extend_from_slice(&offset.to_le_bytes());
        self.entries.extend_from_slice(&len.to_le_bytes());
        self.entries.extend_from_slice(&crc(&record).to_le_bytes());
        self.record = record;
        self.samples += 1;
        self.max_boxes = self.max_boxes.max(count);
        Ok(())
    }

    /// Samples pushed so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Writes the categories (a JSON array, or `""` for none), the table, the footer and the
    /// header, and syncs the file. Returns the file's length.
    pub fn finish(mut self, categories_json: &str) -> Result<u64, ShardError> {
        let categories_offset = self.pos;
        self.put(categories_json.as_bytes())?;
        self.pad_to_8()?;
        let table_offset = self.pos;
        let entries = std::mem::take(&mut self.entries);
        self.put(&entries)?;
        let header = TargetsHeader {
            minor: if self.flags & (FLAG_INSTANCES | FLAG_KEYPOINTS) != 0 {
                TARGETS_MINOR
            } else {
                0
            },
            keypoints: self.keypoints,
            flags: self.flags,
            sample_count: self.samples,
            max_boxes: self.max_boxes,
            categories_len: u32::try_from(categories_json.len())
                .map_err(|_| ShardError::corrupt(&self.path, categories_offset, "the categories are over 4 GiB"))?,
            categories_offset,
            table_offset,
        }
        .encode();
        let rest_len = (self.pos - TARGETS_HEADER_LEN as u64) as usize;
        let body_crc = crc32c::crc32c_combine(crc(&header), self.rest_crc, rest_len);
        let file_len = self.pos + TARGETS_FOOTER_LEN as u64;
        let mut footer = [0u8; TARGETS_FOOTER_LEN];
        footer[0..8].copy_from_slice(&TARGETS_END_MAGIC);
        footer[8..16].copy_from_slice(&file_len.to_le_bytes());
        footer[16..20].copy_from_slice(&crc(&entries).to_le_bytes());
        footer[20..24].copy_from_slice(&body_crc.to_le_bytes());
        let c = crc(&footer[..28]);
        footer[28..32].copy_from_slice(&c.to_le_bytes());
        let path = self.path.clone();
        let io = |e| ShardError::io(&path, e);
        self.out.write_all(&footer).map_err(io)?;
        let mut file = self.out.into_inner().map_err(|e| io(e.into_error()))?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        file.write_all(&header).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(file_len)
    }
}

fn box_is_valid(b: &[f32; 4]) -> bool {
    b.iter().all(|v| v.is_finite()) && b[0] <= b[2] && b[1] <= b[3]
}

/// One sample's record as stored: boxes and labels decoded, the mask still PNG bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredTargets<'a> {
    pub boxes: Vec<[f32; 4]>,
    pub labels: Vec<i64>,
    /// The mask's PNG bytes (empty: no mask).
    pub mask_png: &'a [u8],
    /// 1.1: each box's keypoints `[x, y, v]`, box by box (empty: none).
    pub keypoints: Vec<[f32; 3]>,
    /// 1.1: the instance masks' `(width, height)` and each box's encoded runs (`None`: none).
    pub instances: Option<StoredInstances<'a>>,
}

/// A record's instance masks as stored ([`super::rle`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredInstances<'a> {
    pub width: u32,
    pub height: u32,
    /// Each box's runs, LEB128 varints.
    pub runs: Vec<&'a [u8]>,
}

impl StoredTargets<'_> {
    /// Moves the boxes and labels into `targets`, with `mask` as its label map (decoded by the
    /// caller: this crate does not decode PNG).
    pub fn into_targets(self, mask: Option<LabelMap>) -> Targets {
        Targets {
            boxes: self.boxes,
            labels: self.labels,
            mask,
            instances: Vec::new(),
            keypoints: self.keypoints,
        }
    }
}

/// An open `targets.rft`: header and footer checked; records read by sample index.
#[derive(Debug)]
pub struct TargetsFile {
    file: Mapped,
    pub header: TargetsHeader,
    table_crc: u32,
    body_crc: u32,
}

impl TargetsFile {
    /// The targets file of the dataset directory `dir`, if it has one.
    pub fn open_in(dir: &Path) -> Result<Option<Self>, ShardError> {
        let path = dir.join(TARGETS_FILE);
        if !path.exists() {
            return Ok(None);
        }
        Self::open(&path).map(Some)
    }

    /// Opens `path`, checking the footer, the header and the structure's offsets (not the CRCs
    /// of the body or the table: [`verify_targets`] does).
    pub fn open(path: &Path) -> Result<Self, ShardError> {
        Self::from_mapped(Mapped::open(path)?)
    }

    /// Reads a file held in memory (tests, fuzzing).
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Self, ShardError> {
        Self::from_mapped(Mapped {
            path: path.to_owned(),
            map: crate::shard::reader::Backing::Owned(bytes),
        })
    }

    fn from_mapped(file: Mapped) -> Result<Self, ShardError> {
        let path = file.path.clone();
        let len = file.len();
        let min = (TARGETS_HEADER_LEN + TARGETS_FOOTER_LEN) as u64;
        if len < min {
            return Err(ShardError::truncated(
                &path,
                len,
                format!("a targets file has at least {min} bytes, this one {len}"),
            ));
        }
        let at = len - TARGETS_FOOTER_LEN as u64;
        let f = file.slice(at, TARGETS_FOOTER_LEN as u64, "targets footer")?;
        if f[0..8] != TARGETS_END_MAGIC {
            return Err(ShardError::BadMagic {
                path,
                offset: at,
                what: "targets footer",
                expected: TARGETS_END_MAGIC,
                found: f[0..8].try_into().expect("8 bytes"),
            });
        }
        let (stored, computed) = (u32_at(f, 28), crc(&f[..28]));
        if stored != computed {
            return Err(ShardError::Checksum {
                path,
                offset: at + 28,
                what: "targets footer".to_owned(),
                stored,
                computed,
            });
        }
        let (file_len, table_crc, body_crc) = (u64_at(f, 8), u32_at(f, 16), u32_at(f, 20));
        let header = TargetsHeader::decode(&path, file.slice(0, TARGETS_HEADER_LEN as u64, "targets header")?)?;
        if file_len != len {
            return Err(ShardError::truncated(
                &path,
                at + 8,
                format!("the footer says the file has {file_len} bytes, it has {len}"),
            ));
        }
        let table_len = header.sample_count.checked_mul(TARGETS_ENTRY_LEN as u64);
        let structure_ok = header.categories_offset >= TARGETS_HEADER_LEN as u64
            && header.categories_offset % 8 == 0
            && header.table_offset % 8 == 0
            && align_up(header.categories_offset + u64::from(header.categories_len), 8) == Some(header.table_offset)
            && table_len.and_then(|t| t.checked_add(header.table_offset)) == Some(at);
        if !structure_ok {
            return Err(ShardError::corrupt(
                &path,
                32,
                format!(
                    "the header's categories ({} bytes at {}) and table ({} entries at {}) do not fit the file's {len} bytes",
                    header.categories_len, header.categories_offset, header.sample_count, header.table_offset
                ),
            ));
        }
        Ok(TargetsFile {
            file,
            header,
            table_crc,
            body_crc,
        })
    }

    pub fn path(&self) -> &Path {
        &self.file.path
    }

    pub fn len(&self) -> u64 {
        self.header.sample_count
    }

    pub fn is_empty(&self) -> bool {
        self.header.sample_count == 0
    }

    /// The file offset of the first SIGBUS in its mapping, if it changed on disk (`crate::fault`).
    pub fn fault(&self) -> Option<u64> {
        self.file.fault()
    }

    /// The categories JSON as stored (empty: none).
    pub fn categories(&self) -> &[u8] {
        let h = &self.header;
        &self.file.map[h.categories_offset as usize..(h.categories_offset + u64::from(h.categories_len)) as usize]
    }

    /// Sample `index`'s entry: `(offset, len, crc)`.
    fn entry(&self, index: u64) -> Result<(u64, u32, u32), ShardError> {
        if index >= self.header.sample_count {
            return Err(ShardError::OutOfRange {
                dir: self.file.path.clone(),
                index,
                len: self.header.sample_count,
            });
        }
        let at = self.header.table_offset + index * TARGETS_ENTRY_LEN as u64;
        let e = &self.file.map[at as usize..at as usize + TARGETS_ENTRY_LEN];
        Ok((u64_at(e, 0), u32_at(e, 8), u32_at(e, 12)))
    }

    /// Sample `index`'s record, structure checked; with `check_crc`, its CRC too.
    pub fn get(&self, index: u64, check_crc: bool) -> Result<StoredTargets<'_>, ShardError> {
        let (offset, len, stored) = self.entry(index)?;
        let path = &self.file.path;
        let entry_at = self.header.table_offset + index * TARGETS_ENTRY_LEN as u64;
        let bad = |at: u64, detail: String| ShardError::corrupt(path, at, format!("sample {index}: {detail}"));
        if offset < TARGETS_HEADER_LEN as u64
            || offset % 8 != 0
            || (len as usize) < RECORD_HEAD_LEN
            || offset + u64::from(len) > self.header.categories_offset
        {
            return Err(bad(
                entry_at,
                format!(
                    "the record ({len} bytes at {offset}) is not inside the records' area (64 .. {})",
                    self.header.categories_offset
                ),
            ));
        }
        let r = &self.file.map[offset as usize..(offset + u64::from(len)) as usize];
        if check_crc {
            let computed = crc(r);
            if computed != stored {
                return Err(ShardError::Checksum {
                    path: path.clone(),
                    offset,
                    what: format!("sample {index}'s targets record"),
                    stored,
                    computed,
                });
            }
        }
        let (n, m) = (u32_at(r, 0), u32_at(r, 4));
        if n > self.header.max_boxes {
            return Err(bad(
                offset,
                format!("{n} boxes, more than the header's max_boxes {}", self.header.max_boxes),
            ));
        }
        let base = RECORD_HEAD_LEN as u64 + 24 * u64::from(n) + u64::from(m);
        let kp_len = 12 * u64::from(n) * u64::from(self.header.keypoints);
        let mut want = base + kp_len;
        let inst_at = want as usize;
        let mut inst_lens = Vec::new();
        if self.header.has_instances() {
            let lens_end = want + 8 + 4 * u64::from(n);
            if lens_end <= u64::from(len) {
                inst_lens = (0..n as usize).map(|k| u32_at(r, inst_at + 8 + 4 * k)).collect();
            }
            want = lens_end + inst_lens.iter().map(|&l| u64::from(l)).sum::<u64>();
        }
        if want != u64::from(len) {
            return Err(bad(
                offset,
                format!(
                    "{n} boxes, a {m}-byte mask{} make {want} bytes, the entry says {len}",
                    if self.header.has_instances() || self.header.keypoints > 0 {
                        ", their keypoints and instance masks"
                    } else {
                        ""
                    }
                ),
            ));
        }
        let n = n as usize;
        let kp_at = base as usize;
        let keypoints = (0..n * self.header.keypoints as usize)
            .map(|k| {
                let at = kp_at + 12 * k;
                std::array::from_fn(|j| f32::from_le_bytes(r[at + 4 * j..at + 4 * j + 4].try_into().expect("4 bytes")))
            })
            .collect();
        let instances = self.header.has_instances().then(|| {
            let mut at = inst_at + 8 + 4 * n;
            let runs = inst_lens
                .iter()
                .map(|&l| {
                    let s = &r[at..at + l as usize];
                    at += l as usize;
                    s
                })
                .collect();
            StoredInstances {
                width: u32_at(r, inst_at),
                height: u32_at(r, inst_at + 4),
                runs,
            }
        });
        let boxes = (0..n)
            .map(|k| {
                let at = RECORD_HEAD_LEN + 16 * k;
                std::array::from_fn(|j| f32::from_le_bytes(r[at + 4 * j..at + 4 * j + 4].try_into().expect("4 bytes")))
            })
            .collect();
        let labels_at = RECORD_HEAD_LEN + 16 * n;
        let labels = (0..n)
            .map(|k| i64::from_le_bytes(r[labels_at + 8 * k..labels_at + 8 * k + 8].try_into().expect("8 bytes")))
            .collect();
        Ok(StoredTargets {
            boxes,
            labels,
            mask_png: &r[labels_at + 8 * n..kp_at],
            keypoints,
            instances,
        })
    }
}

/// What [`verify_targets`] found in a good file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetsReport {
    pub samples: u64,
    pub boxes: u64,
    pub max_boxes: u32,
    pub masks: u64,
    /// 1.1: instance masks (one per box of a file that has them).
    pub instances: u64,
    /// 1.1: keypoints per box.
    pub keypoints: u32,
    pub bytes: u64,
}

/// Checks `targets.rft` at `path` completely (`proto/targets.md`, "Verification order"), against
/// the dataset's `sample_count` when given.
pub fn verify_targets(path: &Path, sample_count: Option<u64>) -> Result<TargetsReport, ShardError> {
    let t = TargetsFile::open(path)?;
    let b: &[u8] = &t.file.map;
    let h = t.header;
    let footer_at = b.len() - TARGETS_FOOTER_LEN;
    let computed = crc(&b[h.table_offset as usize..footer_at]);
    if computed != t.table_crc {
        return Err(ShardError::Checksum {
            path: path.to_owned(),
            offset: footer_at as u64 + 16,
            what: "targets table".to_owned(),
            stored: t.table_crc,
            computed,
        });
    }
    let computed = crc(&b[..footer_at]);
    if computed != t.body_crc {
        return Err(ShardError::Checksum {
            path: path.to_owned(),
            offset: footer_at as u64 + 20,
            what: "targets body".to_owned(),
            stored: t.body_crc,
            computed,
        });
    }
    let corrupt = |at: usize, detail: String| ShardError::corrupt(path, at as u64, detail);
    if h.minor <= 1 {
        let reserved = if h.minor == 0 { 48 } else { 52 };
        if let Some(at) = (reserved..60)
            .chain(footer_at + 24..footer_at + 28)
            .find(|&i| b[i] != 0)
        {
            return Err(corrupt(at, "a reserved byte is not zero".to_owned()));
        }
        let known = match h.minor {
            0 => FLAG_BOXES | FLAG_MASKS,
            _ => FLAG_BOXES | FLAG_MASKS | FLAG_INSTANCES | FLAG_KEYPOINTS,
        };
        if h.flags & !known != 0 {
            return Err(corrupt(12, format!("unknown flags {:#x}", h.flags)));
        }
        if (h.flags & FLAG_KEYPOINTS != 0) != (h.keypoints > 0)
            || (h.flags & (FLAG_INSTANCES | FLAG_KEYPOINTS) != 0 && !h.has_boxes())
        {
            return Err(corrupt(
                12,
                format!(
                    "flags {:#x} and {} keypoints per box disagree (keypoints and instance masks go with boxes)",
                    h.flags, h.keypoints
                ),
            ));
        }
    }
    if let Some(want) = sample_count
        && want != h.sample_count
    {
        return Err(corrupt(
            16,
            format!(
                "the file has targets for {} samples, the index has {want}",
                h.sample_count
            ),
        ));
    }
    let (mut next, mut boxes, mut masks, mut most) = (TARGETS_HEADER_LEN as u64, 0u64, 0u64, 0u32);
    let (mut instances, mut runs) = (0u64, Vec::new());
    for i in 0..h.sample_count {
        let (offset, len, _) = t.entry(i)?;
        if offset != next {
            return Err(corrupt(
                (h.table_offset + i * TARGETS_ENTRY_LEN as u64) as usize,
                format!("sample {i}'s record is at {offset}, records are contiguous and it must be at {next}"),
            ));
        }
        if let Some(at) = (offset + u64::from(len)..align_up(offset + u64::from(len), 8).unwrap_or(u64::MAX))
            .find(|&k| k < b.len() as u64 && b[k as usize] != 0)
        {
            return Err(corrupt(
                at as usize,
                format!("the padding after sample {i}'s record is not zero"),
            ));
        }
        next = align_up(offset + u64::from(len), 8).unwrap_or(u64::MAX);
        let s = t.get(i, true)?;
        if let Some(bx) = s.boxes.iter().find(|bx| !box_is_valid(bx)) {
            return Err(corrupt(
                offset as usize,
                format!("sample {i}: box {bx:?} is not finite or has a negative size"),
            ));
        }
        if !s.boxes.is_empty() && !h.has_boxes() {
            return Err(corrupt(
                offset as usize,
                format!("sample {i} has boxes, the header says the file has none"),
            ));
        }
        if s.mask_png.is_empty() == h.has_masks() {
            return Err(corrupt(
                offset as usize + 4,
                format!(
                    "sample {i} {} a mask, the header says the file {} masks",
                    if s.mask_png.is_empty() { "has no" } else { "has" },
                    if h.has_masks() { "has" } else { "has no" }
                ),
            ));
        }
        if !s.mask_png.is_empty() {
            check_grey_png(s.mask_png).map_err(|why| corrupt(offset as usize, format!("sample {i}'s mask: {why}")))?;
            masks += 1;
        }
        if let Some(inst) = &s.instances {
            let pixels = u64::from(inst.width) * u64::from(inst.height);
            for (k, r) in inst.runs.iter().enumerate() {
                super::rle::decode_runs(r, &mut runs)
                    .and_then(|()| {
                        let total: u64 = runs.iter().map(|&v| u64::from(v)).sum();
                        (total == pixels).then_some(()).ok_or_else(|| {
                            format!(
                                "its runs cover {total} pixels, the masks are {}x{}",
                                inst.width, inst.height
                            )
                        })
                    })
                    .map_err(|why| corrupt(offset as usize, format!("sample {i}'s instance mask {k}: {why}")))?;
            }
            instances += inst.runs.len() as u64;
        }
        if let Some(p) = s.keypoints.iter().find(|p| !p.iter().all(|v| v.is_finite())) {
            return Err(corrupt(
                offset as usize,
                format!("sample {i}: keypoint {p:?} is not finite"),
            ));
        }
        boxes += s.boxes.len() as u64;
        most = most.max(s.boxes.len() as u32);
    }
    if next != h.categories_offset && align_up(next, 8) != Some(h.categories_offset) {
        return Err(corrupt(
            32,
            format!(
                "the categories start at {}, after the last record at {next}",
                h.categories_offset
            ),
        ));
    }
    if most != h.max_boxes {
        return Err(corrupt(
            24,
            format!("the header's max_boxes is {}, the largest count is {most}", h.max_boxes),
        ));
    }
    let cats = t.categories();
    if !cats.is_empty() {
        let parsed: Result<serde_json::Value, _> = serde_json::from_slice(cats);
        let ok = matches!(&parsed, Ok(serde_json::Value::Array(a)) if a.iter().all(serde_json::Value::is_object));
        if !ok {
            return Err(corrupt(
                h.categories_offset as usize,
                "the categories are not a JSON array of objects".to_owned(),
            ));
        }
    }
    let cat_end = h.categories_offset + u64::from(h.categories_len);
    if let Some(at) = (cat_end..h.table_offset).find(|&k| b[k as usize] != 0) {
        return Err(corrupt(
            at as usize,
            "the padding after the categories is not zero".to_owned(),
        ));
    }
    if let Some(f) = t.fault() {
        return Err(t.file.changed(f, "the targets file".to_owned()));
    }
    Ok(TargetsReport {
        samples: h.sample_count,
        boxes,
        max_boxes: h.max_boxes,
        masks,
        instances,
        keypoints: h.keypoints,
        bytes: b.len() as u64,
    })
}

/// Checks that `png` starts with the PNG signature and an IHDR of colour type 0, bit depth 8
/// (the stored masks' form); returns `(width, height)`.
pub fn check_grey_png(png: &[u8]) -> Result<(u32, u32), String> {
    if png.len() < 33 || png[..8] != PNG_SIGNATURE || &png[12..16] != b"IHDR" {
        return Err("not a PNG (no signature and IHDR)".to_owned());
    }
    let be = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().expect("4 bytes"));
    let (w, h, depth, colour) = (be(16), be(20), png[24], png[25]);
    if depth != 8 || colour != 0 {
        return Err(format!(
            "a PNG of bit depth {depth} and colour type {colour}, stored masks are 8-bit greyscale (type 0)"
        ));
    }
    Ok((w, h))
}

#[cfg(test)]
mod tests;
