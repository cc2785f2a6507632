"""The shared vectors in ``proto/vectors/targets/``, read by the Python side of ``targets.rft``.

The Rust writer produced them (``crates/format/src/targets/file/tests.rs``); here the Python
reader must read every sample back exactly and each damage case must raise its pinned kind.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ringfeed.formats.shard import FormatError
from ringfeed.formats.targets import TARGETS_FILE, TargetsFile, grey_png_size, verify_targets

VECTORS = Path(__file__).resolve().parents[2] / "proto" / "vectors" / "targets"
CASES: list[dict[str, Any]] = json.loads((VECTORS / "cases.json").read_text())


def test_vector_reads_back_exactly() -> None:
    """Every sample's boxes, labels and mask bytes equal expected.json's, and the header's members too."""
    expected = json.loads((VECTORS / "expected.json").read_text())
    with TargetsFile(VECTORS / "v1-basic") as t:
        assert t.header.flags == expected["flags"]
        assert t.header.max_boxes == expected["max_boxes"]
        assert t.categories() == expected["categories"]
        assert len(t) == len(expected["samples"])
        for i, want in enumerate(expected["samples"]):
            s = t.get(i, check_crc=True)
            np.testing.assert_array_equal(s.boxes, np.asarray(want["boxes"], dtype=np.float32).reshape(-1, 4))
            assert s.boxes.dtype == np.float32
            assert s.labels.dtype == np.int64
            assert s.labels.tolist() == want["labels"]
            assert s.mask_png.hex() == want["mask_png"]
            assert grey_png_size(s.mask_png)[0] > 0


def test_clean_vector_verifies() -> None:
    """verify_targets accepts the vector and counts what the Rust writer wrote."""
    report = verify_targets(VECTORS / "v1-basic" / TARGETS_FILE, sample_count=4)
    assert (report["samples"], report["boxes"], report["max_boxes"], report["masks"]) == (4, 6, 3, 4)


def test_sample_count_must_match_the_index() -> None:
    """A targets file for another number of samples than the index's is refused, naming both counts."""
    with pytest.raises(FormatError, match="targets for 4 samples, the index has 5"):
        verify_targets(VECTORS / "v1-basic", sample_count=5)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_damage_case_reports_its_pinned_kind(tmp_path: Path, case: dict[str, Any]) -> None:
    """Each damage in cases.json raises the error kind the Rust verifier raises, naming the file."""
    path = tmp_path / TARGETS_FILE
    shutil.copy(VECTORS / "v1-basic" / TARGETS_FILE, path)
    b = bytearray(path.read_bytes())
    if case["op"] == "xor":
        b[case["offset"]] ^= case["value"]
    else:
        del b[case["length"] :]
    path.write_bytes(bytes(b))
    with pytest.raises(FormatError) as e:
        verify_targets(path)
    assert e.value.kind == case["kind"], str(e.value)
    assert TARGETS_FILE in str(e.value)


def test_out_of_range_sample_is_an_index_error() -> None:
    """Reading past the last sample raises IndexError naming the file's count."""
    with TargetsFile(VECTORS / "v1-basic") as t, pytest.raises(IndexError, match="has 4 samples"):
        t.get(4)


def test_vector_1_1_reads_back_exactly() -> None:
    """The 1.1 vector's boxes, keypoints and instance masks (runs decoded to [n, h, w]) equal
    expected-1.1.json's, and verify_targets counts them."""
    expected = json.loads((VECTORS / "expected-1.1.json").read_text())
    with TargetsFile(VECTORS / "v1.1-instances") as t:
        assert (t.header.minor, t.header.flags) == (1, expected["flags"])
        assert (t.header.keypoints, t.header.max_boxes) == (expected["keypoints"], expected["max_boxes"])
        assert t.header.has_instances
        for i, want in enumerate(expected["samples"]):
            s = t.get(i, check_crc=True)
            n = len(want["boxes"])
            np.testing.assert_array_equal(s.boxes, np.asarray(want["boxes"], dtype=np.float32).reshape(-1, 4))
            assert s.labels.tolist() == want["labels"]
            assert s.keypoints is not None
            assert s.instance_masks is not None
            kps = np.asarray(want["keypoints"], dtype=np.float32).reshape(n, 2, 3)
            np.testing.assert_array_equal(s.keypoints, kps)
            masks = np.asarray(want["instance_masks"], dtype=np.uint8).reshape(n, 3, 4)
            np.testing.assert_array_equal(s.instance_masks, masks)
            assert s.mask_png == b""
    report = verify_targets(VECTORS / "v1.1-instances", sample_count=3)
    assert (report["boxes"], report["instances"], report["keypoints"]) == (11, 11, 2)
