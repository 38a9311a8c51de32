"""EventGPT's LLM on the shared static-KV runtime: the fast drafter backend.

The HF reference (:class:`~eventspec.edge.drafting.eventgpt.DraftModel` with a ``DynamicCache``)
pays
Python and allocator overhead per layer per token: 56.6 ms per draft token at full size
on an H200, eleven times the cloud's own step. This backend runs the same decoder on
the runtime the cloud's engine uses (:mod:`eventspec.shared.node.static.runtime`): one KV
slot, the event tokens spliced into the prompt's embeddings at prefill, single- and
k-token steps replayed from CUDA graphs, and rollback as a length change (gpt-fast's
static cache; the drafts' own KV past the kept length is never read again).

The vision side (CLIP, projector, adaptor, pooling: ``DraftModel.vision``, torch or ONNX
Runtime) and the prompt stay the DraftModel's, so both backends draft from identical
event embeddings; on CPU the runtime
runs its plain torch layer functions, and tests check that it drafts exactly what the HF
reference drafts (fp32; rollbacks and refeeds included).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from eventspec.edge.drafting.cache import DraftBackend
from eventspec.edge.drafting.eventgpt import DraftModel
from eventspec.edge.drafting.headed_backend import HeadedDraftBackend
from eventspec.edge.drafting.oracle_backend import OracleDraftBackend
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.batch import StepBatch
from eventspec.shared.node.static.quant import QuantMode, quantize_language_weights
from eventspec.shared.node.static.runtime import StaticRuntime
from eventspec.shared.node.static.weights import (
    fuse_llama_weights,
    llama_unsupported_reason,
    rope_tables,
)

#: Draft steps the graphs are captured for: one token (drafting), and the refeeds a
#: Commit causes (the committed tokens the draft cache has not seen).
DRAFT_TOKEN_BUCKETS = (1, 2, 4, 8, 16)
#: KV slots a drafter keeps by default: one per request drafting at once; more requests
#: than slots take turns (the least recently used is evicted and rebuilt on its next
#: step). A full-size EventGPT slot of 2,048 positions holds about 1 GiB in bf16.
DRAFT_SLOTS = 2


def draft_session_buckets(num_slots: int) -> tuple[int, ...]:
    """Requests one draft step holds, per captured graph: 1, and powers of two up to the
    slots (sessions drafting together in one forward, :meth:`StaticDraftBackend.step_many`)."""
    out, b = [1], 2
    while b <= num_slots:
        out.append(b)
        b *= 2
    if out[-1] != num_slots:
        out.append(num_slots)
    return tuple(out)


@dataclass(eq=False)
class StaticDraftState:
    """One request's draft: ``slot`` holds ``length`` positions (while this state owns
    it), ``prompt_len`` of them the prompt with its spliced event tokens (never rolled
    back into). ``embeds`` and ``tokens`` (those fed after the prompt) are what rebuild
    the slot's KV if another request took it meanwhile."""

    length: int
    prompt_len: int
    slot: int = 0
    embeds: torch.Tensor | None = None  # [prompt_len, H]
    tokens: list[int] = field(default_factory=list)


def static_draft_unsupported_reason(draft: DraftModel) -> str | None:
    """Why this draft model cannot run on the static runtime (None when it can)."""
    model: Any = draft.model
    return llama_unsupported_reason(getattr(model, "model", None), getattr(model, "lm_head", None))


class StaticDraftBackend:
    """``DraftBackend`` (:mod:`eventspec.edge.drafting.cache`) on a one-slot static runtime.

    Each request drafting at once owns one of ``num_slots`` KV slots. With more requests
    than slots, a prefill (or a step of a request whose slot was taken) evicts the least
    recently used owner; the evicted request's KV is rebuilt from its prompt embeddings
    and fed tokens on its next step, so drafts never read another request's cache.
    ``max_seq_len`` defaults to the draft model's trained positions. ``quant``
    stores the decoder layers' weights in int8 or int4 (:mod:`eventspec.shared.node.static.quant`);
    the dense weights stay with the HF model unless :meth:`release_dense_weights` is
    called. ``keep_quant_values`` keeps int4's unpacked codes (for reference checks).
    """

    def __init__(
        self, draft: DraftModel, *, max_seq_len: int | None = None, use_graphs: bool = True,
        compile_layers: bool = False, token_buckets: Sequence[int] = DRAFT_TOKEN_BUCKETS,
        quant: QuantMode = QuantMode.NONE, keep_quant_values: bool = False,
        num_slots: int = DRAFT_SLOTS,
    ) -> None:
        reason = static_draft_unsupported_reason(draft)
        if reason is not None:
            raise InvalidInput(f"the static drafter cannot run this model: {reason}")
        model: Any = draft.model
        positions = max_seq_len if max_seq_len is not None else draft.max_positions
        if not 0 < positions <= draft.max_positions:
            raise InvalidInput(
                f"max_seq_len {positions} outside 1..{draft.max_positions} positions"
            )
        self.draft = draft
        self.text_vocab_size = draft.text_vocab_size
        self.eos_token_id = draft.eos_token_id
        self.quant = quant
        cos, sin = rope_tables(model.model, positions, draft.device, draft.dtype)  # [T, D]
        weights = quantize_language_weights(
            fuse_llama_weights(model.model, model.lm_head), quant, keep_values=keep_quant_values
        )
        if num_slots < 1:
            raise InvalidInput(f"the static drafter needs at least one KV slot, got {num_slots}")
        self.runtime = StaticRuntime(
            weights, cos, sin, num_slots=num_slots,
            max_seq_len=positions, use_graphs=use_graphs, compile_layers=compile_layers,
            session_buckets=draft_session_buckets(num_slots), token_buckets=token_buckets,
        )
        self._owners: list[StaticDraftState | None] = [None] * num_slots
        self._last_use = [0] * num_slots
        self._uses = 0
        #: Slots rebuilt because another request had taken them (thrash, when high).
        self.rebuilds = 0

    def warm_up(self) -> dict[str, float]:
        """Capture the step graphs (CUDA); nothing to do on CPU."""
        return self.runtime.warm_up()

    def release_dense_weights(self) -> None:
        """Free the HF decoder's dense layer weights once they are quantised: a 7B
        drafter then holds ~3.4 GB (int4) instead of ~13 GB. The draft model's own HF
        path can no longer run (it refuses, saying why)."""
        if self.quant is QuantMode.NONE:
            return
        self.draft.release_decoder_weights(f"its weights were quantised to {self.quant.value}")

    @torch.no_grad()
    def prefill(
        self, question: str, pixel_values: torch.Tensor | None, *,
        clip_features: torch.Tensor | None = None,
    ) -> tuple[StaticDraftState, torch.Tensor]:
        """The prompt with its event tokens into the slot -> (state, logits [V] float32)."""
        d = self.draft
        if clip_features is None:
            if pixel_values is None:
                raise InvalidInput("prefill needs pixel_values or clip_features")
            clip_features = d.clip_features(pixel_values)  # [F, T, Dv]
        ids = d.build_prompt_ids(question)
        events = d.event_tokens(clip_features)  # [E, H], through d.vision
        embeds = d.model.embed_with_events(ids, events)[0]  # [L', H]
        n = int(embeds.shape[0])
        state = StaticDraftState(length=n, prompt_len=n, embeds=embeds)
        logits = self._load(state)  # [1, V]
        return state, logits[0]

    def step(self, state: StaticDraftState, tokens: Sequence[int]) -> torch.Tensor:
        """Feed ``tokens`` after the held sequence -> logits [len(tokens), V] float32."""
        toks = [int(t) for t in tokens]
        if not toks:
            raise InvalidInput("step needs at least one token")
        vocab = self.runtime.weights.vocab
        bad = [t for t in toks if not 0 <= t < vocab]
        if bad:
            raise InvalidInput(f"token ids out of range: {bad[:5]}")
        if self._owners[state.slot] is not state:  # another request took the slot
            self._load(state)
            self.rebuilds += 1
        self._touch(state.slot)
        rows = self._feed(state, toks)
        state.tokens.extend(toks)
        return rows  # [k, V]

    def step_many(self, items: Sequence[tuple[StaticDraftState, Sequence[int]]]
                  ) -> list[torch.Tensor]:
        """:meth:`step` for several requests in one batched forward over their slots
        (issue 36: an edge's sessions draft together, as the cloud's verify together).
        Requests sharing a slot, or feeding more than the largest token bucket, go one
        at a time (:meth:`step`); so do all of them with fewer slots than requests."""
        toks = [[int(t) for t in tokens] for _, tokens in items]
        cap = max(self.runtime.token_buckets)
        if (len(items) > len(self._owners) or any(not t or len(t) > cap for t in toks)):
            return [self.step(state, t) for (state, _), t in zip(items, toks, strict=True)]
        vocab = self.runtime.weights.vocab
        for t in toks:
            bad = [x for x in t if not 0 <= x < vocab]
            if bad:
                raise InvalidInput(f"token ids out of range: {bad[:5]}")
        states = [state for state, _ in items]
        for state in states:
            if self._owners[state.slot] is not state:  # another request took the slot
                self._load(state)
                self.rebuilds += 1
        if len({s.slot for s in states}) < len(states):  # reloads still collided
            return [self.step(state, t) for state, t in zip(states, toks, strict=True)]
        for state in states:
            self._touch(state.slot)
        ids = torch.tensor([x for t in toks for x in t], dtype=torch.long,
                           device=self.runtime.device)  # [sum k]
        rows = self.runtime.step(StepBatch(tuple(s.slot for s in states),
                                           tuple(s.length for s in states),
                                           tuple(len(t) for t in toks), ids))  # [sum k, V]
        out = list(torch.split(rows, [len(t) for t in toks]))
        for state, t in zip(states, toks, strict=True):
            state.length += len(t)
            state.tokens.extend(t)
        return out

    def _touch(self, slot: int) -> None:
        self._uses += 1
        self._last_use[slot] = self._uses

    def _load(self, state: StaticDraftState) -> torch.Tensor:
        """Give ``state`` the least recently used slot and rebuild its KV there: the
        prompt, then the tokens fed since. Returns the prompt's last logits [1, V]."""
        assert state.embeds is not None
        slot = min(range(len(self._owners)), key=lambda s: self._last_use[s])
        self._owners[slot] = state
        self._touch(slot)
        state.slot = slot
        logits = self.runtime.prefill_embeds([slot], [state.embeds])  # [1, V]
        state.length = state.prompt_len
        if state.tokens:
            self._feed(state, list(state.tokens))
        return logits

    def _feed(self, state: StaticDraftState, toks: list[int]) -> torch.Tensor:
        """Step ``toks`` into the state's slot, at most the largest bucket at a time
        -> logits [len(toks), V]."""
        cap = max(self.runtime.token_buckets)
        rows = []
        for i in range(0, len(toks), cap):
            chunk = toks[i : i + cap]
            ids = torch.tensor(chunk, dtype=torch.long, device=self.runtime.device)  # [k]
            rows.append(self.runtime.step(
                StepBatch((state.slot,), (state.length,), (len(chunk),), ids)))
            state.length += len(chunk)
        return rows[0] if len(rows) == 1 else torch.cat(rows)

    def rollback(self, state: StaticDraftState, keep_len: int) -> None:
        """Keep the first ``keep_len`` positions: a length change (never into the prompt)."""
        if not state.prompt_len <= keep_len <= state.length:
            raise InvalidInput(
                f"rollback to {keep_len} outside {state.prompt_len}..{state.length}"
            )
        state.length = keep_len
        del state.tokens[keep_len - state.prompt_len :]

    def seq_len(self, state: StaticDraftState) -> int:
        return state.length

    def greedy_next(self, logits_row: torch.Tensor) -> int:
        return self.draft.greedy_next(logits_row)


def draft_backend_for(
    choice: str, draft: DraftModel, quant: QuantMode = QuantMode.NONE,
    slots: int = DRAFT_SLOTS,
) -> DraftBackend:
    """``--draft-engine`` and ``--draft-quant``: what to draft with, warm (graphs
    captured) when static.

    "auto" is the static runtime on CUDA, or whenever quantised weights are asked for,
    when the model is a plain LLaMA decoder; the HF reference otherwise (on CPU the
    static runtime saves little: no graphs). "static" on a model the runtime cannot run
    is refused, naming why, and so is a quantised "hf". A quantised backend frees the
    dense decoder weights it replaced.
    """
    if choice == "hf":
        if quant is not QuantMode.NONE:
            raise InvalidInput(
                f"--draft-quant {quant.value} needs the static drafter; use --draft-engine "
                "static or auto"
            )
        return draft
    reason = static_draft_unsupported_reason(draft)
    if choice == "auto" and quant is QuantMode.NONE and draft.device.type != "cuda":
        return draft
    if choice == "auto" and reason is not None:
        if quant is not QuantMode.NONE:
            raise InvalidInput(f"--draft-quant {quant.value} needs the static drafter: {reason}")
        return draft
    backend = StaticDraftBackend(draft, quant=quant, num_slots=slots)
    backend.release_dense_weights()
    backend.warm_up()
    return backend


def draft_engine_name(backend: DraftBackend) -> str:
    """"static", "static int8", "static int4", "hf", a draft head's name ("hf + adapter
    DIR"), or the oracle's label ("oracle α=0.8, ... — benchmarks only"): what the edge
    reports and logs."""
    if isinstance(backend, OracleDraftBackend | HeadedDraftBackend):
        return backend.name
    if not isinstance(backend, StaticDraftBackend):
        return "hf"
    return "static" if backend.quant is QuantMode.NONE else f"static {backend.quant.value}"
