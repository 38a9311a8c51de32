"""Templated questions about toy scenes, with answers a program can score.

Accuracy must be measured on what an answer says, not on its wording, so every answer
comes from a fixed template with one slot, and :func:`parse_answer` reads the slot
back. The question types split by what each camera can know: ``direction``,
``shape``, ``count`` and ``moving`` are visible in events; ``colour`` is not, which is
what makes drafts from the event model disagree with the RGB model where they should.

``shape`` and ``colour`` are asked only of one-object scenes, where "the object" is
unambiguous. Several paraphrases per type keep the models from keying on one string.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import numpy as np

from eventspec.shared.toyworld.scenes import COLOURS, DIRECTIONS, SHAPES, ToyScene

QType = Literal["direction", "shape", "colour", "count", "moving"]
QTYPES: tuple[QType, ...] = ("direction", "shape", "colour", "count", "moving")
#: Types whose answer is visible in events (the draft should get these right).
EVENT_VISIBLE: tuple[QType, ...] = ("direction", "shape", "count", "moving")

QUESTION_TEMPLATES: dict[QType, tuple[str, ...]] = {
    "direction": (
        "Which way is the object moving?",
        "In which direction does it move?",
        "What direction is the motion?",
        "Where is the object going?",
    ),
    "shape": (
        "What shape is the object?",
        "What shape is it?",
        "Which shape do you see?",
        "What is the shape of the object?",
    ),
    "colour": (
        "What colour is the object?",
        "What color is it?",
        "Which colour is the object?",
        "What is the color of the object?",
    ),
    "count": (
        "How many objects are there?",
        "How many objects can you see?",
        "What is the number of objects?",
        "Count the objects in the scene.",
    ),
    "moving": (
        "Is anything moving?",
        "Is the object moving?",
        "Is there any motion?",
        "Does anything move in the scene?",
    ),
}

#: Every structured value each type can take, in a fixed order.
VALUES: dict[QType, tuple[str, ...]] = {
    "direction": (*DIRECTIONS, "still"),
    "shape": SHAPES,
    "colour": COLOURS,
    "count": ("1", "2"),
    "moving": ("yes", "no"),
}

_COUNT_WORDS = {"1": "one", "2": "two"}
_WORD_RE = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class QA:
    """One question with its reference answer and the structured value it states."""

    qtype: QType
    question: str
    answer: str
    value: str


def answer_text(qtype: QType, value: str) -> str:
    """The fixed answer sentence stating ``value`` (one of ``VALUES[qtype]``)."""
    if value not in VALUES[qtype]:
        raise ValueError(f"{value!r} is not a {qtype} value; expected one of {VALUES[qtype]}")
    if qtype == "direction":
        return "It is not moving." if value == "still" else f"It is moving {value}."
    if qtype == "shape":
        return f"It is a {value}."
    if qtype == "colour":
        return f"It is {value}."
    if qtype == "count":
        return (
            "There is one object." if value == "1" else f"There are {_COUNT_WORDS[value]} objects."
        )
    return "Yes, it is moving." if value == "yes" else "No, nothing is moving."


def all_answers() -> list[str]:
    """Every answer sentence any scene can produce, in a fixed order."""
    return [answer_text(q, v) for q in QTYPES for v in VALUES[q]]


def applicable_types(scene: ToyScene) -> tuple[QType, ...]:
    """The question types that make sense for ``scene`` (no shape/colour with 2 objects)."""
    if scene.count == 1:
        return QTYPES
    return tuple(q for q in QTYPES if q not in ("shape", "colour"))


def truth(scene: ToyScene, qtype: QType) -> str:
    """The structured answer: "left"/"still", "circle", "red", "1"/"2", "yes"/"no".

    Raises ValueError for shape/colour of a two-object scene (no single right answer).
    """
    if qtype not in applicable_types(scene):
        raise ValueError(f"{qtype} is not asked of a {scene.count}-object scene")
    if qtype == "direction":
        return scene.motion
    if qtype == "shape":
        return scene.objects[0].shape
    if qtype == "colour":
        return scene.objects[0].colour
    if qtype == "count":
        return str(scene.count)
    return "no" if scene.motion == "still" else "yes"


def qa_pairs(scene: ToyScene, rng_or_seed: np.random.Generator | int) -> list[QA]:
    """One QA per applicable type, each with a paraphrase drawn from ``rng_or_seed``.

    Training passes a running Generator to see every paraphrase over the epochs;
    evaluation uses :func:`all_questions`, whose choice is fixed by the scene seed.
    """
    rng = (
        rng_or_seed
        if isinstance(rng_or_seed, np.random.Generator)
        else np.random.default_rng(rng_or_seed)
    )
    out = []
    for qtype in applicable_types(scene):
        templates = QUESTION_TEMPLATES[qtype]
        question = templates[int(rng.integers(len(templates)))]
        value = truth(scene, qtype)
        out.append(QA(qtype, question, answer_text(qtype, value), value))
    return out


def all_questions(scene: ToyScene) -> list[QA]:
    """:func:`qa_pairs` with the paraphrases fixed by the scene's seed (for evaluation)."""
    return qa_pairs(scene, np.random.default_rng([scene.seed, 0x0A]))


def parse_answer(qtype: QType, text: str) -> str | None:
    """The structured value an answer states, or None when it states none.

    Case and punctuation do not matter; the first value word wins. For ``direction``,
    "not moving", "still" and "static" mean ``"still"``; for ``moving``, "yes"/"no"
    or, failing those, a negated ("not", "nothing") or plain mention of moving.
    """
    words: list[str] = _WORD_RE.findall(text.lower())
    if qtype == "direction":
        for i, word in enumerate(words):
            if word in DIRECTIONS:
                return word
            if word in ("still", "static", "stationary", "motionless"):
                return "still"
            if word in ("not", "nothing") and any(_is_move(w) for w in words[i + 1 : i + 3]):
                return "still"
        return None
    if qtype == "shape":
        return next((w for w in words if w in SHAPES), None)
    if qtype == "colour":
        return next((w for w in words if w in COLOURS), None)
    if qtype == "count":
        for word in words:
            if word in ("1", "one", "single"):
                return "1"
            if word in ("2", "two"):
                return "2"
        return None
    for word in words:
        if word in ("yes", "no"):
            return word
    if any(w in ("not", "nothing", "still") for w in words):
        return "no"
    return "yes" if any(_is_move(w) for w in words) else None


def _is_move(word: str) -> bool:
    return word in ("moving", "move", "moves", "motion")
