"""nvJPEG's batched hardware decoder (``ringfeed.gpu.nvjpeg``): how it is chosen, and on a GPU with a
hardware JPEG decoder, that its pixels are nvImageCodec's and a batch it refuses is named."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from ringfeed.gpu import nvjpeg


def test_an_unknown_decoder_choice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGFEED_GPU_DECODER", "nvdec")
    with pytest.raises(ValueError, match="RINGFEED_GPU_DECODER must be 'auto', 'nvjpeg' or 'nvimgcodec'"):
        nvjpeg.open_hardware(torch.device("cpu"))


def test_without_the_library_auto_says_why_and_nvjpeg_raises(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    missing = str(tmp_path / "libnvjpeg.so.13")
    monkeypatch.setenv("RINGFEED_NVJPEG_LIB", missing)
    dec, why = nvjpeg.open_hardware(torch.device("cpu"))
    assert dec is None
    assert missing in why
    assert "RINGFEED_NVJPEG_LIB" in why
    monkeypatch.setenv("RINGFEED_GPU_DECODER", "nvjpeg")
    with pytest.raises(ValueError, match="RINGFEED_GPU_DECODER=nvjpeg: nvJPEG's hardware decoder cannot run here"):
        nvjpeg.open_hardware(torch.device("cpu"))
    monkeypatch.setenv("RINGFEED_GPU_DECODER", "nvimgcodec")
    assert nvjpeg.open_hardware(torch.device("cpu")) == (None, "RINGFEED_GPU_DECODER=nvimgcodec")


@pytest.mark.parametrize("raw", ["0", "9", "two"])
def test_a_bad_decode_thread_count_is_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    from ringfeed.gpu import hybrid

    monkeypatch.setenv("RINGFEED_GPU_DECODE_THREADS", raw)
    with pytest.raises(
        ValueError, match=f"RINGFEED_GPU_DECODE_THREADS must be a whole number from 1 to 8, not '{raw}'"
    ):
        hybrid._decode_threads()
    monkeypatch.setenv("RINGFEED_GPU_DECODE_THREADS", "3")
    assert hybrid._decode_threads() == 3
    # Only the batched hardware decoder decodes in several threads (and the loader takes that
    # many batches ahead); the host and nvImageCodec image by image use one.
    f = hybrid.Finisher(torch.device("cpu"), "host", "NHWC", (8, 8), geometry="bmm")
    assert f.decode_threads == 1
    f.close()


def test_chroma_is_replicated_unless_interpolation_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """``RINGFEED_GPU_CHROMA``: unset, ``replicate`` or ``rebuild`` asks nvJPEG for no flags,
    ``interpolate`` for interpolated upsampling; anything else is refused by name, before any
    library is looked for."""
    monkeypatch.delenv("RINGFEED_GPU_CHROMA", raising=False)
    assert nvjpeg.chroma_flags() == 0
    monkeypatch.setenv("RINGFEED_GPU_CHROMA", "replicate")
    assert nvjpeg.chroma_flags() == 0
    monkeypatch.setenv("RINGFEED_GPU_CHROMA", "interpolate")
    assert nvjpeg.chroma_flags() == nvjpeg.FLAGS_UPSAMPLING_WITH_INTERPOLATION == 32
    monkeypatch.setenv("RINGFEED_GPU_CHROMA", "rebuild")  # replicated, then rebuilt on the GPU
    assert nvjpeg.chroma_flags() == 0
    assert nvjpeg.chroma_mode() == "rebuild"
    monkeypatch.setenv("RINGFEED_GPU_CHROMA", "fancy")
    with pytest.raises(
        ValueError, match="RINGFEED_GPU_CHROMA must be 'replicate', 'interpolate' or 'rebuild', not 'fancy'"
    ):
        nvjpeg.open_hardware(torch.device("cpu"))


def test_the_pipelining_experiment_adds_its_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """``RINGFEED_NVJPEG_PIPELINE=0`` adds nvJPEG's ``NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE`` (1) to
    the chroma mode's flags; unset or 1 adds nothing; anything else is refused by name."""
    monkeypatch.delenv("RINGFEED_GPU_CHROMA", raising=False)
    monkeypatch.delenv("RINGFEED_NVJPEG_PIPELINE", raising=False)
    assert nvjpeg.chroma_flags() == 0
    monkeypatch.setenv("RINGFEED_NVJPEG_PIPELINE", "0")
    assert nvjpeg.chroma_flags() == nvjpeg.FLAGS_HW_DECODE_NO_PIPELINE == 1
    monkeypatch.setenv("RINGFEED_GPU_CHROMA", "interpolate")
    assert nvjpeg.chroma_flags() == 33
    monkeypatch.setenv("RINGFEED_NVJPEG_PIPELINE", "1")
    assert nvjpeg.chroma_flags() == 32
    monkeypatch.setenv("RINGFEED_NVJPEG_PIPELINE", "off")
    with pytest.raises(ValueError, match="RINGFEED_NVJPEG_PIPELINE must be 0 or 1, not 'off'"):
        nvjpeg.open_hardware(torch.device("cpu"))


def test_the_image_record_is_nvjpeg_13s() -> None:
    """``nvjpegImage_t`` of nvjpeg.h 13.0: four channel pointers, then four ``size_t`` pitches."""
    assert nvjpeg.IMAGE_DTYPE.itemsize == 64
    assert nvjpeg.IMAGE_DTYPE.fields["pitch"][1] == 32
    assert nvjpeg.CHECKED_MAJORS == (13,)


def _hardware() -> nvjpeg.HardwareDecoder | None:
    if not torch.cuda.is_available():
        return None
    dec, _ = nvjpeg.open_hardware(torch.device("cuda"))
    return dec


def _jpeg(seed: int, w: int, h: int, **kw: object) -> bytes:
    rng = np.random.default_rng(seed)
    # Smooth content (as photos are), so that subsampling and the IDCT differ by little.
    base = rng.integers(0, 255, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
    img = Image.fromarray(base).resize((w, h), Image.BILINEAR)
    out = io.BytesIO()
    img.save(out, "JPEG", quality=90, **kw)
    return out.getvalue()


@pytest.mark.skipif(_hardware() is None, reason="needs a GPU with a hardware JPEG decoder and libnvjpeg.so.13")
def test_one_batched_call_gives_nvimgcodecs_pixels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Baseline 4:2:0, 4:4:4, 4:2:2 and grey JPEGs of several sizes in one batch, decoded into one
    buffer at their pitches, are Pillow's pixels (and nvImageCodec's) within a level or two with
    ``RINGFEED_GPU_CHROMA=interpolate``; the default, replicated chroma, gives the same pixels
    for 4:4:4 and grey and differs from Pillow's only where chroma is subsampled."""
    nvimgcodec = pytest.importorskip("nvidia.nvimgcodec", reason="compares against nvImageCodec, not installed")

    monkeypatch.setenv("RINGFEED_GPU_CHROMA", "interpolate")

    cases = [
        _jpeg(1, 64, 48),
        _jpeg(2, 333, 250, subsampling=0),
        _jpeg(3, 500, 375),
        _jpeg(4, 120, 200, subsampling=1),
    ]
    grey = io.BytesIO()
    Image.fromarray(np.random.default_rng(5).integers(0, 255, (40, 56), dtype=np.uint8)).save(grey, "JPEG")
    cases.append(grey.getvalue())
    arena = torch.from_numpy(np.frombuffer(b"".join(cases), dtype=np.uint8).copy()).pin_memory()
    lens = np.array([len(c) for c in cases], dtype=np.uint64)
    offs = np.concatenate([[0], np.cumsum(lens[:-1])]).astype(np.uint64)
    sizes = [Image.open(io.BytesIO(c)).size for c in cases]
    out_offs = np.concatenate([[0], np.cumsum([w * h * 3 for w, h in sizes[:-1]])]).astype(np.uint64)
    buf = torch.zeros(sum(w * h * 3 for w, h in sizes), dtype=torch.uint8, device="cuda")

    def decode_all(dec: nvjpeg.HardwareDecoder | None) -> None:
        assert dec is not None
        buf.zero_()
        pitches = np.array([w * 3 for w, _ in sizes], dtype=np.uint64)
        stream = torch.cuda.current_stream().cuda_stream
        dec.decode(arena.data_ptr() + offs, lens, buf.data_ptr() + out_offs, pitches, stream)
        torch.cuda.synchronize()

    dec = _hardware()
    decode_all(dec)
    ref = nvimgcodec.Decoder(backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY)])
    for k, ((w, h), data) in enumerate(zip(sizes, cases, strict=True)):
        ours = buf[int(out_offs[k]) : int(out_offs[k]) + w * h * 3].view(h, w, 3).cpu().int()
        theirs = torch.as_tensor(ref.decode(data), device="cuda").cpu().int()
        pil = torch.from_numpy(np.array(Image.open(io.BytesIO(data)).convert("RGB"))).int()
        # With interpolated chroma upsampling (libjpeg's "fancy" upsampling) the hardware decoder
        # gives Pillow's pixels within a level (on the H200: means 0.00, maxima 1), as
        # nvImageCodec's does; replicated chroma was 3-5 levels off on average and up to 37.
        assert float((ours - pil).abs().float().mean()) < 0.25, k
        assert int((ours - pil).abs().max()) <= 2, k
        assert float((ours - theirs).abs().float().mean()) < 0.25, k
    assert dec is not None
    dec.close()
    dec.close()
    monkeypatch.setenv("RINGFEED_GPU_CHROMA", "replicate")
    rep = _hardware()
    decode_all(rep)
    for k, ((w, h), data) in enumerate(zip(sizes, cases, strict=True)):
        ours = buf[int(out_offs[k]) : int(out_offs[k]) + w * h * 3].view(h, w, 3).cpu().int()
        pil = torch.from_numpy(np.array(Image.open(io.BytesIO(data)).convert("RGB"))).int()
        off = float((ours - pil).abs().float().mean())
        if k in (1, 4):  # 4:4:4 and grey: nothing to upsample
            assert off < 0.25, k
        else:
            assert 0.25 < off < 8.0, (k, off)
    assert rep is not None
    rep.close()


@pytest.mark.skipif(_hardware() is None, reason="needs a GPU with a hardware JPEG decoder and libnvjpeg.so.13")
def test_a_batch_with_a_progressive_jpeg_is_refused_by_name() -> None:
    """The hardware decoder takes baseline JPEGs only: a batch holding a progressive one raises
    HardwareRefusedError naming the call and nvJPEG's status (the Finisher then decodes that batch
    with nvImageCodec)."""
    cases = [_jpeg(1, 64, 48), _jpeg(2, 64, 48, progressive=True)]
    arena = torch.from_numpy(np.frombuffer(b"".join(cases), dtype=np.uint8).copy()).pin_memory()
    lens = np.array([len(c) for c in cases], dtype=np.uint64)
    buf = torch.zeros(2 * 64 * 48 * 3, dtype=torch.uint8, device="cuda")
    dec = _hardware()
    assert dec is not None
    with pytest.raises(nvjpeg.HardwareRefusedError, match=r"nvjpegDecodeBatched failed: nvJPEG status \d+"):
        dec.decode(
            np.array([arena.data_ptr(), arena.data_ptr() + len(cases[0])], dtype=np.uint64),
            lens,
            np.array([buf.data_ptr(), buf.data_ptr() + 64 * 48 * 3], dtype=np.uint64),
            np.array([64 * 3, 64 * 3], dtype=np.uint64),
            torch.cuda.current_stream().cuda_stream,
        )
    dec.close()
