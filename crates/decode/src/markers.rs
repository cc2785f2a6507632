//! A bounded walk over a JPEG's marker segments, from SOI to the first scan (SOS).
//!
//! It finds three things libjpeg-turbo does not report:
//! - the EXIF orientation (APP1 `Exif\0\0`, a TIFF header in either byte order, IFD0 tag
//!   0x0112);
//! - whether there is a frame header (SOF) at all: a "tables-only" stream has none, and
//!   `tj3DecompressHeader` then succeeds while leaving the previous image's size in the handle;
//! - whether the stream is *self-contained*: a sequential, single-scan image that defines every
//!   quantisation and Huffman table it refers to before its scan. libjpeg keeps tables from one
//!   image to the next in a reused handle, so only a self-contained image is guaranteed to decode
//!   the same on a reused handle as on a fresh one.
//!
//! Every read is bounds-checked and every loop advances by at least one byte or ends, so hostile
//! input costs at most one pass over the headers and never panics. Anything the walk does not
//! understand makes it stop and answer conservatively (orientation 1, not self-contained);
//! libjpeg-turbo then gives the authoritative verdict on the data.

/// How a JPEG's frame samples chroma, from its components' sampling factors (the SOF).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chroma {
    /// One component.
    Gray,
    /// Three components, the chroma ones at full resolution (4:4:4).
    Full,
    /// Chroma at half the horizontal resolution (4:2:2, h2v1).
    HalfWidth,
    /// Chroma at half the resolution both ways (4:2:0, h2v2).
    Half,
    /// Chroma at half the vertical resolution (4:4:0, h1v2).
    HalfHeight,
    /// Anything else (4:1:1, 4:4:1, two chroma components sampled differently, four components).
    Other,
}

impl Chroma {
    /// The chroma of a frame of `nf` components whose first three sampling factors `(h, v)` are
    /// `factors`.
    fn of(nf: u8, factors: &[(u8, u8)]) -> Chroma {
        match (nf, factors) {
            (1, _) => Chroma::Gray,
            (3, &[(h0, v0), (h1, v1), (h2, v2)]) if (h1, v1) == (h2, v2) && h1 > 0 && v1 > 0 => {
                if h0 % h1 != 0 || v0 % v1 != 0 {
                    return Chroma::Other;
                }
                match (h0 / h1, v0 / v1) {
                    (1, 1) => Chroma::Full,
                    (2, 1) => Chroma::HalfWidth,
                    (2, 2) => Chroma::Half,
                    (1, 2) => Chroma::HalfHeight,
                    _ => Chroma::Other,
                }
            }
            _ => Chroma::Other,
        }
    }
}

/// What the walk found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct JpegMarkers {
    /// EXIF orientation 1..=8; 1 if absent or invalid.
    pub(super) orientation: u8,
    /// A SOF marker was seen before the first SOS.
    pub(super) has_frame: bool,
    /// See the module documentation.
    pub(super) self_contained: bool,
    /// Offset of the first byte after the first SOS segment (where entropy-coded data starts);
    /// 0 if the walk did not reach a scan.
    pub(super) scan_data: usize,
    /// The frame's chroma sampling; `None` without a frame header.
    pub(super) chroma: Option<Chroma>,
    /// The MCU grid and restart interval of a self-contained, sequential, single-scan,
    /// Huffman-coded image (what `restart.rs` can cut, given restart markers, and what
    /// `tj3Transform` can give restart markers); `None` for anything else.
    pub(super) layout: Option<RestartLayout>,
}

/// The MCU grid of a sequential, single-scan, Huffman-coded JPEG and where it restarts its
/// entropy coding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RestartLayout {
    /// Offset of the SOF segment's length field (its height and width follow at +3 and +5).
    pub(super) sof_at: usize,
    /// Image size from the SOF (the DNL-free height; an image with height 0 has no layout).
    pub(super) width: u32,
    pub(super) height: u32,
    /// MCU size in pixels: 8 × the largest sampling factors for an interleaved scan, 8 × 8
    /// for a single-component one.
    pub(super) mcu_width: u32,
    pub(super) mcu_height: u32,
    /// MCUs between restart markers (the DRI value); 0 without restart markers.
    pub(super) interval: u32,
}

impl RestartLayout {
    /// MCUs per MCU row.
    pub(super) fn mcus_per_row(&self) -> u32 {
        self.width.div_ceil(self.mcu_width)
    }

    /// MCU rows.
    pub(super) fn mcu_rows(&self) -> u32 {
        self.height.div_ceil(self.mcu_height)
    }
}

/// Bit sets of table slots (0..=3) defined by DQT/DHT, or referred to by SOF/SOS.
#[derive(Default)]
struct Tables {
    quant: u8,
    dc: u8,
    ac: u8,
}

fn be16(d: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*d.get(at)?, *d.get(at + 1)?]))
}

/// Walks the markers of `data` (which should start with SOI). Never panics.
pub(super) fn walk(data: &[u8]) -> JpegMarkers {
    let mut found = JpegMarkers {
        orientation: 1,
        has_frame: false,
        self_contained: false,
        scan_data: 0,
        layout: None,
        chroma: None,
    };
    if !data.starts_with(&[0xFF, 0xD8]) {
        return found;
    }
    let mut orientation = None;
    let mut defined = Tables::default();
    let mut used = Tables::default();
    // (SOF marker, number of components), once seen.
    let mut frame: Option<(u8, u8)> = None;
    // (offset of the SOF length field, width, height, largest sampling factors h and v).
    let mut geometry: Option<(usize, u32, u32, u32, u32)> = None;
    // The restart interval of the last DRI segment.
    let mut interval = 0u32;
    let mut pos = 2;
    loop {
        // Every marker starts with 0xFF, possibly preceded by more 0xFF fill bytes.
        if data.get(pos) != Some(&0xFF) {
            break;
        }
        while data.get(pos) == Some(&0xFF) {
            pos += 1;
        }
        let Some(&marker) = data.get(pos) else { break };
        pos += 1;
        match marker {
            // Standalone markers without a length: TEM, RST0..7.
            0x01 | 0xD0..=0xD7 => continue,
            // EOI, or a second SOI: stop.
            0xD8 | 0xD9 => break,
            _ => {}
        }
        let Some(len) = be16(data, pos) else { break };
        let len = usize::from(len);
        if len < 2 {
            break;
        }
        let Some(seg) = data.get(pos + 2..pos + len) else {
            break;
        };
        let seg_at = pos;
        pos += len;
        match marker {
            0xE1 if orientation.is_none() && seg.starts_with(b"Exif\0\0") => {
                orientation = Some(exif_orientation(&seg[6..]).unwrap_or(1));
            }
            0xDB => parse_dqt(seg, &mut defined),
            0xC4 => parse_dht(seg, &mut defined),
            // SOF0..SOF15, except DHT (C4), JPG (C8) and DAC (CC).
            0xC0..=0xCF if !matches!(marker, 0xC4 | 0xC8 | 0xCC) => {
                if frame.is_some() {
                    break; // A second frame header: libjpeg rejects it.
                }
                let Some(&nf) = seg.get(5) else { break };
                let (mut hmax, mut vmax) = (0u32, 0u32);
                let mut factors = [(0u8, 0u8); 3];
                let mut read = 0;
                for c in 0..usize::from(nf) {
                    let (Some(&hv), Some(&tq)) = (seg.get(6 + 3 * c + 1), seg.get(6 + 3 * c + 2)) else {
                        break;
                    };
                    used.quant |= slot_bit(tq);
                    hmax = hmax.max(u32::from(hv >> 4));
                    vmax = vmax.max(u32::from(hv & 0x0F));
                    if let Some(f) = factors.get_mut(c) {
                        *f = (hv >> 4, hv & 0x0F);
                    }
                    read += 1;
                }
                found.chroma = Some(if read == usize::from(nf) {
                    Chroma::of(nf, &factors[..usize::from(nf).min(3)])
                } else {
                    Chroma::Other
                });
                if let (Some(h), Some(w)) = (be16(seg, 1), be16(seg, 3)) {
                    geometry = Some((seg_at, u32::from(w), u32::from(h), hmax, vmax));
                }
                frame = Some((marker, nf));
                found.has_frame = true;
            }
            0xDD => {
                if let Some(ri) = be16(seg, 0) {
                    interval = u32::from(ri);
                }
            }
            0xDA => {
                found.scan_data = pos;
                let Some(&ns) = seg.first() else { break };
                for c in 0..usize::from(ns) {
                    let Some(&tables) = seg.get(1 + 2 * c + 1) else {
                        break;
                    };
                    used.dc |= slot_bit(tables >> 4);
                    used.ac |= slot_bit(tables & 0x0F);
                }
                if let Some((sof, nf)) = frame {
                    let single_scan = ns == nf;
                    let quant_ok = used.quant & !defined.quant == 0;
                    let huff_ok = used.dc & !defined.dc == 0 && used.ac & !defined.ac == 0;
                    found.self_contained = single_scan
                        && quant_ok
                        && match sof {
                            // Baseline and extended sequential, Huffman-coded.
                            0xC0 | 0xC1 => huff_ok,
                            // Extended sequential, arithmetic-coded: no Huffman tables; the
                            // arithmetic conditioning is reset at every SOI.
                            0xC9 => true,
                            _ => false,
                        };
                    found.layout = geometry.and_then(|(sof_at, width, height, hmax, vmax)| {
                        let huffman = matches!(sof, 0xC0 | 0xC1);
                        let sampling_ok = (1..=4).contains(&hmax) && (1..=4).contains(&vmax);
                        let usable = found.self_contained && huffman && sampling_ok;
                        let (mcu_width, mcu_height) = if nf == 1 { (8, 8) } else { (8 * hmax, 8 * vmax) };
                        (usable && width > 0 && height > 0).then_some(RestartLayout {
                            sof_at,
                            width,
                            height,
                            mcu_width,
                            mcu_height,
                            interval,
                        })
                    });
                }
                break;
            }
            _ => {}
        }
    }
    found.orientation = orientation.unwrap_or(1);
    found
}

/// The bit for table slot `id`; ids above 3 are invalid and map to an impossible bit so that
/// the image never counts as self-contained.
fn slot_bit(id: u8) -> u8 {
    if id < 4 { 1 << id } else { 0x80 }
}

fn parse_dqt(seg: &[u8], defined: &mut Tables) {
    let mut p = 0;
    while let Some(&pq_tq) = seg.get(p) {
        let size = if pq_tq >> 4 == 0 { 64 } else { 128 };
        if p + 1 + size > seg.len() {
            return;
        }
        defined.quant |= slot_bit(pq_tq & 0x0F) & 0x0F;
        p += 1 + size;
    }
}

fn parse_dht(seg: &[u8], defined: &mut Tables) {
    let mut p = 0;
    while let Some(&tc_th) = seg.get(p) {
        let Some(counts) = seg.get(p + 1..p + 17) else {
            return;
        };
        let n: usize = counts.iter().map(|&c| usize::from(c)).sum();
        if p + 17 + n > seg.len() {
            return;
        }
        let bit = slot_bit(tc_th & 0x0F) & 0x0F;
        match tc_th >> 4 {
            0 => defined.dc |= bit,
            1 => defined.ac |= bit,
            _ => return,
        }
        p += 17 + n;
    }
}

/// The orientation (1..=8) in IFD0 of the TIFF structure `tiff` (the APP1 payload after
/// `Exif\0\0`), or `None` if absent, malformed or out of range.
pub(super) fn exif_orientation(tiff: &[u8]) -> Option<u8> {
    let little = match tiff.get(0..2)? {
        b"II" => true,
        b"MM" => false,
        _ => return None,
    };
    let u16_at = |at: usize| -> Option<u16> {
        let b = [*tiff.get(at)?, *tiff.get(at.checked_add(1)?)?];
        Some(if little {
            u16::from_le_bytes(b)
        } else {
            u16::from_be_bytes(b)
        })
    };
    let u32_at = |at: usize| -> Option<u32> {
        let b: [u8; 4] = tiff.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(if little {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    };
    if u16_at(2)? != 42 {
        return None;
    }
    let ifd = usize::try_from(u32_at(4)?).ok()?;
    let count = usize::from(u16_at(ifd)?);
    for i in 0..count {
        let entry = ifd.checked_add(2 + 12 * i)?;
        let tag = u16_at(entry)?;
        if tag != 0x0112 {
            continue;
        }
        let value = match u16_at(entry.saturating_add(2))? {
            // SHORT, the type the standard prescribes; LONG, written by a few tools.
            3 => u32::from(u16_at(entry.saturating_add(8))?),
            4 => u32_at(entry.saturating_add(8))?,
            _ => return None,
        };
        return u8::try_from(value).ok().filter(|v| (1..=8).contains(v));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiff(little: bool, entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut t = Vec::new();
        let w16 =
            |t: &mut Vec<u8>, v: u16| t.extend_from_slice(&if little { v.to_le_bytes() } else { v.to_be_bytes() });
        let w32 =
            |t: &mut Vec<u8>, v: u32| t.extend_from_slice(&if little { v.to_le_bytes() } else { v.to_be_bytes() });
        t.extend_from_slice(if little { b"II" } else { b"MM" });
        w16(&mut t, 42);
        w32(&mut t, 8);
        w16(&mut t, entries.len() as u16);
        for &(tag, typ, value) in entries {
            w16(&mut t, tag);
            w16(&mut t, typ);
            w32(&mut t, 1);
            if typ == 3 {
                w16(&mut t, value as u16);
                w16(&mut t, 0);
            } else {
                w32(&mut t, value);
            }
        }
        w32(&mut t, 0);
        t
    }

    #[test]
    fn chroma_from_sampling_factors() {
        assert_eq!(Chroma::of(1, &[(1, 1)]), Chroma::Gray);
        assert_eq!(Chroma::of(3, &[(1, 1), (1, 1), (1, 1)]), Chroma::Full);
        assert_eq!(Chroma::of(3, &[(2, 2), (2, 2), (2, 2)]), Chroma::Full);
        assert_eq!(Chroma::of(3, &[(2, 1), (1, 1), (1, 1)]), Chroma::HalfWidth);
        assert_eq!(Chroma::of(3, &[(2, 2), (1, 1), (1, 1)]), Chroma::Half);
        assert_eq!(Chroma::of(3, &[(1, 2), (1, 1), (1, 1)]), Chroma::HalfHeight);
        assert_eq!(Chroma::of(3, &[(4, 1), (1, 1), (1, 1)]), Chroma::Other);
        assert_eq!(Chroma::of(3, &[(2, 2), (1, 1), (2, 1)]), Chroma::Other);
        assert_eq!(Chroma::of(3, &[(3, 2), (2, 1), (2, 1)]), Chroma::Other);
        assert_eq!(Chroma::of(3, &[(2, 2), (0, 1), (0, 1)]), Chroma::Other);
        assert_eq!(Chroma::of(4, &[(1, 1), (1, 1), (1, 1)]), Chroma::Other);
    }

    #[test]
    fn orientation_both_byte_orders() {
        for little in [true, false] {
            for o in 1..=8u32 {
                let t = tiff(little, &[(0x010F, 2, 0), (0x0112, 3, o)]);
                assert_eq!(exif_orientation(&t), Some(o as u8));
            }
            assert_eq!(exif_orientation(&tiff(little, &[(0x0112, 4, 6)])), Some(6));
            assert_eq!(exif_orientation(&tiff(little, &[(0x0112, 3, 0)])), None);
            assert_eq!(exif_orientation(&tiff(little, &[(0x0112, 3, 9)])), None);
            assert_eq!(exif_orientation(&tiff(little, &[(0x0112, 2, 6)])), None);
            assert_eq!(exif_orientation(&tiff(little, &[(0x0100, 3, 6)])), None);
        }
    }

    #[test]
    fn orientation_hostile_tiff() {
        let good = tiff(true, &[(0x0112, 3, 6)]);
        for cut in 0..good.len() {
            let _ = exif_orientation(&good[..cut]);
        }
        // IFD offset far out of range, huge entry count, offset near usize::MAX.
        assert_eq!(exif_orientation(b"II*\0\xff\xff\xff\xff"), None);
        assert_eq!(exif_orientation(b"II*\0\x08\0\0\0\xff\xff"), None);
        assert_eq!(exif_orientation(b"MM\0*\0\0\0\x08\xff\xff\x01\x12"), None);
        assert_eq!(exif_orientation(b"XX*\0"), None);
    }

    #[test]
    fn walk_never_panics_on_prefixes_and_junk() {
        let mut j = vec![0xFF, 0xD8, 0xFF, 0xE1, 0x00, 0x08, b'E', b'x', b'i', b'f', 0, 0];
        j.extend_from_slice(&[0xFF, 0xDA, 0x00, 0x02, 0xFF, 0xD9]);
        for cut in 0..=j.len() {
            let m = walk(&j[..cut]);
            assert_eq!(m.orientation, 1);
            assert!(!m.has_frame);
        }
        assert!(!walk(&[0xFF, 0xD8, 0x00, 0x00]).self_contained);
        assert!(!walk(&[0xFF, 0xD8, 0xFF, 0xC0, 0x00, 0x01]).has_frame);
    }
}
