"""A request's plan re-run while it decodes, as the cloud's load and the request's own
acceptance change. Pure; the request's stream calls it after each Commit.

Why: the plan was computed once, at Open, from the load of that moment (issue 36, cause 2).
When sixteen or sixty-four requests open together, the first plans for one session and
the last for all of them, so the early ones draft to the wrong depth for the whole
answer; and a request whose drafts keep being rejected, or a cloud so loaded that a
verify step costs more than it returns, keeps its edge drafting for nothing. The same
function both nodes run (``shared/contract/timing_model.py``) is re-run on the current
batch size, the request's observed acceptance and the tokens it has left, and a new
Plan goes to the edge when what the edge acts on changed: whether to draft, how far
ahead, how many tokens to a message. The edge adopts the latest Plan it hears
(``edge/ask/session.py: on_plan``).

When: every ``every_tokens`` committed tokens, or sooner when the load moved by
``load_change`` of what the last plan assumed; never in the last ``every_tokens``
tokens of the answer (a plan for a handful of tokens is mostly rounding) and never for
a target-only request.
"""

from __future__ import annotations

import dataclasses

from eventspec.shared.contract.estimators import AcceptanceEstimator
from eventspec.shared.contract.timing import PlanInputs, TimingPlan
from eventspec.shared.contract.timing_model import plan as run_plan

__all__ = ["EVERY_TOKENS", "LOAD_CHANGE", "MIN_TRIALS", "Replanner"]

#: Committed tokens between two re-plans at a steady load.
EVERY_TOKENS = 16
#: A relative change of the batch size that re-plans at once (0.25: 16 -> 20 or 12).
LOAD_CHANGE = 0.25
#: Acceptance trials (verified drafts) before the request's own acceptance replaces the
#: prior the plan started from.
MIN_TRIALS = 8


def _acts_on(p: TimingPlan) -> tuple[bool, int, int]:
    """What the edge does differently when it changes."""
    return p.speculate, p.lookahead_tokens, p.chunk_cadence_tokens


class Replanner:
    """One request's re-planning state: the inputs it opened with and the last plan sent."""

    def __init__(self, initial: TimingPlan, inputs: PlanInputs, *,
                 every_tokens: int = EVERY_TOKENS, load_change: float = LOAD_CHANGE) -> None:
        self.inputs = inputs
        self.last = initial
        self.every_tokens = every_tokens
        self.load_change = load_change
        self._load = max(1.0, inputs.cloud.load_sessions)
        self._at_tokens = 0
        #: Plans sent after the first.
        self.sent = 0
        self._stopped = False

    def stop(self) -> None:
        """No more re-plans for this request (its plan could not be re-run)."""
        self._stopped = True

    def after_commit(self, committed: int, live_sessions: int, accepted: int,
                     verified: int, rejections: int) -> TimingPlan | None:
        """A new plan to send after ``committed`` tokens, or None.

        ``live_sessions``: the sessions the cloud steps now (this one included);
        ``accepted`` / ``verified`` / ``rejections``: the request's drafts so far."""
        left = self.inputs.max_new_tokens - committed
        if self._stopped or left <= self.every_tokens:
            return None
        load = float(max(1, live_sessions))
        moved = abs(load - self._load) >= self.load_change * self._load
        if not moved and committed - self._at_tokens < self.every_tokens:
            return None
        self._at_tokens, self._load = committed, load
        alpha = self.inputs.alpha
        if verified >= MIN_TRIALS:
            observed = AcceptanceEstimator(prior=alpha)
            observed.observe(accepted, verified, rejections=rejections)
            alpha = observed.value
        # The prompt's prefill and upload stay in: both sides of the predicted speedup pay
        # them, which dilutes it a little, and a prompt of 0 tokens is not a valid input.
        inputs = dataclasses.replace(
            self.inputs, alpha=alpha, max_new_tokens=left, max_hidden_drafts=0,
            cloud=dataclasses.replace(self.inputs.cloud, load_sessions=load))
        fresh = dataclasses.replace(run_plan(inputs), hidden_draft_budget=0,
                                    max_new_tokens=self.last.max_new_tokens)
        if _acts_on(fresh) == _acts_on(self.last):
            return None
        self.last = fresh
        self.sent += 1
        return fresh
