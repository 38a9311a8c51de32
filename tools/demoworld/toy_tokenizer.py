"""The toy pair's shared tokenizer, trained on the text both toy models read and write.

The real pair shares Vicuna's vocabulary; the toy pair shares one trained here, in
the same LLaMA id layout, so a draft token id means the same text on both nodes. The
corpus is the prompts' fixed text (the Vicuna system line, the role tags, EventGPT's
event markers), every question paraphrase and every answer, then the prompt segments
of a fixed set of training scenes so piece frequencies follow what the models see.

The prompts are the product's own templates (``eventspec.cloud.target`` and
``eventspec.edge.drafting.eventgpt`` own one definition each). Prompt segments are split where a
model's
placeholder goes (``{video}`` for the target, ``<event>`` for the draft): the tokenizer never sees
the placeholder itself, and each segment is normalised on its own, exactly as the models
tokenize prompts.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from eventspec.cloud.target import PROMPT_TEMPLATE as TARGET_PROMPT
from eventspec.demoworld.tokenizer import (
    Role,
    fast_tokenizer,
    role_specials,
    train_llama_layout_tokenizer,
    write_tokenizer_files,
)
from eventspec.edge.drafting.eventgpt import EVENT_PLACEHOLDER, SYSTEM_PROMPT
from eventspec.edge.drafting.eventgpt import PROMPT_TEMPLATE as DRAFT_PROMPT
from eventspec.shared.toyworld.qa import QUESTION_TEMPLATES, all_answers, all_questions
from eventspec.shared.toyworld.scenes import SPLITS, sample_scene

FIXED_TEXT = ("USER:", "ASSISTANT:", SYSTEM_PROMPT, "<ev_start>", "<ev_end>")
#: Words a person may use when asking about a toy scene in their own words (the demo's
#: free-form questions). Seen once each, they get pieces only after the template
#: words, which are far more frequent.
EXTRA_WORDS = (
    "what is happening moving thing things see do you can there any where how fast slow "
    "describe tell me about this that these those scene video event events camera frame "
    "frames picture image shape shapes colour color colours colors object objects "
    "ball box round left right up down top bottom side still stop stopped static "
    "towards away from going goes move moves motion direction speed one two three "
    "many much number count visible appear appears kind type big small large size"
)

#: 3 specials + 256 byte pieces + 381 learned pieces: every word of every template and
#: answer is one piece (the corpus fully merged would give 733).
TOY_TEXT_VOCAB_SIZE = 640
#: Training scenes whose prompts weight the corpus (a prefix of the train split).
TOKENIZER_SEEDS = range(SPLITS["train"].start, SPLITS["train"].start + 2000)


def corpus_lines(seeds: Iterable[int]) -> Iterator[str]:
    """The fixed text, then each scene's prompt segments with answers, in a fixed order."""
    yield from FIXED_TEXT
    for templates in QUESTION_TEMPLATES.values():
        yield from templates
    yield from all_answers()
    yield from EXTRA_WORDS.split()
    for seed in seeds:
        for qa in all_questions(sample_scene(seed)):
            completed = f"{qa.question} ASSISTANT: {qa.answer}"
            for template, slot in ((TARGET_PROMPT, "{video}"), (DRAFT_PROMPT, EVENT_PLACEHOLDER)):
                before, after = template.split(slot)
                yield before
                yield after.replace("{question} ASSISTANT:", completed)


def build_toy_tokenizer(role: Role) -> Tokenizer:
    """The toy pair's shared tokenizer with ``role``'s specials after the text vocabulary.

    Deterministic: a fixed corpus (:data:`TOKENIZER_SEEDS`) and fixed trainer settings.
    Training takes a second or two, so the text vocabulary is trained once per process
    and shared by both roles; each call returns a fresh Tokenizer that callers may
    configure (padding, truncation) freely.
    """
    tok = Tokenizer.from_str(_text_tokenizer_json())
    tok.add_special_tokens(
        [AddedToken(s, special=True, normalized=False) for s in role_specials(role)]
    )
    return tok


@functools.lru_cache(maxsize=1)
def _text_tokenizer_json() -> str:
    """The trained text vocabulary with no model's specials, serialised."""
    tok = train_llama_layout_tokenizer(
        corpus_lines(TOKENIZER_SEEDS),
        TOY_TEXT_VOCAB_SIZE,
        (),
        pre_tokenizer=_words_and_punctuation(),
        name="toy tokenizer",
    )
    text: str = tok.to_str()
    return text


def _words_and_punctuation() -> pre_tokenizers.PreTokenizer:
    """Split into ``▁word`` units with punctuation and newlines as their own pieces.

    Pieces then never span two words or glue a word to its full stop, as with
    Vicuna's sentencepiece vocabulary ("▁left", "."), so the learned vocabulary is
    spent on words, and each answer is a handful of tokens a draft can get right one
    by one. ``<``, ``>`` and ``_`` stay inside words so "<ev_start>" can be one piece.
    """
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split("▁", behavior="merged_with_next"),
            pre_tokenizers.Split(Regex(r"[.,?!:;'\"\n()-]"), behavior="isolated"),
        ]
    )


def save_toy_tokenizer(directory: str | Path, role: Role) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` loadable by transformers."""
    return write_tokenizer_files(build_toy_tokenizer(role), directory, role)


def toy_fast_tokenizer(role: Role) -> PreTrainedTokenizerFast:
    """The toy tokenizer of ``role`` wrapped for transformers."""
    return fast_tokenizer(build_toy_tokenizer(role), role)
