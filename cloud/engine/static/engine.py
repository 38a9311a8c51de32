"""The cloud's fast engine: Video-LLaVA's language model on the static-KV runtime.

Implements ``eventspec.cloud.engine.base.BatchedEngine``. The runtime
(:mod:`eventspec.shared.node.static.runtime`: static KV slots, split-KV attention, CUDA
graphs per step shape) is shared with the edge's drafter; what is Video-LLaVA's own is
here: the prefill runs the video tower and projector as HF does and scatters the
features into the ``<video>`` rows before the decoder runs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import torch

from eventspec.cloud.engine.ahead import AheadEmbeds, SideStream, index_tensor
from eventspec.cloud.engine.base import PrefillChunk, PrefillRequest
from eventspec.cloud.engine.static.tower_graph import TowerGraph
from eventspec.cloud.engine.static.weights import (
    fuse_language_weights,
    rope_tables,
    static_unsupported_reason,
)
from eventspec.cloud.target import TargetModel
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.batch import StepBatch
from eventspec.shared.node.static.buckets import SESSION_BUCKETS, TOKEN_BUCKETS
from eventspec.shared.node.static.runtime import StaticRuntime

__all__ = ["StaticEngine"]


class StaticEngine(StaticRuntime):
    """``BatchedEngine`` over static KV slots: the runtime plus Video-LLaVA's prefill."""

    def __init__(
        self,
        target: TargetModel,
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
        reason = static_unsupported_reason(target)
        if reason is not None:
            raise InvalidInput(f"the static engine cannot serve this model: {reason}")
        if num_slots < 1:
            raise InvalidInput("the static engine needs at least one KV slot")
        if not 0 < max_seq_len <= target.max_positions:
            raise InvalidInput(
                f"max_seq_len {max_seq_len} outside 1..{target.max_positions} positions"
            )
        self.target = target
        #: The video tower and projector as one graph, captured at warm-up (CUDA graphs).
        self.tower_graph: TowerGraph | None = None
        #: Where every prompt's embeddings are made (:mod:`eventspec.cloud.engine.ahead`).
        self.side = SideStream(target.device)
        cos, sin = rope_tables(target, max_seq_len)  # each [T, D]
        super().__init__(
            fuse_language_weights(target), cos, sin, num_slots=num_slots,
            max_seq_len=max_seq_len, use_graphs=use_graphs, compile_layers=compile_layers,
            session_buckets=session_buckets, token_buckets=token_buckets,
            batch_invariant=batch_invariant, kv_positions=kv_positions,
            chunk_buckets=chunk_buckets, prefill_dtype=prefill_dtype, step_dtype=step_dtype,
        )

    @torch.inference_mode()
    def prefill(self, requests: Sequence[PrefillRequest]) -> torch.Tensor:
        """Prefill every request into its slot in one pass; return [R, V] float32
        last-position logits.

        The requests' tokens are concatenated into one [sum L, H] activation, so every
        GEMM of every layer runs once for all of them; attention is causal SDPA per
        request. What the scheduler gains is sessions that start together and so step
        in full batches; the prefill compute itself does not shrink (on CPU a call of 4
        toy prompts costs about 4 single ones, benchmarks/bench_prefill.py), and on a
        GPU one 2k-token prompt already fills the device, so the scheduler's token
        budget sends those one at a time. Every request is checked before any model
        work: one bad request fails the call with nothing written.
        """
        if not requests:
            raise InvalidInput("prefill needs at least one request")
        if len({r.slot for r in requests}) != len(requests):
            raise InvalidInput("a prefill names a slot twice")
        video_rows = [self.check_prefill(r) for r in requests]  # each [F*T] row indices
        for r in requests:  # a whole prompt needs its visual input
            if r.pixel_values_videos is None and r.video_features is None:
                raise InvalidInput(
                    "prefill needs exactly one of pixel_values_videos or video_features")
        return self._prefill_many(requests, video_rows)  # [R, V]

    def check_prefill(self, req: PrefillRequest) -> list[int]:
        """Validate one prefill request; returns the rows of its <video> placeholders."""
        self.occupancy.check_slot(req.slot)
        t = self.target
        ids_list = [int(i) for i in req.input_ids]
        n = len(ids_list)
        room = self.occupancy.room(req.slot)
        if not 0 < n <= room - 1:
            raise InvalidInput(f"prompt of {n} tokens does not fit a slot of {room}")
        video_rows = [i for i, tok in enumerate(ids_list) if tok == t.video_token_id]
        if len(video_rows) != t.geometry.visual_tokens:
            raise InvalidInput(
                f"the prompt has {len(video_rows)} <video> placeholders, "
                f"the target needs {t.geometry.visual_tokens}"
            )
        if req.pixel_values_videos is not None and req.video_features is not None:
            raise InvalidInput("prefill needs exactly one of pixel_values_videos or video_features")
        return video_rows

    def prompt_embeds(self, request: PrefillRequest, start: int = 0) -> torch.Tensor:
        """Rows ``start`` .. L - 1 of the request's prompt as [L - start, H] embeddings:
        token embeddings with the video tower's projected features scattered into the
        <video> rows, as HF does. The tower runs only when a <video> row is among them
        (a prefix reused from the cache holds them all)."""
        return self.prompt_embeds_ahead(request, start).take()  # [L - start, H]

    def prompt_embeds_ahead(self, request: PrefillRequest, start: int = 0) -> AheadEmbeds:
        """:meth:`prompt_embeds` enqueued on the side stream (checked first, on the
        host): the caller's stream goes on, and ``ready`` says when they are made."""
        video_rows = self.check_prefill(request)
        if not 0 <= start < len(request.input_ids):
            raise InvalidInput(f"prompt rows from {start} of a {len(request.input_ids)}-token "
                               "prompt")
        if any(r >= start for r in video_rows):
            request = self._pinned(request)
            return self.side.run(lambda: self._embeds(request, video_rows)[start:],
                                 start)  # [L - start, H]
        return self.side.run(lambda: self._text_embeds(request.input_ids[start:]), start)

    def _pinned(self, request: PrefillRequest) -> PrefillRequest:
        """The request with its pixels in pinned host memory (on a GPU): copied from
        pageable memory, the side stream's copy may make the host wait for the work
        already queued there (another prompt's tower) before the next step launches."""
        pix = request.pixel_values_videos
        if self.device.type != "cuda" or pix is None or pix.is_cuda or pix.is_pinned():
            return request
        return replace(request, pixel_values_videos=pix.pin_memory())

    @torch.inference_mode()
    def _text_embeds(self, ids: Sequence[int]) -> torch.Tensor:
        """Token embeddings [L, H] of text rows (on the caller's stream: the side one)."""
        return self.weights.embed.index_select(0, index_tensor(ids, self.device))  # [L, H]

    @torch.inference_mode()
    def prefill_chunks(self, chunks: Sequence[PrefillChunk]) -> torch.Tensor:
        """Each chunk into its slot from its start, in one pass; [R, V] float32 logits.

        Chunks that continue prompts with text rows only (their ``token_ids`` hold no
        ``<video>`` placeholder: a new question after a reused clip, a prompt's last
        words) and fit a captured step run as one graphed step
        (:meth:`StaticRuntime.prompt_rows_as_step`); the rest as :meth:`prefill_embeds`."""
        if not chunks:
            raise InvalidInput("prefill needs at least one chunk")
        slots, starts = [c.slot for c in chunks], [c.start for c in chunks]
        ids = [c.token_ids for c in chunks]
        for c in chunks:
            if c.token_ids is not None and len(c.token_ids) != c.embeds.shape[0]:
                raise InvalidInput(f"slot {c.slot}: a chunk of {c.embeds.shape[0]} rows "
                                   f"names {len(c.token_ids)} token ids")
        text = [t for t in ids if t is not None and self.target.video_token_id not in t]
        if len(text) == len(chunks) and self.fits_a_step(starts, [len(t) for t in text]):
            return self.prompt_rows_as_step(slots, starts, text)  # [R, V]
        return self.prefill_embeds(slots, [c.embeds for c in chunks], starts)  # [R, V]

    def warm_up(self) -> dict[str, float]:
        """The runtime's warm-up (step graphs, prompt attention plans), then the video
        tower's graph (:class:`.tower_graph.TowerGraph`) when steps are graphed."""
        report = super().warm_up()
        if self.use_graphs and self.tower_graph is None:
            t0 = time.perf_counter()
            self.tower_graph = TowerGraph(self.target, self.side.stream)
            report["tower_graph_s"] = time.perf_counter() - t0
            self.warmup_report = report
        return report

    @property
    def mixed_steps(self) -> bool:
        """Whether :meth:`step_with_chunks` runs (not with ``batch_invariant``)."""
        return not self.batch_invariant

    def step_with_chunks(self, batch: StepBatch, chunks: Sequence[PrefillChunk]
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """A mixed step (:meth:`StaticRuntime.step_with_pieces`): ([N, V] step logits,
        [R, V] logits of each chunk's last position)."""
        if not chunks:
            raise InvalidInput("a mixed step needs at least one chunk")
        return self.step_with_pieces(batch, [c.slot for c in chunks], [c.embeds for c in chunks],
                                     [c.start for c in chunks])

    def release(self) -> None:
        """The runtime's :meth:`StaticRuntime.release`, and the tower's graph."""
        self.tower_graph = None
        super().release()

    @torch.inference_mode()
    def _embeds(self, req: PrefillRequest, video_rows: list[int]) -> torch.Tensor:
        """Tower + projector, scattered into the prompt's <video> rows: [L, H]. The
        index tensors go first, copied without blocking the host, so the host does not
        wait for the tower it launches (it runs ahead on the side stream)."""
        t, w = self.target, self.weights
        ids = index_tensor(req.input_ids, self.device)  # [L]
        rows = index_tensor(video_rows, self.device)  # [F*T]
        if req.pixel_values_videos is not None and self.tower_graph is not None:
            video = self.tower_graph(req.pixel_values_videos)  # [F*T, H]
        elif req.pixel_values_videos is not None:
            feats = t.video_features_from_pixels(req.pixel_values_videos)  # [F, T, Dv]
            video = t.project_video_features(feats).reshape(-1, w.hidden)  # [F*T, H]
        elif req.video_features is not None:
            video = t.project_video_features(req.video_features).reshape(-1, w.hidden)
        else:  # only rows after a reused prefix may go without a visual input
            raise InvalidInput("prefill needs exactly one of pixel_values_videos or video_features")
        h = w.embed.index_select(0, ids)  # [L, H]
        return h.index_copy(0, rows, video.to(h.dtype))  # [L, H]

    def _prefill_many(self, requests: Sequence[PrefillRequest],
                      video_rows: Sequence[list[int]]) -> torch.Tensor:
        """Each request's embeddings (:meth:`_embeds`), then the runtime's prefill over
        all of them in one pass."""
        embeds = [self.side.now(lambda r=r, rows=rows: self._embeds(r, rows))  # type: ignore[misc]
                  for r, rows in zip(requests, video_rows, strict=True)]
        return self.prefill_embeds([r.slot for r in requests], embeds)  # [R, V]
