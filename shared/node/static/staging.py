"""A static-engine step's index arrays: built on the host, staged to the device in one copy.

Every padded step reads the same few index arrays (positions, where each row's K/V
goes, each session's slot, start and length). They live in one int64 block at fixed
offsets (:class:`~eventspec.shared.node.static.buckets.MetaLayout`) so each bucket's
views keep the addresses its CUDA graph captured; per step the host fills them with
numpy, copies them once (pinned, asynchronous) and scatters the token ids, and nothing
synchronises with the host. On CUDA the numpy arrays are written straight into one of
two pinned blocks kept for the static buffers (a step waits, on an event, only for the
copy out of the block it reuses, two steps back): a fresh pinned copy per step cost
about 0.06 ms of host time at one session on an H200, a third of loading the step
(``tools/pyspy_steps.py --within StepStaging.load``; docs/results/load-gpu.md). Kept apart from
``eventspec.cloud.engine.static.engine``, which holds the device work these inputs feed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from eventspec.shared.node.static.batch import StepBatch
from eventspec.shared.node.static.buckets import MetaLayout, StepInputs


class StepStaging:
    """The static index buffers of steps up to ``cap_m`` rows and ``cap_b`` sessions, and
    the host-side work that fills them (larger steps get buffers of their own)."""

    def __init__(self, device: torch.device, *, max_seq_len: int, scratch_slot: int,
                 cap_m: int, cap_b: int) -> None:
        self.device = device
        self.max_seq_len = max_seq_len
        #: The slot padding rows write into, so padding never touches a live session.
        self.scratch_slot = scratch_slot
        self.layout = MetaLayout(cap_m=cap_m, cap_b=cap_b)
        self.meta = torch.zeros(self.layout.size, device=device, dtype=torch.long)
        self.ids = torch.zeros(cap_m, device=device, dtype=torch.long)  # [Mmax]
        #: CUDA: two pinned host blocks [size + Mmax] (index block, then dest) the static
        #: buffers load from, each with the event after its last copy; None elsewhere.
        self._pinned: list[tuple[torch.Tensor, Any]] = []
        if device.type == "cuda":
            self._pinned = [(torch.empty(self.layout.size + cap_m, dtype=torch.long,
                                         pin_memory=True),
                             torch.cuda.Event())  # type: ignore[no-untyped-call]
                            for _ in range(2)]
        self._turn = 0

    def buffers(self, bp: int, qp: int) -> tuple[MetaLayout, torch.Tensor, torch.Tensor]:
        """(layout, index block, ids) for a (Bp, Qp) step: the static ones when they fit."""
        m = bp * qp
        if m <= self.layout.cap_m and bp <= self.layout.cap_b:
            return self.layout, self.meta, self.ids[:m]
        layout = MetaLayout(cap_m=m, cap_b=bp)
        meta = torch.zeros(layout.size, device=self.device, dtype=torch.long)
        return layout, meta, torch.zeros(m, device=self.device, dtype=torch.long)

    def host_meta(
        self,
        layout: MetaLayout,
        slots: Sequence[int],
        starts: Sequence[int],
        counts: Sequence[int],
        bp: int,
        qp: int,
        out: np.ndarray[Any, Any] | None = None,
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Build the step's index arrays on the host (numpy, no Python loop over tokens).

        Returns (the int64 block for ``layout``, dest [N]: each real token's row in the
        padded [Bp * Qp] step). Padding rows write K/V into the scratch slot at
        positions 0..Qp-1 and attend over it; their outputs are never gathered.
        ``out``: a block to write into (at least ``layout.size``; the pinned path's),
        of which only the parts the (Bp, Qp) views read are written; else a fresh one.
        """
        block = np.zeros(layout.size, dtype=np.int64) if out is None else out
        b = len(slots)
        slot_a = np.full(bp, self.scratch_slot, dtype=np.int64)
        start_a = np.zeros(bp, dtype=np.int64)
        count_a = np.zeros(bp, dtype=np.int64)
        slot_a[:b], start_a[:b], count_a[:b] = slots, starts, counts
        j = np.arange(qp, dtype=np.int64)[None, :]  # [1, Qp]
        valid = j < count_a[:, None]  # [Bp, Qp]
        pos = np.minimum(start_a[:, None] + j, self.max_seq_len - 1)  # [Bp, Qp]
        wslot = np.where(valid, slot_a[:, None], self.scratch_slot)  # [Bp, Qp]
        wpos = np.where(valid, start_a[:, None] + j, j)  # [Bp, Qp]
        lens = np.where(count_a > 0, start_a + count_a, qp)  # [Bp]
        m, cm, cb = bp * qp, layout.cap_m, layout.cap_b
        block[:m] = pos.reshape(-1)
        block[cm : cm + m] = wslot.reshape(-1)
        block[2 * cm : 2 * cm + m] = wpos.reshape(-1)
        block[3 * cm : 3 * cm + bp] = slot_a
        block[3 * cm + cb : 3 * cm + cb + bp] = start_a
        block[3 * cm + 2 * cb : 3 * cm + 2 * cb + bp] = lens
        dest = np.flatnonzero(valid.reshape(-1))  # [N], session-major like token_ids
        return block, dest

    def to_device(self, array: np.ndarray[Any, Any]) -> torch.Tensor:
        """Host -> device without a host sync: a pinned staging copy, asynchronous.

        The caching host allocator keeps the pinned block until the copy has run, so
        the next step cannot overwrite it early.
        """
        host = torch.from_numpy(array)
        if self.device.type != "cuda":
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    def load(self, batch: StepBatch, bp: int, qp: int) -> tuple[StepInputs, torch.Tensor]:
        """Fill a (Bp, Qp) step's inputs from ``batch``; return them and dest [N]."""
        layout, meta, ids = self.buffers(bp, qp)
        if self._pinned and layout is self.layout:
            dest = self._load_pinned(batch, bp, qp)
        else:
            block, dest_np = self.host_meta(
                layout, batch.slots, batch.start_positions, batch.counts, bp, qp
            )
            staged = self.to_device(np.concatenate([block, dest_np]))  # [size + N]
            meta.copy_(staged[: layout.size])
            dest = staged[layout.size :]  # [N]
        ids.index_copy_(0, dest, batch.token_ids.to(self.device, torch.long))  # [M]
        return _inputs(layout, meta, ids, bp, qp), dest

    def _load_pinned(self, batch: StepBatch, bp: int, qp: int) -> torch.Tensor:
        """The static index block and dest [N] through this turn's pinned block: written
        in place by numpy once the copy out of it two steps back has run, then one
        asynchronous copy into the device block. Returns dest [N] on the device."""
        pinned, copied = self._pinned[self._turn]
        self._turn ^= 1
        copied.synchronize()  # normally long done: the step after it has been read
        host = pinned.numpy()  # [size + Mmax] view of the pinned memory
        size, n = self.layout.size, batch.num_tokens
        _, dest_np = self.host_meta(self.layout, batch.slots, batch.start_positions,
                                    batch.counts, bp, qp, out=host)
        host[size : size + n] = dest_np
        staged = pinned[: size + n].to(self.device, non_blocking=True)  # [size + N]
        copied.record()
        self.meta.copy_(staged[:size])
        return staged[size:]  # [N]

    def dummy(self, bp: int, qp: int) -> StepInputs:
        """A valid all-padding step for capture: every row in the scratch slot."""
        layout, meta, ids = self.buffers(bp, qp)
        block, _ = self.host_meta(layout, [], [], [], bp, qp)
        meta.copy_(torch.from_numpy(block))
        return _inputs(layout, meta, ids, bp, qp)


def _inputs(
    layout: MetaLayout, meta: torch.Tensor, ids: torch.Tensor, bp: int, qp: int
) -> StepInputs:
    pos, wslot, wpos, slots, starts, lens = layout.views(meta, bp, qp)
    return StepInputs(ids, pos, wslot, wpos, slots, starts, lens, bp, qp)
