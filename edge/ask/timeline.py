"""The edge's side of a request's timeline (``eventspec.shared.contract.timeline``), and the merge
with the
cloud's, when the Ask asks for it (``AskRequest.timeline``).

What is logged, on the edge's clock (ms since this request's Open was sent, the same
clock as ``Drafts.sent_at_ms``):

- every message to and from the cloud, through :class:`RecordingStream` wrapped around
  the Generate stream: the uplink (Open and the visual input), each Drafts message
  sent, the Plan, each Commit received (with the cloud's ``at_ms`` for aligning the
  clocks) and Done;
- the draft model's prefill and each drafted token (``DraftCache.spans``);
- the window rendering that came before the Open.

Nothing here runs unless the Ask asked for a timeline.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from eventspec.edge.drafting.cache import DraftCache
from eventspec.edge.uplink.roles import VerifierStream
from eventspec.edge.vision.inputs import PreparedVisual
from eventspec.shared.contract.convert_verifier import CloudOutbound, EdgeInbound
from eventspec.shared.contract.timeline import Timeline, TimelineLog, merge
from eventspec.shared.contract.timing import TimingPlan
from eventspec.shared.contract.types import CommitEvent, DoneEvent, DraftTail
from eventspec.shared.node.tracing import EDGE_SPANS, current_request_span


class EdgeTimeline:
    """One request's edge-side event log; ``started`` is the agent's perf_counter at Open."""

    def __init__(self, started: float, drafter: DraftCache, *, wanted: bool = True) -> None:
        self.started = started
        #: Whether the client asked for it (else it is kept for the trace only).
        self.wanted = wanted
        self.drafter = drafter
        drafter.spans = []
        self.log = TimelineLog()
        self.uplink: tuple[float, float] | None = None
        self.cloud: Timeline | None = None

    def ms(self, clock_value: float | None = None) -> float:
        """``clock_value`` (perf_counter; now if None) in ms on this request's clock."""
        return ((time.perf_counter() if clock_value is None else clock_value)
                - self.started) * 1e3

    def wrap(self, stream: VerifierStream) -> RecordingStream:
        return RecordingStream(stream, self)

    def on_sent(self, msg: EdgeInbound, start_ms: float, end_ms: float) -> None:
        if isinstance(msg, DraftTail):
            self.log.add("edge.drafts_sent", msg.sent_at_ms, tokens=len(msg.token_ids))
        elif self.uplink is None:
            self.uplink = (start_ms, end_ms)
        else:
            self.uplink = (self.uplink[0], end_ms)

    def on_received(self, msg: CloudOutbound) -> None:
        now = self.ms()
        if isinstance(msg, CommitEvent):
            self.log.add("edge.commit", now, verified=msg.drafts_verified,
                         accepted=msg.drafts_accepted, tokens=len(msg.token_ids),
                         peer_ms=msg.at_ms)
        elif isinstance(msg, TimingPlan):
            self.log.add("edge.plan", now)
        elif isinstance(msg, DoneEvent):
            self.log.add("edge.done", now)
            self.cloud = msg.timeline

    def finish(self, prepared: PreparedVisual, rtt_ms: float) -> Timeline | None:
        """Both sides' events on the edge's clock, when the client asked for them; the
        edge's become child spans of the Ask's trace, when tracing is on."""
        if prepared.ready_at:
            end = self.ms(prepared.ready_at)
            self.log.add("edge.render", end - prepared.render_ms, end)
        if self.uplink is not None:
            self.log.add("edge.uplink", *self.uplink)
        d = self.drafter
        if d.prefill_span is not None:
            self.log.add("edge.draft_prefill", self.ms(d.prefill_span[0]),
                         self.ms(d.prefill_span[1]))
        for t0, t1 in d.spans or ():
            self.log.add("edge.draft", self.ms(t0), self.ms(t1), tokens=1)
        span = current_request_span()
        if span is not None:
            span.add_children(self.log.events, EDGE_SPANS, self.started)
        return merge(self.log.freeze(), self.cloud, rtt_ms) if self.wanted else None


class RecordingStream:
    """A ``VerifierStream`` that logs what passes through it (timeline only)."""

    def __init__(self, inner: VerifierStream, timeline: EdgeTimeline) -> None:
        self._inner = inner
        self._timeline = timeline

    @property
    def uplink_bytes(self) -> int:
        return self._inner.uplink_bytes

    @uplink_bytes.setter
    def uplink_bytes(self, value: int) -> None:
        self._inner.uplink_bytes = value

    @property
    def downlink_bytes(self) -> int:
        return self._inner.downlink_bytes

    @downlink_bytes.setter
    def downlink_bytes(self, value: int) -> None:
        self._inner.downlink_bytes = value

    async def send(self, msg: EdgeInbound, *, best_effort: bool = False) -> None:
        start = self._timeline.ms()
        await self._inner.send(msg, best_effort=best_effort)
        self._timeline.on_sent(msg, start, self._timeline.ms())

    async def done_writing(self) -> None:
        await self._inner.done_writing()

    async def replies(self) -> AsyncIterator[CloudOutbound]:
        async for msg in self._inner.replies():
            self._timeline.on_received(msg)
            yield msg

    def cancel(self) -> None:
        self._inner.cancel()

    def __getattr__(self, name: str) -> Any:
        """Anything else is the wrapped stream's (e.g. the replica it runs on)."""
        return getattr(self._inner, name)


