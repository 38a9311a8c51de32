"""A request's timeline: the event log each side keeps, and the edge's merge of the two.

Asked for (``AskRequest.timeline``, which the edge passes on as ``Open.timeline``), the
cloud logs its side of one request on its own clock (queue, prefill, hidden drafts,
each verify step with its verified and accepted counts, each Commit sent, each Drafts
message received) and returns it in ``Done.timeline``; the edge logs its side (render,
uplink, draft prefill, each drafted token, each Drafts message sent, each Commit
received) and returns both in ``Final.timeline`` on the edge's clock.

The clocks are aligned from timestamps both sides already exchange: each ``Drafts``
carries the edge's send time and the cloud logs when it arrived; each ``Commit`` carries
the cloud's send time and the edge logs when it arrived. With ``edge = cloud + offset``,
every commit bounds ``offset`` from above (it cannot arrive before it was sent) and every
Drafts message bounds it from below; the midpoint of the tightest bounds is the offset
(NTP's assumption: the two directions take equally long). The Open bounds it from below
too: the cloud cannot log a request before the edge sent it. With no Drafts
(target-only), the commits' bound minus half the smoothed RTT is used, moved up to the
Open's bound when an overstated RTT would put the cloud's queue before the Open.

Recording is off unless asked for, and bounded (``MAX_EVENTS`` per side), so it costs
nothing by default and a few kilobytes when on. Pure: no clocks of its own, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

#: Events one side keeps per request; later ones are counted in ``Timeline.dropped``.
MAX_EVENTS = 512

#: Lanes, top to bottom, as the picture draws them.
EDGE_LANES = ("edge.render", "edge.uplink", "edge.plan", "edge.draft_prefill", "edge.draft",
              "edge.drafts_sent", "edge.commit", "edge.done")
CLOUD_LANES = ("cloud.drafts", "cloud.queue", "cloud.prefill", "cloud.hidden",
               "cloud.verify", "cloud.commit", "cloud.done")
LANES = EDGE_LANES + CLOUD_LANES


@dataclass(frozen=True)
class TimelineEvent:
    """One span on a lane (an instant when ``end_ms == start_ms``)."""

    lane: str
    start_ms: float
    end_ms: float
    verified: int = 0
    accepted: int = 0
    tokens: int = 0
    #: The other side's timestamp of the same message (clock alignment); 0 if none.
    peer_ms: float = 0.0


@dataclass(frozen=True)
class Timeline:
    """A request's events; in a Final, cloud events are already on the edge's clock."""

    events: tuple[TimelineEvent, ...] = ()
    dropped: int = 0
    cloud_offset_ms: float = 0.0
    clock_sync: str = ""

    def lane(self, name: str) -> list[TimelineEvent]:
        """The events of one lane, in time order."""
        return sorted((e for e in self.events if e.lane == name), key=lambda e: e.start_ms)


@dataclass
class TimelineLog:
    """One side's bounded event log for one request."""

    limit: int = MAX_EVENTS
    events: list[TimelineEvent] = field(default_factory=list)
    dropped: int = 0

    def add(self, lane: str, start_ms: float, end_ms: float | None = None, *,
            verified: int = 0, accepted: int = 0, tokens: int = 0,
            peer_ms: float = 0.0) -> None:
        """Log a span (``end_ms`` None: an instant); past the bound it is only counted."""
        if len(self.events) >= self.limit:
            self.dropped += 1
            return
        self.events.append(TimelineEvent(lane, start_ms, start_ms if end_ms is None else end_ms,
                                         verified, accepted, tokens, peer_ms))

    def freeze(self) -> Timeline:
        return Timeline(tuple(self.events), self.dropped)


def align_clocks(edge: Iterable[TimelineEvent], cloud: Iterable[TimelineEvent],
                 rtt_ms: float) -> tuple[float, str]:
    """``offset`` with edge time = cloud time + offset, and how it was found.

    ``edge.commit`` events (edge arrival, cloud ``peer_ms`` send) bound the offset from
    above; ``cloud.drafts`` events (cloud arrival, edge ``peer_ms`` send) from below, and
    so does the Open: the cloud's first event of the request cannot precede the edge's
    ``edge.uplink`` start (its Open). An estimate from one side and the RTT is clamped
    into the bounds, so no cloud event is drawn before its cause even when the RTT is
    overstated (a loopback link once read 142 ms).
    """
    edge, cloud = list(edge), list(cloud)
    upper = min((e.start_ms - e.peer_ms for e in edge if e.lane == "edge.commit"),
                default=None)
    lower = max((e.peer_ms - e.start_ms for e in cloud if e.lane == "cloud.drafts"),
                default=None)
    opened = min((e.start_ms for e in edge if e.lane == "edge.uplink"), default=None)
    first_seen = min((e.start_ms for e in cloud), default=None)
    by_open = None if opened is None or first_seen is None else opened - first_seen
    if lower is not None and upper is not None and lower <= upper:
        bound = lower if by_open is None else max(lower, min(by_open, upper))
        return (upper + bound) / 2, "Drafts and Commits in both directions (NTP-style midpoint)"
    if upper is not None:
        offset = upper - max(rtt_ms, 0.0) / 2
        if by_open is not None and offset < by_open <= upper:
            return by_open, ("Commit arrivals less half the smoothed RTT, moved to the Open "
                             "(the cloud cannot see the request before it was sent)")
        return offset, "Commit arrivals less half the smoothed RTT"
    if lower is not None:
        return lower + max(rtt_ms, 0.0) / 2, "Drafts arrivals plus half the smoothed RTT"
    return 0.0, "no exchanged timestamps: clocks not aligned"


def merge(edge: Timeline, cloud: Timeline | None, rtt_ms: float) -> Timeline:
    """Both sides' events on the edge's clock (the cloud's shifted by the offset)."""
    if cloud is None:
        return dataclasses.replace(edge, clock_sync="edge only: the cloud sent no timeline")
    offset, how = align_clocks(edge.events, cloud.events, rtt_ms)
    shifted = tuple(
        dataclasses.replace(e, start_ms=e.start_ms + offset, end_ms=e.end_ms + offset)
        for e in cloud.events
    )
    return Timeline(edge.events + shifted, edge.dropped + cloud.dropped, offset, how)
