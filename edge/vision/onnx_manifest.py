"""An ONNX export's manifest (``export.json``): what it was made from, and the staleness check.

An export is only right for the weights it was traced from. Its manifest records the
EventGPT config, the adapter config, and the sha256 of each weight file that holds an
exported tensor (:func:`~eventspec.edge.drafting.checkpoint.vision_weight_files`, plus the
adapter's file); the edge recomputes these for the directories it loads and refuses an
export that differs, naming both directories and the command that makes a fresh one.
The check compares contents, not paths: an export stays valid for a copy of its model.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eventspec.edge.drafting.checkpoint import vision_weight_files
from eventspec.edge.vision.align import CONFIG_NAME as ADAPTER_CONFIG
from eventspec.edge.vision.align import WEIGHTS_NAME as ADAPTER_WEIGHTS
from eventspec.shared.contract.errors import FailedPrecondition, InvalidInput, NotFound

MANIFEST_NAME = "export.json"
FORMAT_VERSION = 1
#: The three graphs of an export: pixels -> CLIP features, CLIP features -> event
#: tokens (projector, adaptor, pooling), CLIP features -> aligned features (adapter).
GRAPHS = ("clip", "events", "adapter")
#: Precisions an export holds: fp32 (the reference, for the CPU execution provider) and
#: fp16 with fused attention / LayerNorm / GELU (for the CUDA execution provider).
PRECISIONS = ("fp32", "fp16")
_CHUNK = 1 << 24


@dataclass(frozen=True)
class Sources:
    """What an export is made from, or what an edge loads: configs and weight checksums."""

    model_config: dict[str, Any]
    #: weight file (relative to its directory, CLIP directory files prefixed ``clip/``)
    #: -> sha256
    model_weights: dict[str, str]
    adapter_config: dict[str, Any] | None = None
    adapter_weights: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "model": {"config": self.model_config, "weights_sha256": self.model_weights},
            "adapter": None if self.adapter_config is None else {
                "config": self.adapter_config, "weights_sha256": self.adapter_weights},
        }


def sha256_of(path: Path) -> str:
    """The file's sha256, read in 16 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sources_of(model_dir: Path, adapter_dir: Path | None) -> Sources:
    """The configs and vision weight checksums of a model (and adapter) directory."""
    model_config = _read_json(model_dir / "config.json")
    weights = {}
    for f in vision_weight_files(model_dir):
        name = f.name if f.parent == model_dir else f"clip/{f.name}"
        weights[name] = sha256_of(f)
    if adapter_dir is None:
        return Sources(model_config, weights)
    weights_path = adapter_dir / ADAPTER_WEIGHTS
    if not weights_path.is_file():
        raise NotFound(f"feature adapter file {weights_path} not found")
    return Sources(model_config, weights, _read_json(adapter_dir / ADAPTER_CONFIG),
                   sha256_of(weights_path))


def write_manifest(out: Path, sources: Sources, **fields: Any) -> Path:
    """Write ``export.json``: the format version, the sources, and ``fields`` (graphs,
    opset, exporter and library versions, geometry)."""
    path = out / MANIFEST_NAME
    path.write_text(json.dumps(
        {"format_version": FORMAT_VERSION, **sources.to_json(), **fields}, indent=1))
    return path


def read_manifest(export_dir: Path) -> dict[str, Any]:
    """The manifest of an export directory; NotFound / InvalidInput naming the file."""
    path = export_dir / MANIFEST_NAME
    if not path.is_file():
        raise NotFound(
            f"{export_dir} is not an ONNX export ({MANIFEST_NAME} missing); make one with "
            "`eventspec-edge export-onnx --model DIR --out DIR`"
        )
    manifest = _read_json(path)
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise InvalidInput(
            f"{path}: export format {version!r} is not supported (want {FORMAT_VERSION}); "
            "re-run `eventspec-edge export-onnx`"
        )
    return manifest


def check_fresh(export_dir: Path, manifest: dict[str, Any], model_dir: Path,
                adapter_dir: Path | None) -> None:
    """Refuse (FailedPrecondition) an export not made from these directories' weights.

    The message names the export, the model (and adapter) directory, what differs, and
    the export-onnx command that makes a fresh export.
    """
    now = sources_of(model_dir, adapter_dir)
    made = manifest.get("model") or {}
    diffs = _diff("model config", made.get("config"), now.model_config)
    diffs += _diff_weights(made.get("weights_sha256") or {}, now.model_weights)
    adapter = manifest.get("adapter")
    if adapter_dir is not None:
        if adapter is None:
            diffs.append(f"it holds no adapter, and the edge loads {adapter_dir}")
        else:
            diffs += _diff("adapter config", adapter.get("config"), now.adapter_config)
            if adapter.get("weights_sha256") != now.adapter_weights:
                diffs.append(f"adapter weights sha256 {str(adapter.get('weights_sha256'))[:12]} "
                             f"in the export, {str(now.adapter_weights)[:12]} in {adapter_dir}")
    if diffs:
        again = f"--model {model_dir}" + (f" --adapter {adapter_dir}" if adapter_dir else "")
        raise FailedPrecondition(
            f"the ONNX export {export_dir} is stale for the model {model_dir}"
            + (f" and adapter {adapter_dir}" if adapter_dir else "") + ": "
            + "; ".join(diffs)
            + f". Re-run `eventspec-edge export-onnx {again} --out {export_dir}`"
        )


def _diff(what: str, made: Any, now: Any) -> list[str]:
    if made == now:
        return []
    if not isinstance(made, dict) or not isinstance(now, dict):
        return [f"{what} differs"]
    keys = sorted(k for k in made.keys() | now.keys() if made.get(k) != now.get(k))
    return [f"{what} differs in {', '.join(keys[:6])}"]


def _diff_weights(made: dict[str, str], now: dict[str, str]) -> list[str]:
    out = []
    for name in sorted(made.keys() | now.keys()):
        a, b = made.get(name), now.get(name)
        if a != b:
            out.append(f"weights {name}: sha256 {(a or 'absent')[:12]} in the export, "
                       f"{(b or 'absent')[:12]} now")
    return out


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise NotFound(f"{path} not found")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidInput(f"{path} does not hold a JSON object")
    return data
