//! Detection and segmentation targets that follow the geometry (control.md, "Detection and
//! segmentation targets (1.10)"): a sample's boxes and label map moved as torchvision v2 moves
//! `tv_tensors.BoundingBoxes` (XYXY, `clamping_mode="hard"`) and `tv_tensors.Mask` with the
//! image, from the same drawn parameters.
//!
//! The ops never move targets themselves. Where an op draws or lowers its geometry (the plan's
//! crops, resizes and flips, the tail's sized ops, the policies' affine [`Step`]s and quarter-turn
//! remaps) it appends a primitive [`Geo`] step to the output's list; [`Follow::flush`] applies
//! the list to the boxes and the mask, in one place. The list lives in the *source* image's
//! coordinates and the ops' integer draws, never in the decoded region (a JPEG decoded by region
//! or at a DCT scale), so targets do not depend on how the pixels were decoded.
//!
//! Arithmetic is torchvision's, in `f32` as its box tensors are: a crop subtracts its offset and
//! clamps to the new canvas, a resize multiplies by `new / old` rounded to `f32` (no clamp), a
//! flip is `size - x`, an affine maps the four corners by the forward matrix (`f32`) and clamps
//! their enclosing box. Masks resample nearest exactly as `F.resize(mask, NEAREST)` (source index
//! `min(floor(dst · (in / out)), in - 1)` in `f32`), cut and pad with `mask_fill`, and warp
//! nearest with fill `mask_fill`. The last step is [`Follow::sanitize`]
//! (`SanitizeBoundingBoxes(min_size, min_area)`).
//!
//! Instance masks (1.10) are bit planes of the canvas's size ([`Targets::instances`]) moved by
//! the label map's kernels with fill 0 (a pixel no source covers belongs to no instance), so they
//! are exactly `tv_tensors.Mask` `[M, H, W]` moved nearest. Keypoints (1.10) move as
//! `tv_tensors.KeyPoints`: a crop subtracts its offset, a resize multiplies by `new / old` in
//! `f32`, a flip is torchvision's `size - 1 - x` (pixel indices, unlike a box's `size - x`), an
//! affine (and a policy's quarter turn, which torchvision rotates keypoints by) maps them by the
//! forward matrix; nothing clamps them (a point may leave the canvas) and their visibility `v` is
//! carried unchanged. Sanitising removes a box's instance mask and keypoints with it.
//!
//! Invariants: boxes and labels stay paired and in their order; the mask (when there is one) is
//! always the canvas's size; no allocation once warm (the lists and scratch keep capacity),
//! except when the last step removes boxes of a sample (their survivors are renumbered).

use ringfeed_format::targets::{LabelMap, Targets};

use super::OpError;
use super::affine;
use super::steps::{Remap, Step};

/// How targets end (control.md, `open.targets`): `SanitizeBoundingBoxes(min_size, min_area)`
/// after the last op, and the label of mask pixels no source pixel covers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TargetOptions {
    /// Boxes narrower or lower than this (output pixels) are removed. Default 1.
    pub min_size: f64,
    /// Boxes of a smaller area (square output pixels) are removed. Default 1.
    pub min_area: f64,
    /// The label of padding, zoom-out and the uncovered corners of a warp. Default 0.
    pub mask_fill: u8,
}

impl Default for TargetOptions {
    fn default() -> Self {
        TargetOptions {
            min_size: 1.0,
            min_area: 1.0,
            mask_fill: 0,
        }
    }
}

/// One primitive move of the canvas, as an op drew it. Sizes are `(width, height)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Geo {
    /// The `width`×`height` window at (`left`, `top`) of the canvas becomes the canvas; it may
    /// reach outside (padding): `F.crop` with negative offsets, `F.pad`, a larger CenterCrop.
    Crop {
        left: i64,
        top: i64,
        width: u32,
        height: u32,
    },
    /// The canvas is resized to `width`×`height`.
    Resize { width: u32, height: u32 },
    /// A pixel permutation onto a `width`×`height` canvas: output `(x, y)` reads source
    /// `(c0·x + c1·y + c2, c3·x + c4·y + c5)` (flips, quarter turns, EXIF orientations).
    /// `pixel`: keypoints move as pixel indices (`size - 1 - x`: torchvision's flips, and EXIF
    /// orientations) rather than as points of the continuous plane (`size - x`: torchvision's
    /// rotations, which boxes always follow).
    Remap {
        c: [i64; 6],
        width: u32,
        height: u32,
        pixel: bool,
    },
    /// A warp at the canvas's size by the inverse matrix of [`Step::Affine`] (centred
    /// coordinates, as `affine::inverse_matrix` makes it).
    Affine { inverse: [f64; 6] },
    /// RandomIoUCrop's filter before its crop: boxes whose centre is not strictly inside the
    /// window `[left, right] × [top, bottom]` are removed (torchvision zeroes them for the
    /// `SanitizeBoundingBoxes` it requires after it to remove).
    KeepCentred {
        left: i64,
        top: i64,
        right: i64,
        bottom: i64,
    },
}

impl Geo {
    /// The geometric part of a tail step (`None`: a colour step, which leaves targets alone).
    pub(crate) fn of_step(step: &Step, (w, h): (u32, u32)) -> Option<Geo> {
        match *step {
            Step::Remap(r) => Some(Geo::remap(r, (w, h))),
            Step::Affine { matrix, .. } => Some(Geo::Affine { inverse: matrix }),
            _ => None,
        }
    }

    /// A [`Remap`] of a `w`×`h` canvas (they keep its size).
    pub(crate) fn remap(r: Remap, (w, h): (u32, u32)) -> Geo {
        Geo::Remap {
            c: r.coefficients((w, h)),
            width: w,
            height: h,
            pixel: matches!(r, Remap::FlipX | Remap::FlipY),
        }
    }

    /// EXIF `orientation` of a stored `w`×`h` image (`ringfeed_decode`'s `orient` table), or
    /// `None` for 1 and unknown values.
    pub(crate) fn orientation(o: u8, (w, h): (u32, u32)) -> Option<Geo> {
        let (w1, h1) = (i64::from(w) - 1, i64::from(h) - 1);
        let (c, size) = match o {
            2 => ([-1, 0, w1, 0, 1, 0], (w, h)),
            3 => ([-1, 0, w1, 0, -1, h1], (w, h)),
            4 => ([1, 0, 0, 0, -1, h1], (w, h)),
            5 => ([0, 1, 0, 1, 0, 0], (h, w)),
            6 => ([0, 1, 0, -1, 0, h1], (h, w)),
            7 => ([0, -1, w1, -1, 0, h1], (h, w)),
            8 => ([0, -1, w1, 1, 0, 0], (h, w)),
            _ => return None,
        };
        Some(Geo::Remap {
            c,
            width: size.0,
            height: size.1,
            pixel: true,
        })
    }
}

/// One output's targets while its ops run: the geometry recorded so far and the targets moved
/// through the part of it already applied.
#[derive(Debug, Default)]
pub(crate) struct Follow {
    /// Whether the current output records its geometry (output 0 of a sample with targets).
    pub(crate) on: bool,
    /// The geometry recorded, in order.
    geo: Vec<Geo>,
    /// How many of `geo` `targets` has been moved through.
    done: usize,
    /// The canvas `targets` lies on (after `geo[..done]`).
    size: (u32, u32),
    /// The stored image's size, where `geo` starts.
    source: (u32, u32),
    /// The sample's targets, moved in (and handed back by) [`super::Processor::run_targets`].
    pub(crate) targets: Targets,
    /// Mask scratch, swapped with the mask at each step.
    scratch: Vec<u8>,
    /// The options of the sample's stream.
    pub(crate) options: TargetOptions,
}

impl Follow {
    /// Starts an output on a `width`×`height` source: no geometry yet.
    pub(crate) fn start(&mut self, on: bool, size: (u32, u32)) {
        self.on = on;
        self.geo.clear();
        self.done = 0;
        self.size = size;
        self.source = size;
    }

    /// Checks that the mask and the instance masks are the source's size
    /// ([`OpError::MaskSize`]).
    pub(crate) fn check(&self) -> Result<(), OpError> {
        let maps = self.targets.mask.iter().chain(&self.targets.instances);
        match maps.into_iter().find(|m| (m.width, m.height) != self.source) {
            Some(m) => Err(OpError::MaskSize {
                mask_width: m.width,
                mask_height: m.height,
                width: self.source.0,
                height: self.source.1,
            }),
            None => Ok(()),
        }
    }

    /// Moves the targets through all the geometry recorded and sanitises them.
    pub(crate) fn finish(&mut self) -> Result<(), OpError> {
        if self.done == 0 {
            self.check()?;
        }
        self.flush();
        self.sanitize();
        Ok(())
    }

    /// Records `g` if this output follows its geometry.
    #[inline]
    pub(crate) fn push(&mut self, g: Geo) {
        if self.on {
            self.geo.push(g);
        }
    }

    /// Records the geometric steps of `steps` (a tail op's lowering) on a `size` canvas.
    pub(crate) fn push_steps(&mut self, steps: &[Step], size: (u32, u32)) {
        if self.on {
            self.geo.extend(steps.iter().filter_map(|s| Geo::of_step(s, size)));
        }
    }

    /// Moves the targets through the geometry recorded since the last flush; returns their boxes
    /// (what RandomIoUCrop draws against).
    pub(crate) fn flush(&mut self) -> &[[f32; 4]] {
        let fill = self.options.mask_fill;
        for &g in &self.geo[self.done..] {
            self.size = apply(g, self.size, &mut self.targets, &mut self.scratch, fill);
        }
        self.done = self.geo.len();
        &self.targets.boxes
    }

    /// torchvision's `SanitizeBoundingBoxes(min_size, min_area)` on the current canvas: keeps
    /// the boxes at least `min_size` wide and high, of area at least `min_area`, with every
    /// coordinate in the canvas, in order, with their labels.
    pub(crate) fn sanitize(&mut self) {
        let (w, h) = (self.size.0 as f32, self.size.1 as f32);
        let (min_size, min_area) = (self.options.min_size as f32, self.options.min_area as f32);
        self.targets.retain(|b| {
            let [x0, y0, x1, y1] = *b;
            let (bw, bh) = (x1 - x0, y1 - y0);
            bw >= min_size
                && bh >= min_size
                && b.iter().all(|&v| v >= 0.0)
                && bw * bh >= min_area
                && x0 <= w
                && x1 <= w
                && y0 <= h
                && y1 <= h
        });
    }
}

/// Clamps an xyxy box to a `w`×`h` canvas (torchvision's `clamp_bounding_boxes`).
fn clamp(b: &mut [f32; 4], (w, h): (u32, u32)) {
    let (w, h) = (w as f32, h as f32);
    b[0] = b[0].clamp(0.0, w);
    b[2] = b[2].clamp(0.0, w);
    b[1] = b[1].clamp(0.0, h);
    b[3] = b[3].clamp(0.0, h);
}

/// Moves `t` on a `size` canvas through `g`; returns the new canvas.
fn apply(g: Geo, (w, h): (u32, u32), t: &mut Targets, scratch: &mut Vec<u8>, fill: u8) -> (u32, u32) {
    match g {
        Geo::Crop {
            left,
            top,
            width,
            height,
        } => {
            let (l, tp) = (left as f32, top as f32);
            for b in &mut t.boxes {
                *b = [b[0] - l, b[1] - tp, b[2] - l, b[3] - tp];
                clamp(b, (width, height));
            }
            for p in &mut t.keypoints {
                (p[0], p[1]) = (p[0] - l, p[1] - tp);
            }
            if let Some(m) = &mut t.mask {
                crop_mask(m, left, top, width, height, fill, scratch);
            }
            for m in &mut t.instances {
                crop_mask(m, left, top, width, height, 0, scratch);
            }
            (width, height)
        }
        Geo::Resize { width, height } => {
            if (width, height) == (w, h) {
                return (w, h);
            }
            // torchvision: `torch.tensor([w_ratio, h_ratio, ...])`, f64 ratios made f32.
            let rx = (f64::from(width) / f64::from(w)) as f32;
            let ry = (f64::from(height) / f64::from(h)) as f32;
            for b in &mut t.boxes {
                *b = [b[0] * rx, b[1] * ry, b[2] * rx, b[3] * ry];
            }
            for p in &mut t.keypoints {
                (p[0], p[1]) = (p[0] * rx, p[1] * ry);
            }
            for m in t.mask.iter_mut().chain(&mut t.instances) {
                resize_mask(m, width, height, scratch);
            }
            (width, height)
        }
        Geo::Remap {
            c,
            width,
            height,
            pixel,
        } => {
            // Output pixel d reads source pixel s = A·d + c; with A a signed permutation, a
            // point S of the continuous source lands at D = Aᵀ·(S - k), k = c + (1 - A·1) / 2.
            let k = (
                c[2] as f32 + 0.5 * (1 - c[0] - c[1]) as f32,
                c[5] as f32 + 0.5 * (1 - c[3] - c[4]) as f32,
            );
            let to = |x: f32, y: f32| {
                let (sx, sy) = (x - k.0, y - k.1);
                (c[0] as f32 * sx + c[3] as f32 * sy, c[1] as f32 * sx + c[4] as f32 * sy)
            };
            for b in &mut t.boxes {
                let (ax, ay) = to(b[0], b[1]);
                let (bx, by) = to(b[2], b[3]);
                *b = [ax.min(bx), ay.min(by), ax.max(bx), ay.max(by)];
            }
            // Pixel indices: output index d reads source index s = A·d + c, so d = Aᵀ·(s - c).
            let kp = if pixel { (c[2] as f32, c[5] as f32) } else { k };
            for p in &mut t.keypoints {
                let (sx, sy) = (p[0] - kp.0, p[1] - kp.1);
                (p[0], p[1]) = (c[0] as f32 * sx + c[3] as f32 * sy, c[1] as f32 * sx + c[4] as f32 * sy);
            }
            for m in t.mask.iter_mut().chain(&mut t.instances) {
                remap_mask(m, c, width, height, scratch);
            }
            (width, height)
        }
        Geo::Affine { inverse } => {
            let f = forward_pixels(inverse, (w, h)).map(|v| v as f32);
            for b in &mut t.boxes {
                let corners = [(b[0], b[1]), (b[2], b[1]), (b[2], b[3]), (b[0], b[3])];
                let mut out = [f32::INFINITY, f32::INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY];
                for (x, y) in corners {
                    let px = (x * f[0] + y * f[1]) + f[2];
                    let py = (x * f[3] + y * f[4]) + f[5];
                    out = [out[0].min(px), out[1].min(py), out[2].max(px), out[3].max(py)];
                }
                *b = out;
                clamp(b, (w, h));
            }
            for p in &mut t.keypoints {
                let (x, y) = (p[0], p[1]);
                (p[0], p[1]) = ((x * f[0] + y * f[1]) + f[2], (x * f[3] + y * f[4]) + f[5]);
            }
            let maps = t.mask.iter_mut().map(|m| (m, fill));
            for (m, fill) in maps.chain(t.instances.iter_mut().map(|m| (m, 0))) {
                scratch.resize(m.data.len(), 0);
                affine::warp_mask(&m.data, w, h, inverse, fill, scratch);
                std::mem::swap(&mut m.data, scratch);
            }
            (w, h)
        }
        Geo::KeepCentred {
            left,
            top,
            right,
            bottom,
        } => {
            let c = [left as f32, top as f32, right as f32, bottom as f32];
            t.retain(|b| super::geometry::centred_in(b, &c));
            (w, h)
        }
    }
}

/// The forward matrix, in pixel coordinates of a `w`×`h` canvas, of the warp whose inverse in
/// centred coordinates is `m` (`affine::inverse_matrix`): torchvision's
/// `_get_inverse_affine_matrix(..., inverted=False)` for the same parameters, up to rounding.
pub(crate) fn forward_pixels(m: [f64; 6], (w, h): (u32, u32)) -> [f64; 6] {
    // Centred u = P - c0; the inverse maps u_out to u_in = M·u_out + t, so
    // P_out = c0 + M⁻¹·(P_in - c0 - t).
    let (cx, cy) = (f64::from(w) * 0.5, f64::from(h) * 0.5);
    let det = m[0] * m[4] - m[1] * m[3];
    let inv = [m[4] / det, -m[1] / det, -m[3] / det, m[0] / det];
    let (tx, ty) = (-cx - m[2], -cy - m[5]);
    [
        inv[0],
        inv[1],
        cx + inv[0] * tx + inv[1] * ty,
        inv[2],
        inv[3],
        cy + inv[2] * tx + inv[3] * ty,
    ]
}

/// `F.crop(mask, top, left, height, width)` after any padding with `fill`: the window may reach
/// outside the mask.
fn crop_mask(m: &mut LabelMap, left: i64, top: i64, width: u32, height: u32, fill: u8, scratch: &mut Vec<u8>) {
    scratch.clear();
    scratch.resize(width as usize * height as usize, fill);
    let (sw, sh) = (i64::from(m.width), i64::from(m.height));
    let x0 = (-left).clamp(0, i64::from(width));
    let x1 = (sw - left).clamp(0, i64::from(width));
    if x1 > x0 {
        for y in 0..i64::from(height) {
            let sy = top + y;
            if sy < 0 || sy >= sh {
                continue;
            }
            let d = (y * i64::from(width) + x0) as usize;
            let s = (sy * sw + left + x0) as usize;
            let n = (x1 - x0) as usize;
            scratch[d..d + n].copy_from_slice(&m.data[s..s + n]);
        }
    }
    std::mem::swap(&mut m.data, scratch);
    (m.width, m.height) = (width, height);
}

/// PyTorch's `interpolate(mode="nearest")` source index of output `i`: `min(floor(i · s),
/// n_in - 1)` with `s = n_in / n_out` in `f32`.
#[inline]
fn nearest_index(i: u32, scale: f32, n_in: u32) -> usize {
    ((i as f32 * scale).floor() as u32).min(n_in - 1) as usize
}

/// `F.resize(mask, [height, width], NEAREST)`.
fn resize_mask(m: &mut LabelMap, width: u32, height: u32, scratch: &mut Vec<u8>) {
    let (sx, sy) = (m.width as f32 / width as f32, m.height as f32 / height as f32);
    scratch.clear();
    scratch.reserve(width as usize * height as usize);
    for y in 0..height {
        let row = &m.data[nearest_index(y, sy, m.height) * m.width as usize..][..m.width as usize];
        scratch.extend((0..width).map(|x| row[nearest_index(x, sx, m.width)]));
    }
    std::mem::swap(&mut m.data, scratch);
    (m.width, m.height) = (width, height);
}

/// A pixel permutation of the mask onto `width`×`height` ([`Geo::Remap`]).
fn remap_mask(m: &mut LabelMap, c: [i64; 6], width: u32, height: u32, scratch: &mut Vec<u8>) {
    scratch.clear();
    scratch.reserve(width as usize * height as usize);
    let sw = i64::from(m.width);
    for y in 0..i64::from(height) {
        for x in 0..i64::from(width) {
            let (sx, sy) = (c[0] * x + c[1] * y + c[2], c[3] * x + c[4] * y + c[5]);
            scratch.push(m.data[(sy * sw + sx) as usize]);
        }
    }
    std::mem::swap(&mut m.data, scratch);
    (m.width, m.height) = (width, height);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn follow(boxes: &[[f32; 4]], mask: Option<LabelMap>, size: (u32, u32)) -> Follow {
        let mut f = Follow {
            targets: Targets {
                boxes: boxes.to_vec(),
                labels: (0..boxes.len() as i64).collect(),
                mask,
                ..Targets::default()
            },
            ..Follow::default()
        };
        f.start(true, size);
        f
    }

    fn numbered(w: u32, h: u32) -> LabelMap {
        LabelMap {
            width: w,
            height: h,
            data: (0..w * h).map(|v| v as u8).collect(),
        }
    }

    #[test]
    fn a_padded_crop_shifts_clamps_and_fills() {
        let mut f = follow(&[[1.0, 1.0, 3.0, 2.0]], Some(numbered(4, 3)), (4, 3));
        f.options.mask_fill = 255;
        f.push(Geo::Crop {
            left: -1,
            top: 1,
            width: 3,
            height: 3,
        });
        f.flush();
        assert_eq!(f.targets.boxes, [[2.0, 0.0, 3.0, 1.0]]);
        let m = f.targets.mask.as_ref().unwrap();
        assert_eq!((m.width, m.height), (3, 3));
        assert_eq!(m.data, [255, 4, 5, 255, 8, 9, 255, 255, 255]);
    }

    #[test]
    fn a_resize_scales_and_takes_the_nearest_label() {
        let mut f = follow(&[[1.0, 0.0, 2.0, 3.0]], Some(numbered(4, 3)), (4, 3));
        f.push(Geo::Resize { width: 8, height: 2 });
        f.flush();
        assert_eq!(f.targets.boxes, [[2.0, 0.0, 4.0, 2.0]]);
        let m = f.targets.mask.as_ref().unwrap();
        // Rows: floor(y · 1.5) = 0, 1; columns floor(x / 2).
        assert_eq!(m.data, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]);
    }

    #[test]
    fn remaps_move_boxes_as_their_pixels() {
        // A box around pixel (1, 0) of a 4x3 image goes where the remap sends that pixel.
        for o in 2..=8u8 {
            let g = Geo::orientation(o, (4, 3)).unwrap();
            let mut f = follow(&[[1.0, 0.0, 2.0, 1.0]], Some(numbered(4, 3)), (4, 3));
            f.push(g);
            f.flush();
            let m = f.targets.mask.as_ref().unwrap();
            let at = m.data.iter().position(|&v| v == 1).unwrap() as u32;
            let (x, y) = ((at % m.width) as f32, (at / m.width) as f32);
            assert_eq!(f.targets.boxes, [[x, y, x + 1.0, y + 1.0]], "orientation {o}");
        }
    }

    #[test]
    fn the_forward_matrix_inverts_the_warp() {
        let inv = affine::inverse_matrix((0.0, 0.0), -30.0, (3.0, -2.0), 1.0, (10.0, 5.0));
        let f = forward_pixels(inv, (20, 10));
        // A point moved forward, then back through the inverse (centred coordinates).
        let (x, y) = (4.0, 7.0);
        let (fx, fy) = (f[0] * x + f[1] * y + f[2], f[3] * x + f[4] * y + f[5]);
        let (ux, uy) = (fx - 10.0, fy - 5.0);
        let (bx, by) = (inv[0] * ux + inv[1] * uy + inv[2], inv[3] * ux + inv[4] * uy + inv[5]);
        assert!((bx + 10.0 - x).abs() < 1e-9 && (by + 5.0 - y).abs() < 1e-9);
    }

    fn crop(left: i64, top: i64, width: u32, height: u32) -> Geo {
        Geo::Crop {
            left,
            top,
            width,
            height,
        }
    }

    #[test]
    fn keypoints_flip_as_pixel_indices_and_rotate_as_points() {
        // torchvision: horizontal_flip_keypoints is `w - 1 - x`; rotate_keypoints (a policy's
        // 180° turn) maps by the affine about (w/2, h/2), so `w - x`. Crops and resizes as boxes.
        let mut f = follow(&[[0.0, 0.0, 4.0, 3.0]], None, (4, 3));
        f.targets.keypoints = vec![[1.0, 0.5, 2.0]];
        f.push(Geo::remap(Remap::FlipX, (4, 3)));
        f.flush();
        assert_eq!(f.targets.keypoints, [[2.0, 0.5, 2.0]]);
        f.push(Geo::remap(Remap::Rot180, (4, 3)));
        f.push(crop(1, -1, 4, 4));
        f.push(Geo::Resize { width: 8, height: 2 });
        f.flush();
        // Rot180: (4 - 2, 3 - 0.5) = (2, 2.5); crop: (1, 3.5); resize ×(2, 0.5): (2, 1.75).
        assert_eq!(f.targets.keypoints, [[2.0, 1.75, 2.0]]);
        // Quarter turns of a square: torchvision's F.rotate(KeyPoints([[1, 0.5]], canvas 4x4), 90)
        // is (0.5, 3), by 270 (3.5, 1).
        for (r, want) in [(Remap::Rot90, [0.5, 3.0]), (Remap::Rot270, [3.5, 1.0])] {
            let mut f = follow(&[[0.0, 0.0, 1.0, 1.0]], None, (4, 4));
            f.targets.keypoints = vec![[1.0, 0.5, 1.0]];
            f.push(Geo::remap(r, (4, 4)));
            f.flush();
            assert_eq!(f.targets.keypoints, [[want[0], want[1], 1.0]], "{r:?}");
        }
    }

    #[test]
    fn instance_masks_move_as_the_label_map_with_fill_zero_and_leave_with_their_box() {
        // Nine boxes (two planes); box k's mask is the single pixel k of a 4x3 canvas.
        let boxes: Vec<[f32; 4]> = (0..9).map(|k| [0.0, 0.0, 1.0 + k as f32 * 0.1, 1.0]).collect();
        let mut f = follow(&boxes, Some(numbered(4, 3)), (4, 3));
        f.targets.instances = vec![LabelMap::filled(4, 3, 0), LabelMap::filled(4, 3, 0)];
        for k in 0..9 {
            f.targets.instances[k / 8].data[k] |= 1 << (k % 8);
        }
        f.targets.keypoints = (0..9).map(|k| [k as f32, 0.0, 1.0]).collect();
        f.options.mask_fill = 255;
        f.push(crop(-1, 0, 4, 3));
        f.flush();
        // Every plane moved as the label map, padding 0 (not mask_fill) in the planes.
        let m = f.targets.mask.clone().unwrap();
        for y in 0..3u32 {
            for x in 0..4u32 {
                let bits =
                    u32::from(f.targets.instances[0].get(x, y)) | u32::from(f.targets.instances[1].get(x, y)) << 8;
                // The label map names each pixel's source; source pixels 9.. are no box's.
                let want = if x == 0 || m.get(x, y) >= 9 {
                    0
                } else {
                    1 << m.get(x, y)
                };
                assert_eq!(bits, want, "({x}, {y})");
            }
        }
        // Box 1 is removed: box 2's mask and keypoints become box 1's, box 8's moves to plane 0.
        f.targets.boxes[1] = [0.0, 0.0, 0.5, 1.0];
        f.sanitize();
        assert_eq!(f.targets.labels, [0, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(f.targets.instances.len(), 1);
        assert_eq!(
            f.targets.keypoints[1],
            [3.0, 0.0, 1.0],
            "box 2's point, shifted by the crop"
        );
        assert_eq!(
            f.targets.instances[0].get(3, 0),
            1 << 1,
            "source pixel 2 is box 2's, now bit 1"
        );
        assert_eq!(
            f.targets.instances[0].get(1, 2),
            1 << 7,
            "source pixel 8 is box 8's, now bit 7"
        );
        assert_eq!(f.targets.instances[0].get(2, 0), 0, "box 1's pixel is gone with it");
    }

    #[test]
    fn sanitize_keeps_order_and_labels() {
        let mut f = follow(
            &[
                [0.0, 0.0, 5.0, 5.0],
                [1.0, 1.0, 1.5, 4.0],
                [2.0, 2.0, 4.0, 4.0],
                [0.0, 0.0, 11.0, 2.0],
            ],
            None,
            (10, 10),
        );
        f.sanitize();
        assert_eq!(f.targets.boxes, [[0.0, 0.0, 5.0, 5.0], [2.0, 2.0, 4.0, 4.0]]);
        assert_eq!(f.targets.labels, [0, 2]);
    }
    /// A PNG whose pixel `(x, y)` is `(5x + 1, 7y + 1, 7)`, so an output pixel names its source
    /// (blue 7) or is fill; and a label map `(7x + 13y) % 200 + 1` of the same size.
    fn coded(w: u32, h: u32) -> (Vec<u8>, LabelMap) {
        let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([(5 * x + 1) as u8, (7 * y + 1) as u8, 7]));
        let mut png = Vec::new();
        image::codecs::png::PngEncoder::new(&mut png)
            .write_image(img.as_raw(), w, h, image::ExtendedColorType::Rgb8)
            .unwrap();
        let mask = LabelMap {
            width: w,
            height: h,
            data: (0..h)
                .flat_map(|y| (0..w).map(move |x| ((7 * x + 13 * y) % 200 + 1) as u8))
                .collect(),
        };
        (png, mask)
    }

    use image::ImageEncoder;

    /// Runs `ops` (one view of `size`) with targets; the output image, and the targets.
    fn run(ops: serde_json::Value, size: [u32; 2], seed: u64, t: &mut Targets) -> Vec<u8> {
        let (png, mask) = coded(48, 36);
        t.mask = Some(mask);
        let pipeline = crate::Pipeline::parse(&serde_json::json!({"views": [{"ops": ops, "size": size}]})).unwrap();
        let mut p = crate::Processor::new(ringfeed_decode::Limits::default()).unwrap();
        let mut sink = crate::BufferSink::for_pipeline(&pipeline);
        let options = TargetOptions {
            mask_fill: 255,
            ..TargetOptions::default()
        };
        let rng = ringfeed_order::rng::SampleRng::new(seed, 0, 0);
        p.run_targets(
            &png,
            None,
            &pipeline,
            rng,
            crate::Layout::Nhwc,
            &mut sink,
            &mut crate::Trace::off(),
            t,
            &options,
        )
        .unwrap();
        sink.outs.remove(0)
    }

    #[test]
    fn a_header_probed_by_the_caller_is_the_one_used() {
        // The server hands on the header it probed for WebDataset instance masks: the sample is
        // then the one a probe of its own makes, and the header given is what the targets follow
        // (not probed again: a header claiming EXIF orientation 3 turns them).
        let (png, mask) = coded(48, 36);
        let pipeline = crate::Pipeline::parse(&serde_json::json!({"views": [{"ops": [
            {"op": "random_resized_crop", "size": [20, 24], "interpolation": "nearest"}], "size": [20, 24]}]}))
        .unwrap();
        let mut p = crate::Processor::new(ringfeed_decode::Limits::default()).unwrap();
        let info = p.probe(&png).unwrap();
        let options = TargetOptions::default();
        let mut go = |probed: Option<ringfeed_decode::ImageInfo>| {
            let mut t = Targets {
                mask: Some(mask.clone()),
                ..Targets::default()
            };
            let mut sink = crate::BufferSink::for_pipeline(&pipeline);
            let rng = ringfeed_order::rng::SampleRng::new(5, 0, 0);
            let (data, layout, trace) = (&png[..], crate::Layout::Nhwc, &mut crate::Trace::off());
            let crop = p
                .run_targets(data, probed, &pipeline, rng, layout, &mut sink, trace, &mut t, &options)
                .unwrap();
            (crop, sink.outs.remove(0), t)
        };
        let itself = go(None);
        assert_eq!(go(Some(info)), itself);
        let turned = go(Some(ringfeed_decode::ImageInfo { orientation: 3, ..info }));
        assert_ne!(turned.2.mask, itself.2.mask);
    }

    #[test]
    fn a_label_map_follows_its_pixels() {
        let (_, src) = coded(48, 36);
        let pipelines = [
            serde_json::json!([
                {"op": "random_resized_crop", "size": [20, 24], "interpolation": "nearest"},
                {"op": "horizontal_flip"}, {"op": "vertical_flip"}]),
            serde_json::json!([
                {"op": "resize", "size": [30], "interpolation": "nearest"},
                {"op": "random_crop", "size": [20, 24], "padding": [3], "pad_if_needed": true, "fill": [255, 255, 255]}]),
            serde_json::json!([{"op": "center_crop", "size": [20, 24]}, {"op": "invert", "p": 0.0}, {"op": "horizontal_flip"},
                {"op": "random_crop", "size": [20, 24], "padding": [4, 2], "fill": [255, 255, 255]}]),
            serde_json::json!([{"op": "center_crop", "size": [40, 51]}, {"op": "resize", "size": [20, 24], "interpolation": "nearest"}]),
        ];
        for ops in pipelines {
            for seed in 0..12 {
                let mut t = Targets::default();
                let out = run(ops.clone(), [20, 24], seed, &mut t);
                let m = t.mask.as_ref().unwrap();
                assert_eq!((m.width, m.height), (24, 20));
                for (px, &label) in out.chunks_exact(3).zip(&m.data) {
                    let want = if px[2] == 7 {
                        src.get(u32::from(px[0] - 1) / 5, u32::from(px[1] - 1) / 7)
                    } else {
                        255
                    };
                    assert_eq!(label, want, "{ops} seed {seed}");
                }
            }
        }
    }

    #[test]
    fn boxes_follow_their_pixels_through_crops_and_flips() {
        // Without a resize, an output pixel is inside the moved box exactly when its source
        // pixel was inside the box.
        let ops = serde_json::json!([
            {"op": "horizontal_flip"}, {"op": "center_crop", "size": [30, 44]}, {"op": "invert", "p": 0.0},
            {"op": "vertical_flip"}, {"op": "random_crop", "size": [20, 24], "padding": [4], "fill": [255, 255, 255]}]);
        let b = [10.0, 5.0, 30.0, 21.0];
        let mut kept = 0;
        for seed in 0..40 {
            let mut t = Targets {
                boxes: vec![b],
                labels: vec![3],
                ..Targets::default()
            };
            let out = run(ops.clone(), [20, 24], seed, &mut t);
            let inside_src = |x: f32, y: f32| x >= b[0] && x < b[2] && y >= b[1] && y < b[3];
            let moved = t.boxes.first().copied();
            kept += moved.is_some() as u32;
            for (i, px) in out.chunks_exact(3).enumerate() {
                let (x, y) = ((i % 24) as f32, (i / 24) as f32);
                let in_out = moved.is_some_and(|m| x >= m[0] && x < m[2] && y >= m[1] && y < m[3]);
                let in_src = px[2] == 7 && inside_src(f32::from(px[0] - 1) / 5.0, f32::from(px[1] - 1) / 7.0);
                assert_eq!(in_out, in_src, "seed {seed}: pixel ({x}, {y}), box {moved:?}");
            }
            assert_eq!(t.labels.len(), t.boxes.len());
        }
        assert!(kept > 20, "{kept}");
    }

    #[test]
    fn targets_need_one_image_and_a_mask_of_the_image_size() {
        let (png, _) = coded(48, 36);
        let two = crate::Pipeline::parse(
            &serde_json::json!({"views": [{"ops": [{"op": "center_crop", "size": [8, 8]}], "count": 2}]}),
        )
        .unwrap();
        let mut p = crate::Processor::new(ringfeed_decode::Limits::default()).unwrap();
        let mut sink = crate::BufferSink::for_pipeline(&two);
        let rng = ringfeed_order::rng::SampleRng::new(0, 0, 0);
        let mut t = Targets::default();
        let o = TargetOptions::default();
        let e = p.run_targets(
            &png,
            None,
            &two,
            rng.clone(),
            crate::Layout::Nhwc,
            &mut sink,
            &mut crate::Trace::off(),
            &mut t,
            &o,
        );
        assert!(e.unwrap_err().to_string().starts_with("targets: "));
        let one =
            crate::Pipeline::parse(&serde_json::json!({"views": [{"ops": [{"op": "center_crop", "size": [8, 8]}]}]}))
                .unwrap();
        let mut sink = crate::BufferSink::for_pipeline(&one);
        t.mask = Some(LabelMap::filled(36, 48, 0));
        let e = p.run_targets(
            &png,
            None,
            &one,
            rng,
            crate::Layout::Nhwc,
            &mut sink,
            &mut crate::Trace::off(),
            &mut t,
            &o,
        );
        assert!(
            e.unwrap_err()
                .to_string()
                .contains("mask is 36x48 but the image is 48x36")
        );
    }

    #[test]
    fn targets_follow_the_exif_orientation() {
        // Four quadrants of distinct colours; the mask names each pixel's quadrant, one box
        // covers quadrant 0. After each orientation the decoded pixels, the mask and the box
        // must still agree (interiors only: JPEG blurs the quadrant edges).
        let colours = [[250u8, 10, 10], [10, 250, 10], [10, 10, 250], [250, 250, 10]];
        let quadrant = |x: u32, y: u32| usize::from(x >= 24) + 2 * usize::from(y >= 16);
        let img = image::RgbImage::from_fn(48, 32, |x, y| image::Rgb(colours[quadrant(x, y)]));
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 95)
            .encode_image(&img)
            .unwrap();
        let mask = LabelMap {
            width: 48,
            height: 32,
            data: (0..32)
                .flat_map(|y| (0..48).map(move |x| quadrant(x, y) as u8))
                .collect(),
        };
        for o in 1..=8u8 {
            // APP1 "Exif", a little-endian TIFF whose IFD0 holds only tag 0x0112 = o.
            let mut app1 = b"Exif\0\0II\x2a\0\x08\0\0\0\x01\0\x12\x01\x03\0\x01\0\0\0".to_vec();
            app1.extend_from_slice(&[o, 0, 0, 0, 0, 0, 0, 0]);
            let mut data = vec![0xFF, 0xD8, 0xFF, 0xE1];
            data.extend_from_slice(&((app1.len() + 2) as u16).to_be_bytes());
            data.extend_from_slice(&app1);
            data.extend_from_slice(&jpeg[2..]);
            let (w, h) = if o >= 5 { (32, 48) } else { (48, 32) };
            let pipeline = crate::Pipeline::parse(&serde_json::json!({"views": [{"ops": [
                {"op": "center_crop", "size": [h, w]}]}]}))
            .unwrap();
            let mut p = crate::Processor::new(ringfeed_decode::Limits::default()).unwrap();
            let mut sink = crate::BufferSink::for_pipeline(&pipeline);
            let mut t = Targets {
                boxes: vec![[0.0, 0.0, 24.0, 16.0]],
                labels: vec![1],
                mask: Some(mask.clone()),
                ..Targets::default()
            };
            let rng = ringfeed_order::rng::SampleRng::new(0, 0, 0);
            let options = TargetOptions::default();
            p.run_targets(
                &data,
                None,
                &pipeline,
                rng,
                crate::Layout::Nhwc,
                &mut sink,
                &mut crate::Trace::off(),
                &mut t,
                &options,
            )
            .unwrap();
            let m = t.mask.as_ref().unwrap();
            assert_eq!((m.width, m.height), (w, h), "orientation {o}");
            let b = t.boxes[0];
            for y in 0..h {
                for x in 0..w {
                    let px = &sink.outs[0][((y * w + x) * 3) as usize..][..3];
                    let near = |c: &[u8; 3]| c.iter().zip(px).all(|(a, b)| a.abs_diff(*b) < 60);
                    let Some(q) = colours.iter().position(near) else {
                        continue;
                    };
                    assert_eq!(usize::from(m.get(x, y)), q, "orientation {o}: ({x}, {y})");
                    let inside = (x as f32) + 0.5 > b[0]
                        && (x as f32) + 0.5 < b[2]
                        && (y as f32) + 0.5 > b[1]
                        && (y as f32) + 0.5 < b[3];
                    assert_eq!(inside, q == 0, "orientation {o}: ({x}, {y}) and box {b:?}");
                }
            }
        }
    }
}
