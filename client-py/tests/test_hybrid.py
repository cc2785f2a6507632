"""Hybrid decode (control.md, "Hybrid decode"): the server hands a share of each batch to the client
as JPEG bytes plus a ``gpu_job`` record, and the client finishes those samples itself.

These tests run the whole path through a real server with the client's ``host`` backend
(``torchvision.io.decode_jpeg`` on the CPU in place of the GPU's decoder): the split, the records,
the arena, the batched geometry and the write into the batch. ``test_cuda.py`` runs the same with
the GPU decoders on a CUDA machine.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from _support import frame_vector
from PIL import Image
from test_pixels import photo

import ringfeed
from ringfeed.gpu import hybrid

RRC = ringfeed.Compose([ringfeed.RandomResizedCrop(32), ringfeed.RandomHorizontalFlip()])


def _jpeg(img: Image.Image, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", **kw)
    return buf.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """An image folder served in place: plain JPEGs the GPU path takes, and files it must leave to the CPU."""
    root = tmp_path_factory.mktemp("hybrid") / "imgs"
    kinds: dict[str, str] = {}

    def put(cls: str, name: str, data: bytes, kind: str) -> None:
        p = root / cls / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        kinds[f"{cls}/{name}"] = kind

    for i in range(24):
        w, h = 60 + 7 * i, 48 + 5 * (i % 6)
        sub = [2, 1, 0][i % 3]  # 4:2:0, 4:2:2, 4:4:4
        put(f"c{i % 3}", f"p{i:02d}.jpg", _jpeg(photo(w, h, i), quality=90, subsampling=sub), "gpu")
    put("c0", "grey.jpg", _jpeg(photo(70, 50, 99).convert("L"), quality=90), "gpu")
    put("c1", "progressive.jpg", _jpeg(photo(66, 54, 98), quality=90, progressive=True), "cpu")
    put("c2", "cmyk.jpg", _jpeg(photo(64, 52, 97).convert("CMYK"), quality=90), "cpu")
    buf = io.BytesIO()
    photo(62, 50, 96).save(buf, "PNG")
    put("c0", "png.png", buf.getvalue(), "cpu")
    exif = Image.Exif()
    exif[0x0112] = 6
    put("c1", "rotated.jpg", _jpeg(photo(72, 44, 95), quality=90, exif=exif.tobytes()), "cpu")
    return root, kinds


def _epoch(
    ds: Path, sock: str, gpu: float | bool | ringfeed.GPUDecode, transform: object = RRC, **kw: object
) -> tuple[list[dict[str, torch.Tensor]], dict[str, object]]:
    """One epoch's batches (on the host) and the stats; the host backend unless ``device="cuda"``
    is given (then the GPU decoder)."""
    backend = {} if kw.get("device") == "cuda" else {"_gpu_backend": "host"}
    if isinstance(gpu, float):
        # A share alone: the samples the server decodes stay the server's (the decoded-pixel
        # path, 1.11, has tests of its own below).
        gpu = ringfeed.GPUDecode(share=gpu, pixels=False)
    with ringfeed.Loader(
        ds,
        6,
        transform,
        server=ringfeed.Server(socket=sock, spawn=True, timeout=60),
        seed=5,
        shuffle=True,
        drop_last=True,
        fields=["index", "crop"],
        gpu_decode=gpu,
        **backend,
        **kw,
    ) as ld:
        out = [{k: v.cpu().clone() for k, v in b.items()} for b in ld]
        stats = ld.stats()
    return out, stats


def test_finishable_pipelines_match_the_server() -> None:
    """The client's rule for which pipelines the GPU can finish (``gpu_decode="auto"`` decides
    by it before asking) gives the server's verdict (``ops::gpu::finishable``) on every pipeline
    of the spec's vectors, and names the reason when it says no."""
    from ringfeed import _images

    vectors = json.loads((Path(__file__).parents[2] / "proto/vectors/control/hybrid.json").read_text())
    cases = vectors["finishable"]
    assert any(c["finishable"] for c in cases)
    assert not all(c["finishable"] for c in cases)
    assert any(c["finishable_1_9"] and not c["finishable_1_7"] for c in cases), "1.8 finishes more"
    assert any(c["finishable"] and not c["finishable_1_9"] for c in cases), "1.10 finishes views"
    for case in cases:
        why = _images.gpu_pipeline_doc_problem(case["pipeline"])
        assert (why is None) == case["finishable"], (case, why)
        one_view = _images.gpu_pipeline_doc_problem(case["pipeline"], views=False)
        assert (one_view is None) == case["finishable_1_9"], (case, one_view)
        before = _images.gpu_pipeline_doc_problem(case["pipeline"], per_image=False, views=False)
        assert (before is None) == case["finishable_1_7"], (case, before)
        if case["finishable"]:
            from ringfeed.gpu import ops as gops

            # The gpu_ops field's steps per output (0: no field) is the client's count too.
            assert gops.steps_per_output(case["pipeline"]) == case["steps"], case


def test_offered_positions_match_the_vectors() -> None:
    """The client's reading of the split rule is the spec's vectors (both languages read them)."""
    vectors = json.loads((Path(__file__).parents[2] / "proto/vectors/control/hybrid.json").read_text())
    for case in vectors["offered"]:
        got = [p for p in range(case["batch"]) if hybrid.offered(p, case["share"])]
        assert got == case["positions"], case
    for case in vectors["records"]:
        assert len(case["record"]) == hybrid.RECORD_LEN
        assert dict(zip(hybrid.COLUMNS, case["record"], strict=True)) == case["fields"]


def test_chroma_codes_match_the_vectors() -> None:
    """``gpu_job[16]`` bits 5-7 (1.4): the client's chroma table names every code the server
    writes as the spec's vectors do, and reads each code out of the flags (the records' chroma
    bits sit beside their geometry bits, which keep their meaning)."""
    vectors = json.loads((Path(__file__).parents[2] / "proto/vectors/control/hybrid.json").read_text())
    assert [c["code"] for c in vectors["chroma"]] == [1, 2, 3, 4, 5, 6]
    for case in vectors["chroma"]:
        assert hybrid.CHROMA[case["code"]][0] == case["name"], case
        assert hybrid.chroma_of(case["flags_bits"]) == case["code"]
        assert hybrid.chroma_of(case["flags_bits"] | 0x1F) == case["code"]
    assert hybrid.CHROMA[0] == ("not said", None)
    flags = np.array([r["fields"]["flags"] for r in vectors["records"]])
    assert [hybrid.CHROMA[int(c)][0] for c in hybrid.chroma_of(flags)] == ["4:2:0", "4:2:2"]
    # The geometry bits of the same records, read as the finishers read them.
    assert list((flags >> hybrid.INTERPOLATION_SHIFT) & 3) == [1, 0]
    assert list(flags & hybrid.FLIP_X) == [1, 0]
    assert list(flags & hybrid.ANTIALIAS) == [16, 0]


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize(
    "transform",
    [
        RRC,
        ringfeed.Compose([ringfeed.Resize(40), ringfeed.CenterCrop(32)]),
        ringfeed.Compose([ringfeed.RandomResizedCrop(24, interpolation="bicubic"), ringfeed.RandomVerticalFlip()]),
        ringfeed.Compose([ringfeed.CenterCrop(80), ringfeed.RandomHorizontalFlip()]),  # padded, no resize
        ringfeed.Compose([ringfeed.Resize((30, 36), interpolation="nearest")]),
    ],
    ids=["rrc-flip", "resize-centercrop", "rrc-bicubic-vflip", "pad-no-resize", "nearest"],
)
def test_hybrid_batches_are_the_cpu_batches(
    folder: tuple[Path, dict[str, str]], sock: str, transform: object, layout: str
) -> None:
    """With every sample offered, a batch has the same samples, labels, crops, order and shape as the
    CPU path's, its pixels within a few levels (another IDCT, a float resample), and only plain JPEGs
    went to the client: progressive, CMYK, PNG and EXIF-rotated files were decoded by the server."""
    root, kinds = folder
    cpu, _ = _epoch(root, sock, False, transform, layout=layout)
    gpu, stats = _epoch(root, sock, 1.0, transform, layout=layout)
    assert len(cpu) == len(gpu) == 29 // 6
    diffs = []
    for a, b in zip(cpu, gpu, strict=True):
        assert set(a) == set(b) == {"image", "label", "index", "crop"}
        for k in ("label", "index", "crop"):
            assert torch.equal(a[k], b[k]), k
        assert a["image"].shape == b["image"].shape
        assert a["image"].dtype == b["image"].dtype
        diffs.append((a["image"].float() - b["image"].float()).abs())
    d = torch.cat([x.flatten() for x in diffs])
    assert float(d.mean()) < 1.5, float(d.mean())
    assert float(torch.quantile(d[:100000], 0.999)) <= 12, "a few pixels differ by IDCT rounding, none by much"
    # Dataset indices follow ImageFolder's order: classes, then files, sorted.
    order = sorted(kinds)
    plain = sum(kinds[order[int(i)]] == "gpu" for b in gpu for i in b["index"])
    assert stats["gpu_samples"] == plain, stats
    assert stats["gpu_fallbacks"] == 0
    assert stats["server"]["gpu_share"] == 1.0
    assert stats["server"]["gpu_samples"] >= plain
    assert 0.0 <= stats["gpu_decode_wait_s"] <= stats["data_wait_s"] + 1e-6


def test_a_share_hands_over_that_part_and_pixels_follow_the_share(
    folder: tuple[Path, dict[str, str]], sock: str
) -> None:
    """A pinned share of 0.5 hands about half the plain JPEGs to the client; samples the server
    decoded are byte-identical to the CPU path's."""
    root, _ = folder
    cpu, _ = _epoch(root, sock, False)
    half, stats = _epoch(root, sock, 0.5)
    handed = stats["gpu_samples"]
    assert 6 <= handed <= 15, handed
    same = sum(int(torch.equal(a["image"][i], b["image"][i])) for a, b in zip(cpu, half, strict=True) for i in range(6))
    assert same >= 24 - handed, same
    for a, b in zip(cpu, half, strict=True):
        assert torch.equal(a["index"], b["index"])


def test_an_arena_too_small_sends_samples_back_to_the_cpu(folder: tuple[Path, dict[str, str]], sock: str) -> None:
    """Samples whose bytes do not fit what is left of the batch's arena are decoded by the server:
    the batch is still complete and correct."""
    root, _ = folder
    cpu, _ = _epoch(root, sock, False)
    small, stats = _epoch(root, sock, ringfeed.GPUDecode(share=1.0, bytes_per_sample=4096, pixels=False))
    assert 0 < stats["gpu_samples"] < 21
    for a, b in zip(cpu, small, strict=True):
        assert torch.equal(a["index"], b["index"])
        assert float((a["image"].float() - b["image"].float()).abs().mean()) < 1.5


def test_normalize_and_erasing_run_after_the_gpu_samples(folder: tuple[Path, dict[str, str]], sock: str) -> None:
    """The batch ops see the finished GPU samples: normalised batches of both paths agree."""
    root, _ = folder
    recipe = ringfeed.Compose([RRC, ringfeed.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25])])
    cpu, _ = _epoch(root, sock, False, recipe)
    gpu, _ = _epoch(root, sock, 1.0, recipe)
    for a, b in zip(cpu, gpu, strict=True):
        assert a["image"].dtype == torch.float32
        assert a["image"].shape == (6, 3, 32, 32)
        assert float((a["image"] - b["image"]).abs().mean()) < 1.5 / 255 / 0.25


def test_gpu_decode_off_says_why(folder: tuple[Path, dict[str, str]], sock: str) -> None:
    """A pipeline the GPU cannot finish, or a CPU device, turns "auto" off with the reason; a pinned share
    that cannot work is a ValueError naming it; the server refuses such a pipeline too."""
    root, _ = folder
    with ringfeed.Loader(root, 6, RRC, server=ringfeed.Server(socket=sock, spawn=True, timeout=60)) as ld:
        assert ld.gpu_decode_reason == "the loader's device is the CPU"
        assert "gpu_samples" not in ld.stats()["server"] or ld.stats()["server"]["gpu_samples"] is None
    late = ringfeed.Compose([ringfeed.RandomResizedCrop(40), ringfeed.ColorJitter(0.4), ringfeed.CenterCrop(32)])
    with ringfeed.Loader(
        root, 6, late, server=ringfeed.Server(socket=sock, spawn=True, timeout=60), _gpu_backend="host"
    ) as ld:
        assert "center_crop changes the image's size" in (ld.gpu_decode_reason or "")
    with pytest.raises(ValueError, match="center_crop changes the image's size"):
        ringfeed.Loader(
            root, 6, late, server=ringfeed.Server(socket=sock, spawn=True), gpu_decode=0.5, _gpu_backend="host"
        )
    with pytest.raises(ValueError, match="gpu_decode must be"):
        ringfeed.Loader(root, 6, RRC, server=ringfeed.Server(socket=sock, spawn=True), gpu_decode=1.5)


def _raw_open(sock: str, members: dict[str, object], protocol: list[int] | None = None) -> dict[str, object]:
    """Says hello and `open` on a raw connection; returns the server's answer to the `open`."""
    import socket

    from ringfeed.wire.protocol import LENGTH, encode

    def recv(s: socket.socket) -> dict[str, object]:
        head = s.recv(4, socket.MSG_WAITALL)
        (n,) = LENGTH.unpack(head)
        return json.loads(s.recv(n, socket.MSG_WAITALL))

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(sock)
        s.sendall(encode({"type": "hello", "protocol": protocol or list(ringfeed.PROTOCOL)}))
        assert recv(s)["type"] == "welcome"
        s.sendall(encode({"type": "open", **members}))
        return recv(s)


def test_the_server_refuses_what_the_gpu_cannot_finish(folder: tuple[Path, dict[str, str]], sock: str) -> None:
    """`ringfeed serve` answers an `open` with `gpu_decode` for a pipeline with a crop after a colour
    op (in a 1.8 session), or with colour ops at all (in a 1.7 one), or a share out of range, with
    `bad_request` naming the member and the op."""
    root, _ = folder
    with ringfeed.Loader(
        root, 6, RRC, server=ringfeed.Server(socket=sock, spawn=True, timeout=60)
    ):  # starts the sidecar
        grey = {"op": "grayscale", "p": 1.0}
        crop = {"op": "center_crop", "size": [24]}
        pipeline = {"views": [{"ops": [{"op": "random_resized_crop", "size": [32]}, grey, crop]}]}
        base = {"dataset": str(root), "batch_size": 4, "pipeline": pipeline}
        err = _raw_open(sock, {**base, "gpu_decode": {"share": 0.5}})
        assert err["type"] == "error", err
        assert err["code"] == "bad_request", err
        assert "open.gpu_decode" in str(err["message"]), err
        assert "center_crop" in str(err["message"]), err
        assert "changes the image's size" in str(err["message"]), err
        tail = {"views": [{"ops": [{"op": "random_resized_crop", "size": [32]}, grey]}]}
        ok = _raw_open(sock, {**base, "pipeline": tail, "gpu_decode": {"share": 0.5}})
        assert ok["type"] == "ring", ok
        old = _raw_open(sock, {**base, "pipeline": tail, "gpu_decode": {"share": 0.5}}, protocol=[1, 7])
        assert old["type"] == "error", old
        assert "grayscale" in str(old["message"]), old
        assert "not geometric" in str(old["message"]), old
        rrc = {"views": [{"ops": [{"op": "random_resized_crop", "size": [32]}]}]}
        err = _raw_open(sock, {**base, "pipeline": rrc, "gpu_decode": {"share": 2.0}})
        assert err["code"] == "bad_request", err
        assert "open.gpu_decode.share 2" in str(err["message"]), err


def test_the_server_binary_and_the_client_speak_1_11(folder: tuple[Path, dict[str, str]], sock: str) -> None:
    """The server binary answers the client's hello with its protocol, 1.11 (1.8 brought the
    per-image steps of hybrid decode, ``gpu_ops``; 1.9 sample fields and more object stores; 1.10
    aspect-ratio buckets and detection targets; 1.11 decoded pixels)."""
    root, _ = folder
    with ringfeed.Loader(root, 6, RRC, server=ringfeed.Server(socket=sock, spawn=True, timeout=60)) as ld:
        assert tuple(ld.server_protocol) == ringfeed.PROTOCOL == (1, 11)


def test_pixel_records_match_the_vectors() -> None:
    """1.11: the client reads bit 8 of ``gpu_job[16]`` as the server writes it, tells pixel
    samples from decoded ones by it, and a pixel record's length is its rectangle's packed RGB."""
    vectors = json.loads((Path(__file__).parents[2] / "proto/vectors/control/hybrid.json").read_text())
    cases = vectors["pixel_records"]
    assert {c["pixels_bit"] for c in cases} == {hybrid.PIXELS}
    jobs = np.array([vectors["records"][0]["record"], cases[0]["record"], [0] * 18, cases[1]["record"]], dtype=np.int32)
    decoded, pixels = hybrid._split(jobs)
    assert decoded.tolist() == [0]
    assert pixels.tolist() == [1, 3]
    for c in cases:
        f = c["fields"]
        left, top, w, h = c["rect"]
        assert (f["src_width"], f["src_height"]) == (w, h)
        assert f["length"] == 3 * w * h
        assert hybrid.chroma_of(f["flags"]) == 0, "a pixel sample says no chroma"
        src = dict(zip(hybrid.COLUMNS, c["source_record"], strict=True))
        # The crop moves into the rectangle; the geometry bits keep their meaning.
        assert (f["pre_left"], f["pre_top"]) == (src["pre_left"] - left, src["pre_top"] - top)
        assert f["flags"] & 0x1F == src["flags"] & 0x1F


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize(
    "transform",
    [
        RRC,
        ringfeed.Compose([ringfeed.Resize(40), ringfeed.CenterCrop(32)]),
        ringfeed.Compose([ringfeed.CenterCrop(80), ringfeed.RandomHorizontalFlip()]),  # padded, no resize
        ringfeed.Compose([ringfeed.RandomCrop(30), ringfeed.RandomVerticalFlip()]),  # a crop, no resize
        ringfeed.Compose(
            [ringfeed.RandomResizedCrop(32), ringfeed.RandomHorizontalFlip(), ringfeed.TrivialAugmentWide()]
        ),
    ],
    ids=["rrc-flip", "resize-centercrop", "pad-no-resize", "crop-no-resize", "trivial-augment"],
)
def test_pixel_samples_are_the_cpu_batches(
    folder: tuple[Path, dict[str, str]], sock: str, transform: object, layout: str
) -> None:
    """1.11, decoded pixels with nothing offered to the GPU decoder: every sample (the plain JPEGs
    and the progressive, CMYK, PNG and EXIF-rotated files alike) is decoded by the server only to
    the rectangle its geometry reads and finished by the client, with the CPU path's labels,
    indices, crops and draws; its pixels within a level or so of the CPU path's (the same decoded
    pixels, a float resample)."""
    root, _ = folder
    cpu, _ = _epoch(root, sock, False, transform, layout=layout)
    pix, stats = _epoch(root, sock, ringfeed.GPUDecode(share=0.0, pixels=True), transform, layout=layout)
    assert len(cpu) == len(pix) == 29 // 6
    worst = 0.0
    for a, b in zip(cpu, pix, strict=True):
        for k in ("label", "index", "crop"):
            assert torch.equal(a[k], b[k]), k
        assert a["image"].shape == b["image"].shape
        assert a["image"].dtype == b["image"].dtype
        d = (a["image"].float() - b["image"].float()).abs()
        worst = max(worst, float(d.flatten(1).mean(1).max()))
    # A policy's thresholds (solarize, posterize) turn a level's difference into more, as in the
    # per-image ops' test above.
    limit = 4.0 if any(isinstance(op, ringfeed.TrivialAugmentWide) for op in getattr(transform, "ops", ())) else 1.5
    assert worst < limit, f"a sample differs from the CPU path's by {worst:.2f} levels on average"
    assert stats["gpu_samples"] == 0, stats
    assert stats["gpu_pixel_samples"] == 24, stats
    assert stats["server"]["pixel_samples"] >= 24, stats["server"]


def test_crops_and_flips_of_pixel_samples_are_exact(folder: tuple[Path, dict[str, str]], sock: str) -> None:
    """Without a resize the client only moves the server's decoded pixels: the batch equals the
    CPU path's byte for byte (so the rectangle, its rows and the moved window are right)."""
    root, _ = folder
    for transform in (
        ringfeed.Compose([ringfeed.RandomCrop(30), ringfeed.RandomVerticalFlip(), ringfeed.RandomHorizontalFlip()]),
        ringfeed.Compose([ringfeed.CenterCrop(80), ringfeed.RandomHorizontalFlip()]),
    ):
        cpu, _ = _epoch(root, sock, False, transform)
        pix, stats = _epoch(root, sock, ringfeed.GPUDecode(share=0.0, pixels=True), transform)
        assert stats["gpu_pixel_samples"] == 24
        for a, b in zip(cpu, pix, strict=True):
            assert torch.equal(a["image"], b["image"]), transform


def test_a_share_and_pixels_hand_every_sample_to_the_client(folder: tuple[Path, dict[str, str]], sock: str) -> None:
    """With a share and pixels, the plain JPEGs offered are decoded by the client and the rest
    come as pixels: every sample is finished by the client, and the batches are the CPU path's."""
    root, _ = folder
    cpu, _ = _epoch(root, sock, False)
    both, stats = _epoch(root, sock, ringfeed.GPUDecode(share=0.5, pixels=True))
    assert 6 <= stats["gpu_samples"] <= 15, stats
    assert stats["gpu_samples"] + stats["gpu_pixel_samples"] == 24, stats
    for a, b in zip(cpu, both, strict=True):
        assert torch.equal(a["index"], b["index"])
        assert torch.equal(a["crop"], b["crop"])
        assert float((a["image"].float() - b["image"].float()).abs().mean()) < 1.5


def test_pixels_that_do_not_fit_the_arena_are_finished_by_the_server(
    folder: tuple[Path, dict[str, str]], sock: str
) -> None:
    """A rectangle larger than what is left of the batch's arena is finished by the server, as
    before: the batch is complete and correct, and fewer samples came as pixels."""
    root, _ = folder
    cpu, _ = _epoch(root, sock, False)
    small, stats = _epoch(root, sock, ringfeed.GPUDecode(share=0.0, pixels=True, bytes_per_sample=4096))
    assert 0 < stats["gpu_pixel_samples"] < 24, stats
    for a, b in zip(cpu, small, strict=True):
        assert torch.equal(a["index"], b["index"])
        assert float((a["image"].float() - b["image"].float()).abs().mean()) < 1.5


def test_every_view_of_a_pixel_sample_is_finished_from_its_rectangle(
    folder: tuple[Path, dict[str, str]], sock: str
) -> None:
    """1.11 with several views (1.10): one rectangle per sample holds what every output reads;
    each output is the CPU path's within a few levels, its erasing boxes and draws the same."""
    root, _ = folder
    views = ringfeed.Views(
        {
            "global": ringfeed.View(
                ringfeed.Compose([ringfeed.RandomResizedCrop(32, scale=(0.3, 1.0)), ringfeed.RandomHorizontalFlip()]),
                count=2,
            ),
            "local": ringfeed.View(
                ringfeed.Compose(
                    [ringfeed.RandomResizedCrop(16, scale=(0.05, 0.3)), ringfeed.RandomSolarize(128, 0.5)]
                ),
                count=2,
            ),
        }
    )
    cpu, _ = _epoch(root, sock, False, views)
    pix, stats = _epoch(root, sock, ringfeed.GPUDecode(share=0.0, pixels=True), views)
    assert stats["gpu_pixel_samples"] == 24
    for a, b in zip(cpu, pix, strict=True):
        assert set(a) == set(b)
        for k, v in a.items():
            if k in ("global", "local"):
                assert float((v.float() - b[k].float()).abs().mean()) < 2.0, k
            else:
                assert torch.equal(v, b[k]), k


def test_pixels_are_asked_for_only_from_a_1_11_server(folder: tuple[Path, dict[str, str]], sock: str) -> None:
    """The client sends ``gpu_decode.pixels`` to a 1.11 server only (a 1.10 server would ignore it
    and finish its samples itself); it is on by default, and ``pixels=False`` or
    ``RINGFEED_GPU_PIXELS=0`` leave it out, so the server finishes what it decodes."""
    root, _ = folder

    def open_gpu(gpu: ringfeed.GPUDecode, protocol: tuple[int, int]) -> object:
        with ringfeed.Loader(
            root, 6, RRC, server=ringfeed.Server(socket=sock, spawn=True, timeout=60), gpu_decode=gpu,
            _gpu_backend="host",
        ) as ld:  # fmt: skip
            member = ld._kind.open_members(ld._stream.cfg, protocol)["gpu_decode"]
            next(iter(ld))
            return member, ld.stats()["gpu_pixel_samples"]

    # The member as the spec's vector spells it (frames.json, which the Rust side decodes and encodes back).
    want = frame_vector("open, 1.11 decoded pixels")["gpu_decode"]
    assert want == {"share": 0.5, "pixels": True}
    assert open_gpu(ringfeed.GPUDecode(share=0.5), (1, 11)) == (want, 3)
    assert open_gpu(ringfeed.GPUDecode(share=0.5), (1, 10))[0] == {"share": 0.5}
    assert open_gpu(ringfeed.GPUDecode(share=0.5, pixels=False), (1, 11)) == ({"share": 0.5}, 0)
    with pytest.MonkeyPatch.context() as m:
        m.setenv("RINGFEED_GPU_PIXELS", "0")
        assert open_gpu(ringfeed.GPUDecode(share=0.5), (1, 11)) == ({"share": 0.5}, 0)
        m.setenv("RINGFEED_GPU_PIXELS", "yes")
        with pytest.raises(ValueError, match="RINGFEED_GPU_PIXELS"):
            open_gpu(ringfeed.GPUDecode(share=0.5), (1, 11))
    with pytest.raises(ValueError, match="pixels"):
        ringfeed.GPUDecode(pixels="yes")  # type: ignore[arg-type]


TAILS = {
    "trivial-augment": ringfeed.Compose(
        [ringfeed.RandomResizedCrop(32), ringfeed.RandomHorizontalFlip(), ringfeed.TrivialAugmentWide()]
    ),
    "rand-augment": ringfeed.Compose([ringfeed.RandomResizedCrop(32), ringfeed.RandAugment(2, 9)]),
    "jitter-grey-blur": ringfeed.Compose(
        [
            ringfeed.RandomResizedCrop(32),
            ringfeed.ColorJitter(0.4, 0.4, 0.4, 0.1),
            ringfeed.RandomGrayscale(0.3),
            ringfeed.GaussianBlur(5, (0.1, 2.0)),
            ringfeed.RandomHorizontalFlip(),
        ]
    ),
}


#: DINO-like multi-crop (1.10): two global crops with colour ops and erasing, several local ones.
DINO = ringfeed.Views(
    {
        "global": ringfeed.View(
            ringfeed.Compose(
                [
                    ringfeed.RandomResizedCrop(224, scale=(0.32, 1.0)),
                    ringfeed.RandomHorizontalFlip(),
                    ringfeed.ColorJitter(0.4, 0.4, 0.2, 0.1),
                    ringfeed.RandomGrayscale(0.2),
                    ringfeed.RandomErasing(0.5),
                ]
            ),
            count=2,
        ),
        "local": ringfeed.View(
            ringfeed.Compose(
                [
                    ringfeed.RandomResizedCrop(96, scale=(0.05, 0.32)),
                    ringfeed.RandomHorizontalFlip(),
                    ringfeed.RandomSolarize(128, 0.3),
                ]
            ),
            count=3,
        ),
        # A view without per-image ops beside them: its step tables are empty.
        "plain": ringfeed.CenterCrop(24),
    }
)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_every_view_of_a_gpu_sample_is_finished_from_its_one_decode(
    folder: tuple[Path, dict[str, str]], sock: str, layout: str
) -> None:
    """A multi-view pipeline (1.10: two global crops with colour ops and erasing, three local
    ones, a plain centre crop) goes to the GPU whole: each plain JPEG is decoded once by the
    client and every one of its six images finished from it with the draws the server made for that image (``gpu_job``
    and ``gpu_ops`` per output), so every image is within a few levels of the CPU path's (an image
    finished with another output's draws, or a step not run, moves it by tens of levels), erased
    where the CPU path erased it, and the labels, indices and crops are the CPU path's."""
    root, kinds = folder
    cpu, _ = _epoch(root, sock, False, DINO, layout=layout)
    gpu, stats = _epoch(root, sock, 1.0, DINO, layout=layout)
    order = sorted(kinds)
    plain = sum(kinds[order[int(i)]] == "gpu" for b in gpu for i in b["index"])
    assert stats["gpu_samples"] == plain > 0, stats
    shapes = {"global": (2, 224, 224, 3), "local": (3, 96, 96, 3), "plain": (1, 24, 24, 3)}
    worst = 0.0
    for a, b in zip(cpu, gpu, strict=True):
        assert set(a) == set(b) == {"global", "local", "plain", "label", "index", "crop"}
        for k in ("label", "index", "crop"):
            assert torch.equal(a[k], b[k]), k
        for name, (count, h, w, c) in shapes.items():
            want = (6, count, h, w, c) if layout == "NHWC" else (6, count, c, h, w)
            want = want if count > 1 else (6, *want[2:])
            assert a[name].shape == b[name].shape == want
            d = (a[name].float() - b[name].float()).reshape(6 * count, -1).abs().mean(1)
            worst = max(worst, float(d.max()))
    assert worst < 4.0, f"an image differs from the CPU path's by {worst:.2f} levels on average"
    # The server's answer for an older session: one view of one image only.
    with ringfeed.Loader(root, 6, RRC, server=ringfeed.Server(socket=sock, spawn=True, timeout=60)):
        base = {"dataset": str(root), "batch_size": 4, "pipeline": DINO.to_json(), "gpu_decode": {"share": 0.5}}
        old = _raw_open(sock, base, protocol=[1, 9])
        assert old["type"] == "error", old
        assert old["code"] == "bad_request", old
        assert "3 views" in str(old["message"]), old
        assert "1.10" in str(old["message"]), old
        ok = _raw_open(sock, base)
        assert ok["type"] == "ring", ok


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_every_view_on_a_cuda_device(folder: tuple[Path, dict[str, str]], sock: str) -> None:
    """On a CUDA device with the GPU decoder, a multi-view batch's plain JPEGs are decoded once
    on the GPU and each of their images finished from it (the finishing kernel and the step
    kernels once per view): the labels, indices and crops are the CPU path's, the pixels near its
    (the hardware decoder's replicated chroma differs; an image finished with another's draws
    moves by tens of levels)."""
    root, kinds = folder
    cpu, _ = _epoch(root, sock, False, DINO)
    gpu, stats = _epoch(root, sock, 1.0, DINO, device="cuda")
    order = sorted(kinds)
    plain = sum(kinds[order[int(i)]] == "gpu" for b in gpu for i in b["index"])
    assert stats["gpu_samples"] == plain > 0, stats
    diffs = []
    for a, b in zip(cpu, gpu, strict=True):
        for k in ("label", "index", "crop"):
            assert torch.equal(a[k], b[k]), k
        for name, count in (("global", 2), ("local", 3), ("plain", 1)):
            assert a[name].shape == b[name].shape
            diffs.append((a[name].float() - b[name].float()).reshape(6 * count, -1).abs().mean(1))
    d = torch.cat(diffs)
    assert float(d.median()) < 3.0, d
    assert float(d.max()) < 16.0, d


def test_a_view_without_kernels_is_named(folder: tuple[Path, dict[str, str]], sock: str) -> None:
    """``gpu_decode_reason`` names the view and the first op of it that the GPU cannot finish."""
    root, _ = folder
    views = ringfeed.Views(
        {
            "global": ringfeed.RandomResizedCrop(32),
            "local": ringfeed.Compose(
                [ringfeed.RandomResizedCrop(24), ringfeed.RandomInvert(), ringfeed.CenterCrop(16)]
            ),
        }
    )
    with ringfeed.Loader(
        root, 6, views, server=ringfeed.Server(socket=sock, spawn=True, timeout=60), _gpu_backend="host"
    ) as ld:
        why = ld.gpu_decode_reason or ""
        assert "'local'" in why, why
        assert "center_crop changes the image's size" in why, why


def test_launches_per_batch_do_not_grow_with_the_batch() -> None:
    """The finisher's work for a multi-view batch launches as many kernels whatever the batch
    size: each view's outputs of every sample go through one finishing kernel (counted by a proxy
    of it here: CI has no GPU, and the kernel's pixels are ``test_finish_kernel.py``'s) and the
    steps of all of them through one table (their tensor ops counted with a ``TorchDispatchMode``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            Count.n += 1
            return func(*args, **(kwargs or {}))

    class Kernel:
        """Stands for ``finish_kernel``: one launch per call, over the table's rows."""

        rows: ClassVar[list[int]] = []

        @staticmethod
        def finish(table: Any, image: Any, layout: str) -> None:
            Count.n += 1
            Kernel.rows.append(int(table.shape[0]))

    img = photo(48, 40, 3)
    data = np.frombuffer(_jpeg(img, quality=90), dtype=np.uint8)
    f = hybrid.Finisher(torch.device("cpu"), "host", "NHWC", (12, 12), geometry="bmm", counts=(2, 3))
    f._kernel = Kernel
    # One record per output: a crop and a resize, a flip on odd outputs; every output the same
    # steps (an invert and a brightness), so the groups do not depend on the batch.
    rec = [0, len(data), 48, 40, 4, 2, 30, 28, 12, 12, 0, 0, 0, 0, 12, 12, 1 << 2 | 16, 0]
    step = np.zeros((2, 16), dtype=np.int32)
    step[0, 0] = 7  # invert
    step[1, :3] = [2, 0, np.float32(1.25).view(np.int32)]  # brightness 1.25

    def launches(n: int) -> int:
        arena = np.tile(data, n)
        jobs = np.zeros((n, 5, hybrid.RECORD_LEN), dtype=np.int32)
        jobs[:] = rec
        jobs[:, :, 0] = (np.arange(n) * len(data))[:, None]
        jobs[:, 1::2, 16] |= hybrid.FLIP_X
        ops = np.broadcast_to(step, (n, 5, 2, 16)).copy()
        images = [torch.zeros((n, 2, 12, 12, 3), dtype=torch.uint8), torch.zeros((n, 3, 12, 12, 3), dtype=torch.uint8)]
        pending = f.submit(jobs, arena)
        pending.result()
        Count.n, Kernel.rows = 0, []
        with Count():
            done = f(jobs, arena, images, pending=pending, ops=ops)
        assert done == list(range(n))
        assert Kernel.rows == [2 * n, 3 * n], "one launch per view, over all its outputs"
        # The steps ran on every output: an inverted, brightened zero image is 255 everywhere.
        assert all(bool((x == 255).all()) for x in images)
        return Count.n

    small, large = launches(4), launches(16)
    f.close()
    assert small == large, (small, large)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("name", list(TAILS))
def test_per_image_ops_run_on_the_gpu_samples_as_the_server_drew_them(
    folder: tuple[Path, dict[str, str]], sock: str, name: str, layout: str
) -> None:
    """With per-image ops after the geometry (1.8), every plain JPEG still goes to the client,
    which runs the steps the server drew (``gpu_ops``): each sample is within a few levels of the
    CPU path's (the decoders' IDCTs differ; a step that was not run, or run with other draws,
    moves a sample by tens of levels), and the labels, indices and crops are the CPU path's."""
    root, kinds = folder
    transform = TAILS[name]
    cpu, _ = _epoch(root, sock, False, transform, layout=layout)
    gpu, stats = _epoch(root, sock, 1.0, transform, layout=layout)
    order = sorted(kinds)
    plain = sum(kinds[order[int(i)]] == "gpu" for b in gpu for i in b["index"])
    assert stats["gpu_samples"] == plain > 0, stats
    worst = 0.0
    for a, b in zip(cpu, gpu, strict=True):
        for k in ("label", "index", "crop"):
            assert torch.equal(a[k], b[k]), k
        d = (a["image"].float() - b["image"].float()).abs().flatten(1).mean(1)
        worst = max(worst, float(d.max()))
    assert worst < 4.0, f"a sample differs from the CPU path's by {worst:.2f} levels on average"


def test_the_wait_for_decodes_started_ahead_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Finisher.ahead_wait_ns`` (``stats()["gpu_decode_wait_s"]``) counts the time a caller blocks
    on a decode started ahead, and only that: a decode still running when its batch is finished
    adds its remaining time, one already done adds next to nothing."""
    import time

    real = hybrid._host_decode

    def slow(data: np.ndarray) -> torch.Tensor:
        time.sleep(0.2)
        return real(data)

    monkeypatch.setattr(hybrid, "_host_decode", slow)
    buf = io.BytesIO()
    photo(24, 18, 3).save(buf, "JPEG", quality=90)
    arena = np.frombuffer(buf.getvalue(), dtype=np.uint8)
    flags = (1 << hybrid.INTERPOLATION_SHIFT) | hybrid.ANTIALIAS
    jobs = np.zeros((2, hybrid.RECORD_LEN), dtype=np.int32)
    jobs[0] = [0, len(arena), 24, 18, 0, 0, 24, 18, 8, 8, 0, 0, 0, 0, 8, 8, flags, 0]
    image = torch.zeros((2, 8, 8, 3), dtype=torch.uint8)
    f = hybrid.Finisher(torch.device("cpu"), "host", "NHWC", (8, 8), geometry="bmm")
    try:
        assert f.ahead_wait_ns == 0
        assert f(jobs, arena, image, pending=f.submit(jobs, arena)) == [0]
        waited = f.ahead_wait_ns
        assert 0.1e9 < waited < 5e9, waited
        assert int(image[0].float().std()) > 0, "the sample was finished"
        # The same wait goes to the server as `stats.gpu_decode_wait_ns` (1.5), once.
        samples, _, fallbacks, decode_wait = f.take_counts()
        assert (samples, fallbacks, decode_wait) == (1, 0, waited)
        done = f.submit(jobs, arena)
        done.result()
        f(jobs, arena, image, pending=done)
        assert f.ahead_wait_ns - waited < 0.05e9, f.ahead_wait_ns - waited
        assert f.take_counts()[3] == f.ahead_wait_ns - waited
    finally:
        f.close()


def test_a_loop_waiting_for_its_gpu_decodes_reads_the_gpu_decoder_as_the_limit(
    folder: tuple[Path, dict[str, str]], sock: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end (1.5): the loader reports its wait for GPU decodes (`stats.gpu_decode_wait_ns`) and the server's
    tuner reads it (control.md, "The GPU decoder as the limit"). With a GPU decoder (here the host fallback, slowed
    to 40 ms an image) far slower than the CPU path and a loop with no step of its own, the server reads the GPU
    decoder as the limit, and the autotuned share stays at 0.5 or below (raises of at most 0.25), where the cost
    model alone (no step: all of each batch to the GPU) had sent it to 1.0 at once."""
    import time

    real = hybrid._host_decode

    def slow(data: np.ndarray) -> torch.Tensor:
        time.sleep(0.04)
        return real(data)

    monkeypatch.setattr(hybrid, "_host_decode", slow)
    root, _ = folder
    seen: list[tuple[float, str]] = []
    # One decode thread at most, so that the CPU is the limit (which raises the share) on any machine.
    with ringfeed.Loader(
        root,
        6,
        RRC,
        server=ringfeed.Server(socket=sock, spawn=True, timeout=60),
        # The server finishes what it decodes: the host finisher would otherwise be the limit.
        gpu_decode=ringfeed.GPUDecode(share="auto", pixels=False),
        _gpu_backend="host",
        tuning=ringfeed.Tuning(threads=1),
    ) as ld:
        deadline = time.monotonic() + 60
        epoch, read_at = 0, None
        while time.monotonic() < deadline and (read_at is None or time.monotonic() < read_at + 3):
            ld.set_epoch(epoch)
            epoch += 1
            for _ in ld:
                pass
            sv = ld.stats(server=True)["server"]
            seen.append((sv["gpu_share"], sv.get("limit", "")))
            if read_at is None and sv.get("limit", "").startswith("the GPU decoder is the limit"):
                read_at = time.monotonic()
        assert read_at is not None, seen[-5:]
        assert ld.stats()["gpu_decode_wait_s"] > 0
    assert max(r[0] for r in seen) <= 0.5, [r for r in seen if r[0] > 0.5][:3]
    assert any(r[0] > 0 for r in seen), "the CPU's limit never raised the share"


def test_axis_weights_reproduce_torch_antialiased_resize() -> None:
    """The batched geometry's weights resize as torch's antialiased bilinear/bicubic interpolate does
    (torchvision's tensor path) when the crop is the whole image and no flip is drawn."""
    rng = np.random.default_rng(0)
    img = torch.from_numpy(rng.integers(0, 256, size=(1, 3, 57, 83), dtype=np.uint8)).float()
    for interp, mode in ((1, "bilinear"), (2, "bicubic")):
        for out_h, out_w in ((20, 31), (57, 83), (90, 100)):
            t = lambda v: torch.tensor([v])  # noqa: E731
            wy, _ = hybrid.axis_weights(
                out_h, 57, t(0), t(57), t(out_h), t(0), t(0), t(out_h), t(interp), t(True), t(False)
            )
            wx, _ = hybrid.axis_weights(
                out_w, 83, t(0), t(83), t(out_w), t(0), t(0), t(out_w), t(interp), t(True), t(False)
            )
            ours = torch.einsum("yh,chw,xw->cyx", wy[0], img[0], wx[0])
            ref = torch.nn.functional.interpolate(img, size=(out_h, out_w), mode=mode, antialias=True)[0]
            assert float((ours - ref).abs().max()) < 1e-3, (mode, out_h, out_w)


#: The GPU samples' PSNR floor where the GPU decoder replicates chroma (the sawtooth test photos
#: have sharp colour edges, where replication differs most from interpolated chroma).
REPLICATED_PSNR = 30.0


def _gpu_backends() -> list[str]:
    """The GPU decoders to test here: nvImageCodec's batch through nvJPEG's batched hardware
    decoder (``nvimgcodec``, the default, chroma replicated; ``nvimgcodec/interpolate`` and
    ``nvimgcodec/rebuild``, with ``RINGFEED_GPU_CHROMA`` so) and image by image
    (``nvimgcodec/images``), then torchvision's."""
    if not torch.cuda.is_available():
        return []
    out = ["torchvision"]
    try:
        from nvidia import nvimgcodec  # noqa: F401

        out[:0] = ["nvimgcodec", "nvimgcodec/interpolate", "nvimgcodec/rebuild", "nvimgcodec/images"]
    except ImportError:
        pass
    return out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", _gpu_backends())
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("geometry", ["bmm", "triton"])
def test_gpu_decoders_finish_batches_like_the_cpu(
    folder: tuple[Path, dict[str, str]],
    sock: str,
    backend: str,
    layout: str,
    geometry: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a CUDA device, each GPU decoder's batches (every sample offered), finished by either
    geometry (matrix products, or the Triton kernel reading the decoded images in place), carry
    the CPU path's samples, labels and crops, pixels within a few levels, normalised on the GPU
    afterwards; no sample fell back to the host; the slot bytes the decoder read were not
    released early (the same epoch twice gives the same batches). The GPU samples' PSNR against
    the CPU path's (torchvision's pixels) is at least issue 11's 40 dB where chroma is
    interpolated (nvImageCodec image by image, ``RINGFEED_GPU_CHROMA=interpolate``) or where the
    decoder replicates it and the client rebuilds it (``RINGFEED_GPU_CHROMA=rebuild``: 53.0-53.8 dB
    on the H200, benches/results/2026-12-02-h200-tiled), and at least :data:`REPLICATED_PSNR`
    where the decoder replicates it (the batched default, torchvision's CUDA decoder: a
    deliberate difference, docs/hybrid-decode.md "Chroma")."""
    monkeypatch.setenv("RINGFEED_GPU_FINISH", geometry)
    batched = rebuilt = False
    interpolated = backend != "torchvision"
    if backend.startswith("nvimgcodec"):
        # The batched hardware decoder needs the kernel's addresses; with the matrix products
        # nvImageCodec decodes image by image either way (interpolating chroma).
        batched = backend in ("nvimgcodec", "nvimgcodec/interpolate", "nvimgcodec/rebuild") and geometry == "triton"
        interpolated = not batched or backend == "nvimgcodec/interpolate"
        monkeypatch.setenv("RINGFEED_GPU_DECODER", "nvjpeg" if batched else "nvimgcodec")
        mode = backend.partition("/")[2]
        monkeypatch.setenv("RINGFEED_GPU_CHROMA", mode if mode in ("interpolate", "rebuild") else "replicate")
        # The rebuild runs on the batched decoder's replicated chroma (image by image it interpolates).
        rebuilt = batched and mode == "rebuild"
        backend = "nvimgcodec"
    root, kinds = folder
    recipe = ringfeed.Compose([RRC, ringfeed.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25])])
    cpu, _ = _epoch(root, sock, False, recipe, layout=layout)
    runs = []
    for _ in range(2):
        with ringfeed.Loader(
            root,
            6,
            recipe,
            server=ringfeed.Server(socket=sock, spawn=True, timeout=60),
            seed=5,
            shuffle=True,
            drop_last=True,
            fields=["index", "crop"],
            layout=layout,
            device="cuda",
            gpu_decode=1.0,
            _gpu_backend=backend,
        ) as ld:
            batches = [{k: v.clone() for k, v in b.items()} for b in ld]
            torch.cuda.synchronize()
            runs.append((batches, ld.stats()))
            hw_used = ld._kind.finisher is not None and ld._kind.finisher.hw_decoders > 0
            assert hw_used == batched, ld._kind.finisher.hw_reason if ld._kind.finisher is not None else "no finisher"
    (gpu, stats), (again, _) = runs
    order = sorted(kinds)
    plain = sum(kinds[order[int(i)]] == "gpu" for b in gpu for i in b["index"].cpu())
    assert stats["gpu_samples"] == plain
    assert stats["gpu_fallbacks"] == 0
    sq, n = 0.0, 0
    for a, b, c in zip(cpu, gpu, again, strict=True):
        for k in ("label", "index", "crop"):
            assert torch.equal(a[k], b[k].cpu()), k
        assert b["image"].device.type == "cuda"
        diff = (a["image"] - b["image"].float().cpu()).abs() * 0.25 * 255
        assert float(diff.mean()) < 2.0, float(diff.mean())
        rows = [j for j, i in enumerate(b["index"].cpu()) if kinds[order[int(i)]] == "gpu"]
        sq += float((diff[rows] ** 2).sum())
        n += diff[rows].numel()
        assert torch.equal(b["image"], c["image"])
    psnr = 10 * math.log10(255**2 / max(sq / n, 1e-12))
    print(f"GPU samples' PSNR, {backend} (batched {batched}, chroma interpolated {interpolated}): {psnr:.2f} dB")
    assert psnr >= (40.0 if interpolated or rebuilt else REPLICATED_PSNR), (backend, batched, psnr)


def test_batches_taken_ahead_are_neither_lost_nor_repeated(folder: tuple[Path, dict[str, str]], sock: str) -> None:
    """The loader takes the next batch ahead to start its decode during the step: breaking off an
    epoch, resuming from state_dict() in a new loader, and abandoning an iteration for a new epoch
    deliver every batch exactly once, the ones taken ahead included."""
    root, _ = folder

    def loader(**kw: object) -> ringfeed.Loader:
        return ringfeed.Loader(
            root, 3, RRC, server=ringfeed.Server(socket=sock, spawn=True, timeout=60), seed=2, shuffle=True,
            drop_last=True, fields=["index"], tuning=ringfeed.Tuning(slots=4), gpu_decode=1.0, _gpu_backend="host",
            **kw,
        )  # fmt: skip

    with loader() as ld:
        whole = [b["index"].clone() for b in ld]
    assert len(whole) == 29 // 3
    with loader() as ld:
        it = iter(ld)
        head = [next(it)["index"].clone() for _ in range(4)]
        ahead = len(ld._kind.ahead)
        state = ld.state_dict()
    assert state["batches_delivered"] == 4
    with loader() as ld:
        ld.load_state_dict(state)
        tail = [b["index"].clone() for b in ld]
        # A new epoch in the middle of an iteration drops what was taken ahead, and goes on.
        ld.set_epoch(1)
        it = iter(ld)
        next(it)
        ld.set_epoch(2)
        again = [b["index"].clone() for b in ld]
    assert [torch.equal(a, b) for a, b in zip(whole, head + tail, strict=True)] == [True] * len(whole)
    assert len(again) == len(whole)
    assert ahead <= 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(TAILS))
def test_per_image_ops_on_a_cuda_device(
    folder: tuple[Path, dict[str, str]], sock: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CUDA device with the GPU decoder, the per-image steps (1.8) run on the GPU samples by
    either path, the fused Triton kernels or PyTorch ops, with the same bytes (blur within 40 dB
    PSNR: the kernels sum its taps in the server's order), and the stats name the path asked for
    (no silent fallback). Against the CPU path: the same labels, indices and crops, and pixels
    near its (the hardware decoder's replicated chroma differs, docs/hybrid-decode.md "Chroma",
    and ops such as equalize widen that; a step not run, or run with other draws, moves a sample
    by tens of levels)."""
    root, kinds = folder
    transform = TAILS[name]
    cpu, _ = _epoch(root, sock, False, transform)
    out = {}
    for steps in ("triton", "torch"):
        monkeypatch.setenv("RINGFEED_GPU_OPS", steps)
        out[steps], stats = _epoch(root, sock, 1.0, transform, device="cuda")
        assert stats["gpu_steps_path"] == steps, stats
        order = sorted(kinds)
        plain = sum(kinds[order[int(i)]] == "gpu" for b in out[steps] for i in b["index"])
        assert stats["gpu_samples"] == plain > 0, stats
    fused, plain_ops = out["triton"], out["torch"]
    for a, b in zip(fused, plain_ops, strict=True):
        if "blur" in name:
            mse = float(((a["image"].float() - b["image"].float()) ** 2).mean())
            assert mse == 0 or 10 * math.log10(255.0**2 / mse) >= 40.0, mse
        else:
            assert torch.equal(a["image"], b["image"]), "the fused kernels give PyTorch's bytes"
    diffs = []
    for a, b in zip(cpu, fused, strict=True):
        for k in ("label", "index", "crop"):
            assert torch.equal(a[k], b[k]), k
        diffs.append((a["image"].float() - b["image"].float()).abs().flatten(1).mean(1))
    d = torch.cat(diffs)
    assert float(d.median()) < 3.0, d
    assert float(d.max()) < 16.0, d
    print(f"{name}: from the CPU path's by {float(d.median()):.2f} levels (median), {float(d.max()):.2f} (worst)")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["plain", *TAILS])
def test_pixel_samples_on_a_cuda_device(folder: tuple[Path, dict[str, str]], sock: str, name: str) -> None:
    """1.11 on a CUDA device: with a share of 0.5 and decoded pixels, half the plain JPEGs go to
    the GPU decoder and every other sample comes as pixels (one copy a batch), all finished by the
    Triton kernels; the batches keep the CPU path's labels, indices and crops, and the pixel
    samples are near the CPU path's (the same decoded pixels: closer than the decoder's samples)."""
    root, kinds = folder
    transform = RRC if name == "plain" else TAILS[name]
    cpu, _ = _epoch(root, sock, False, transform)
    gpu, stats = _epoch(root, sock, ringfeed.GPUDecode(share=0.5, pixels=True), transform, device="cuda")
    assert stats["gpu_pixel_samples"] > 0, stats
    assert stats["gpu_samples"] > 0, stats
    assert stats["gpu_samples"] + stats["gpu_pixel_samples"] == 24, stats
    order = sorted(kinds)
    diffs = []
    for a, b in zip(cpu, gpu, strict=True):
        for k in ("label", "index", "crop"):
            assert torch.equal(a[k], b[k]), k
        d = (a["image"].float() - b["image"].float()).abs().flatten(1).mean(1)
        # The files the GPU decoder does not take (progressive, CMYK, PNG, rotated): all pixels.
        diffs += [float(d[i]) for i, j in enumerate(b["index"]) if kinds[order[int(j)]] == "cpu"]
    assert diffs
    assert max(diffs) < (1.5 if name == "plain" else 4.0), diffs
    print(f"pixels {name}: worst of the server-decoded samples {max(diffs):.2f} levels")
