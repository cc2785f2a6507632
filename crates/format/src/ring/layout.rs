//! Byte layout of a ring segment: header, field descriptors, slot headers (ring.md).

use crate::shard::le;

/// Major version written and read.
pub const MAJOR: u16 = 1;
/// Minor version written.
pub const MINOR: u16 = 0;
pub const MAGIC: [u8; 8] = *b"RFRING\0\0";
/// Bytes reserved for the segment header and field descriptors; slots start here.
pub const HEADER_LEN: u32 = 4096;
pub const SEGMENT_HEADER_LEN: usize = 64;
pub const FIELD_DESC_LEN: usize = 64;
pub const SLOT_HEADER_LEN: usize = 64;
/// Most fields a segment describes.
pub const MAX_FIELDS: usize = 16;
/// Payload alignment inside a slot, and slot alignment inside the segment.
pub const PAGE: u64 = 4096;

const _: () = assert!(SEGMENT_HEADER_LEN + MAX_FIELDS * FIELD_DESC_LEN <= HEADER_LEN as usize);

/// Element types of a field (ring.md, "Dtype codes").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    U8 = 1,
    I32 = 2,
    I64 = 3,
    F32 = 4,
}

impl DType {
    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(DType::U8),
            2 => Some(DType::I32),
            3 => Some(DType::I64),
            4 => Some(DType::F32),
            _ => None,
        }
    }

    pub fn itemsize(self) -> u64 {
        match self {
            DType::U8 => 1,
            DType::I32 | DType::F32 => 4,
            DType::I64 => 8,
        }
    }
}

/// What a stream wants in a field, before offsets are assigned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldSpec {
    /// ASCII, 1..=16 bytes.
    pub name: std::borrow::Cow<'static, str>,
    pub dtype: DType,
    /// One sample's shape (at most 4 dimensions; empty for a scalar).
    pub shape: Vec<u32>,
}

impl FieldSpec {
    /// Bytes of one sample; `None` if that overflows.
    pub fn sample_bytes(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(self.dtype.itemsize(), |acc, &d| acc.checked_mul(u64::from(d)))
    }
}

/// A field as laid out in a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldDesc {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u32>,
    /// From the start of a slot; a multiple of [`PAGE`].
    pub offset: u64,
    pub sample_bytes: u64,
}

/// The segment header (ring.md, "SegmentHeader").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentHeader {
    pub minor: u16,
    pub slot_count: u32,
    pub slot_stride: u64,
    pub segment_len: u64,
    pub batch_size: u32,
    pub fields: Vec<FieldDesc>,
}

/// Why a layout cannot be built or a header cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("bad ring magic {0:?}")]
    BadMagic([u8; 8]),
    #[error("ring version {0}.{1} is not supported (this ringfeed speaks {MAJOR}.x)")]
    Version(u16, u16),
    #[error("ring header checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    #[error("invalid ring layout: {0}")]
    Invalid(String),
}

/// The layout a stream's segment gets: fields, batch size, slot count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingLayout {
    pub header: SegmentHeader,
}

fn align_page(x: u64) -> Option<u64> {
    crate::shard::align_up(x, PAGE)
}

impl RingLayout {
    /// Lays out `fields` for batches of `batch_size` in `slot_count` slots: the slot header
    /// takes the first page of a slot, then each field's payload starts on a page boundary.
    pub fn new(fields: &[FieldSpec], batch_size: u32, slot_count: u32) -> Result<Self, LayoutError> {
        let invalid = |m: String| LayoutError::Invalid(m);
        if fields.is_empty() || fields.len() > MAX_FIELDS {
            return Err(invalid(format!("{} fields (1..={MAX_FIELDS} allowed)", fields.len())));
        }
        if batch_size == 0 || slot_count == 0 {
            return Err(invalid("batch size and slot count must be at least 1".into()));
        }
        let mut offset = PAGE; // the slot header's page
        let mut descs = Vec::with_capacity(fields.len());
        for f in fields {
            if f.name.is_empty() || f.name.len() > 16 || !f.name.is_ascii() || f.shape.len() > 4 {
                return Err(invalid(format!(
                    "field {:?}: names are 1..=16 ASCII bytes, shapes at most 4-D",
                    f.name
                )));
            }
            let sample_bytes = f
                .sample_bytes()
                .ok_or_else(|| invalid(format!("field {} overflows", f.name)))?;
            let bytes = sample_bytes
                .checked_mul(u64::from(batch_size))
                .ok_or_else(|| invalid(format!("field {} overflows", f.name)))?;
            descs.push(FieldDesc {
                name: f.name.to_string(),
                dtype: f.dtype,
                shape: f.shape.clone(),
                offset,
                sample_bytes,
            });
            offset = offset
                .checked_add(bytes)
                .and_then(align_page)
                .ok_or_else(|| invalid("slot size overflows".into()))?;
        }
        let slot_stride = offset;
        let segment_len = slot_stride
            .checked_mul(u64::from(slot_count))
            .and_then(|s| s.checked_add(u64::from(HEADER_LEN)))
            .ok_or_else(|| invalid("segment size overflows".into()))?;
        Ok(RingLayout {
            header: SegmentHeader {
                minor: MINOR,
                slot_count,
                slot_stride,
                segment_len,
                batch_size,
                fields: descs,
            },
        })
    }

    /// Offset of slot `s` in the segment.
    pub fn slot_offset(&self, s: u32) -> u64 {
        u64::from(HEADER_LEN) + u64::from(s) * self.header.slot_stride
    }

    /// The field named `name`.
    pub fn field(&self, name: &str) -> Option<&FieldDesc> {
        self.header.fields.iter().find(|f| f.name == name)
    }
}

impl SegmentHeader {
    /// The header page: segment header, field descriptors, zero padding (`HEADER_LEN` bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN as usize];
        b[..8].copy_from_slice(&MAGIC);
        le::put_u16(&mut b, 8, MAJOR);
        le::put_u16(&mut b, 10, self.minor);
        le::put_u32(&mut b, 12, HEADER_LEN);
        le::put_u32(&mut b, 16, self.slot_count);
        le::put_u32(&mut b, 20, self.fields.len() as u32);
        le::put_u64(&mut b, 24, self.slot_stride);
        le::put_u64(&mut b, 32, self.segment_len);
        le::put_u32(&mut b, 40, self.batch_size);
        for (i, f) in self.fields.iter().enumerate() {
            let d = &mut b[SEGMENT_HEADER_LEN + i * FIELD_DESC_LEN..][..FIELD_DESC_LEN];
            d[..f.name.len()].copy_from_slice(f.name.as_bytes());
            d[16] = f.dtype.code();
            d[17] = f.shape.len() as u8;
            for (k, &dim) in f.shape.iter().enumerate() {
                le::put_u32(d, 20 + 4 * k, dim);
            }
            le::put_u64(d, 40, f.offset);
            le::put_u64(d, 48, f.sample_bytes);
        }
        let c = header_crc(&b, self.fields.len());
        le::put_u32(&mut b, 60, c);
        b
    }

    /// Decodes and checks a header page (at least `64 + 64 * field_count` bytes).
    pub fn decode(b: &[u8]) -> Result<Self, LayoutError> {
        let invalid = |m: String| LayoutError::Invalid(m);
        if b.len() < SEGMENT_HEADER_LEN {
            return Err(invalid(format!("header of {} bytes", b.len())));
        }
        let magic = le::magic(b);
        if magic != MAGIC {
            return Err(LayoutError::BadMagic(magic));
        }
        let field_count = le::u32(b, 20) as usize;
        if field_count == 0 || field_count > MAX_FIELDS || b.len() < SEGMENT_HEADER_LEN + field_count * FIELD_DESC_LEN {
            return Err(invalid(format!("{field_count} fields")));
        }
        let (stored, computed) = (le::u32(b, 60), header_crc(b, field_count));
        let (major, minor) = (le::u16(b, 8), le::u16(b, 10));
        if major != MAJOR && stored == computed {
            return Err(LayoutError::Version(major, minor));
        }
        if stored != computed {
            return Err(LayoutError::Checksum { stored, computed });
        }
        let mut fields = Vec::with_capacity(field_count);
        for i in 0..field_count {
            let d = &b[SEGMENT_HEADER_LEN + i * FIELD_DESC_LEN..][..FIELD_DESC_LEN];
            let name_len = d[..16].iter().position(|&c| c == 0).unwrap_or(16);
            let name = std::str::from_utf8(&d[..name_len]).map_err(|_| invalid(format!("field {i} name")))?;
            let dtype =
                DType::from_code(d[16]).ok_or_else(|| invalid(format!("field {name}: dtype code {}", d[16])))?;
            let ndim = d[17] as usize;
            if ndim > 4 {
                return Err(invalid(format!("field {name}: {ndim} dimensions")));
            }
            fields.push(FieldDesc {
                name: name.to_owned(),
                dtype,
                shape: (0..ndim).map(|k| le::u32(d, 20 + 4 * k)).collect(),
                offset: le::u64(d, 40),
                sample_bytes: le::u64(d, 48),
            });
        }
        Ok(SegmentHeader {
            minor,
            slot_count: le::u32(b, 16),
            slot_stride: le::u64(b, 24),
            segment_len: le::u64(b, 32),
            batch_size: le::u32(b, 40),
            fields,
        })
    }
}

/// CRC-32C of header bytes 0..60 followed by the field descriptors (ring.md).
fn header_crc(b: &[u8], field_count: usize) -> u32 {
    let c = crc32c::crc32c(&b[..60]);
    crc32c::crc32c_append(
        c,
        &b[SEGMENT_HEADER_LEN..SEGMENT_HEADER_LEN + field_count * FIELD_DESC_LEN],
    )
}

/// The header at the start of each slot (ring.md, "SlotHeader").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotHeader {
    pub seq: u64,
    pub run: u32,
    pub epoch: u32,
    pub batch: u64,
    pub count: u32,
    pub skipped: u32,
    /// 1.10: the batch's image height and width in an aspect-bucketed stream (bytes 32..40;
    /// its samples are packed at that size: ring.md); 0 in every other stream.
    pub height: u32,
    pub width: u32,
}

impl SlotHeader {
    pub fn encode(&self) -> [u8; SLOT_HEADER_LEN] {
        let mut b = [0u8; SLOT_HEADER_LEN];
        le::put_u64(&mut b, 0, self.seq);
        le::put_u32(&mut b, 8, self.run);
        le::put_u32(&mut b, 12, self.epoch);
        le::put_u64(&mut b, 16, self.batch);
        le::put_u32(&mut b, 24, self.count);
        le::put_u32(&mut b, 28, self.skipped);
        le::put_u32(&mut b, 32, self.height);
        le::put_u32(&mut b, 36, self.width);
        let c = crc32c::crc32c(&b[..60]);
        le::put_u32(&mut b, 60, c);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, LayoutError> {
        if b.len() < SLOT_HEADER_LEN {
            return Err(LayoutError::Invalid(format!("slot header of {} bytes", b.len())));
        }
        let (stored, computed) = (le::u32(b, 60), crc32c::crc32c(&b[..60]));
        if stored != computed {
            return Err(LayoutError::Checksum { stored, computed });
        }
        Ok(SlotHeader {
            seq: le::u64(b, 0),
            run: le::u32(b, 8),
            epoch: le::u32(b, 12),
            batch: le::u64(b, 16),
            count: le::u32(b, 24),
            skipped: le::u32(b, 28),
            height: le::u32(b, 32),
            width: le::u32(b, 36),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image_fields() -> Vec<FieldSpec> {
        vec![
            FieldSpec {
                name: "image".into(),
                dtype: DType::U8,
                shape: vec![224, 224, 3],
            },
            FieldSpec {
                name: "label".into(),
                dtype: DType::I64,
                shape: vec![],
            },
        ]
    }

    #[test]
    fn payloads_are_page_aligned_and_disjoint() {
        let l = RingLayout::new(&image_fields(), 256, 4).unwrap();
        let h = &l.header;
        assert_eq!(h.fields[0].offset, 4096);
        assert_eq!(h.fields[0].sample_bytes, 224 * 224 * 3);
        assert_eq!(h.fields[1].offset % PAGE, 0);
        assert!(h.fields[1].offset >= h.fields[0].offset + 256 * 224 * 224 * 3);
        assert_eq!(h.slot_stride % PAGE, 0);
        assert_eq!(h.segment_len, 4096 + 4 * h.slot_stride);
    }

    #[test]
    fn header_round_trips_and_detects_damage() {
        let l = RingLayout::new(&image_fields(), 8, 3).unwrap();
        let mut b = l.header.encode();
        assert_eq!(SegmentHeader::decode(&b).unwrap(), l.header);
        b[64 + 20] ^= 1;
        assert!(matches!(SegmentHeader::decode(&b), Err(LayoutError::Checksum { .. })));
    }

    #[test]
    fn slot_header_round_trips() {
        let h = SlotHeader {
            seq: 9,
            run: 2,
            epoch: 3,
            batch: 4,
            count: 5,
            skipped: 1,
            height: 768,
            width: 1344,
        };
        assert_eq!(SlotHeader::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn absurd_layouts_are_refused() {
        let huge = vec![FieldSpec {
            name: "image".into(),
            dtype: DType::U8,
            shape: vec![u32::MAX, u32::MAX, 3],
        }];
        assert!(RingLayout::new(&huge, u32::MAX, 64).is_err());
        assert!(RingLayout::new(&image_fields(), 0, 1).is_err());
    }
}
