"""What the loader checks before it talks to any server: transforms, ranks, devices, parameters.

None of these tests needs a server: every parameter is validated before the connection, so each
bad value fails with a ``ValueError`` naming the parameter (the socket given does not exist).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ringfeed
from ringfeed.loader import resolve_device, resolve_rank

NOWHERE = "/nonexistent/ringfeed.sock"


# -- transforms -------------------------------------------------------------------------------------


def test_random_resized_crop_plus_flip_is_one_protocol_transform() -> None:
    """RandomResizedCrop(224) + Flip() is control.md's random_resized_crop with torchvision's defaults and flip 0.5."""
    t = ringfeed.RandomResizedCrop(224) + ringfeed.Flip()
    assert t.to_json() == {
        "kind": "random_resized_crop",
        "size": [224, 224],
        "scale": [0.08, 1.0],
        "ratio": [0.75, 1.3333333333333333],
        "flip": 0.5,
    }
    assert t.size == (224, 224)


def test_random_resized_crop_alone_does_not_flip() -> None:
    """RandomResizedCrop alone sends flip 0 explicitly (the protocol's default for a missing flip would be 0.5)."""
    t = ringfeed.RandomResizedCrop((160, 128), scale=(0.35, 1), ratio=(1, 2))
    assert t.to_json() == {
        "kind": "random_resized_crop",
        "size": [160, 128],
        "scale": [0.35, 1.0],
        "ratio": [1.0, 2.0],
        "flip": 0.0,
    }


def test_eval_transforms() -> None:
    """CenterCrop and Resize give center_crop and resize; CenterCrop's default resize is size / 0.875."""
    assert ringfeed.CenterCrop(224).to_json() == {"kind": "center_crop", "size": [224, 224], "resize": 256}
    assert ringfeed.CenterCrop(160).resize == 182
    assert ringfeed.CenterCrop((100, 200), resize=300).to_json() == {
        "kind": "center_crop",
        "size": [100, 200],
        "resize": 300,
    }
    assert ringfeed.Resize(64).to_json() == {"kind": "resize", "size": [64, 64]}
    assert ringfeed.Resize([32, 48]).size == (32, 48)


def test_transforms_compare_and_print() -> None:
    """Transforms are values: equal when their protocol objects are, with a readable repr."""
    assert ringfeed.Resize(4) == ringfeed.Resize((4, 4))
    assert ringfeed.Resize(4) != ringfeed.CenterCrop(4)
    assert repr(ringfeed.Resize((4, 5))) == "Resize(size=[4, 5])"
    assert len({ringfeed.Flip(), ringfeed.Flip()}) == 1


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
        (lambda: ringfeed.Flip(1.5), r"Flip: p must be a probability in 0..=1, got 1.5"),
        (lambda: ringfeed.Flip(-0.1), "Flip: p must be"),
        (lambda: ringfeed.Flip("yes"), "Flip: p must be"),  # type: ignore[arg-type]
        (lambda: ringfeed.CenterCrop(224, resize=0), r"CenterCrop: resize must be an int in 1..=4096"),
        (lambda: ringfeed.CenterCrop(224, resize=256.0), "CenterCrop: resize must be"),  # type: ignore[arg-type]
        (lambda: ringfeed.CenterCrop(-1), "CenterCrop: size must be"),
        (lambda: ringfeed.Resize(5000), "Resize: size must be"),
    ],
)
def test_invalid_transform_parameters_name_the_parameter(make: Any, match: str) -> None:
    """Each out-of-range transform parameter is a ValueError naming the transform, the parameter and the value."""
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: ringfeed.RandomResizedCrop(8) + ringfeed.Flip() + ringfeed.Flip(), "already flips"),
        (lambda: ringfeed.CenterCrop(8) + ringfeed.Flip(), "cannot combine CenterCrop with Flip"),
        (lambda: ringfeed.Flip() + ringfeed.RandomResizedCrop(8), "cannot combine Flip with RandomResizedCrop"),
        (lambda: ringfeed.Resize(8) + ringfeed.Resize(8), "only RandomResizedCrop"),
    ],
)
def test_only_crop_plus_flip_combine(make: Any, match: str) -> None:
    """The server runs one transform per stream: only RandomResizedCrop + Flip combine, once."""
    with pytest.raises(TypeError, match=match):
        make()


def test_adding_a_non_transform_is_a_type_error() -> None:
    """Adding something that is not a transform is the usual TypeError."""
    with pytest.raises(TypeError):
        ringfeed.Resize(8) + 1


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
        ({"transform": ringfeed.Flip()}, r"Flip\(\) alone is not a transform"),
        ({"transform": "RandomResizedCrop(224)"}, "transform must be ringfeed.RandomResizedCrop"),
        ({"seed": -1}, r"seed must be an integer in 0..=9007199254740991"),
        ({"seed": 2**53}, "seed must be"),
        ({"shuffle": 1}, "shuffle must be True or False"),
        ({"layout": "HWC"}, "layout must be 'NHWC' or 'NCHW'"),
        ({"slots": 0}, r"slots must be an integer in 1..=64"),
        ({"slots": 65}, "slots must be"),
        ({"on_error": "ignore"}, "on_error must be 'raise' or 'skip'"),
        ({"fields": ["image", "mask"]}, r"fields: unknown field 'mask'; the server delivers image, label, index, crop"),
        ({"timeout": 0}, "timeout must be a positive number of seconds or None"),
        ({"timeout": -1.0}, "timeout must be"),
        ({"hold": 5, "slots": 4}, r"hold must be an integer in 1..=4"),
        ({"dtype": torch.float16}, "dtype applies to normalized images only"),
        ({"normalize": (0.5, 0.5)}, "normalize: mean must be 3 finite numbers"),
        ({"normalize": ((0.5,) * 3, (0.5, 0.0, 0.5))}, "every std must be positive"),
        ({"normalize": ((0.5,) * 3, (0.5,) * 3), "dtype": torch.int32}, "dtype must be a floating torch dtype"),
        ({"normalize": "imagenet"}, r"normalize must be a \(mean, std\) pair"),
        ({"rank": 2, "world_size": 2}, "rank must be"),
        ({"device": "cuda:0" if not torch.cuda.is_available() else "cuda:99"}, "CUDA|does not exist"),
    ],
)
def test_bad_parameters_fail_before_connecting(kw: dict[str, Any], match: str) -> None:
    """Each bad Loader parameter is a ValueError naming it, raised before any connection is tried."""
    args: dict[str, Any] = {"batch_size": 2, "transform": ringfeed.Resize(8), "socket": NOWHERE}
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        ringfeed.Loader("/data/x", **args)


def test_fields_always_include_image_and_label() -> None:
    """fields= lists extras; image and label are always delivered, first, without duplicates."""
    from ringfeed.loader import _check_fields

    assert _check_fields(None) == ("image", "label")
    assert _check_fields(["crop", "image", "index", "crop"]) == ("image", "label", "crop", "index")
    assert _check_fields("index") == ("image", "label", "index")
