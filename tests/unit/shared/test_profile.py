"""Calibration profiles: round trip, identity checks, corrupt and missing files."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import msgpack
import pytest

from eventspec.shared.contract.errors import InvalidInput, NotFound
from eventspec.shared.contract.profile import (
    PROFILE_FORMAT_VERSION,
    CalibrationProfile,
    ProfileMismatch,
    load_profile,
    save_profile,
)
from eventspec.shared.contract.timing import CloudCost, EdgeCost

CLOUD = CalibrationProfile(
    role="cloud",
    model_id="LanguageBind/Video-LLaVA-7B-hf@abc123",
    device="cuda:NVIDIA H100",
    created_unix=1_700_000_000.5,
    cloud=CloudCost(40.0, 0.015, 0.05, 16.3, 0.4, device="cuda:NVIDIA H100"),
    edge=None,
    samples={"step_k1_ms": [16.6, 16.8, 16.7], "step_k8_ms": [19.5]},
)
EDGE = CalibrationProfile(
    role="edge",
    model_id="EventGPT-7b",
    device="cuda:Orin",
    created_unix=1_700_000_001.0,
    cloud=None,
    edge=EdgeCost(66.0, 18.5, 12.0, 5e6, 0.5),
    samples={},
)


def _load(path: Path, **kw: Any) -> CalibrationProfile:
    args: dict[str, Any] = {
        "expected_role": "cloud",
        "expected_model_id": CLOUD.model_id,
    }
    args.update(kw)
    return load_profile(path, **args)


@pytest.mark.parametrize("profile", [CLOUD, EDGE], ids=["cloud", "edge"])
def test_round_trip(tmp_path: Path, profile: CalibrationProfile) -> None:
    path = tmp_path / "sub" / f"{profile.role}.msgpack"
    save_profile(path, profile)
    loaded = load_profile(
        path,
        expected_role=profile.role,
        expected_model_id=profile.model_id,
        expected_device=profile.device,
    )
    assert loaded == profile
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left


def test_save_overwrites_atomically(tmp_path: Path) -> None:
    path = tmp_path / "cloud.msgpack"
    save_profile(path, CLOUD)
    newer = dataclasses.replace(CLOUD, created_unix=1_800_000_000.0)
    save_profile(path, newer)
    assert _load(path).created_unix == 1_800_000_000.0
    assert sorted(os.listdir(tmp_path)) == ["cloud.msgpack"]


def test_failed_write_keeps_old_file_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cloud.msgpack"
    save_profile(path, CLOUD)

    def boom(src: str, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        save_profile(path, dataclasses.replace(CLOUD, model_id="other"))
    monkeypatch.undo()
    assert _load(path) == CLOUD
    assert sorted(os.listdir(tmp_path)) == ["cloud.msgpack"]


def _rewrite(path: Path, **changes: Any) -> None:
    doc = msgpack.unpackb(path.read_bytes())
    doc.update(changes)
    path.write_bytes(msgpack.packb(doc))


def test_version_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "p.msgpack"
    save_profile(path, CLOUD)
    _rewrite(path, version=PROFILE_FORMAT_VERSION + 1)
    with pytest.raises(ProfileMismatch, match="format version 2; this build reads version 1"):
        _load(path)


def test_model_role_device_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "p.msgpack"
    save_profile(path, CLOUD)
    with pytest.raises(ProfileMismatch, match=r"measured for model .* serves 'other-model'"):
        _load(path, expected_model_id="other-model")
    with pytest.raises(ProfileMismatch, match="is for role 'cloud', expected 'edge'"):
        _load(path, expected_role="edge")
    with pytest.raises(ProfileMismatch, match=r"measured on device 'cuda:NVIDIA H100'.*'cpu'"):
        _load(path, expected_device="cpu")
    assert issubclass(ProfileMismatch, InvalidInput)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="does not exist"):
        _load(tmp_path / "absent.msgpack")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not valid msgpack"),
        (b"\xc1garbage", "not valid msgpack"),
        (msgpack.packb([1, 2, 3]), "top level is list"),
        (msgpack.packb({"format": "something-else"}), "format tag"),
    ],
)
def test_corrupt_file(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "p.msgpack"
    path.write_bytes(content)
    with pytest.raises(InvalidInput, match=message):
        _load(path)


def test_truncated_file(tmp_path: Path) -> None:
    path = tmp_path / "p.msgpack"
    save_profile(path, CLOUD)
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(InvalidInput, match="corrupt"):
        _load(path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_id": 7}, "field 'model_id' has type int"),
        ({"cloud": None}, "a cloud profile needs a cloud cost model"),
        ({"cloud": {"prefill_base_ms": 1.0}}, "missing field 'prefill_ms_per_visual_token'"),
        ({"samples": {"x": ["a"]}}, r"samples\['x'\] holds a non-number"),
        ({"role": "gateway"}, "role must be 'cloud' or 'edge'"),
        ({"created_unix": True}, "field 'created_unix' has type bool"),
    ],
)
def test_structurally_bad_profile(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    path = tmp_path / "p.msgpack"
    save_profile(path, CLOUD)
    _rewrite(path, **changes)
    with pytest.raises(InvalidInput, match=message) as info:
        _load(path)
    assert "is corrupt" in str(info.value)


def test_bad_cost_values_are_reported_as_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "p.msgpack"
    save_profile(path, CLOUD)
    doc = msgpack.unpackb(path.read_bytes())
    doc["cloud"]["step_base_ms"] = float("nan")
    path.write_bytes(msgpack.packb(doc))
    with pytest.raises(InvalidInput, match=r"corrupt: CloudCost\.step_base_ms must be finite"):
        _load(path)


def test_profile_invariants() -> None:
    with pytest.raises(InvalidInput, match="edge profile needs an edge cost model"):
        dataclasses.replace(EDGE, edge=None)
    with pytest.raises(InvalidInput, match="model_id"):
        dataclasses.replace(EDGE, model_id="")

