"""Whether the edge can answer now, why not, and a way to wait until it can.

Two things must be ready before an Ask in a cloud mode can start: the edge itself
(source opened, draft model loaded, costs measured) and the cloud verifier behind it
(reachable, warmed up, and really a Verifier). Health, ``GetStatus`` and every waiting
Ask read this one object, so they never disagree: the edge reports SERVING exactly when
an Ask in its default mode would start at once.

How long an Ask waits is the agent's business: a cloud that is warming up or briefly
unreachable is waited for, with progress; a cloud that is not a Verifier at all is not
(it will not become one).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Callable
from dataclasses import dataclass

from eventspec.shared.contract.errors import (
    EventSpecError,
    FailedPrecondition,
    Unavailable,
    WarmingUp,
)


class CloudState(enum.Enum):
    """The cloud verifier as the edge last saw it."""

    UNKNOWN = "not checked yet"
    READY = "ready"
    WARMING_UP = "warming up"
    UNREACHABLE = "unreachable"
    NOT_A_VERIFIER = "not an eventspec Verifier"
    REFUSED = "refused this edge"


@dataclass(frozen=True)
class CloudView:
    """One observation of the cloud: its state and, for people, what it said."""

    state: CloudState
    detail: str = ""

    def describe(self) -> str:
        """``ready``, ``warming up: calibrating, round 2 of 3``, ``unreachable``, ..."""
        return f"{self.state.value}: {self.detail}" if self.detail else self.state.value


@dataclass(frozen=True)
class Waiting:
    """Why an Ask cannot start yet (``stage`` is machine-readable)."""

    stage: str
    message: str


class Readiness:
    """The edge's own warm-up phase and its view of the cloud, with change notification.

    ``needs_cloud`` is False for an edge without ``--cloud`` (draft_only only): then only
    its own warm-up matters.
    """

    def __init__(self, *, needs_cloud: bool,
                 on_change: Callable[[bool], None] | None = None) -> None:
        self.needs_cloud = needs_cloud
        self.edge_phase: str | None = "starting"
        self.cloud = CloudView(CloudState.UNKNOWN)
        self._on_change = on_change
        self._changed = asyncio.Event()

    # -- updates ------------------------------------------------------------------------

    def set_edge_phase(self, phase: str | None) -> None:
        """The edge's own warm-up phase; None once it is warm."""
        self.edge_phase = phase
        self._notify()

    def set_cloud(self, view: CloudView) -> None:
        if view != self.cloud:
            self.cloud = view
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
        if self._on_change is not None:
            self._on_change(self.serving)

    # -- reading ------------------------------------------------------------------------

    @property
    def edge_ready(self) -> bool:
        return self.edge_phase is None

    @property
    def serving(self) -> bool:
        """What health reports: the edge can answer in its default mode now."""
        return self.waiting(needs_cloud=self.needs_cloud) is None

    def not_serving_reason(self) -> str:
        waiting = self.waiting(needs_cloud=self.needs_cloud)
        return waiting.message if waiting is not None else ""

    def waiting(self, *, needs_cloud: bool) -> Waiting | None:
        """What an Ask that ``needs_cloud`` (or not) would wait for; None: nothing."""
        if self.edge_phase is not None:
            return Waiting("edge_warming_up", f"the edge agent is warming up: {self.edge_phase}")
        if not needs_cloud:
            return None
        state = self.cloud.state
        if state == CloudState.READY:
            return None
        if state == CloudState.WARMING_UP:
            return Waiting("cloud_warming_up",
                           f"waiting for the cloud verifier: {self.cloud.detail or 'warming up'}")
        if state == CloudState.UNKNOWN:
            return Waiting("cloud_unreachable", "waiting for the cloud verifier: connecting")
        return Waiting("cloud_unreachable",
                       f"waiting for the cloud verifier: {self.cloud.describe()}")

    def refusal(self, *, needs_cloud: bool) -> EventSpecError | None:
        """The error an Ask gets now instead of waiting: a cloud that is not a Verifier
        will not become one, and one that refuses this edge's credentials will not
        change its mind while the Ask waits. None: waiting may help."""
        if not (needs_cloud and self.edge_ready):
            return None
        if self.cloud.state == CloudState.NOT_A_VERIFIER:
            return FailedPrecondition(
                "the edge's --cloud address does not serve an eventspec Verifier (it answered "
                "UNIMPLEMENTED; is it another edge's port?); the edge operator must fix --cloud"
            )
        if self.cloud.state == CloudState.REFUSED:
            # To the edge's client this is the cloud being unavailable, not the client's
            # own credentials being wrong.
            return Unavailable(f"cloud verifier: it refused this edge ({self.cloud.detail})")
        return None

    def timeout_error(self, *, needs_cloud: bool, waited_s: float) -> EventSpecError:
        """The distinct error for an Ask whose wait ran out (UNAVAILABLE, with a message
        that says whose fault it is: the client keys on its ``edge agent:`` and
        ``cloud verifier:`` prefixes)."""
        waiting = self.waiting(needs_cloud=needs_cloud)
        after = f"after waiting {waited_s:.1f} s"
        if waiting is not None and waiting.stage == "edge_warming_up":
            phase = self.edge_phase or "warming up"
            return WarmingUp(phase, f"edge agent: still warming up ({phase}) {after}; "
                                    "try again when its health is SERVING (eventspec wait)")
        if waiting is not None and waiting.stage == "cloud_warming_up":
            phase = self.cloud.detail or "warming up"
            return WarmingUp(phase, f"cloud verifier: still warming up ({phase}) {after}; "
                                    "try again when the edge reports SERVING (eventspec wait)")
        return Unavailable(f"cloud verifier: {self.cloud.describe()} {after}; try again later")

    async def next_change(self, timeout_s: float) -> None:
        """Return at the next change, or after ``timeout_s``."""
        changed = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout=max(0.0, timeout_s))
