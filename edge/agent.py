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
from typing import TYPE_CHECKING, Any

from eventspec.edge.admission import AdmissionQueue, cloud_slots
from eventspec.edge.align import FeatureAdapter
from eventspec.edge.ask_checks import check_ask, draft_only_settings
from eventspec.edge.cloud_wait import cloud_info_when_ready, first_reply
from eventspec.edge.cost_meter import EdgeCostMeter
from eventspec.edge.draft import DraftModel
from eventspec.edge.draft_only import answer_draft_only, decode_after
from eventspec.edge.drafter import Drafter
from eventspec.edge.events.base import EventSource
from eventspec.edge.failover import ask_event_is_committed, with_failover
from eventspec.edge.link import VerifierLink, VerifierStream
from eventspec.edge.readiness import Readiness
from eventspec.edge.request_timeline import EdgeTimeline
from eventspec.edge.session import Action, EdgeSession, SendDrafts, ShowPreview
from eventspec.edge.visual_input import (
    PreparedVisual,
    choose_feature_mode,
    prepare_visual,
    send_features,
)
from eventspec.edge.worker import ModelWorker
from eventspec.shared.contract.codec import WireDtype
from eventspec.shared.contract.errors import (
    EventSpecError,
    FailedPrecondition,
    Unavailable,
)
from eventspec.shared.contract.estimators import AcceptanceEstimator, ThroughputEstimator
from eventspec.shared.contract.planning import (
    RequestFacts,
    facts_from_open,
    plan_inputs,
    request_plan,
)
from eventspec.shared.contract.timing import EdgeCost, TimingPlan
from eventspec.shared.contract.timing_model import plan
from eventspec.shared.contract.types import (
    AlignedSpec,
    AskEvent,
    AskSpec,
    CommitEvent,
    CommittedEvent,
    DoneEvent,
    FeatureMode,
    FinalEvent,
    GenerationSettings,
    Mode,
    OpenRequest,
    PreviewEvent,
    ProgressEvent,
    RequestStats,
    ServerInfo,
    ServerLimits,
)
from eventspec.shared.node.tracing import current_request_span

if TYPE_CHECKING:
    from eventspec.edge.metrics import EdgeMetrics

log = logging.getLogger(__name__)



class EdgeAgent:
    """Answers questions about the source's events; one instance per edge process."""

    def __init__(
        self,
        *,
        source: EventSource,
        draft: DraftModel,
        link: VerifierLink | None,
        adapter: FeatureAdapter | None = None,
        worker: ModelWorker | None = None,
        acceptance_prior: float = 0.5,
        default_jpeg_quality: int = 90,
        request_timeout_s: float = 120.0,
        rpc_timeout_s: float = 5.0,
        preview_every: int = 4,
        force_speculation: bool = False,
        readiness: Readiness | None = None,
        cloud_wait_s: float = 60.0,
        first_reply_s: float = 5.0,
        max_queued_asks: int = 256,
    ) -> None:
        self.source = source
        self.draft = draft
        self.link = link
        self.adapter = adapter
        self.worker = worker or ModelWorker("edge-model")
        self.acceptance = AcceptanceEstimator(prior=acceptance_prior)
        self.costs = EdgeCostMeter()
        self.uplink = ThroughputEstimator()
        self.default_jpeg_quality = default_jpeg_quality
        self.request_timeout_s = request_timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self.preview_every = max(1, preview_every)
        self.force_speculation = force_speculation
        self.requests_served = 0
        if readiness is None:  # built from loaded models, with nobody else to tell
            readiness = Readiness(needs_cloud=link is not None)
            readiness.set_edge_phase(None)
        self.readiness = readiness
        self.cloud_wait_s = cloud_wait_s
        self.first_reply_s = first_reply_s
        self.admission = AdmissionQueue(max_waiting=max_queued_asks)
        #: Prometheus metrics (``--metrics-port``); None: nothing is recorded.
        self.metrics: EdgeMetrics | None = None

    # -- set-up ---------------------------------------------------------------------------

    async def warm_up(self) -> None:
        """Measure the draft model's prefill and per-token costs on the live source."""
        try:
            spec = AskSpec(question="What is moving?", feature_mode=FeatureMode.FRAMES)
            prepared = await self._prepare(spec, need_frames=False, need_features=False)
        except EventSpecError as exc:
            log.warning("warm-up skipped: %s", exc)
            return
        drafter = Drafter(self.draft)

        def run() -> None:
            # Twice: the first round pays one-off costs (allocations, lazy init).
            nonlocal drafter
            for _ in range(2):
                drafter = Drafter(self.draft)
                drafter.prefill(spec.question, prepared.event_pixels)
                seq: list[int] = []
                while len(seq) < 8 and (not seq or seq[-1] != self.draft.eos_token_id):
                    seq.append(drafter.draft_next(seq))

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
            uplink_bytes_per_s=self.uplink.bytes_per_s,
            acceptance_prior=self.acceptance.value,
        )

    # -- one request ----------------------------------------------------------------------

    async def ask(self, spec: AskSpec, *, deadline_s: float | None = None
                  ) -> AsyncIterator[AskEvent]:
        """Answer ``spec``; yields progress while waiting for the cloud, previews,
        committed text and one FinalEvent. ``deadline_s`` is the call's time left (the
        wait for a warming cloud ends before it).

        Logs one line per request (id, mode, outcome or error code, tokens, ms), never
        the question text at INFO.
        """
        started = time.perf_counter()
        request_id = uuid.uuid4().hex[:12]
        outcome, tokens = "CANCELLED", 0
        try:
            async for event in self._answer(spec, request_id, deadline_s):
                if isinstance(event, FinalEvent):
                    outcome, tokens = event.finish_reason.name, len(event.token_ids)
                yield event
        except EventSpecError as exc:
            outcome = exc.code.name
            raise
        except Exception as exc:
            outcome = f"INTERNAL ({type(exc).__name__})"
            raise
        finally:
            log.info("ask %s: mode %s, %s, %d tokens, %.1f ms", request_id,
                     spec.mode.name.lower(), outcome, tokens,
                     (time.perf_counter() - started) * 1e3)

    async def _answer(self, spec: AskSpec, request_id: str, deadline_s: float | None
                      ) -> AsyncIterator[AskEvent]:
        if spec.mode == Mode.DRAFT_ONLY:
            check_ask(spec, ServerLimits())
            settings = draft_only_settings(spec, self.draft)  # before any model work
            prepared = await self._prepare(spec, need_frames=False, need_features=False)
            async for event in answer_draft_only(spec, settings, prepared, self.draft,
                                                 self.worker):
                yield event
            self.requests_served += 1
            return
        if self.link is None:
            raise Unavailable(
                f"mode {spec.mode.name.lower()} needs a cloud verifier, and this edge runs "
                "without one; use mode draft_only"
            )
        info: ServerInfo | None = None
        wait_s = self.cloud_wait_s if deadline_s is None else min(self.cloud_wait_s,
                                                                   max(0.0, deadline_s - 1.0))
        async for item in cloud_info_when_ready(
                self.link, self.readiness, wait_s=wait_s, rpc_timeout_s=self.rpc_timeout_s):
            if isinstance(item, ProgressEvent):
                yield item
            else:
                info = item
        assert info is not None
        check_ask(spec, info.limits)  # before any model work
        if spec.mode == Mode.SPECULATIVE and info.vocab_fingerprint != self.draft.vocab_fingerprint:
            raise FailedPrecondition(
                f"the cloud's text vocabulary (fingerprint {info.vocab_fingerprint[:12]}) "
                f"differs from the draft model's ({self.draft.vocab_fingerprint[:12]}), so "
                "drafts cannot be verified; use mode target_only"
            )
        # A slot on the cloud before any model work: wait in line for one
        # (eventspec.edge.admission).
        self.admission.set_capacity(cloud_slots(info.limits))
        queued_at = time.monotonic()
        budget = self.request_timeout_s if deadline_s is None else max(0.0, deadline_s - 1.0)
        async for place in self.admission.enter(budget):
            yield ProgressEvent(
                "queued", f"queued for the cloud verifier: place {place} in line "
                          f"({self.admission.in_flight} in flight)",
                round(time.monotonic() - queued_at, 3))
        try:
            feature_mode = choose_feature_mode(spec.feature_mode, self.source, self.adapter)
            prepared = await self._prepare(
                spec,
                need_frames=feature_mode == FeatureMode.FRAMES,
                need_features=feature_mode == FeatureMode.ALIGNED,
                info=info,
            )
            # A replica that dies before anything is committed gets the request re-run
            # once on another (eventspec.edge.failover); after a commit the answer fails clearly
            # instead. A cloud full for a moment is asked again within the wait budget.
            left = budget - (time.monotonic() - queued_at)
            async for event in with_failover(
                lambda attempt: self._with_cloud(
                    spec, info, prepared,
                    request_id if not attempt else f"{request_id}-r{attempt}",
                ),
                is_committed=ask_event_is_committed,
                busy_retry_s=max(0.0, min(self.cloud_wait_s, left)),
            ):
                yield event
        finally:
            self.admission.release()

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
        self, spec: AskSpec, info: ServerInfo, prepared: PreparedVisual, request_id: str
    ) -> AsyncIterator[AskEvent]:
        """Run one request against the cloud, driving an ``EdgeSession``.

        Three things can happen at any time: a cloud reply arrives, the draft prefill
        ends, a draft token is ready. The session decides what each means; this loop
        only waits for them and carries out the session's actions.
        """
        assert self.link is not None
        started = time.perf_counter()
        speculative = spec.mode == Mode.SPECULATIVE
        settings = spec.generation.validated(info.limits.max_new_tokens)
        edge_cost = self.edge_cost()
        feature_dtype = self._feature_dtype(info, edge_cost, spec, settings, prepared)
        open_req = OpenRequest(
            request_id=request_id,
            question=spec.question,
            generation=settings,
            frames=prepared.frames,
            aligned=(
                AlignedSpec(feature_dtype.label, tuple(prepared.features.shape))
                if prepared.features is not None
                else None
            ),
            edge_cost=edge_cost if speculative else None,
            deadline_ms=int(self.request_timeout_s * 1000),
            speculative=speculative,
            timeline=spec.timeline,
        )
        local_plan, _ = request_plan(info, open_req.edge_cost, facts_from_open(open_req))
        session = EdgeSession(
            plan=local_plan,
            max_new_tokens=settings.max_new_tokens,
            eos_token_id=self.draft.eos_token_id,
            speculative=speculative,
            force_speculation=self.force_speculation,
            preview_every=self.preview_every,
        )
        drafter = Drafter(self.draft)
        stream = self.link.open_stream(self.request_timeout_s)
        timeline = (EdgeTimeline(started, drafter, wanted=spec.timeline)
                    if spec.timeline or current_request_span() is not None else None)
        if timeline is not None:
            stream = timeline.wrap(stream)
        stage: dict[str, float] = {"edge_render": prepared.render_ms}
        first_commit_at: float | None = None
        tasks: dict[str, asyncio.Future[Any]] = {}
        draft_context: tuple[int, ...] = ()
        try:
            t_up = time.perf_counter()
            await stream.send(open_req)
            replies = aiter(stream.replies())
            tasks["reply"] = asyncio.ensure_future(anext(replies))
            tasks["upload"] = asyncio.ensure_future(send_features(stream, prepared, feature_dtype))
            await first_reply(self.link, stream, tasks["reply"], tasks["upload"],
                              within_s=self.first_reply_s)
            sent = await tasks.pop("upload")
            up_s = time.perf_counter() - t_up
            stage["edge_upload"] = up_s * 1e3
            self.uplink.observe(sent + sum(len(f) for f in prepared.frames or ()), up_s)
            prefill_started = False
            while session.done is None:
                # The draft prefill starts as soon as a plan (the edge's own, or the
                # cloud's Plan if it differs, e.g. on a load change) says to draft.
                if not prefill_started and session.wants_prefill:
                    prefill_started = True
                    tasks["prefill"] = asyncio.ensure_future(self.worker.run(
                        lambda: drafter.prefill(
                            spec.question, prepared.event_pixels, prepared.clip_features
                        )
                    ))
                if "draft" not in tasks and session.wants_draft():
                    draft_context = session.draft_context()
                    tasks["draft"] = asyncio.ensure_future(self.worker.run(
                        lambda ctx=draft_context: drafter.draft_next(ctx)  # type: ignore[misc]
                    ))
                await asyncio.wait(tasks.values(), return_when=asyncio.FIRST_COMPLETED)
                if "prefill" in tasks and tasks["prefill"].done():
                    tasks.pop("prefill").result()
                    session.on_prefill_done()
                if "draft" in tasks and tasks["draft"].done():
                    token = tasks.pop("draft").result()
                    for action in session.on_draft(draft_context, token):
                        event = await self._carry_out(action, session, stream, started)
                        if event is not None:
                            yield event
                if tasks["reply"].done():
                    msg = self._reply(tasks.pop("reply"))
                    if isinstance(msg, TimingPlan):
                        session.on_plan(msg)
                    elif isinstance(msg, DoneEvent):
                        session.on_done(msg)
                        break
                    else:
                        first_commit_at = first_commit_at or time.perf_counter()
                        if msg.drafts_verified:
                            self.acceptance.observe(msg.drafts_accepted, msg.drafts_verified)
                        for action in session.on_commit(msg):
                            event = await self._carry_out(action, session, stream, started)
                            if event is not None:
                                yield event
                    tasks["reply"] = asyncio.ensure_future(anext(replies))
            await stream.done_writing()
        finally:
            if session.done is None:  # cancelled, failed or closed early: end the call
                with contextlib.suppress(Exception):
                    stream.cancel()
            for task in tasks.values():
                task.cancel()
            for task in tasks.values():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        done = session.done
        assert done is not None
        if self.metrics is not None:
            self.metrics.on_drafting(session.counters, drafter)
        if drafter.drafted_total:
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
            plan=session.plan,
            window=prepared.window,
            timeline=(timeline.finish(prepared, self.link.rtt.value) if timeline is not None
                      else None),
        )

    def _reply(self, task: asyncio.Future[Any]) -> TimingPlan | CommitEvent | DoneEvent:
        """The cloud's next message, or the error that ended the stream."""
        assert self.link is not None
        try:
            msg = task.result()
        except StopAsyncIteration:
            err: EventSpecError = Unavailable("the cloud verifier ended the answer without Done")
            self.link.mark_failure(err)
            raise err from None
        except EventSpecError as exc:
            self.link.mark_failure(exc)
            raise
        if not isinstance(msg, (TimingPlan, CommitEvent, DoneEvent)):
            raise FailedPrecondition(f"unexpected message from the cloud: {type(msg).__name__}")
        return msg

    async def _carry_out(
        self, action: Action, session: EdgeSession, stream: VerifierStream, started: float
    ) -> AskEvent | None:
        """Do what the session asked: send a tail, or produce a client event."""
        if isinstance(action, SendDrafts):
            tail = replace(action.tail, sent_at_ms=(time.perf_counter() - started) * 1e3)
            await stream.send(tail, best_effort=True)
            return None
        if isinstance(action, ShowPreview):
            text = session.text + self._decode(action.token_ids, prefix=session.committed)
            return PreviewEvent(action.base, action.token_ids, text)
        return CommittedEvent(action.start, action.token_ids, action.text)

    def _feature_dtype(
        self, info: ServerInfo, edge_cost: EdgeCost, spec: AskSpec,
        settings: GenerationSettings, prepared: PreparedVisual,
    ) -> WireDtype:
        """fp16, or int8 when the shared plan says fp16 features do not fit the uplink
        (and the uplink has been measured: unknown is not slow)."""
        if prepared.features is None or edge_cost.uplink_bytes_per_s <= 0:
            return WireDtype.FLOAT16
        fp16 = RequestFacts(spec.question, settings.max_new_tokens, True, "aligned",
                            prepared.features.numel() * WireDtype.FLOAT16.itemsize)
        fits = plan(plan_inputs(info, edge_cost, fp16)).aligned_fits_uplink
        return WireDtype.FLOAT16 if fits else WireDtype.INT8

    def _decode(self, ids: Sequence[int], prefix: Sequence[int] = ()) -> str:
        return decode_after(self.draft, ids, prefix)

    def _edge_stats(
        self,
        cloud: RequestStats,
        started: float,
        first_commit_at: float | None,
        stream: VerifierStream,
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
