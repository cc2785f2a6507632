//! Cutting a region out of a JPEG's entropy-coded data at its restart markers, so that a region
//! decode skips the Huffman decoding of everything outside the region.
//!
//! libjpeg-turbo decodes a cropping region by skipping rows above it and columns beside it, but
//! it must still Huffman-decode every MCU above and beside the region: the entropy-coded data
//! is one bit stream, and each block's DC coefficient is coded relative to the previous one.
//! Huffman decoding is more than half of a decode's instructions. A restart marker (`RSTn`)
//! resets both the bit stream (byte-aligned) and the DC predictors, so the data between two
//! markers (a *segment*) decodes on its own. When the segments tile the image in a grid (the
//! restart interval divides the MCUs per row, or is a whole number of MCU rows), the segments
//! that cover a region form a smaller, valid JPEG of their own: the same headers with the
//! frame's height and width changed, the segments in order, renumbered `RST0, RST1, ..`, and
//! an EOI. Its coefficients are the original's, so its pixels are the original's.
//!
//! `ringfeed pack` writes baseline JPEGs with such markers (a lossless transcode, see
//! [`super::Transcoder`]); files that come with a usable restart interval of their own benefit
//! too.
//!
//! # Invariants
//! - A cut is made only when every marker up to the last segment needed is found, in sequence
//!   (`RST0..RST7` cyclically), at the positions the restart interval implies; anything else
//!   (a missing, out-of-order or unexpected marker) gives `None`, and the caller decodes the
//!   original, which reports damage as it always did.
//! - The sub-image's MCU grid is the original's shifted by whole MCUs, and every sub-image
//!   edge that is not an edge of the original lies at or outside the caller's region, so the
//!   region's pixels see the same neighbours they would see in a region decode of the original
//!   (the caller's margin covers the chroma upsampling across a cut edge).

use super::Rect;
use super::markers::RestartLayout;

/// A region's enclosing segments, written out as a JPEG.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cut {
    /// Where the sub-image's top-left pixel is in the original, in full-size pixels (whole
    /// MCUs).
    pub(super) left: u32,
    pub(super) top: u32,
    /// The sub-image's size in full-size pixels.
    pub(super) width: u32,
    pub(super) height: u32,
}

/// The rows of MCUs one segment covers and the segments one MCU row holds, when the segments
/// tile the image in a grid; `None` when they do not (an interval that neither divides the
/// MCUs per row nor is a multiple of them).
fn grid(l: &RestartLayout) -> Option<(u32, u32)> {
    let per_row = l.mcus_per_row();
    if l.interval == 0 {
        None
    } else if l.interval <= per_row && per_row.is_multiple_of(l.interval) {
        Some((1, per_row / l.interval))
    } else if l.interval.is_multiple_of(per_row) {
        Some((l.interval / per_row, 1))
    } else {
        None
    }
}

/// Writes into `out` a JPEG made of the segments of `data` (laid out as `layout` says) that
/// cover `want` (full-size stored pixels, inside the image), and returns where it lies.
/// `marks` is scratch for the marker offsets. `None` when there is nothing to gain (the
/// segments needed are the whole image) or the data is not as the layout promises.
pub(super) fn cut(
    data: &[u8],
    scan_data: usize,
    layout: &RestartLayout,
    want: Rect,
    out: &mut Vec<u8>,
    marks: &mut Vec<usize>,
) -> Option<Cut> {
    let (rows_per_seg, segs_per_row) = grid(layout)?;
    let seg_w = layout.interval.min(layout.mcus_per_row()) * layout.mcu_width;
    let seg_h = rows_per_seg * layout.mcu_height;
    // The grid of segments: `seg_cols` per row of segments, `seg_rows` rows.
    let seg_rows = layout.mcu_rows().div_ceil(rows_per_seg);
    let (right, bottom) = (want.left.checked_add(want.width)?, want.top.checked_add(want.height)?);
    if want.width == 0 || want.height == 0 || right > layout.width || bottom > layout.height {
        return None;
    }
    let (c0, c1) = (want.left / seg_w, right.div_ceil(seg_w).min(segs_per_row));
    let (r0, r1) = (want.top / seg_h, bottom.div_ceil(seg_h).min(seg_rows));
    if c0 == 0 && c1 == segs_per_row && r0 == 0 && r1 == seg_rows {
        return None;
    }
    // Offsets of the markers that end segments 0 ..= last (the last segment of the image ends
    // at EOI or another marker instead).
    let last = (r1 - 1) as usize * segs_per_row as usize + (c1 - 1) as usize;
    let total = seg_rows as usize * segs_per_row as usize;
    find_markers(data, scan_data, last, total, marks)?;
    let start = |j: usize| if j == 0 { scan_data } else { marks[j - 1] + 2 };

    let cut = Cut {
        left: c0 * seg_w,
        top: r0 * seg_h,
        width: (c1 * seg_w).min(layout.width) - c0 * seg_w,
        height: (r1 * seg_h).min(layout.height) - r0 * seg_h,
    };
    // The headers, with the frame's size changed (SOF: length, precision, height, width).
    out.clear();
    out.extend_from_slice(data.get(..scan_data)?);
    let size = out.get_mut(layout.sof_at + 3..layout.sof_at + 7)?;
    size[..2].copy_from_slice(&u16::try_from(cut.height).ok()?.to_be_bytes());
    size[2..].copy_from_slice(&u16::try_from(cut.width).ok()?.to_be_bytes());
    // Segment k of the sub-image is preceded by RST((k - 1) mod 8).
    let mut k = 0usize;
    for r in r0 as usize..r1 as usize {
        for c in c0 as usize..c1 as usize {
            let j = r * segs_per_row as usize + c;
            if k > 0 {
                out.extend_from_slice(&[0xFF, 0xD0 + ((k - 1) % 8) as u8]);
            }
            out.extend_from_slice(data.get(start(j)..marks[j])?);
            k += 1;
        }
    }
    out.extend_from_slice(&[0xFF, 0xD9]);
    Some(cut)
}

/// Fills `marks[j]` with the offset of the marker that ends segment `j`, for `j` in
/// `0..=last`: `RSTn` for all but the image's last segment (`total - 1`), whose end is the
/// next marker of any kind. `None` if the data does not hold the markers in sequence.
fn find_markers(data: &[u8], scan_data: usize, last: usize, total: usize, marks: &mut Vec<usize>) -> Option<()> {
    marks.clear();
    let mut pos = scan_data;
    while marks.len() <= last {
        let ff = pos + memchr::memchr(0xFF, data.get(pos..)?)?;
        // Fill bytes: any run of FF before the marker code.
        let mut code_at = ff + 1;
        while data.get(code_at) == Some(&0xFF) {
            code_at += 1;
        }
        let code = *data.get(code_at)?;
        match code {
            0x00 => {} // A stuffed FF inside the data.
            0xD0..=0xD7 => {
                let j = marks.len();
                if j + 1 >= total || usize::from(code - 0xD0) != j % 8 {
                    return None;
                }
                marks.push(ff);
            }
            _ => {
                // Any other marker ends the scan: only after the image's last segment.
                if marks.len() + 1 != total {
                    return None;
                }
                marks.push(ff);
            }
        }
        pos = code_at + 1;
    }
    Some(())
}

/// The restart interval `ringfeed pack` gives an image with `mcus_per_row` MCUs per row: the
/// largest divisor of it that is at most `target` MCUs, so that segments tile each row; or one
/// whole MCU row per segment when that divisor is below `target / 2` (a prime width, say),
/// where the markers would cost more than the finer column cuts save.
pub(super) fn choose_interval(mcus_per_row: u32, target: u32) -> u32 {
    let target = target.max(1);
    let best = (1..=target.min(mcus_per_row))
        .rev()
        .find(|d| mcus_per_row.is_multiple_of(*d))
        .unwrap_or(1);
    if best * 2 < target.min(mcus_per_row) {
        mcus_per_row
    } else {
        best
    }
}

/// Whether `layout`'s restart markers already let [`cut`] work (a grid of segments).
pub(super) fn is_cuttable(layout: &RestartLayout) -> bool {
    grid(layout).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Decoder, Limits, markers};

    #[test]
    fn interval_divides_the_row_or_is_a_row() {
        // (MCUs per row, target) → interval.
        for (per_row, target, want) in [
            (32, 2, 2),
            (31, 2, 1),
            (32, 4, 4),
            (30, 4, 3),
            (26, 4, 2),
            (31, 4, 31),
            (1, 2, 1),
        ] {
            assert_eq!(choose_interval(per_row, target), want, "{per_row} {target}");
        }
    }

    /// A 4:2:0 JPEG of `w`x`h` with a restart marker every `target` MCUs (as packed).
    fn packed(w: usize, h: usize, target: u32) -> Vec<u8> {
        let px: Vec<u8> = (0..w * h * 3).map(|i| ((i * 31) ^ (i / 97)) as u8).collect();
        let img = turbojpeg::Image {
            pixels: &px[..],
            width: w,
            pitch: w * 3,
            height: h,
            format: turbojpeg::PixelFormat::RGB,
        };
        let jpeg = turbojpeg::compress(img, 90, turbojpeg::Subsamp::Sub2x2).unwrap();
        let mut out = Vec::new();
        let mut d = Decoder::new(Limits::default()).unwrap();
        assert!(d.add_restarts(&jpeg, target, &mut out).unwrap().is_some());
        out
    }

    /// The cut is a JPEG of exactly the segments' size whose pixels, away from the cut edges
    /// (where chroma upsampling lacks its neighbours), are the original's.
    #[test]
    fn a_cut_is_a_window_on_the_original() {
        let (w, h) = (203u32, 141u32);
        let data = packed(w as usize, h as usize, 2);
        let m = markers::walk(&data);
        let layout = m.layout.unwrap();
        assert_eq!((layout.mcu_width, layout.mcu_height, layout.interval), (16, 16, 1));
        let mut d = Decoder::new(Limits::default()).unwrap();
        let (mut full, mut part, mut sub, mut marks) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        d.decode_rgb8(&data, &mut full).unwrap();
        for (left, top, width, height) in [(0, 0, 5, 5), (40, 30, 60, 50), (190, 130, 13, 11), (17, 0, 1, 141)] {
            let want = Rect {
                left,
                top,
                width,
                height,
            };
            let c = cut(&data, m.scan_data, &layout, want, &mut sub, &mut marks).unwrap();
            assert!(c.left <= left && c.top <= top, "{want:?} {c:?}");
            assert!(c.left + c.width >= left + width && c.top + c.height >= top + height);
            assert_eq!((c.left % 16, c.top % 16), (0, 0));
            let got = d.decode_rgb8(&sub, &mut part).unwrap();
            assert_eq!((got.width, got.height), (c.width, c.height));
            let inner = |lo: u32, len: u32, limit: u32| {
                let a = if lo == 0 { 0 } else { lo + 2 };
                let b = if lo + len == limit { limit } else { lo + len - 2 };
                a..b
            };
            for y in inner(c.top, c.height, h) {
                for x in inner(c.left, c.width, w) {
                    let at = (((y - c.top) * c.width + x - c.left) * 3) as usize;
                    let full_at = ((y * w + x) * 3) as usize;
                    assert_eq!(part[at..at + 3], full[full_at..full_at + 3], "{want:?} ({x},{y})");
                }
            }
        }
        // The whole image is no cut.
        assert_eq!(
            cut(&data, m.scan_data, &layout, Rect::full(w, h), &mut sub, &mut marks),
            None
        );
    }

    /// Markers out of sequence, missing, or a stray marker inside the data: no cut.
    #[test]
    fn damaged_markers_give_no_cut() {
        let data = packed(96, 64, 1);
        let m = markers::walk(&data);
        let layout = m.layout.unwrap();
        let want = Rect {
            left: 40,
            top: 40,
            width: 8,
            height: 8,
        };
        let (mut sub, mut marks) = (Vec::new(), Vec::new());
        assert!(cut(&data, m.scan_data, &layout, want, &mut sub, &mut marks).is_some());
        let rst: Vec<usize> = (m.scan_data..data.len() - 1)
            .filter(|&i| data[i] == 0xFF && (0xD0..=0xD7).contains(&data[i + 1]))
            .collect();
        assert_eq!(rst.len(), 6 * 4 - 1);
        for (what, edit) in [("renumbered", 0xD5u8), ("stray marker", 0xC4)] {
            let mut bad = data.clone();
            bad[rst[3] + 1] = edit;
            assert!(
                cut(&bad, m.scan_data, &layout, want, &mut sub, &mut marks).is_none(),
                "{what}"
            );
        }
        let mut missing = data.clone();
        missing.drain(rst[2]..rst[2] + 2);
        assert!(cut(&missing, m.scan_data, &layout, want, &mut sub, &mut marks).is_none());
        // Truncated before the segments needed.
        assert!(cut(&data[..rst[5]], m.scan_data, &layout, want, &mut sub, &mut marks).is_none());
    }
}
