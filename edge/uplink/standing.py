"""Whether a cloud replica takes requests: in rotation, resting, or being probed.

A replica that froze (it took a request and sent no Plan within
``--cloud-first-reply-s``, or let GetServerInfo run out its deadline) leaves the
rotation. It used to come back as soon as its rest was over, and the next Ask sent to
it waited the first-reply timeout again: with a replica frozen for minutes, about 13%
of Asks waited 5.6 s (issue 38). Now, once its rest is over, it is probed out of band
(``eventspec.edge.uplink.replicas.Prober``) and takes requests again only after a probe
answers; failed probes are repeated with a growing, bounded gap. With no other replica
in rotation the rest is skipped: waiting it out would only keep every Ask waiting.

A replica whose stream was dropped (UNAVAILABLE: connection reset, process gone) only
rests, as before: that is not a freeze, the channel sees a dead peer itself, and a
request's retry may still go back to it when no other replica takes requests.

Pure: every method is given the time, so the tests drive it without a clock.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field


class Phase(enum.Enum):
    """Where a replica stands."""

    IN_ROTATION = "in rotation"
    RESTING = "resting"
    PROBING = "out of rotation, being probed"


@dataclass(frozen=True)
class ProbePolicy:
    """How a replica that froze is probed: each probe's deadline, the gap after a failed
    probe (doubling from ``first_gap_s`` up to ``max_gap_s``, which bounds how long a
    replica that recovered stays out), and how often failures are logged loudly."""

    timeout_s: float = 2.0
    first_gap_s: float = 0.5
    max_gap_s: float = 5.0
    log_every_s: float = 60.0


@dataclass
class ReplicaStanding:
    """One replica's standing; see the module docstring for the rules."""

    policy: ProbePolicy = field(default_factory=ProbePolicy)
    #: Until when it takes no requests (a rest after a freeze or a dropped stream).
    resting_until: float = -math.inf
    #: When it froze; None while it is in rotation.
    out_since: float | None = None
    #: The earliest next probe after a failed one (-inf: none failed yet).
    retry_at: float = -math.inf
    gap_s: float = 0.0
    failed_probes: int = 0
    _logged_at: float = -math.inf

    @property
    def frozen(self) -> bool:
        """Out of rotation until a probe answers."""
        return self.out_since is not None

    def phase(self, now: float) -> Phase:
        if now < self.resting_until:
            return Phase.RESTING
        return Phase.PROBING if self.frozen else Phase.IN_ROTATION

    def takes_requests(self, now: float) -> bool:
        return self.phase(now) == Phase.IN_ROTATION

    def froze(self, now: float, rest_s: float) -> bool:
        """It did not answer in time: out of rotation, resting ``rest_s`` before the
        first probe. True when this took it out (False: it was out already)."""
        self.resting_until = max(self.resting_until, now + rest_s)
        if self.frozen:
            return False
        self.out_since = now
        self.retry_at = -math.inf
        self.gap_s = self.policy.first_gap_s
        self.failed_probes = 0
        self._logged_at = -math.inf
        return True

    def dropped(self, now: float, rest_s: float) -> None:
        """Its stream was dropped: it rests ``rest_s``, then takes requests again."""
        self.resting_until = max(self.resting_until, now + rest_s)

    def next_probe_at(self, *, nowhere_else: bool) -> float:
        """When it may be probed next (inf while in rotation); ``nowhere_else``: no
        other replica takes requests, so its rest no longer holds the probe back."""
        if not self.frozen:
            return math.inf
        return self.retry_at if nowhere_else else max(self.retry_at, self.resting_until)

    def probe_due(self, now: float, *, nowhere_else: bool) -> bool:
        return now >= self.next_probe_at(nowhere_else=nowhere_else)

    def probe_passed(self, now: float) -> float:
        """A probe answered: back in rotation. Returns the seconds it was out."""
        out_s = 0.0 if self.out_since is None else now - self.out_since
        self.out_since = None
        self.resting_until = -math.inf
        self.retry_at = -math.inf
        return out_s

    def probe_failed(self, now: float) -> bool:
        """A probe failed: it stays out, probed again after a growing gap. True when this
        failure should be logged loudly (the first, then one a ``log_every_s``)."""
        self.failed_probes += 1
        self.retry_at = now + self.gap_s
        self.gap_s = min(2 * self.gap_s, self.policy.max_gap_s)
        if now - self._logged_at < self.policy.log_every_s:
            return False
        self._logged_at = now
        return True
