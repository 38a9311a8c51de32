"""What each KV slot of the static runtime holds, and the checks every call makes
against it before any model work.

Why apart from :class:`.runtime.StaticRuntime`: the runtime's job is the forward (the
layers, the graphs, the attention); this is pure bookkeeping, the same on CPU and CUDA,
and every entry point (prefill, step, mixed step, prompt rows as a step, prefix reuse)
asks it the same questions: is this slot in range and alive, how many positions may it
use, does this piece continue where the slot's prompt ended. Keeping the answers in one
place is what makes "one bad piece fails the call, nothing written" hold for all of them.

A slot is:

- **in range**: fixed slots ``0 .. num_slots - 1``; KV by length (``kv_positions``), a
  run's first position ``0 .. kv_positions - 1``;
- **reserved** (KV by length only): the run of positions it may use, from
  :meth:`SlotOccupancy.reserve`; with fixed slots every slot has ``max_seq_len``;
- **live**: it holds a prefilled session, so a step may write its next tokens;
- **filled to n**: its first n prompt positions are written; a chunk continues there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.batch import StepBatch

__all__ = ["SlotOccupancy"]


class SlotOccupancy:
    """Live sessions, filled prompt positions and reserved runs of a static KV."""

    def __init__(self, *, num_slots: int, max_seq_len: int,
                 kv_positions: int | None = None) -> None:
        """``kv_positions``: KV by length, an arena of that many positions (a slot id is
        a run's first position); None: ``num_slots`` fixed slots of ``max_seq_len``."""
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.kv_positions = kv_positions
        self._live: set[int] = set()
        #: Prompt positions each slot holds (chunks continue from here).
        self._filled: dict[int, int] = {}
        #: KV by length: each session's run, first position -> positions reserved.
        self._reserved: dict[int, int] = {}
        self._released = False

    # -- questions ------------------------------------------------------------------

    @property
    def scratch_slot(self) -> int:
        """Where padding rows write: the extra slot, or the window after the arena."""
        return self.num_slots if self.kv_positions is None else self.kv_positions

    def room(self, slot: int) -> int:
        """Positions the session in ``slot`` may use: the slot, or the run it reserved
        (none reserved: 0, so nothing fits)."""
        if self.kv_positions is None:
            return self.max_seq_len
        return self._reserved.get(slot, 0)

    def filled(self, slot: int) -> int:
        """Prompt positions ``slot`` holds (0: none)."""
        return self._filled.get(slot, 0)

    def is_live(self, slot: int) -> bool:
        """Whether ``slot`` holds a prefilled session a step may continue."""
        return slot in self._live

    # -- checks (InvalidInput naming the slot; nothing changes) -----------------------

    def check_slot(self, slot: int) -> None:
        """InvalidInput unless ``slot`` is in range of a runtime that still serves."""
        if self._released:
            raise InvalidInput("this engine was released (its server stopped)")
        top = self.num_slots if self.kv_positions is None else self.kv_positions
        if not 0 <= slot < top:
            raise InvalidInput(f"slot {slot} outside 0..{top - 1}")

    def check_step(self, batch: StepBatch) -> None:
        """InvalidInput unless every session of ``batch`` is live, named once, and its
        tokens fit its room."""
        b = len(batch.slots)
        if b == 0 or not len(batch.start_positions) == len(batch.counts) == b:
            raise InvalidInput("a step needs matching, non-empty slots/starts/counts")
        if len(set(batch.slots)) != b:
            raise InvalidInput("a step names a slot twice")
        triples = zip(batch.slots, batch.start_positions, batch.counts, strict=True)
        for slot, start, count in triples:
            if slot not in self._live:
                raise InvalidInput(f"slot {slot} holds no prefilled session")
            if count < 1 or start < 1 or start + count > self.room(slot):
                raise InvalidInput(
                    f"slot {slot}: tokens [{start}, {start + count}) outside 1..{self.room(slot)}"
                )
        n = batch.num_tokens
        if tuple(batch.token_ids.shape) != (n,):
            raise InvalidInput(f"token_ids must be [{n}], got {list(batch.token_ids.shape)}")

    def check_runs(self, slots: Sequence[int], starts: Sequence[int],
                   lengths: Sequence[int]) -> None:
        """InvalidInput unless each slot is named once, and each piece of ``lengths[r]``
        rows from ``starts[r]`` fits its slot and continues what the slot holds."""
        if len(set(slots)) != len(slots):
            raise InvalidInput("a prefill names a slot twice")
        for s, start, n in zip(slots, starts, lengths, strict=True):
            self.check_slot(s)
            if not 0 < start + n <= self.room(s) - 1 or n < 1:
                raise InvalidInput(
                    f"prompt of {start + n} tokens does not fit a slot of {self.room(s)}")
            if start and self._filled.get(s) != start:
                raise InvalidInput(f"slot {s} holds {self.filled(s)} prompt positions, "
                                   f"not {start}: a chunk must continue where the last ended")

    # -- changes --------------------------------------------------------------------

    def reserve(self, slot: int, positions: int) -> None:
        """KV by length: the session starting at position ``slot`` of the arena owns
        ``positions`` from there (the caller's allocator keeps runs apart). Fixed slots:
        only checks the length."""
        self.check_slot(slot)
        if not 0 < positions <= self.max_seq_len:
            raise InvalidInput(f"a session of {positions} positions; this engine holds "
                               f"1..{self.max_seq_len} per session")
        if self.kv_positions is not None:
            if slot + positions > self.kv_positions:
                raise InvalidInput(f"a run of {positions} positions from {slot} passes the "
                                   f"arena's end ({self.kv_positions})")
            self._reserved[slot] = positions

    def fill(self, slots: Sequence[int], starts: Sequence[int], lengths: Sequence[int]) -> None:
        """Pieces were written: each slot is live and holds its prompt to start + length."""
        self._live.update(slots)
        for s, st, n in zip(slots, starts, lengths, strict=True):
            self._filled[s] = st + n

    def prompt_written_to(self, slot: int, positions: int) -> None:
        """``slot``'s first ``positions`` prompt positions were written by other means (a
        copied prefix): a prefill continues from there; not yet a session to step."""
        self.check_slot(slot)
        self._filled[slot] = positions

    def hold(self, slot: int, positions: int) -> None:
        """Declare that ``slot`` holds a session whose first ``positions`` prompt
        positions were written by other means (a benchmark's KV, or a chunk it reruns)."""
        self.prompt_written_to(slot, positions)
        self._live.add(slot)

    def open_for_prompt_rows(self, slots: Iterable[int]) -> list[int]:
        """Make ``slots`` live for a step that carries their prompt rows; returns those
        that were not, for :meth:`close` if that step fails."""
        added = [s for s in slots if s not in self._live]
        self._live.update(added)
        return added

    def close(self, slots: Iterable[int]) -> None:
        """Undo :meth:`open_for_prompt_rows` (the step failed; nothing is held)."""
        self._live.difference_update(slots)

    def free(self, slot: int) -> None:
        """Forget the slot's content (idempotent); by length, its reservation ends too."""
        self.check_slot(slot)
        self._live.discard(slot)
        self._filled.pop(slot, None)
        self._reserved.pop(slot, None)

    def release(self) -> None:
        """The runtime serves nothing more: every later check fails."""
        self._released = True
        self._live.clear()
        self._filled.clear()
        self._reserved.clear()
