"""What kind of step the engine loop ran: the label its time is recorded under.

Why: a decoding session's inter-token latency is made of the gaps between the loop's
steps, and a step that carries prompt work can take twice a plain one. Which work sets
the tail (a prompt's video tower, two prompts' pieces, a prompt's last piece with its
first-token sampling, a step outside the captured graphs, a failed mixed step) is a
question of which steps are slow, so every step is counted and timed under one kind
(``eventspec.cloud.scheduling.step_kind_stats``) and the metrics label it.

One kind a step, the first that holds, in this order (so the set stays small and every
step has exactly one):

``fallback``
    a mixed step failed, its pieces ran in a call of their own, and this plain step
    followed (its gap holds the failed call and the pieces' call);
``after_prefill``
    the iteration ran a prefill call of its own before the step (whole prompts, or
    pieces with ``--mixed-steps off``, or the first prompt while nothing decoded);
``eager``
    pieces rode the step, and the engine ran it at exact shapes, outside its fixed
    mixed-step shapes (more than 4 pieces, rows beyond the largest bucket, more than 9
    tokens a session, no captured graph): only where the engine can tell;
``tower``
    a riding piece starts a prompt whose video tower runs in the step's timed call
    (``Piece.tower``);
``multi``
    pieces of two or more prompts rode the step;
``finishing``
    one prompt's piece rode the step and ends it (its first token is sampled inside
    the step's engine time);
``piece``
    one prompt's piece rode the step, neither starting its tower nor ending it;
``plain``
    no prompt work: sessions only.

Pure: the plan and what the loop knows about the call, nothing read from the engine.
"""

from __future__ import annotations

import enum

from eventspec.cloud.scheduling.step_plan import StepPlan


class StepKind(enum.StrEnum):
    """The kinds, in the order of the rule (see the module docstring)."""

    FALLBACK = "fallback"
    AFTER_PREFILL = "after_prefill"
    EAGER = "eager"
    TOWER = "tower"
    MULTI = "multi"
    FINISHING = "finishing"
    PIECE = "piece"
    PLAIN = "plain"


def step_kind(plan: StepPlan, *, fixed_shape: bool | None = None, prefilled: bool = False,
              fell_back: bool = False) -> StepKind:
    """The kind of the step ``plan`` ran. ``fixed_shape``: the engine ran its riding
    pieces at a fixed mixed-step shape (False: eagerly at exact shapes; None: the engine
    cannot tell); ``prefilled``: a prefill call of its own ran earlier in the
    iteration; ``fell_back``: a mixed step failed and this plain step followed."""
    if fell_back:
        return StepKind.FALLBACK
    if prefilled:
        return StepKind.AFTER_PREFILL
    riding = plan.riding
    if not riding:
        return StepKind.PLAIN
    if fixed_shape is False:
        return StepKind.EAGER
    if any(p.tower for p in riding):
        return StepKind.TOWER
    if len({id(p.pending) for p in riding}) > 1:
        return StepKind.MULTI
    if any(p.finishes for p in riding):
        return StepKind.FINISHING
    return StepKind.PIECE
