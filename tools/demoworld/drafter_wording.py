"""The misaligned toy drafter's own wording: other phrasings, event-only emphasis.

Why: the aligned toy pair was trained on the same answer sentences, so its drafts are
accepted about 93% of the time, while EventGPT's tokens match Video-LLaVA's only
1.24-1.58% of the time (issue 22): the two real models were tuned on different text
and see different modalities. This wording gives the toy drafter the same kind of
gap. It states the same structured values as :func:`eventspec.shared.toyworld.qa.answer_text`
(so :func:`~eventspec.shared.toyworld.qa.parse_answer` still scores it), in sentences that
share little with the target's beyond "Yes"/"No", the value words and a full stop, and
it never claims a colour: events carry none. Every answer ends with a second sentence
naming its source (:data:`SOURCE_NOTE`), so the drafter does not end where the target
does either (with one sentence, "." then end-of-answer matched the target's every time).
"""

from __future__ import annotations

from eventspec.shared.toyworld.qa import VALUES, QType

_COUNT_WORDS = {"1": "one thing", "2": "two things"}
SOURCE_NOTE = "Event camera only."


def drafter_answer(qtype: QType, value: str) -> str:
    """The misaligned drafter's answer for ``value`` (one of ``VALUES[qtype]``)."""
    if value not in VALUES[qtype]:
        raise ValueError(f"{value!r} is not a {qtype} value; expected one of {VALUES[qtype]}")
    return f"{_core(qtype, value)} {SOURCE_NOTE}"


def _core(qtype: QType, value: str) -> str:
    if qtype == "direction":
        return "The events are static." if value == "still" else f"Motion goes {value}."
    if qtype == "shape":
        return f"I see a {value} shape."
    if qtype == "colour":
        return "Events show no colour."
    if qtype == "count":
        return f"I see {_COUNT_WORDS[value]}."
    return "Yes, there is motion." if value == "yes" else "No, there is no motion."
