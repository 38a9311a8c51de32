"""What the edge refuses in an Ask before any model work: the cloud's own limits, and
what draft_only cannot do. Tokenizing is the only work done here."""

from __future__ import annotations

from dataclasses import replace

from eventspec.edge.drafting.eventgpt import DraftModel
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.types import AskSpec, GenerationSettings, ServerLimits

#: The largest max_new_tokens a draft_only answer takes (then clamped to the draft's room).
DRAFT_ONLY_MAX_NEW_TOKENS = 4096


def check_ask(spec: AskSpec, limits: ServerLimits) -> None:
    """Refuse what the cloud would refuse, before any model work on the edge (a huge
    question would otherwise keep the single model worker busy for everyone)."""
    if not spec.question.strip():
        raise InvalidInput("AskRequest.question is empty")
    if len(spec.question) > limits.max_question_chars:
        raise InvalidInput(
            f"AskRequest.question: {len(spec.question)} characters exceed the cap of "
            f"{limits.max_question_chars}"
        )
    spec.generation.validated(limits.max_new_tokens, max_stop_strings=limits.max_stop_strings,
                              max_stop_chars=limits.max_stop_chars)


def draft_only_settings(spec: AskSpec, draft: DraftModel) -> GenerationSettings:
    """``spec.generation`` for a draft_only answer, or InvalidInput naming the field.

    The draft decodes greedily, so a temperature would be silently ignored: refused. The
    prompt (question and event tokens) must leave the draft model room for an answer;
    ``max_new_tokens`` is clamped to that room, as the cloud clamps it to a KV slot's.
    Tokenizing is cheap; it runs before any rendering or model work.
    """
    settings = spec.generation.validated(DRAFT_ONLY_MAX_NEW_TOKENS)
    if settings.temperature != 0:
        raise InvalidInput(
            f"generation.temperature {settings.temperature:g}: draft_only decodes greedily "
            "(the draft model's unverified argmax); send temperature 0, or use mode "
            "speculative or target_only to sample"
        )
    prompt = draft.prompt_positions(spec.question)
    room = draft.max_positions - prompt
    if room < 1:
        raise InvalidInput(
            f"AskRequest.question: its draft_only prompt takes {prompt} positions, and the "
            f"draft model has {draft.max_positions}, leaving none for the answer; shorten "
            "the question or use mode target_only"
        )
    return replace(settings, max_new_tokens=min(settings.max_new_tokens, room))
