"""One Generate stream, end to end, over domain types (no protobuf, no gRPC).

The servicer converts wire messages to domain messages and back; this module owns the
order of events: Open, the visual input, Plan, prefill (while hidden drafts arrive),
then the commits of the steps that verify whatever valid drafts extend C, then Done. A
reader task (``eventspec.cloud.requests.inbox``) consumes the edge's messages concurrently, so
drafts land while the model works; the Open's checks are ``eventspec.cloud.requests.open_request``.
The stream talks only to the scheduler (``eventspec.cloud.scheduling.scheduler``): it never calls
the engine, and it never reads the session while the engine thread owns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eventspec.cloud.requests.inbox import Inbox, visual_input
from eventspec.cloud.requests.log import RequestRecord
from eventspec.cloud.requests.open_request import clamp_to_context, first_message, validate_open
from eventspec.cloud.requests.replanning import Replanner
from eventspec.cloud.requests.timeline import CloudTimeline
from eventspec.cloud.runtime import VerifierRuntime
from eventspec.cloud.scheduling.prefix_cache import visual_key
from eventspec.cloud.scheduling.tickets import Failure, Ticket
from eventspec.cloud.speculation.decoding import Committed, DecodingSession
from eventspec.shared.contract.convert_verifier import CloudOutbound, EdgeInbound
from eventspec.shared.contract.errors import EventSpecError, InvalidInput
from eventspec.shared.contract.principal import current_principal
from eventspec.shared.contract.timing import PlanInputs, TimingPlan
from eventspec.shared.contract.types import (
    CommitEvent,
    DoneEvent,
    FinishReason,
    OpenRequest,
)
from eventspec.shared.node.logsafe import safe_request_id
from eventspec.shared.node.tracing import (
    CLOUD_SPANS,
    RequestSpan,
    final_attributes,
    incoming_metadata,
)

if TYPE_CHECKING:
    from eventspec.cloud.metrics import RequestProbe

log = logging.getLogger(__name__)


@dataclass
class ByteCounter:
    """Serialized bytes each way, filled in by the transport."""

    uplink: int = 0
    downlink: int = 0


async def run_generate(
    rt: VerifierRuntime, messages: AsyncIterator[EdgeInbound], counter: ByteCounter
) -> AsyncIterator[CloudOutbound]:
    """Serve one Generate stream: yields a Plan, Commits, then Done.

    Whatever happens, one INFO line records the request (``eventspec.cloud.requests.log``):
    answers, refusals, failures and cancellations alike, never the question.
    """
    record = RequestRecord(principal=str(current_principal()))
    probe = rt.metrics.request(current_principal()) if rt.metrics is not None else None
    span = (RequestSpan.begin(rt.tracer, "Generate", parent_metadata=incoming_metadata())
            if rt.tracer is not None else None)
    done: list[DoneEvent] = []
    try:
        async with contextlib.aclosing(_serve(rt, messages, counter, record, probe,
                                              span)) as events:
            async for event in events:
                if isinstance(event, DoneEvent):
                    done.append(event)
                yield event
    except EventSpecError as exc:
        record.fail(exc.code.name, exc.message)
        if probe is not None:
            probe.on_error(exc)
        raise
    except (asyncio.CancelledError, GeneratorExit):
        record.fail("CANCELLED", "the edge went away")
        if probe is not None:
            probe.on_cancelled()
        raise
    except Exception as exc:
        record.fail("INTERNAL", type(exc).__name__)
        raise
    finally:
        record.log()
        if span is not None:
            span.finish(CLOUD_SPANS, attributes={
                "eventspec.request_id": record.request_id, "eventspec.mode": record.mode,
                **final_attributes(done[0] if done else None)},
                error=None if done else record.outcome)


async def _serve(
    rt: VerifierRuntime, messages: AsyncIterator[EdgeInbound], counter: ByteCounter,
    record: RequestRecord, probe: RequestProbe | None = None, span: RequestSpan | None = None,
) -> AsyncGenerator[CloudOutbound, None]:
    open_req, prompt_ids = await _receive_open(rt, messages, record, probe)
    key, ticket = await _admit(rt, open_req, len(prompt_ids), probe)
    inbox, timeline = _attach(rt, key, ticket, open_req, probe, span)
    reader = asyncio.create_task(inbox.consume(messages))
    try:
        plan, plan_inputs = rt.plan_for(open_req)  # states the clamped max_new_tokens
        yield plan

        results = _Results(rt, ticket, inbox, record, probe, timeline)
        await results.prefill(open_req, prompt_ids)
        replanner = Replanner(plan, plan_inputs) if plan_inputs is not None else None
        async with contextlib.aclosing(results.commits()) as commits:
            async for commit in commits:
                yield commit
                if replanner is not None and (fresh := results.replan(replanner)) is not None:
                    yield fresh
        yield results.done(open_req, plan, plan_inputs, counter, len(prompt_ids))
        # Keep the stream open until the edge half-closes (bounded), so a Drafts message
        # it wrote while Done was in flight is drained here instead of failing its write
        # and taking the Done with it.
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(reader), timeout=rt.settings.drain_timeout_s)
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
        await rt.registry.close(key)


async def _receive_open(
    rt: VerifierRuntime, messages: AsyncIterator[EdgeInbound], record: RequestRecord,
    probe: RequestProbe | None,
) -> tuple[OpenRequest, list[int]]:
    """The stream's Open, checked and clamped to the context, and its prompt's token ids;
    the request's log line and metrics learn its id and mode as soon as it arrives."""
    first = await first_message(rt, messages)
    record.request_id = safe_request_id(first.request_id)
    record.mode = _mode(first)
    if probe is not None:
        probe.mode = "speculative" if first.speculative else "target_only"
    open_req = validate_open(first, rt)
    prompt_ids = rt.target.build_prompt_ids(open_req.question)
    open_req = clamp_to_context(open_req, len(prompt_ids), rt.scheduler.engine.max_seq_len)
    return open_req, prompt_ids


async def _admit(
    rt: VerifierRuntime, open_req: OpenRequest, prompt_len: int, probe: RequestProbe | None
) -> tuple[int, Ticket]:
    """A place under the session caps, then a KV slot: (the registry key, the ticket).
    The place is given back when no slot is free."""
    sched = rt.scheduler
    # KV for the prompt and the answer cap: with KV by length the request gets exactly
    # that and its session stays within it; a fixed slot holds max_seq_len whatever.
    need = prompt_len + open_req.generation.max_new_tokens
    room = need if sched.kv_by_length else sched.engine.max_seq_len

    def make_session(slot: int) -> DecodingSession:
        return DecodingSession(
            settings=open_req.generation,
            slot=slot,
            prompt_len=prompt_len,
            max_seq_len=room,
            eos_token_id=rt.info.eos_token_id,
            max_verify_tokens=rt.settings.max_verify_tokens,
            decode=rt.target.decode,
            speculative=open_req.speculative,
            deadline_ms=open_req.deadline_ms,
        )

    if probe is not None:
        probe.stage = "sessions"
    key = rt.registry.open(open_req.request_id, _nothing_to_release,  # the session caps
                           principal=current_principal())
    if probe is not None:
        probe.stage = "kv"
    try:
        if rt.kv_queue is None:
            ticket = sched.admit(open_req.request_id, make_session, positions=need)
        else:  # a KV slot, waiting in line while none is free
            wait_s = rt.settings.kv_wait_s
            if open_req.deadline_ms > 0:
                wait_s = min(wait_s, open_req.deadline_ms / 1000)
            ticket = await rt.kv_queue.admit(
                lambda: sched.admit(open_req.request_id, make_session, positions=need),
                positions=need, wait_s=wait_s, full_message=lambda: sched.pool.full_message)
    except BaseException:
        await rt.registry.close(key)
        raise
    return key, ticket


def _attach(
    rt: VerifierRuntime, key: int, ticket: Ticket, open_req: OpenRequest,
    probe: RequestProbe | None, span: RequestSpan | None,
) -> tuple[Inbox, CloudTimeline | None]:
    """The inbox that will read the edge's messages, the request's timeline (when Open
    or a trace asks for one), and the registry's hooks to release and expire it."""
    inbox = Inbox(ticket, open_req, rt)
    if probe is not None:
        probe.stage = "run"
        inbox.probe = probe
    timeline = CloudTimeline(ticket) if open_req.timeline or span is not None else None
    inbox.timeline = timeline
    if span is not None and timeline is not None:  # its stages become the span's children
        span.attach(timeline.log.events, ticket.session.started)
    rt.registry.attach(key, _releaser(rt, ticket), inbox.expire)
    return inbox, timeline


class _Results:
    """One admitted request's results from the scheduler, as Commits and then Done."""

    def __init__(self, rt: VerifierRuntime, ticket: Ticket, inbox: Inbox,
                 record: RequestRecord, probe: RequestProbe | None,
                 timeline: CloudTimeline | None) -> None:
        self.rt, self.ticket, self.inbox = rt, ticket, inbox
        self.record, self.probe, self.timeline = record, probe, timeline
        self.received: list[int] = []
        self.finish: FinishReason | None = None

    async def prefill(self, open_req: OpenRequest, prompt_ids: Sequence[int]) -> None:
        """Queue the prefill once the visual input is in; a request cancelled before its
        features arrived finishes CANCELLED without one.

        With the prefix cache on, the visual input is keyed here, off the engine thread;
        a clip whose prefix the cache holds skips its frames' preprocessing (22 ms for 8
        frames on the H200 machine), which only the prefill of its <video> rows needs.
        """
        scheduler = self.rt.scheduler
        keyed = scheduler.prefix_cache is not None
        vkey: str | None = None
        if keyed and open_req.frames is not None:
            vkey = await asyncio.to_thread(visual_key, frames=open_req.frames)
            if scheduler.prefix_may_hit(prompt_ids, vkey):
                scheduler.submit_prefill(self.ticket, prompt_ids, visual_key=vkey,
                                         deferred_frames=tuple(open_req.frames))
                return
        visual = await visual_input(self.rt, open_req, self.inbox)
        if visual is None:  # cancelled before the features arrived: no prefill
            self.finish = FinishReason.CANCELLED
            self.ticket.session.finish(self.finish)
            return
        if keyed and vkey is None and visual.get("video_features") is not None:
            vkey = await asyncio.to_thread(visual_key, tensor=visual["video_features"])
        scheduler.submit_prefill(self.ticket, prompt_ids, **visual, visual_key=vkey)

    async def commits(self) -> AsyncGenerator[CommitEvent, None]:
        """A Commit for each result that carries tokens, until one carries a finish
        reason; a Failure raises its error, also one posted right after the last result."""
        ticket = self.ticket
        while self.finish is None:
            event = await ticket.events.get()
            if isinstance(event, Failure):
                raise event.error
            if event.tokens:
                yield self._commit(event)
            self.finish = event.finish_reason
        self.inbox.finished = True
        if not ticket.events.empty():
            pending = ticket.events.get_nowait()
            if isinstance(pending, Failure):
                raise pending.error

    def replan(self, replanner: Replanner) -> TimingPlan | None:
        """A Plan for the load and acceptance now, when the edge should act otherwise."""
        session = self.ticket.session
        c = session.counters
        try:
            fresh = replanner.after_commit(len(self.received), self.rt.scheduler.live,
                                           c.accepted, c.drafted, c.rejections)
        except InvalidInput as exc:  # a re-plan is advice: it never fails the answer
            log.warning("request %s: re-planning stopped: %s", self.record.request_id, exc)
            replanner.stop()
            return None
        if fresh is not None:
            c.plans_sent = replanner.sent
            log.debug("request %s re-planned: %s", self.record.request_id, fresh.reason)
        return fresh

    def _commit(self, event: Committed) -> CommitEvent:
        """Take in one result's tokens and say so in the log, metrics and timeline."""
        self.received.extend(event.tokens)
        self.inbox.received = len(self.received)
        self.record.tokens = len(self.received)
        if self.probe is not None:
            self.probe.on_commit(len(event.tokens), event.verified, event.accepted)
        commit = _commit_event(event, self.received, self.rt, self.ticket.session)
        if self.timeline is not None:
            self.timeline.on_committed(event)
            self.timeline.on_commit_sent(commit)
        return commit

    def done(self, open_req: OpenRequest, plan: TimingPlan, plan_inputs: PlanInputs | None,
             counter: ByteCounter, prompt_len: int) -> DoneEvent:
        """The answer's Done (its text, stats and the plan replanned on what was observed),
        recorded in the log line and the metrics."""
        rt, session, finish = self.rt, self.ticket.session, self.finish
        assert finish is not None
        stats = session.stats(counter.uplink, counter.downlink)
        logged = self.timeline.finish(stats) if self.timeline is not None else None
        rt.observe(stats, session.counters.rejections)
        done = DoneEvent(
            finish_reason=finish,
            token_ids=tuple(self.received),
            text=session.visible(rt.target.decode(self.received), finish),
            stats=stats,
            final_plan=dataclasses.replace(
                rt.replan(plan, plan_inputs, stats, session.counters.rejections),
                max_new_tokens=open_req.generation.max_new_tokens,
            ),
            timeline=logged if open_req.timeline else None,
        )
        self.record.finish(done.finish_reason.name, stats)
        if self.probe is not None:
            ticket = self.ticket
            if ticket.prefill_started_at:
                self.probe.on_prefill(prompt_len, ticket.prefill_started_at - ticket.submitted_at)
            self.probe.on_done(done.finish_reason.name, stats)
        return done


def _commit_event(event: Committed, received: list[int], rt: VerifierRuntime,
                  session: DecodingSession) -> CommitEvent:
    return CommitEvent(
        start=event.start,
        token_ids=event.tokens,
        drafts_verified=event.verified,
        drafts_accepted=event.accepted,
        text=session.visible(rt.target.decode(received), event.finish_reason),
        at_ms=session.elapsed_ms(),
    )


async def _nothing_to_release() -> None:
    """A registered request holds nothing until ``SessionRegistry.attach``."""


def _releaser(rt: VerifierRuntime, ticket: Ticket) -> Callable[[], Awaitable[None]]:
    async def release() -> None:
        rt.scheduler.release(ticket)

    return release


def _mode(open_req: OpenRequest) -> str:
    """``speculative`` or ``target_only``, and the visual path, for the request's log."""
    visual = "aligned" if open_req.aligned is not None else "frames"
    return f"{'speculative' if open_req.speculative else 'target_only'}/{visual}"
