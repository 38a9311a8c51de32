"""The edge's measured draft costs, smoothed over requests: what its profile (and so the
shared plan) says drafting costs on this machine."""

from __future__ import annotations

from eventspec.shared.contract.estimators import Ewma


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
