//! Instance masks as stored in `targets.rft` 1.1 (`proto/targets.md`, "Instance masks"): COCO's
//! run-length encoding (runs over the pixels in column-major order, the first run of zeros,
//! alternating), each run length a LEB128 unsigned varint.
//!
//! The writer ([`encode_runs`]) takes the runs `pack` computed from COCO's polygons or RLE; the
//! reader ([`paint_runs`]) checks them against the image's size and sets one bit of a
//! row-major bit plane ([`super::Targets::instances`]) where the mask is 1. Runs that do not add
//! up to `width * height` pixels are an error naming both, never a write out of bounds.

use super::LabelMap;

/// Appends `runs` to `out` as LEB128 varints.
pub fn encode_runs(runs: &[u32], out: &mut Vec<u8>) {
    for &r in runs {
        let mut v = r;
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
    }
}

/// Decodes the varints of `bytes` into `out` (cleared first).
pub fn decode_runs(bytes: &[u8], out: &mut Vec<u32>) -> Result<(), String> {
    out.clear();
    let (mut v, mut shift) = (0u64, 0u32);
    for &b in bytes {
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            out.push(u32::try_from(v).map_err(|_| format!("a run of {v} pixels is over 2^32"))?);
            (v, shift) = (0, 0);
        } else {
            shift += 7;
            if shift > 28 {
                return Err("a run length's varint is longer than 5 bytes".to_owned());
            }
        }
    }
    if shift != 0 {
        return Err("the runs end inside a varint".to_owned());
    }
    Ok(())
}

/// Sets bit `bit` of `plane` (a `width`×`height` row-major map) on every pixel the column-major
/// `runs` mark 1. The runs must cover exactly `width * height` pixels.
pub fn paint_runs(runs: &[u32], plane: &mut LabelMap, bit: u8) -> Result<(), String> {
    let (w, h) = (plane.width as u64, plane.height as u64);
    let total: u64 = runs.iter().map(|&r| u64::from(r)).sum();
    if total != w * h {
        return Err(format!(
            "the instance mask's runs cover {total} pixels, the image is {w}x{h} = {} pixels",
            w * h
        ));
    }
    let mut at = 0u64;
    for (k, &r) in runs.iter().enumerate() {
        if k % 2 == 1 {
            for p in at..at + u64::from(r) {
                // Column-major p = x·h + y.
                let (x, y) = (p / h, p % h);
                plane.data[(y * w + x) as usize] |= 1 << bit;
            }
        }
        at += u64::from(r);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_refuse_a_cut() {
        let runs = [0, 1, 127, 128, 300, 16384, u32::MAX];
        let mut b = Vec::new();
        encode_runs(&runs, &mut b);
        assert_eq!(&b[..5], [0, 1, 127, 0x80, 1]);
        let mut out = Vec::new();
        decode_runs(&b, &mut out).unwrap();
        assert_eq!(out, runs);
        assert!(
            decode_runs(&b[..b.len() - 1], &mut out)
                .unwrap_err()
                .contains("inside a varint")
        );
    }

    #[test]
    fn runs_are_column_major_and_start_with_zeros() {
        // A 3x2 image (w 3, h 2): column-major pixels (0,0) (0,1) (1,0) (1,1) (2,0) (2,1);
        // runs [1, 2, 3]: pixel (0,0) off, (0,1) and (1,0) on, the rest off.
        let mut plane = LabelMap::filled(3, 2, 0);
        paint_runs(&[1, 2, 3], &mut plane, 2).unwrap();
        assert_eq!(plane.data, [0, 4, 0, 4, 0, 0]);
        let e = paint_runs(&[1, 2], &mut plane, 0).unwrap_err();
        assert!(e.contains("cover 3 pixels, the image is 3x2 = 6"), "{e}");
    }
}
