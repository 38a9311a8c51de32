"""EventGPT (Liu et al., CVPR 2025), the edge's draft model, on stock transformers classes.

The released code (``model/EventChatModel.py``) builds CLIP with ``from_pretrained``
inside ``__init__`` and targets transformers 4.x. Here the same modules are rebuilt from
a config so that:

- state-dict keys match the released EventGPT-7b checkpoint exactly
  (``model.embed_tokens``, ``model.layers``, ``model.norm``, ``lm_head``,
  ``model.visual_projector.{0,2}``, ``model.feature_adaptor``, and CLIP at
  ``model.visual_tower.visual_tower``);
- tiny random models of the same classes run the whole system in tests;
- loading is explicit and bit-exact: 0 missing, 0 unexpected keys, or a clear error.

Vision path: 5 event frames -> CLIP last layer ``last_hidden_state`` (CLS kept,
[5, 577, 1024] at 7B) -> visual_projector -> feature_adaptor -> [per-frame mean (5),
per-position mean over frames (577)] = 582 tokens spliced in place of the single
``-200`` placeholder of the prompt.

Speculation needs a draft whose KV cache can be extended and cut back cheaply, so
:class:`DraftModel` exposes prefill / step / rollback over a ``DynamicCache`` rather
than ``generate()``.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from huggingface_hub.dataclasses import strict
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from transformers import (
    AutoConfig,
    AutoTokenizer,
    CLIPVisionConfig,
    CLIPVisionModel,
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaModel,
    PreTrainedTokenizerBase,
)
from transformers.initialization import no_init_weights
from transformers.models.llama.modeling_llama import LlamaPreTrainedModel

from shared.errors import InvalidInput, NotFound
from shared.tiny_tokenizer import build_tiny_tokenizer, text_vocab_fingerprint

log = logging.getLogger(__name__)

#: The placeholder id the event tokens replace (``EVENT_TOKEN_INDEX`` in EventGPT).
EVENT_TOKEN_INDEX = -200
EVENT_PLACEHOLDER = "<event>"
#: vicuna_v1 with EventGPT's event markers; ``<event>`` is split out, never tokenized.
PROMPT_TEMPLATE = (
    "A chat between a curious human and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the human's questions. "
    "USER: <ev_start><event><ev_end>\n{question} ASSISTANT:"
)
N_EVENT_FRAMES = 5

CLIP_PREFIX = "model.visual_tower.visual_tower."
_LEGACY_CLIP_PREFIX = CLIP_PREFIX + "vision_model."
#: Buffers some older checkpoints saved; today they are recomputed, never loaded.
_IGNORED_KEY_PATTERNS = (
    re.compile(r"\.rotary_emb\.inv_freq$"),
    re.compile(r"(^|\.)embeddings\.position_ids$"),
)
#: Parts of a full CLIP checkpoint (text tower, projections) that EventGPT does not use.
_CLIP_UNUSED = re.compile(r"^(text_model\.|text_projection\.|visual_projection\.|logit_scale$)")


@strict
class EventGPTConfig(LlamaConfig):  # type: ignore[no-untyped-call]
    """EventGPT's config: Vicuna's LlamaConfig plus the vision fields.

    ``vision_config`` is a CLIPVisionConfig dict; the released checkpoint has none and
    names a CLIP directory in ``mm_visual_tower`` instead, which :func:`load_draft`
    reads (or infers the tower from the weights' shapes).
    """

    model_type = "EventChat_llama"

    mm_visual_tower: str | None = None
    event_feature_adaptor: bool = True
    vision_config: dict[str, Any] | None = None
    image_size: int | None = None


AutoConfig.register(EventGPTConfig.model_type, EventGPTConfig, exist_ok=True)


def clip_config_of(config: EventGPTConfig) -> CLIPVisionConfig:
    """The CLIPVisionConfig that ``config.vision_config`` describes."""
    if not config.vision_config:
        raise InvalidInput(
            "EventGPT config has no vision_config; load the model with load_draft, which "
            "takes the CLIP config from mm_visual_tower or clip_path"
        )
    vc = dict(config.vision_config)
    if vc.get("model_type") == "clip":  # a full CLIPConfig dict
        vc = dict(vc["vision_config"])
    vc.pop("model_type", None)
    return CLIPVisionConfig(**vc)


class EventGPTVisualTower(nn.Module):
    """Holds CLIP at ``visual_tower.visual_tower``, the nesting of the released checkpoint."""

    def __init__(self, config: CLIPVisionConfig) -> None:
        super().__init__()
        self.visual_tower = CLIPVisionModel(config)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, 3, S, S] -> last layer's ``last_hidden_state`` [N, 1 + (S/P)², Dv], CLS kept."""
        out = self.visual_tower(pixel_values=pixel_values)
        hidden: torch.Tensor = out.last_hidden_state
        return hidden


class EventGPTModel(LlamaModel):  # type: ignore[no-untyped-call]
    """LlamaModel plus CLIP, the 2-layer projector and the feature adaptor."""

    def __init__(self, config: EventGPTConfig) -> None:
        super().__init__(config)
        clip_cfg = clip_config_of(config)
        hidden = config.hidden_size
        self.visual_tower = EventGPTVisualTower(clip_cfg)
        # Sized from the configs (the original hard-codes 1024 -> 4096).
        self.visual_projector = nn.Sequential(
            nn.Linear(clip_cfg.hidden_size, hidden), nn.GELU(), nn.Linear(hidden, hidden)
        )
        self.feature_adaptor: nn.Module = (
            nn.Linear(hidden, hidden) if config.event_feature_adaptor else nn.Identity()
        )


class EventGPTForCausalLM(LlamaForCausalLM):  # type: ignore[no-untyped-call]
    """The causal LM with EventGPT's vision path (EventChatModel in the original)."""

    config_class = EventGPTConfig

    def __init__(self, config: EventGPTConfig) -> None:
        # Skip LlamaForCausalLM.__init__ so a plain LlamaModel is never built and dropped.
        LlamaPreTrainedModel.__init__(self, config)
        self.model = EventGPTModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()  # type: ignore[no-untyped-call]

    @property
    def event_model(self) -> EventGPTModel:
        assert isinstance(self.model, EventGPTModel)
        return self.model

    def clip_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, 3, S, S] -> raw CLIP last layer [N, T, Dv] (T = 1 + (S/P)²)."""
        dtype = next(self.event_model.visual_projector.parameters()).dtype
        feats: torch.Tensor = self.event_model.visual_tower(pixel_values.to(self.device, dtype))
        return feats

    def event_tokens(self, clip_features: torch.Tensor) -> torch.Tensor:
        """[F, T, Dv] CLIP features -> [F + T, H] event embeddings.

        Projector and adaptor per frame, then EventGPT's spatio-temporal pooling:
        the mean over tokens of each frame (F), then the mean over frames of each
        token position (T).
        """
        if clip_features.ndim != 3:
            raise InvalidInput(f"CLIP features must be [F, T, D], got {tuple(clip_features.shape)}")
        m = self.event_model
        feats = m.feature_adaptor(m.visual_projector(clip_features))  # [F, T, H]
        temporal = feats.mean(dim=1)  # [F, H]
        spatial = feats.mean(dim=0)  # [T, H]
        return torch.cat([temporal, spatial], dim=0)  # [F + T, H]

    def embed_with_events(self, input_ids: Sequence[int], events: torch.Tensor) -> torch.Tensor:
        """Prompt ids with exactly one ``-200`` -> inputs_embeds [1, L - 1 + E, H]."""
        ids = torch.tensor(list(input_ids), dtype=torch.long, device=self.device)  # [L]
        where = (ids == EVENT_TOKEN_INDEX).nonzero().flatten()
        if where.numel() != 1:
            raise InvalidInput(
                f"prompt must hold exactly one event placeholder, found {where.numel()}"
            )
        pos = int(where[0])
        embed = self.get_input_embeddings()
        before = embed(ids[:pos])  # [pos, H]
        after = embed(ids[pos + 1 :])  # [L - pos - 1, H]
        return torch.cat([before, events.to(before.dtype), after], dim=0).unsqueeze(0)


@dataclass
class DraftState:
    """One request's draft KV cache. ``prompt_len`` counts the spliced event tokens."""

    cache: DynamicCache
    prompt_len: int


class DraftModel:
    """EventGPT for speculative drafting: prefill once, then step / roll back the cache.

    ``text_vocab_size`` is the first id past the shared text vocabulary (32000 for
    Vicuna, where ``<ev_patch>`` sits); drafts must stay below it, because the target's
    ids past it mean something else (``<image>``).
    """

    def __init__(
        self, model: EventGPTForCausalLM, tokenizer: PreTrainedTokenizerBase, model_id: str
    ) -> None:
        model.train(False)
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.text_vocab_size = int(tokenizer.vocab_size)
        if model.config.vocab_size < self.text_vocab_size:
            raise InvalidInput(
                f"model vocab {model.config.vocab_size} is smaller than the tokenizer's text "
                f"vocab {self.text_vocab_size}"
            )
        eos = tokenizer.eos_token_id
        if not isinstance(eos, int):
            raise InvalidInput("the draft tokenizer has no EOS token")
        self.eos_token_id = eos
        pieces = tokenizer.convert_ids_to_tokens(list(range(self.text_vocab_size)))
        self.vocab_fingerprint = text_vocab_fingerprint([str(p) for p in pieces])
        config = model.config
        if not isinstance(config, EventGPTConfig):
            raise InvalidInput(f"expected an EventGPTConfig, got {type(config).__name__}")
        self.clip_config = clip_config_of(config)
        self.image_size = _image_size(self.clip_config)
        patches = (self.image_size // _as_int(self.clip_config.patch_size, "patch_size")) ** 2
        self.tokens_per_frame = 1 + patches  # CLS kept
        self.num_event_tokens = N_EVENT_FRAMES + self.tokens_per_frame

    @property
    def device(self) -> torch.device:
        device: torch.device = self.model.device
        return device

    @property
    def dtype(self) -> torch.dtype:
        dtype: torch.dtype = self.model.dtype
        return dtype

    def build_prompt_ids(self, question: str) -> list[int]:
        """vicuna_v1 prompt ids with one ``-200`` where the event tokens go.

        As EventGPT's ``tokenizer_event_token``: split on ``<event>``, tokenize each
        chunk, keep only the first chunk's BOS.
        """
        if EVENT_PLACEHOLDER in question:
            raise InvalidInput(f"the question must not contain {EVENT_PLACEHOLDER!r}")
        prompt = PROMPT_TEMPLATE.format(question=question.strip())
        chunks = [self.tokenizer(c).input_ids for c in prompt.split(EVENT_PLACEHOLDER)]
        bos = self.tokenizer.bos_token_id
        ids: list[int] = list(chunks[0])
        for chunk in chunks[1:]:
            ids.append(EVENT_TOKEN_INDEX)
            ids.extend(chunk[1:] if chunk and chunk[0] == bos else chunk)
        return ids

    @torch.no_grad()
    def clip_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[5, 3, S, S] preprocessed event frames -> raw CLIP last layer [5, T, Dv]."""
        if pixel_values.ndim != 4 or pixel_values.shape[1:] != (
            3,
            self.image_size,
            self.image_size,
        ):
            raise InvalidInput(
                f"event pixels must be [F, 3, {self.image_size}, {self.image_size}], got "
                f"{tuple(pixel_values.shape)}"
            )
        feats: torch.Tensor = self.model.clip_features(pixel_values)
        return feats

    @torch.no_grad()
    def prefill(
        self,
        question: str,
        pixel_values: torch.Tensor | None,
        *,
        clip_features: torch.Tensor | None = None,
    ) -> tuple[DraftState, torch.Tensor]:
        """Run the prompt with the event tokens -> (state, next-token logits [V] float32).

        Pass ``clip_features`` (from :meth:`clip_features`) instead of pixels when they
        were already computed, e.g. for the aligned-features path.
        """
        if clip_features is None:
            if pixel_values is None:
                raise InvalidInput("prefill needs pixel_values or clip_features")
            clip_features = self.clip_features(pixel_values)
        ids = self.build_prompt_ids(question)
        events = self.model.event_tokens(clip_features.to(self.device, self.dtype))  # [E, H]
        embeds = self.model.embed_with_events(ids, events)  # [1, L', H]
        cache = DynamicCache(config=self.model.config)
        out = self.model(
            inputs_embeds=embeds, past_key_values=cache, use_cache=True, logits_to_keep=1
        )
        return DraftState(cache, int(embeds.shape[1])), out.logits[0, -1].float()

    @torch.no_grad()
    def step(self, state: DraftState, tokens: Sequence[int]) -> torch.Tensor:
        """Feed ``tokens`` after the cached sequence -> logits [len(tokens), V] float32."""
        toks = [int(t) for t in tokens]
        if not toks:
            raise InvalidInput("step needs at least one token")
        bad = [t for t in toks if not 0 <= t < self.model.config.vocab_size]
        if bad:
            raise InvalidInput(f"token ids out of range: {bad[:5]}")
        ids = torch.tensor([toks], dtype=torch.long, device=self.device)  # [1, k]
        out = self.model(input_ids=ids, past_key_values=state.cache, use_cache=True)
        logits: torch.Tensor = out.logits[0].float()  # [k, V]
        return logits

    def rollback(self, state: DraftState, keep_len: int) -> None:
        """Cut the cache back to its first ``keep_len`` positions (never into the prompt).

        ``DynamicCache.crop`` takes a negative count of positions to drop: that reads
        the same on transformers 4.x and 5.x, while a positive argument means an
        absolute length in 4.x and raises in 5.23.
        """
        current = self.seq_len(state)
        if not state.prompt_len <= keep_len <= current:
            raise InvalidInput(
                f"cannot roll back to {keep_len}: the cache holds {current} positions, "
                f"{state.prompt_len} of them prompt"
            )
        if keep_len < current:
            state.cache.crop(keep_len - current)

    def seq_len(self, state: DraftState) -> int:
        """Positions held in the cache (prompt incl. event tokens, plus fed tokens)."""
        return int(state.cache.get_seq_length())

    def greedy_next(self, logits_row: torch.Tensor) -> int:
        """Argmax over the shared text vocabulary only (ids >= text_vocab_size masked)."""
        return int(torch.argmax(logits_row[..., : self.text_vocab_size], dim=-1))


# -- building ----------------------------------------------------------------------------


def tiny_config(vocab_size: int = 576) -> EventGPTConfig:
    """The embedded tiny EventGPT: CLIP 32-d/2 layers at 28 px (5 tokens/frame), LLaMA 64-d."""
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
        projection_dim=32,
    )
    return EventGPTConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        mm_visual_tower=None,
        event_feature_adaptor=True,
        vision_config=vision.to_dict(),
        image_size=28,
    )


def build_tiny_random_draft(
    seed: int = 0, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> DraftModel:
    """A deterministic tiny random EventGPT with the tiny ``draft`` tokenizer."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=build_tiny_tokenizer("draft"),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<unk>",
    )
    config = tiny_config(vocab_size=_round_up(len(tokenizer), 64))
    with _fork_rng(seed):
        model = EventGPTForCausalLM(config)
    model.to(device=torch.device(device), dtype=dtype)  # type: ignore[call-arg]
    return DraftModel(model, tokenizer, model_id=f"tiny-random-eventgpt-{seed}")


@contextmanager
def _fork_rng(seed: int) -> Iterator[None]:
    """Seed torch for a deterministic init without disturbing the caller's RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _round_up(n: int, multiple: int) -> int:
    return int(math.ceil(n / multiple) * multiple)


@contextmanager
def _empty_init(device: str | torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Build modules directly on ``device`` in ``dtype`` and skip random init: the
    weights are overwritten by the checkpoint anyway, and initialising 7B parameters
    on a CPU takes minutes."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), no_init_weights():
            yield
    finally:
        torch.set_default_dtype(previous)


# -- loading and saving --------------------------------------------------------------------


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
    config.image_size = _image_size(clip_config_of(config))

    with _empty_init(device, dtype):
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


def _image_size(clip: CLIPVisionConfig) -> int:
    """CLIP's input size (a config may hold an int or an (h, w) pair; EventGPT's is square)."""
    return _as_int(clip.image_size, "image_size")


def _as_int(value: object, name: str) -> int:
    """A CLIP size field as one int; configs may hold (h, w) pairs, EventGPT's are square."""
    if isinstance(value, list | tuple):
        if len(value) != 2 or value[0] != value[1]:
            raise InvalidInput(f"EventGPT needs a square CLIP {name}, got {value}")
        value = value[0]
    if not isinstance(value, int):
        raise InvalidInput(f"CLIP config has no usable {name} ({value!r})")
    return value


def _load_tokenizer(root: Path) -> PreTrainedTokenizerBase:
    if not any((root / n).is_file() for n in ("tokenizer.json", "tokenizer.model")):
        raise NotFound(f"no tokenizer (tokenizer.json or tokenizer.model) in {root}")
    tok: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(root))
    return tok
