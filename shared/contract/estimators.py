"""Online estimates both nodes keep: EWMA, per-token acceptance, smoothed RTT.

They feed the timing plan (``eventspec.shared.contract.timing``) with what was observed,
so the next plan uses the measured acceptance and link instead of the priors.
"""

from __future__ import annotations

import math

from eventspec.shared.contract.checks import check_finite_nonneg, check_int, check_probability
from eventspec.shared.contract.errors import InvalidInput


class Ewma:
    """Exponentially weighted moving average: ``v <- (1 - w) * v + w * x``."""

    def __init__(self, alpha_smoothing: float, initial: float | None) -> None:
        """``alpha_smoothing`` in (0, 1] is the weight of each new observation;
        ``initial`` None lets the first observation seed the average."""
        check_finite_nonneg("Ewma", "alpha_smoothing", alpha_smoothing)
        if not 0.0 < alpha_smoothing <= 1.0:
            raise InvalidInput(f"Ewma.alpha_smoothing must be in (0, 1], got {alpha_smoothing!r}")
        if initial is not None and not math.isfinite(initial):
            raise InvalidInput(f"Ewma.initial must be finite, got {initial!r}")
        self._w = float(alpha_smoothing)
        self._value = 0.0 if initial is None else float(initial)
        self._seeded = initial is not None
        self._count = 0

    @property
    def value(self) -> float:
        """The current average (the initial value, or 0, until the first update)."""
        return self._value

    @property
    def count(self) -> int:
        """Observations folded in so far."""
        return self._count

    def update(self, x: float) -> float:
        """Fold in one finite observation and return the new average."""
        if not math.isfinite(x):
            raise InvalidInput(f"Ewma.update needs a finite observation, got {x!r}")
        if self._seeded:
            self._value = (1.0 - self._w) * self._value + self._w * x
        else:
            self._value, self._seeded = float(x), True
        self._count += 1
        return self._value


class AcceptanceEstimator:
    """Per-token acceptance rate a: a prior, then an EWMA of observed verify steps.

    Why per token, not accepted/drafted per step: a step that verifies g drafts
    is a run of Bernoulli(a) trials stopped at the first rejection, so it
    observes ``accepted`` successes and, if ``accepted < g``, one failure. The
    trailing unverified drafts carry no information; counting them as failures
    (accepted/drafted) would bias a low.
    """

    def __init__(self, prior: float, smoothing: float = 0.05) -> None:
        """``smoothing`` is the weight of each observed trial."""
        check_probability("AcceptanceEstimator", "prior", prior)
        self._ewma = Ewma(smoothing, prior)

    @property
    def value(self) -> float:
        """Current estimate in [0, 1]."""
        return min(1.0, max(0.0, self._ewma.value))

    @property
    def trials(self) -> int:
        """Acceptance trials observed so far."""
        return self._ewma.count

    def observe(self, accepted: int, verified: int, *, rejections: int | None = None) -> float:
        """Fold in ``accepted`` of ``verified`` drafts; returns the new estimate.

        Without ``rejections`` the call is one verify step (one failure iff
        ``accepted < verified``). For totals over several steps, pass
        ``rejections``: the number of steps that rejected a draft. Aggregates
        passed as one step would count one failure per request and inflate a.
        """
        check_int("AcceptanceEstimator", "verified", verified, 0)
        check_int("AcceptanceEstimator", "accepted", accepted, 0)
        if accepted > verified:
            raise InvalidInput(
                f"AcceptanceEstimator: accepted={accepted} exceeds verified={verified}"
            )
        if rejections is None:
            rejections = 1 if accepted < verified else 0
        check_int("AcceptanceEstimator", "rejections", rejections, 0)
        if rejections > verified - accepted:
            raise InvalidInput(
                f"AcceptanceEstimator: rejections={rejections} exceeds the "
                f"{verified - accepted} rejected drafts"
            )
        if accepted < verified and rejections == 0:
            raise InvalidInput(
                "AcceptanceEstimator: rejections=0 but "
                f"{verified - accepted} drafts were not accepted"
            )
        # Spread failures evenly among successes so the order does not bias the EWMA.
        trials = accepted + rejections
        for i in range(trials):
            failed = (i + 1) * rejections // trials > i * rejections // trials
            self._ewma.update(0.0 if failed else 1.0)
        return self.value


class RttEstimator:
    """Smoothed RTT like TCP's SRTT/RTTVAR (RFC 6298: gains 1/8 and 1/4)."""

    def __init__(
        self,
        initial_ms: float | None = None,
        smoothing: float = 0.125,
        var_smoothing: float = 0.25,
    ) -> None:
        """Without ``initial_ms`` the first sample seeds the estimate, as in RFC 6298."""
        for name, w in (("smoothing", smoothing), ("var_smoothing", var_smoothing)):
            check_finite_nonneg("RttEstimator", name, w)
            if not 0.0 < w <= 1.0:
                raise InvalidInput(f"RttEstimator.{name} must be in (0, 1], got {w!r}")
        if initial_ms is not None:
            check_finite_nonneg("RttEstimator", "initial_ms", initial_ms)
        self._g = float(smoothing)
        self._h = float(var_smoothing)
        self._srtt: float | None = None if initial_ms is None else float(initial_ms)
        self._rttvar = 0.0 if initial_ms is None else float(initial_ms) / 2.0
        self._samples = 0

    @property
    def value(self) -> float:
        """Smoothed RTT in ms (0 before any estimate)."""
        return 0.0 if self._srtt is None else self._srtt

    @property
    def rttvar(self) -> float:
        """Smoothed mean deviation in ms."""
        return self._rttvar

    @property
    def samples(self) -> int:
        """Samples folded in so far."""
        return self._samples

    def update(self, sample_ms: float) -> float:
        """Fold in one RTT sample (ms, finite, >= 0) and return the smoothed RTT."""
        check_finite_nonneg("RttEstimator", "sample_ms", sample_ms)
        self._samples += 1
        if self._srtt is None:
            self._srtt = float(sample_ms)
            self._rttvar = sample_ms / 2.0
            return self._srtt
        self._rttvar = (1.0 - self._h) * self._rttvar + self._h * abs(self._srtt - sample_ms)
        self._srtt = (1.0 - self._g) * self._srtt + self._g * sample_ms
        return self._srtt


class ThroughputEstimator:
    """Smoothed bytes per second of transfers the node timed itself (its uplink).

    0 means unknown (nothing measured yet), which the timing model reads as such.
    Transfers shorter than ``min_bytes`` are ignored: their time is mostly latency.
    """

    def __init__(self, smoothing: float = 0.3, min_bytes: int = 64 << 10) -> None:
        check_int("ThroughputEstimator", "min_bytes", min_bytes, 0)
        self._ewma = Ewma(smoothing, None)
        self._min_bytes = min_bytes

    @property
    def bytes_per_s(self) -> float:
        return self._ewma.value

    def observe(self, nbytes: int, seconds: float) -> None:
        """Fold in one transfer of ``nbytes`` that took ``seconds``."""
        check_int("ThroughputEstimator", "nbytes", nbytes, 0)
        check_finite_nonneg("ThroughputEstimator", "seconds", seconds)
        if nbytes >= self._min_bytes and seconds > 0:
            self._ewma.update(nbytes / seconds)
