"""Calibration profiles: a node's measured cost model, kept in a small msgpack file.

Why a file: calibrating (timing prefill and steps at several sizes) takes
seconds to minutes, so a node measures once at warm-up, stores the fitted
:class:`~eventspec.shared.contract.timing.CloudCost` /
:class:`~eventspec.shared.contract.timing.EdgeCost` with the
raw samples, and reuses it at the next start. A profile is only valid for the
model and device it was measured on, so loading checks both, plus the format
version and the role, and refuses anything else with a clear message.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import msgpack

from eventspec.shared.contract.errors import InvalidInput, NotFound
from eventspec.shared.contract.timing import CLOUD_COST_FIELDS, CloudCost, EdgeCost

PROFILE_FORMAT_VERSION: Final[int] = 1
_FORMAT_TAG: Final[str] = "eventspec-calibration"
_MAX_PROFILE_BYTES: Final[int] = 16 << 20
"""A profile is a few KiB; anything this large is not one of ours."""

Role = Literal["cloud", "edge"]

_EDGE_FIELDS: Final[tuple[str, ...]] = (
    "draft_prefill_ms",
    "draft_ms_per_token",
    "rtt_ms",
    "uplink_bytes_per_s",
    "acceptance_prior",
)


class ProfileMismatch(InvalidInput):
    """The profile is well-formed but belongs to another version, role, model or device."""


@dataclass(frozen=True)
class CalibrationProfile:
    """One node's calibration: identity, the fitted cost model, and the raw samples."""

    role: Role
    model_id: str
    device: str
    created_unix: float
    cloud: CloudCost | None
    edge: EdgeCost | None
    samples: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.role not in ("cloud", "edge"):
            raise InvalidInput(f"profile role must be 'cloud' or 'edge', got {self.role!r}")
        if self.role == "cloud" and self.cloud is None:
            raise InvalidInput("a cloud profile needs a cloud cost model")
        if self.role == "edge" and self.edge is None:
            raise InvalidInput("an edge profile needs an edge cost model")
        if not self.model_id:
            raise InvalidInput("profile model_id must be non-empty")
        if not math.isfinite(self.created_unix):
            raise InvalidInput(f"profile created_unix must be finite, got {self.created_unix!r}")


def _to_document(profile: CalibrationProfile) -> dict[str, Any]:
    cloud = (
        None
        if profile.cloud is None
        else {
            **{f: getattr(profile.cloud, f) for f in CLOUD_COST_FIELDS},
            "device": profile.cloud.device,
        }
    )
    edge = None if profile.edge is None else {f: getattr(profile.edge, f) for f in _EDGE_FIELDS}
    return {
        "format": _FORMAT_TAG,
        "version": PROFILE_FORMAT_VERSION,
        "role": profile.role,
        "model_id": profile.model_id,
        "device": profile.device,
        "created_unix": float(profile.created_unix),
        "cloud": cloud,
        "edge": edge,
        "samples": {k: [float(x) for x in v] for k, v in profile.samples.items()},
    }


def save_profile(path: str | os.PathLike[str], profile: CalibrationProfile) -> None:
    """Write ``profile`` atomically: a temp file in the same folder, fsync, rename.

    A crash mid-write therefore leaves either the old profile or the new one,
    never a truncated file that a later start would reject as corrupt.
    """
    target = Path(path)
    data: bytes = msgpack.packb(_to_document(profile), use_bin_type=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _corrupt(path: Path, why: str) -> InvalidInput:
    return InvalidInput(f"calibration profile {path} is corrupt: {why}")


def _get(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], path: Path) -> Any:
    if key not in doc:
        raise _corrupt(path, f"missing field {key!r}")
    value = doc[key]
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise _corrupt(path, f"field {key!r} has type {type(value).__name__}")
    return value


def _numbers(doc: Mapping[str, Any], fields: Sequence[str], path: Path) -> dict[str, float]:
    return {name: float(_get(doc, name, (int, float), path)) for name in fields}


def _parse(doc: Any, path: Path) -> CalibrationProfile:
    if not isinstance(doc, dict):
        raise _corrupt(path, f"top level is {type(doc).__name__}, not a map")
    if doc.get("format") != _FORMAT_TAG:
        raise _corrupt(path, f"format tag is {doc.get('format')!r}, expected {_FORMAT_TAG!r}")
    version = _get(doc, "version", int, path)
    if version != PROFILE_FORMAT_VERSION:
        raise ProfileMismatch(
            f"calibration profile {path} has format version {version}; this build reads "
            f"version {PROFILE_FORMAT_VERSION} (re-run calibration)"
        )
    cloud_doc = doc.get("cloud")
    edge_doc = doc.get("edge")
    try:
        cloud = None
        if cloud_doc is not None:
            if not isinstance(cloud_doc, dict):
                raise _corrupt(path, "field 'cloud' is not a map")
            device = cloud_doc.get("device", "")
            if not isinstance(device, str):
                raise _corrupt(path, "field 'cloud.device' is not a string")
            numbers: dict[str, Any] = _numbers(cloud_doc, CLOUD_COST_FIELDS, path)
            cloud = CloudCost(**numbers, device=device)
        edge = None
        if edge_doc is not None:
            if not isinstance(edge_doc, dict):
                raise _corrupt(path, "field 'edge' is not a map")
            edge = EdgeCost(**_numbers(edge_doc, _EDGE_FIELDS, path))
        raw_samples = _get(doc, "samples", dict, path)
        samples: dict[str, list[float]] = {}
        for key, values in raw_samples.items():
            if not isinstance(key, str) or not isinstance(values, list):
                raise _corrupt(path, f"samples entry {key!r} is not a name -> list of numbers")
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                raise _corrupt(path, f"samples[{key!r}] holds a non-number")
            samples[key] = [float(v) for v in values]
        return CalibrationProfile(
            role=_get(doc, "role", str, path),
            model_id=_get(doc, "model_id", str, path),
            device=_get(doc, "device", str, path),
            created_unix=float(_get(doc, "created_unix", (int, float), path)),
            cloud=cloud,
            edge=edge,
            samples=samples,
        )
    except ProfileMismatch:
        raise
    except InvalidInput as exc:
        if exc.message.startswith(f"calibration profile {path}"):
            raise
        raise _corrupt(path, exc.message) from exc


def load_profile(
    path: str | os.PathLike[str],
    *,
    expected_role: Role,
    expected_model_id: str,
    expected_device: str | None = None,
) -> CalibrationProfile:
    """Read a profile and check it belongs to this node's role, model and device.

    Raises :class:`NotFound` for a missing file, :class:`ProfileMismatch` for a
    profile of another format version / role / model / device, and
    :class:`InvalidInput` for anything unreadable.
    """
    p = Path(path)
    try:
        with p.open("rb") as fh:
            raw = fh.read(_MAX_PROFILE_BYTES + 1)
    except FileNotFoundError:
        raise NotFound(f"calibration profile {p} does not exist (run calibration)") from None
    except IsADirectoryError:
        raise InvalidInput(f"calibration profile {p} is a directory, not a file") from None
    if len(raw) > _MAX_PROFILE_BYTES:
        raise _corrupt(p, f"larger than {_MAX_PROFILE_BYTES} bytes")
    try:
        doc = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise _corrupt(p, f"not valid msgpack ({exc})") from None
    profile = _parse(doc, p)
    if profile.role != expected_role:
        raise ProfileMismatch(
            f"calibration profile {p} is for role {profile.role!r}, expected {expected_role!r}"
        )
    if profile.model_id != expected_model_id:
        raise ProfileMismatch(
            f"calibration profile {p} was measured for model {profile.model_id!r}, "
            f"but this node serves {expected_model_id!r} (re-run calibration)"
        )
    if expected_device is not None and profile.device != expected_device:
        raise ProfileMismatch(
            f"calibration profile {p} was measured on device {profile.device!r}, "
            f"but this node runs on {expected_device!r} (re-run calibration)"
        )
    return profile

