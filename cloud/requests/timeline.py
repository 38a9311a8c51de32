"""The cloud's side of a request's timeline (``eventspec.shared.contract.timeline``), when Open
asks for it.

Everything is logged on the session's clock (ms since the request took its KV slot)
from what the stream already sees on the event loop: the scheduler's timestamps on the
ticket (prefill queued and started), each ``Committed`` result (its step's end and
length), each Drafts message received and each Commit sent. Nothing runs on the engine
thread, and nothing runs at all unless ``Open.timeline`` is set.
"""

from __future__ import annotations

from eventspec.cloud.scheduling.tickets import Ticket
from eventspec.cloud.speculation.decoding import Committed
from eventspec.shared.contract.timeline import Timeline, TimelineLog
from eventspec.shared.contract.types import CommitEvent, DraftTail, RequestStats


class CloudTimeline:
    """One request's cloud-side event log."""

    def __init__(self, ticket: Ticket) -> None:
        self.ticket = ticket
        self.log = TimelineLog()
        self._prefill_end_ms: float | None = None

    def _ms(self, clock_value: float) -> float:
        return (clock_value - self.ticket.session.started) * 1e3

    def on_drafts(self, tail: DraftTail) -> None:
        """A Drafts message arrived; its ``sent_at_ms`` is the edge's clock."""
        self.log.add("cloud.drafts", self.ticket.session.elapsed_ms(),
                     tokens=len(tail.token_ids), peer_ms=tail.sent_at_ms)

    def on_committed(self, event: Committed) -> None:
        """A result from the engine loop: the prefill's first token, or one verify step."""
        t = self.ticket
        if self._prefill_end_ms is None:
            started = self._ms(t.prefill_started_at)
            self.log.add("cloud.queue", self._ms(t.submitted_at), started)
            self._prefill_end_ms = event.at_ms
            self.log.add("cloud.prefill", started, event.at_ms, verified=event.verified,
                         accepted=event.accepted, tokens=len(event.tokens))
            return
        self.log.add("cloud.verify", event.at_ms - event.step_ms, event.at_ms,
                     verified=event.verified, accepted=event.accepted, tokens=len(event.tokens))

    def on_commit_sent(self, commit: CommitEvent) -> None:
        self.log.add("cloud.commit", commit.at_ms, tokens=len(commit.token_ids),
                     verified=commit.drafts_verified, accepted=commit.drafts_accepted)

    def finish(self, stats: RequestStats) -> Timeline:
        """The log with the hidden drafts (at the prefill's end) and Done."""
        if self._prefill_end_ms is not None:
            self.log.add("cloud.hidden", self._prefill_end_ms, verified=stats.hidden_drafted,
                         accepted=stats.hidden_accepted)
        self.log.add("cloud.done", self.ticket.session.elapsed_ms())
        return self.log.freeze()
