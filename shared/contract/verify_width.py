"""How many of each session's drafts one batched target step verifies.

Why a rule: verifying a draft costs every session in the batch the time it adds to the
step, and pays only if it is accepted. Verifying a session's whole tail is right for a
lone session on a bandwidth-bound GPU (extra rows are nearly free) and wrong for a full
batch, where each extra row slows 63 other sessions; a measured 16-deep tail rose from
1.76x to 2.22x at one client once the cloud verified at most 4 drafts per step.

The rule maximises the step's expected committed tokens per ms under the cloud's
calibrated linear cost model (:class:`~eventspec.shared.contract.timing.CloudCost`):

    R(k_1..k_B) = sum_i E_i(k_i) / (base + (B - 1) * per_session + per_token * sum_i (k_i + 1))

with ``E_i(k) = sum_{j=0..k} a_i^j`` (Leviathan et al. 2023, with i.i.d. acceptance
``a_i``, the session's measured rate). The j-th draft of session i adds ``a_i^j`` to the
numerator and ``per_token`` to the denominator; every draft costs the same, so the best
choice is the m drafts with the largest gains, for the m that maximises R (R over m is
evaluated exactly; ties go to the fewer drafts). A session's gains fall with j, so the
top m are always a prefix of each session's tail: the verified drafts stay contiguous.

A session that offered drafts always verifies at least one: its acceptance is measured
only on verified drafts, and a session held at 0 would never show that its drafts
improved. The rule only trims what is verified; the verdicts stay exactly the target's
(unverified drafts are simply not used this step), so the answer does not change.

Padded engines. The static engine runs a step as ``sessions x q`` rows, every session
padded to the longest one's tokens (rounded up to a captured graph's bucket): one
session verifying 8 drafts makes all 16 pay for 9 rows. For such an engine (``pad``
maps the longest session's tokens to the rows each session pays) the cost of a step is
``base + (B - 1) * per_session + per_token * B * pad(q)``, so the rule chooses ``q``
instead: every session verifies ``min(available, q - 1)`` drafts (the padding is paid
anyway), and ``q`` is the one that maximises expected tokens per ms (issue 36: trees
offered longer paths, the longest set every step's shape, and tree steps took 35 ms
against chains' 26 at 16 sessions on an H100).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.timing import CloudCost


@dataclass(frozen=True)
class SessionDrafts:
    """One session's candidates for the next step: how many valid drafts it offers and
    the acceptance rate to expect of them."""

    available: int
    alpha: float

    def __post_init__(self) -> None:
        if self.available < 0:
            raise InvalidInput(f"SessionDrafts.available must be >= 0, got {self.available}")
        if not 0.0 <= self.alpha <= 1.0:
            raise InvalidInput(f"SessionDrafts.alpha must be in [0, 1], got {self.alpha!r}")


def verify_widths(cost: CloudCost, sessions: Sequence[SessionDrafts],
                  pad: Callable[[int], int] | None = None) -> list[int]:
    """Drafts to verify per session this step (each ``<= available``; ``>= 1`` where any
    are available), maximising expected committed tokens per ms (module docstring).
    ``pad``: for an engine that pads every session to the longest, the rows each session
    pays when the longest feeds ``q`` tokens (None: rows cost what they feed)."""
    if pad is not None:
        return padded_widths(cost, sessions, pad)
    widths = [1 if s.available > 0 else 0 for s in sessions]
    if not sessions:
        return widths
    gains: list[tuple[float, int]] = []  # (gain of the j-th draft, session index), j >= 2
    for i, s in enumerate(sessions):
        g = s.alpha
        for _ in range(1, s.available):
            g *= s.alpha
            gains.append((g, i))
    gains.sort(key=lambda gi: -gi[0])  # stable: earlier sessions win ties
    tokens = float(sum(w + 1 for w in widths))
    expected = sum(1.0 + (s.alpha if w else 0.0) for s, w in zip(sessions, widths, strict=True))
    fixed = cost.batch_step_ms(float(len(sessions)), 0.0)
    best_rate = expected / (fixed + tokens * cost.step_ms_per_token)
    best_m = 0
    for m, (g, _) in enumerate(gains, start=1):
        expected += g
        tokens += 1.0
        rate = expected / (fixed + tokens * cost.step_ms_per_token)
        if rate > best_rate:
            best_rate, best_m = rate, m
    for _, i in gains[:best_m]:
        widths[i] += 1
    return widths


def padded_widths(cost: CloudCost, sessions: Sequence[SessionDrafts],
                  pad: Callable[[int], int]) -> list[int]:
    """The widths for a padded engine: one token count ``q`` per step for everyone
    (each session verifies ``min(available, q - 1)``, at least one where it has any), the
    ``q`` whose expected tokens per ms is highest; ties go to the smaller ``q``."""
    if not sessions:
        return []
    longest = max(s.available for s in sessions)
    b = float(len(sessions))
    fixed = cost.batch_step_ms(b, 0.0)
    best: tuple[float, list[int]] | None = None
    q = 2 if longest > 0 else 1
    while q <= longest + 1:
        rows = max(q, pad(q))  # the padding is paid: fill it
        widths = [min(s.available, rows - 1) for s in sessions]
        expected = sum(sum(s.alpha ** j for j in range(w + 1))
                       for s, w in zip(sessions, widths, strict=True))
        rate = expected / (fixed + b * rows * cost.step_ms_per_token)
        if best is None or rate > best[0]:
            best = (rate, widths)
        q = rows + 1  # the next bucket
    assert best is not None
    return best[1]
