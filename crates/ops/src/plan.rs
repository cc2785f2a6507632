//! The geometric prefix of a view, fused into the decode: crops, flips and at most one resize
//! at the head of the op list become one decoded region and one resample, so a
//! RandomResizedCrop still decodes only its crop (and, with restart markers, entropy-decodes
//! only its segments), and Resize + CenterCrop samples only the pixels the crop keeps.
//!
//! The planner walks the ops as torchvision would run them, drawing the same random numbers
//! in the same order from the same sizes, but moves a window instead of pixels:
//!
//! - The current image is a window of a *base* image: the decoded source before the resize,
//!   the resized source after it. A window may reach outside the part of the base that holds
//!   pixels (`valid`): RandomCrop's padding, a CenterCrop larger than the image. Those pixels
//!   are `fill`.
//! - Flips set a flag and mirror the window's later crops, so a crop drawn on the flipped image
//!   takes the same pixels; the output is mirrored at the end.
//! - Exactness: a crop after a resize samples the resized image's own pixel grid, so resampling
//!   only the crop's part gives the same bytes as resizing the whole and cropping; a resize after
//!   a crop reads only the crop (`bounds`), as torchvision's crop-then-resize does.
//!
//! The prefix ends at the first op that is not geometric, at a second resize, and at a resize
//! of a padded window (the filter would have to read the fill); the rest of the ops then run
//! on the materialised image.

use super::geometry::{random_resized_crop_params, resize_target};
use super::spec::{Interpolation, Op, Resampling};
use super::steps::Remap;
use super::targets::{Follow, Geo};
use super::trace::Trace;
use ringfeed_decode::resample::Rect;
use ringfeed_order::rng::SampleRng;

/// A window of a base image, in the base's pixels; may reach outside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Win {
    pub(super) left: i64,
    pub(super) top: i64,
    pub(super) width: u32,
    pub(super) height: u32,
}

impl Win {
    fn full(width: u32, height: u32) -> Win {
        Win {
            left: 0,
            top: 0,
            width,
            height,
        }
    }

    fn intersect(&self, o: &Win) -> Win {
        let l = self.left.max(o.left);
        let t = self.top.max(o.top);
        let r = (self.left + i64::from(self.width)).min(o.left + i64::from(o.width));
        let b = (self.top + i64::from(self.height)).min(o.top + i64::from(o.height));
        Win {
            left: l,
            top: t,
            width: (r - l).max(0) as u32,
            height: (b - t).max(0) as u32,
        }
    }

    fn contains(&self, o: &Win) -> bool {
        self.intersect(o) == *o
    }
}

/// What a view's fused prefix does to one image.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Fused {
    /// How many of the view's ops it covers.
    pub(super) consumed: usize,
    /// The source window that is resized (`pre`, inside the source): what the filter may read.
    pub(super) pre: Rect,
    /// The resize: the resized base's size and how it was resampled; `None`: no resize.
    pub(super) resize: Option<((u32, u32), Resampling)>,
    /// The output window in base pixels (unmirrored).
    pub(super) win: Win,
    /// The part of the base that holds pixels, in base pixels.
    pub(super) valid: Win,
    /// Colour of the output pixels outside `valid`.
    pub(super) fill: [u8; 3],
    /// Mirror the output left to right.
    pub(super) flip_x: bool,
    /// Mirror the output top to bottom.
    pub(super) flip_y: bool,
}

impl Fused {
    /// The output's `(width, height)`.
    pub(super) fn out_size(&self) -> (u32, u32) {
        (self.win.width, self.win.height)
    }

    /// The part of the output that holds pixels (the rest is `fill`), in output pixels
    /// (unmirrored).
    pub(super) fn dst(&self) -> Rect {
        let d = self.win.intersect(&self.valid);
        if d.width == 0 || d.height == 0 {
            return Rect::full(0, 0);
        }
        Rect {
            left: (d.left - self.win.left) as u32,
            top: (d.top - self.win.top) as u32,
            width: d.width,
            height: d.height,
        }
    }

    /// The source box sampled into [`Fused::dst`], in source pixels.
    pub(super) fn sample(&self) -> (f64, f64, f64, f64) {
        let d = self.win.intersect(&self.valid);
        let (sx, sy) = self.scale();
        (
            f64::from(self.pre.left) + d.left as f64 * sx,
            f64::from(self.pre.top) + d.top as f64 * sy,
            f64::from(d.width) * sx,
            f64::from(d.height) * sy,
        )
    }

    /// Source pixels per base pixel.
    pub(super) fn scale(&self) -> (f64, f64) {
        match self.resize {
            Some(((rw, rh), _)) => (
                f64::from(self.pre.width) / f64::from(rw.max(1)),
                f64::from(self.pre.height) / f64::from(rh.max(1)),
            ),
            None => (1.0, 1.0),
        }
    }

    /// The source rectangle the resample reads: the sampled box widened by the filter's
    /// reach, clipped to `pre`.
    pub(super) fn reads(&self) -> Rect {
        let dst = self.dst();
        if dst.width == 0 || dst.height == 0 {
            return Rect {
                left: self.pre.left,
                top: self.pre.top,
                width: 1.min(self.pre.width),
                height: 1.min(self.pre.height),
            };
        }
        let (l, t, w, h) = self.sample();
        let support = match self.resize {
            Some((_, r)) if r.interpolation == Interpolation::Bicubic => 2.0,
            Some(_) => 1.0,
            None => 0.0,
        };
        let axis = |start: f64, len: f64, out: u32, lo: u32, n: u32| -> (u32, u32) {
            let reach = if support == 0.0 {
                0.0
            } else {
                support * (len / f64::from(out.max(1))).max(1.0) + 1.0
            };
            let a = (start - reach).floor().max(f64::from(lo)) as u32;
            let b = ((start + len + reach).ceil().min(f64::from(lo + n)) as u32).max(a + 1);
            (a, b - a)
        };
        let (left, width) = axis(l, w, dst.width, self.pre.left, self.pre.width);
        let (top, height) = axis(t, h, dst.height, self.pre.top, self.pre.height);
        Rect {
            left,
            top,
            width,
            height,
        }
    }
}

/// The crop of a window `w`×`h` of the current image at (`left`, `top`) in its own (possibly
/// mirrored) pixels, as a window of the base.
fn sub(win: Win, flip: (bool, bool), left: i64, top: i64, w: u32, h: u32) -> Win {
    let l = if flip.0 {
        win.left + i64::from(win.width) - left - i64::from(w)
    } else {
        win.left + left
    };
    let t = if flip.1 {
        win.top + i64::from(win.height) - top - i64::from(h)
    } else {
        win.top + top
    };
    Win {
        left: l,
        top: t,
        width: w,
        height: h,
    }
}

/// torchvision's CenterCrop offsets of a `crop` window in `n` pixels: `int(round((n - c) / 2))`,
/// or, when the crop is larger, the negated padding before it (`(c - n) // 2`).
pub(crate) fn center_offset(n: u32, c: u32) -> i64 {
    if c <= n {
        ((f64::from(n - c)) / 2.0).round_ties_even() as i64
    } else {
        -i64::from((c - n) / 2)
    }
}

/// Plans the geometric prefix of `ops` on a `width`×`height` (oriented) source, drawing from
/// `rng`, and records each consumed op's geometry in `follow` as torchvision would apply it (in
/// the frame of the image the op sees, not the window's). Never fails: parameters were
/// validated with the pipeline.
pub(super) fn plan(
    ops: &[Op],
    width: u32,
    height: u32,
    rng: &mut SampleRng,
    trace: &mut Trace,
    follow: &mut Follow,
) -> Fused {
    let mut f = Fused {
        consumed: 0,
        pre: Rect::full(width, height),
        resize: None,
        win: Win::full(width, height),
        valid: Win::full(width, height),
        fill: [0; 3],
        flip_x: false,
        flip_y: false,
    };
    let mut padded = false;
    for op in ops {
        let (cw, ch) = (f.win.width, f.win.height);
        let flip = (f.flip_x, f.flip_y);
        match *op {
            Op::HorizontalFlip { p } => {
                let on = rng.uniform(0.0, 1.0) < p;
                trace.record(op, || [("flip", on.into())]);
                if on {
                    follow.push(Geo::remap(Remap::FlipX, (cw, ch)));
                }
                f.flip_x ^= on;
            }
            Op::VerticalFlip { p } => {
                let on = rng.uniform(0.0, 1.0) < p;
                trace.record(op, || [("flip", on.into())]);
                if on {
                    follow.push(Geo::remap(Remap::FlipY, (cw, ch)));
                }
                f.flip_y ^= on;
            }
            Op::CenterCrop { size: (h, w) } => {
                let (l, t) = (center_offset(cw, w), center_offset(ch, h));
                let next = sub(f.win, flip, l, t, w, h);
                if !pad_ok(&mut f, &mut padded, next, [0; 3]) {
                    break;
                }
                trace.record(op, || [("top", t.into()), ("left", l.into())]);
                follow.push(Geo::Crop {
                    left: l,
                    top: t,
                    width: w,
                    height: h,
                });
            }
            Op::RandomCrop {
                size: (h, w),
                padding,
                pad_if_needed,
                fill,
            } => {
                let Some(c) = random_crop_offsets(cw, ch, (h, w), padding, pad_if_needed, rng) else {
                    break;
                };
                let (t, l) = (c.top, c.left);
                let next = sub(f.win, flip, l, t, w, h);
                if !pad_ok(&mut f, &mut padded, next, fill) {
                    break;
                }
                trace.record(op, || [("top", t.into()), ("left", l.into())]);
                c.record((cw, ch), follow);
            }
            Op::RandomResizedCrop {
                size: (h, w),
                scale,
                ratio,
                resampling,
            } => {
                if f.resize.is_some() || padded {
                    break;
                }
                let (t, l, ch2, cw2) = random_resized_crop_params(cw, ch, scale, ratio, rng);
                trace.record(op, || {
                    [
                        ("top", t.into()),
                        ("left", l.into()),
                        ("height", ch2.into()),
                        ("width", cw2.into()),
                    ]
                });
                let crop = sub(f.win, flip, i64::from(l), i64::from(t), cw2, ch2);
                follow.push(Geo::Crop {
                    left: i64::from(l),
                    top: i64::from(t),
                    width: cw2,
                    height: ch2,
                });
                follow.push(Geo::Resize { width: w, height: h });
                f.pre = to_rect(crop);
                f.resize = Some(((w, h), resampling));
                f.win = Win::full(w, h);
                f.valid = f.win;
            }
            Op::Resize {
                size,
                max_size,
                resampling,
            } => {
                if f.resize.is_some() || padded {
                    break;
                }
                let (rw, rh) = resize_target(cw, ch, size, max_size);
                trace.record(op, || [("height", rh.into()), ("width", rw.into())]);
                follow.push(Geo::Resize { width: rw, height: rh });
                f.pre = to_rect(f.win);
                f.resize = Some(((rw, rh), resampling));
                f.win = Win::full(rw, rh);
                f.valid = f.win;
            }
            _ => break,
        }
        f.consumed += 1;
    }
    f
}

/// Accepts `next` as the window if the fill it introduces agrees with the fill so far.
fn pad_ok(f: &mut Fused, padded: &mut bool, next: Win, fill: [u8; 3]) -> bool {
    let pads = !f.win.contains(&next);
    if pads {
        if *padded && fill != f.fill {
            return false;
        }
        // Pixels outside the current window are fill from now on, even where the base has some.
        f.valid = f.valid.intersect(&f.win);
        f.fill = fill;
        *padded = true;
    }
    f.win = next;
    true
}

fn to_rect(w: Win) -> Rect {
    Rect {
        left: w.left.max(0) as u32,
        top: w.top.max(0) as u32,
        width: w.width,
        height: w.height,
    }
}

/// What torchvision v2's `RandomCrop.make_params` drew: the crop's offset relative to the
/// unpadded image (negative inside the padding), and the padding it adds first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CropDraw {
    /// First row of the crop, in the unpadded image's rows.
    pub(super) top: i64,
    /// First column.
    pub(super) left: i64,
    /// `[left, top, right, bottom]` padding (with `pad_if_needed`'s).
    pub(super) pad: [i64; 4],
    /// The crop's `(height, width)`.
    pub(super) size: (u32, u32),
}

impl CropDraw {
    /// Records torchvision's `F.pad` (when any padding) then `F.crop` (when the crop is smaller
    /// than the padded image) on a `(w, h)` image, as it runs them.
    pub(super) fn record(&self, (w, h): (u32, u32), follow: &mut Follow) {
        let [pl, pt, pr, pb] = self.pad;
        let (pw, ph) = (i64::from(w) + pl + pr, i64::from(h) + pt + pb);
        if self.pad != [0; 4] {
            follow.push(Geo::Crop {
                left: -pl,
                top: -pt,
                width: pw as u32,
                height: ph as u32,
            });
        }
        let (ch, cw) = self.size;
        if ph > i64::from(ch) || pw > i64::from(cw) {
            follow.push(Geo::Crop {
                left: self.left + pl,
                top: self.top + pt,
                width: cw,
                height: ch,
            });
        }
    }
}

/// torchvision v2 `RandomCrop.make_params` on a `w`×`h` image, drawing `top` then `left`.
/// `None` when the crop does not fit the padded image (torchvision raises; the pipeline then
/// reports the sample).
pub(crate) fn random_crop_offsets(
    w: u32,
    h: u32,
    (ch, cw): (u32, u32),
    padding: [u32; 4],
    pad_if_needed: bool,
    rng: &mut SampleRng,
) -> Option<CropDraw> {
    let [mut pl, mut pt, mut pr, mut pb] = padding.map(i64::from);
    let mut ph = i64::from(h) + pt + pb;
    let mut pw = i64::from(w) + pl + pr;
    let (chi, cwi) = (i64::from(ch), i64::from(cw));
    if pad_if_needed {
        if ph < chi {
            let diff = chi - ph;
            pt += diff;
            pb += diff;
            ph += 2 * diff;
        }
        if pw < cwi {
            let diff = cwi - pw;
            pl += diff;
            pr += diff;
            pw += 2 * diff;
        }
    }
    if ph < chi || pw < cwi {
        return None;
    }
    let top = if ph > chi {
        rng.below((ph - chi + 1) as u64) as i64
    } else {
        0
    };
    let left = if pw > cwi {
        rng.below((pw - cwi + 1) as u64) as i64
    } else {
        0
    };
    Some(CropDraw {
        top: top - pt,
        left: left - pl,
        pad: [pl, pt, pr, pb],
        size: (ch, cw),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::ResizeTo;

    fn run(ops: &[Op], w: u32, h: u32) -> Fused {
        plan(
            ops,
            w,
            h,
            &mut SampleRng::new(1, 2, 3),
            &mut Trace::off(),
            &mut Follow::default(),
        )
    }

    #[test]
    fn resize_then_center_crop_samples_the_middle() {
        let ops = [
            Op::Resize {
                size: ResizeTo::Shorter(256),
                max_size: None,
                resampling: Resampling::default(),
            },
            Op::CenterCrop { size: (224, 224) },
        ];
        let f = run(&ops, 500, 375);
        assert_eq!(f.consumed, 2);
        assert_eq!(f.resize.map(|r| r.0), Some((341, 256)));
        // round((341 - 224) / 2) = 58, round((256 - 224) / 2) = 16.
        assert_eq!((f.win.left, f.win.top), (58, 16));
        let (l, t, w, _) = f.sample();
        assert!((l - 58.0 * 500.0 / 341.0).abs() < 1e-9 && (t - 16.0 * 375.0 / 256.0).abs() < 1e-9);
        assert!((w - 224.0 * 500.0 / 341.0).abs() < 1e-9);
        assert_eq!(f.dst(), Rect::full(224, 224));
        assert!(Rect::full(500, 375).contains(&f.reads()));
    }

    #[test]
    fn a_larger_center_crop_pads_with_zeros() {
        let f = run(&[Op::CenterCrop { size: (8, 4) }], 4, 4);
        assert_eq!(
            f.dst(),
            Rect {
                left: 0,
                top: 2,
                width: 4,
                height: 4
            }
        );
        assert_eq!(f.fill, [0; 3]);
    }

    #[test]
    fn a_flip_mirrors_later_crops() {
        // CenterCrop of a 10-wide image to 4 at offset 3: [3, 7) flipped or not, it is the
        // middle; a RandomCrop with padding after a flip takes the mirrored window.
        let crop = Op::RandomCrop {
            size: (1, 4),
            padding: [0; 4],
            pad_if_needed: false,
            fill: [0; 3],
        };
        let plain = run(std::slice::from_ref(&crop), 10, 1);
        let flipped = run(&[Op::HorizontalFlip { p: 1.0 }, crop], 10, 1);
        assert!(flipped.flip_x);
        // Same draws (the flip's uniform comes first, so compare the geometry of one draw).
        let mut rng = SampleRng::new(1, 2, 3);
        let _ = rng.uniform(0.0, 1.0);
        let l = random_crop_offsets(10, 1, (1, 4), [0; 4], false, &mut rng)
            .unwrap()
            .left;
        assert_eq!(flipped.win.left, 10 - l - 4);
        assert!(plain.win.left >= 0 && plain.win.left <= 6);
    }

    #[test]
    fn random_crop_padding_follows_torchvision() {
        // CIFAR: 32x32, padding 4: offsets in -4..=4.
        let mut rng = SampleRng::new(0, 0, 0);
        for _ in 0..500 {
            let c = random_crop_offsets(32, 32, (32, 32), [4; 4], false, &mut rng).unwrap();
            let (t, l) = (c.top, c.left);
            assert!((-4..=4).contains(&t) && (-4..=4).contains(&l));
        }
        // pad_if_needed pads a short side by the full difference on both ends.
        let t = random_crop_offsets(10, 5, (9, 10), [0; 4], true, &mut rng).unwrap().top;
        assert!((-4..=0).contains(&t));
        assert_eq!(random_crop_offsets(10, 5, (9, 10), [0; 4], false, &mut rng), None);
    }

    #[test]
    fn a_second_resize_ends_the_prefix() {
        let r = Op::Resize {
            size: ResizeTo::Exact(10, 10),
            max_size: None,
            resampling: Resampling::default(),
        };
        let f = run(&[r.clone(), Op::Invert { p: 1.0 }, r.clone()], 20, 20);
        assert_eq!(f.consumed, 1);
        let f = run(&[r.clone(), r], 20, 20);
        assert_eq!(f.consumed, 1);
    }
}
