//! Hybrid decode (control.md, "Hybrid decode"; ring.md, `gpu_job`): samples the client finishes
//! on its GPU.
//!
//! For such a sample the server does everything but the pixels: it probes the header, draws the
//! sample's parameters from the same generator in the same order as [`Processor::run`] would
//! (so `crop`, erasing boxes and every later draw agree with a CPU decode of the sample), and
//! describes the fused geometry as a [`GpuJob`], which the pool writes into the slot beside the
//! encoded bytes. A view qualifies when its ops are a geometric prefix and (control 1.8) a tail of
//! per-image ops that keep its size ([`finishable`]): the tail's draws become steps
//! ([`crate::steps`]), which the pool writes as `gpu_ops` records. Since control 1.10 a sample
//! may have several outputs (views, and images per view): the client decodes it once and
//! finishes each output from the same pixels, so each output has its own job and steps, drawn
//! from the output's generator (`j = 0` the sample's, `j > 0` its `fork(j)`), as the CPU path
//! draws them. A sample the GPU path cannot take ([`Processor::plan_gpu`] answers `None`) is
//! decoded on the CPU as before.

use super::plan::{self, Fused};
use super::spec::{Interpolation, Op, Pipeline};
use super::steps::{self, Step};
use super::{OpError, Processor, Sink, TargetOptions, Targets, Trace, crop_of, erasing_box};
use ringfeed_decode::{Chroma, ColorKind, Format, Rect};
use ringfeed_format::ring::gpu_ops::MAX_STEPS;
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
    /// 1.11: the arena holds the sample's decoded pixels, not a JPEG (ring.md, "Decoded pixels").
    pub const PIXELS: i32 = 256;
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

/// 1.11: a pixel sample as [`Processor::plan_pixels`] planned it (control.md, "Decoded pixels").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PixelPlan {
    /// The ring's `crop` (output 0's).
    pub crop: super::Crop,
    /// The rectangle of the oriented image to decode: the union of the outputs' `pre`.
    pub rect: Rect,
    /// The oriented image's `(width, height)`.
    pub image: (u32, u32),
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

    /// 1.11: the record of a pixel sample whose decoded rectangle `r` of the source (which holds
    /// [`GpuJob::pre`]) lies in the arena at `offset` as packed RGB rows (control.md, "Decoded
    /// pixels (1.11)"): the source becomes `r`, the coordinates move with it (`win` and `valid`
    /// only without a resize: then the base is the source), bit 8 is set and the chroma bits 0.
    pub fn pixel_record(&self, offset: u32, r: Rect) -> [i32; RECORD_LEN] {
        let mut job = *self;
        job.src = (r.width, r.height);
        job.pre.left -= r.left;
        job.pre.top -= r.top;
        if job.resize == (0, 0) {
            let (dx, dy) = (i64::from(r.left), i64::from(r.top));
            job.win = (job.win.0 - dx, job.win.1 - dy);
            job.valid.0 -= dx;
            job.valid.1 -= dy;
        }
        job.flags |= flags::PIXELS;
        // `r` fits the arena (at most 64 MiB a sample), so its byte count fits a u32.
        let mut record = job.record(offset, r.width * r.height * 3);
        record[16] &= !(7 << flags::CHROMA_SHIFT);
        record
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

/// How many leading ops of `ops` the geometric prefix can cover: the leading crops, flips and
/// resizes, up to a second resize ([`GpuJob`]; the plan may stop earlier for some draws).
pub fn prefix_len(ops: &[Op]) -> usize {
    let mut resizes = 0;
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::RandomResizedCrop { .. } | Op::Resize { .. } => {
                resizes += 1;
                if resizes > 1 {
                    return i;
                }
            }
            Op::CenterCrop { .. } | Op::RandomCrop { .. } | Op::HorizontalFlip { .. } | Op::VerticalFlip { .. } => {}
            _ => return i,
        }
    }
    ops.len()
}

/// Whether (and how) `pipeline` can be finished on the GPU in a session of protocol `1.minor`:
/// each view's ops a geometric prefix ([`prefix_len`]) and, from 1.8, a tail of ops that keep the
/// image's size and lower to steps ([`steps::lowers`]). Before 1.10 only one view of one image
/// qualifies; from 1.10 any number of views and images per view (each output finished from the
/// sample's one decode). `Ok(s)`: the `gpu_ops` field's steps per output, the most any view can
/// draw, 0 when no view has a tail (no field).
pub fn finishable(pipeline: &Pipeline, minor: u16) -> Result<u32, NotFinishable> {
    if minor < 10 {
        let [view] = pipeline.views.as_slice() else {
            return Err(NotFinishable::Views(pipeline.views.len()));
        };
        if view.count != 1 {
            return Err(NotFinishable::Count {
                view: view.name.clone(),
                count: view.count,
            });
        }
    }
    let mut most = 0;
    for view in &pipeline.views {
        most = most.max(view_steps(view, minor >= 8)?);
    }
    Ok(most)
}

/// [`finishable`] for one view: its steps per image (0: no tail).
fn view_steps(view: &super::View, per_image: bool) -> Result<u32, NotFinishable> {
    let prefix = prefix_len(&view.ops);
    let Some(first) = view.ops.get(prefix) else {
        return Ok(0);
    };
    if matches!(first, Op::RandomResizedCrop { .. } | Op::Resize { .. }) {
        return Err(NotFinishable::SecondResize {
            op: prefix,
            view: view.name.clone(),
        });
    }
    if !per_image {
        return Err(NotFinishable::NotGeometric {
            op: prefix,
            view: view.name.clone(),
            name: first.name(),
        });
    }
    if let Some(i) = view.ops[prefix..].iter().position(|o| !steps::lowers(o)) {
        return Err(NotFinishable::Sized {
            op: prefix + i,
            view: view.name.clone(),
            name: view.ops[prefix + i].name(),
        });
    }
    // Flips of the prefix count too: a plan that stops early leaves them to the tail.
    let most: u32 = view.ops.iter().map(steps::max_steps).sum();
    if most > MAX_STEPS {
        return Err(NotFinishable::Steps {
            view: view.name.clone(),
            steps: most,
        });
    }
    Ok(most.max(1))
}

/// Why a pipeline cannot be finished on the GPU ([`finishable`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotFinishable {
    /// More (or fewer) views than one (before 1.10).
    #[error("the pipeline has {0} views; GPU decode finishes one view before protocol 1.10")]
    Views(usize),
    /// The view makes several images per sample (before 1.10).
    #[error("view {view:?} makes {count} images per sample; GPU decode finishes one before protocol 1.10")]
    Count { view: String, count: u32 },
    /// Op `op` of the view (named `name`) is not a crop, flip or resize (a 1.7 session).
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
    /// Op `op` changes the image's size after a per-image op (1.8).
    #[error(
        "op {op} of view {view:?} ({name}) changes the image's size after a per-image op; GPU decode finishes crops, flips and one resize first, then ops that keep the size"
    )]
    Sized {
        op: usize,
        view: String,
        name: &'static str,
    },
    /// The view's ops can draw more steps than `gpu_ops` holds.
    #[error("view {view:?} can draw {steps} per-image steps per sample; GPU decode finishes at most {MAX_STEPS}")]
    Steps { view: String, steps: u32 },
}

impl Processor {
    /// Plans sample `data` for the client's GPU: draws its parameters as [`Processor::run`]
    /// does, for every output (views in order, their images in order; output `j` from `rng`'s
    /// `fork(j)`, `j = 0` from `rng` itself), hands their erasing boxes to `sink`, and returns the
    /// ring's `crop` (output 0's); the outputs' jobs are then [`Processor::gpu_jobs`] and their
    /// steps [`Processor::gpu_steps`]. `None` when the GPU path cannot take it (not a sequential
    /// Huffman-coded 8-bit grey or YCbCr JPEG ending in its EOI, an EXIF-rotated one, geometry the
    /// fused prefix does not cover for the drawn parameters of some output, more tail steps than
    /// `max_steps` for some output), and the caller decodes it on the CPU with the same `rng`
    /// (which draws every output again, erasing boxes included). `pipeline` must be
    /// [`finishable`]; `max_steps` is what it answered (0: no `gpu_ops` field).
    pub fn plan_gpu(
        &mut self,
        data: &[u8],
        pipeline: &Pipeline,
        rng: SampleRng,
        max_steps: usize,
        sink: &mut dyn Sink,
        trace: &mut Trace,
    ) -> Result<Option<super::Crop>, OpError> {
        // A file without its EOI is truncated: the CPU path reports it (a GPU decoder might fill
        // the missing rows with grey instead).
        if pipeline.views.is_empty()
            || ringfeed_decode::sniff(data) != Some(Format::Jpeg)
            || !data.ends_with(&[0xFF, 0xD9])
        {
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
        self.plan_outputs(pipeline, (info.width, info.height), chroma, rng, max_steps, sink, trace)
    }

    /// 1.11: plans sample `data` as a pixel sample (control.md, "Decoded pixels (1.11)"): its
    /// parameters drawn as [`Processor::plan_gpu`] draws them, for any image the decoder probes
    /// (on its EXIF-oriented size). Returns the plan, or `None` where the geometry does not
    /// cover some output (the caller decodes it on the CPU with the same `rng`). With
    /// `targets`, only an image of EXIF orientation 1 qualifies ([`Processor::gpu_targets`]
    /// moves targets through the planned geometry alone).
    #[allow(clippy::too_many_arguments)]
    pub fn plan_pixels(
        &mut self,
        data: &[u8],
        pipeline: &Pipeline,
        rng: SampleRng,
        max_steps: usize,
        targets: bool,
        sink: &mut dyn Sink,
        trace: &mut Trace,
    ) -> Result<Option<PixelPlan>, OpError> {
        if pipeline.views.is_empty() {
            return Ok(None);
        }
        let info = self.decoder.probe(data)?;
        let (w, h) = super::oriented(&info);
        if w == 0 || h == 0 || (targets && info.orientation > 1) {
            return Ok(None);
        }
        // The chroma bits are zero in a pixel record; the value here is not used.
        let Some(crop) = self.plan_outputs(pipeline, (w, h), Chroma::Other, rng, max_steps, sink, trace)? else {
            return Ok(None);
        };
        let rect = self
            .gpu_jobs
            .iter()
            .map(|j| j.pre)
            .reduce(super::union)
            .unwrap_or(Rect::full(w, h));
        Ok(Some(PixelPlan {
            crop,
            rect,
            image: (w, h),
        }))
    }

    /// 1.11: decodes the rectangle of `plan` ([`Processor::plan_pixels`] of `data`: the
    /// EXIF-oriented image, full scale) and writes it into `dst` as packed RGB rows
    /// (`rect.width * rect.height * 3` bytes): a pixel sample's arena bytes. The decoder is asked
    /// for a margin around it, as the CPU path asks, so the pixels are the ones a CPU decode of
    /// the sample sees.
    pub fn decode_pixels(&mut self, data: &[u8], plan: &PixelPlan, dst: &mut [u8]) -> Result<(), OpError> {
        let started = std::time::Instant::now();
        let rect = plan.rect;
        let row = rect.width as usize * 3;
        if dst.len() != row * rect.height as usize {
            return Err(OpError::OutputLength {
                expected: row * rect.height as usize,
                got: dst.len(),
                height: rect.height,
                width: rect.width,
            });
        }
        let want = super::pad_rect(rect, super::REGION_MARGIN, plan.image.0, plan.image.1);
        let d = self.decoder.decode_region_into(data, want, 1, &mut self.pixels)?;
        let stride = d.rect.width as usize * 3;
        let x0 = (rect.left - d.rect.left) as usize * 3;
        let y0 = (rect.top - d.rect.top) as usize;
        for (y, out) in dst.chunks_exact_mut(row).enumerate() {
            let at = (y0 + y) * stride + x0;
            out.copy_from_slice(&self.pixels[at..at + row]);
        }
        self.decode_ns = started.elapsed().as_nanos() as u64;
        Ok(())
    }

    /// Plans every output of `pipeline` on a `src`-sized source (views in order, their images
    /// in order; output `j` from `rng`'s `fork(j)`, `j = 0` from `rng` itself) into
    /// [`Processor::gpu_jobs`] and [`Processor::gpu_steps`], handing the erasing boxes to `sink`;
    /// output 0's crop, or `None` where some output's geometry is not covered.
    #[allow(clippy::too_many_arguments)]
    fn plan_outputs(
        &mut self,
        pipeline: &Pipeline,
        src: (u32, u32),
        chroma: Chroma,
        rng: SampleRng,
        max_steps: usize,
        sink: &mut dyn Sink,
        trace: &mut Trace,
    ) -> Result<Option<super::Crop>, OpError> {
        self.gpu_jobs.clear();
        let mut crop0 = None;
        let mut j = 0u64;
        for (v, view) in pipeline.views.iter().enumerate() {
            for r in 0..view.count {
                let mut g = if j == 0 { rng.clone() } else { rng.fork(j) };
                // Only output 0 carries targets (a pipeline with targets has one output).
                let Some(f) = self.plan_view(view, src, &mut g, trace, j == 0)? else {
                    return Ok(None);
                };
                if self.steps.len() > max_steps {
                    return Ok(None);
                }
                let k = j as usize;
                if self.gpu_steps.len() <= k {
                    self.gpu_steps.resize_with(k + 1, Vec::new);
                }
                self.gpu_steps[k].clear();
                self.gpu_steps[k].extend_from_slice(&self.steps);
                if !view.erasing.is_empty() {
                    self.boxes.clear();
                    for e in &view.erasing {
                        self.boxes.push(erasing_box(e, view.size, &mut g));
                    }
                    sink.erase(v, r, &self.boxes);
                }
                self.gpu_jobs.push(GpuJob::of(&f, src, chroma));
                if j == 0 {
                    crop0 = Some(crop_of(&f));
                }
                j += 1;
            }
        }
        Ok(crop0)
    }

    /// The jobs [`Processor::plan_gpu`] planned for the last sample it took, one per output.
    pub fn gpu_jobs(&self) -> &[GpuJob] {
        &self.gpu_jobs
    }

    /// The fused prefix of `view` on a `size` source and its tail's steps (into `self.steps`),
    /// drawn from `g`; `None` when the prefix does not reach the view's size or the tail has an
    /// op that does not lower.
    /// With `follow` (output 0) the geometry is recorded for [`Processor::gpu_targets`].
    fn plan_view(
        &mut self,
        view: &super::View,
        (width, height): (u32, u32),
        g: &mut SampleRng,
        trace: &mut Trace,
        follow: bool,
    ) -> Result<Option<Fused>, OpError> {
        if follow {
            // Always recorded (a few steps): `gpu_targets` moves a sample's targets through them.
            self.follow.start(true, (width, height));
        } else {
            // Output 0's geometry stays recorded; later outputs add none to it.
            self.follow.on = false;
        }
        let f = plan::plan(&view.ops, width, height, g, trace, &mut self.follow);
        let size = f.out_size();
        let tail = &view.ops[f.consumed..];
        self.steps.clear();
        if size != (view.size.1, view.size.0) || !tail.iter().all(steps::lowers) {
            return Ok(None);
        }
        self.check_size(size.0, size.1, view.ops.last())?;
        for op in tail {
            steps::lower(op, size, g, trace, &mut self.steps);
        }
        self.follow.push_steps(&self.steps, size);
        Ok(Some(f))
    }

    /// The tail steps a GPU sample of `data` (any format: the size is probed) would carry under
    /// `pipeline`'s one view with generator `rng`: what [`Processor::plan_gpu`] lowers, for
    /// `ringfeed ops` and the tests that replay them. `None` where the GPU path would not take
    /// the sample for its geometry.
    pub fn tail_steps(&mut self, data: &[u8], pipeline: &Pipeline, rng: SampleRng) -> Result<Option<&[Step]>, OpError> {
        let [view] = pipeline.views.as_slice() else {
            return Ok(None);
        };
        let info = self.decoder.probe(data)?;
        let mut g = rng;
        let planned = self.plan_view(view, (info.width, info.height), &mut g, &mut Trace::off(), true)?;
        Ok(planned.map(|_| self.steps.as_slice()))
    }

    /// Moves `targets` (in the stored image's pixels) through the geometry of the sample
    /// [`Processor::plan_gpu`] last planned for the GPU, and sanitises them by `options`: the
    /// targets [`Processor::run_targets`] would give with the same generator, computed before
    /// any pixel is decoded (control.md, "Detection and segmentation targets (1.10)"). A mask
    /// must be the image's size ([`OpError::MaskSize`]).
    pub fn gpu_targets(&mut self, targets: &mut Targets, options: &TargetOptions) -> Result<(), OpError> {
        self.follow.options = *options;
        std::mem::swap(&mut self.follow.targets, targets);
        let result = self.follow.finish();
        std::mem::swap(&mut self.follow.targets, targets);
        result
    }

    /// The tail steps [`Processor::plan_gpu`] drew for output `output` of the last sample it
    /// took.
    pub fn gpu_steps(&self, output: usize) -> &[Step] {
        self.gpu_steps.get(output).map_or(&[], Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Layout;

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
    fn only_geometric_single_views_are_finishable_before_1_8() {
        let p = |json: &str| Pipeline::parse(&serde_json::from_str(json).unwrap()).unwrap();
        let ok = p(r#"{"views":[{"ops":[{"op":"random_resized_crop","size":[224]},{"op":"horizontal_flip"}]}]}"#);
        assert_eq!(finishable(&ok, 7), Ok(0));
        assert_eq!(finishable(&ok, 9), Ok(0), "no tail: no gpu_ops field");
        let eval = p(r#"{"views":[{"ops":[{"op":"resize","size":[256]},{"op":"center_crop","size":[224]}]}]}"#);
        assert_eq!(finishable(&eval, 7), Ok(0));
        let jitter = p(
            r#"{"views":[{"ops":[{"op":"random_resized_crop","size":[224]},{"op":"color_jitter","brightness":[0.6,1.4]}]}]}"#,
        );
        let e = finishable(&jitter, 7).unwrap_err().to_string();
        assert!(e.contains("color_jitter") && e.contains("not geometric"), "{e}");
        let two = p(r#"{"views":[{"count":2,"ops":[{"op":"random_resized_crop","size":[96]}]}]}"#);
        assert!(finishable(&two, 9).unwrap_err().to_string().contains("2 images"));
        assert_eq!(finishable(&two, 10), Ok(0), "1.10 finishes every image of a view");
    }

    #[test]
    fn a_tail_of_per_image_ops_is_finishable_in_1_8_with_its_most_steps() {
        let p = |json: &str| Pipeline::parse(&serde_json::from_str(json).unwrap()).unwrap();
        // The prefix's flip counts (a plan that stops early leaves it to the tail), TA one,
        // ColorJitter one per member, RandAugment num_ops.
        let ta = p(
            r#"{"views":[{"ops":[{"op":"random_resized_crop","size":[224]},{"op":"horizontal_flip"},{"op":"trivial_augment_wide"}]}]}"#,
        );
        assert_eq!(finishable(&ta, 9), Ok(2));
        let cj = p(
            r#"{"views":[{"ops":[{"op":"random_resized_crop","size":[64]},{"op":"color_jitter","brightness":[0.6,1.4],"hue":[-0.1,0.1]},{"op":"rand_augment","num_ops":3},{"op":"random_apply","p":0.5,"ops":[{"op":"invert"},{"op":"gaussian_blur","kernel_size":[5],"sigma":[0.1,2.0]}]}]}]}"#,
        );
        assert_eq!(finishable(&cj, 9), Ok(2 + 3 + 2));
        let sized = p(
            r#"{"views":[{"ops":[{"op":"random_resized_crop","size":[64]},{"op":"invert"},{"op":"center_crop","size":[32]}]}]}"#,
        );
        let e = finishable(&sized, 9).unwrap_err().to_string();
        assert!(
            e.contains("op 2") && e.contains("center_crop") && e.contains("changes the image's size"),
            "{e}"
        );
        let second = p(r#"{"views":[{"ops":[{"op":"resize","size":[64]},{"op":"resize","size":[32,32]}]}]}"#);
        assert!(
            finishable(&second, 9)
                .unwrap_err()
                .to_string()
                .contains("second resize")
        );
        let ra = r#"{"op":"rand_augment","num_ops":16}"#;
        let many = p(&format!(
            r#"{{"views":[{{"ops":[{{"op":"random_resized_crop","size":[64]}},{ra},{ra},{ra},{ra},{ra}]}}]}}"#
        ));
        assert!(finishable(&many, 9).unwrap_err().to_string().contains("at most 64"));
    }

    #[test]
    fn steps_lowered_for_the_gpu_are_the_cpu_path_s_draws() {
        // The CPU path runs a view's tail by lowering each op and executing its steps; plan_gpu
        // lowers the whole tail at once. Same generator, same steps: checked through the trace,
        // which both record from the same draws.
        let p = |json: &str| Pipeline::parse(&serde_json::from_str(json).unwrap()).unwrap();
        let pipeline = p(
            r#"{"views":[{"ops":[{"op":"random_resized_crop","size":[24]},{"op":"horizontal_flip"},{"op":"color_jitter","brightness":[0.6,1.4],"contrast":[0.6,1.4],"saturation":[0.6,1.4],"hue":[-0.1,0.1]},{"op":"trivial_augment_wide"},{"op":"auto_augment"},{"op":"gaussian_blur","kernel_size":[3],"sigma":[0.1,2.0]}]}],"erasing":[]}"#,
        );
        let max = finishable(&pipeline, 9).unwrap() as usize;
        let mut img = image::RgbImage::new(40, 30);
        for (x, y, px) in img.enumerate_pixels_mut() {
            *px = image::Rgb([(x * 6) as u8, (y * 8) as u8, ((x + y) * 3) as u8]);
        }
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90)
            .encode_image(&img)
            .unwrap();
        let mut proc = Processor::new(ringfeed_decode::Limits::default()).unwrap();
        let mut sink = super::super::BufferSink::for_pipeline(&pipeline);
        let mut planned = 0;
        for index in 0..40u64 {
            let rng = SampleRng::new(7, 0, index);
            let (mut a, mut b) = (Trace::on(), Trace::on());
            let got = proc
                .plan_gpu(&jpeg, &pipeline, rng.clone(), max, &mut sink, &mut a)
                .unwrap();
            let steps = proc.gpu_steps(0).to_vec();
            proc.run(&jpeg, &pipeline, rng, Layout::Nhwc, &mut sink, &mut b)
                .unwrap();
            assert_eq!(a.take(), b.take(), "sample {index}");
            if got.is_some() {
                planned += 1;
                assert!(steps.len() <= max);
                for s in &steps {
                    let r = s.record((24, 24));
                    assert_eq!(
                        ringfeed_format::ring::gpu_ops::Record::from_ints(&r.to_ints()),
                        Ok(Some(r))
                    );
                }
            }
        }
        assert_eq!(planned, 40, "every sample of a plain JPEG goes to the GPU");
    }

    #[test]
    fn targets_of_a_gpu_sample_are_the_cpu_path_s() {
        let pipeline = Pipeline::parse(&serde_json::json!({"views": [{"ops": [
            {"op": "random_resized_crop", "size": [24, 20]}, {"op": "horizontal_flip"},
            {"op": "trivial_augment_wide"}, {"op": "vertical_flip"}, {"op": "rand_augment", "num_ops": 3}]}]}))
        .unwrap();
        let max = finishable(&pipeline, 9).unwrap() as usize;
        let img = image::RgbImage::from_fn(40, 30, |x, y| image::Rgb([(x * 6) as u8, (y * 8) as u8, 9]));
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90)
            .encode_image(&img)
            .unwrap();
        let source = Targets {
            boxes: vec![
                [1.5, 2.0, 30.0, 20.25],
                [20.0, 10.0, 39.0, 29.5],
                [0.0, 0.0, 40.0, 30.0],
            ],
            labels: vec![4, 5, 6],
            mask: Some(ringfeed_format::targets::LabelMap {
                width: 40,
                height: 30,
                data: (0..1200).map(|v| (v % 251) as u8).collect(),
            }),
            ..Targets::default()
        };
        let options = TargetOptions {
            mask_fill: 200,
            ..TargetOptions::default()
        };
        let mut proc = Processor::new(ringfeed_decode::Limits::default()).unwrap();
        let mut sink = super::super::BufferSink::for_pipeline(&pipeline);
        for index in 0..60u64 {
            let rng = SampleRng::new(3, 1, index);
            let (mut gpu, mut cpu) = (source.clone(), source.clone());
            let planned = proc
                .plan_gpu(&jpeg, &pipeline, rng.clone(), max, &mut sink, &mut Trace::off())
                .unwrap();
            assert!(planned.is_some());
            proc.gpu_targets(&mut gpu, &options).unwrap();
            let mut trace = Trace::off();
            proc.run_targets(
                &jpeg,
                None,
                &pipeline,
                rng,
                Layout::Nhwc,
                &mut sink,
                &mut trace,
                &mut cpu,
                &options,
            )
            .unwrap();
            assert_eq!(gpu, cpu, "sample {index}");
        }
    }

    #[test]
    fn views_are_finishable_in_1_10_and_the_first_op_without_a_kernel_is_named() {
        let p = |json: &str| Pipeline::parse(&serde_json::from_str(json).unwrap()).unwrap();
        let dino = p(
            r#"{"views":[{"name":"global","count":2,"ops":[{"op":"random_resized_crop","size":[32]},{"op":"horizontal_flip"},{"op":"color_jitter","brightness":[0.6,1.4],"hue":[-0.1,0.1]},{"op":"grayscale","p":0.2}]},{"name":"local","count":3,"ops":[{"op":"random_resized_crop","size":[16]},{"op":"solarize","threshold":128}]}]}"#,
        );
        let e = finishable(&dino, 9).unwrap_err().to_string();
        assert!(e.contains("2 views") && e.contains("1.10"), "{e}");
        // The most steps of any view: global's flip + 2 jitter members + grayscale.
        assert_eq!(finishable(&dino, 10), Ok(4));
        let bad = p(
            r#"{"views":[{"name":"a","ops":[{"op":"random_resized_crop","size":[32]}]},{"name":"b","ops":[{"op":"random_resized_crop","size":[16]},{"op":"invert"},{"op":"center_crop","size":[8]}]}]}"#,
        );
        let e = finishable(&bad, 10).unwrap_err().to_string();
        assert!(
            e.contains("op 2") && e.contains("\"b\"") && e.contains("center_crop"),
            "{e}"
        );
    }

    #[test]
    fn every_output_of_a_gpu_sample_draws_what_the_cpu_path_draws() {
        // Several views and images per view: each output's job, steps and erasing boxes come from
        // its own generator, as in `run`. The erasing boxes are drawn after every other op of
        // the output, so equal boxes mean the same draws before them; the steps replayed on the
        // CPU path's prefix give its pixels (the tail is what `run` executes).
        let pipeline = Pipeline::parse(&serde_json::json!({"views": [
            {"name": "global", "count": 2, "ops": [{"op": "random_resized_crop", "size": [24]},
                {"op": "horizontal_flip"},
                {"op": "color_jitter", "brightness": [0.6, 1.4], "contrast": [0.6, 1.4], "saturation": [0.6, 1.4], "hue": [-0.1, 0.1]},
                {"op": "random_erasing", "p": 0.5}]},
            {"name": "local", "count": 3, "ops": [{"op": "random_resized_crop", "size": [12, 10]},
                {"op": "trivial_augment_wide"}, {"op": "random_erasing", "p": 0.7}]}]}))
        .unwrap();
        let max = finishable(&pipeline, 10).unwrap() as usize;
        let img = image::RgbImage::from_fn(40, 30, |x, y| {
            image::Rgb([(x * 6) as u8, (y * 8) as u8, ((x + y) * 3) as u8])
        });
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90)
            .encode_image(&img)
            .unwrap();
        let mut proc = Processor::new(ringfeed_decode::Limits::default()).unwrap();
        let (mut gpu, mut cpu) = (
            super::super::BufferSink::for_pipeline(&pipeline),
            super::super::BufferSink::for_pipeline(&pipeline),
        );
        let mut erased = 0;
        for index in 0..40u64 {
            let rng = SampleRng::new(11, 2, index);
            let crop = proc
                .plan_gpu(&jpeg, &pipeline, rng.clone(), max, &mut gpu, &mut Trace::off())
                .unwrap()
                .expect("a plain JPEG goes to the GPU");
            assert_eq!(proc.gpu_jobs().len(), 5);
            let cpu_crop = proc
                .run(&jpeg, &pipeline, rng.clone(), Layout::Nhwc, &mut cpu, &mut Trace::off())
                .unwrap();
            assert_eq!(crop, cpu_crop, "sample {index}");
            assert_eq!(gpu.erase, cpu.erase, "sample {index}");
            erased += cpu.erase.iter().filter(|b| b.iter().any(|b| b[2] > 0)).count();
            // Output j's steps are those its own generator draws for its view alone.
            for (j, view) in [(0, 0), (1, 0), (2, 1), (3, 1), (4, 1)] {
                let one = Pipeline {
                    views: vec![pipeline.views[view].clone()],
                };
                let g = if j == 0 { rng.clone() } else { rng.fork(j as u64) };
                let mine = proc.gpu_steps(j).to_vec();
                let alone = proc.tail_steps(&jpeg, &one, g).unwrap().unwrap().to_vec();
                assert_eq!(mine, alone, "sample {index} output {j}");
            }
        }
        assert!(erased > 20, "the boxes were drawn ({erased})");
    }

    #[test]
    fn a_pixel_sample_carries_its_decoded_rectangle_and_the_cpu_path_s_draws() {
        // 1.11: any image the server decodes (a JPEG, a PNG) is planned with the CPU path's
        // draws; its arena bytes are exactly the full decode's pixels of the rectangle its
        // outputs read, and each record's coordinates move into that rectangle.
        let pipeline = Pipeline::parse(&serde_json::json!({"views": [
            {"name": "a", "ops": [{"op": "random_resized_crop", "size": [24]}, {"op": "horizontal_flip"},
                {"op": "trivial_augment_wide"}, {"op": "random_erasing", "p": 0.5}]},
            {"name": "b", "ops": [{"op": "random_crop", "size": [20, 16]}]}]}))
        .unwrap();
        let max = finishable(&pipeline, 11).unwrap() as usize;
        let img = image::RgbImage::from_fn(40, 30, |x, y| {
            image::Rgb([(x * 6) as u8, (y * 8) as u8, ((x * y) % 251) as u8])
        });
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90)
            .encode_image(&img)
            .unwrap();
        let mut png = Vec::new();
        img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .unwrap();
        let mut proc = Processor::new(ringfeed_decode::Limits::default()).unwrap();
        let mut decoder = ringfeed_decode::Decoder::new(ringfeed_decode::Limits::default()).unwrap();
        let (mut gpu, mut cpu) = (
            super::super::BufferSink::for_pipeline(&pipeline),
            super::super::BufferSink::for_pipeline(&pipeline),
        );
        for data in [&jpeg, &png] {
            let mut whole = Vec::new();
            let d = decoder.decode_rgb8(data, &mut whole).unwrap();
            assert_eq!((d.width, d.height), (40, 30));
            let mut smaller = 0;
            for index in 0..30u64 {
                let rng = SampleRng::new(5, 1, index);
                let plan = proc
                    .plan_pixels(data, &pipeline, rng.clone(), max, false, &mut gpu, &mut Trace::off())
                    .unwrap()
                    .expect("every output's geometry is covered");
                let (crop, rect) = (plan.crop, plan.rect);
                assert_eq!(plan.image, (40, 30));
                let cpu_crop = proc
                    .run(data, &pipeline, rng, Layout::Nhwc, &mut cpu, &mut Trace::off())
                    .unwrap();
                assert_eq!(crop, cpu_crop, "sample {index}");
                assert_eq!(gpu.erase, cpu.erase, "sample {index}");
                assert!(Rect::full(40, 30).contains(&rect), "{rect:?}");
                smaller += usize::from(rect != Rect::full(40, 30));
                let mut px = vec![0u8; rect.width as usize * rect.height as usize * 3];
                proc.decode_pixels(data, &plan, &mut px).unwrap();
                for y in 0..rect.height as usize {
                    let at = ((rect.top as usize + y) * 40 + rect.left as usize) * 3;
                    let row = rect.width as usize * 3;
                    assert_eq!(px[y * row..][..row], whole[at..at + row], "sample {index} row {y}");
                }
                let jobs = proc.gpu_jobs().to_vec();
                assert_eq!(jobs.len(), 2);
                for (j, job) in jobs.iter().enumerate() {
                    let r = job.pixel_record(4096, rect);
                    assert!(rect.contains(&job.pre), "output {j}: {:?} outside {rect:?}", job.pre);
                    assert_eq!(r[..4], [4096, (px.len()) as i32, rect.width as i32, rect.height as i32]);
                    assert_eq!(
                        r[4..6],
                        [(job.pre.left - rect.left) as i32, (job.pre.top - rect.top) as i32]
                    );
                    assert_eq!(r[6..10], job.record(0, 0)[6..10]);
                    assert_eq!(r[16] & flags::PIXELS, flags::PIXELS);
                    assert_eq!(r[16] & (7 << flags::CHROMA_SHIFT), 0);
                    let (dx, dy) = (rect.left as i32, rect.top as i32);
                    let plain = job.record(0, 0);
                    if job.resize == (0, 0) {
                        // No resize: the base is the source, so the window moves too.
                        assert_eq!(
                            r[10..14],
                            [plain[10] - dx, plain[11] - dy, plain[12] - dx, plain[13] - dy]
                        );
                    } else {
                        assert_eq!(r[10..14], plain[10..14]);
                    }
                }
            }
            assert!(smaller > 0, "some rectangles are smaller than the image");
        }
    }
}
