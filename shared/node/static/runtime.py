"""The static-KV runtime: one LLaMA decoder over preallocated KV slots, for both nodes.

The cloud's engine (:mod:`eventspec.cloud.engine.static.engine`, many sessions of
Video-LLaVA's language model) and the edge's drafter (:mod:`eventspec.edge.static_draft`,
one session of EventGPT's LLM) run on this one runtime; each splices its own visual
tokens into the prompt's embeddings and hands them to :meth:`StaticRuntime.prefill_embeds`.

- **KV.** One preallocated tensor per K and V, [layers, slots + 1, Hkv, T, D], written
  in place (by the fused RoPE kernel on CUDA, ``index_copy_`` on CPU); the extra slot
  is scratch that padded rows write into, so padding never touches a live session.
  Rollback is free: a step names each session's valid length and nothing beyond it
  is read. With ``kv_positions`` (KV by length, the cloud's default) the tensor is one
  arena of positions per layer and head, [layers, Hkv, A + T, D], seen through a
  strided view of the same [layers, A + 1, Hkv, T, D] shape whose "slot" stride is one
  position: slot ``s`` is the window starting at position ``s``, so a session owns
  the run ``[s, s + n)`` it :meth:`~StaticRuntime.reserve`-d and every kernel, which
  addresses ``slot * stride + pos * stride``, runs unchanged
  (``eventspec.cloud.kv_arena`` hands out the runs). The scratch window starts at A.
  What each slot holds (live, prompt positions written, the run reserved) and the
  checks every call makes before model work are :mod:`.slot_occupancy`'s.
- **Attention** reads only each session's real length: a Triton split-KV kernel on
  CUDA (:mod:`.attention`), dense masked SDPA on CPU.
- **Weights** are the HF model's own tensors with fused QKV and gate-up
  (:mod:`.weights`); norms and RoPE follow HF to the cast (:mod:`.layers`).
  On CUDA a layer is ~10 kernels: Triton RMSNorm, RoPE + KV write and SiLU-mul
  (:mod:`.kernels`), cuBLAS GEMMs with the residual add fused (``addmm_``).
- **Steps** are padded to a bucket (sessions x tokens per session) and replayed from
  one CUDA graph per bucket, captured at warm-up (gpt-fast, vLLM and SGLang capture
  decode graphs the same way). Per step the host builds a few small index arrays,
  copies them once (pinned, asynchronous; :mod:`.staging`), replays, and gathers the
  real rows' logits: nothing synchronises with the host. Shapes beyond the largest
  bucket run the same forward eagerly.
- **Prefill** runs the same layer functions with causal SDPA (flash attention on CUDA)
  per request, over all the call's requests' tokens at once; a whole prompt at its
  length rounded up to 128 rows, every rounded length planned at warm-up
  (:func:`.pieces.sdpa_piece_attention` says why).
- **Prompt rows inside steps** (:mod:`.mixed_steps`): text that continues a prompt runs
  as one verify step, and a mixed step (decode rows and prompt pieces in one forward)
  runs at fixed shapes from CUDA graphs (:mod:`.chunk_staging`).

- **Batch-invariant** (``--batch-invariant``): a row's bits do not depend on the batch,
  the step's width or the row's place. On CUDA with Triton the layers stay fused and
  graphed, with a Triton GEMM of one tile per weight shape and split-KV attention of
  a fixed split size (:mod:`.invariant_kernels`); prefill runs the step's attention.
  Elsewhere (CPU, int8/int4 weights) the plain torch path of :mod:`.invariant`.

On CPU the same runtime runs the plain torch layer functions without graphs, which is
what the equality tests against the HF references exercise. ``docs/engine.md`` has the
H200 measurements behind these choices.
"""


from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static import kernels as static_kernels
from eventspec.shared.node.static import layers as layers
from eventspec.shared.node.static.attention import (
    HAVE_TRITON,
    num_splits_for,
    reference_attention,
    splitkv_attention,
)
from eventspec.shared.node.static.batch import StepBatch
from eventspec.shared.node.static.buckets import (
    SESSION_BUCKETS,
    TOKEN_BUCKETS,
    StepInputs,
    bucket,
)
from eventspec.shared.node.static.chunk_staging import (
    CHUNK_TILE,
    MAX_PIECES,
    ChunkStaging,
)
from eventspec.shared.node.static.invariant import (
    invariant_attention,
    invariant_linear,
    invariant_rms_norm,
)
from eventspec.shared.node.static.invariant_kernels import (
    all_dense,
    dense_invariant_linear,
    dense_invariant_linear_add_,
    fixed_split_attention,
    invariant_mm,
    prefill_fixed_split_attention,
)
from eventspec.shared.node.static.invariant_tiles import PrefillTiles, prefill_tiles
from eventspec.shared.node.static.kernels import rope_and_write_kv, silu_mul
from eventspec.shared.node.static.kv_memory import kv_tensor, rows_of
from eventspec.shared.node.static.mixed_steps import PromptRowsInSteps
from eventspec.shared.node.static.pieces import (
    PROMPT_LENGTH_STEP,
    PromptPieces,
    invariant_piece_attention,
    lay_out,
    plan_prompt_attention,
    sdpa_piece_attention,
)
from eventspec.shared.node.static.quant import Weight, linear, linear_add_
from eventspec.shared.node.static.slot_occupancy import SlotOccupancy
from eventspec.shared.node.static.staging import StepStaging
from eventspec.shared.node.static.weights import LanguageWeights

logger = logging.getLogger(__name__)

__all__ = ["StaticRuntime"]


class StaticRuntime(PromptRowsInSteps):
    """A LLaMA decoder over static KV slots (see the module docstring)."""

    def __init__(
        self,
        weights: LanguageWeights,
        cos: torch.Tensor,
        sin: torch.Tensor,
        *,
        num_slots: int,
        max_seq_len: int,
        use_graphs: bool,
        compile_layers: bool,
        session_buckets: Sequence[int] = SESSION_BUCKETS,
        token_buckets: Sequence[int] = TOKEN_BUCKETS,
        batch_invariant: bool = False,
        kv_positions: int | None = None,
        chunk_buckets: Sequence[int] = (),
    ) -> None:
        """``weights`` and ``cos``/``sin`` [T >= max_seq_len, D] from :mod:`.weights`.

        ``chunk_buckets``: prompt-piece rows (multiples of
        :data:`.chunk_staging.CHUNK_TILE`) a mixed step may carry at fixed shapes,
        graphed with every step bucket of up to :data:`.mixed_steps.MIXED_MAX_TOKENS` tokens
        (:meth:`step_with_pieces`); empty: mixed steps run eagerly at exact shapes.

        ``kv_positions``: KV by length, an arena of that many positions (see the module
        docstring); ``num_slots`` is then the most sessions a step holds, a slot id is
        a run's first position, and a session must :meth:`reserve` its run first.

        ``batch_invariant``: every row's arithmetic independent of the batch, the step's
        width and the row's place in it. On CUDA with Triton and dense weights: the
        fused layers with the batch-invariant Triton GEMM and fixed-split attention
        (:mod:`.invariant_kernels`), CUDA graphs on. Elsewhere (CPU, CUDA without
        Triton, or int8/int4 weights, which those kernels do not take): the plain torch
        path of :mod:`.invariant`, unfused and without graphs.
        """
        if num_slots < 1:
            raise InvalidInput("the static runtime needs at least one KV slot")
        if not 0 < max_seq_len <= cos.shape[0]:
            raise InvalidInput(f"max_seq_len {max_seq_len} outside 1..{cos.shape[0]} positions")
        if kv_positions is not None and kv_positions < 1:
            raise InvalidInput(f"a KV arena needs at least one position, got {kv_positions}")
        self.device: torch.device = weights.embed.device
        self.dtype = weights.embed.dtype
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.weights = weights
        self.cos, self.sin = cos, sin  # each [T, D]
        w = self.weights
        #: Positions of the KV arena (KV by length), or None: fixed slots.
        self.kv_positions = kv_positions
        #: What each slot holds; every call checks against it before model work.
        self.occupancy = SlotOccupancy(num_slots=num_slots, max_seq_len=max_seq_len,
                                       kv_positions=kv_positions)
        # One slot more than served (or a window after the arena): the scratch that
        # padding rows write into.
        self.k_cache = self._kv_tensor()  # [L, S+1, Hkv, T, D] (a strided view by length)
        self.v_cache = self._kv_tensor()  # [L, S+1, Hkv, T, D]
        self.batch_invariant = batch_invariant
        triton_gpu = self.device.type == "cuda" and HAVE_TRITON
        #: Batch-invariant through the Triton kernels (else the plain path, if invariant).
        self.invariant_kernels = batch_invariant and triton_gpu and all_dense(weights)
        plain_invariant = batch_invariant and not self.invariant_kernels
        self.use_graphs = use_graphs and self.device.type == "cuda" and not plain_invariant
        self.session_buckets = tuple(b for b in session_buckets if b <= num_slots) or (1,)
        if num_slots not in self.session_buckets and num_slots < max(session_buckets):
            self.session_buckets = (*self.session_buckets, num_slots)
        self.token_buckets = tuple(token_buckets)
        if batch_invariant:
            chunk_buckets = ()  # mixed steps are not batch-invariant (step_with_pieces)
        if any(c < CHUNK_TILE or c % CHUNK_TILE or c > max_seq_len for c in chunk_buckets):
            raise InvalidInput(f"prompt-piece buckets must be multiples of {CHUNK_TILE} up to "
                               f"{max_seq_len}, got {list(chunk_buckets)}")
        self.chunk_buckets = tuple(sorted(set(chunk_buckets)))
        self._sm_count = (
            torch.cuda.get_device_properties(self.device).multi_processor_count
            if self.device.type == "cuda"
            else 1
        )
        self._use_splitkv = triton_gpu and not batch_invariant

        # CUDA: Triton kernels for RMSNorm, RoPE + KV write and SiLU-mul, cuBLAS GEMMs
        # with the residual fused (addmm); batch-invariant, the same with the invariant
        # Triton GEMM (the other three kernels are per row already). CPU: the plain torch
        # functions; batch-invariant without the kernels: the plain functions with tiled
        # linear layers and norms.
        self._fused = triton_gpu and not plain_invariant
        self._norm: Callable[..., Any] = layers.rms_norm
        self._lin: layers.Linear = linear
        self._lin_add_: Callable[[torch.Tensor, torch.Tensor, Weight], torch.Tensor] = linear_add_
        if plain_invariant:
            self._norm, self._lin = invariant_rms_norm, invariant_linear
        if self.invariant_kernels:
            self._lin, self._lin_add_ = dense_invariant_linear, dense_invariant_linear_add_
        if self._fused:
            self._norm = static_kernels.rms_norm
            if compile_layers and not batch_invariant:  # Inductor picks its reduction by shape
                self._norm = torch.compile(layers.rms_norm, dynamic=True, fullgraph=True)

        max_b = max(self.session_buckets)
        max_m = max_b * max(self.token_buckets)
        # Static step buffers: one int64 block holding every index array at fixed
        # offsets, so each bucket's views keep their addresses across replays.
        scratch = self.occupancy.scratch_slot
        self._staging = StepStaging(self.device, max_seq_len=max_seq_len,
                                    scratch_slot=scratch, cap_m=max_m, cap_b=max_b)
        # MAX_PIECES rows more than the largest step: a mixed step's logits are its
        # step rows and its pieces' last rows.
        self._logits = torch.zeros(max_m + MAX_PIECES, w.vocab, device=self.device,
                                   dtype=self.dtype)
        self._chunk_staging = ChunkStaging(
            self.device, self.dtype, w.hidden, max_seq_len=max_seq_len,
            scratch_slot=scratch, cap_rows=max(self.chunk_buckets, default=CHUNK_TILE))
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        #: Mixed-step graphs by (sessions, tokens, piece rows).
        self._mixed_graphs: dict[tuple[int, int, int], torch.cuda.CUDAGraph] = {}
        self.warmup_report: dict[str, float] = {}
        #: Whole prompts' attention runs at lengths rounded up to this (1: exact);
        #: :func:`.pieces.sdpa_piece_attention` says why.
        self.prompt_length_step = PROMPT_LENGTH_STEP

    # -- prefill and step -----------------------------------------------------------

    @torch.inference_mode()
    def prefill_embeds(
        self, slots: Sequence[int], embeds: Sequence[torch.Tensor],
        starts: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Prefill each prompt's embeddings ``embeds[r]`` [L_r, H] into ``slots[r]`` at
        positions ``starts[r]`` .. ``starts[r] + L_r - 1``; return [R, V] float32 logits
        of each piece's last position.

        A start of 0 (the default) begins a prompt; a later start continues one whose
        first ``starts[r]`` positions this slot already holds (an earlier chunk, or a
        prefix copied in by :meth:`load_prefix`): chunked prefill (Sarathi-Serve, Agrawal
        et al. 2024) and prefix reuse. The pieces are concatenated into one [sum L, H]
        activation, so every GEMM of every layer runs once for all of them; attention is
        causal SDPA per piece over its slot's [0, start + L) (flash on CUDA; a later
        start aligns the causal mask to the bottom right); batch-invariant, the step's
        own attention, so a prompt row gets the bits a step at its position would (on
        CUDA, 16-query pseudo-sessions:
        :func:`.invariant_kernels.prefill_fixed_split_attention`).
        Checked before any model work: one bad piece fails the call, nothing written.
        """
        pieces = self._pieces(slots, embeds, starts)
        w = self.weights
        cos, sin = self.cos.index_select(0, pieces.pos), self.sin.index_select(0, pieces.pos)
        attend = self._prompt_attention(pieces)
        h = pieces.h  # [M, H]
        for i in range(len(w.layers)):
            h = self._layer(i, h, cos, sin, pieces.write_slot, pieces.pos, attend)  # [M, H]
        x = self._norm(h.index_select(0, pieces.last_rows), w.norm, w.eps)  # [R, H]
        self._mark_filled(pieces)
        logits: torch.Tensor = self._lin(x, w.lm_head).float()  # [R, V]
        return logits

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
        :data:`.mixed_steps.MIXED_MAX_TOKENS` tokens, the step and the padded pieces run at fixed
        shapes (:mod:`.chunk_staging`), replayed from a graph captured at warm-up
        (eager on CPU); otherwise eagerly at exact shapes, decode rows attending as in
        :meth:`step` and piece rows as in :meth:`prefill_embeds`. Not with
        ``batch_invariant``: the rows' GEMM shapes would follow the chunk. Checked
        before any model work.
        """
        if self.batch_invariant:
            raise InvalidInput("mixed steps are not batch-invariant; step and prefill apart")
        self.occupancy.check_step(batch)
        starts = [int(st) for st in starts]
        self._check_pieces(slots, embeds, starts)
        if set(slots) & set(batch.slots):
            raise InvalidInput("a slot both steps and prefills in one mixed step")
        shape = self._mixed_shape(batch, [int(e.shape[0]) for e in embeds])
        if shape is not None:
            return self._fixed_mixed_step(batch, slots, embeds, starts, shape)
        pieces = lay_out(slots, embeds, starts, self.dtype, self.device)
        w = self.weights
        b, q_max = len(batch.slots), max(batch.counts)
        inp, dest = self._staging.load(batch, b, q_max)  # exact shape: eager
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
        x = self._norm(h.index_select(0, rows), w.norm, w.eps)  # [N + R, H]
        self._mark_filled(pieces)
        logits: torch.Tensor = self._lin(x, w.lm_head).float()  # [N + R, V]
        n = batch.num_tokens
        return logits[:n], logits[n:]

    def save_prefix(self, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A copy of the first ``length`` positions of ``slot``'s K and V, each
        [layers, Hkv, length, D], for :meth:`load_prefix` into another slot later."""
        self.occupancy.check_slot(slot)
        if not 0 < length <= self.occupancy.filled(slot):
            raise InvalidInput(f"slot {slot} holds {self.occupancy.filled(slot)} prompt "
                               f"positions; cannot save {length}")
        return (self.k_cache[:, slot, :, :length].clone(),
                self.v_cache[:, slot, :, :length].clone())

    def load_prefix(self, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Copy a saved prefix (:meth:`save_prefix`) into positions 0.. of ``slot``; a
        prefill of the rest continues from its length (``starts``)."""
        self.occupancy.check_slot(slot)
        w = self.weights
        n = int(k.shape[2]) if k.dim() == 4 else 0
        want = (len(w.layers), w.num_kv_heads, n, w.head_dim)
        room = self.occupancy.room(slot)
        if tuple(k.shape) != want or tuple(v.shape) != want or not 0 < n < room:
            raise InvalidInput(f"a prefix must be K and V of {list(want)} with 0 < length < "
                               f"{room}, got {list(k.shape)} and {list(v.shape)}")
        self.k_cache[:, slot, :, :n].copy_(k)
        self.v_cache[:, slot, :, :n].copy_(v)
        self.occupancy.prompt_written_to(slot, n)

    def padded_tokens(self, q_max: int) -> int:
        """Rows every session of a step pays when its longest feeds ``q_max`` tokens: the
        captured graph's bucket, else ``q_max`` (the step pads every session to it).
        The cloud's verify-width rule prices a step by this (issue 36)."""
        qp = bucket(q_max, self.token_buckets) if self.use_graphs else None
        return q_max if qp is None else qp

    @torch.inference_mode()
    def step(self, batch: StepBatch) -> torch.Tensor:
        """Write the batch's tokens into their slots; return [N, V] float32 logits."""
        self.occupancy.check_step(batch)
        b = len(batch.slots)
        q_max = max(batch.counts)
        bp = bucket(b, self.session_buckets) if self.use_graphs else b
        qp = bucket(q_max, self.token_buckets) if self.use_graphs else q_max
        graph = self._graphs.get((bp, qp)) if bp is not None and qp is not None else None
        if graph is None:  # beyond the buckets (or CPU): exact padding, eager forward
            bp, qp = b, q_max
        assert bp is not None and qp is not None
        inp, dest = self._staging.load(batch, bp, qp)  # dest: [N] rows of the padded step
        m = bp * qp
        if graph is not None:
            graph.replay()
            logits = self._logits[:m]  # [M, V]
        else:
            static_out = m <= self._staging.layout.cap_m
            logits = self._forward(inp, self._logits[:m] if static_out else None)
        return logits.index_select(0, dest).float()  # [N, V]

    def free(self, slot: int) -> None:
        """Forget the slot's content (idempotent); nothing to clear, it is overwritten.
        By length, the run's reservation ends too."""
        self.occupancy.free(slot)

    def release(self) -> None:
        """Give the device memory back: KV, the CUDA graphs and their pool, the static
        step buffers (not the weights, which the caller may share). The runtime serves
        nothing after this. Why: a process that builds one engine after another (a
        benchmark of several server configurations) otherwise holds every old engine's
        KV as long as anything references it; on an 80 GB card the second one did not fit.
        """
        self.occupancy.release()
        self._graphs.clear()
        self._mixed_graphs.clear()
        empty = torch.empty(0, device=self.device, dtype=self.dtype)
        self.k_cache = self.v_cache = self._logits = empty

    def reserve(self, slot: int, positions: int) -> None:
        """KV by length: the session starting at position ``slot`` of the arena owns
        ``positions`` from there (the caller's allocator keeps runs apart); its prefill
        and steps are checked against them. Fixed slots: only checks the length."""
        self.occupancy.reserve(slot, positions)

    # -- warm-up --------------------------------------------------------------------

    @torch.inference_mode()
    def warm_up(self) -> dict[str, float]:
        """Compile and capture one CUDA graph per (sessions, tokens) bucket.

        Largest first, all in one memory pool (the largest bucket's activations are
        reused by every smaller graph). Logs progress; returns seconds and bytes.
        """
        plans = 0
        if self.device.type == "cuda" and not self.batch_invariant:
            t_plan = time.perf_counter()
            plans = plan_prompt_attention(self.k_cache[0, self.occupancy.scratch_slot],
                                          self.v_cache[0, self.occupancy.scratch_slot],
                                          self.weights.num_heads, self.prompt_length_step)
            logger.info("planned the prompt attention at %d lengths (%.1f s)", plans,
                        time.perf_counter() - t_plan)
        if not self.use_graphs:
            return {"prompt_attention_lengths": float(plans)} if plans else {}
        t0 = time.perf_counter()
        torch.cuda.synchronize(self.device)
        base = torch.cuda.memory_allocated(self.device)
        pool = torch.cuda.graph_pool_handle()
        shapes = sorted(
            ((bp, qp) for bp in self.session_buckets for qp in self.token_buckets),
            key=lambda s: -s[0] * s[1],
        )
        for i, (bp, qp) in enumerate(shapes):
            inp = self._staging.dummy(bp, qp)
            out = self._logits[: bp * qp]
            stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                self._forward(inp, out)  # compiles / JITs outside the capture
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._forward(inp, out)
            self._graphs[(bp, qp)] = graph
            logger.info(
                "captured step graph %d/%d: %d sessions x %d tokens (%.1f s)",
                i + 1, len(shapes), bp, qp, time.perf_counter() - t0,
            )  # fmt: skip
        mixed = self._capture_mixed(pool)
        torch.cuda.synchronize(self.device)
        self.warmup_report = {
            "graphs": float(len(shapes)),
            "mixed_graphs": float(mixed),
            "prompt_attention_lengths": float(plans),
            "seconds": time.perf_counter() - t0,
            "graph_bytes_allocated": float(torch.cuda.memory_allocated(self.device) - base),
            "reserved_bytes_after": float(torch.cuda.memory_reserved(self.device)),
        }
        logger.info(
            "static engine warm: %d graphs in %.1f s, %.2f GiB reserved; KV %d slots x %d",
            len(shapes), self.warmup_report["seconds"],
            self.warmup_report["reserved_bytes_after"] / 2**30, self.num_slots, self.max_seq_len,
        )  # fmt: skip
        return self.warmup_report

    # -- internals --------------------------------------------------------------------

    def _pieces(self, slots: Sequence[int], embeds: Sequence[torch.Tensor],
                starts: Sequence[int] | None) -> PromptPieces:
        """Checked prompt pieces as one activation (see :meth:`prefill_embeds`)."""
        starts = [0] * len(slots) if starts is None else [int(s) for s in starts]
        self._check_pieces(slots, embeds, starts)
        return lay_out(slots, embeds, starts, self.dtype, self.device)

    def _check_pieces(self, slots: Sequence[int], embeds: Sequence[torch.Tensor],
                      starts: Sequence[int]) -> None:
        """InvalidInput unless every piece fits its slot and continues what it holds."""
        if not slots or not len(slots) == len(embeds) == len(starts):
            raise InvalidInput("prefill needs one embedding and one start per slot, at least one")
        for s, e in zip(slots, embeds, strict=True):
            if e.dim() != 2 or e.shape[1] != self.weights.hidden:
                raise InvalidInput(
                    f"slot {s}: embeddings must be [L, {self.weights.hidden}], got {list(e.shape)}"
                )
        self.occupancy.check_runs(slots, starts, [int(e.shape[0]) for e in embeds])

    def _mark_filled(self, pieces: PromptPieces) -> None:
        self.occupancy.fill(pieces.slots, pieces.starts, pieces.lengths)

    def _prompt_attention(self, pieces: PromptPieces
                          ) -> Callable[[int, torch.Tensor], torch.Tensor]:
        """Attention of prompt pieces' queries [M, Hq D]: causal over each piece's slot
        up to its end, reading its K/V back (the layer wrote them first)."""
        w = self.weights
        d, hq = w.head_dim, w.num_heads
        tiles: PrefillTiles | None = None
        if self.invariant_kernels:
            tiles = prefill_tiles(pieces.slots, pieces.starts, pieces.lengths, self.device)

        def attend(i: int, q: torch.Tensor) -> torch.Tensor:
            if tiles is not None:
                o = prefill_fixed_split_attention(q.view(-1, hq, d), self.k_cache[i],
                                                  self.v_cache[i], tiles)  # [M, Hq, D]
                return o.view(-1, hq * d)  # [M, Hq D]
            if self.batch_invariant:
                return invariant_piece_attention(q, self.k_cache[i], self.v_cache[i], pieces,
                                                 hq)
            return sdpa_piece_attention(q, self.k_cache[i], self.v_cache[i], pieces, hq,
                                        self.prompt_length_step)

        return attend

    def _kv_tensor(self) -> torch.Tensor:
        """Zeroed K or V memory, [L, S + 1, Hkv, T, D] (:func:`.kv_memory.kv_tensor`)."""
        w = self.weights
        return kv_tensor(layers=len(w.layers), slots=self.num_slots, kv_heads=w.num_kv_heads,
                         positions=self.max_seq_len, head_dim=w.head_dim,
                         arena_positions=self.kv_positions, device=self.device,
                         dtype=self.dtype)

    def _step_attention(self, inp: StepInputs) -> Callable[[int, torch.Tensor], torch.Tensor]:
        """Attention of a padded step's queries [Bp Qp, Hq D] over their sessions' KV."""
        w = self.weights
        bp, qp, hq, d = inp.sessions, inp.tokens, w.num_heads, w.head_dim
        num_splits = num_splits_for(bp, hq, self._sm_count)

        def attend(i: int, q: torch.Tensor) -> torch.Tensor:
            q4 = q.view(bp, qp, hq, d)  # [Bp, Qp, Hq, D]
            kc, vc = self.k_cache[i], self.v_cache[i]  # [S+1, Hkv, T, D]
            if self.invariant_kernels:
                o = fixed_split_attention(q4, kc, vc, inp.slots, inp.starts, inp.seq_lens)
            elif self.batch_invariant:
                q_pos = inp.starts[:, None] + torch.arange(qp, device=q.device)  # [Bp, Qp]
                o = invariant_attention(q4, kc, vc, inp.slots, q_pos)  # [Bp, Qp, Hq, D]
            elif self._use_splitkv:
                o = splitkv_attention(
                    q4, kc, vc, inp.slots, inp.starts, inp.seq_lens, num_splits=num_splits
                )  # [Bp, Qp, Hq, D]
            else:
                o = reference_attention(q4, kc, vc, inp.slots, inp.starts, inp.seq_lens)
            return o.reshape(bp * qp, hq * d)  # [M, Hq D]

        return attend

    def _forward(self, inp: StepInputs, out: torch.Tensor | None) -> torch.Tensor:
        """The padded step: [M] ids -> [M, V] logits (into ``out`` when given).

        Everything here is device work on static addresses, so it is what the CUDA
        graphs capture.
        """
        w = self.weights
        h = w.embed.index_select(0, inp.ids)  # [M, H]
        cos = self.cos.index_select(0, inp.pos)  # [M, D]
        sin = self.sin.index_select(0, inp.pos)  # [M, D]
        attend = self._step_attention(inp)
        for i in range(len(w.layers)):
            h = self._layer(i, h, cos, sin, inp.write_slot, inp.write_pos, attend)  # [M, H]
        x = self._norm(h, w.norm, w.eps)  # [M, H]
        logits: torch.Tensor
        if self.invariant_kernels:
            assert isinstance(w.lm_head, torch.Tensor)
            logits = invariant_mm(x, w.lm_head, out=out)  # [M, V]
            return logits
        if self.batch_invariant:
            logits = self._lin(x, w.lm_head)  # [M, V]
            return logits if out is None else out.copy_(logits)
        if out is None:
            logits = x @ w.lm_head.t()  # [M, V]
            return logits
        torch.matmul(x, w.lm_head.t(), out=out)
        return out

    def _layer(
        self,
        i: int,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        write_slot: torch.Tensor,
        write_pos: torch.Tensor,
        attend: Callable[[int, torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """One decoder layer over M rows: h [M, H] -> [M, H]; row m's K/V go to
        (write_slot[m], write_pos[m]) of layer i's cache before ``attend`` reads it."""
        w, lw = self.weights, self.weights.layers[i]
        hq, hkv, d = w.num_heads, w.num_kv_heads, w.head_dim
        kc, vc = self.k_cache[i], self.v_cache[i]  # [S+1, Hkv, T, D]
        if self._fused:
            qkv = self._lin(self._norm(h, lw.ln_attn, w.eps), lw.wqkv)  # [M, (Hq + 2 Hkv) D]
            q = rope_and_write_kv(qkv, cos, sin, kc, vc, write_slot, write_pos, hq, hkv)
            # In-place addmm: the residual add rides in the GEMM epilogue, and no copy of
            # h is made first (out-of-place addmm copies its input into the result).
            self._lin_add_(h, attend(i, q), lw.wo)  # [M, H]
            gate_up = self._lin(self._norm(h, lw.ln_mlp, w.eps), lw.w_gate_up)  # [M, 2 I]
            return self._lin_add_(h, silu_mul(gate_up), lw.w_down)  # [M, H]
        q, k, v = layers.attention_in(h, lw.ln_attn, lw.wqkv, cos, sin, w.eps, hq, hkv,
                                      self._lin, self._norm)
        heads = torch.arange(hkv, device=h.device)  # [Hkv]
        s_slot, s_head, s_pos = (st // d for st in kc.stride()[:3])  # in rows of D
        rows = (write_slot[:, None] * s_slot + heads * s_head
                + write_pos[:, None] * s_pos).view(-1)  # [M Hkv]
        rows_of(kc).index_copy_(0, rows, k.view(-1, d))
        rows_of(vc).index_copy_(0, rows, v.view(-1, d))
        o = attend(i, q)  # [M, Hq D]
        return layers.attention_out_and_mlp(h, o, lw.wo, lw.ln_mlp, lw.w_gate_up, lw.w_down,
                                            w.eps, self._lin, self._norm)
