"""One question, end to end on the edge: window, render, draft, stream to the cloud.

Speculative flow (DESIGN, "Hidden drafts"): the Open (with frames, or followed by the
aligned features) goes out first so the cloud starts its long prefill at once; the edge
then runs its own short prefill and drafts greedily, sending its whole tail (with the
committed length it has seen) at the plan's cadence. Commits from the cloud are folded
in as they arrive: a confirmed tail is kept, a diverging one rolled back. The answer is
exactly the cloud's; previews of the drafts are streamed to the client, marked as such.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

from edge.align import FeatureAdapter
from edge.cloud_link import CloudLink, CloudStream
from edge.draft import DraftModel
from edge.drafter import Drafter
from edge.events.base import EventSource
from edge.visual_input import (
    PreparedVisual,
    choose_feature_mode,
    prepare_visual,
    send_features,
)
from shared.errors import EventSpecError, FailedPrecondition, InvalidInput, Unavailable
from shared.estimators import AcceptanceEstimator, Ewma
from shared.timing import EdgeCost, PlanInputs, TimingPlan, plan
from shared.types import (
    AlignedSpec,
    AskEvent,
    AskSpec,
    CommitEvent,
    CommittedEvent,
    DoneEvent,
    DraftTail,
    FeatureMode,
    FinalEvent,
    FinishReason,
    Mode,
    OpenRequest,
    PreviewEvent,
    RequestStats,
    ServerInfo,
)
from shared.worker import ModelWorker

log = logging.getLogger(__name__)


class EdgeCostMeter:
    """The edge's measured draft costs, smoothed over requests (the first one seeds them)."""

    def __init__(self, smoothing: float = 0.3) -> None:
        self._prefill = Ewma(smoothing, None)
        self._per_token = Ewma(smoothing, None)

    @property
    def draft_prefill_ms(self) -> float:
        return self._prefill.value

    @property
    def draft_ms_per_token(self) -> float:
        return self._per_token.value

    def update(self, prefill_ms: float, ms_per_token: float) -> None:
        if prefill_ms > 0:
            self._prefill.update(prefill_ms)
        if ms_per_token > 0:
            self._per_token.update(ms_per_token)


#: Drafting budget when ``--speculation always`` overrides a plan that said no.
FORCED_HIDDEN_DRAFTS = 16
FORCED_LOOKAHEAD = 6


def forced_plan(p: TimingPlan) -> TimingPlan:
    """``p`` with drafting switched on (``--speculation always``, for measuring acceptance).

    The cloud verifies whatever valid drafts arrive, so this changes speed, never output.
    """
    if p.speculate:
        return p
    return replace(
        p,
        speculate=True,
        hidden_draft_budget=max(p.hidden_draft_budget, FORCED_HIDDEN_DRAFTS),
        lookahead_tokens=max(p.lookahead_tokens, FORCED_LOOKAHEAD),
        chunk_cadence_tokens=1,
        reason=f"forced by --speculation always; the plan said: {p.reason}",
    )


class EdgeAgent:
    """Answers questions about the source's events; one instance per edge process."""

    def __init__(
        self,
        *,
        source: EventSource,
        draft: DraftModel,
        link: CloudLink | None,
        adapter: FeatureAdapter | None = None,
        worker: ModelWorker | None = None,
        acceptance_prior: float = 0.5,
        default_jpeg_quality: int = 90,
        request_timeout_s: float = 120.0,
        rpc_timeout_s: float = 5.0,
        preview_every: int = 4,
        force_speculation: bool = False,
    ) -> None:
        self.source = source
        self.draft = draft
        self.link = link
        self.adapter = adapter
        self.worker = worker or ModelWorker("edge-model")
        self.acceptance = AcceptanceEstimator(prior=acceptance_prior)
        self.costs = EdgeCostMeter()
        self.default_jpeg_quality = default_jpeg_quality
        self.request_timeout_s = request_timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self.preview_every = max(1, preview_every)
        self.force_speculation = force_speculation
        self.requests_served = 0
        self._model_lock = asyncio.Lock()

    # -- set-up ---------------------------------------------------------------------------

    async def warm_up(self) -> None:
        """Measure the draft model's prefill and per-token costs on the live source."""
        try:
            spec = AskSpec(question="What is moving?", feature_mode=FeatureMode.FRAMES)
            prepared = await self._prepare(spec, need_frames=False, need_features=False)
        except EventSpecError as exc:
            log.warning("warm-up skipped: %s", exc)
            return
        drafter = Drafter(self.draft, max_new_tokens=8)

        def run() -> None:
            # Twice: the first round pays one-off costs (allocations, lazy init).
            nonlocal drafter
            for _ in range(2):
                drafter = Drafter(self.draft, max_new_tokens=8)
                drafter.prefill(spec.question, prepared.event_pixels)
                while drafter.can_draft() and len(drafter.tail) < 8:
                    drafter.draft_one()

        await self.worker.run(run)
        self.costs.update(drafter.prefill_ms, drafter.ms_per_token)
        log.info(
            "edge warm-up: draft prefill %.1f ms, %.2f ms/token",
            drafter.prefill_ms,
            drafter.ms_per_token,
        )

    def edge_cost(self) -> EdgeCost:
        rtt = self.link.rtt.value if self.link is not None else 0.0
        return EdgeCost(
            draft_prefill_ms=max(self.costs.draft_prefill_ms, 0.01),
            draft_ms_per_token=max(self.costs.draft_ms_per_token, 0.01),
            rtt_ms=max(rtt, 0.0),
            uplink_bytes_per_s=0.0,
            acceptance_prior=self.acceptance.value,
        )

    # -- one request ----------------------------------------------------------------------

    async def ask(self, spec: AskSpec) -> AsyncIterator[AskEvent]:
        """Answer ``spec``; yields previews, committed text and one FinalEvent."""
        if not spec.question.strip():
            raise InvalidInput("question is empty")
        if spec.mode == Mode.DRAFT_ONLY:
            async for event in self._draft_only(spec):
                yield event
            return
        if self.link is None:
            raise Unavailable(
                f"mode {spec.mode.name.lower()} needs a cloud verifier, and this edge was "
                "started without --cloud; use mode draft_only"
            )
        info = await self._server_info()
        if info.vocab_fingerprint != self.draft.vocab_fingerprint:
            raise FailedPrecondition(
                f"the cloud's text vocabulary (fingerprint {info.vocab_fingerprint[:12]}) "
                f"differs from the draft model's ({self.draft.vocab_fingerprint[:12]}); "
                "drafts would be meaningless"
            )
        feature_mode = choose_feature_mode(spec.feature_mode, self.source, self.adapter)
        prepared = await self._prepare(
            spec,
            need_frames=feature_mode == FeatureMode.FRAMES,
            need_features=feature_mode == FeatureMode.ALIGNED,
            info=info,
        )
        async for event in self._with_cloud(spec, info, prepared):
            yield event

    async def _server_info(self) -> ServerInfo:
        assert self.link is not None
        try:
            return await self.link.server_info(self.rpc_timeout_s)
        except EventSpecError as exc:
            raise Unavailable(exc.message) from exc

    async def _prepare(
        self, spec: AskSpec, *, need_frames: bool, need_features: bool,
        info: ServerInfo | None = None,
    ) -> PreparedVisual:
        return await prepare_visual(
            spec, source=self.source, draft=self.draft, adapter=self.adapter,
            worker=self.worker, info=info, jpeg_quality=self.default_jpeg_quality,
            need_frames=need_frames, need_features=need_features,
        )

    async def _with_cloud(
        self, spec: AskSpec, info: ServerInfo, prepared: PreparedVisual
    ) -> AsyncIterator[AskEvent]:
        assert self.link is not None
        started = time.perf_counter()
        speculative = spec.mode == Mode.SPECULATIVE
        settings = spec.generation.validated(info.limits.max_new_tokens)
        edge_cost = self.edge_cost()
        open_req = OpenRequest(
            request_id=uuid.uuid4().hex[:12],
            question=spec.question,
            generation=settings,
            frames=prepared.frames,
            aligned=(
                AlignedSpec("float16", tuple(prepared.features.shape))
                if prepared.features is not None
                else None
            ),
            edge_cost=edge_cost if speculative else None,
            deadline_ms=int(self.request_timeout_s * 1000),
            speculative=speculative,
        )
        local_plan = self._plan(info, edge_cost, settings.max_new_tokens, speculative)
        if speculative and self.force_speculation:
            local_plan = forced_plan(local_plan)
        stream = self.link.open_stream(self.request_timeout_s)
        replies: asyncio.Queue[Any] = asyncio.Queue()

        async def receive() -> None:
            try:
                async for msg in stream.replies():
                    await replies.put(msg)
                await replies.put(
                    Unavailable(
                        f"cloud verifier at {self.link.address if self.link else '?'} closed the "
                        "stream without Done"
                    )
                )
            except EventSpecError as exc:
                await replies.put(exc)

        receiver = asyncio.create_task(receive())
        drafter = Drafter(self.draft, settings.max_new_tokens) if speculative else None
        committed: list[int] = []
        text = ""
        first_commit_at: float | None = None
        stage: dict[str, float] = {"edge_render": prepared.render_ms}
        try:
            t_up = time.perf_counter()
            await stream.send(open_req)
            await send_features(stream, prepared)
            stage["edge_upload"] = (time.perf_counter() - t_up) * 1e3
            active_plan = local_plan
            prefill_task: asyncio.Task[float] | None = None
            if drafter is not None and local_plan.speculate:
                prefill_task = asyncio.create_task(
                    self.worker.run(lambda: drafter.prefill(
                        spec.question, prepared.event_pixels, prepared.clip_features
                    ))
                )
            last_sent_len = 0
            last_preview = 0
            done: DoneEvent | None = None
            while done is None:
                # 1. Fold in everything the cloud has said.
                while not replies.empty() or (
                    not self._can_draft(drafter, prefill_task, active_plan, committed)
                ):
                    msg = await replies.get()
                    if isinstance(msg, EventSpecError):
                        self.link.mark_failure(msg)
                        raise msg
                    if isinstance(msg, TimingPlan):
                        # Both sides ran the same function on the same profiles; the
                        # cloud's copy wins unless drafting is forced for measurement.
                        active_plan = forced_plan(msg) if self.force_speculation else msg
                        continue
                    if isinstance(msg, DoneEvent):
                        done = msg
                        break
                    assert isinstance(msg, CommitEvent)
                    if first_commit_at is None:
                        first_commit_at = time.perf_counter()
                    if drafter is not None and prefill_task is not None:
                        await prefill_task  # the drafter's cache must exist to fold commits in
                        await self.worker.run(
                            lambda m=msg: drafter.on_commit(m.start, m.token_ids)  # type: ignore[misc]
                        )
                        if not drafter.tail:
                            last_sent_len = len(drafter.committed)
                    if msg.drafts_verified:
                        self.acceptance.observe(msg.drafts_accepted, msg.drafts_verified)
                    committed.extend(msg.token_ids)
                    text = msg.text
                    yield CommittedEvent(msg.start, msg.token_ids, msg.text)
                if done is not None:
                    break
                # 2. Draft one token and send the tail at the plan's cadence.
                assert drafter is not None and prefill_task is not None
                await prefill_task
                await self.worker.run(drafter.draft_one)
                seq_len = len(drafter.committed) + len(drafter.tail)
                if drafter.tail and (
                    seq_len - last_sent_len >= max(1, active_plan.chunk_cadence_tokens)
                    or not drafter.can_draft()
                ):
                    await stream.send(
                        DraftTail(
                            len(drafter.committed),
                            tuple(drafter.tail),
                            (time.perf_counter() - started) * 1e3,
                        ),
                        best_effort=True,
                    )
                    last_sent_len = seq_len
                if seq_len - last_preview >= self.preview_every and drafter.tail:
                    last_preview = seq_len
                    yield PreviewEvent(
                        len(drafter.committed),
                        tuple(drafter.tail),
                        text + self._decode(drafter.tail, prefix=committed),
                    )
            await stream.done_writing()
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                stream.cancel()
            raise
        finally:
            receiver.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await receiver
        if drafter is not None and drafter.drafted_total:
            self.costs.update(drafter.prefill_ms, drafter.ms_per_token)
            stage["draft_prefill"] = drafter.prefill_ms
        stats = self._edge_stats(done.stats, started, first_commit_at, stream, stage)
        self.requests_served += 1
        yield FinalEvent(
            answer=done.text,
            token_ids=done.token_ids,
            mode=spec.mode,
            feature_mode=prepared.feature_mode,
            finish_reason=done.finish_reason,
            stats=stats,
            plan=active_plan,
            window=prepared.window,
        )

    def _can_draft(
        self,
        drafter: Drafter | None,
        prefill_task: asyncio.Task[float] | None,
        active_plan: TimingPlan,
        committed: Sequence[int],
    ) -> bool:
        """Whether drafting one more token now is within the plan."""
        if drafter is None or prefill_task is None or not active_plan.speculate:
            return False
        if not prefill_task.done():
            return True  # awaiting the prefill is the next useful thing
        if not drafter.can_draft():
            return False
        limit = active_plan.hidden_draft_budget if not committed else active_plan.lookahead_tokens
        return len(drafter.tail) < max(limit, 0)

    def _plan(
        self, info: ServerInfo, edge_cost: EdgeCost, max_new_tokens: int, speculative: bool
    ) -> TimingPlan:
        """The same plan the cloud computes from the same profiles."""
        if not speculative:
            return TimingPlan(False, 0, 0, 1, False, 0.0, 0.0, 0.0, 1.0, "target-only request")
        return plan(
            PlanInputs(
                cloud=info.cloud_cost,
                edge=edge_cost,
                visual_tokens=info.geometry.visual_tokens,
                text_tokens=info.prompt_overhead_tokens,
                alpha=edge_cost.acceptance_prior,
                max_new_tokens=max_new_tokens,
                max_lookahead=32,
            )
        )

    def _decode(self, ids: Sequence[int], prefix: Sequence[int] = ()) -> str:
        """Text that ``ids`` add after ``prefix`` (decoding together keeps spacing right)."""
        tok = self.draft.tokenizer
        whole = str(tok.decode(list(prefix) + list(ids), skip_special_tokens=True))
        head = str(tok.decode(list(prefix), skip_special_tokens=True)) if prefix else ""
        return whole[len(head) :] if whole.startswith(head) else whole

    def _edge_stats(
        self,
        cloud: RequestStats,
        started: float,
        first_commit_at: float | None,
        stream: CloudStream,
        stage: dict[str, float],
    ) -> RequestStats:
        now = time.perf_counter()
        merged = dict(cloud.stage_ms)
        merged.update(stage)
        return replace(
            cloud,
            ttft_ms=((first_commit_at or now) - started) * 1e3,
            total_ms=(now - started) * 1e3,
            uplink_bytes=stream.uplink_bytes,
            downlink_bytes=stream.downlink_bytes,
            stage_ms=merged,
        )

    async def _draft_only(self, spec: AskSpec) -> AsyncIterator[AskEvent]:
        """The edge alone: greedy EventGPT output, labelled as unverified."""
        started = time.perf_counter()
        settings = spec.generation.validated(4096)
        prepared = await self._prepare(spec, need_frames=False, need_features=False)
        drafter = Drafter(self.draft, settings.max_new_tokens)
        await self.worker.run(lambda: drafter.prefill(spec.question, prepared.event_pixels))
        first_at: float | None = None
        text = ""
        while drafter.can_draft():
            token = await self.worker.run(drafter.draft_one)
            start = len(drafter.committed)
            await self.worker.run(lambda t=token, s=start: drafter.on_commit(s, [t]))  # type: ignore[misc]
            first_at = first_at or time.perf_counter()
            text = self._decode(drafter.committed)
            yield CommittedEvent(start, (token,), text)
        ids = tuple(drafter.committed)
        reason = (
            FinishReason.EOS
            if ids and ids[-1] == self.draft.eos_token_id
            else FinishReason.MAX_TOKENS
        )
        now = time.perf_counter()
        self.requests_served += 1
        yield FinalEvent(
            answer=text,
            token_ids=ids,
            mode=Mode.DRAFT_ONLY,
            feature_mode=None,
            finish_reason=reason,
            stats=RequestStats(
                target_steps=0,
                new_tokens=len(ids),
                ttft_ms=((first_at or now) - started) * 1e3,
                total_ms=(now - started) * 1e3,
                stage_ms={"draft_prefill": drafter.prefill_ms, "edge_render": prepared.render_ms},
            ),
            plan=None,
            window=prepared.window,
        )
