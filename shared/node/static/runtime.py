"""The static-KV runtime: one LLaMA decoder over preallocated KV slots, for both nodes.

The cloud's engine (:mod:`eventspec.cloud.engine.static.engine`, many sessions of
Video-LLaVA's language model) and the edge's drafter (:mod:`eventspec.edge.drafting.static_backend`,
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
  (``eventspec.cloud.scheduling.kv_arena`` hands out the runs). The scratch window starts at A.
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
  (:func:`.pieces.sdpa_piece_attention` says why). ``prefill_dtype="fp8"``
  (``step_dtype`` for steps): linear layers on fp8 copies (:mod:`.fp8`).
- **Prompt rows inside steps** (:mod:`.mixed_steps`): text that continues a prompt runs
  as one verify step, and a mixed step (decode rows and prompt pieces in one forward)
  runs at fixed shapes from CUDA graphs (:mod:`.chunk_staging`).
- **Batch-invariant** (``--batch-invariant``): a row's bits do not depend on the batch,
  the step's width or the row's place. On CUDA with Triton the layers stay fused and
  graphed, with a Triton GEMM of one tile per weight shape and split-KV attention of
  a fixed split size (:mod:`.invariant_kernels`); prefill runs the step's attention.
  Elsewhere (CPU, int8/int4 weights) the plain torch path of :mod:`.invariant`.

Which kernels run is decided once (:mod:`.kernel_choice`); the layer, attention and LM
head on that choice are :mod:`.layer_forward`'s. On CPU the same runtime runs the plain
torch layer functions without graphs, which the equality tests against the HF
references exercise. ``docs/engine.md`` has the H200 measurements behind these choices.
"""


from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from functools import partial

import torch

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.batch import StepBatch
from eventspec.shared.node.static.buckets import SESSION_BUCKETS, TOKEN_BUCKETS, StepInputs, bucket
from eventspec.shared.node.static.chunk_staging import CHUNK_TILE, MAX_PIECES, ChunkStaging
from eventspec.shared.node.static.fp8 import runtime_weights
from eventspec.shared.node.static.graph_capture import capture_graph, step_graph_shapes
from eventspec.shared.node.static.invariant_tma import cuda_index, sm_count
from eventspec.shared.node.static.kernel_choice import KernelChoice
from eventspec.shared.node.static.kv_memory import kv_tensor, load_prefix, save_prefix
from eventspec.shared.node.static.layer_forward import (
    Attend,
    decoder_layer,
    kernels_for,
    layer_functions,
    lm_head_logits,
    prompt_attention,
    step_attention,
)
from eventspec.shared.node.static.mixed_steps import PromptRowsInSteps
from eventspec.shared.node.static.pieces import (
    PROMPT_LENGTH_STEP,
    PromptPieces,
    check_pieces,
    lay_out,
    plan_prompt_attention,
)
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
        prefill_dtype: str = "model",
        step_dtype: str = "model",
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
        width and the row's place in it. Which kernels that takes here, and every other
        kernel decision, is :func:`.kernel_choice.choose_kernels`' (:attr:`kernels`).

        ``prefill_dtype``, ``step_dtype``: "fp8": prefill calls', steps' linear layers on
        fp8 copies of the weights (:mod:`.fp8`)."""
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
        self.cos, self.sin = cos, sin  # each [T, D]
        #: What steps, and prefill calls of their own, run on: ``weights`` or fp8 copies
        #: (made before the KV, whose budget left room for them).
        self.weights, self.prefill_weights = runtime_weights(
            weights, prefill_dtype=prefill_dtype, step_dtype=step_dtype,
            batch_invariant=batch_invariant)
        w = self.weights
        #: Positions of the KV arena (KV by length), or None: fixed slots.
        self.kv_positions = kv_positions
        #: What each slot holds; every call checks against it before model work.
        self.occupancy = SlotOccupancy(num_slots=num_slots, max_seq_len=max_seq_len,
                                       kv_positions=kv_positions)
        # One slot more than served (or a window after the arena): scratch for padding.
        self.k_cache = self._kv_tensor()  # [L, S+1, Hkv, T, D] (a strided view by length)
        self.v_cache = self._kv_tensor()  # [L, S+1, Hkv, T, D]
        #: Every kernel this runtime runs, decided once (:mod:`.kernel_choice`).
        self.kernels: KernelChoice = kernels_for(w, batch_invariant=batch_invariant,
                                                 use_graphs=use_graphs,
                                                 compile_layers=compile_layers)
        logger.info("static runtime kernels: %s", self.kernels.reason)
        self.batch_invariant = batch_invariant
        self.use_graphs = self.kernels.graphs
        self._fns = layer_functions(self.kernels)
        self.session_buckets = tuple(b for b in session_buckets if b <= num_slots) or (1,)
        if num_slots not in self.session_buckets and num_slots < max(session_buckets):
            self.session_buckets = (*self.session_buckets, num_slots)
        self.token_buckets = tuple(token_buckets)
        if not self.kernels.mixed_steps:
            chunk_buckets = ()  # mixed steps are not batch-invariant (step_with_pieces)
        if any(c < CHUNK_TILE or c % CHUNK_TILE or c > max_seq_len for c in chunk_buckets):
            raise InvalidInput(f"prompt-piece buckets must be multiples of {CHUNK_TILE} up to "
                               f"{max_seq_len}, got {list(chunk_buckets)}")
        self.chunk_buckets = tuple(sorted(set(chunk_buckets)))
        #: Multiprocessors (the split-KV attention's split count; 1 off CUDA), asked once a device.
        self.sm_count = sm_count(cuda_index(self.device)) if self.device.type == "cuda" else 1

        max_b = max(self.session_buckets)
        max_m = max_b * max(self.token_buckets)
        scratch = self.occupancy.scratch_slot
        #: Static step buffers: one int64 block holding every index array at fixed
        #: offsets, so each bucket's views keep their addresses across replays.
        self.step_staging = StepStaging(self.device, max_seq_len=max_seq_len,
                                        scratch_slot=scratch, cap_m=max_m, cap_b=max_b)
        #: The steps' logits: MAX_PIECES rows more than the largest step, since a mixed
        #: step's logits are its step rows and its pieces' last rows.
        self.logits_buffer = torch.zeros(max_m + MAX_PIECES, w.vocab, device=self.device,
                                         dtype=self.dtype)
        self._chunk_staging = ChunkStaging(
            self.device, self.dtype, w.hidden, max_seq_len=max_seq_len,
            scratch_slot=scratch, cap_rows=max(self.chunk_buckets, default=CHUNK_TILE))
        #: Step graphs by (sessions, tokens) bucket; empty: every step runs eagerly.
        self.step_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        #: Mixed-step graphs by (sessions, tokens, piece rows).
        self.mixed_graphs: dict[tuple[int, int, int], torch.cuda.CUDAGraph] = {}
        self.warmup_report: dict[str, float] = {}
        #: Whole prompts' attention runs at lengths rounded up to this (1: exact);
        #: :func:`.pieces.sdpa_piece_attention` says why.
        self.prompt_length_step = PROMPT_LENGTH_STEP

    @property
    def invariant_kernels(self) -> bool:
        """Batch-invariant through the Triton kernels (else the plain path, if invariant)."""
        return self.kernels.invariant_kernels

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
        w = self.prefill_weights
        cos, sin = self.cos.index_select(0, pieces.pos), self.sin.index_select(0, pieces.pos)
        attend = self._prompt_attention(pieces)
        h = pieces.h  # [M, H]
        for i in range(len(w.layers)):
            h = self._layer(i, h, cos, sin, pieces.write_slot, pieces.pos, attend, w)  # [M, H]
        x = self._fns.norm(h.index_select(0, pieces.last_rows), w.norm, w.eps)  # [R, H]
        self._mark_filled(pieces)
        logits: torch.Tensor = self._fns.lin(x, w.lm_head).float()  # [R, V]
        return logits

    def save_prefix(self, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A copy of the first ``length`` positions of ``slot``'s K and V, each
        [layers, Hkv, length, D], for :meth:`load_prefix` into another slot later."""
        return save_prefix(self.k_cache, self.v_cache, self.occupancy, slot, length)

    def load_prefix(self, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Copy a saved prefix (:meth:`save_prefix`) into positions 0.. of ``slot``; a
        prefill of the rest continues from its length (``starts``)."""
        load_prefix(self.k_cache, self.v_cache, self.occupancy, slot, k, v)

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
        graph = self.step_graphs.get((bp, qp)) if bp is not None and qp is not None else None
        if graph is None:  # beyond the buckets (or CPU): exact padding, eager forward
            bp, qp = b, q_max
        assert bp is not None and qp is not None
        inp, dest = self.step_staging.load(batch, bp, qp)  # dest: [N] rows of the padded step
        m = bp * qp
        if graph is not None:
            graph.replay()
            logits = self.logits_buffer[:m]  # [M, V]
        else:
            static_out = m <= self.step_staging.layout.cap_m
            logits = self._forward(inp, self.logits_buffer[:m] if static_out else None)
        return logits.index_select(0, dest).float()  # [N, V]

    def free(self, slot: int) -> None:
        """Forget the slot's content (idempotent); nothing to clear, it is overwritten.
        By length, the run's reservation ends too."""
        self.occupancy.free(slot)

    def release(self) -> None:
        """Give the device memory back: KV, the CUDA graphs and their pool, the static
        step buffers (not the weights, which the caller may share); it serves nothing
        after. Why: a process that builds one engine after another otherwise holds every
        old engine's KV while anything references it (an 80 GB card fit no second one)."""
        self.occupancy.release()
        self.step_graphs.clear()
        self.mixed_graphs.clear()
        empty = torch.empty(0, device=self.device, dtype=self.dtype)
        self.k_cache = self.v_cache = self.logits_buffer = empty

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
        if self.kernels.plan_prompt_lengths:
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
        shapes = step_graph_shapes(self.session_buckets, self.token_buckets)
        for i, (bp, qp) in enumerate(shapes):
            inp, out = self.step_staging.dummy(bp, qp), self.logits_buffer[: bp * qp]
            self.step_graphs[(bp, qp)] = capture_graph(self.device, pool,
                                                   partial(self._forward, inp, out))
            logger.info("captured step graph %d/%d: %d sessions x %d tokens (%.1f s)",
                        i + 1, len(shapes), bp, qp, time.perf_counter() - t0)
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
        check_pieces(self.occupancy, self.weights.hidden, slots, embeds, starts)
        return lay_out(slots, embeds, starts, self.dtype, self.device)

    def _mark_filled(self, pieces: PromptPieces) -> None:
        self.occupancy.fill(pieces.slots, pieces.starts, pieces.lengths)

    def _prompt_attention(self, pieces: PromptPieces) -> Attend:
        """Attention of prompt pieces' queries (:func:`.layer_forward.prompt_attention`)."""
        return prompt_attention(self.kernels, self.weights, self.k_cache, self.v_cache, pieces,
                                self.prompt_length_step)

    def _kv_tensor(self) -> torch.Tensor:
        """Zeroed K or V memory, [L, S + 1, Hkv, T, D] (:func:`.kv_memory.kv_tensor`)."""
        w = self.weights
        return kv_tensor(layers=len(w.layers), slots=self.num_slots, kv_heads=w.num_kv_heads,
                         positions=self.max_seq_len, head_dim=w.head_dim,
                         arena_positions=self.kv_positions, device=self.device,
                         dtype=self.dtype)

    def _step_attention(self, inp: StepInputs) -> Attend:
        """Attention of a padded step's queries (:func:`.layer_forward.step_attention`)."""
        return step_attention(self.kernels, self.weights, self.k_cache, self.v_cache, inp,
                              self.sm_count)

    def _forward(self, inp: StepInputs, out: torch.Tensor | None) -> torch.Tensor:
        """The padded step: [M] ids -> [M, V] logits (into ``out`` when given); device
        work on static addresses only, so it is what the CUDA graphs capture."""
        w = self.weights
        h = w.embed.index_select(0, inp.ids)  # [M, H]
        cos, sin = self.cos.index_select(0, inp.pos), self.sin.index_select(0, inp.pos)  # [M, D]
        attend = self._step_attention(inp)
        for i in range(len(w.layers)):
            h = self._layer(i, h, cos, sin, inp.write_slot, inp.write_pos, attend)  # [M, H]
        x = self._fns.norm(h, w.norm, w.eps)  # [M, H]
        return lm_head_logits(self.kernels, self._fns, w, x, out)  # [M, V]

    def _layer(self, i: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               write_slot: torch.Tensor, write_pos: torch.Tensor, attend: Attend,
               weights: LanguageWeights | None = None) -> torch.Tensor:
        """Decoder layer i over M rows on ``weights`` (default: the runtime's)."""
        return decoder_layer(self.kernels, self._fns, weights or self.weights, i, h, cos, sin,
                             self.k_cache[i], self.v_cache[i], write_slot, write_pos, attend)
