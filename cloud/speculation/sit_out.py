"""Which dry sessions sit a step out (``--sit-out``): SpecEdge's policy, for a loaded batch.

After a rejection the correction has to reach the edge and new drafts come back a round
trip and a draft forward later, after the next step has started; that step then feeds
the session's last token alone and commits one token for it. SpecEdge (Park et al.
2025, "SpecEdge: Scalable Edge-Assisted Serving Framework for Interactive LLMs")
lets such a session wait one step instead, so that a full batch does not spend rows on
it and the session's next step verifies the drafts that arrived meanwhile. Alone,
stepping is better (the session loses the step); in a full batch the rows it frees
pay (the virtual clock of ``benchmarks/pipeline_sim.py --sit-out``: chains at RTT 20 ms
verify 1.76 -> 2.31 tokens a step).

Rules, each for a reason:
- only sessions that speculate and whose previous step had drafts (its edge is drafting,
  so drafts are on their way); a session whose edge stopped drafting steps every time;
- at most one step out in a row, so no session waits more than one step for drafts
  that may never come;
- only when at least ``min_sessions`` sessions run (below that the rows freed are worth
  less than the step the session loses), and never every session at once (a step of
  nobody would wait for nothing).

Sitting out changes when a session steps, never what it commits: every verdict is the
sampler's over the target's logits, so answers stay target-only's.

Measured on an H200 at 16 edges (docs/results/e2e-gpu.md), sitting out raised what a
step verifies (chains 1.39 -> 1.50 tokens a step, trees 1.65 -> 1.84) and lowered
goodput (1.083x -> 1.062x, 1.057x -> 1.019x): the static engine runs a step in the CUDA
graph of the next session bucket (1, 2, 4, 8, 16, ...), so 13 sessions cost what 16 do
and the rows freed are not freed. Hence ``off`` by default; a policy that sits sessions
out only when that drops the step into a smaller bucket is the next thing to measure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from eventspec.shared.contract.errors import InvalidInput

#: ``--sit-out auto``: from this many running sessions.
AUTO_MIN_SESSIONS: Final[int] = 8


class DryState(NamedTuple):
    """What the policy reads of one running session when a step is planned."""

    dry: bool  # no valid drafts extend its committed text now
    speculative: bool
    sat_out_last: bool  # it sat the previous step out
    drafted_last: bool  # its last step had drafts


@dataclass(frozen=True)
class SitOut:
    """``--sit-out``: ``off``, ``auto`` (from :data:`AUTO_MIN_SESSIONS` running sessions)
    or a number of running sessions N >= 2."""

    min_sessions: int  # 0: never

    @classmethod
    def parse(cls, value: str) -> SitOut:
        if value == "off":
            return cls(0)
        if value == "auto":
            return cls(AUTO_MIN_SESSIONS)
        try:
            n = int(value)
        except ValueError:
            n = -1
        if n < 2:
            raise InvalidInput(f"--sit-out must be off, auto or a number of sessions >= 2, "
                               f"got {value!r}")
        return cls(n)

    @property
    def enabled(self) -> bool:
        return self.min_sessions > 0

    def applies(self, running: int) -> bool:
        """Whether a step of ``running`` sessions looks at who is dry at all."""
        return self.enabled and running >= self.min_sessions

    def choose(self, states: Sequence[DryState]) -> list[bool]:
        """For each running session, whether it sits this step out."""
        if not self.applies(len(states)):
            return [False] * len(states)
        sit = [s.dry and s.speculative and s.drafted_last and not s.sat_out_last
               for s in states]
        return [False] * len(states) if all(sit) else sit
