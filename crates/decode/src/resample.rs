//! Antialiased bilinear resampling of packed RGB8 images: our own separable resampler, which
//! allocates nothing once warm.
//!
//! [`Resampler::resample`] maps a floating-point box of a source image onto a rectangle of a
//! destination image with a triangle filter whose support grows with the downscale factor.
//! That is Pillow's `Image.resize(size, BILINEAR, box)`, which torchvision's uint8
//! `antialias=True` path follows too, and, bit for bit, fast_image_resize 6's
//! `Convolution(Bilinear)` with a crop box, which this module replaced (fir allocated one `Vec`
//! per output row and column on every call: 451.7 heap allocations per sample). fir stays a
//! dev-dependency, and the tests compare the two over random geometries and pixels
//! (`benches/results/2026-11-30-dev-vm/resampler.md` has the speeds).
//!
//! # Arithmetic (Pillow's `precompute_coeffs`, fir's `precompute_coefficients`)
//! - For each output pixel `i` of an axis, with `scale = (in1 - in0) / out`: the centre
//!   `in0 + (i + 0.5) * scale`, a support of `max(scale, 1)` source pixels on either side, the
//!   window clamped to `0..in_size` (the `bounds` the filter may read), triangle weights
//!   `1 - |x + 0.5 - centre| / max(scale, 1)`, zero weights trimmed at both ends of the window,
//!   normalised to sum 1.
//! - Fixed point: the weights of an axis become `i16` with the largest precision `p < 22` such
//!   that `round(max_weight * 2^(p + 1)) < 2^15` (at least 14 bits, as the largest weight is at
//!   most 1), each rounded half away from zero. A pass accumulates `2^(p - 1) + Σ pixel · weight`
//!   in `i32` and keeps `(acc >> p)` clipped to `0..=255`.
//! - Two passes with a `u8` image between them: **vertical first, then horizontal**, which is
//!   fir's order for `u8` images (Pillow goes the other way; the two orders differ by at most
//!   one level, now and then). A pass is skipped when its axis keeps its size and the box
//!   starts on a whole pixel, as in fir: the pass would be the identity.
//!
//! # Vectorisation
//! The kernels are plain Rust, fixed-width loops over `i32` accumulators that LLVM vectorises,
//! compiled twice: once with AVX2 enabled, chosen at run time when the CPU has it (detected
//! once, in [`Resampler::new`]), and once for the baseline target. They are integer-only, so
//! both give the same bytes (tested).
//! - The number of taps is a compile-time constant of each kernel (1 to 16, one copy each;
//!   wider windows take a generic loop): LLVM then unrolls the taps and vectorises across the
//!   lanes. Within an axis every window is padded with zero weights to the widest one.
//! - Vertical pass: an output row is a weighted sum of whole source rows, 32 bytes at a time.
//! - Horizontal pass: 8 rows at a time. The block of rows is first transposed so that the 8
//!   pixels of one column lie side by side (`[column][row][channel]`, 24 bytes); an output
//!   pixel is then a weighted sum of a few contiguous columns, which vectorises like the
//!   vertical pass, and is stored whole into an output block transposed the same way, then
//!   written to the rows. The blocks stay in L1 cache.
//! - Not reached this way: fir's vertical kernel does two taps per `pmaddwd` by interleaving
//!   two source rows, a pattern LLVM does not form, so our vertical pass costs about 1.5 times
//!   fir's per tap; the horizontal pass more than makes up for it up to about a 2x downscale.

//! # Invariants
//! - **The same arguments give the same bytes on every CPU and every call**, whatever the
//!   resampler did before.
//! - **No allocation once warm**: coefficient tables, the vertical pass's rows and the
//!   transposed block live in the [`Resampler`] and only grow.
//! - **No panics on any arguments**: geometry that does not fit the buffers is a
//!   [`ResampleError`].

/// A rectangle of pixels: columns `left..left + width`, rows `top..top + height`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rect {
    /// First column.
    pub left: u32,
    /// First row.
    pub top: u32,
    /// Number of columns.
    pub width: u32,
    /// Number of rows.
    pub height: u32,
}

impl Rect {
    /// The whole `width`×`height` image.
    pub fn full(width: u32, height: u32) -> Self {
        Rect {
            left: 0,
            top: 0,
            width,
            height,
        }
    }

    /// Whether `other` lies inside `self`.
    pub fn contains(&self, other: &Rect) -> bool {
        other.left >= self.left
            && other.top >= self.top
            && u64::from(other.left) + u64::from(other.width) <= u64::from(self.left) + u64::from(self.width)
            && u64::from(other.top) + u64::from(other.height) <= u64::from(self.top) + u64::from(self.height)
    }
}

/// A packed RGB8 image to read from: `height` rows of `width * 3` bytes.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// The pixels; at least `width * height * 3` bytes (the rest is ignored).
    pub pixels: &'a [u8],
    /// Columns.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// What the filter may read: pixels outside it count as absent, as beyond an image edge
    /// (torchvision's `resized_crop` crops before it resizes). Inside the image.
    pub bounds: Rect,
}

/// The part of [`Source::bounds`] that is sampled, in source pixels relative to the top-left
/// corner of `bounds`: non-empty, finite and inside `bounds`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleBox {
    /// First column (may be fractional).
    pub left: f64,
    /// First row (may be fractional).
    pub top: f64,
    /// Columns.
    pub width: f64,
    /// Rows.
    pub height: f64,
}

/// A packed RGB8 image to write into: `height` rows of `width * 3` bytes, of which only
/// `rect` is written.
#[derive(Debug)]
pub struct Target<'a> {
    /// The pixels; at least `width * height * 3` bytes (the rest is untouched).
    pub pixels: &'a mut [u8],
    /// Columns.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// The rectangle the sampled box is resampled onto; inside the image. Empty: nothing to do.
    pub rect: Rect,
}

/// Arguments [`Resampler::resample`] refuses: always a caller's geometry bug, never an image's.
#[derive(Debug, thiserror::Error)]
pub enum ResampleError {
    /// A pixel buffer is shorter than its size says.
    #[error("{what} holds {got} bytes; a {width}x{height}x3 image needs {expected}")]
    Length {
        /// `"source"` or `"target"`.
        what: &'static str,
        /// Bytes needed.
        expected: usize,
        /// Bytes given.
        got: usize,
        /// Columns.
        width: u32,
        /// Rows.
        height: u32,
    },
    /// `bounds` or `rect` is not inside its image.
    #[error("{what} {rect:?} is not inside the {width}x{height} image")]
    Outside {
        /// `"bounds"` or `"rect"`.
        what: &'static str,
        /// The offending rectangle.
        rect: Rect,
        /// Image columns.
        width: u32,
        /// Image rows.
        height: u32,
    },
    /// The sampled box is empty, not finite, or not inside `bounds`.
    #[error("sample box {sample:?} is not a non-empty box inside the {width}x{height} bounds")]
    Sample {
        /// The box.
        sample: SampleBox,
        /// Width of `bounds`.
        width: u32,
        /// Height of `bounds`.
        height: u32,
    },
}

/// Rows per block of the horizontal pass: 8 rows of 3 channels are 24 `i32` accumulators,
/// three AVX2 registers.
const ROWS: usize = 8;

/// Bytes of one column of a transposed block.
const LANES: usize = ROWS * 3;

/// Bytes per step of the vertical pass.
const CHUNK: usize = 32;

/// Largest fixed-point precision (fir's and Pillow's `PRECISION_BITS`, 32 - 8 - 2: 8 bits of
/// result and 2 of headroom for filters with negative lobes).
const PRECISION_BITS: u32 = 22;

/// Coefficients are `i16`: at most 15 bits of magnitude.
const MAX_COEFFS_PRECISION: u32 = 15;

/// Which build of the kernels runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    /// Compiled for the baseline target (SSE2 on x86-64).
    Portable,
    /// Compiled with AVX2 enabled; chosen only where the CPU has it.
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Isa {
    /// The best build this CPU runs.
    fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            return Isa::Avx2;
        }
        Isa::Portable
    }
}

/// The fixed-point coefficients of one axis, laid out for the kernels: every output pixel has
/// the same number of taps, `taps` (the widest window), and output pixel `i` reads source pixels
/// `start[i]..start[i] + taps` with weights `coeffs[i * taps..][..taps]`. A narrower window is
/// padded with zero weights, on its right, or on its left where the padding would pass the
/// end of the source; so every tap is inside the source, and a kernel needs no bounds of its
/// own.
#[derive(Debug, Default)]
struct Axis {
    start: Vec<u32>,
    coeffs: Vec<i16>,
    /// Taps per output pixel (at least 1, at most the source's size).
    taps: usize,
    /// Fractional bits of `coeffs`.
    precision: u32,
    /// fir's windows: first tap and number of taps, per output pixel.
    bounds: Vec<(u32, u32)>,
    /// fir's floating-point weights, `2 * ceil(support) + 1` per output pixel.
    weights: Vec<f64>,
}

impl Axis {
    /// Computes the coefficients for resampling `in0..in1` (source pixels, inside
    /// `0..in_size`) onto `out` pixels (at least 1). fir's `precompute_coefficients` and
    /// `Normalizer16::new`, operation for operation, so that the rounding is the same.
    #[inline(always)]
    fn compute(&mut self, filter: Filter, in_size: u32, in0: f64, in1: f64, out: u32) {
        let out_n = out as usize;
        let scale = (in1 - in0) / f64::from(out);
        // Without antialiasing the kernel keeps its width when downscaling (torch's
        // `interpolate(antialias=False)`): each output pixel reads its few nearest source pixels.
        let filter_scale = if filter.antialias { scale.max(1.0) } else { 1.0 };
        let radius = filter.kernel.support() * filter_scale;
        let window = radius.ceil() as usize * 2 + 1;
        let recip = 1.0 / filter_scale;
        self.weights.clear();
        self.weights.resize(window * out_n, 0.0);
        self.bounds.clear();
        for (i, w) in self.weights.chunks_exact_mut(window).enumerate() {
            let in_center = in0 + (i as f64 + 0.5) * scale;
            let x_min = (in_center - radius).floor().max(0.0) as u32;
            let x_max = (in_center + radius).ceil().min(f64::from(in_size)) as u32;
            let center = in_center - 0.5;
            let (mut first, mut end) = (x_min, x_max);
            let (mut n, mut sum) = (0usize, 0.0f64);
            for x in x_min..x_max {
                let v = filter.weight((f64::from(x) - center) * recip);
                if x == first && v == 0.0 {
                    // Leading zero weights are not taps.
                    first += 1;
                } else {
                    if n < window {
                        w[n] = v;
                    }
                    n += 1;
                    sum += v;
                }
            }
            // Trailing zero weights are not taps either.
            let mut k = n;
            while end > first && k > 0 && k <= window && w[k - 1] == 0.0 {
                end -= 1;
                k -= 1;
            }
            if sum != 0.0 {
                for v in &mut w[..n.min(window)] {
                    *v /= sum;
                }
            }
            // Never more taps than the window (which always holds them: a window of radius
            // `r` around a point spans fewer than `2r + 2` whole pixels).
            self.bounds.push((first, end.saturating_sub(first).min(window as u32)));
        }
        let max = self.weights.iter().copied().fold(0.0f64, f64::max);
        let mut precision = 0;
        for p in 0..PRECISION_BITS {
            precision = p;
            let next = (max * f64::from(1u32 << (p + 1))).round() as i32;
            if next >= 1 << MAX_COEFFS_PRECISION {
                break;
            }
        }
        let unit = f64::from(1u32 << precision);
        // The kernels' layout: `taps` weights per output pixel. A window holds at most
        // `in_size` pixels, so `start` below never underflows and every tap is in the source.
        let taps = self
            .bounds
            .iter()
            .map(|&(_, n)| n)
            .max()
            .unwrap_or(0)
            .clamp(1, in_size.max(1));
        self.start.clear();
        self.coeffs.clear();
        self.coeffs.resize(taps as usize * out_n, 0);
        for ((&(first, n), w), row) in self
            .bounds
            .iter()
            .zip(self.weights.chunks_exact(window))
            .zip(self.coeffs.chunks_exact_mut(taps as usize))
        {
            let start = first.min(in_size.saturating_sub(taps));
            let pad = (first - start) as usize;
            for (c, &v) in row[pad..].iter_mut().zip(&w[..n as usize]) {
                *c = (v * unit).round() as i16;
            }
            self.start.push(start);
        }
        self.taps = taps as usize;
        self.precision = precision;
    }

    /// The source pixels the taps read: `(first, end)`.
    fn span(&self) -> (usize, usize) {
        let first = self.start.iter().min().map_or(0, |&s| s as usize);
        let end = self.start.iter().max().map_or(0, |&s| s as usize + self.taps);
        (first, end)
    }

    /// The taps of output pixel `i`: (first source pixel, `taps` weights).
    #[inline(always)]
    fn taps(&self, i: usize) -> (usize, &[i16]) {
        (self.start[i] as usize, &self.coeffs[i * self.taps..][..self.taps])
    }

    /// The taps of output pixel `i` without the padding: (first source pixel, weights).
    #[inline(always)]
    fn window(&self, i: usize) -> (usize, &[i16]) {
        let (first, n) = self.bounds[i];
        let pad = (first - self.start[i]) as usize;
        (first as usize, &self.coeffs[i * self.taps + pad..][..n as usize])
    }
}

/// The bilinear filter: a triangle of support 1.
fn triangle(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 { 1.0 - x } else { 0.0 }
}

/// Keys' cubic convolution kernel with parameter `a`, support 2: Pillow's `bicubic_filter`
/// (`a = -0.5`, torchvision's antialiased bicubic) or PyTorch's `interpolate(mode="bicubic")`
/// (`a = -0.75`, its bicubic without antialiasing).
fn cubic(x: f64, a: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * a
    } else {
        0.0
    }
}

/// The interpolation kernel of a [`Filter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// A triangle of support 1 (bilinear).
    Bilinear,
    /// Keys' cubic of support 2 (bicubic).
    Bicubic,
}

impl Kernel {
    fn support(self) -> f64 {
        match self {
            Kernel::Bilinear => 1.0,
            Kernel::Bicubic => 2.0,
        }
    }
}

/// What [`Resampler::resample`] convolves with: a kernel, and whether it widens with the
/// downscale factor (antialiasing, torchvision's default `antialias=True`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Filter {
    /// The interpolation kernel.
    pub kernel: Kernel,
    /// Widen the kernel by the downscale factor, so every source pixel contributes.
    pub antialias: bool,
}

impl Filter {
    /// Antialiased bilinear: Pillow's `BILINEAR`, torchvision's default.
    pub const BILINEAR: Filter = Filter {
        kernel: Kernel::Bilinear,
        antialias: true,
    };

    #[inline(always)]
    fn weight(self, x: f64) -> f64 {
        match (self.kernel, self.antialias) {
            (Kernel::Bilinear, _) => triangle(x),
            (Kernel::Bicubic, true) => cubic(x, -0.5),
            (Kernel::Bicubic, false) => cubic(x, -0.75),
        }
    }
}

impl Default for Filter {
    fn default() -> Self {
        Filter::BILINEAR
    }
}

/// Resamples packed RGB8 images with Pillow's antialiased bilinear filter (see the module
/// docs). One per thread: it keeps its coefficient tables and intermediate rows from call to
/// call, and allocates only when a call needs more room than any call before.
pub struct Resampler {
    isa: Isa,
    /// The filter of the following calls ([`Resampler::set_filter`]).
    filter: Filter,
    horizontal: Axis,
    vertical: Axis,
    /// Up to [`ROWS`] rows of the vertical pass's output, the input of the horizontal pass.
    rows: Vec<u8>,
    /// The same rows transposed: `[column][row][channel]`, [`LANES`] bytes per column.
    block: Vec<u8>,
    /// The horizontal pass's output for those rows, transposed the same way.
    columns: Vec<u8>,
}

impl std::fmt::Debug for Resampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resampler")
            .field("isa", &self.isa)
            .field("rows_capacity", &self.rows.capacity())
            .field("block_capacity", &self.block.capacity())
            .field("columns_capacity", &self.columns.capacity())
            .finish_non_exhaustive()
    }
}

impl Default for Resampler {
    fn default() -> Self {
        Self::new()
    }
}

/// One call, validated.
struct Call<'s, 'd> {
    src: &'s [u8],
    /// Bytes per source row.
    src_stride: usize,
    bounds: Rect,
    sample: SampleBox,
    dst: &'d mut [u8],
    /// Bytes per target row.
    dst_stride: usize,
    rect: Rect,
}

/// What the passes need of one call.
struct Job<'s, 'd> {
    src: &'s [u8],
    /// Bytes per source row.
    src_stride: usize,
    /// First source column and row the filter may read (`bounds`' corner).
    origin: (usize, usize),
    dst: &'d mut [u8],
    /// Bytes per target row.
    dst_stride: usize,
    rect: Rect,
    /// The box's first column and row when that axis has no pass (whole pixels then).
    offset: (usize, usize),
}

/// The resampler's buffers, lent to one call.
struct Scratch<'a> {
    rows: &'a mut [u8],
    block: &'a mut [u8],
    columns: &'a mut [u8],
}

impl Resampler {
    /// A resampler using the fastest kernels this CPU runs (decided once, here).
    pub fn new() -> Self {
        Self::with_isa(Isa::detect())
    }

    fn with_isa(isa: Isa) -> Self {
        Resampler {
            isa,
            filter: Filter::BILINEAR,
            horizontal: Axis::default(),
            vertical: Axis::default(),
            rows: Vec::new(),
            block: Vec::new(),
            columns: Vec::new(),
        }
    }

    /// Sets the filter of the following calls (antialiased bilinear until set).
    pub fn set_filter(&mut self, filter: Filter) {
        self.filter = filter;
    }

    /// The filter in force.
    pub fn filter(&self) -> Filter {
        self.filter
    }

    /// Resamples `sample` of `src.bounds` onto `dst.rect`, leaving the rest of `dst` as it is.
    pub fn resample(&mut self, src: Source<'_>, sample: SampleBox, dst: Target<'_>) -> Result<(), ResampleError> {
        let Source {
            pixels,
            width,
            height,
            bounds,
        } = src;
        check_len("source", pixels.len(), width, height)?;
        check_len("target", dst.pixels.len(), dst.width, dst.height)?;
        if !Rect::full(width, height).contains(&bounds) {
            return Err(ResampleError::Outside {
                what: "bounds",
                rect: bounds,
                width,
                height,
            });
        }
        if !Rect::full(dst.width, dst.height).contains(&dst.rect) {
            return Err(ResampleError::Outside {
                what: "rect",
                rect: dst.rect,
                width: dst.width,
                height: dst.height,
            });
        }
        let (bw, bh) = (f64::from(bounds.width), f64::from(bounds.height));
        let inside = |start: f64, len: f64, limit: f64| {
            start.is_finite() && len.is_finite() && start >= 0.0 && len > 0.0 && start < limit && start + len <= limit
        };
        if !(inside(sample.left, sample.width, bw) && inside(sample.top, sample.height, bh)) {
            return Err(ResampleError::Sample {
                sample,
                width: bounds.width,
                height: bounds.height,
            });
        }
        let rect = dst.rect;
        if rect.width == 0 || rect.height == 0 {
            return Ok(());
        }
        let call = Call {
            src: pixels,
            src_stride: width as usize * 3,
            bounds,
            sample,
            dst: dst.pixels,
            dst_stride: dst.width as usize * 3,
            rect,
        };
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                // SAFETY: `Isa::Avx2` is chosen only by `Isa::detect` after
                // `is_x86_feature_detected!("avx2")`, or by tests that checked it the same way;
                // so this CPU runs AVX2 instructions.
                unsafe { self.run_avx2(call) }
            }
            Isa::Portable => self.run_portable(call),
        }
        Ok(())
    }

    /// [`Resampler::run`] compiled with AVX2.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn run_avx2(&mut self, call: Call<'_, '_>) {
        self.run(call);
    }

    /// [`Resampler::run`] compiled for the baseline target.
    fn run_portable(&mut self, call: Call<'_, '_>) {
        self.run(call);
    }

    /// The coefficients, then the passes. `#[inline(always)]` down to the loops, so that each
    /// `run_*` above compiles its own copy with its own target features (the coefficients'
    /// floating-point arithmetic is exact to the last bit either way: IEEE operations, and
    /// rounding functions that are exact).
    #[inline(always)]
    fn run(&mut self, call: Call<'_, '_>) {
        let Call {
            src,
            src_stride,
            bounds,
            sample,
            dst,
            dst_stride,
            rect,
        } = call;
        // fir's rule: an axis that keeps its size from a whole-pixel start needs no pass.
        let need_h = f64::from(rect.width) != sample.width || sample.left != sample.left.round();
        let need_v = f64::from(rect.height) != sample.height || sample.top != sample.top.round();
        if need_h {
            let (l, w) = (sample.left, sample.width);
            self.horizontal.compute(self.filter, bounds.width, l, l + w, rect.width);
        }
        if need_v {
            let (t, h) = (sample.top, sample.height);
            self.vertical.compute(self.filter, bounds.height, t, t + h, rect.height);
        }
        let job = Job {
            src,
            src_stride,
            origin: (bounds.left as usize, bounds.top as usize),
            dst,
            dst_stride,
            rect,
            // Whole pixels wherever they are used (the axis has no pass).
            offset: (sample.left as usize, sample.top as usize),
        };
        let h = need_h.then_some(&self.horizontal);
        let v = need_v.then_some(&self.vertical);
        // Room for the intermediate rows and the blocks, grown only: every byte a pass reads
        // was written earlier in the same call.
        let tw = h.map_or(0, |a| {
            let (first, end) = a.span();
            end - first
        });
        grow(&mut self.rows, ROWS * tw * 3);
        grow(&mut self.block, tw * LANES);
        grow(
            &mut self.columns,
            if h.is_some() { rect.width as usize * LANES } else { 0 },
        );
        let scratch = Scratch {
            rows: &mut self.rows,
            block: &mut self.block,
            columns: &mut self.columns,
        };
        passes(job, h, v, scratch);
    }
}

fn check_len(what: &'static str, got: usize, width: u32, height: u32) -> Result<(), ResampleError> {
    let expected = width as usize * height as usize * 3;
    if got < expected {
        return Err(ResampleError::Length {
            what,
            expected,
            got,
            width,
            height,
        });
    }
    Ok(())
}

/// Makes `v` at least `n` bytes long, never shorter (so no `memset` of bytes that are about to
/// be overwritten, and no reallocation once it is large enough).
fn grow(v: &mut Vec<u8>, n: usize) {
    if v.len() < n {
        v.resize(n, 0);
    }
}

/// Calls `f::<A, B>(args)` for a window of `taps = A + B` taps: `(taps, 0)` up to 8 taps,
/// `(8, taps - 8)` up to 16, and `(0, 0)` (any number) beyond. A kernel with a fixed number
/// of taps is unrolled and vectorised across its lanes.
macro_rules! with_taps {
    ($taps:expr, $f:ident($($arg:expr),* $(,)?)) => {
        match $taps {
            1 => $f::<1, 0>($($arg),*),
            2 => $f::<2, 0>($($arg),*),
            3 => $f::<3, 0>($($arg),*),
            4 => $f::<4, 0>($($arg),*),
            5 => $f::<5, 0>($($arg),*),
            6 => $f::<6, 0>($($arg),*),
            7 => $f::<7, 0>($($arg),*),
            8 => $f::<8, 0>($($arg),*),
            9 => $f::<8, 1>($($arg),*),
            10 => $f::<8, 2>($($arg),*),
            11 => $f::<8, 3>($($arg),*),
            12 => $f::<8, 4>($($arg),*),
            13 => $f::<8, 5>($($arg),*),
            14 => $f::<8, 6>($($arg),*),
            15 => $f::<8, 7>($($arg),*),
            16 => $f::<8, 8>($($arg),*),
            _ => $f::<0, 0>($($arg),*),
        }
    };
}

/// Both passes, either, or a copy.
#[inline(always)]
fn passes(job: Job<'_, '_>, h: Option<&Axis>, v: Option<&Axis>, scratch: Scratch<'_>) {
    let Job {
        src,
        src_stride,
        origin: (ox, oy),
        dst,
        dst_stride,
        rect,
        offset: (bx, by),
    } = job;
    let Scratch { rows, block, columns } = scratch;
    let (out_w, out_h) = (rect.width as usize, rect.height as usize);
    let dst_at = |y: usize| (rect.top as usize + y) * dst_stride + rect.left as usize * 3;
    match (h, v) {
        (None, None) => {
            for y in 0..out_h {
                let s = (oy + by + y) * src_stride + (ox + bx) * 3;
                let d = dst_at(y);
                dst[d..d + out_w * 3].copy_from_slice(&src[s..s + out_w * 3]);
            }
        }
        (None, Some(v)) => {
            for y in 0..out_h {
                let (first, ks) = v.window(y);
                let d = dst_at(y);
                with_taps!(
                    ks.len(),
                    vertical_row(
                        src,
                        src_stride,
                        (oy + first) * src_stride + (ox + bx) * 3,
                        ks,
                        v.precision,
                        &mut dst[d..d + out_w * 3],
                    )
                );
            }
        }
        (Some(h), v) => {
            let (first, end) = h.span();
            let tw = end - first;
            let row_len = tw * 3;
            for y0 in (0..out_h).step_by(ROWS) {
                let n = ROWS.min(out_h - y0);
                let mut starts = [0usize; ROWS];
                match v {
                    Some(v) => {
                        // The vertical pass for these rows, over the columns the horizontal
                        // pass reads.
                        for (r, row) in rows.chunks_exact_mut(row_len).take(n).enumerate() {
                            // Row by row, so each row's own window, without padding.
                            let (top, ks) = v.window(y0 + r);
                            let at = (oy + top) * src_stride + (ox + first) * 3;
                            with_taps!(ks.len(), vertical_row(src, src_stride, at, ks, v.precision, row));
                            starts[r] = r * row_len;
                        }
                        transpose(rows, starts, n, tw, block);
                    }
                    None => {
                        for (r, s) in starts.iter_mut().enumerate().take(n) {
                            *s = (oy + by + y0 + r) * src_stride + (ox + first) * 3;
                        }
                        transpose(src, starts, n, tw, block);
                    }
                }
                let out = &mut columns[..out_w * LANES];
                with_taps!(h.taps, horizontal_block(block, h, first, out));
                untranspose(out, n, out_w, dst, dst_at(y0), dst_stride);
            }
        }
    }
}

/// One output row of the vertical pass: `out[i] = clip(Σ_j src[at + j * stride + i] * ks[j])`,
/// for `A + B` taps (see `with_taps!`).
#[inline(always)]
fn vertical_row<const A: usize, const B: usize>(
    src: &[u8],
    stride: usize,
    at: usize,
    ks: &[i16],
    precision: u32,
    out: &mut [u8],
) {
    let len = out.len();
    let init = 1i32 << (precision - 1);
    if len < CHUNK {
        // A row shorter than one step (tiny images).
        for (i, o) in out.iter_mut().enumerate() {
            let mut acc = init;
            for (j, &k) in ks.iter().enumerate() {
                acc += i32::from(src[at + j * stride + i]) * i32::from(k);
            }
            *o = clip(acc, precision);
        }
        return;
    }
    let mut i = 0;
    loop {
        // A last step shorter than CHUNK is taken as the CHUNK bytes that end the row
        // (recomputing a few bytes, with the same result).
        let c = i.min(len - CHUNK);
        let mut acc = [init; CHUNK];
        fixed_or_any::<CHUNK, A, B>(&mut acc, src, at + c, stride, ks);
        let o: &mut [u8; CHUNK] = (&mut out[c..c + CHUNK]).try_into().expect("CHUNK bytes");
        clip_all(&acc, precision, o);
        if c + CHUNK == len {
            return;
        }
        i = c + CHUNK;
    }
}

/// `acc[l] += Σ_j data[at + j * step + l] * ks[j]`: for `A + B` taps, unrolled, or for any
/// number (`A = 0`) with [`convolve`].
#[inline(always)]
fn fixed_or_any<const L: usize, const A: usize, const B: usize>(
    acc: &mut [i32; L],
    data: &[u8],
    at: usize,
    step: usize,
    ks: &[i16],
) {
    if A == 0 {
        convolve(acc, data, at, step, ks);
    } else {
        madd::<L, A>(acc, data, at, step, ks);
        madd::<L, B>(acc, data, at + A * step, step, &ks[A..]);
    }
}

/// `acc[l] += Σ_j data[at + j * step + l] * ks[j]` over all of `ks`, for windows wider than
/// sixteen taps: eight taps at a time, then the rest.
#[inline(always)]
fn convolve<const L: usize>(acc: &mut [i32; L], data: &[u8], mut at: usize, step: usize, ks: &[i16]) {
    let mut groups = ks.chunks_exact(8);
    for g in &mut groups {
        madd::<L, 8>(acc, data, at, step, g);
        at += 8 * step;
    }
    let rest = groups.remainder();
    match rest.len() {
        1 => madd::<L, 1>(acc, data, at, step, rest),
        2 => madd::<L, 2>(acc, data, at, step, rest),
        3 => madd::<L, 3>(acc, data, at, step, rest),
        4 => madd::<L, 4>(acc, data, at, step, rest),
        5 => madd::<L, 5>(acc, data, at, step, rest),
        6 => madd::<L, 6>(acc, data, at, step, rest),
        7 => madd::<L, 7>(acc, data, at, step, rest),
        _ => {}
    }
}

/// [`convolve`] for exactly `M` taps (`ks.len() >= M`, `M <= 8`), written out tap by tap: a
/// loop over the taps would not be unrolled (its body is large), and LLVM would then
/// vectorise across the taps instead of across the lanes.
#[inline(always)]
fn madd<const L: usize, const M: usize>(acc: &mut [i32; L], data: &[u8], at: usize, step: usize, ks: &[i16]) {
    let ks = &ks[..M];
    if M > 0 {
        tap(acc, data, at, ks[0]);
    }
    if M > 1 {
        tap(acc, data, at + step, ks[1]);
    }
    if M > 2 {
        tap(acc, data, at + 2 * step, ks[2]);
    }
    if M > 3 {
        tap(acc, data, at + 3 * step, ks[3]);
    }
    if M > 4 {
        tap(acc, data, at + 4 * step, ks[4]);
    }
    if M > 5 {
        tap(acc, data, at + 5 * step, ks[5]);
    }
    if M > 6 {
        tap(acc, data, at + 6 * step, ks[6]);
    }
    if M > 7 {
        tap(acc, data, at + 7 * step, ks[7]);
    }
}

/// `acc[l] += data[at + l] * k`.
#[inline(always)]
fn tap<const L: usize>(acc: &mut [i32; L], data: &[u8], at: usize, k: i16) {
    let s: &[u8; L] = data[at..at + L].try_into().expect("L bytes");
    let k = i32::from(k);
    for (a, &p) in acc.iter_mut().zip(s) {
        *a += i32::from(p) * k;
    }
}

/// [`clip`] of every lane.
#[inline(always)]
fn clip_all<const L: usize>(acc: &[i32; L], precision: u32, out: &mut [u8; L]) {
    for (o, &a) in out.iter_mut().zip(acc) {
        *o = clip(a, precision);
    }
}

/// Writes `n` rows of `tw` pixels, row `r` starting at `src[starts[r]..]`, into `block` as
/// `[column][row][channel]`. Rows `n..ROWS` of each column repeat row 0 (their lanes are
/// computed and dropped).
#[inline(always)]
fn transpose(src: &[u8], mut starts: [usize; ROWS], n: usize, tw: usize, block: &mut [u8]) {
    for r in n..ROWS {
        starts[r] = starts[0];
    }
    let rows: [&[u8]; ROWS] = std::array::from_fn(|r| &src[starts[r]..starts[r] + tw * 3]);
    // Every column but the last moves 4 bytes per pixel, one more than it has: the extra byte,
    // read from inside the row and written into the next slot, is overwritten by the next
    // move. (Half the instructions of a 3-byte move.)
    let last = tw - 1;
    for x in 0..last {
        let column = &mut block[x * LANES..x * LANES + LANES + 1];
        for (r, row) in rows.iter().enumerate() {
            move4(&row[x * 3..x * 3 + 4], &mut column[r * 3..r * 3 + 4]);
        }
    }
    let column = &mut block[last * LANES..last * LANES + LANES];
    for (r, row) in rows.iter().enumerate() {
        column[r * 3..r * 3 + 3].copy_from_slice(&row[last * 3..last * 3 + 3]);
    }
}

/// `to.copy_from_slice(from)` for 4 bytes, as one 4-byte load and one 4-byte store.
#[inline(always)]
fn move4(from: &[u8], to: &mut [u8]) {
    let v: [u8; 4] = from.try_into().expect("4 bytes");
    let to: &mut [u8; 4] = to.try_into().expect("4 bytes");
    *to = v;
}

/// The horizontal pass over a transposed block whose column 0 is source column `first`, into a
/// transposed output block (`[output column][row][channel]`, [`LANES`] bytes a column), for
/// `A + B` taps (see `with_taps!`).
#[inline(always)]
fn horizontal_block<const A: usize, const B: usize>(block: &[u8], h: &Axis, first: usize, out: &mut [u8]) {
    let precision = h.precision;
    let init = 1i32 << (precision - 1);
    for (x, px) in out.chunks_exact_mut(LANES).enumerate() {
        let (start, ks) = h.taps(x);
        let mut acc = [init; LANES];
        fixed_or_any::<LANES, A, B>(&mut acc, block, (start - first) * LANES, LANES, ks);
        // One contiguous store of the whole column: it is what lets LLVM vectorise the
        // arithmetic above (its vectoriser starts from stores).
        let px: &mut [u8; LANES] = px.try_into().expect("LANES bytes");
        clip_all(&acc, precision, px);
    }
}

/// Writes the first `n` rows of a transposed output block of `out_w` columns into `dst`, row
/// `r` at `dst[at + r * stride..]`.
#[inline(always)]
fn untranspose(out: &[u8], n: usize, out_w: usize, dst: &mut [u8], at: usize, stride: usize) {
    let last = out_w - 1;
    for r in 0..n {
        let row = &mut dst[at + r * stride..][..out_w * 3];
        // 4-byte moves as in `transpose`: the extra byte lands on the next pixel of the row,
        // written next; the last pixel moves its 3 bytes, so nothing past the row is touched.
        for x in 0..last {
            let from = x * LANES + r * 3;
            move4(&out[from..from + 4], &mut row[x * 3..x * 3 + 4]);
        }
        let from = last * LANES + r * 3;
        row[last * 3..last * 3 + 3].copy_from_slice(&out[from..from + 3]);
    }
}

/// `acc >> precision`, clipped to a byte.
#[inline(always)]
fn clip(acc: i32, precision: u32) -> u8 {
    (acc >> precision).clamp(0, 255) as u8
}

/// Every build of the kernels this CPU runs, by name (for tests that compare them).
#[cfg(test)]
pub(crate) fn every_isa() -> Vec<(&'static str, Resampler)> {
    let mut all = vec![("portable", Resampler::with_isa(Isa::Portable))];
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        all.push(("avx2", Resampler::with_isa(Isa::Avx2)));
    }
    all
}

#[cfg(test)]
mod tests {
    use fast_image_resize::images::{CroppedImage, CroppedImageMut, Image, ImageRef};
    use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

    use super::*;

    /// xorshift64*, seeded.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        /// Uniform in `lo..=hi`.
        fn int(&mut self, lo: u32, hi: u32) -> u32 {
            lo + (self.next() % u64::from(hi - lo + 1)) as u32
        }
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| (self.next() >> 32) as u8).collect()
        }
        /// A non-empty rectangle inside `width`×`height`.
        fn rect(&mut self, width: u32, height: u32) -> Rect {
            let (w, h) = (self.int(1, width), self.int(1, height));
            Rect {
                left: self.int(0, width - w),
                top: self.int(0, height - h),
                width: w,
                height: h,
            }
        }
        /// A start and length inside `0..limit`: whole or fractional, sometimes tiny.
        fn span(&mut self, limit: u32) -> (f64, f64) {
            let limit_f = f64::from(limit);
            match self.int(0, 2) {
                0 => {
                    let len = self.int(1, limit);
                    (f64::from(self.int(0, limit - len)), f64::from(len))
                }
                1 => {
                    // Tiny, fractional.
                    let len = (self.unit() * 0.9 + 0.05).min(limit_f);
                    ((limit_f - len) * self.unit(), len)
                }
                _ => {
                    let start = self.unit() * (limit_f - 0.01);
                    let len = ((limit_f - start) * (0.05 + 0.95 * self.unit())).max(1e-3);
                    (start, len.min(limit_f - start))
                }
            }
        }
    }

    /// One random call: a source with bounds and a box, and a target with a rectangle.
    #[derive(Debug, Clone, Copy)]
    struct Case {
        src: (u32, u32),
        bounds: Rect,
        sample: SampleBox,
        dst: (u32, u32),
        rect: Rect,
    }

    impl Case {
        fn random(rng: &mut Rng, max_side: u32) -> Case {
            let src = (rng.int(1, max_side), rng.int(1, max_side));
            let bounds = match rng.int(0, 2) {
                0 => Rect::full(src.0, src.1),
                _ => rng.rect(src.0, src.1),
            };
            let (left, width) = rng.span(bounds.width);
            let (top, height) = rng.span(bounds.height);
            let sample = SampleBox {
                left,
                top,
                width,
                height,
            };
            // Down- and upscales, and sometimes the box's own size (a skipped pass).
            let side = |rng: &mut Rng, len: f64| match rng.int(0, 3) {
                0 | 1 if len.fract() == 0.0 => len as u32,
                0 => (len.round() as u32).max(1),
                _ => rng.int(1, max_side + 16),
            };
            let (rw, rh) = (side(rng, width), side(rng, height));
            let dst = match rng.int(0, 2) {
                0 => (rw, rh),
                _ => (rw + rng.int(0, 9), rh + rng.int(0, 9)),
            };
            let rect = Rect {
                left: rng.int(0, dst.0 - rw),
                top: rng.int(0, dst.1 - rh),
                width: rw,
                height: rh,
            };
            Case {
                src,
                bounds,
                sample,
                dst,
                rect,
            }
        }

        fn ours(&self, r: &mut Resampler, pixels: &[u8], fill: u8) -> Vec<u8> {
            let mut out = vec![fill; (self.dst.0 * self.dst.1 * 3) as usize];
            let source = Source {
                pixels,
                width: self.src.0,
                height: self.src.1,
                bounds: self.bounds,
            };
            let target = Target {
                pixels: &mut out,
                width: self.dst.0,
                height: self.dst.1,
                rect: self.rect,
            };
            r.resample(source, self.sample, target)
                .unwrap_or_else(|e| panic!("{self:?}: {e}"));
            out
        }

        fn fir(&self, pixels: &[u8], fill: u8) -> Vec<u8> {
            let mut out = vec![fill; (self.dst.0 * self.dst.1 * 3) as usize];
            let b = self.bounds;
            let image = ImageRef::new(self.src.0, self.src.1, pixels, PixelType::U8x3).unwrap();
            let view = CroppedImage::new(&image, b.left, b.top, b.width, b.height).unwrap();
            let s = self.sample;
            let options = ResizeOptions::new()
                .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
                .crop(s.left, s.top, s.width, s.height);
            let mut image = Image::from_slice_u8(self.dst.0, self.dst.1, &mut out, PixelType::U8x3).unwrap();
            let r = self.rect;
            let mut part = CroppedImageMut::new(&mut image, r.left, r.top, r.width, r.height).unwrap();
            Resizer::new().resize(&view, &mut part, &options).unwrap();
            out
        }
    }

    /// The module's promise: fir's `Convolution(Bilinear)` with a crop box, bit for bit, over
    /// random geometries (whole and fractional boxes, tiny ones, down- and upscales, 1xN
    /// images, target sub-rectangles, skipped passes) and random pixels.
    #[test]
    fn agrees_with_fir() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut resampler = Resampler::new();
        let (mut bytes, mut differ, mut worst) = (0usize, 0usize, 0u8);
        let mut cases = 0;
        // Cases by the passes they need: neither, vertical only, horizontal only, both.
        let mut passes = [0usize; 4];
        for max_side in [1, 2, 3, 8, 24, 64, 160] {
            for _ in 0..400 {
                let case = Case::random(&mut rng, max_side);
                let s = case.sample;
                let need_h = f64::from(case.rect.width) != s.width || s.left.fract() != 0.0;
                let need_v = f64::from(case.rect.height) != s.height || s.top.fract() != 0.0;
                passes[usize::from(need_h) * 2 + usize::from(need_v)] += 1;
                let pixels = rng.bytes((case.src.0 * case.src.1 * 3) as usize);
                let ours = case.ours(&mut resampler, &pixels, 0xA5);
                let fir = case.fir(&pixels, 0xA5);
                for (&a, &b) in ours.iter().zip(&fir) {
                    let d = a.abs_diff(b);
                    differ += usize::from(d != 0);
                    worst = worst.max(d);
                }
                assert!(worst <= 1, "{case:?}: differs from fir by {worst}");
                bytes += ours.len();
                cases += 1;
            }
        }
        eprintln!(
            "{cases} cases (passes none/v/h/both: {passes:?}), {bytes} bytes: {differ} differ from fir, \
             by at most {worst}"
        );
        assert!(passes.iter().all(|&n| n >= 50), "{passes:?}");
        assert_eq!(differ, 0, "{differ} of {bytes} bytes differ from fir");
    }

    /// The benchmark's geometry and torchvision's typical ones, on photo-sized sources.
    #[test]
    fn agrees_with_fir_on_typical_crops() {
        let mut rng = Rng(7);
        let mut resampler = Resampler::new();
        let full = Rect::full(500, 375);
        let crop = Rect {
            left: 60,
            top: 45,
            width: 387,
            height: 290,
        };
        let whole = |r: Rect| SampleBox {
            left: 0.0,
            top: 0.0,
            width: f64::from(r.width),
            height: f64::from(r.height),
        };
        let cases = [
            // RandomResizedCrop: the crop is the bounds.
            (crop, whole(crop), (224, 224)),
            // Resize(256) + CenterCrop(224) of 500x375 in one pass: 341x256, offsets 58, 16.
            (
                full,
                SampleBox {
                    left: 58.0 * 500.0 / 341.0,
                    top: 16.0 * 375.0 / 256.0,
                    width: 224.0 * 500.0 / 341.0,
                    height: 224.0 * 375.0 / 256.0,
                },
                (224, 224),
            ),
            // Upscale.
            (Rect::full(40, 30), whole(Rect::full(40, 30)), (224, 224)),
        ];
        for (bounds, sample, (w, h)) in cases {
            let case = Case {
                src: (500, 375),
                bounds,
                sample,
                dst: (w, h),
                rect: Rect::full(w, h),
            };
            let pixels = rng.bytes(500 * 375 * 3);
            assert!(
                case.ours(&mut resampler, &pixels, 0) == case.fir(&pixels, 0),
                "{case:?}"
            );
        }
    }

    /// The AVX2 build and the portable build give the same bytes (integer arithmetic only), so
    /// a sample does not depend on the CPU that served it.
    #[test]
    fn every_isa_gives_the_same_bytes() {
        let mut all = every_isa();
        eprintln!("builds: {:?}", all.iter().map(|(name, _)| *name).collect::<Vec<_>>());
        let mut rng = Rng(42);
        for max_side in [1, 5, 40, 300] {
            for _ in 0..150 {
                let case = Case::random(&mut rng, max_side);
                let pixels = rng.bytes((case.src.0 * case.src.1 * 3) as usize);
                let (first, rest) = all.split_first_mut().expect("the portable build");
                let want = case.ours(&mut first.1, &pixels, 3);
                for (name, r) in rest {
                    assert!(case.ours(r, &pixels, 3) == want, "{name}: {case:?}");
                }
            }
        }
    }

    /// Only `rect` is written, and the same resampler gives the same bytes whatever it did
    /// before (its buffers carry nothing over).
    #[test]
    fn writes_only_the_rectangle_and_forgets_the_last_call() {
        let mut rng = Rng(3);
        let mut warm = Resampler::new();
        for _ in 0..300 {
            let case = Case::random(&mut rng, 50);
            let pixels = rng.bytes((case.src.0 * case.src.1 * 3) as usize);
            let a = case.ours(&mut warm, &pixels, 0x11);
            let b = case.ours(&mut Resampler::new(), &pixels, 0x22);
            let r = case.rect;
            for y in 0..case.dst.1 {
                for x in 0..case.dst.0 {
                    let i = ((y * case.dst.0 + x) * 3) as usize;
                    let inside = x >= r.left && x < r.left + r.width && y >= r.top && y < r.top + r.height;
                    if inside {
                        assert_eq!(a[i..i + 3], b[i..i + 3], "{case:?}");
                    } else {
                        assert_eq!((a[i], b[i]), (0x11, 0x22), "{case:?} wrote outside at ({x}, {y})");
                    }
                }
            }
        }
    }

    #[test]
    fn refuses_geometry_that_does_not_fit() {
        let pixels = vec![0u8; 10 * 10 * 3];
        let mut out = vec![0u8; 4 * 4 * 3];
        let mut r = Resampler::new();
        let mut call = |bounds: Rect, sample: SampleBox, rect: Rect, short: bool| {
            let source = Source {
                pixels: if short { &pixels[1..] } else { &pixels },
                width: 10,
                height: 10,
                bounds,
            };
            let target = Target {
                pixels: &mut out,
                width: 4,
                height: 4,
                rect,
            };
            r.resample(source, sample, target).map_err(|e| e.to_string())
        };
        let full = Rect::full(10, 10);
        let b = |left, top, width, height| SampleBox {
            left,
            top,
            width,
            height,
        };
        let ok = b(0.0, 0.0, 10.0, 10.0);
        let out4 = Rect::full(4, 4);
        assert_eq!(call(full, ok, out4, false), Ok(()));
        assert!(
            call(full, ok, out4, true)
                .unwrap_err()
                .starts_with("source holds 299 bytes")
        );
        let wide = Rect { width: 11, ..full };
        assert!(call(wide, ok, out4, false).unwrap_err().starts_with("bounds "));
        let off = Rect { left: 1, ..out4 };
        assert!(call(full, ok, off, false).unwrap_err().starts_with("rect "));
        for bad in [
            b(0.0, 0.0, 0.0, 10.0),
            b(-0.5, 0.0, 5.0, 5.0),
            b(0.0, 0.0, 10.5, 10.0),
            b(f64::NAN, 0.0, 1.0, 1.0),
            b(0.0, 0.0, 1.0, f64::INFINITY),
            b(10.0, 0.0, 0.5, 1.0),
        ] {
            let e = call(full, bad, out4, false).unwrap_err();
            assert!(e.starts_with("sample box "), "{bad:?}: {e}");
        }
        // An empty rectangle is nothing to do.
        assert_eq!(call(full, ok, Rect::full(0, 3), false), Ok(()));
    }

    /// Coefficients are fir's: the precision rule and the trimmed windows.
    #[test]
    fn coefficients() {
        let mut a = Axis::default();
        // The same size: the identity, at 14 bits (a weight of 1 fits 15 bits at most).
        a.compute(Filter::BILINEAR, 5, 0.0, 5.0, 5);
        assert_eq!(a.precision, 14);
        for i in 0..5 {
            assert_eq!(a.taps(i), (i, &[1 << 14][..]));
        }
        // Halving: support 2, weights 1/8, 3/8, 3/8, 1/8 (clamped at the edges).
        a.compute(Filter::BILINEAR, 8, 0.0, 8.0, 4);
        assert_eq!(a.taps(1).0, 1);
        let w = a.taps(1).1;
        let unit = 1i32 << a.precision;
        assert_eq!(w.iter().map(|&k| i32::from(k)).sum::<i32>(), unit);
        assert_eq!(w.len(), 4);
        assert_eq!(i32::from(w[0]) * 3, i32::from(w[1]));
        // The last window (pixels 5..8) is padded on its left, to stay inside the source.
        let (start, w) = a.taps(3);
        assert_eq!((start, w[0]), (4, 0));
        assert_eq!(w[1..].iter().map(|&k| i32::from(k)).sum::<i32>(), unit);
    }
}
