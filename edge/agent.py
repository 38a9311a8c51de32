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

from edge.admission import AdmissionQueue, cloud_slots
from edge.align import FeatureAdapter
from edge.draft import DraftModel
from edge.drafter import Drafter
from edge.events.base import EventSource
from edge.failover import ask_event_is_committed, with_failover
from edge.link import VerifierLink, VerifierStream
from edge.readiness import CloudState, CloudView, Readiness
from edge.request_timeline import EdgeTimeline
from edge.session import Action, EdgeSession, SendDrafts, ShowPreview
from edge.visual_input import (
    PreparedVisual,
    choose_feature_mode,
    prepare_visual,
    send_features,
)
from shared.codec import WireDtype
from shared.errors import (
    ErrorCode,
    EventSpecError,
    FailedPrecondition,
    InvalidInput,
    Unavailable,
)
from shared.estimators import AcceptanceEstimator, Ewma, ThroughputEstimator
from shared.planning import RequestFacts, facts_from_open, plan_inputs, request_plan
from shared.stops import StopMatcher
from shared.timing import EdgeCost, TimingPlan, plan
from shared.tracing import current_request_span
from shared.types import (
    AlignedSpec,
    AskEvent,
    AskSpec,
    CommitEvent,
    CommittedEvent,
    DoneEvent,
    FeatureMode,
    FinalEvent,
    FinishReason,
    GenerationSettings,
    Mode,
    OpenRequest,
    PreviewEvent,
    ProgressEvent,
    RequestStats,
    ServerInfo,
    ServerLimits,
)
from shared.worker import ModelWorker

if TYPE_CHECKING:
    from edge.metrics import EdgeMetrics

log = logging.getLogger(__name__)

#: The largest max_new_tokens a draft_only answer takes (then clamped to the draft's room).
DRAFT_ONLY_MAX_NEW_TOKENS = 4096
#: How often an Ask that waits for the cloud asks it again, s.
CLOUD_POLL_S = 0.5
#: An Ask plans with a GetServerInfo answer at most this old (the edge server's watcher
#: refreshes it every few seconds) instead of asking again.
INFO_MAX_AGE_S = 10.0


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


def check_ask(spec: AskSpec, limits: ServerLimits) -> None:
    """Refuse what the cloud would refuse, before any model work on the edge (a huge
    question would otherwise keep the single model worker busy for everyone)."""
    if not spec.question.strip():
        raise InvalidInput("AskRequest.question is empty")
    if len(spec.question) > limits.max_question_chars:
        raise InvalidInput(
            f"AskRequest.question: {len(spec.question)} characters exceed the cap of "
            f"{limits.max_question_chars}"
        )
    spec.generation.validated(limits.max_new_tokens, max_stop_strings=limits.max_stop_strings,
                              max_stop_chars=limits.max_stop_chars)


def draft_only_settings(spec: AskSpec, draft: DraftModel) -> GenerationSettings:
    """``spec.generation`` for a draft_only answer, or InvalidInput naming the field.

    The draft decodes greedily, so a temperature would be silently ignored: refused. The
    prompt (question and event tokens) must leave the draft model room for an answer;
    ``max_new_tokens`` is clamped to that room, as the cloud clamps it to a KV slot's.
    Tokenizing is cheap; it runs before any rendering or model work.
    """
    settings = spec.generation.validated(DRAFT_ONLY_MAX_NEW_TOKENS)
    if settings.temperature != 0:
        raise InvalidInput(
            f"generation.temperature {settings.temperature:g}: draft_only decodes greedily "
            "(the draft model's unverified argmax); send temperature 0, or use mode "
            "speculative or target_only to sample"
        )
    prompt = draft.prompt_positions(spec.question)
    room = draft.max_positions - prompt
    if room < 1:
        raise InvalidInput(
            f"AskRequest.question: its draft_only prompt takes {prompt} positions, and the "
            f"draft model has {draft.max_positions}, leaving none for the answer; shorten "
            "the question or use mode target_only"
        )
    return replace(settings, max_new_tokens=min(settings.max_new_tokens, room))


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
            async for event in self._draft_only(spec):
                yield event
            return
        if self.link is None:
            raise Unavailable(
                f"mode {spec.mode.name.lower()} needs a cloud verifier, and this edge runs "
                "without one; use mode draft_only"
            )
        info: ServerInfo | None = None
        wait_s = self.cloud_wait_s if deadline_s is None else min(self.cloud_wait_s,
                                                                   max(0.0, deadline_s - 1.0))
        async for item in self._cloud_info_when_ready(wait_s):
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
        # A slot on the cloud before any model work: wait in line for one (edge.admission).
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
            # once on another (edge.failover); after a commit the answer fails clearly
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

    async def _cloud_info_when_ready(
        self, wait_s: float
    ) -> AsyncIterator[ProgressEvent | ServerInfo]:
        """The cloud's GetServerInfo, waiting up to ``wait_s`` for a cloud that is warming
        up or briefly unreachable; yields a ProgressEvent whenever the reason changes,
        then the info. A cloud that is not a Verifier, or a wait that runs out, gets its
        own clear error."""
        assert self.link is not None
        cached = self.link.fresh_info(INFO_MAX_AGE_S)
        if cached is not None:
            yield cached
            return
        started = time.monotonic()
        shown = None
        while True:
            try:
                info = await self.link.server_info(self.rpc_timeout_s)
            except EventSpecError as exc:
                if exc.code not in (ErrorCode.UNAVAILABLE, ErrorCode.DEADLINE_EXCEEDED):
                    raise
                view = await self.link.diagnose(self.rpc_timeout_s)
            else:
                self.readiness.set_cloud(CloudView(CloudState.READY))
                yield info
                return
            self.readiness.set_cloud(view)
            waited = time.monotonic() - started
            refusal = self.readiness.refusal(needs_cloud=True)
            if refusal is not None:
                raise refusal
            if waited >= wait_s:
                raise self.readiness.timeout_error(needs_cloud=True, waited_s=waited)
            waiting = self.readiness.waiting(needs_cloud=True)
            if waiting is not None and waiting != shown:
                shown = waiting
                log.info("ask waits: %s", waiting.message)
                yield ProgressEvent(waiting.stage, waiting.message, round(waited, 3))
            await asyncio.sleep(min(CLOUD_POLL_S, wait_s - waited))

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
            await self._first_reply(tasks["reply"], tasks["upload"], stream)
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

    async def _first_reply(self, reply: asyncio.Future[Any], upload: asyncio.Future[Any],
                           stream: VerifierStream) -> None:
        """Wait for the cloud's first message (its Plan, sent as soon as the Open is
        admitted, before the visual input), at most ``first_reply_s``.

        A replica that is frozen (SIGSTOPped, hung) keeps its connection open and
        answers nothing; without this bound a request waited for keepalive to declare
        the connection dead. UNAVAILABLE here, before anything is committed, lets
        ``edge.failover`` run the request on another replica.
        """
        assert self.link is not None
        deadline = time.monotonic() + self.first_reply_s
        while not reply.done():
            if upload.done() and not upload.cancelled() and upload.exception() is not None:
                return  # the upload failed (the call ended): the caller raises why
            left = deadline - time.monotonic()
            if left <= 0:
                self.link.mark_hung(stream)
                raise Unavailable(f"cloud verifier: no reply within {self.first_reply_s:g} s "
                                  "of the request (a hung replica?)")
            await asyncio.wait({f for f in (reply, upload) if not f.done()}, timeout=left,
                               return_when=asyncio.FIRST_COMPLETED)

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

    async def _draft_only(self, spec: AskSpec) -> AsyncIterator[AskEvent]:
        """The edge alone: greedy EventGPT output, labelled as unverified, under the same
        stop rules as the cloud's (EOS, stop strings, token cap, context); what it cannot
        do (sampling, a prompt past the draft's positions) is refused before model work."""
        started = time.perf_counter()
        settings = draft_only_settings(spec, self.draft)
        prepared = await self._prepare(spec, need_frames=False, need_features=False)
        drafter = Drafter(self.draft)
        await self.worker.run(lambda: drafter.prefill(spec.question, prepared.event_pixels))
        first_at: float | None = None
        text = ""
        answer: list[int] = []
        stops = StopMatcher(settings.stop)
        reason: FinishReason | None = None
        while reason is None:
            token = await self.worker.run(lambda seq=tuple(answer): drafter.draft_next(seq))  # type: ignore[misc]
            answer.append(token)
            first_at = first_at or time.perf_counter()
            text = self._decode(answer)
            stop_at = stops.feed(text)
            if token == self.draft.eos_token_id:
                reason = FinishReason.EOS
            elif stop_at is not None:
                reason, text = FinishReason.STOP_STRING, text[:stop_at]
            elif len(answer) >= settings.max_new_tokens:
                reason = FinishReason.MAX_TOKENS
            yield CommittedEvent(len(answer) - 1, (token,), text)
        ids = tuple(answer)
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
