"""What one engine step is made of: each session's verified drafts cut to the width
that pays (``--verify-width auto``), and the sessions' inputs as one flat batch.

Pure functions of the sessions' inputs, called once a step: the scheduler
(``eventspec.cloud.scheduling.step_scheduler``) trims the drafts as it plans the step, and the
engine
loop (``eventspec.cloud.scheduling.engine_loop``) builds the batch it runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from eventspec.cloud.speculation.decoding import Counters, StepInput
from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.contract.verify_width import SessionDrafts, verify_widths
from eventspec.shared.node.static.batch import StepBatch

#: How many drafts' worth of the server-wide acceptance a session's own rate starts from.
PRIOR_DRAFTS = 4.0


def trim_drafts(counters: Sequence[Counters], inputs: list[StepInput], cost: CloudCost,
                prior: float, pad: Callable[[int], int] | None = None) -> list[StepInput]:
    """Each session's verified drafts cut to the width that maximises the step's
    expected tokens per ms; a session's own acceptance so far (its ``counters``), shrunk
    towards the server-wide estimate ``prior`` (4 drafts' worth), is what its drafts are
    expected to do. ``pad``: the engine pads every session to the longest (the static
    engine's ``padded_tokens``); None prices rows as fed."""
    offers = []
    for c, inp in zip(counters, inputs, strict=True):
        alpha = (c.accepted + PRIOR_DRAFTS * prior) / (c.drafted + PRIOR_DRAFTS)
        offers.append(SessionDrafts(len(inp.drafts), min(1.0, max(0.0, alpha))))
    widths = verify_widths(cost, offers, pad)
    return [inp if k == len(inp.drafts) else dataclasses.replace(
                inp, tokens=inp.tokens[: k + 1], drafts=inp.drafts[:k])
            for inp, k in zip(inputs, widths, strict=True)]


def batch_of(inputs: Sequence[StepInput], device: torch.device) -> StepBatch:
    """The sessions' step inputs as one engine batch, tokens flattened session-major."""
    flat = [tok for inp in inputs for tok in inp.tokens]
    return StepBatch(
        slots=tuple(inp.slot for inp in inputs),
        start_positions=tuple(inp.start_position for inp in inputs),
        counts=tuple(len(inp.tokens) for inp in inputs),
        token_ids=torch.tensor(flat, dtype=torch.long, device=device),  # [N]
    )
