//! COCO `segmentation` into the run-length instance masks of `targets.rft` 1.1
//! (`proto/targets.md`, "Instance masks"), with pycocotools' semantics, so that a stored mask is
//! the `mask.decode(...)` torchvision's `wrap_dataset_for_transforms_v2` makes of the same
//! annotation:
//!
//! - polygons (`[[x0, y0, x1, y1, ...], ...]`): each rasterised as pycocotools' `rleFrPoly`
//!   does (the boundary walked at 5× resolution, column crossings snapped back), their union
//!   (`mask.merge`);
//! - RLE (`{"counts": ..., "size": [h, w]}`): uncompressed (`counts` a list of run lengths) or
//!   compressed (`counts` COCO's string, `rleFrString`); its `size` must be the image's.
//!
//! [`check`] refuses a malformed segmentation when the COCO file is read (before any image);
//! [`runs`] makes the runs once the image's size is known, and its error is the sample's.
//! `ringfeed pack --coco` stores the runs; a WebDataset annotation's are painted as they are
//! read (`crate::targets`): both come from this one module, so a packed and a WebDataset copy of
//! one annotation give the same mask.

use serde_json::Value;

/// Checks the form of one annotation's `segmentation`; the error says what is wrong.
pub fn check(seg: &Value) -> Result<(), String> {
    match seg {
        Value::Array(polys) => {
            if polys.is_empty() {
                return Err("`segmentation` is an empty list of polygons".to_owned());
            }
            for (k, p) in polys.iter().enumerate() {
                polygon(p).map_err(|e| format!("`segmentation` polygon {k}: {e}"))?;
            }
            Ok(())
        }
        Value::Object(_) => rle_size(seg).and_then(|_| match seg.get("counts") {
            Some(Value::String(_)) => Ok(()),
            Some(Value::Array(a)) if a.iter().all(|v| v.as_u64().is_some_and(|n| n <= u64::from(u32::MAX))) => Ok(()),
            _ => Err("`segmentation` RLE `counts` is neither a string nor a list of run lengths".to_owned()),
        }),
        _ => Err("`segmentation` is neither a list of polygons nor an RLE object".to_owned()),
    }
}

/// A polygon's coordinates: an even number (at least 6: three points) of finite numbers.
fn polygon(p: &Value) -> Result<Vec<f64>, String> {
    let xy: Option<Vec<f64>> = p
        .as_array()
        .and_then(|a| a.iter().map(Value::as_f64).collect::<Option<Vec<f64>>>());
    match xy {
        Some(xy) if xy.len() >= 6 && xy.len() % 2 == 0 && xy.iter().all(|v| v.is_finite()) => Ok(xy),
        Some(xy) => Err(format!(
            "a polygon is [x0, y0, x1, y1, ...] with at least 3 points, this one has {} numbers",
            xy.len()
        )),
        None => Err("a polygon is a list of numbers".to_owned()),
    }
}

/// An RLE's `size` `[h, w]`.
fn rle_size(seg: &Value) -> Result<(u32, u32), String> {
    let size = seg.get("size").and_then(Value::as_array);
    match size.map(|s| s.iter().map(Value::as_u64).collect::<Vec<_>>()).as_deref() {
        Some([Some(h), Some(w)]) => Ok((
            u32::try_from(*h).unwrap_or(u32::MAX),
            u32::try_from(*w).unwrap_or(u32::MAX),
        )),
        _ => Err("`segmentation` RLE has no `size` [height, width]".to_owned()),
    }
}

/// The runs (column-major, first run of zeros) of `seg` on a `width`×`height` image.
pub fn runs(seg: &Value, width: u32, height: u32) -> Result<Vec<u32>, String> {
    let (w, h) = (u64::from(width), u64::from(height));
    match seg {
        Value::Array(polys) => {
            if polys.len() == 1 {
                return Ok(poly_runs(&polygon(&polys[0])?, width, height));
            }
            let mut bits = vec![0u8; (w * h) as usize];
            for p in polys {
                for (at, on) in expand(&poly_runs(&polygon(p)?, width, height)) {
                    if on {
                        bits[at.0..at.1].fill(1);
                    }
                }
            }
            Ok(runs_of(&bits))
        }
        Value::Object(_) => {
            let (rh, rw) = rle_size(seg)?;
            if (rh, rw) != (height, width) {
                return Err(format!(
                    "its RLE `size` is [{rh}, {rw}] (height, width), the image is {width}x{height}"
                ));
            }
            let counts = match seg.get("counts") {
                Some(Value::String(s)) => from_string(s)?,
                Some(Value::Array(a)) => a.iter().map(|v| v.as_u64().unwrap_or(0) as u32).collect(),
                _ => return Err("`segmentation` RLE has no `counts`".to_owned()),
            };
            let total: u64 = counts.iter().map(|&c| u64::from(c)).sum();
            if total != w * h {
                return Err(format!(
                    "its RLE `counts` cover {total} pixels, the image is {width}x{height} = {} pixels",
                    w * h
                ));
            }
            Ok(counts)
        }
        _ => Err("`segmentation` is neither a list of polygons nor an RLE object".to_owned()),
    }
}

/// Runs as `((start, end), on)` pixel ranges.
fn expand(runs: &[u32]) -> impl Iterator<Item = ((usize, usize), bool)> + '_ {
    let mut at = 0usize;
    runs.iter().enumerate().map(move |(k, &r)| {
        let range = (at, at + r as usize);
        at += r as usize;
        (range, k % 2 == 1)
    })
}

/// The runs of a column-major 0/1 bitmap.
fn runs_of(bits: &[u8]) -> Vec<u32> {
    let mut out = Vec::new();
    let (mut cur, mut n) = (0u8, 0u32);
    for &b in bits {
        if b != cur {
            out.push(n);
            (cur, n) = (b, 0);
        }
        n += 1;
    }
    out.push(n);
    out
}

/// pycocotools' `rleFrString`: COCO's compressed counts (6-bit groups from `'0'`, deltas
/// against the run two back from the third on).
fn from_string(s: &str) -> Result<Vec<u32>, String> {
    let b = s.as_bytes();
    let (mut out, mut p) = (Vec::<u32>::new(), 0);
    while p < b.len() {
        let (mut x, mut k, mut more) = (0i64, 0u32, true);
        while more {
            let Some(&ch) = b.get(p) else {
                return Err("the compressed RLE `counts` end inside a number".to_owned());
            };
            let c = i64::from(ch) - 48;
            if !(0..64).contains(&c) || k > 6 {
                return Err(format!("the compressed RLE `counts` hold {:?} at {p}", ch as char));
            }
            x |= (c & 0x1f) << (5 * k);
            more = c & 0x20 != 0;
            p += 1;
            k += 1;
            if !more && c & 0x10 != 0 {
                x |= -1i64 << (5 * k);
            }
        }
        if out.len() > 2 {
            x += i64::from(out[out.len() - 2]);
        }
        out.push(u32::try_from(x).map_err(|_| format!("the compressed RLE `counts` make a run of {x}"))?);
    }
    Ok(out)
}

/// pycocotools' `rleFrPoly` (maskApi.c), step by step, in its integer and `double` arithmetic
/// (C's `(int)` truncates toward zero).
fn poly_runs(xy: &[f64], width: u32, height: u32) -> Vec<u32> {
    let (h, w) = (i64::from(height), i64::from(width));
    let scale = 5.0;
    let k = xy.len() / 2;
    let mut x: Vec<i64> = (0..k).map(|j| (scale * xy[2 * j] + 0.5) as i32 as i64).collect();
    let mut y: Vec<i64> = (0..k).map(|j| (scale * xy[2 * j + 1] + 0.5) as i32 as i64).collect();
    x.push(x[0]);
    y.push(y[0]);
    let (mut u, mut v) = (Vec::new(), Vec::new());
    for j in 0..k {
        let (mut xs, mut xe, mut ys, mut ye) = (x[j], x[j + 1], y[j], y[j + 1]);
        let (dx, dy) = ((xe - xs).abs(), (ys - ye).abs());
        let flip = (dx >= dy && xs > xe) || (dx < dy && ys > ye);
        if flip {
            std::mem::swap(&mut xs, &mut xe);
            std::mem::swap(&mut ys, &mut ye);
        }
        let s = if dx >= dy {
            (ye - ys) as f64 / dx as f64
        } else {
            (xe - xs) as f64 / dy as f64
        };
        if dx >= dy {
            for d in 0..=dx {
                let t = if flip { dx - d } else { d };
                u.push(t + xs);
                v.push((ys as f64 + s * t as f64 + 0.5) as i32 as i64);
            }
        } else {
            for d in 0..=dy {
                let t = if flip { dy - d } else { d };
                v.push(t + ys);
                u.push((xs as f64 + s * t as f64 + 0.5) as i32 as i64);
            }
        }
    }
    // Points along the y-boundary, downsampled.
    let mut a: Vec<u32> = Vec::new();
    for j in 1..u.len() {
        if u[j] == u[j - 1] {
            continue;
        }
        let mut xd = (if u[j] < u[j - 1] { u[j] } else { u[j] - 1 }) as f64;
        xd = (xd + 0.5) / scale - 0.5;
        if xd.floor() != xd || xd < 0.0 || xd > (w - 1) as f64 {
            continue;
        }
        let mut yd = (if v[j] < v[j - 1] { v[j] } else { v[j - 1] }) as f64;
        yd = (yd + 0.5) / scale - 0.5;
        yd = yd.clamp(0.0, h as f64).ceil();
        a.push((xd as i64 * h + yd as i64) as u32);
    }
    a.push((h * w) as u32);
    a.sort_unstable();
    let mut p = 0u32;
    for e in &mut a {
        let t = *e;
        *e -= p;
        p = t;
    }
    let mut b = vec![a[0]];
    let mut j = 1;
    while j < a.len() {
        if a[j] > 0 {
            b.push(a[j]);
            j += 1;
        } else {
            j += 1;
            if j < a.len() {
                *b.last_mut().expect("b starts with one run") += a[j];
                j += 1;
            }
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 0/1 pixels of `runs` row by row, for reading a small mask in a test.
    fn rows(runs: &[u32], w: usize, h: usize) -> Vec<String> {
        let mut bits = vec![0u8; w * h];
        for ((s, e), on) in expand(runs) {
            if on {
                bits[s..e].fill(1);
            }
        }
        (0..h)
            .map(|y| (0..w).map(|x| if bits[x * h + y] == 1 { '#' } else { '.' }).collect())
            .collect()
    }

    #[test]
    fn a_square_polygon_covers_its_pixels() {
        // pycocotools: frPyObjects([[1, 1, 4, 1, 4, 3, 1, 3]], 5, 6) decodes to columns 1..=3
        // (x 1, 2, 3) of rows 1..=2 (y 1, 2), the pixels whose centres the square holds.
        let r = poly_runs(&[1.0, 1.0, 4.0, 1.0, 4.0, 3.0, 1.0, 3.0], 6, 5);
        assert_eq!(rows(&r, 6, 5), ["......", ".###..", ".###..", "......", "......"]);
    }

    #[test]
    fn compressed_counts_decode_as_pycocotools() {
        // pycocotools.mask.encode of a 4x3 (h, w) mask whose middle column is set: runs [4, 4, 4],
        // "444" (deltas start at the fourth run).
        let mut bits = vec![0u8; 12];
        bits[4..8].fill(1);
        assert_eq!(runs_of(&bits), [4, 4, 4]);
        assert_eq!(from_string("444").unwrap(), [4, 4, 4]);
        // A 4x4 mask, columns 1 and 3 set but for (3, 0): runs [4, 4, 5, 3], encoded "445O" (the
        // fourth run a delta of -1 against the second).
        assert_eq!(from_string("445O").unwrap(), [4, 4, 5, 3]);
        assert!(from_string("4\u{7f}").is_err());
    }

    #[test]
    fn rle_size_and_polygons_are_checked() {
        let rle = serde_json::json!({"counts": [2, 3, 1], "size": [2, 3]});
        assert_eq!(runs(&rle, 3, 2).unwrap(), [2, 3, 1]);
        let e = runs(&rle, 2, 3).unwrap_err();
        assert!(
            e.contains("RLE `size` is [2, 3] (height, width), the image is 2x3"),
            "{e}"
        );
        let e = check(&serde_json::json!([[1, 2, 3, 4]])).unwrap_err();
        assert!(e.contains("polygon 0") && e.contains("at least 3 points"), "{e}");
        assert!(check(&serde_json::json!({"counts": "x"})).unwrap_err().contains("size"));
    }
}
