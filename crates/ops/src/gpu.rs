//! Hybrid decode (control.md, "Hybrid decode"; ring.md, `gpu_job`): samples the client finishes
//! on its GPU.
//!
//! For such a sample the server does everything but the pixels: it probes the header, draws the
//! sample's parameters from the same generator in the same order as [`Processor::run`] would
//! (so `crop`, erasing boxes and every later draw agree with a CPU decode of the sample), and
//! describes the fused geometry as a [`GpuJob`], which the pool writes into the slot beside the
//! encoded bytes. Only a view whose ops are all geometric qualifies ([`finishable`]); a sample the
//! GPU path cannot take ([`Processor::plan_gpu`] answers `None`) is decoded on the CPU as before.

use super::plan::{self, Fused};
use super::spec::{Interpolation, Op, Pipeline};
use super::{OpError, Processor, Sink, Trace, crop_of, erasing_box};
use ringfeed_decode::{Chroma, ColorKind, Format, Rect};
use ringfeed_order::rng::SampleRng;

/// Values of `gpu_job` (ring.md), one int32 each.
pub const RECORD_LEN: usize = 18;

/// Bits of `gpu_job[16]` (ring.md).
pub mod flags {
    /// Mirror left to right.
    pub const FLIP_X: i32 = 1;
    /// Mirror top to bottom.
    pub const FLIP_Y: i32 = 2;
    /// The interpolation, bits 2–3: 0 nearest, 1 bilinear, 2 bicubic.
    pub const INTERPOLATION_SHIFT: i32 = 2;
    /// Antialias.
    pub const ANTIALIAS: i32 = 16;
    /// The JPEG's chroma sampling, bits 5–7 ([`super::chroma_code`]; 1.4; 0 from a 1.3 server).
    pub const CHROMA_SHIFT: i32 = 5;
}

/// `gpu_job[16]` bits 5–7 (ring.md, 1.4): how the sample's JPEG samples chroma, so that the
/// client can rebuild the chroma its GPU decoder replicated. 0 is "not said" (a 1.3 server).
pub fn chroma_code(c: Chroma) -> i32 {
    match c {
        Chroma::Gray => 1,
        Chroma::Full => 2,
        Chroma::HalfWidth => 3,
        Chroma::Half => 4,
        Chroma::HalfHeight => 5,
        Chroma::Other => 6,
    }
}

/// What the client needs to finish one sample from its decoded pixels (ring.md, `gpu_job`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuJob {
    /// The decoded image's `(width, height)`.
    pub src: (u32, u32),
    /// The source rectangle that is resized (or, without a resize, the part the window reads).
    pub pre: Rect,
    /// The resized base's `(width, height)`; `(0, 0)`: no resize.
    pub resize: (u32, u32),
    /// The output window's top-left corner in base pixels.
    pub win: (i64, i64),
    /// The part of the base that holds pixels, in base pixels.
    pub valid: (i64, i64, u32, u32),
    /// `gpu_job[16]`'s geometry bits (flips, interpolation, antialias).
    pub flags: i32,
    /// The fill colour.
    pub fill: [u8; 3],
    /// How the JPEG samples chroma (`gpu_job[16]` bits 5–7).
    pub chroma: Chroma,
}

impl GpuJob {
    /// The ring record for bytes `[offset, offset + length)` of the batch's arena.
    pub fn record(&self, offset: u32, length: u32) -> [i32; RECORD_LEN] {
        // Sizes are bounded by the decoder's limits (at most 65,535 per side for a JPEG) and
        // windows by the view's size (at most 4096): every value fits an i32.
        let c = |v: i64| v.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32;
        let u = |v: u32| c(i64::from(v));
        let fill = i32::from(self.fill[0]) | i32::from(self.fill[1]) << 8 | i32::from(self.fill[2]) << 16;
        [
            u(offset),
            u(length),
            u(self.src.0),
            u(self.src.1),
            u(self.pre.left),
            u(self.pre.top),
            u(self.pre.width),
            u(self.pre.height),
            u(self.resize.0),
            u(self.resize.1),
            c(self.win.0),
            c(self.win.1),
            c(self.valid.0),
            c(self.valid.1),
            u(self.valid.2),
            u(self.valid.3),
            self.flags | chroma_code(self.chroma) << flags::CHROMA_SHIFT,
            fill,
        ]
    }

    fn of(f: &Fused, src: (u32, u32), chroma: Chroma) -> GpuJob {
        let mut flags = (i32::from(f.flip_x) * flags::FLIP_X) | (i32::from(f.flip_y) * flags::FLIP_Y);
        let valid = (f.valid.left, f.valid.top, f.valid.width, f.valid.height);
        let (pre, resize) = match f.resize {
            Some(((rw, rh), r)) => {
                let kind = match r.interpolation {
                    Interpolation::Nearest => 0,
                    Interpolation::Bilinear => 1,
                    Interpolation::Bicubic => 2,
                };
                flags |= kind << flags::INTERPOLATION_SHIFT;
                if r.antialias {
                    flags |= flags::ANTIALIAS;
                }
                (f.pre, (rw, rh))
            }
            None => {
                // The base is the source: only the part of the window that holds pixels is read.
                let (fw, fh) = f.out_size();
                let l = f.win.left.max(f.valid.left);
                let t = f.win.top.max(f.valid.top);
                let r = (f.win.left + i64::from(fw)).min(f.valid.left + i64::from(f.valid.width));
                let b = (f.win.top + i64::from(fh)).min(f.valid.top + i64::from(f.valid.height));
                let pre = if r > l && b > t {
                    Rect {
                        left: l as u32,
                        top: t as u32,
                        width: (r - l) as u32,
                        height: (b - t) as u32,
                    }
                } else {
                    Rect::full(1, 1)
                };
                (pre, (0, 0))
            }
        };
        GpuJob {
            src,
            pre,
            resize,
            win: (f.win.left, f.win.top),
            valid,
            flags,
            fill: f.fill,
            chroma,
        }
    }
}

/// Whether position `pos` of a batch is offered to the GPU under share `share` (control.md,
/// "Which samples"): `floor((pos + 1) s) > floor(pos s)`, which spreads the offered positions
/// evenly and offers `floor(n s)` of the first `n`.
pub fn offered(pos: u32, share: f64) -> bool {
    let s = share.clamp(0.0, 1.0);
    ((f64::from(pos) + 1.0) * s).floor() > (f64::from(pos) * s).floor()
}

/// Why `pipeline` cannot be finished on the GPU, or `Ok`: one view of one image whose ops are all
/// geometric (crops, flips, at most one resize).
pub fn finishable(pipeline: &Pipeline) -> Result<(), NotFinishable> {
    let [view] = pipeline.views.as_slice() else {
        return Err(NotFinishable::Views(pipeline.views.len()));
    };
    if view.count != 1 {
        return Err(NotFinishable::Count {
            view: view.name.clone(),
            count: view.count,
        });
    }
    let mut resizes = 0;
    for (i, op) in view.ops.iter().enumerate() {
        match op {
            Op::RandomResizedCrop { .. } | Op::Resize { .. } => resizes += 1,
            Op::CenterCrop { .. } | Op::RandomCrop { .. } | Op::HorizontalFlip { .. } | Op::VerticalFlip { .. } => {}
            other => {
                return Err(NotFinishable::NotGeometric {
                    op: i,
                    view: view.name.clone(),
                    name: other.name(),
                });
            }
        }
        if resizes > 1 {
            return Err(NotFinishable::SecondResize {
                op: i,
                view: view.name.clone(),
            });
        }
    }
    Ok(())
}

/// Why a pipeline cannot be finished on the GPU ([`finishable`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotFinishable {
    /// More (or fewer) views than one.
    #[error("the pipeline has {0} views; GPU decode finishes one view")]
    Views(usize),
    /// The view makes several images per sample.
    #[error("view {view:?} makes {count} images per sample; GPU decode finishes one")]
    Count { view: String, count: u32 },
    /// Op `op` of the view (named `name`) is not a crop, flip or resize.
    #[error(
        "op {op} of view {view:?} ({name}) is not geometric; GPU decode finishes crops, flips and one resize, the other ops run on the CPU"
    )]
    NotGeometric {
        op: usize,
        view: String,
        name: &'static str,
    },
    /// Op `op` of the view is its second resize.
    #[error("op {op} of view {view:?} is a second resize; GPU decode finishes one")]
    SecondResize { op: usize, view: String },
}

impl Processor {
    /// Plans sample `data` for the client's GPU: draws its parameters as [`Processor::run`]
    /// does, hands its erasing boxes to `sink`, and returns its [`GpuJob`] and the ring's
    /// `crop`; `None` when the GPU path cannot take it (not a sequential Huffman-coded 8-bit
    /// grey or YCbCr JPEG ending in its EOI, an EXIF-rotated one, or geometry the fused prefix
    /// does not cover for the drawn parameters), and the caller decodes it on the CPU with the same `rng`.
    /// `pipeline` must be [`finishable`].
    pub fn plan_gpu(
        &mut self,
        data: &[u8],
        pipeline: &Pipeline,
        rng: SampleRng,
        sink: &mut dyn Sink,
        trace: &mut Trace,
    ) -> Result<Option<(GpuJob, super::Crop)>, OpError> {
        let [view] = pipeline.views.as_slice() else {
            return Ok(None);
        };
        // A file without its EOI is truncated: the CPU path reports it (a GPU decoder might fill
        // the missing rows with grey instead).
        if view.count != 1 || ringfeed_decode::sniff(data) != Some(Format::Jpeg) || !data.ends_with(&[0xFF, 0xD9]) {
            return Ok(None);
        }
        let info = self.decoder.probe(data)?;
        let plain = matches!(info.color, ColorKind::Gray | ColorKind::Rgb)
            && info.bits_per_channel == 8
            && info.orientation == 1
            && !info.progressive;
        let chroma = if plain {
            ringfeed_decode::sequential_huffman_chroma(data)
        } else {
            None
        };
        let Some(chroma) = chroma.filter(|_| info.width > 0 && info.height > 0) else {
            return Ok(None);
        };
        let mut g = rng;
        let f = plan::plan(&view.ops, info.width, info.height, &mut g, trace);
        if f.consumed != view.ops.len() || f.out_size() != (view.size.1, view.size.0) {
            return Ok(None);
        }
        self.check_size(f.out_size().0, f.out_size().1, view.ops.last())?;
        if !view.erasing.is_empty() {
            self.boxes.clear();
            for e in &view.erasing {
                self.boxes.push(erasing_box(e, view.size, &mut g));
            }
            sink.erase(0, 0, &self.boxes);
        }
        Ok(Some((GpuJob::of(&f, (info.width, info.height), chroma), crop_of(&f))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offered_positions_are_spread_and_counted() {
        for n in [1u32, 7, 64, 256] {
            for s in [0.0, 0.1, 0.25, 0.5, 1.0 / 3.0, 0.9, 1.0] {
                let picked: Vec<u32> = (0..n).filter(|&p| offered(p, s)).collect();
                assert_eq!(picked.len() as f64, (f64::from(n) * s).floor(), "n {n} share {s}");
            }
        }
        assert_eq!((0..8).filter(|&p| offered(p, 0.5)).collect::<Vec<_>>(), [1, 3, 5, 7]);
        assert!((0..8).all(|p| offered(p, 1.0)));
        assert!(!(0..8).any(|p| offered(p, 0.0)));
    }

    #[test]
    fn a_record_carries_the_chroma_beside_the_geometry_bits() {
        let job = GpuJob {
            src: (64, 48),
            pre: Rect::full(64, 48),
            resize: (32, 24),
            win: (0, 0),
            valid: (0, 0, 32, 24),
            flags: flags::FLIP_X | (2 << flags::INTERPOLATION_SHIFT) | flags::ANTIALIAS,
            fill: [1, 2, 3],
            chroma: Chroma::Half,
        };
        let f = job.record(0, 10)[16];
        assert_eq!(f & 0x1F, job.flags);
        assert_eq!(f >> flags::CHROMA_SHIFT, 4);
        let codes: Vec<i32> = [
            Chroma::Gray,
            Chroma::Full,
            Chroma::HalfWidth,
            Chroma::Half,
            Chroma::HalfHeight,
            Chroma::Other,
        ]
        .into_iter()
        .map(chroma_code)
        .collect();
        // Distinct, non-zero (0 is a 1.3 server's "not said"), within bits 5-7.
        assert_eq!(codes, [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn only_geometric_single_views_are_finishable() {
        let p = |json: &str| Pipeline::parse(&serde_json::from_str(json).unwrap()).unwrap();
        let ok = p(r#"{"views":[{"ops":[{"op":"random_resized_crop","size":[224]},{"op":"horizontal_flip"}]}]}"#);
        assert!(finishable(&ok).is_ok());
        let eval = p(r#"{"views":[{"ops":[{"op":"resize","size":[256]},{"op":"center_crop","size":[224]}]}]}"#);
        assert!(finishable(&eval).is_ok());
        let jitter = p(
            r#"{"views":[{"ops":[{"op":"random_resized_crop","size":[224]},{"op":"color_jitter","brightness":[0.6,1.4]}]}]}"#,
        );
        let e = finishable(&jitter).unwrap_err().to_string();
        assert!(e.contains("color_jitter") && e.contains("not geometric"), "{e}");
        let two = p(r#"{"views":[{"count":2,"ops":[{"op":"random_resized_crop","size":[96]}]}]}"#);
        assert!(finishable(&two).unwrap_err().to_string().contains("2 images"));
    }
}
