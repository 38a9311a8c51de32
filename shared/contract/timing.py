"""The timing budget's vocabulary: each node's measured costs, what the planner reads and
the plan it returns.

Frozen dataclasses that mirror the proto's ``CloudProfile``, ``EdgeProfile`` and ``Plan``
and check their own ranges, so a broken profile is refused where it is built (or
received), before any arithmetic. The arithmetic itself, the one deterministic cost model
both nodes run, is :func:`eventspec.shared.contract.timing_model.plan`; kept apart so
this module reads as the contract and that one as the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from eventspec.shared.contract.checks import (
    check_finite_nonneg,
    check_int,
    check_positive,
    check_probability,
    check_range,
)
from eventspec.shared.contract.errors import InvalidInput

PayloadMode = Literal["frames", "aligned"]

#: The span of a measured time the model accepts (1 us to 1 h): beyond it a profile is
#: broken, and finite extremes (5e-324) would overflow the arithmetic.
MIN_MS = 1e-3
MAX_MS = 3.6e6
#: Up to 1 Tbit/s of uplink.
#: Slowest uplink that counts as a measurement (below it, 0 means unknown).
MIN_BYTES_PER_S = 1.0
MAX_BYTES_PER_S = 1.25e11


#: The fitted terms of :class:`CloudCost` (what calibration measures and a profile saves).
CLOUD_COST_FIELDS: tuple[str, ...] = (
    "prefill_base_ms",
    "prefill_ms_per_visual_token",
    "prefill_ms_per_text_token",
    "step_base_ms",
    "step_ms_per_token",
    "step_ms_per_session",
)


@dataclass(frozen=True)
class CloudCost:
    """The cloud's calibrated linear cost model (ms on its device); mirrors ``CloudProfile``.

    A batched step over B sessions feeding N tokens in all costs
    ``step_base_ms + (B - 1) * step_ms_per_session + N * step_ms_per_token``.
    ``load_sessions`` is how many sessions the cloud is stepping together now (the
    server publishes its recent mean batch size), so :meth:`step_ms` is the step a new
    request will actually share: a loaded cloud steps slower, which lowers c = t_draft /
    t_step and lets the plan draft where drafting pays (DESIGN.md, "Performance posture").
    """

    prefill_base_ms: float
    prefill_ms_per_visual_token: float
    prefill_ms_per_text_token: float
    step_base_ms: float
    step_ms_per_token: float
    device: str = ""
    step_ms_per_session: float = 0.0
    load_sessions: float = 1.0
    #: Where the numbers come from ("measured at warm-up", "profile file", ...).
    calibration: str = ""
    #: The measurement failed its own sanity check: used for this run only, never saved.
    unreliable: bool = False

    def __post_init__(self) -> None:
        for name in (*CLOUD_COST_FIELDS, "load_sessions"):
            check_finite_nonneg("CloudCost", name, getattr(self, name))
        if self.step_base_ms + self.step_ms_per_token <= 0:
            raise InvalidInput(
                "CloudCost.step_base_ms + CloudCost.step_ms_per_token must be > 0 "
                "(a target step cannot be free)"
            )

    def prefill_ms(self, visual_tokens: int, text_tokens: int) -> float:
        """Prefill time for a prompt of this many visual and text tokens."""
        return (
            self.prefill_base_ms
            + visual_tokens * self.prefill_ms_per_visual_token
            + text_tokens * self.prefill_ms_per_text_token
        )

    def batch_step_ms(self, sessions: float, tokens: float) -> float:
        """One batched forward over ``sessions`` sessions feeding ``tokens`` tokens in all."""
        return (
            self.step_base_ms
            + max(0.0, sessions - 1.0) * self.step_ms_per_session
            + tokens * self.step_ms_per_token
        )

    def step_ms(self, k_tokens: int) -> float:
        """One target step of a session feeding ``k_tokens`` (the last committed token plus
        drafts), sharing the forward with ``load_sessions - 1`` others that feed as many.
        With ``load_sessions`` <= 1 (0 from servers that predate it) it runs alone."""
        load = max(1.0, self.load_sessions)
        return self.batch_step_ms(load, load * k_tokens)


@dataclass(frozen=True)
class EdgeCost:
    """The edge's measured draft costs and link estimates; mirrors ``EdgeProfile``."""

    draft_prefill_ms: float
    draft_ms_per_token: float
    rtt_ms: float
    uplink_bytes_per_s: float
    acceptance_prior: float

    def __post_init__(self) -> None:
        check_range("EdgeCost", "draft_prefill_ms", self.draft_prefill_ms, MIN_MS, MAX_MS)
        check_range("EdgeCost", "draft_ms_per_token", self.draft_ms_per_token, MIN_MS, MAX_MS)
        check_range("EdgeCost", "rtt_ms", self.rtt_ms, 0.0, MAX_MS)
        check_range("EdgeCost", "uplink_bytes_per_s", self.uplink_bytes_per_s, 0.0, MAX_BYTES_PER_S)
        if 0.0 < self.uplink_bytes_per_s < MIN_BYTES_PER_S:
            # 5e-324 B/s makes every upload take forever (an OverflowError downstream).
            raise InvalidInput(
                f"EdgeCost.uplink_bytes_per_s must be 0 (unknown) or at least "
                f"{MIN_BYTES_PER_S:g} B/s, got {self.uplink_bytes_per_s!r}"
            )
        check_probability("EdgeCost", "acceptance_prior", self.acceptance_prior)


@dataclass(frozen=True)
class PlanInputs:
    """Everything :func:`~eventspec.shared.contract.timing_model.plan` reads; both nodes
    build it from the exchanged profiles.

    ``payload_mode`` says which payload the ``Open`` carries, hence which byte
    count delays the cloud's prefill. ``uplink_bytes_per_s == 0`` means unknown.
    """

    cloud: CloudCost
    edge: EdgeCost
    visual_tokens: int
    text_tokens: int
    alpha: float
    aligned_payload_bytes: int = 0
    frames_payload_bytes: int = 0
    payload_mode: PayloadMode = "frames"
    max_new_tokens: int = 256
    max_lookahead: int = 16
    max_hidden_drafts: int = 64
    min_speedup_margin: float = 0.02
    per_message_overhead_ms: float = 0.25
    max_message_overhead_fraction: float = 0.05

    def __post_init__(self) -> None:
        check_int("PlanInputs", "visual_tokens", self.visual_tokens, 0)
        check_int("PlanInputs", "text_tokens", self.text_tokens, 0)
        check_probability("PlanInputs", "alpha", self.alpha)
        check_int("PlanInputs", "aligned_payload_bytes", self.aligned_payload_bytes, 0)
        check_int("PlanInputs", "frames_payload_bytes", self.frames_payload_bytes, 0)
        if self.payload_mode not in ("frames", "aligned"):
            raise InvalidInput(
                f"PlanInputs.payload_mode must be 'frames' or 'aligned', got {self.payload_mode!r}"
            )
        check_int("PlanInputs", "max_new_tokens", self.max_new_tokens, 1)
        check_int("PlanInputs", "max_lookahead", self.max_lookahead, 0)
        check_int("PlanInputs", "max_hidden_drafts", self.max_hidden_drafts, 0)
        check_finite_nonneg("PlanInputs", "min_speedup_margin", self.min_speedup_margin)
        check_finite_nonneg("PlanInputs", "per_message_overhead_ms", self.per_message_overhead_ms)
        check_positive(
            "PlanInputs", "max_message_overhead_fraction", self.max_message_overhead_fraction
        )
        if self.cloud.prefill_ms(self.visual_tokens, self.text_tokens) <= 0:
            raise InvalidInput(
                "CloudCost.prefill_base_ms: predicted prefill is 0 ms for "
                f"{self.visual_tokens} visual + {self.text_tokens} text tokens; it must be > 0"
            )


@dataclass(frozen=True)
class TimingPlan:
    """The negotiated budget; mirrors the proto ``Plan``."""

    speculate: bool
    hidden_draft_budget: int
    lookahead_tokens: int
    chunk_cadence_tokens: int
    aligned_fits_uplink: bool
    acceptance_estimate: float
    predicted_prefill_ms: float
    predicted_step_ms: float
    predicted_speedup: float
    reason: str
    #: The answer's token cap as the cloud honours it (clamped to the context left after
    #: the prompt); 0 where the cloud has not said (the edge's own plans).
    max_new_tokens: int = 0

