"""What the loader checks before it talks to any server: transforms, ranks, devices, parameters.

None of these tests needs a server: every parameter is validated before the connection, so each
bad value fails with a ``ValueError`` naming the parameter (the socket given does not exist).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ringfeed
from ringfeed._options import resolve_device, resolve_rank

NOWHERE = "/nonexistent/ringfeed.sock"


# -- transforms -------------------------------------------------------------------------------------


def test_random_resized_crop_plus_flip_is_a_pipeline() -> None:
    """RandomResizedCrop(224) + Flip() is Compose([RandomResizedCrop(224), RandomHorizontalFlip()]) with defaults."""
    t = ringfeed.RandomResizedCrop(224) + ringfeed.Flip()
    assert t == ringfeed.Compose([ringfeed.RandomResizedCrop(224), ringfeed.RandomHorizontalFlip(0.5)])
    assert t.to_json() == [
        {
            "op": "random_resized_crop",
            "size": [224, 224],
            "scale": [0.08, 1.0],
            "ratio": [0.75, 1.3333333333333333],
            "interpolation": "bilinear",
            "antialias": True,
        },
        {"op": "horizontal_flip", "p": 0.5},
    ]
    assert t.size == (224, 224)
    # A 1.1 server gets the 1.1 transform it means.
    assert ringfeed.Views({"image": t}).legacy() == {
        "kind": "random_resized_crop",
        "size": [224, 224],
        "scale": [0.08, 1.0],
        "ratio": [0.75, 1.3333333333333333],
        "flip": 0.5,
    }


def test_resize_and_center_crop_have_torchvision_semantics() -> None:
    """Resize(int) is the shorter side (its size depends on the image); (h, w) stretches; CenterCrop only crops."""
    assert ringfeed.Resize(256).out_size(None) is None
    assert ringfeed.Resize([32, 48]).size == (32, 48)
    assert ringfeed.Resize([32]).size == (32,)
    assert ringfeed.CenterCrop(224).to_json() == {"op": "center_crop", "size": [224, 224]}
    evals = ringfeed.Compose([ringfeed.Resize(256), ringfeed.CenterCrop(224)])
    assert evals.size == (224, 224)
    assert ringfeed.Views({"image": evals}).legacy() == {"kind": "center_crop", "size": [224, 224], "resize": 256}
    assert ringfeed.Views({"image": ringfeed.Resize((4, 6))}).legacy() == {"kind": "resize", "size": [4, 6]}
    # Normalize runs in the client, so it does not stop a 1.1 server; erasing does (1.2 draws its boxes).
    assert ringfeed.Views({"image": evals + ringfeed.Normalize([0.5], [0.5])}).legacy() is not None
    assert ringfeed.Views({"image": evals + ringfeed.RandomErasing()}).legacy() is None
    # Anything else has no 1.1 form.
    assert ringfeed.Views({"image": evals + ringfeed.RandomInvert()}).legacy() is None
    assert ringfeed.Views({"image": ringfeed.Resize((4, 6), interpolation="bicubic")}).legacy() is None


def test_ops_compare_and_print() -> None:
    """Ops are values: equal when their protocol objects are, with a readable repr."""
    assert ringfeed.Resize((4, 4)) == ringfeed.Resize([4, 4])
    assert ringfeed.Resize((4, 4)) != ringfeed.CenterCrop(4)
    assert repr(ringfeed.CenterCrop((4, 5))) == "CenterCrop(size=[4, 5])"
    assert len({ringfeed.Flip(), ringfeed.RandomHorizontalFlip()}) == 1


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: ringfeed.RandomResizedCrop(0), r"RandomResizedCrop: size must be .* in 1..=4096, got 0"),
        (lambda: ringfeed.RandomResizedCrop(4097), "RandomResizedCrop: size .* got 4097"),
        (lambda: ringfeed.RandomResizedCrop((224, 0)), r"size .* got \(224, 0\)"),
        (lambda: ringfeed.RandomResizedCrop((1, 2, 3)), "size .* got"),
        (lambda: ringfeed.RandomResizedCrop(22.4), "size .* got 22.4"),  # type: ignore[arg-type]
        (lambda: ringfeed.RandomResizedCrop(True), "size .* got True"),
        (lambda: ringfeed.RandomResizedCrop("224"), "size .* got '224'"),  # type: ignore[arg-type]
        (
            lambda: ringfeed.RandomResizedCrop(224, scale=(0.5, 0.2)),
            r"scale must be a \(min, max\) pair with 0 < min <= max <= 1",
        ),
        (lambda: ringfeed.RandomResizedCrop(224, scale=(0, 1)), "scale must be"),
        (lambda: ringfeed.RandomResizedCrop(224, scale=(0.5, 1.5)), "scale must be"),
        (lambda: ringfeed.RandomResizedCrop(224, scale=0.5), "scale must be"),  # type: ignore[arg-type]
        (lambda: ringfeed.RandomResizedCrop(224, scale=(float("nan"), 1)), "scale must be"),
        (
            lambda: ringfeed.RandomResizedCrop(224, ratio=(2, 1)),
            r"ratio must be a \(min, max\) pair with 0 < min <= max,",
        ),
        (lambda: ringfeed.RandomResizedCrop(224, ratio=(-1, 1)), "ratio must be"),
        (lambda: ringfeed.RandomResizedCrop(224, ratio=(1, float("inf"))), "ratio must be"),
        (lambda: ringfeed.RandomResizedCrop(224, interpolation="lanczos"), "RandomResizedCrop: interpolation must be"),
        (lambda: ringfeed.Flip(1.5), r"RandomHorizontalFlip: p must be a probability in 0..=1, got 1.5"),
        (lambda: ringfeed.Flip(-0.1), "p must be"),
        (lambda: ringfeed.Flip("yes"), "p must be"),  # type: ignore[arg-type]
        (lambda: ringfeed.CenterCrop(-1), "CenterCrop: size must be"),
        (lambda: ringfeed.Resize(5000), "Resize: size must be"),
        (lambda: ringfeed.Resize(256, max_size=200), "Resize: max_size must be an int greater than size"),
        (lambda: ringfeed.RandomCrop(32, padding=(1, 2, 3)), "RandomCrop: padding must be"),
        (lambda: ringfeed.RandomCrop(32, fill=300), "RandomCrop: fill must be"),
        (lambda: ringfeed.ColorJitter(hue=0.6), r"ColorJitter: hue must lie in \(-0.5, 0.5\)"),
        (lambda: ringfeed.RandomSolarize(300), "RandomSolarize: threshold"),
        (lambda: ringfeed.RandomAdjustSharpness(-1), "RandomAdjustSharpness: sharpness_factor"),
        (lambda: ringfeed.AutoAugment("cifar100"), "AutoAugment: policy"),
        (
            lambda: ringfeed.TrivialAugmentWide(interpolation="bicubic"),
            "TrivialAugmentWide: interpolation must be one of nearest, bilinear",
        ),
        (lambda: ringfeed.Normalize([0.5], [0.0]), "Normalize: every std must be positive"),
        (lambda: ringfeed.RandomErasing(value="noise"), "RandomErasing: value must be"),
        (lambda: ringfeed.MixUp(alpha=0, num_classes=10), "MixUp: alpha must be positive"),
        (lambda: ringfeed.CutMix(num_classes=0), "CutMix: num_classes must be a positive int"),
        (lambda: ringfeed.RandomChoice([ringfeed.RandomInvert()], p=[-1]), "RandomChoice: p must"),
        (lambda: ringfeed.View(ringfeed.CenterCrop(4), count=65), "View: count must be"),
        (lambda: ringfeed.Compose([ringfeed.MixUp(num_classes=3)]), "MixUp is a batch transform"),
        (lambda: ringfeed.Compose(["RandomResizedCrop(224)"]), "is not a ringfeed op"),
    ],
)
def test_invalid_op_parameters_name_the_parameter(make: Any, match: str) -> None:
    """Each out-of-range op parameter is a ValueError naming the op, the parameter and the value."""
    with pytest.raises(ValueError, match=match):
        make()


def test_adding_a_non_op_is_a_type_error() -> None:
    """Adding something that is not an op is the usual TypeError."""
    with pytest.raises(TypeError):
        ringfeed.Resize(8) + 1


def test_pipeline_vectors_are_what_the_python_ops_write() -> None:
    """Each vector of proto/vectors/control/pipelines.json is the JSON its Python expression builds, with its sizes."""
    import json
    from pathlib import Path

    rf = ringfeed
    path = Path(__file__).resolve().parents[2] / "proto" / "vectors" / "control" / "pipelines.json"
    vectors = json.loads(path.read_text())
    for case in vectors["good"]:
        views = rf._transforms.as_views(eval(case["python"], {"rf": rf}))
        assert views.to_json() == case["pipeline"], case["name"]
        for name, (h, w, count) in case["views"].items():
            assert views.views[name].size == (h, w), case["name"]
            assert views.views[name].count == count, case["name"]


# -- ranks and devices ----------------------------------------------------------------------------


def test_rank_and_world_size_come_from_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without arguments, rank and world_size come from $RANK and $WORLD_SIZE, else (0, 1); arguments win."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert resolve_rank(None, None) == (0, 1)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert resolve_rank(None, None) == (3, 8)
    assert resolve_rank(1, None) == (1, 8)
    assert resolve_rank(0, 2) == (0, 2)


@pytest.mark.parametrize(
    ("env", "args", "match"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, (None, None), r"the environment variable RANK='x' is not an integer"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, (None, None), r"rank must be an integer in 0..2 \(world_size=2\), got 2"),
        ({"RANK": "1"}, (None, None), r"rank must be .*\(world_size=1\)"),
        ({}, (0, 0), r"world_size must be an integer in 1..="),
        ({}, (-1, 4), "rank must be"),
    ],
)
def test_bad_ranks_are_refused(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], args: Any, match: str) -> None:
    """A rank outside 0..world_size, or a non-integer environment variable, is a ValueError naming it."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=match):
        resolve_rank(*args)


def test_devices() -> None:
    """'cpu' (or torch.device('cpu')) is CPU mode; CUDA without CUDA, and other device types, are refused."""
    assert resolve_device("cpu") == "cpu"
    assert resolve_device(torch.device("cpu")) == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"CUDA is not available"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match="the CPU or a CUDA device"):
        resolve_device("meta")
    with pytest.raises(ValueError, match="device must be"):
        resolve_device("gpu0")


# -- loader parameters ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"batch_size": 0}, r"batch_size must be an integer in 1..=65536, got 0"),
        ({"batch_size": 65537}, "batch_size must be"),
        ({"batch_size": 2.0}, "batch_size must be"),
        ({"transform": ringfeed.Flip()}, "ends in a size that depends on the image"),
        ({"transform": ringfeed.Resize(8)}, "ends in a size that depends on the image"),
        ({"transform": "RandomResizedCrop(224)"}, "transform must be a ringfeed op"),
        ({"transform": ringfeed.MixUp(num_classes=3)}, "MixUp is a batch transform"),
        ({"batch_transform": ringfeed.RandomInvert()}, "batch_transform must be MixUp, CutMix"),
        ({"seed": -1}, r"seed must be an integer in 0..=9007199254740991"),
        ({"seed": 2**53}, "seed must be"),
        ({"shuffle": 1}, "shuffle must be True or False"),
        ({"layout": "HWC"}, "layout must be 'NHWC' or 'NCHW'"),
        ({"on_error": "ignore"}, "on_error must be 'raise' or 'skip'"),
        ({"on_error": "fail"}, "on_error must be 'raise' or 'skip'"),
        ({"fields": ["image", "mask"]}, r"fields: unknown field 'mask'; the server delivers image, label, index, crop"),
        ({"dtype": torch.float16}, "dtype applies to normalized images only"),
        (
            {"transform": ringfeed.Resize((8, 8)) + ringfeed.Normalize([0.5], [0.5]), "dtype": torch.int32},
            "dtype must be a floating torch dtype",
        ),
        ({"order": "random"}, r"order must be one of 'auto', 'global', 'shard_blocks' or a ringfeed.ShardBlocks"),
        ({"gpu_decode": 1.5}, r"gpu_decode must be 'auto', True, False or a share in 0..1, got 1.5"),
        ({"server": {"socket": NOWHERE}}, r"server must be a ringfeed.Server\(...\)"),
        ({"tuning": {"slots": 2}}, r"tuning must be a ringfeed.Tuning\(...\)"),
        ({"rank": 2, "world_size": 2}, "rank must be"),
        ({"device": "cuda:0" if not torch.cuda.is_available() else "cuda:99"}, "CUDA|does not exist"),
    ],
)
def test_bad_parameters_fail_before_connecting(kw: dict[str, Any], match: str) -> None:
    """Each bad Loader parameter is a ValueError naming it, raised before any connection is tried."""
    args: dict[str, Any] = {
        "batch_size": 2,
        "transform": ringfeed.Resize((8, 8)),
        "server": ringfeed.Server(socket=NOWHERE),
    }
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        ringfeed.Loader("/data/x", **args)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: ringfeed.Server(socket=3), r"Server: socket must be a path, got 3"),
        (lambda: ringfeed.Server(spawn="yes"), r"Server: spawn must be True or False, got 'yes'"),
        (lambda: ringfeed.Server(timeout=0), r"Server: timeout must be a positive number of seconds or None, got 0"),
        (lambda: ringfeed.Server(timeout=-1.0), "Server: timeout must be"),
        (lambda: ringfeed.Server(spawn_timeout=True), "Server: spawn_timeout must be"),
        (lambda: ringfeed.Server(reconnect=-1), r"Server: reconnect must be an integer in 0..=1073741824, got -1"),
        (lambda: ringfeed.Server(reconnect_timeout=0), "Server: reconnect_timeout must be a positive number"),
        (lambda: ringfeed.Server(on_opening=5), r"Server: on_opening must be a callable \(files_listed, seconds\)"),
        (lambda: ringfeed.Tuning(slots=0), r"Tuning: slots must be an integer in 1..=64, got 0"),
        (lambda: ringfeed.Tuning(slots=65), "Tuning: slots must be"),
        (lambda: ringfeed.Tuning(hold=5, slots=4), r"Tuning: hold must be an integer in 1..=4, got 5"),
        (lambda: ringfeed.Tuning(prefetch=5), r"Tuning: prefetch must be an integer in 1..=4, got 5"),
        (lambda: ringfeed.Tuning(threads=0), r"Tuning: threads must be an integer in 1..=1024, got 0"),
        (lambda: ringfeed.Tuning(autotune=1), r"Tuning: autotune must be True or False, got 1"),
        (lambda: ringfeed.Tuning(log_every=0), "Tuning: log_every must be an integer in 1..="),
        (lambda: ringfeed.ShardBlocks(block=0), r"ShardBlocks: block must be an integer in 1..=1048576, got 0"),
        (lambda: ringfeed.ShardBlocks(shard=2**33), r"ShardBlocks: shard must be an integer in 1..=4294967296"),
        (lambda: ringfeed.GPUDecode(share=-0.1), r"gpu_decode must be 'auto', True, False or a share in 0..1"),
        (lambda: ringfeed.GPUDecode(share="on"), r"gpu_decode must be .* got 'on'"),
        (
            lambda: ringfeed.GPUDecode(bytes_per_sample=100),
            r"GPUDecode: bytes_per_sample must be an integer in 4096..=67108864, got 100",
        ),
        (lambda: ringfeed.LMDB(None), r"LMDB: path must be a path, got None"),
        (lambda: ringfeed.LMDB("x.lmdb", layout="json"), r"LMDB: layout must be one of 'auto', 'raw', 'pickle'"),
        (lambda: ringfeed.LMDB("x.lmdb", labels_key=1), r"LMDB: labels_key must be a str, got 1"),
        (lambda: ringfeed.LMDB("x.lmdb", labels="l.csv", labels_key="k"), "LMDB: pass labels .* or labels_key"),
        (lambda: ringfeed.WebDataset("x.tar", image=1), r"WebDataset: image must be a str, got 1"),
        (lambda: ringfeed.WebDataset("x.tar", label=False), r"WebDataset: label must be a str, got False"),
        (lambda: ringfeed.WebDataset("x.tar", write_index="no"), r"WebDataset: write_index must be a bool"),
    ],
)
def test_option_objects_check_their_fields(make: Any, match: str) -> None:
    """Each option object refuses a bad field where it is written, with a ValueError naming the object and field."""
    with pytest.raises(ValueError, match=match):
        make()


def test_option_objects_are_frozen_keyword_only_values() -> None:
    """Option objects compare by value, cannot be changed, and take their settings by keyword only."""
    import dataclasses

    assert ringfeed.Tuning(slots=8) == ringfeed.Tuning(slots=8) != ringfeed.Tuning()
    with pytest.raises(dataclasses.FrozenInstanceError):
        ringfeed.Server().timeout = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        ringfeed.Tuning(True)  # type: ignore[misc]
    with pytest.raises(TypeError):
        ringfeed.LMDB("x.lmdb", "raw")  # type: ignore[misc]
    # Normalised: None keeps the documented defaults of the timeouts it may be.
    assert ringfeed.Server(spawn_timeout=None).spawn_timeout == 10.0  # type: ignore[arg-type]
    assert ringfeed.Server(timeout=None).timeout is None
    assert ringfeed.LMDB("x.lmdb", labels_key="__labels__").options() == {"labels_key": "__labels__"}
    assert ringfeed.WebDataset("x.tar", label="").options() == {"label": ""}


def test_fields_always_include_image_and_label() -> None:
    """fields= lists extras; image and label are always delivered, first, without duplicates."""
    from ringfeed._images import check_fields

    views = ringfeed.Views({"image": ringfeed.CenterCrop(4)})
    assert check_fields(None, views) == ("image", "label")
    assert check_fields(["crop", "image", "index", "crop"], views) == ("image", "label", "crop", "index")
    assert check_fields("index", views) == ("image", "label", "index")
    # Each view is a field, with its erasing boxes when it erases.
    erasing = ringfeed.Views({"a": ringfeed.CenterCrop(4), "b": ringfeed.CenterCrop(2) + ringfeed.RandomErasing()})
    assert check_fields(None, erasing) == ("a", "b", "b_erase", "label")
