"""One request's timing plan, built identically on the edge and the cloud.

Both ends call :func:`request_plan` on the same facts: the cloud's ``ServerInfo`` (its
calibrated cost, geometry and limits), the edge's profile as sent in ``Open``, and what
the ``Open`` itself says (question, token cap, payload). Nothing else goes in, so the
two copies of the plan agree without an extra round trip (DESIGN, "Timing budget
negotiation"); the cloud's ``Plan`` message then confirms it.

The question's token count is the one fact the edge cannot know exactly (each model
owns its template), so both ends use the same byte-based estimate: text tokens barely
move a prefill of ~2k visual tokens, and agreement matters more than the last token.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from eventspec.shared.contract.checks import check_int
from eventspec.shared.contract.codec import WireDtype
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.timing import EdgeCost, PayloadMode, PlanInputs, TimingPlan
from eventspec.shared.contract.timing_model import plan
from eventspec.shared.contract.types import OpenRequest, ServerInfo

#: UTF-8 bytes per text token assumed by the shared estimate (LLaMA's tokenizer averages
#: about four bytes of English per token).
BYTES_PER_TEXT_TOKEN = 4


@dataclass(frozen=True)
class RequestFacts:
    """What both ends know about one request once ``Open`` is written."""

    question: str
    max_new_tokens: int
    speculative: bool
    payload_mode: PayloadMode
    payload_bytes: int  # JPEG bytes of all frames, or the aligned tensor's bytes

    def __post_init__(self) -> None:
        check_int("RequestFacts", "max_new_tokens", self.max_new_tokens, 1)
        check_int("RequestFacts", "payload_bytes", self.payload_bytes, 0)
        if self.payload_mode not in ("frames", "aligned"):
            raise InvalidInput(
                f"RequestFacts.payload_mode must be 'frames' or 'aligned', "
                f"got {self.payload_mode!r}"
            )


def facts_from_open(open_req: OpenRequest) -> RequestFacts:
    """The facts of a request as its ``Open`` states them (the same bytes on both ends)."""
    if open_req.aligned is not None:
        spec = open_req.aligned
        size = math.prod(spec.shape) * WireDtype.from_name(spec.dtype).itemsize
        mode: PayloadMode = "aligned"
    else:
        size = sum(len(f) for f in open_req.frames or ())
        mode = "frames"
    return RequestFacts(
        question=open_req.question,
        max_new_tokens=open_req.generation.max_new_tokens,
        speculative=open_req.speculative,
        payload_mode=mode,
        payload_bytes=size,
    )


def estimated_text_tokens(info: ServerInfo, question: str) -> int:
    """The prompt's text tokens as both ends estimate them (template + question)."""
    return info.prompt_overhead_tokens + math.ceil(
        len(question.encode("utf-8")) / BYTES_PER_TEXT_TOKEN
    )


def plan_inputs(info: ServerInfo, edge: EdgeCost, facts: RequestFacts) -> PlanInputs:
    """The :class:`PlanInputs` of one speculative request."""
    aligned = facts.payload_bytes if facts.payload_mode == "aligned" else 0
    frames = facts.payload_bytes if facts.payload_mode == "frames" else 0
    return PlanInputs(
        cloud=info.cloud_cost,
        edge=edge,
        visual_tokens=info.geometry.visual_tokens,
        text_tokens=estimated_text_tokens(info, facts.question),
        alpha=edge.acceptance_prior,
        aligned_payload_bytes=aligned,
        frames_payload_bytes=frames,
        payload_mode=facts.payload_mode,
        max_new_tokens=facts.max_new_tokens,
        max_lookahead=max(0, info.limits.max_verify_tokens - 1),
    )


def target_only_plan(info: ServerInfo, facts: RequestFacts, reason: str) -> TimingPlan:
    """The plan of a request that runs without drafts (no edge profile, or declined)."""
    cost = info.cloud_cost
    return TimingPlan(
        speculate=False,
        hidden_draft_budget=0,
        lookahead_tokens=0,
        chunk_cadence_tokens=1,
        aligned_fits_uplink=False,
        acceptance_estimate=0.0,
        predicted_prefill_ms=cost.prefill_ms(
            info.geometry.visual_tokens, estimated_text_tokens(info, facts.question)
        ),
        predicted_step_ms=cost.step_ms(1),
        predicted_speedup=1.0,
        reason=reason,
    )


def request_plan(
    info: ServerInfo, edge: EdgeCost | None, facts: RequestFacts
) -> tuple[TimingPlan, PlanInputs | None]:
    """The request's plan and the inputs it came from (None for target-only requests).

    The plan states ``facts.max_new_tokens``: on the cloud that is the value clamped to
    its context, so the edge learns the cap the answer will meet.
    """
    if not facts.speculative or edge is None:
        chosen = target_only_plan(info, facts, "target-only request: no drafts expected")
        return dataclasses.replace(chosen, max_new_tokens=facts.max_new_tokens), None
    inputs = plan_inputs(info, edge, facts)
    return dataclasses.replace(plan(inputs), max_new_tokens=facts.max_new_tokens), inputs
