"""Steps that carry prompt rows: text that continues a prompt as a verify step, and
mixed steps (decode rows and prompt pieces in one forward) at fixed shapes, replayed
from CUDA graphs. A mixin of :class:`.runtime.StaticRuntime`, kept apart so that module
holds the KV, the step and the prefill; the attributes used here are the runtime's
(declared below for the type checker).

Mixed steps are Sarathi-Serve's stall-free batching (Agrawal et al., OSDI 2024); their
fixed shapes, and why, are :mod:`.chunk_staging`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.attention import reference_attention
from eventspec.shared.node.static.batch import StepBatch
from eventspec.shared.node.static.buckets import (
    CHUNK_TILE,
    MIXED_MAX_TOKENS,
    StepInputs,
    bucket,
)
from eventspec.shared.node.static.chunk_staging import (
    MAX_PIECES,
    ChunkInputs,
    ChunkStaging,
    chunk_rows_for,
    chunk_split,
)
from eventspec.shared.node.static.graph_capture import capture_graph
from eventspec.shared.node.static.invariant_kernels import fixed_split_attention
from eventspec.shared.node.static.kernel_choice import KernelChoice, PieceAttention
from eventspec.shared.node.static.layer_forward import Attend, LayerFunctions
from eventspec.shared.node.static.pieces import PromptPieces, check_pieces, lay_out
from eventspec.shared.node.static.slot_occupancy import SlotOccupancy
from eventspec.shared.node.static.staging import StepStaging
from eventspec.shared.node.static.weights import LanguageWeights

logger = logging.getLogger("eventspec.shared.node.static.runtime")

__all__ = ["MIXED_MAX_TOKENS", "PromptRowsInSteps"]


class PromptRowsInSteps:
    """Prompt rows inside steps (see the module docstring)."""

    device: torch.device
    dtype: torch.dtype
    weights: LanguageWeights
    cos: torch.Tensor
    sin: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    kernels: KernelChoice
    use_graphs: bool
    session_buckets: tuple[int, ...]
    token_buckets: tuple[int, ...]
    chunk_buckets: tuple[int, ...]
    _fns: LayerFunctions
    step_staging: StepStaging
    _chunk_staging: ChunkStaging
    logits_buffer: torch.Tensor
    step_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph]
    mixed_graphs: dict[tuple[int, int, int], torch.cuda.CUDAGraph]
    occupancy: SlotOccupancy
    #: Whether the latest :meth:`step_with_pieces` ran at a fixed shape, not eagerly at
    #: exact shapes: the engine loop labels the step by it, without a look-up of its own.
    last_mixed_fixed: bool = False

    if TYPE_CHECKING:
        def step(self, batch: StepBatch) -> torch.Tensor: ...
        def _step_attention(self, inp: StepInputs) -> Attend: ...
        def _prompt_attention(self, pieces: PromptPieces) -> Attend: ...
        def _mark_filled(self, pieces: PromptPieces) -> None: ...
        def _layer(self, i: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   write_slot: torch.Tensor, write_pos: torch.Tensor,
                   attend: Attend) -> torch.Tensor: ...

    def fits_a_step(self, starts: Sequence[int], lengths: Sequence[int]) -> bool:
        """Whether prompt pieces at ``starts`` of ``lengths`` rows can run as one step
        (:meth:`prompt_rows_as_step`): each continues a prompt, and the sessions and rows
        fit a captured step graph (without graphs: the buckets)."""
        if not starts or min(starts) < 1 or len(starts) != len(lengths):
            return False
        bp = bucket(len(starts), self.session_buckets)
        qp = bucket(max(lengths), self.token_buckets)
        if bp is None or qp is None:
            return False
        return (bp, qp) in self.step_graphs or not self.use_graphs

    @torch.inference_mode()
    def prompt_rows_as_step(self, slots: Sequence[int], starts: Sequence[int],
                            token_ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """Text rows continuing prompts, run as one step; [R, V] float32 logits of each
        piece's last row, as :meth:`prefill_embeds` with those rows' embeddings returns.

        A piece of text after a prompt's first rows (a new question after a reused clip
        prefix, or a chunk's last words) is what a verify step already computes: rows at
        ``start`` .. ``start + n - 1``, each attending to the slot's rows up to itself.
        As a step it replays a captured graph: on an H100 a 20-token question took 7.1 ms
        this way against 15.7 ms through the eager prefill (``benchmarks/bench_engine.py
        --prefill-only``, ``prefill-h100.json``). Use :meth:`fits_a_step` first. Checked
        before any model work.
        """
        lengths = [len(t) for t in token_ids]
        if not slots or not len(slots) == len(starts) == len(token_ids):
            raise InvalidInput("a step of prompt rows needs one start and ids per slot")
        if min(starts) < 1:
            raise InvalidInput("a step of prompt rows continues a prompt: every start >= 1")
        self.occupancy.check_runs(slots, starts, lengths)
        flat = [int(t) for ids in token_ids for t in ids]
        batch = StepBatch(slots=tuple(slots), start_positions=tuple(starts),
                          counts=tuple(lengths),
                          token_ids=torch.tensor(flat, device=self.device))  # [N]
        added = self.occupancy.open_for_prompt_rows(slots)
        try:
            logits = self.step(batch)  # [N, V]
        except Exception:
            self.occupancy.close(added)
            raise
        self.occupancy.fill(slots, starts, lengths)
        ends = torch.tensor(lengths, device=logits.device).cumsum(0) - 1  # [R]
        return logits.index_select(0, ends)  # [R, V]

    @torch.inference_mode()
    def step_with_pieces(
        self, batch: StepBatch, slots: Sequence[int], embeds: Sequence[torch.Tensor],
        starts: Sequence[int],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A mixed step: ``batch``'s decode and verify tokens and prompt pieces (as in
        :meth:`prefill_embeds`) in one forward. Returns ([N, V] step logits, [R, V]
        logits of each piece's last position), float32.

        Sarathi-Serve's stall-free batching (Agrawal et al., OSDI 2024): the pieces'
        rows ride the step's GEMMs, so the weights are read once for both and a chunk
        adds its arithmetic to the step instead of a call of its own (a separate eager
        chunk call cost about 9 ms of launches on an H200 whatever its size). When the
        pieces fit a ``chunk_buckets`` bucket (in whole 64-row tiles, at most
        :data:`.chunk_staging.MAX_PIECES`) and the step a bucket of at most
        :data:`MIXED_MAX_TOKENS` tokens, the step and the padded pieces run at fixed
        shapes (:mod:`.chunk_staging`), replayed from a graph captured at warm-up
        (eager on CPU); otherwise eagerly at exact shapes, decode rows attending as in
        :meth:`step` and piece rows as in :meth:`prefill_embeds`. Not with
        ``batch_invariant``: the rows' GEMM shapes would follow the chunk. Checked
        before any model work.
        """
        if not self.kernels.mixed_steps:
            raise InvalidInput("mixed steps are not batch-invariant; step and prefill apart")
        self.occupancy.check_step(batch)
        starts = [int(st) for st in starts]
        check_pieces(self.occupancy, self.weights.hidden, slots, embeds, starts)
        if set(slots) & set(batch.slots):
            raise InvalidInput("a slot both steps and prefills in one mixed step")
        shape = self._mixed_shape(batch, [int(e.shape[0]) for e in embeds])
        self.last_mixed_fixed = shape is not None
        if shape is not None:
            return self._fixed_mixed_step(batch, slots, embeds, starts, shape)
        pieces = lay_out(slots, embeds, starts, self.dtype, self.device)
        w = self.weights
        b, q_max = len(batch.slots), max(batch.counts)
        inp, dest = self.step_staging.load(batch, b, q_max)  # exact shape: eager
        m = b * q_max
        h = torch.cat([w.embed.index_select(0, inp.ids), pieces.h])  # [m + Mp, H]
        pos = torch.cat([inp.pos, pieces.pos])  # [m + Mp]
        cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)  # [., D]
        write_slot = torch.cat([inp.write_slot, pieces.write_slot])
        write_pos = torch.cat([inp.write_pos, pieces.pos])
        decode, prompt = self._step_attention(inp), self._prompt_attention(pieces)

        def attend(i: int, q: torch.Tensor) -> torch.Tensor:
            return torch.cat([decode(i, q[:m]), prompt(i, q[m:])])  # [m + Mp, Hq D]

        for i in range(len(w.layers)):
            h = self._layer(i, h, cos, sin, write_slot, write_pos, attend)
        rows = torch.cat([dest, m + pieces.last_rows])  # [N + R]
        x = self._fns.norm(h.index_select(0, rows), w.norm, w.eps)  # [N + R, H]
        self._mark_filled(pieces)
        logits: torch.Tensor = self._fns.lin(x, w.lm_head).float()  # [N + R, V]
        n = batch.num_tokens
        return logits[:n], logits[n:]

    def _mixed_shape(self, batch: StepBatch, lengths: Sequence[int]
                     ) -> tuple[int, int, int] | None:
        """(Bp, Qp, piece rows) of a fixed-shape mixed step, or None: run it eagerly."""
        rows = chunk_rows_for(lengths, self.chunk_buckets)
        bp = bucket(len(batch.slots), self.session_buckets)
        qp = bucket(max(batch.counts), self.token_buckets)
        if rows is None or bp is None or qp is None or qp > MIXED_MAX_TOKENS:
            return None
        if self.use_graphs and (bp, qp, rows) not in self.mixed_graphs:
            return None
        return bp, qp, rows

    def _fixed_mixed_step(self, batch: StepBatch, slots: Sequence[int],
                          embeds: Sequence[torch.Tensor], starts: Sequence[int],
                          shape: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`step_with_pieces` at a fixed (Bp, Qp, rows) shape: staged, then the
        graph replayed (or the same forward, eager, without graphs)."""
        bp, qp, rows = shape
        inp, dest = self.step_staging.load(batch, bp, qp)  # dest: [N] rows of the padded step
        chunk = self._chunk_staging.load(slots, starts, embeds, rows)
        m = bp * qp
        out = self.logits_buffer[: m + MAX_PIECES]
        graph = self.mixed_graphs.get(shape)
        if graph is not None:
            graph.replay()
        else:
            self._forward_mixed(inp, chunk, out)
        self.occupancy.fill(slots, starts, [int(e.shape[0]) for e in embeds])
        step_logits = out.index_select(0, dest).float()  # [N, V]
        return step_logits, out[m : m + len(slots)].float()  # [R, V]

    def _forward_mixed(self, inp: StepInputs, chunk: ChunkInputs, out: torch.Tensor
                       ) -> torch.Tensor:
        """The padded step's rows and the padded pieces' rows in one forward: [M + C]
        rows -> ``out`` [M + MAX_PIECES, V] logits (the step's rows, then each piece's
        last row). Device work on static addresses only: what the mixed graphs capture.
        """
        w = self.weights
        m, hq, d = inp.sessions * inp.tokens, w.num_heads, w.head_dim
        h = torch.cat([w.embed.index_select(0, inp.ids), chunk.h])  # [M + C, H]
        pos = torch.cat([inp.pos, chunk.pos])  # [M + C]
        cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)  # [M + C, D]
        write_slot = torch.cat([inp.write_slot, chunk.write_slot])  # [M + C]
        write_pos = torch.cat([inp.write_pos, chunk.write_pos])  # [M + C]
        decode = self._step_attention(inp)
        tiles = chunk.rows // CHUNK_TILE

        def attend(i: int, q: torch.Tensor) -> torch.Tensor:
            q4 = q[m:].view(tiles, CHUNK_TILE, hq, d)  # [P, tile, Hq, D]
            kc, vc = self.k_cache[i], self.v_cache[i]  # [S+1, Hkv, T, D]
            if self.kernels.piece_attention is PieceAttention.FIXED_SPLIT:
                o = fixed_split_attention(q4, kc, vc, chunk.slots, chunk.starts,
                                          chunk.seq_lens, split=chunk_split(chunk.rows),
                                          query_tile=CHUNK_TILE)  # [P, tile, Hq, D]
            else:
                o = reference_attention(q4, kc, vc, chunk.slots, chunk.starts, chunk.seq_lens)
            return torch.cat([decode(i, q[:m]), o.reshape(chunk.rows, hq * d)])  # [M + C, .]

        for i in range(len(w.layers)):
            h = self._layer(i, h, cos, sin, write_slot, write_pos, attend)  # [M + C, H]
        x = torch.cat([h[:m], h[m:].index_select(0, chunk.last_rows)])  # [M + MAX_PIECES, H]
        x = self._fns.norm(x, w.norm, w.eps)
        torch.matmul(x, w.lm_head.t(), out=out)
        return out

    def _capture_mixed(self, pool: Any) -> int:
        """One mixed-step graph per (sessions, tokens <= MIXED_MAX_TOKENS, piece rows)
        bucket, into the step graphs' pool; returns how many."""
        shapes = sorted(((bp, qp, c) for bp in self.session_buckets for qp in self.token_buckets
                         for c in self.chunk_buckets if qp <= MIXED_MAX_TOKENS),
                        key=lambda s: -(s[0] * s[1] + s[2]))
        t0 = time.perf_counter()
        for bp, qp, c in shapes:
            inp, chunk = self.step_staging.dummy(bp, qp), self._chunk_staging.dummy(c)
            out = self.logits_buffer[: bp * qp + MAX_PIECES]
            self.mixed_graphs[(bp, qp, c)] = capture_graph(
                self.device, pool, partial(self._forward_mixed, inp, chunk, out))
        if shapes:
            logger.info("captured %d mixed-step graphs (pieces of %s rows) in %.1f s",
                        len(shapes), list(self.chunk_buckets), time.perf_counter() - t0)
        return len(shapes)
