"""nvJPEG's hardware decoder, one call per batch, without holding the GIL (hybrid decode).

nvImageCodec's Python ``Decoder.decode`` makes a Python object, a code stream and a device
allocation per image, and hands the GIL back and forth for each: beside a training step in the
same process, every hand-off waits for the training thread to let go of the GIL, and the training
thread then waits for it back. On the H200 that cost ResNet-18's step 35-42 % at 160 GPU images per
step whatever nvImageCodec's CPU threads or the input's memory (``benches/e2e/hybrid_step.py``,
``benches/results/2026-12-01-h200-nvjpeg``), although the model's kernels took no longer: the gaps
were on the host. This module calls ``nvjpegDecodeBatched`` of nvJPEG's hardware backend through
``ctypes``, which releases the GIL for the whole call: one batched decode of every image into one
device buffer that the caller allocates (PyTorch's caching allocator, so no ``cudaMalloc`` in the
steady state), with no Python per image.

The hardware backend decodes baseline JPEGs of one scan, 4:4:4, 4:2:2, 4:2:0, 4:4:0 or grey. A
batch it refuses (an extended-sequential or 4:1:1 file, a corrupt one) raises :class:`HardwareRefusedError`
and the caller decodes that batch with nvImageCodec, image by image. ``libnvjpeg.so.13`` (the
``nvidia-nvjpeg`` wheel of CUDA 13, which ``ringfeed[gpu-cu13]`` installs) is the only version
whose ``nvjpegImage_t`` layout this module was checked against (``size_t`` pitches); with another,
:func:`open_hardware` says why it is not used and hybrid decode keeps nvImageCodec's decoder.
"""

from __future__ import annotations

import base64
import ctypes
import os
from pathlib import Path
from typing import Any

import numpy as np

#: nvjpeg.h (13.0): nvjpegBackend_t, nvjpegOutputFormat_t, nvjpegChromaSubsampling_t, libraryPropertyType.
BACKEND_HARDWARE = 3
OUTPUT_YUV = 1
OUTPUT_RGBI = 5
#: Two planes: Y, then Cb and Cr interleaved at half the width and height (4:2:0 only).
OUTPUT_NV12 = 8
#: nvjpeg.h's NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION: chroma upsampled as libjpeg's "fancy"
#: upsampling does (Pillow's and the server's decoder). Without it the hardware decoder replicates
#: chroma: 4.7 levels off Pillow on average and up to 37 on a 4:2:0 photo, against 0.00 and 1 with
#: it (H200, benches/e2e/nvjpeg_upsampling.py). But with it nvJPEG takes another path (the engine
#: writes planar YCbCr, then a kernel per image converts it), and that path slows a model training
#: beside it: ResNet-18's step by 36-42 % at 160 images a step, against 4 % for replicated chroma,
#: whichever stream the model is on, with only 0.6 ms of GPU work a batch of its own
#: (benches/results/2026-12-01-h200-chroma). So :data:`CHROMA` chooses, and replicated is the default.
FLAGS_UPSAMPLING_WITH_INTERPOLATION = 1 << 5
#: ``RINGFEED_GPU_CHROMA`` values -> ``nvjpegCreateEx`` flags: ``replicate`` (the default: the
#: hardware's own chroma, fast beside a model), ``interpolate`` (Pillow's pixels, slow beside one)
#: or ``rebuild`` (the hardware's replicated chroma, then interpolated chroma rebuilt from it on the
#: GPU before the finishing kernel: ``ringfeed.gpu.chroma_kernel``; beside ResNet-18 on the H200 the
#: decode, the rebuild and the kernel slowed its step by 15.5 %, benches/results/2026-12-02-h200-tiled).
CHROMA = {"replicate": 0, "interpolate": FLAGS_UPSAMPLING_WITH_INTERPOLATION, "rebuild": 0}
CSS_420 = 2
MAJOR_VERSION = 0
STATUS = {
    0: "success",
    1: "not initialized",
    2: "invalid parameter",
    3: "bad JPEG",
    4: "JPEG not supported",
    5: "allocator failure",
    6: "execution failed",
    7: "architecture mismatch",
    8: "internal error",
    9: "implementation not supported",
    10: "incomplete bitstream",
}
#: ``nvjpegImage_t`` of nvJPEG 13: ``unsigned char *channel[4]; size_t pitch[4];`` (64 bytes).
IMAGE_DTYPE = np.dtype([("channel", "<u8", (4,)), ("pitch", "<u8", (4,))])
assert IMAGE_DTYPE.itemsize == 64
#: The nvJPEG major versions whose ``nvjpegImage_t`` is :data:`IMAGE_DTYPE`.
CHECKED_MAJORS = (13,)


class NvjpegError(RuntimeError):
    """An nvJPEG call failed: ``status`` is its ``nvjpegStatus_t``."""

    def __init__(self, call: str, status: int) -> None:
        super().__init__(f"{call} failed: nvJPEG status {status} ({STATUS.get(status, 'unknown')})")
        self.call = call
        self.status = status


class HardwareRefusedError(NvjpegError):
    """The hardware decoder refused a batch (decode it another way)."""


def _library_paths() -> list[str]:
    """Where ``libnvjpeg.so.13`` may be: ``RINGFEED_NVJPEG_LIB``, the ``nvidia`` wheels' folders,
    then the loader's search path."""
    env = os.environ.get("RINGFEED_NVJPEG_LIB")
    if env:
        return [env]
    found: list[str] = []
    try:
        import nvidia

        for root in list(getattr(nvidia, "__path__", [])):
            found += sorted(str(p) for p in Path(root).glob("*/lib/libnvjpeg.so.*"))
    except ImportError:
        pass
    return [*found, "libnvjpeg.so.13"]


def _load() -> tuple[Any, str]:
    errors = []
    for path in _library_paths():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise OSError(
        "libnvjpeg.so.13 not found (`pip install nvidia-nvjpeg`, or RINGFEED_NVJPEG_LIB): " + "; ".join(errors)
    )


#: A 64x64 baseline 4:2:0 JPEG (colour ramps, Pillow at quality 75): what :meth:`HardwareDecoder.warm`
#: decodes, so that the engine's first decode and its buffers happen at construction.
WARM_JPEG = base64.b64decode(
    "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAgGBgcGBQgHBwcJCQgKDBQNDAsLDBkSEw8UHRofHh0aHBwgJC4nICIsIxwc"
    "KDcpLDAxNDQ0Hyc5PTgyPC4zNDL/2wBDAQkJCQwLDBgNDRgyIRwhMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIy"
    "MjIyMjIyMjIyMjIyMjIyMjIyMjL/wAARCABAAEADASIAAhEBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAAAAECAwQFBgcI"
    "CQoL/8QAtRAAAgEDAwIEAwUFBAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAkM2JyggkKFhcYGRol"
    "JicoKSo0NTY3ODk6Q0RFRkdISUpTVFVWV1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKTlJWWl5iZmqKjpKWmp6ip"
    "qrKztLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uHi4+Tl5ufo6erx8vP09fb3+Pn6/8QAHwEAAwEBAQEBAQEBAQAAAAAA"
    "AAECAwQFBgcICQoL/8QAtREAAgECBAQDBAcFBAQAAQJ3AAECAxEEBSExBhJBUQdhcRMiMoEIFEKRobHBCSMzUvAVYnLR"
    "ChYkNOEl8RcYGRomJygpKjU2Nzg5OkNERUZHSElKU1RVVldYWVpjZGVmZ2hpanN0dXZ3eHl6goOEhYaHiImKkpOUlZaX"
    "mJmaoqOkpaanqKmqsrO0tba3uLm6wsPExcbHyMnK0tPU1dbX2Nna4uPk5ebn6Onq8vP09fb3+Pn6/9oADAMBAAIRAxEA"
    "PwDw2O39qtx2/tVqO39qtx2/tQmFCuVo7f2q3Hb+1WY7f2q5Hb+1apntUK5Wjt/arcdv7VZjt/arkdv7Vome1QrlWO39"
    "quR2/tVmO39qtx2/tWqZ7WHrnCR2/tVyO39qsx2/tVuO39q8xM/F6FcrR2/tVuO39qtR2/tVuO39q1TPaoVytHb+1W47"
    "f2qzHb+1XI7f2rVM9qhXK0dv7Vbjt/arMdv7Vcjt/atEz2qFc4OO39quR2/tVmO39qtx2/tXmpn4vQrlaO39quR2/tVm"
    "O39qtx2/tWiZ7VCuVo7f2q3Hb+1Wo7f2q3Hb+1apntUK5Wjt/arcdv7VZjt/arkdv7Vqme1QrnCR2/tVuO39qsx2/tVy"
    "O39q8xM/F8PXKsdv7Vcjt/arMdv7Vbjt/atUz2qFcrR2/tVyO39qsx2/tVuO39q0TPaoVytHb+1W47f2q1Hb+1W47f2r"
    "VM9qhXP/2Q=="
)


class HardwareDecoder:
    """One nvJPEG handle on the hardware backend, with its decode state; used from one thread.

    Args:
        device: the CUDA device (a ``torch.device``); :meth:`decode`'s caller must have it current.
        flags: ``nvjpegCreateEx``'s flags; by default :func:`chroma_flags`'s.
    """

    def __init__(self, device: Any, flags: int | None = None) -> None:
        if flags is None:
            flags = chroma_flags()
        lib, self.path = _load()
        self._lib = lib
        vp, i32, u32p = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint)
        for name, args in {
            "nvjpegGetProperty": [i32, ctypes.POINTER(i32)],
            "nvjpegCreateEx": [i32, vp, vp, ctypes.c_uint, ctypes.POINTER(vp)],
            "nvjpegGetHardwareDecoderInfo": [vp, u32p, u32p],
            "nvjpegJpegStateCreate": [vp, ctypes.POINTER(vp)],
            "nvjpegDecodeBatchedPreAllocate": [vp, vp, i32, i32, i32, i32, i32],
            "nvjpegDecodeBatchedInitialize": [vp, vp, i32, i32, i32],
            "nvjpegDecodeBatched": [vp, vp, vp, vp, vp, vp],
            "nvjpegJpegStateDestroy": [vp],
            "nvjpegDestroy": [vp],
        }.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, i32
        major = ctypes.c_int()
        self._check("nvjpegGetProperty", lib.nvjpegGetProperty(MAJOR_VERSION, ctypes.byref(major)))
        if major.value not in CHECKED_MAJORS:
            raise OSError(f"{self.path} is nvJPEG {major.value}; ringfeed's batched path knows nvJPEG {CHECKED_MAJORS}")
        import torch

        self.device = device
        self._handle, self._state = ctypes.c_void_p(), ctypes.c_void_p()
        with torch.cuda.device(device):
            self._open(flags)

    def _open(self, flags: int) -> None:
        lib = self._lib
        self._check(
            "nvjpegCreateEx", lib.nvjpegCreateEx(BACKEND_HARDWARE, None, None, flags, ctypes.byref(self._handle))
        )
        engines, cores = ctypes.c_uint(), ctypes.c_uint()
        status = lib.nvjpegGetHardwareDecoderInfo(self._handle, ctypes.byref(engines), ctypes.byref(cores))
        if status != 0 or engines.value == 0:
            self.close()
            raise OSError(f"this GPU has no hardware JPEG decoder (nvjpegGetHardwareDecoderInfo: status {status})")
        self.engines, self.cores = engines.value, cores.value
        self._check("nvjpegJpegStateCreate", lib.nvjpegJpegStateCreate(self._handle, ctypes.byref(self._state)))
        # The decoder's memory pool (as nvImageCodec does): buffers are kept and grown, not
        # allocated and freed per batch (cudaFree waits for the whole device).
        self._check(
            "nvjpegDecodeBatchedPreAllocate",
            lib.nvjpegDecodeBatchedPreAllocate(self._handle, self._state, 1, 1, 1, CSS_420, OUTPUT_RGBI),
        )

    @staticmethod
    def _check(call: str, status: int) -> None:
        if status != 0:
            raise NvjpegError(call, status)

    def decode(
        self,
        data: np.ndarray,
        lengths: np.ndarray,
        out: np.ndarray,
        pitch: np.ndarray,
        stream: int,
        output: int = OUTPUT_RGBI,
    ) -> None:
        """Decodes ``len(data)`` JPEGs to ``output`` (interleaved RGB, or planar Y, Cb, Cr at their
        own sizes with :data:`OUTPUT_YUV`), on ``stream`` (a ``cudaStream_t``).

        ``data``: host addresses of the encoded images (uint64; memory that stays valid, pinned
        for speed); ``lengths``: their sizes; ``out``: device addresses of their outputs, and
        ``pitch`` their bytes a row: ``[n]`` for the one interleaved plane (``3·width`` or more
        times the height), ``[n, k]`` for ``k`` planes. The call returns once the work is queued
        on ``stream``. What may be read or written after it returns: the encoded bytes are copied
        to the device by copies queued on ``stream`` (they must stay valid until the stream's work
        up to here has run: the loader holds the slot until the batch's copy event, which
        follows), and the outputs are written before the stream's next work (nvJPEG's own streams
        join ``stream``); the address arrays are read during the call only.

        The hardware's own downscale and region decode (``nvjpegDecodeBatchedEx``) are not offered:
        on the H200 they saved nothing on the corpus (8.4-8.7 ms a batch of 192 against 8.05 for
        the whole decode) and the downscale by 2 came out 57 levels from the whole decode pooled
        (``benches/results/2026-12-02-h200-final``).

        Raises:
            HardwareRefusedError: the hardware decoder refused the batch (nothing was written that
                the caller may use; decode the batch another way).
        """
        dst, ptrs, sizes = self._prepare(data, lengths, out, pitch, output)
        lib = self._lib
        args = (self._handle, self._state, ptrs.ctypes.data, sizes.ctypes.data, dst.ctypes.data)
        # ctypes releases the GIL for the call: the whole batch decodes without it.
        status = lib.nvjpegDecodeBatched(*args, ctypes.c_void_p(stream))
        if status != 0:
            raise HardwareRefusedError("nvjpegDecodeBatched", status)

    def _prepare(
        self, data: np.ndarray, lengths: np.ndarray, out: np.ndarray, pitch: np.ndarray, output: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The batch's ``nvjpegImage_t`` array, its addresses and sizes, after
        ``nvjpegDecodeBatchedInitialize`` for ``len(data)`` images in ``output``."""
        n = len(data)
        planes = np.asarray(out, dtype=np.uint64).reshape(n, -1)
        pitches = np.asarray(pitch, dtype=np.uint64).reshape(n, -1)
        k = planes.shape[1]
        dst = np.zeros(n, dtype=IMAGE_DTYPE)
        dst["channel"][:, :k] = planes
        dst["pitch"][:, :k] = pitches
        ptrs = np.ascontiguousarray(data, dtype=np.uint64)
        sizes = np.ascontiguousarray(lengths, dtype=np.uint64)
        self._check(
            "nvjpegDecodeBatchedInitialize",
            self._lib.nvjpegDecodeBatchedInitialize(self._handle, self._state, n, 1, output),
        )
        return dst, ptrs, sizes

    def warm(self) -> None:
        """Decodes :data:`WARM_JPEG` on a stream of its own and waits: the first decode of a handle
        (the engine's set-up, its buffers' first allocation) costs hundreds of milliseconds on
        the H200 (``benches/results/2026-12-01-h200-chroma``), which inside a training run's
        first batches reads as slow GPU decode. Raises as :meth:`decode` does."""
        import torch

        data = np.frombuffer(WARM_JPEG, dtype=np.uint8)
        with torch.cuda.device(self.device):
            stream = torch.cuda.Stream()
            out = torch.empty(64 * 64 * 3, dtype=torch.uint8, device=self.device)
            ptrs = np.array([data.ctypes.data], dtype=np.uint64)
            self.decode(ptrs, np.array([len(data)]), np.array([out.data_ptr()]), np.array([64 * 3]), stream.cuda_stream)
            stream.synchronize()

    def close(self) -> None:
        """Frees the state and the handle. Idempotent."""
        lib = self._lib
        if getattr(self, "_state", None) is not None and self._state.value:
            lib.nvjpegJpegStateDestroy(self._state)
            self._state = ctypes.c_void_p()
        if getattr(self, "_handle", None) is not None and self._handle.value:
            lib.nvjpegDestroy(self._handle)
            self._handle = ctypes.c_void_p()


#: nvjpeg.h's NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE: the hardware decoder without its pipelining.
FLAGS_HW_DECODE_NO_PIPELINE = 1


def chroma_flags() -> int:
    """The flags ``RINGFEED_GPU_CHROMA`` asks for (:data:`CHROMA`), with
    :data:`FLAGS_HW_DECODE_NO_PIPELINE` where ``RINGFEED_NVJPEG_PIPELINE=0`` (an experiment:
    whether nvJPEG's pipelined hardware decode, a copy, an event and a sync per image, is what
    slows the training thread's launches beside it)."""
    pipeline = os.environ.get("RINGFEED_NVJPEG_PIPELINE", "1")
    if pipeline not in ("0", "1"):
        raise ValueError(f"RINGFEED_NVJPEG_PIPELINE must be 0 or 1, not {pipeline!r}")
    return CHROMA[chroma_mode()] | (FLAGS_HW_DECODE_NO_PIPELINE if pipeline == "0" else 0)


def chroma_mode() -> str:
    """``RINGFEED_GPU_CHROMA`` (a key of :data:`CHROMA`), ``replicate`` when unset."""
    choice = os.environ.get("RINGFEED_GPU_CHROMA", "replicate")
    if choice not in CHROMA:
        raise ValueError(f"RINGFEED_GPU_CHROMA must be 'replicate', 'interpolate' or 'rebuild', not {choice!r}")
    return choice


def open_hardware(device: Any) -> tuple[HardwareDecoder | None, str]:
    """``(decoder, why)``: nvJPEG's batched hardware decoder on ``device``, or ``None`` and the reason."""
    choice = os.environ.get("RINGFEED_GPU_DECODER", "auto")
    if choice not in ("auto", "nvjpeg", "nvimgcodec"):
        raise ValueError(f"RINGFEED_GPU_DECODER must be 'auto', 'nvjpeg' or 'nvimgcodec', not {choice!r}")
    if choice == "nvimgcodec":
        return None, "RINGFEED_GPU_DECODER=nvimgcodec"
    chroma_flags()  # a bad setting is an error whatever the library
    try:
        return HardwareDecoder(device), "nvJPEG's batched hardware decoder"
    except (OSError, NvjpegError, AttributeError) as e:
        if choice == "nvjpeg":
            raise ValueError(f"RINGFEED_GPU_DECODER=nvjpeg: nvJPEG's hardware decoder cannot run here ({e})") from e
        return None, str(e)
