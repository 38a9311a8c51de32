"""The tiny tokenizer of the ``tiny-random`` test models: 512 text ids, frozen.

A fixed corpus of common words and word pairs, trained once into the shared LLaMA id
layout (:mod:`eventspec.demoworld.tokenizer`). Its bytes are pinned by a test: the
tiny-random models' behaviour, which many tests rely on, depends on them.
"""

from __future__ import annotations

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from eventspec.demoworld.tokenizer import (
    Role,
    fast_tokenizer,
    role_specials,
    train_llama_layout_tokenizer,
)

TINY_TEXT_VOCAB_SIZE = 512

#: The corpus vocabulary, in the order the pinned tokenizer was trained on.
_WORDS_TEXT = """
a an the is are was what where which who how many much why when there this that it
its of in on at to from by with and or not no yes USER ASSISTANT A chat between
curious human artificial intelligence assistant gives helpful detailed polite
answers questions object objects shape shapes circle square triangle colour color
red green blue yellow black white gray moving move moves still static left right up
down toward away fast slow speed motion direction scene camera event events frame
frames video image see seen one two three four five count number large small big
tiny background foreground edge edges car person people road street light dark
bright night day rain sky tree building describe happening happens going goes
visible appear appears answer question I you we they he she them his her our your my
me can could would should do does did be been has have had will shall may might must
very also only just more most some any all each both
"""
_CORPUS_WORDS = _WORDS_TEXT.split()


def _corpus() -> list[str]:
    """A fixed corpus: every word alone, then word pairs in a fixed order."""
    lines = list(_CORPUS_WORDS)
    for i, word in enumerate(_CORPUS_WORDS):
        nxt = _CORPUS_WORDS[(i * 7 + 3) % len(_CORPUS_WORDS)]
        lines.append(f"{word} {nxt}. {word.capitalize()}? {nxt}, {i} {i * 13 % 97}!")
    return lines


def build_tiny_tokenizer(role: Role) -> Tokenizer:
    """Build the shared tiny tokenizer with ``role``'s special tokens appended.

    Deterministic: the same corpus and trainer settings give the same vocabulary.
    """
    return train_llama_layout_tokenizer(
        _corpus(), TINY_TEXT_VOCAB_SIZE, role_specials(role), name="tiny tokenizer"
    )


def tiny_fast_tokenizer(role: Role) -> PreTrainedTokenizerFast:
    """The tiny tokenizer of ``role`` wrapped for transformers."""
    return fast_tokenizer(build_tiny_tokenizer(role), role)
