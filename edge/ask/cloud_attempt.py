"""One attempt at answering an Ask with the cloud verifier: the edge's side of Generate.

Speculative flow (DESIGN, "Hidden drafts"): the Open (with frames, or followed by the
aligned features) goes out first so the cloud starts its long prefill at once; the edge
then runs its own short prefill and drafts greedily, sending its whole tail (with the
committed length it has seen) at the plan's cadence. Commits from the cloud are folded
in as they arrive: a confirmed tail is kept, a diverging one rolled back. The answer is
exactly the cloud's; previews of the drafts are streamed to the client, marked as such.

A :class:`CloudAttempt` is one Generate call; ``eventspec.edge.uplink.failover`` may make
another on another replica when this one's dies before anything is committed. The
decisions are the ``EdgeSession``'s (``eventspec.edge.ask.session``): an attempt waits for
the three things that can happen at any time (a cloud reply, the end of the draft
prefill, a draft token) and carries out what the session asks. Kept apart from
``eventspec.edge.ask.agent``, which checks the Ask, waits for the cloud and a place in line,
and prepares the visual input before any attempt starts; the attempt sees that agent
only as an ``AttemptHost`` (``eventspec.edge.ask.attempt_host``), so it never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import replace
from typing import Any

from eventspec.edge.ask.attempt_host import AttemptHost
from eventspec.edge.ask.draft_only import decode_after
from eventspec.edge.ask.session import Action, EdgeSession, SendDrafts, ShowPreview
from eventspec.edge.ask.timeline import EdgeTimeline
from eventspec.edge.drafting.cache import DraftCache
from eventspec.edge.drafting.tree import Key, TreeShape
from eventspec.edge.uplink.roles import VerifierLink, VerifierStream
from eventspec.edge.uplink.wait import first_reply
from eventspec.edge.vision.inputs import PreparedVisual, send_features
from eventspec.shared.contract.codec import WireDtype
from eventspec.shared.contract.convert_verifier import CloudOutbound
from eventspec.shared.contract.errors import EventSpecError, FailedPrecondition, Unavailable
from eventspec.shared.contract.estimators import ThroughputEstimator
from eventspec.shared.contract.planning import (
    RequestFacts,
    facts_from_open,
    plan_inputs,
    request_plan,
)
from eventspec.shared.contract.timing import EdgeCost, TimingPlan
from eventspec.shared.contract.timing_model import plan
from eventspec.shared.contract.types import (
    UPLOAD_STAGE,
    AlignedSpec,
    AskEvent,
    AskSpec,
    CommitEvent,
    CommittedEvent,
    DoneEvent,
    FinalEvent,
    GenerationSettings,
    Mode,
    OpenRequest,
    PreviewEvent,
    RequestStats,
    ServerInfo,
)
from eventspec.shared.node.tracing import current_request_span


class CloudAttempt:
    """One Generate call answering ``spec``, driving an ``EdgeSession``.

    Built when the attempt starts (inside ``with_failover``'s iteration, so a failure to
    start is one it can retry): the Open, the session with the edge's own plan, the
    drafter and the stream. :meth:`run` then streams the client's events.
    """

    def __init__(self, agent: AttemptHost, spec: AskSpec, info: ServerInfo,
                 prepared: PreparedVisual, request_id: str) -> None:
        assert agent.link is not None
        self.agent = agent
        self.link: VerifierLink = agent.link
        self.spec, self.info, self.prepared = spec, info, prepared
        self.started = time.perf_counter()
        self.open_req, self.feature_dtype = self._open_request(request_id)
        local_plan, _ = request_plan(info, self.open_req.edge_cost,
                                     facts_from_open(self.open_req))
        self.drafter = DraftCache(agent.draft_backend)
        self.session = EdgeSession(
            plan=local_plan,
            max_new_tokens=self.open_req.generation.max_new_tokens,
            eos_token_id=agent.draft.eos_token_id,
            speculative=self.open_req.speculative,
            force_speculation=agent.force_speculation,
            preview_every=agent.preview_every,
            tree=tree_shape(agent.tree_shape, info, self.drafter),
            max_nodes_per_message=max(1, info.limits.max_draft_tokens),
            drafts_every=agent.drafts_every,
        )
        #: The tree nodes the draft under way expands (trees only).
        self.expanding: list[Key] = []
        stream = self.link.open_stream(agent.request_timeout_s)
        self.timeline = (EdgeTimeline(self.started, self.drafter, wanted=spec.timeline)
                         if spec.timeline or current_request_span() is not None else None)
        self.stream: VerifierStream = (self.timeline.wrap(stream) if self.timeline is not None
                                       else stream)
        self.stage: dict[str, float] = {"edge_render": prepared.render_ms}
        #: Payload bytes of the aligned features this attempt sent (0: frames).
        self.uploaded_bytes = 0
        self.first_commit_at: float | None = None
        self.tasks: dict[str, asyncio.Future[Any]] = {}
        self.draft_context: tuple[int, ...] = ()
        self.prefill_started = False

    async def run(self) -> AsyncGenerator[AskEvent, None]:
        """Previews and committed text as the session produces them, then one FinalEvent."""
        try:
            replies = await self._send_open_and_upload()
            while self.session.done is None:
                self._start_drafting()
                await asyncio.wait(self.tasks.values(), return_when=asyncio.FIRST_COMPLETED)
                if "prefill" in self.tasks and self.tasks["prefill"].done():
                    self.tasks.pop("prefill").result()
                    self.session.on_prefill_done()
                for action in self._drafted():
                    event = await self._carry_out(action)
                    if event is not None:
                        yield event
                if self.tasks["reply"].done():
                    msg = self._reply(self.tasks.pop("reply"))
                    if isinstance(msg, DoneEvent):
                        self.session.on_done(msg)
                        break
                    for action in self._on_reply(msg):
                        event = await self._carry_out(action)
                        if event is not None:
                            yield event
                    self.tasks["reply"] = asyncio.ensure_future(anext(replies))
            await self.stream.done_writing()
        finally:
            await self._end_call()
        self._log_commits()
        yield self._final_event()

    def _log_commits(self) -> None:
        """``--commit-log``: queue this request's committed positions on the model thread
        (behind any drafting already queued; nothing waits for it)."""
        recorder, prepared = self.agent.commit_recorder, self.prepared
        if recorder is None or not self.open_req.speculative or not self.session.committed:
            return
        tokens = tuple(self.session.committed)
        self.agent.background(self.agent.worker.run(lambda: recorder.record(
            self.spec.question, prepared.event_pixels, prepared.clip_features, tokens)))

    # -- the steps ------------------------------------------------------------------------

    def _open_request(self, request_id: str) -> tuple[OpenRequest, WireDtype]:
        """The Open this attempt sends, and the dtype its aligned features travel in."""
        spec, info, prepared = self.spec, self.info, self.prepared
        speculative = spec.mode == Mode.SPECULATIVE
        settings = spec.generation.validated(info.limits.max_new_tokens)
        edge_cost = self.agent.edge_cost()
        dtype = feature_dtype(info, edge_cost, spec, settings, prepared)
        open_req = OpenRequest(
            request_id=request_id,
            question=spec.question,
            generation=settings,
            frames=prepared.frames,
            aligned=(
                AlignedSpec(dtype.label, tuple(prepared.features.shape))
                if prepared.features is not None
                else None
            ),
            edge_cost=edge_cost if speculative else None,
            deadline_ms=int(self.agent.request_timeout_s * 1000),
            speculative=speculative,
            timeline=spec.timeline,
        )
        return open_req, dtype

    async def _send_open_and_upload(self) -> AsyncIterator[CloudOutbound]:
        """Send the Open, upload the visual input behind it, and wait (bounded) for the
        cloud's first reply. Returns the replies,
        the next one already being read."""
        t_up = time.perf_counter()
        await self.stream.send(self.open_req)
        replies = aiter(self.stream.replies())
        self.tasks["reply"] = asyncio.ensure_future(anext(replies))
        self.tasks["upload"] = asyncio.ensure_future(
            send_features(self.stream, self.prepared, self.feature_dtype))
        await first_reply(self.link, self.stream, self.tasks["reply"], self.tasks["upload"],
                          within_s=self.agent.first_reply_s)
        self.uploaded_bytes = await self.tasks.pop("upload")
        self.stage["edge_upload"] = (time.perf_counter() - t_up) * 1e3
        return replies

    def _start_drafting(self) -> None:
        """Start the draft prefill as soon as a plan (the edge's own, or the cloud's Plan
        if it differs, e.g. on a load change) says to draft, and the next draft token
        whenever the session wants one and none is under way."""
        worker, drafter, prepared = self.agent.worker, self.drafter, self.prepared
        if not self.prefill_started and self.session.wants_prefill:
            self.prefill_started = True
            self.tasks["prefill"] = asyncio.ensure_future(worker.run(
                lambda: drafter.prefill(
                    self.spec.question, prepared.event_pixels, prepared.clip_features
                )
            ))
        drafting = self.agent.drafting  # with the edge's other sessions, in one forward
        if "draft" not in self.tasks and self.session.tree is not None:
            if self.session.wants_draft():  # the likeliest leaves, in one forward
                wanted = self.session.expansion()
                self.expanding = [key for key, _ in wanted]
                contexts, k = [ctx for _, ctx in wanted], self.session.tree.top_k
                self.tasks["draft"] = asyncio.ensure_future(
                    drafting.expand(drafter, contexts, k))
        elif "draft" not in self.tasks and self.session.wants_draft():
            self.draft_context = self.session.draft_context()
            self.tasks["draft"] = asyncio.ensure_future(
                drafting.draft(drafter, self.draft_context))

    def _drafted(self) -> list[Action]:
        """The session's actions for a draft token that is ready (none while drafting)."""
        if "draft" not in self.tasks or not self.tasks["draft"].done():
            return []
        result = self.tasks.pop("draft").result()
        if self.session.tree is not None:
            return self.session.on_expanded(self.expanding, result)
        return self.session.on_draft(self.draft_context, result)

    def _reply(self, task: asyncio.Future[Any]) -> TimingPlan | CommitEvent | DoneEvent:
        """The cloud's next message, or the error that ended the stream."""
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

    def _on_reply(self, msg: TimingPlan | CommitEvent) -> list[Action]:
        """Fold the cloud's Plan or Commit into the session; a Commit also feeds the
        acceptance estimate and marks the first commit's time."""
        if isinstance(msg, TimingPlan):
            self.session.on_plan(msg)
            return []
        self.first_commit_at = self.first_commit_at or time.perf_counter()
        if msg.drafts_verified:
            self.agent.acceptance.observe(msg.drafts_accepted, msg.drafts_verified)
        return self.session.on_commit(msg)

    async def _carry_out(self, action: Action) -> AskEvent | None:
        """Do what the session asked: send a tail, or produce a client event."""
        if isinstance(action, SendDrafts):
            tail = replace(action.tail, sent_at_ms=(time.perf_counter() - self.started) * 1e3)
            await self.stream.send(tail, best_effort=True)
            return None
        if isinstance(action, ShowPreview):
            session = self.session
            text = session.text + decode_after(self.agent.draft, action.token_ids,
                                               session.committed)
            return PreviewEvent(action.base, action.token_ids, text)
        return CommittedEvent(action.start, action.token_ids, action.text)

    async def _end_call(self) -> None:
        """Cancel the call unless it ended with Done (cancelled, failed or closed early),
        and every task still under way."""
        if self.session.done is None:
            with contextlib.suppress(Exception):
                self.stream.cancel()
        for task in self.tasks.values():
            task.cancel()
        for task in self.tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _final_event(self) -> FinalEvent:
        """The cloud's answer with the edge's own timings merged into its stats; the draft
        costs measured on the way update the agent's."""
        done = self.session.done
        assert done is not None
        agent, drafter = self.agent, self.drafter
        if agent.metrics is not None:
            agent.metrics.on_drafting(self.session.counters, drafter)
        if drafter.drafted_total:
            agent.costs.update(drafter.prefill_ms, drafter.ms_per_token)
            self.stage["draft_prefill"] = drafter.prefill_ms
        observe_uplink(agent.uplink, self.uploaded_bytes, done.stats.stage_ms)
        stats = edge_stats(done.stats, self.started, self.first_commit_at, self.stream,
                           self.stage)
        tree = self.session.tree
        stats = replace(
            stats, draft_forward_ms=drafter.draft_busy_ms,
            tree_nodes_sent=tree.nodes_sent if tree is not None else 0,
            tree_nodes_pruned=tree.nodes_pruned if tree is not None else 0,
            tree_branch_hits=tree.branch_hits if tree is not None else 0)
        return FinalEvent(
            answer=done.text,
            token_ids=done.token_ids,
            mode=self.spec.mode,
            feature_mode=self.prepared.feature_mode,
            finish_reason=done.finish_reason,
            stats=stats,
            plan=self.session.plan,
            window=self.prepared.window,
            timeline=(self.timeline.finish(self.prepared, self.link.rtt.value)
                      if self.timeline is not None else None),
        )


def tree_shape(shape: TreeShape | None, info: ServerInfo, drafter: DraftCache
               ) -> TreeShape | None:
    """How this request grows draft trees: the edge's shape within the cloud's tree
    limits, where the drafter expands several nodes in one forward and the cloud keeps
    trees; None (chains) otherwise."""
    limits = info.limits
    if shape is None or limits.max_tree_nodes <= 0 or not drafter.expands_in_one_forward:
        return None
    return replace(shape, node_budget=min(shape.node_budget, limits.max_tree_nodes),
                   max_depth=min(shape.max_depth, max(1, limits.max_tree_depth)),
                   cloud_nodes=limits.max_tree_nodes)


def observe_uplink(uplink: ThroughputEstimator, payload_bytes: int,
                   cloud_stage_ms: Mapping[str, float]) -> None:
    """Feed the uplink estimate the aligned features' transfer as the cloud timed it
    (header to last chunk, ``Done.stats.stage_ms["upload"]``). The edge's own clock
    around its writes is not used: it times buffers, not the link. Frames travel inside
    the Open, so nothing times them, and they do not feed the estimate."""
    ms = cloud_stage_ms.get(UPLOAD_STAGE, 0.0)
    if payload_bytes > 0 and ms > 0:
        uplink.observe(payload_bytes, ms / 1e3)


def feature_dtype(
    info: ServerInfo, edge_cost: EdgeCost, spec: AskSpec, settings: GenerationSettings,
    prepared: PreparedVisual,
) -> WireDtype:
    """fp16, or int8 when the shared plan says fp16 features do not fit the uplink
    (and the uplink has been measured: unknown is not slow)."""
    if prepared.features is None or edge_cost.uplink_bytes_per_s <= 0:
        return WireDtype.FLOAT16
    fp16 = RequestFacts(spec.question, settings.max_new_tokens, True, "aligned",
                        prepared.features.numel() * WireDtype.FLOAT16.itemsize)
    fits = plan(plan_inputs(info, edge_cost, fp16)).aligned_fits_uplink
    return WireDtype.FLOAT16 if fits else WireDtype.INT8


def edge_stats(
    cloud: RequestStats,
    started: float,
    first_commit_at: float | None,
    stream: VerifierStream,
    stage: dict[str, float],
) -> RequestStats:
    """The cloud's stats with the edge's view: time to first token and total as the
    client saw them, the bytes each way on this stream, and the edge's stages."""
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
