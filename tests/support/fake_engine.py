"""A fake ``BatchedEngine`` with a deterministic "model", for the scheduler's tests.

The next token is a hash of the whole sequence so far, so a wrong start position, a lost
rollback or a draft accepted against the wrong row changes the answer. It keeps every
slot's tokens, so a test can also check that the scheduler freed every slot.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from eventspec.cloud.engine.base import PrefillChunk, PrefillRequest
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.batch import StepBatch

VOCAB, TEXT_VOCAB, EOS = 40, 32, 2


def next_token(seq: Sequence[int]) -> int:
    """The fake model's greedy choice after ``seq``: a hash, EOS now and then."""
    h = 0
    for t in seq:
        h = (h * 1_000_003 + t + 1) % 2_147_483_647
    return h % TEXT_VOCAB


class FakeEngine:
    """``BatchedEngine`` whose logits are one-hot at ``next_token`` of each prefix."""

    def __init__(self, num_slots: int, max_seq_len: int = 64) -> None:
        self.device = torch.device("cpu")
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.slots: list[list[int] | None] = [None] * num_slots

    def _row(self, seq: Sequence[int]) -> torch.Tensor:
        row = torch.zeros(VOCAB)
        row[next_token(seq)] = 1.0
        row[TEXT_VOCAB + 1] = 5.0  # a non-text id that must never be chosen
        return row

    def prefill(self, requests: Sequence[PrefillRequest]) -> torch.Tensor:
        rows = []
        for r in requests:
            self.slots[r.slot] = list(r.input_ids)
            rows.append(self._row(r.input_ids))
        return torch.stack(rows)  # [R, V]

    def step(self, batch: StepBatch) -> torch.Tensor:
        rows, offset = [], 0
        for slot, start, count in zip(batch.slots, batch.start_positions, batch.counts,
                                      strict=True):
            held = self.slots[slot]
            assert held is not None, f"slot {slot} stepped while free"
            assert start <= len(held), "start beyond what the slot holds"
            assert start + count <= self.max_seq_len
            seq = held[:start] + batch.token_ids[offset : offset + count].tolist()
            self.slots[slot] = seq
            rows += [self._row(seq[: start + i + 1]) for i in range(count)]
            offset += count
        return torch.stack(rows)  # [N, V]

    def free(self, slot: int) -> None:
        self.slots[slot] = None


def target_only(prompt: Sequence[int], max_new: int, max_seq_len: int) -> list[int]:
    out: list[int] = []
    while True:
        tok = next_token([*prompt, *out])
        out.append(tok)
        if tok == EOS or len(out) >= max_new or len(prompt) + len(out) >= max_seq_len:
            return out


class ChunkedFakeEngine(FakeEngine):
    """``FakeEngine`` that also prefills in chunks and takes saved prefixes (the
    ``ChunkedPrefillEngine`` side); ``events`` records every call in order:
    ("prefill", slots), ("chunk", [(slot, start, end)]) and ("step", slots)."""

    def __init__(self, num_slots: int, max_seq_len: int = 64) -> None:
        super().__init__(num_slots, max_seq_len)
        self.events: list[tuple[str, list[object]]] = []
        self.poison: int | None = None  # a prompt holding this id fails its chunk call
        self.embedded: list[tuple[int, int]] = []  # (slot, start) of prompt_embeds calls
        #: When set, the second step waits in ``held`` until ``gate`` opens (10 s at most).
        self.hold_second_step = False
        self.held = threading.Event()
        self.gate = threading.Event()
        #: When set to N, the N-th chunk call writes its chunks, then waits in
        #: ``chunk_held`` until ``chunk_gate`` opens (10 s at most).
        self.hold_after_chunk_call: int | None = None
        self.chunk_held = threading.Event()
        self.chunk_gate = threading.Event()

    def prefill(self, requests: Sequence[PrefillRequest]) -> torch.Tensor:
        self.events.append(("prefill", [r.slot for r in requests]))
        return super().prefill(requests)

    def step(self, batch: StepBatch) -> torch.Tensor:
        self.events.append(("step", list(batch.slots)))
        if self.hold_second_step and sum(kind == "step" for kind, _ in self.events) == 2:
            self.held.set()
            assert self.gate.wait(timeout=10), "the test never opened the gate"
        return super().step(batch)

    def prompt_embeds(self, request: PrefillRequest, start: int = 0) -> torch.Tensor:
        self.embedded.append((request.slot, start))
        return torch.tensor([float(i) for i in request.input_ids[start:]])[:, None]  # [L, 1]

    def prefill_chunks(self, chunks: Sequence[PrefillChunk]) -> torch.Tensor:
        self.events.append(("chunk", [(c.slot, c.start, c.start + len(c.embeds))
                                      for c in chunks]))
        rows = []
        for c in chunks:
            ids = [int(x) for x in c.embeds[:, 0].tolist()]
            if self.poison is not None and self.poison in ids:
                raise InvalidInput("input_ids: a poisoned prompt")
            held = self.slots[c.slot] or []
            assert len(held) == c.start or c.start == 0, "a chunk skipped positions"
            seq = (held if c.start else []) + ids
            self.slots[c.slot] = seq
            rows.append(self._row(seq))
        calls = sum(kind == "chunk" for kind, _ in self.events)
        if self.hold_after_chunk_call == calls:
            self.chunk_held.set()
            assert self.chunk_gate.wait(timeout=10), "the test never opened the chunk gate"
        return torch.stack(rows)  # [R, V]

    def save_prefix(self, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        held = self.slots[slot]
        assert held is not None and length <= len(held)
        ids = torch.tensor(held[:length], dtype=torch.float32)
        return ids, ids.clone()

    def load_prefix(self, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.slots[slot] = [int(x) for x in k.tolist()]


class MixedFakeEngine(ChunkedFakeEngine):
    """``ChunkedFakeEngine`` whose chunks can ride a step (the ``MixedStepEngine``
    side); a mixed call is recorded as ("mixed", [step slots, [(slot, start, end)]])."""

    mixed_steps = True

    def step_with_chunks(self, batch: StepBatch, chunks: Sequence[PrefillChunk]
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        mark = len(self.events)
        chunk_logits = self.prefill_chunks(chunks)  # a poisoned chunk fails the call first
        logits = super().step(batch)
        del self.events[mark:]
        self.events.append(("mixed", [list(batch.slots),
                                      [(c.slot, c.start, c.start + len(c.embeds))
                                       for c in chunks]]))
        return logits, chunk_logits
