"""Hybrid decode, the client's half (control.md, "Hybrid decode"; ring.md, ``gpu_job``).

The server decodes most of a batch on its CPU threads and hands the rest to this process as
encoded JPEG bytes plus a ``gpu_job`` record: the crop it drew, the resize, the output window, the
flips and the fill. :class:`Finisher` decodes those samples in one batched call on the GPU (the
hardware JPEG decoder through nvImageCodec, else ``torchvision.io.decode_jpeg``), then does the
geometry for all of them at once as two batched matrix products: each output row (column) is a
weighted sum of source rows (columns), with the weights of the antialiased filter the CPU path
uses (PIL's and torchvision's: a triangle for bilinear, Keys' cubic for bicubic, widened by the
downscale factor), zero outside the crop, mirrored for a flip. Samples outside ``valid`` get the
fill. The result is written into the batch tensor beside the CPU-decoded samples, before the batch
ops (normalisation, erasing, MixUp/CutMix).

Everything runs on the copy stream of :class:`ringfeed.gpu.device.CudaCopier`; the host only
submits work. A sample the GPU decoder refuses is decoded by Pillow on the host and finished the
same way (a fallback, counted); a sample neither can decode is a sample
failure for the loader's ``on_error``.
"""

from __future__ import annotations

import io
import logging
import os
import time
import warnings
from typing import Any

import numpy as np

log = logging.getLogger("ringfeed")

#: int32 values per ``gpu_job`` record (ring.md).
RECORD_LEN = 18
#: Bits of ``gpu_job[16]`` (ring.md).
FLIP_X = 1
FLIP_Y = 2
INTERPOLATION_SHIFT = 2
ANTIALIAS = 16
#: ``gpu_job[16]`` bits 5-7 (ring.md, 1.4): the JPEG's chroma sampling, by code: its name and the
#: chroma block's ``(width, height)`` in pixels where chroma is subsampled by two (what a rebuild
#: of replicated chroma needs), ``None`` otherwise. Code 0: not said (a 1.3 server).
CHROMA_SHIFT = 5
#: ``gpu_job[16]`` bit 8 (ring.md, control 1.11, "Decoded pixels"): the arena holds the sample's
#: decoded pixels (packed RGB rows of ``src_width`` by ``src_height``), not a JPEG.
PIXELS = 256
CHROMA = {
    0: ("not said", None),
    1: ("grey", None),
    2: ("4:4:4", None),
    3: ("4:2:2", (2, 1)),
    4: ("4:2:0", (2, 2)),
    5: ("4:4:0", (1, 2)),
    6: ("other", None),
}


#: Each chroma code's block ``(width, height)``, ``(1, 1)`` where chroma is not subsampled by two.
_BLOCKS = np.array([(CHROMA.get(c, ("", None))[1] or (1, 1)) for c in range(8)], dtype=np.int64)


def chroma_of(flags: Any) -> Any:
    """The chroma code of ``gpu_job[16]`` values (an int or an array of them)."""
    return (flags >> CHROMA_SHIFT) & 7


#: ``gpu_job`` columns, by name (ring.md).
COLUMNS = (
    "offset",
    "length",
    "src_width",
    "src_height",
    "pre_left",
    "pre_top",
    "pre_width",
    "pre_height",
    "resize_width",
    "resize_height",
    "win_left",
    "win_top",
    "valid_left",
    "valid_top",
    "valid_width",
    "valid_height",
    "flags",
    "fill",
)
assert len(COLUMNS) == RECORD_LEN
_C = {name: k for k, name in enumerate(COLUMNS)}


def offered(pos: int, share: float) -> bool:
    """Whether batch position ``pos`` is offered to the GPU under ``share`` (control.md, "Which samples")."""
    s = min(max(share, 0.0), 1.0)
    return int((pos + 1) * s) > int(pos * s)


def backend_for(device: Any) -> tuple[str | None, str]:
    """The GPU decoder this process can use on ``device``: ``(name, why)``, name ``None`` when none.

    ``nvimgcodec`` (the hardware JPEG decoder, then nvJPEG's CUDA decoder) is preferred; without
    it ``torchvision`` (``decode_jpeg(device="cuda")``, nvJPEG's CUDA decoder, slower). The host
    fallback for what a GPU decoder refuses is Pillow.
    """
    if getattr(device, "type", "cpu") != "cuda":
        return None, "the loader's device is the CPU"
    try:
        from nvidia import nvimgcodec  # noqa: F401

        return "nvimgcodec", "nvImageCodec's hardware JPEG decoder"
    except ImportError:
        pass
    try:
        import torchvision.io as tio

        if hasattr(tio, "decode_jpeg"):
            return "torchvision", (
                "torchvision.io.decode_jpeg on the GPU (nvImageCodec is not installed: "
                "`pip install nvidia-nvimgcodec-cu13` for the hardware decoder, several times faster)"
            )
    except ImportError:
        pass
    return None, "neither nvImageCodec (`pip install nvidia-nvimgcodec-cu13`) nor torchvision is installed"


def _host_decode(data: np.ndarray) -> Any:
    """Decodes one JPEG on the host with Pillow (libjpeg), strictly: a truncated file is an error.

    Returns an HWC uint8 tensor.
    """
    import torch
    from PIL import Image, ImageFile

    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise ValueError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set, so Pillow would fill a truncated file with grey")
    with Image.open(io.BytesIO(data.tobytes())) as im:
        rgb = im.convert("RGB")
        return torch.from_numpy(np.asarray(rgb).copy())


def _kernel(x: Any, interp: Any, antialias: Any) -> Any:
    """Filter weights at distances ``x`` (in filter units): triangle (bilinear) or Keys' cubic."""
    import torch

    ax = x.abs()
    tri = (1.0 - ax).clamp(min=0.0)
    # Keys' cubic: a = -0.5 with antialias (PIL, torchvision's antialiased path), -0.75 without
    # (PyTorch's bicubic), as the server's resampler.
    a = torch.where(antialias, -0.5, -0.75)
    near = ((a + 2.0) * ax - (a + 3.0)) * ax * ax + 1.0
    far = ((a * ax - 5.0 * a) * ax + 8.0 * a) * ax - 4.0 * a
    cubic = torch.where(ax < 1.0, near, torch.where(ax < 2.0, far, torch.zeros_like(ax)))
    return torch.where(interp == 2, cubic, tri)


def axis_weights(
    out_n: int,
    span: int,
    pre0: Any,
    pre_n: Any,
    resize_n: Any,
    win0: Any,
    valid0: Any,
    valid_n: Any,
    interp: Any,
    antialias: Any,
    flip: Any,
) -> tuple[Any, Any]:
    """Weights ``[k, out_n, span]`` from a crop's pixels to output pixels along one axis, and ``[k, out_n]`` validity.

    Args are per-sample tensors ``[k]`` (ring.md's ``gpu_job`` along this axis); the crop's
    pixel ``j`` is source pixel ``pre + j``, ``span`` the padded crop length of the batch.
    """
    import torch

    dev = pre_n.device
    f32 = torch.float32
    b = win0[:, None].to(f32) + torch.arange(out_n, device=dev, dtype=f32)[None, :]
    valid = (b >= valid0[:, None]) & (b < (valid0 + valid_n)[:, None])
    j = torch.arange(span, device=dev, dtype=f32)[None, None, :]
    inside = j < pre_n[:, None, None]
    resized = resize_n > 0
    scale = pre_n.to(f32) / resize_n.clamp(min=1).to(f32)
    # Nearest: the source pixel at floor(b * scale) in float32, as the server and PyTorch pick it.
    near_src = torch.minimum(torch.floor(b * scale[:, None]), (pre_n - 1)[:, None].to(f32))
    # No resize: the base is the source, and the crop starts at `pre` (ring.md).
    plain_src = b - pre0[:, None].to(f32)
    one_hot_src = torch.where(resized[:, None], near_src, plain_src)
    one_hot = (j == one_hot_src[..., None]).to(f32)
    # Linear and cubic: PIL's and torchvision's antialiased weights, normalised over the crop.
    widen = torch.where(antialias, scale.clamp(min=1.0), torch.ones_like(scale))
    center = (b + 0.5) * scale[:, None]
    x = (j + 0.5 - center[..., None]) / widen[:, None, None]
    filt = _kernel(x, interp[:, None, None], antialias[:, None, None]) * inside
    filt = filt / filt.sum(-1, keepdim=True).clamp(min=1e-12)
    use_filter = (resized & (interp != 0))[:, None, None]
    w = torch.where(use_filter, filt, one_hot * inside) * valid[..., None]
    w = torch.where(flip[:, None, None], w.flip(1), w)
    valid = torch.where(flip[:, None], valid.flip(1), valid)
    return w, valid


def _place(img: Any) -> tuple[int, int, int, int, int, int]:
    """Where a decoded HWC uint8 image lies: ``(address, height, width, row, pixel, channel
    strides in elements)``, for a torch tensor or an object with a CUDA array interface
    (nvImageCodec's images), without making a tensor of it."""
    if hasattr(img, "data_ptr"):
        sy, sx, sc = img.stride()
        return img.data_ptr(), img.shape[0], img.shape[1], sy, sx, sc
    cai = img.__cuda_array_interface__
    h, w, c = cai["shape"]
    if cai["typestr"] != "|u1":
        raise ValueError(f"the GPU decoder made a {cai['typestr']} image, not uint8")
    sy, sx, sc = cai.get("strides") or (w * c, c, 1)
    return cai["data"][0], h, w, sy, sx, sc


def _slices(rec: np.ndarray, arena: np.ndarray) -> list[np.ndarray]:
    """Each record's encoded bytes, as views of ``arena`` (``gpu_job`` columns 0 and 1): what the
    per-image decoders take. Not made for nvJPEG's batched call, which reads the arena by address
    (about 0.1 ms of Python a batch of 192, on the training thread when made at ``submit``)."""
    return [arena[o : o + n] for o, n in zip(rec[:, 0], rec[:, 1], strict=True)]


def _split(jobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The batch positions of the samples to decode (JPEG bytes in the arena) and of the pixel
    samples (1.11: their decoded pixels in the arena), each ascending."""
    first = _first(jobs)
    handed = first[:, _C["length"]] > 0
    pixels = (first[:, _C["flags"]] & PIXELS) != 0
    return np.nonzero(handed & ~pixels)[0], np.nonzero(handed & pixels)[0]


def _first(jobs: np.ndarray) -> np.ndarray:
    """Each sample's first ``gpu_job`` record (``[n, 18]``): where its bytes are and the source's
    size, the same in every record of the sample (1.10: ``jobs`` ``[n, outputs, 18]``)."""
    return jobs if jobs.ndim == 2 else jobs[:, 0]


def _size_of(image: Any, layout: str) -> tuple[int, int]:
    """``(height, width)`` of a batch of images in ``layout``."""
    h, w = (1, 2) if layout == "NHWC" else (2, 3)
    return int(image.shape[h]), int(image.shape[w])


def _decode_threads() -> int:
    """Decode threads for the batched hardware decoder: ``RINGFEED_GPU_DECODE_THREADS``, default 2."""
    raw = os.environ.get("RINGFEED_GPU_DECODE_THREADS", "2")
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= 8:
        raise ValueError(f"RINGFEED_GPU_DECODE_THREADS must be a whole number from 1 to 8, not {raw!r}")
    return n


class DecodeError(Exception):
    """Samples that neither the GPU nor the host fallback could decode: ``(batch position, reason)``."""

    def __init__(self, failed: list[tuple[int, str]]) -> None:
        super().__init__("; ".join(f"position {p}: {r}" for p, r in failed))
        self.failed = failed


class Finisher:
    """Finishes a batch's GPU samples on ``device``.

    Args:
        device: the torch device the batch is on (``cuda``; ``cpu`` only with ``backend="host"``,
            the tests' path through everything but the GPU decoder).
        backend: ``"nvimgcodec"``, ``"torchvision"`` or ``"host"`` (Pillow on the CPU).
        layout: ``"NHWC"`` or ``"NCHW"``, the batch's.
        size: the (first) view's ``(height, width)``, for compiling the kernel ahead; each batch
            is finished at its image tensors' own size (1.10: an aspect-bucketed batch's bucket).
        counts: images per sample of each view, views in order (1.10: a GPU sample is decoded
            once and each output finished from it; ``gpu_job`` is then ``[n, outputs, 18]``);
            default one view of one image.
    """

    def __init__(
        self,
        device: Any,
        backend: str,
        layout: str,
        size: tuple[int, int],
        slots: int = 64,
        geometry: str | None = None,
        counts: Any = None,
    ) -> None:
        import collections
        import contextlib
        import threading

        import torch

        #: How the geometry runs: ``"triton"``, one kernel that reads the decoded images in place
        #: (:mod:`ringfeed.gpu.finish_kernel`), or ``"bmm"``, two batched matrix products over crops
        #: copied into a padded buffer. ``RINGFEED_GPU_FINISH`` sets it when ``geometry`` is not
        #: given; ``"auto"`` (the default) is the kernel on a CUDA device where Triton is installed
        #: and compiles it, else the matrix products.
        choice = geometry or os.environ.get("RINGFEED_GPU_FINISH", "auto")
        if choice not in ("auto", "bmm", "triton"):
            raise ValueError(
                f"gpu finishing geometry must be 'auto', 'bmm' or 'triton', not {choice!r} (RINGFEED_GPU_FINISH)"
            )
        self._kernel: Any = None
        if choice == "triton" or (choice == "auto" and device.type == "cuda"):
            try:
                from . import finish_kernel

                # Compiled now, not inside the first batch (where it would read as a slow step).
                if device.type == "cuda":
                    finish_kernel.warm(device, layout, size)
                self._kernel = finish_kernel
            except Exception as e:  # any failure to import or to compile it
                if choice == "triton":
                    raise ValueError(
                        f"RINGFEED_GPU_FINISH=triton: the Triton finishing kernel cannot run here ({e!r}); "
                        "set RINGFEED_GPU_FINISH=bmm for the matrix products"
                    ) from e
                log.warning(
                    "ringfeed: the Triton finishing kernel cannot run here (%r); GPU samples are finished "
                    "with batched matrix products instead (RINGFEED_GPU_FINISH=bmm chooses them without trying)",
                    e,
                )
        self.geometry = "triton" if self._kernel is not None else "bmm"
        #: How the per-image steps after the geometry run (``gpu_ops``, protocol 1.8): ``"triton"``,
        #: a few fused launches a batch (:mod:`ringfeed.gpu.ops_kernel`), or ``"torch"``, PyTorch
        #: ops per step and kind (:mod:`ringfeed.gpu.ops`, a few hundred launches a batch); the same
        #: bytes (blur within 40 dB). ``RINGFEED_GPU_OPS`` sets it; ``"auto"`` (the default) is the
        #: Triton kernels on a CUDA device, falling back to PyTorch (with a warning) where they fail
        #: to compile.
        ops_choice = os.environ.get("RINGFEED_GPU_OPS", "auto")
        if ops_choice not in ("auto", "torch", "triton"):
            raise ValueError(f"RINGFEED_GPU_OPS must be 'auto', 'torch' or 'triton', not {ops_choice!r}")
        self._ops_choice = ops_choice
        self._ops_kernel: Any = None
        if ops_choice == "triton" or (ops_choice == "auto" and device.type == "cuda"):
            try:
                from . import ops_kernel

                self._ops_kernel = ops_kernel
            except Exception as e:  # Triton missing or broken
                if ops_choice == "triton":
                    raise ValueError(f"RINGFEED_GPU_OPS=triton: the Triton step kernels cannot run here ({e!r})") from e
                log.warning("ringfeed: the Triton step kernels cannot run here (%r); using PyTorch ops", e)
        self.device = device
        self.backend = backend
        self.layout = layout
        self.size = size
        self.counts = tuple(int(c) for c in (counts or (1,)))
        if not self.counts or min(self.counts) < 1:
            raise ValueError(f"counts must be images per view, each at least 1, got {counts!r}")
        # fp16 products with fp32 accumulation on the GPU (0..255 are exact in fp16, the weights
        # carry 11 bits); fp32 on the CPU.
        self.dtype = torch.float16 if device.type == "cuda" else torch.float32
        self._decoder: Any = None
        if backend == "nvimgcodec":
            from nvidia import nvimgcodec

            self._nv = nvimgcodec
            self._decoder = nvimgcodec.Decoder(
                device_id=device.index or 0,
                backends=[
                    nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY),
                    nvimgcodec.Backend(nvimgcodec.BackendKind.GPU_ONLY),
                ],
            )
        #: The chroma rebuild (:mod:`ringfeed.gpu.chroma_kernel`) for the batched hardware decoder's
        #: replicated chroma, with ``RINGFEED_GPU_CHROMA=rebuild``; ``None`` otherwise.
        self._chroma: Any = None
        from . import nvjpeg

        # A bad RINGFEED_GPU_CHROMA is refused here, not in a decode thread.
        if nvjpeg.chroma_mode() == "rebuild":
            try:
                from . import chroma_kernel

                if device.type == "cuda":
                    chroma_kernel.warm(device)
                self._chroma = chroma_kernel
            except Exception as e:  # any failure to import or to compile it
                raise ValueError(
                    f"RINGFEED_GPU_CHROMA=rebuild: the chroma rebuild kernels cannot run here ({e!r}); "
                    "set RINGFEED_GPU_CHROMA=replicate or interpolate"
                ) from e
        #: nvJPEG's batched hardware decoder (:mod:`ringfeed.gpu.nvjpeg`): one per decode thread (each
        #: has its own decode state, so two batches decode at once), opened on first use; off
        #: where it cannot run (then nvImageCodec decodes, image by image).
        self._hw_off = backend != "nvimgcodec" or self._kernel is None
        #: Why the batched hardware decoder is not in use (``None`` while it is, or before it opens).
        self.hw_reason: str | None = None
        if backend != "nvimgcodec":
            self.hw_reason = "the GPU decoder is not nvImageCodec"
        elif self._kernel is None:
            self.hw_reason = "the matrix products need one image per sample (RINGFEED_GPU_FINISH=bmm)"
        self._hw_all: list[Any] = []  # every decoder opened, for close()
        self._hw_lock = threading.Lock()
        self._tls = threading.local()  # this thread's decoder and the event after its last decode
        self._nv_lock = threading.Lock()  # nvImageCodec's decoder, one caller at a time
        self._hw_refused_logged = False
        # nvImageCodec's and torchvision's images of the last batches (memory of their own
        # allocators or streams): the GPU reads them after `__call__` returns, until the batch's
        # copy event; a batch `slots` batches old has completed it (its slot was released only
        # then, and at most `slots` batches are in flight). The batched decoder's buffer is not
        # kept: the caching allocator gave it on the side stream, where the decode writes it and
        # the kernel reads it, so a later allocation of the same block is ordered after both.
        self._keep: collections.deque[list[Any]] = collections.deque(maxlen=slots + 1)
        #: Whether decodes can run ahead in a thread of their own (:meth:`submit`): nvImageCodec's
        #: decode call blocks its thread for the whole decode (and releases the GIL meanwhile).
        self.background = backend in ("nvimgcodec", "host")
        self._pool: Any = None
        #: Threads that decode batches ahead (:meth:`submit`): ``RINGFEED_GPU_DECODE_THREADS``
        #: with the batched hardware decoder (a bad value is refused here), else one. The loader
        #: takes as many batches ahead.
        self.decode_threads = 1 if self._hw_off else _decode_threads()
        #: Counters since the last :meth:`take_counts`: samples, host ns, fallbacks, and the host ns
        #: :meth:`__call__`'s callers waited for decodes started ahead (:meth:`submit`) to return.
        self._counts = [0, 0, 0, 0]
        #: The same since construction.
        self.totals = [0, 0, 0, 0]
        #: 1.11: pixel samples finished since construction (the server decoded them).
        self.pixel_samples = 0
        #: Host ns the last :meth:`__call__` spent in the calling thread (the loader counts it as
        #: the wait for data, never as time behind the GPU).
        self.last_call_ns = 0
        if not self._hw_off and device.type == "cuda":
            # Each decode thread opens and warms its decoder now, while the server starts: a
            # handle's opening and first decode take from hundreds of milliseconds to seconds
            # beside a busy GPU, which inside the first batches read as slow steps (and the tuner
            # would blame GPU decode). The batches submitted later queue behind these.
            pool = self._start_pool()
            gate = threading.Barrier(self.decode_threads)

            def open_here() -> None:
                try:
                    # An error here (RINGFEED_GPU_DECODER=nvjpeg where it cannot run) is raised
                    # again by the first batch's decode, which tries to open it once more.
                    self._thread_decoder()
                finally:
                    # Every thread takes one of these (none takes two), or a minute passes.
                    with contextlib.suppress(threading.BrokenBarrierError):
                        gate.wait(timeout=60)

            for _ in range(self.decode_threads):
                pool.submit(open_here)

    def _start_pool(self) -> Any:
        """The decode threads' pool, started on first use."""
        import concurrent.futures

        if self._pool is None:
            # Two with the batched hardware decoder: a decode's kernels wait for the model's blocks, so
            # one batch at a time cannot keep up with a fast model (ResNet-18 on the H200).
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.decode_threads, thread_name_prefix="ringfeed-gpu-decode"
            )
        return self._pool

    def submit(self, jobs: np.ndarray, arena: np.ndarray, stream: Any = None) -> Any:
        """Starts decoding a batch's GPU samples in the finisher's thread; a future for
        :meth:`__call__`'s ``pending``. ``jobs`` and ``arena`` must stay valid (the slot held)
        until the future is done."""
        pool = self._start_pool()
        t0 = time.perf_counter_ns()
        first = _first(jobs)
        pos = _split(jobs)[0]
        rec = first[pos].astype(np.int64)

        def run() -> tuple[Any, ...]:
            places = None
            datas = None  # the per-image views, made only for the decoders that take them
            if not len(pos):
                # Nothing to decode (1.11: a batch of pixel samples and server-finished ones).
                return pos, rec, datas, [], places, time.perf_counter_ns() - t0
            hw = self._hw_decode(rec, arena, stream) if self.backend == "nvimgcodec" else None
            if hw is not None:
                buf, places, ready = hw
                got = [(buf, ready)] * len(pos)
            elif self.backend == "nvimgcodec":
                datas = _slices(rec, arena)
                kw = {} if stream is None else {"cuda_stream": stream.cuda_stream}
                with self._nv_lock:
                    got = list(self._decoder.decode(datas, **kw))
                # Where each image lies, read here rather than in the training loop's thread:
                # per-image Python there is what the loop waits for (benches/results/2026-12-01-h200-kernel).
                if self._kernel is not None:
                    places = [None if g is None else _place(g) for g in got]
            else:
                datas = _slices(rec, arena)
                got = []
                for d in datas:
                    try:
                        got.append(_host_decode(d))
                    except (OSError, ValueError):
                        got.append(None)
            return pos, rec, datas, got, places, time.perf_counter_ns() - t0

        return pool.submit(run)

    def close(self) -> None:
        """Waits for decodes in flight and stops the thread. Idempotent."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        with self._hw_lock:
            decoders, self._hw_all = self._hw_all, []
            self._hw_off = True
        if decoders:
            import torch

            torch.cuda.synchronize(self.device)  # every decode queued has run
        for dec in decoders:
            dec.close()

    @property
    def hw_decoders(self) -> int:
        """How many batched hardware decoders are open (one per decode thread that used one)."""
        return len(self._hw_all)

    def _thread_decoder(self) -> Any:
        """This thread's batched hardware decoder, opened on first use (at construction, see
        ``__init__``); ``None`` where it is off."""
        dec = getattr(self._tls, "hw", None)
        if dec is not None:
            return dec or None
        with self._hw_lock:
            if self._hw_off:
                return None
            dec = self._open_decoder()
        self._tls.hw, self._tls.done = (dec if dec is not None else False), None
        if dec is not None and self.device.type == "cuda":
            import torch

            # This thread's decodes run on a stream of their own, not on the copy stream: there
            # they queued behind every copy and finishing kernel of the batches before (kernels
            # that wait for the model's blocks), and two decode threads could not overlap.
            self._tls.stream = torch.cuda.Stream(self.device)
        return dec

    def _open_decoder(self) -> Any:
        """Opens and warms one batched hardware decoder (the caller holds ``_hw_lock``); ``None``
        where none can open (then, if none is open at all, the decoder is off for good and
        :attr:`hw_reason` says why)."""
        from . import nvjpeg

        dec, why = nvjpeg.open_hardware(self.device)
        if dec is not None:
            try:
                dec.warm()
            except nvjpeg.NvjpegError as e:
                dec.close()
                dec, why = None, f"nvJPEG's hardware decoder failed its first decode ({e})"
        if dec is None:
            if not self._hw_all:  # none could open: off for good
                self._hw_off = True
                self.hw_reason = why
                log.info("ringfeed: GPU samples are decoded by nvImageCodec image by image (%s)", why)
            return None
        self._hw_all.append(dec)
        return dec

    def _hw_decode(self, rec: np.ndarray, arena: np.ndarray, stream: Any) -> tuple[Any, np.ndarray, Any] | None:
        """Decodes a batch's GPU samples (their ``rec`` records, bytes in ``arena``) in one call of
        nvJPEG's hardware decoder into one device buffer: ``(buffer, places, ready)`` (``places``
        as :func:`_place` gives them, a row per sample; ``ready``, an event after the decode on
        this thread's decode stream, which the stream that reads the buffer must wait for:
        :meth:`_adopt`), or ``None`` where that decoder is not in use or refused the batch (then
        nvImageCodec decodes it)."""
        import torch

        from . import nvjpeg

        if self._hw_off or len(rec) == 0:
            return None
        dec = self._thread_decoder()
        if dec is None:
            return None
        w, h = rec[:, _C["src_width"]], rec[:, _C["src_height"]]
        # Each image's rows start 256-byte aligned in one buffer of the batch.
        size = (w * h * 3 + 255) // 256 * 256
        off = np.concatenate([[0], np.cumsum(size[:-1])]).astype(np.int64)
        cuda_stream = getattr(self._tls, "stream", None)
        if cuda_stream is None:
            cuda_stream = stream if stream is not None else torch.cuda.current_stream(self.device)
        with torch.cuda.stream(cuda_stream):
            # From the caching allocator, on the stream that writes it; the stream that reads it
            # is recorded on it when it adopts the batch (_adopt), so that no later allocation
            # reuses the block before that stream's reads have run.
            buf = torch.empty(int(size.sum()), dtype=torch.uint8, device=self.device)
        if self._tls.done is not None:
            # This thread's decode state holds its last batch's buffers until that decode has run.
            self._tls.done.synchronize()
        base = buf.data_ptr()
        try:
            with torch.cuda.device(self.device):
                dec.decode(
                    (arena.ctypes.data + rec[:, _C["offset"]]).astype(np.uint64),
                    rec[:, _C["length"]],
                    (base + off).astype(np.uint64),
                    (w * 3).astype(np.uint64),
                    cuda_stream.cuda_stream,
                )
        except nvjpeg.HardwareRefusedError as e:
            if not self._hw_refused_logged:
                self._hw_refused_logged = True
                log.warning(
                    "ringfeed: nvJPEG's hardware decoder refused a batch (%s); such batches are decoded by "
                    "nvImageCodec image by image (logged once)",
                    e,
                )
            return None
        done = torch.cuda.Event()
        done.record(cuda_stream)
        self._tls.done = done
        ones = np.ones_like(w)
        places = np.stack([base + off, h, w, w * 3, 3 * ones, ones], axis=1).astype(np.int64)
        return buf, places, done

    @staticmethod
    def _adopt(buf: Any, ready: Any, stream: Any) -> None:
        """Makes ``stream`` (the copy stream, or the current one) wait for a batched decode's
        ``ready`` event before it reads ``buf``, and tells the caching allocator that ``stream``
        uses ``buf``: the block is reused only after ``stream``'s work queued so far has run.
        What becomes visible: everything the decode wrote, to every kernel queued on ``stream``
        after this call."""
        import torch

        s = stream if stream is not None else torch.cuda.current_stream(buf.device)
        s.wait_event(ready)
        buf.record_stream(s)

    @property
    def ahead_wait_ns(self) -> int:
        """Host ns callers have waited, since construction, for decodes started ahead: whether the
        decode threads keep up with the loop."""
        return self.totals[3]

    def take_counts(self) -> tuple[int, int, int, int]:
        """``(samples, host ns, fallbacks, decode wait ns)`` since the last call (for ``stats``:
        1.3, and 1.5's ``gpu_decode_wait_ns``, the callers' wait for decodes started ahead)."""
        c = tuple(self._counts)
        self._counts = [0, 0, 0, 0]
        return c  # type: ignore[return-value]

    def _decode(
        self, datas: list[np.ndarray], stream: Any, decoded: list[Any] | None = None
    ) -> tuple[list[Any], list[tuple[int, str]], int]:
        """Decodes ``datas`` (or takes ``decoded``, a :meth:`submit`'s nvImageCodec images): HWC uint8
        tensors on the device (None where failed), failures, fallbacks."""
        import torch
        import torchvision.io as tio

        images: list[Any] = [None] * len(datas)
        refused: list[int] = []
        if self.backend == "nvimgcodec":
            kw = {} if stream is None else {"cuda_stream": stream.cuda_stream}
            if decoded is not None:
                got = decoded
            else:
                with self._nv_lock:
                    got = self._decoder.decode(datas, **kw)
            for i, img in enumerate(got):
                if img is None:
                    refused.append(i)
                else:
                    # The kernel reads nvImageCodec's images in place (their CUDA array interface).
                    images[i] = img if self._kernel is not None else torch.as_tensor(img, device=self.device)
        elif self.backend == "torchvision":
            try:
                with warnings.catch_warnings():
                    # torchvision 0.29 deprecates its decoders in favour of torchcodec; they still work.
                    warnings.simplefilter("ignore", DeprecationWarning)
                    tens = [torch.from_numpy(d) for d in datas]
                    got = tio.decode_jpeg(tens, mode=tio.ImageReadMode.RGB, device=self.device)
                images = [g.permute(1, 2, 0) for g in got]
            except RuntimeError:
                refused = list(range(len(datas)))
        elif decoded is not None:  # host, decoded ahead
            images = [None if d is None else d.to(self.device, non_blocking=True) for d in decoded]
            refused = [i for i, d in enumerate(decoded) if d is None]
        else:
            refused = list(range(len(datas)))
        failed: list[tuple[int, str]] = []
        fallbacks = 0
        for i in refused:
            try:
                img = _host_decode(datas[i])
            except (OSError, ValueError) as e:
                failed.append((i, f"the GPU decoder refused it and Pillow cannot decode it either: {e}"))
                continue
            images[i] = img.to(self.device, non_blocking=True)
            fallbacks += self.backend != "host"
        return images, failed, fallbacks

    def __call__(
        self,
        jobs: np.ndarray,
        arena: np.ndarray,
        image: Any,
        stream: Any = None,
        pending: Any = None,
        ops: np.ndarray | None = None,
    ) -> list[int]:
        """Finishes the GPU samples of a batch into ``image`` (the batch tensor, on the device; 1.10:
        a list of each view's, ``[n, ...]`` or ``[n, count, ...]`` as :attr:`counts` says).

        ``jobs`` is the slot's ``gpu_job`` field ``[n, 18]`` (1.10: ``[n, outputs, 18]``; host,
        int32), ``arena`` its ``gpu_bytes`` payload as one flat uint8 array; ``pending``, a
        :meth:`submit` of the same batch whose decode ran ahead; ``ops``, the slot's ``gpu_ops``
        field ``[n, S, 16]`` (1.8; 1.10: ``[n, outputs, S, 16]``), the steps each output runs after
        its geometry (:mod:`ringfeed.gpu.ops`). Each GPU sample is decoded once and every output
        finished from its pixels. Returns the batch positions it finished.

        Raises:
            DecodeError: some samples could not be decoded at all (the others are finished).
        """
        t0 = time.perf_counter_ns()
        images_out = list(image) if isinstance(image, (list, tuple)) else [image]
        if len(images_out) != len(self.counts):
            raise ValueError(f"{len(images_out)} view tensors for a finisher of {len(self.counts)} views")
        outputs = sum(self.counts)
        per_out = jobs if jobs.ndim == 3 else jobs[:, None, :]
        if per_out.shape[1] != outputs:
            raise ValueError(f"gpu_job holds {per_out.shape[1]} records per sample, the views make {outputs}")
        if ops is not None and ops.ndim == 3:
            ops = ops[:, None]
        ahead_ns = 0
        ahead_places = None
        decode_pos, pix = _split(jobs)
        if pending is not None:
            pos, rec, datas, decoded, ahead_places, ahead_ns = pending.result()
            waited = time.perf_counter_ns() - t0
            for c in (self._counts, self.totals):
                c[3] += waited
        else:
            pos = decode_pos
            rec = _first(jobs)[pos].astype(np.int64)
            datas = None
            decoded = None
            hw = self._hw_decode(rec, arena, stream) if self.backend == "nvimgcodec" and len(pos) else None
            if hw is not None:
                decoded, ahead_places = [(hw[0], hw[2])] * len(pos), hw[1]
        if len(pos) + len(pix) == 0:
            self.last_call_ns = 0
            return []
        decoded_here = len(pos)
        # One batched hardware decode into one buffer (its places an array, computed with the
        # decode): every sample decoded, its place known.
        batched = isinstance(ahead_places, np.ndarray)
        if not len(pos):
            images: list[Any] = []
            failed: list[tuple[int, str]] = []
            fallbacks = 0
        elif batched:
            buf, ready = decoded[0]  # type: ignore[index]
            self._adopt(buf, ready, stream)
            images = [buf] * len(pos)
            failed = []
            fallbacks = 0
        else:
            images, failed, fallbacks = self._decode(_slices(rec, arena) if datas is None else datas, stream, decoded)
            self._keep.append(images)
        # Where each image lies (read ahead in the decode thread for the kernel; here for images
        # the host decoded instead). A decoded image of another size than the server probed is
        # refused like a failed decode.
        if batched or not len(pos):
            at = ahead_places if batched else np.zeros((0, 6), dtype=np.int64)
        else:
            places = list(ahead_places) if ahead_places is not None else [None] * len(pos)
            for i in range(len(pos)):
                if places[i] is None and images[i] is not None:
                    places[i] = _place(images[i])
            at = np.array([p if p is not None else (0,) * 6 for p in places], dtype=np.int64).reshape(-1, 6)
        if len(pix):
            # 1.11: the pixel samples, after the decoded ones: their pixels copied to the device
            # in one go, finished by the same geometry and steps.
            prec = _first(jobs)[pix].astype(np.int64)
            pat, pimages = self._pixels(prec, arena, stream)
            pos, at = np.concatenate([pos, pix]), np.concatenate([at, pat])
            rec = np.concatenate([rec.reshape(-1, RECORD_LEN), prec])
            images = [*images, *pimages]
        ok = [i for i in range(len(pos)) if images[i] is not None]
        wrong = (at[:, 2] != rec[:, _C["src_width"]]) | (at[:, 1] != rec[:, _C["src_height"]])
        for i in [i for i in ok if wrong[i]]:
            failed.append(
                (i, f"the GPU decoder made a {at[i, 2]}x{at[i, 1]} image where the header says {rec[i, 2]}x{rec[i, 3]}")
            )
            ok.remove(i)
        if ok and batched and self._chroma is not None:
            # Pixel samples' records say no chroma (bits 5-7 zero): only decoded ones are rebuilt.
            self.rebuild_chroma(rec[ok], at[ok])
        # Each view's outputs of every sample in one go (their rows of the view's tensor, as one
        # [n * count, ...] batch): launches per batch depend on the views, not on the samples.
        j0 = 0
        for out, count in zip(images_out, self.counts, strict=True):
            flat = out if count == 1 else out.view(-1, *out.shape[2:])
            recs = per_out[pos[ok], j0 : j0 + count].reshape(-1, RECORD_LEN).astype(np.int64)
            rows = (pos[ok].astype(np.int64)[:, None] * count + np.arange(count)[None, :]).reshape(-1)
            src = np.repeat(np.asarray(ok, dtype=np.int64), count)
            if ok and self._kernel is not None:
                table = np.concatenate([at[src][:, [0, 3, 4, 5]], recs[:, 4:], rows[:, None]], axis=1)
                self._kernel.finish(self._upload(table), flat, self.layout)
            # In chunks of about 2^28 padded crop values (0.5 GiB in fp16) at most: large photos.
            elif ok:
                area = int(recs[:, _C["pre_height"]].max()) * int(recs[:, _C["pre_width"]].max()) * 3
                step = max(1, (1 << 28) // max(area, 1))
                for c in range(0, len(rows), step):
                    part = slice(c, c + step)
                    self._finish(recs[part], [images[i] for i in src[part]], flat, rows[part])
            steps = None if ops is None or not ok else ops[pos[ok], j0 : j0 + count].reshape(len(rows), *ops.shape[2:])
            # A view without per-image ops has empty tables (kind 0) beside one that has them.
            if steps is not None and steps[:, :, 0].any():
                self._run_steps(flat, steps, rows)
            j0 += count
        self.last_call_ns = time.perf_counter_ns() - t0
        for c in (self._counts, self.totals):
            # `gpu_samples` (control.md, `stats`) counts the samples decoded here, not the
            # pixel samples the server decoded.
            c[0] += sum(1 for i in ok if i < decoded_here)
            c[1] += self.last_call_ns + ahead_ns
            c[2] += fallbacks
        self.pixel_samples += len(pix)
        if failed:
            raise DecodeError([(int(pos[i]), r) for i, r in failed])
        return [int(p) for p in pos]

    def _pixels(self, rec: np.ndarray, arena: np.ndarray, stream: Any) -> tuple[np.ndarray, list[Any]]:
        """1.11: the pixel samples of records ``rec``: their bytes of ``arena`` (the ring slot's,
        registered with CUDA) copied to the device in one asynchronous copy on ``stream`` (the
        copy stream, before the slot's copy event: the slot is released only after the copy has
        read it), and where each image lies there (:func:`_place`'s columns), with the images
        as ``[h, w, 3]`` tensors where the matrix products need them (else ``None``: the kernel
        reads the places)."""
        import torch

        w, h = rec[:, _C["src_width"]], rec[:, _C["src_height"]]
        off, length = rec[:, _C["offset"]], rec[:, _C["length"]]
        bad = length != w * h * 3
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(
                f"a pixel sample's record says {int(length[i])} bytes for a {int(w[i])}x{int(h[i])} image (ring.md, "
                "'Decoded pixels')"
            )
        lo, hi = int(off.min()), int((off + length).max())
        src = torch.from_numpy(arena[lo:hi])
        if self.device.type == "cuda":
            s = stream if stream is not None else torch.cuda.current_stream(self.device)
            with torch.cuda.stream(s):
                # From the caching allocator on the stream that writes and reads it.
                buf = torch.empty(hi - lo, dtype=torch.uint8, device=self.device)
                buf.copy_(src, non_blocking=True)
        else:
            buf = src.clone()
        base = buf.data_ptr() - lo
        ones = np.ones_like(w)
        places = np.stack([base + off, h, w, w * 3, 3 * ones, ones], axis=1).astype(np.int64)
        # The buffer is not kept: it came from the caching allocator on the stream whose kernels
        # read it, so a later allocation of its block is ordered after them.
        if self._kernel is not None:
            return places, [buf] * len(rec)
        rows = zip(off, length, w, h, strict=True)
        return places, [buf[o - lo : o - lo + n].view(int(y), int(x), 3) for o, n, x, y in rows]

    @property
    def steps_path(self) -> str:
        """How the per-image steps run now: ``"triton"`` or ``"torch"`` (``RINGFEED_GPU_OPS``)."""
        return "triton" if self._ops_kernel is not None else "torch"

    def _run_steps(self, image: Any, records: np.ndarray, rows: np.ndarray) -> None:
        """The ``gpu_ops`` ``records`` of batch rows ``rows`` on ``image``, after the geometry."""
        if self._ops_kernel is not None:
            try:
                self._ops_kernel.run(image, records, rows, self.layout)
                return
            except ValueError:
                raise
            except Exception as e:  # a kernel variant that fails to compile: nothing was written back yet
                if self._ops_choice == "triton":
                    raise
                log.warning("ringfeed: the Triton step kernels failed (%r); using PyTorch ops from now on", e)
                self._ops_kernel = None
        from . import ops as gops

        table = gops.OpTable.from_records(records, _size_of(image, self.layout), rows=rows, device=self.device)
        gops.apply(image, table, self.layout)

    def rebuild_chroma(self, rec: np.ndarray, at: np.ndarray) -> int:
        """Rebuilds interpolated chroma in place (``RINGFEED_GPU_CHROMA=rebuild``) in the decoded
        images at ``at`` (:func:`_place`'s columns; interleaved RGB) of the records ``rec``, on the
        current stream, for those whose JPEG subsamples chroma by two (``gpu_job[16]`` bits 5-7,
        1.4; a 1.3 server's "not said" is left as decoded). Returns how many it rebuilt."""
        codes = chroma_of(rec[:, _C["flags"]].astype(np.int64))
        fh, fv = _BLOCKS[codes, 0], _BLOCKS[codes, 1]
        # The kernels read interleaved RGB (3 bytes a pixel): nvJPEG's batched output is.
        sub = (fh * fv > 1) & (at[:, 4] == 3) & (at[:, 5] == 1)
        if not sub.any():
            return 0
        rows = np.stack([at[:, 0], at[:, 1], at[:, 2], at[:, 3], fh, fv], axis=1)[sub]
        self._chroma.rebuild(self._upload(rows), rows)
        return int(sub.sum())

    def _upload(self, a: np.ndarray) -> Any:
        """``a`` on the device without waiting: from pinned memory, asynchronously on the current
        (copy) stream. A pageable copy would block the host until the stream's queued work (this
        batch's copy and decode) had finished."""
        import torch

        t = torch.from_numpy(np.ascontiguousarray(a))
        if self.device.type != "cuda":
            return t
        # The caching host allocator keeps the pinned block until the copy has run.
        return t.pin_memory().to(self.device, non_blocking=True)

    def _finish(self, rec: np.ndarray, images: list[Any], image: Any, pos: np.ndarray) -> None:
        """The geometry of ``images`` (their ``rec`` records) into rows ``pos`` of ``image``."""
        import torch

        k = len(images)
        oh, ow = _size_of(image, self.layout)
        ph, pw = int(rec[:, _C["pre_height"]].max()), int(rec[:, _C["pre_width"]].max())
        x = torch.zeros((k, ph, pw, 3), dtype=self.dtype, device=self.device)
        for i, img in enumerate(images):
            left, top, w, h = (int(v) for v in rec[i, 4:8])
            x[i, :h, :w] = img[top : top + h, left : left + w]
        # One upload for the records and the rows they go to.
        both = self._upload(np.concatenate([rec, np.asarray(pos, dtype=np.int64)[:, None]], axis=1))
        r, where = both[:, :RECORD_LEN], both[:, RECORD_LEN]
        flags = r[:, _C["flags"]]
        interp = (flags >> INTERPOLATION_SHIFT) & 3
        antialias = (flags & ANTIALIAS) != 0
        wy, vy = axis_weights(
            oh,
            ph,
            r[:, _C["pre_top"]],
            r[:, _C["pre_height"]],
            r[:, _C["resize_height"]],
            r[:, _C["win_top"]],
            r[:, _C["valid_top"]],
            r[:, _C["valid_height"]],
            interp,
            antialias,
            (flags & FLIP_Y) != 0,
        )
        wx, vx = axis_weights(
            ow,
            pw,
            r[:, _C["pre_left"]],
            r[:, _C["pre_width"]],
            r[:, _C["resize_width"]],
            r[:, _C["win_left"]],
            r[:, _C["valid_left"]],
            r[:, _C["valid_width"]],
            interp,
            antialias,
            (flags & FLIP_X) != 0,
        )
        # Rows, then columns: [k, oh, ph] @ [k, ph, pw*3] -> [k, oh, pw, 3] -> [k, oh*3, pw] @ [k, pw, ow].
        # (Two plain bmm's: a broadcasting matmul would materialise the weights oh times over.)
        y = torch.bmm(wy.to(self.dtype), x.view(k, ph, pw * 3)).view(k, oh, pw, 3).permute(0, 1, 3, 2)
        y = y.reshape(k, oh * 3, pw)
        z = torch.bmm(y, wx.to(self.dtype).transpose(1, 2)).view(k, oh, 3, ow).float()
        fill = r[:, _C["fill"]]
        fill = torch.stack([fill & 255, (fill >> 8) & 255, (fill >> 16) & 255], 1).float()  # [k, 3]
        mask = (vy[:, :, None] & vx[:, None, :])[:, :, None, :]  # [k, oh, 1, ow]
        z = torch.where(mask, z, fill[:, None, :, None])
        z = z.round_().clamp_(0, 255).to(torch.uint8)
        z = z.permute(0, 1, 3, 2) if self.layout == "NHWC" else z.permute(0, 2, 1, 3)
        image.index_copy_(0, where, z.contiguous())
