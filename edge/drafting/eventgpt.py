"""EventGPT (Liu et al., CVPR 2025), the edge's draft model, on stock transformers classes.

The released code (``model/EventChatModel.py``) builds CLIP with ``from_pretrained``
inside ``__init__`` and targets transformers 4.x. Here the same modules are rebuilt from
a config so that:

- state-dict keys match the released EventGPT-7b checkpoint exactly
  (``model.embed_tokens``, ``model.layers``, ``model.norm``, ``lm_head``,
  ``model.visual_projector.{0,2}``, ``model.feature_adaptor``, and CLIP at
  ``model.visual_tower.visual_tower``);
- small models of the same classes (the demo world's, ``eventspec.demoworld``) run the
  whole system in tests and the demo;
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

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import (
    AutoConfig,
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

from eventspec.edge.vision.backend import TorchVision, VisionBackend
from eventspec.shared.contract.errors import FailedPrecondition, InvalidInput
from eventspec.shared.node.kvcache import cache_kwarg, crop_cache
from eventspec.shared.node.vocab import text_vocab_fingerprint

log = logging.getLogger(__name__)

#: The placeholder id the event tokens replace (``EVENT_TOKEN_INDEX`` in EventGPT).
EVENT_TOKEN_INDEX = -200
EVENT_PLACEHOLDER = "<event>"
#: vicuna_v1's system line, which EventGPT's conversation template keeps.
SYSTEM_PROMPT = (
    "A chat between a curious human and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the human's questions."
)
#: vicuna_v1 with EventGPT's event markers; ``<event>`` is split out, never tokenized.
PROMPT_TEMPLATE = SYSTEM_PROMPT + " USER: <ev_start><event><ev_end>\n{question} ASSISTANT:"
N_EVENT_FRAMES = 5

CLIP_PREFIX = "model.visual_tower.visual_tower."


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
    #: How the model's event frames were drawn (``eventspec.edge.events.render``): EventGPT's own
    #: per-frame canvas, or the full sensor (the embedded toy draft).
    event_canvas: str = "eventgpt"


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
        self.image_size = image_size_of(self.clip_config)
        patches = (self.image_size // as_int(self.clip_config.patch_size, "patch_size")) ** 2
        self.tokens_per_frame = 1 + patches  # CLS kept
        self.num_event_tokens = N_EVENT_FRAMES + self.tokens_per_frame
        #: Why the HF decoder can no longer run (its weights were freed), or None.
        self.decoder_released: str | None = None
        #: What runs the vision path (``--vision-backend``): PyTorch on the model itself,
        #: or an ONNX Runtime session over an export of it (eventspec.edge.vision.onnx_backend).
        self.vision: VisionBackend = TorchVision(model)

    def release_decoder_weights(self, reason: str) -> None:
        """Free the decoder layers' projection weights (a quantised static drafter holds
        its own copy); embeddings, norms, LM head and the vision path stay. From then
        on the HF path refuses to run, giving ``reason``."""
        layer: Any
        for layer in self.model.event_model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                         layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj,
                         layer.mlp.down_proj):
                proj.weight.data = proj.weight.data.new_empty(0)
        self.decoder_released = reason

    def _check_decoder(self) -> None:
        if self.decoder_released is not None:
            raise FailedPrecondition(
                f"the HF draft decoder cannot run: {self.decoder_released}"
            )

    @property
    def max_positions(self) -> int:
        """Positions the draft LLM was trained for: prompt, event tokens and answer."""
        return as_int(self.model.config.max_position_embeddings, "max_position_embeddings")

    def prompt_positions(self, question: str) -> int:
        """Positions the prefill of ``question`` takes: its prompt ids, with the one
        placeholder replaced by the event tokens."""
        return len(self.build_prompt_ids(question)) - 1 + self.num_event_tokens

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
        chunk, keep only the first chunk's BOS. The template is split before the question
        goes in, so a question that says ``<event>`` stays text: the target has no such
        placeholder and takes it as text, and every mode must treat a question alike.
        """
        chunks = [self.tokenizer(c.format(question=question.strip())).input_ids
                  for c in PROMPT_TEMPLATE.split(EVENT_PLACEHOLDER)]
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
        return self.vision.clip_features(pixel_values)

    @torch.no_grad()
    def event_tokens(self, clip_features: torch.Tensor) -> torch.Tensor:
        """[5, T, Dv] CLIP features -> [5 + T, H] event embeddings, through ``self.vision``."""
        return self.vision.event_tokens(clip_features)

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
        self._check_decoder()
        embeds = self._prompt_embeds(question, pixel_values, clip_features)  # [1, L', H]
        cache = DynamicCache(config=self.model.config)
        out = self.model(
            inputs_embeds=embeds, use_cache=True, logits_to_keep=1,
            **{cache_kwarg(self.model): cache},
        )
        return DraftState(cache, int(embeds.shape[1])), out.logits[0, -1].float()

    @torch.no_grad()
    def prefill_features(
        self,
        question: str,
        pixel_values: torch.Tensor | None,
        *,
        clip_features: torch.Tensor | None = None,
    ) -> tuple[DraftState, torch.Tensor, torch.Tensor]:
        """:meth:`prefill`, also returning the last hidden state after the prompt.

        -> (state, hidden [H] float32, logits [V] float32). The hidden state is the
        decoder's output after its final norm, what the LM head reads: the features a
        token adapter or draft head (``eventspec.edge.learning.token_heads``) maps to the
        target's next token.
        """
        self._check_decoder()
        embeds = self._prompt_embeds(question, pixel_values, clip_features)  # [1, L', H]
        cache = DynamicCache(config=self.model.config)
        hidden, logits = self._decode(cache, inputs_embeds=embeds, keep=1)
        return DraftState(cache, int(embeds.shape[1])), hidden[0], logits[0]

    def _prompt_embeds(self, question: str, pixel_values: torch.Tensor | None,
                       clip_features: torch.Tensor | None) -> torch.Tensor:
        """The prompt's embeddings with the event tokens spliced in. [1, L', H]."""
        if clip_features is None:
            if pixel_values is None:
                raise InvalidInput("prefill needs pixel_values or clip_features")
            clip_features = self.clip_features(pixel_values)
        ids = self.build_prompt_ids(question)
        events = self.event_tokens(clip_features)  # [E, H]
        return self.model.embed_with_events(ids, events)

    def _decode(self, cache: DynamicCache, keep: int,
                **inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder then the LM head on the last ``keep`` positions.

        -> (hidden [keep, H], logits [keep, V]), both float32.
        """
        base = self.model.event_model
        out = base(use_cache=True, **inputs, **{cache_kwarg(base): cache})
        hidden = out.last_hidden_state[0, -keep:]  # [keep, H]
        logits = self.model.lm_head(hidden)  # [keep, V]
        return hidden.float(), logits.float()

    @torch.no_grad()
    def step(self, state: DraftState, tokens: Sequence[int]) -> torch.Tensor:
        """Feed ``tokens`` after the cached sequence -> logits [len(tokens), V] float32."""
        ids = self._step_ids(tokens)  # [1, k]
        out = self.model(input_ids=ids, use_cache=True, **{cache_kwarg(self.model): state.cache})
        logits: torch.Tensor = out.logits[0].float()  # [k, V]
        return logits

    @torch.no_grad()
    def step_features(self, state: DraftState,
                      tokens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`step`, also returning the hidden states: (hidden [k, H], logits [k, V])."""
        ids = self._step_ids(tokens)  # [1, k]
        return self._decode(state.cache, keep=ids.shape[1], input_ids=ids)

    def _step_ids(self, tokens: Sequence[int]) -> torch.Tensor:
        """``tokens`` checked, as input ids [1, k]."""
        toks = [int(t) for t in tokens]
        if not toks:
            raise InvalidInput("step needs at least one token")
        self._check_decoder()
        bad = [t for t in toks if not 0 <= t < self.model.config.vocab_size]
        if bad:
            raise InvalidInput(f"token ids out of range: {bad[:5]}")
        return torch.tensor([toks], dtype=torch.long, device=self.device)

    def rollback(self, state: DraftState, keep_len: int) -> None:
        """Cut the cache back to its first ``keep_len`` positions (never into the prompt).

        Through ``eventspec.shared.node.kvcache.crop_cache``, the crop the cloud's engine uses too.
        """
        crop_cache(state.cache, keep_len, floor=state.prompt_len)

    def seq_len(self, state: DraftState) -> int:
        """Positions held in the cache (prompt incl. event tokens, plus fed tokens)."""
        return int(state.cache.get_seq_length())

    def greedy_next(self, logits_row: torch.Tensor) -> int:
        """Argmax over the shared text vocabulary only (ids >= text_vocab_size masked)."""
        return int(torch.argmax(logits_row[..., : self.text_vocab_size], dim=-1))


@contextmanager
def empty_init(device: str | torch.device, dtype: torch.dtype) -> Iterator[None]:
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


def image_size_of(clip: CLIPVisionConfig) -> int:
    """CLIP's input size (a config may hold an int or an (h, w) pair; EventGPT's is square)."""
    return as_int(clip.image_size, "image_size")


def as_int(value: object, name: str) -> int:
    """A CLIP size field as one int; configs may hold (h, w) pairs, EventGPT's are square."""
    if isinstance(value, list | tuple):
        if len(value) != 2 or value[0] != value[1]:
            raise InvalidInput(f"EventGPT needs a square CLIP {name}, got {value}")
        value = value[0]
    if not isinstance(value, int):
        raise InvalidInput(f"CLIP config has no usable {name} ({value!r})")
    return value
