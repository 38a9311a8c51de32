"""Loading and saving EventGPT checkpoints in the released EventGPT-7b layout.

The released checkpoint names its weights ``model.embed_tokens.*``, ``model.layers.*``,
``model.visual_projector.{0,2}.*``, ``model.feature_adaptor.*``, ``lm_head.*`` and, usually,
the frozen CLIP as ``model.visual_tower.visual_tower.vision_model.*`` (transformers 4.x
names). The loader takes CLIP from inside the checkpoint when present, else from a local
CLIP directory (``clip_path`` or the config's ``mm_visual_tower``), and accepts 4.x and
5.x key names; anything missing or unexpected is an error that lists the keys.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from transformers import (
    AutoTokenizer,
    CLIPVisionConfig,
    PreTrainedTokenizerBase,
)

from eventspec.edge.drafting.eventgpt import (
    CLIP_PREFIX,
    DraftModel,
    EventGPTConfig,
    EventGPTForCausalLM,
    clip_config_of,
    empty_init,
    image_size_of,
)
from eventspec.shared.contract.errors import InvalidInput, NotFound

log = logging.getLogger(__name__)

_LEGACY_CLIP_PREFIX = CLIP_PREFIX + "vision_model."
_IGNORED_KEY_PATTERNS = (
    re.compile(r"\.rotary_emb\.inv_freq$"),
    re.compile(r"(^|\.)embeddings\.position_ids$"),
)
_CLIP_UNUSED = re.compile(r"^(text_model\.|text_projection\.|visual_projection\.|logit_scale$)")


def load_draft(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    clip_path: str | None = None,
) -> DraftModel:
    """Load an EventGPT checkpoint directory bit-exactly.

    The directory holds ``config.json``, ``*.safetensors`` (possibly sharded with an
    index) and tokenizer files. CLIP weights may be inside (4.x names
    ``...visual_tower.vision_model.*`` or 5.x names) or absent; when absent they come
    from ``clip_path`` or ``config.mm_visual_tower``, a local CLIP directory.
    Raises NotFound for missing files and InvalidInput listing any missing or
    unexpected keys.
    """
    root = Path(path)
    if not (root / "config.json").is_file():
        raise NotFound(f"no EventGPT checkpoint at {root} (config.json missing)")
    config = EventGPTConfig.from_json_file(str(root / "config.json"))
    files = _weight_files(root)
    keys = [k for f in files for k in _keys_of(f)]
    has_clip = any(k.startswith(CLIP_PREFIX) for k in keys)

    clip_dir = _local_clip_dir(clip_path, config.mm_visual_tower)
    if not has_clip and clip_dir is None:
        raise NotFound(
            f"{root} holds no CLIP weights and no local CLIP directory was given "
            f"(mm_visual_tower={config.mm_visual_tower!r}); pass clip_path"
        )
    if clip_dir is not None and (not has_clip or not config.vision_config):
        config.vision_config = _read_clip_config(clip_dir).to_dict()
    elif not config.vision_config:
        config.vision_config = _infer_clip_config(
            {k: s for f in files for k, s in _shapes_of(f, CLIP_PREFIX).items()}
        ).to_dict()
        log.warning("%s: no vision_config or CLIP dir; inferred CLIP from weight shapes", root)
    config.image_size = image_size_of(clip_config_of(config))

    with empty_init(device, dtype):
        model = EventGPTForCausalLM(config)
    expected = set(model.state_dict().keys())
    loaded: set[str] = set()
    unexpected: list[str] = []
    for f in files:
        tensors = {_rename_key(k): v for k, v in _read_tensors(f).items()}
        _load_into(model, tensors, expected, loaded, unexpected)
    if not has_clip:
        assert clip_dir is not None
        for f in _weight_files(clip_dir):
            tensors = {}
            for k, v in _read_tensors(f).items():
                if _CLIP_UNUSED.match(k):
                    continue
                k = k.removeprefix("vision_model.")
                tensors[CLIP_PREFIX + k] = v
            _load_into(model, tensors, expected, loaded, unexpected)
    missing = sorted(expected - loaded)
    if missing or unexpected:
        raise InvalidInput(
            f"EventGPT checkpoint {root} does not match the model: "
            f"{len(missing)} missing keys {missing[:10]}, "
            f"{len(unexpected)} unexpected keys {sorted(unexpected)[:10]}"
        )
    model.train(False)
    tokenizer = _load_tokenizer(root)
    log.info(
        "loaded EventGPT from %s (%d tensors, CLIP %s)",
        root,
        len(loaded),
        "inside" if has_clip else f"from {clip_dir}",
    )
    return DraftModel(model, tokenizer, model_id=str(config.name_or_path or root.name))


def save_draft(
    draft: DraftModel,
    path: str | Path,
    layout: Literal["4.x", "5.x"] = "4.x",
    include_clip: bool = True,
    *,
    mm_visual_tower: str | None = None,
    max_shard_bytes: int | None = None,
) -> Path:
    """Write a checkpoint directory (for tests and the embedded default).

    ``layout="4.x"`` names CLIP keys ``...visual_tower.vision_model.*`` as the released
    checkpoint does. ``max_shard_bytes`` splits the weights into shards plus an index.
    """
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    config = EventGPTConfig.from_dict(draft.model.config.to_dict())
    if mm_visual_tower is not None:
        config.mm_visual_tower = mm_visual_tower
    config.save_pretrained(str(out))
    state: dict[str, torch.Tensor] = {}
    for k, v in draft.model.state_dict().items():
        if k.startswith(CLIP_PREFIX):
            if not include_clip:
                continue
            if layout == "4.x":
                k = _LEGACY_CLIP_PREFIX + k.removeprefix(CLIP_PREFIX)
        state[k] = v.detach().contiguous().cpu()
    _save_sharded(state, out, max_shard_bytes)
    draft.tokenizer.save_pretrained(str(out))
    return out


def save_clip(draft: DraftModel, path: str | Path, layout: Literal["4.x", "5.x"] = "4.x") -> Path:
    """Write the draft's CLIP as a standalone CLIPVisionModel directory (as in
    ``mm_visual_tower``): config.json + model.safetensors."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    draft.clip_config.save_pretrained(str(out))
    tower = draft.model.event_model.visual_tower.visual_tower
    prefix = "vision_model." if layout == "4.x" else ""
    state = {prefix + k: v.detach().contiguous().cpu() for k, v in tower.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


#: The state-dict prefixes of the vision path (CLIP, projector, feature adaptor).
VISION_PREFIXES = ("model.visual_tower.", "model.visual_projector.", "model.feature_adaptor.")


def vision_weight_files(path: str | Path) -> list[Path]:
    """The weight files that hold the vision path's tensors of the checkpoint in ``path``.

    Those of its own files that hold any CLIP, projector or adaptor tensor; when CLIP is
    not inside, also the local CLIP directory's (``mm_visual_tower``), as :func:`load_draft`
    takes it. An ONNX export checksums these only, so that checking an export does not
    read all of a 7B checkpoint's shards.
    """
    root = Path(path)
    if not (root / "config.json").is_file():
        raise NotFound(f"no EventGPT checkpoint at {root} (config.json missing)")
    files: list[Path] = []
    has_clip = False
    for f in _weight_files(root):
        names = [_rename_key(k) for k in _keys_of(f)]
        has_clip = has_clip or any(k.startswith(CLIP_PREFIX) for k in names)
        if any(k.startswith(VISION_PREFIXES) for k in names):
            files.append(f)
    if not has_clip:
        config = json.loads((root / "config.json").read_text())
        clip_dir = _local_clip_dir(None, config.get("mm_visual_tower"))
        if clip_dir is None:
            raise NotFound(f"{root} holds no CLIP weights and names no local CLIP directory")
        files.extend(_weight_files(clip_dir))
    return files


def _rename_key(key: str) -> str:
    """4.x CLIP names -> this module's names. transformers 5.x renames ``vision_model.``
    only inside its own ``from_pretrained`` for a top-level CLIPVisionModel, so a
    checkpoint read here is renamed explicitly."""
    if key.startswith(_LEGACY_CLIP_PREFIX):
        return CLIP_PREFIX + key.removeprefix(_LEGACY_CLIP_PREFIX)
    return key


def _load_into(
    model: nn.Module,
    tensors: dict[str, torch.Tensor],
    expected: set[str],
    loaded: set[str],
    unexpected: list[str],
) -> None:
    """Copy known tensors into ``model``; record the rest (ignoring obsolete buffers)."""
    known: dict[str, torch.Tensor] = {}
    for k, v in tensors.items():
        if k in expected:
            known[k] = v
        elif any(p.search(k) for p in _IGNORED_KEY_PATTERNS):
            log.debug("ignoring obsolete buffer %s", k)
        else:
            unexpected.append(k)
    params = model.state_dict()
    for k, v in known.items():
        if params[k].shape != v.shape:
            raise InvalidInput(
                f"checkpoint tensor {k} has shape {tuple(v.shape)}, the model expects "
                f"{tuple(params[k].shape)}"
            )
    model.load_state_dict(known, strict=False)
    loaded.update(known)


def _weight_files(root: Path) -> list[Path]:
    """The weight files of a directory: indexed shards, else all *.safetensors, else .bin."""
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [root / name for name in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise NotFound(f"{index} names shards that are missing: {absent}")
        return files
    files = sorted(root.glob("*.safetensors"))
    if not files:
        files = sorted(root.glob("pytorch_model*.bin"))
    if not files:
        raise NotFound(f"no *.safetensors weights in {root}")
    return files


def _keys_of(f: Path) -> list[str]:
    if f.suffix == ".bin":
        return list(_read_tensors(f).keys())
    with safe_open(str(f), framework="pt") as sf:
        return list(sf.keys())


def _shapes_of(f: Path, prefix: str) -> dict[str, tuple[int, ...]]:
    """Shapes of the tensors under ``prefix`` (renamed to 5.x names, prefix stripped)."""
    out: dict[str, tuple[int, ...]] = {}
    if f.suffix == ".bin":
        for k, v in _read_tensors(f).items():
            k = _rename_key(k)
            if k.startswith(prefix):
                out[k.removeprefix(prefix)] = tuple(v.shape)
        return out
    with safe_open(str(f), framework="pt") as sf:
        for k in sf.keys():  # noqa: SIM118  (safe_open is not a Mapping)
            name = _rename_key(k)
            if name.startswith(prefix):
                out[name.removeprefix(prefix)] = tuple(sf.get_slice(k).get_shape())
    return out


def _read_tensors(f: Path) -> dict[str, torch.Tensor]:
    try:
        if f.suffix == ".bin":
            data = torch.load(str(f), map_location="cpu", weights_only=True)
            return dict(data)
        with safe_open(str(f), framework="pt") as sf:
            return {k: sf.get_tensor(k) for k in sf.keys()}  # noqa: SIM118
    except (OSError, RuntimeError, ValueError) as exc:
        raise InvalidInput(f"could not read weights {f}: {exc}") from exc


def _save_sharded(state: dict[str, torch.Tensor], out: Path, max_shard_bytes: int | None) -> None:
    if max_shard_bytes is None:
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for k, v in state.items():
        nbytes = v.numel() * v.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += nbytes
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(v.numel() * v.element_size() for v in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _local_clip_dir(clip_path: str | None, mm_visual_tower: str | None) -> Path | None:
    """``clip_path`` (must exist) or ``mm_visual_tower`` if it names a local directory."""
    if clip_path is not None:
        p = Path(clip_path)
        if not (p / "config.json").is_file():
            raise NotFound(f"CLIP directory {p} has no config.json")
        return p
    if mm_visual_tower:
        p = Path(mm_visual_tower)
        if (p / "config.json").is_file():
            return p
        log.info("mm_visual_tower %r is not a local directory; ignoring it", mm_visual_tower)
    return None


def _read_clip_config(clip_dir: Path) -> CLIPVisionConfig:
    """A CLIPVisionConfig from a CLIP dir holding either a CLIPConfig or a vision config."""
    raw: dict[str, Any] = json.loads((clip_dir / "config.json").read_text())
    if raw.get("model_type") == "clip" or "vision_config" in raw:
        raw = dict(raw["vision_config"])
    raw.pop("model_type", None)
    raw.pop("architectures", None)
    return CLIPVisionConfig(**raw)


def _infer_clip_config(shapes: dict[str, tuple[int, ...]]) -> CLIPVisionConfig:
    """Rebuild a CLIPVisionConfig from weight shapes (released checkpoint, no CLIP dir).

    Head count is not visible in shapes; OpenAI CLIP ViTs all use 64-dim heads.
    """
    try:
        hidden, _, patch, _ = shapes["embeddings.patch_embedding.weight"]
        n_pos = shapes["embeddings.position_embedding.weight"][0]
        inter = shapes["encoder.layers.0.mlp.fc1.weight"][0]
    except KeyError as exc:
        raise InvalidInput(f"cannot infer the CLIP config: missing {exc}") from exc
    layers = 1 + max(int(k.split(".")[2]) for k in shapes if k.startswith("encoder.layers."))
    grid = math.isqrt(n_pos - 1)
    return CLIPVisionConfig(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        patch_size=patch,
        image_size=grid * patch,
    )


def _load_tokenizer(root: Path) -> PreTrainedTokenizerBase:
    if not any((root / n).is_file() for n in ("tokenizer.json", "tokenizer.model")):
        raise NotFound(f"no tokenizer (tokenizer.json or tokenizer.model) in {root}")
    tok: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(root))
    return tok
