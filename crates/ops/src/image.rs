//! A packed RGB8 image that per-image ops read and write, and the moves between images: crops
//! with fill, flips, and the transposes to the ring's layouts.

/// A packed RGB8 image (`[h][w][3]`) that keeps its allocation from sample to sample.
#[derive(Debug, Default, Clone)]
pub struct Image {
    /// Columns.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// `width * height * 3` bytes, and possibly spare capacity beyond.
    pub pixels: Vec<u8>,
}

impl Image {
    /// Makes this a `width`×`height` image with unspecified pixels, reusing the allocation.
    pub fn reset(&mut self, width: u32, height: u32) {
        self.width = width;
        self.height = height;
        let n = self.len();
        if self.pixels.len() < n {
            self.pixels.resize(n, 0);
        }
    }

    /// Bytes of the image.
    pub fn len(&self) -> usize {
        self.width as usize * self.height as usize * 3
    }

    /// Whether the image has no pixels.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The image's bytes.
    pub fn data(&self) -> &[u8] {
        &self.pixels[..self.len()]
    }

    /// The image's bytes, writable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        let n = self.len();
        &mut self.pixels[..n]
    }
}

/// Copies the `w`×`h` window at (`left`, `top`) of `src` (which may reach outside it: those
/// pixels are `fill`) into `dst`, resized to `w`×`h`.
pub(super) fn crop_into(src: &Image, left: i64, top: i64, w: u32, h: u32, fill: [u8; 3], dst: &mut Image) {
    dst.reset(w, h);
    let (sw, sh) = (i64::from(src.width), i64::from(src.height));
    let row = w as usize * 3;
    let d = dst.data_mut();
    for y in 0..h as usize {
        let out = &mut d[y * row..(y + 1) * row];
        let sy = top + y as i64;
        if sy < 0 || sy >= sh {
            fill_pixels(out, fill);
            continue;
        }
        // Columns of the window inside the source: [x0, x1).
        let x0 = (-left).clamp(0, i64::from(w)) as usize;
        let x1 = (sw - left).clamp(0, i64::from(w)) as usize;
        fill_pixels(&mut out[..x0 * 3], fill);
        if x1 > x0 {
            let s = ((sy * sw + left + x0 as i64) * 3) as usize;
            out[x0 * 3..x1 * 3].copy_from_slice(&src.pixels[s..s + (x1 - x0) * 3]);
        }
        fill_pixels(&mut out[x1.max(x0) * 3..], fill);
    }
}

/// Sets every pixel of the packed RGB8 `px` to `fill`.
pub(super) fn fill_pixels(px: &mut [u8], fill: [u8; 3]) {
    if fill == [fill[0]; 3] {
        px.fill(fill[0]);
    } else {
        for p in px.chunks_exact_mut(3) {
            p.copy_from_slice(&fill);
        }
    }
}

/// Mirrors the packed RGB8 image `px` (`width` pixels per row) top to bottom, in place.
pub(super) fn flip_vertical(px: &mut [u8], width: usize) {
    let row = width * 3;
    if row == 0 {
        return;
    }
    let rows = px.len() / row;
    for y in 0..rows / 2 {
        let (a, b) = px.split_at_mut((rows - 1 - y) * row);
        a[y * row..(y + 1) * row].swap_with_slice(&mut b[..row]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(w: u32, h: u32) -> Image {
        Image {
            width: w,
            height: h,
            pixels: (0..w * h * 3).map(|v| v as u8).collect(),
        }
    }

    #[test]
    fn crop_pads_with_fill_outside() {
        let src = img(3, 2);
        let mut dst = Image::default();
        crop_into(&src, -1, 1, 3, 2, [9, 8, 7], &mut dst);
        // Row 0 is source row 1 shifted right by one; row 1 is below the source.
        assert_eq!(&dst.data()[..9], &[9, 8, 7, 9, 10, 11, 12, 13, 14]);
        assert_eq!(&dst.data()[9..], &[9, 8, 7, 9, 8, 7, 9, 8, 7]);
        crop_into(&src, 5, 0, 2, 1, [1, 1, 1], &mut dst);
        assert_eq!(dst.data(), &[1; 6]);
    }

    #[test]
    fn vertical_flip_swaps_rows() {
        let mut i = img(1, 3);
        flip_vertical(i.data_mut(), 1);
        assert_eq!(i.data(), &[6, 7, 8, 3, 4, 5, 0, 1, 2]);
    }
}
