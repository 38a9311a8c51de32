"""A small tokenizer in the LLaMA id layout, built offline and deterministically.

The real pair (EventGPT and Video-LLaVA) share Vicuna's 32000-token sentencepiece
vocabulary, which no package registry ships. Tests and the ``tiny-random`` models
need a stand-in that keeps the properties the system relies on:

- the LLaMA layout: ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, then byte-fallback pieces;
- one shared text vocabulary of ``TINY_TEXT_VOCAB_SIZE`` ids for both models;
- each model's special tokens right after the text vocabulary: ``<image>``,
  ``<video>``, ``<pad>`` for the target and ``<ev_patch>`` for the draft, so
  ``<image>`` and ``<ev_patch>`` share the first id past the text vocabulary,
  exactly like 32000 in the real pair.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)
from tokenizers.trainers import BpeTrainer

Role = Literal["target", "draft"]

TINY_TEXT_VOCAB_SIZE = 512
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
_BYTE_PIECES = [f"<0x{i:02X}>" for i in range(256)]
_BASE_SPECIALS = ["<unk>", "<s>", "</s>"]
TARGET_SPECIALS = ("<image>", "<video>", "<pad>")
DRAFT_SPECIALS = ("<ev_patch>",)

_CORPUS_WORDS = [
    "a",
    "an",
    "the",
    "is",
    "are",
    "was",
    "what",
    "where",
    "which",
    "who",
    "how",
    "many",
    "much",
    "why",
    "when",
    "there",
    "this",
    "that",
    "it",
    "its",
    "of",
    "in",
    "on",
    "at",
    "to",
    "from",
    "by",
    "with",
    "and",
    "or",
    "not",
    "no",
    "yes",
    "USER",
    "ASSISTANT",
    "A",
    "chat",
    "between",
    "curious",
    "human",
    "artificial",
    "intelligence",
    "assistant",
    "gives",
    "helpful",
    "detailed",
    "polite",
    "answers",
    "questions",
    "object",
    "objects",
    "shape",
    "shapes",
    "circle",
    "square",
    "triangle",
    "colour",
    "color",
    "red",
    "green",
    "blue",
    "yellow",
    "black",
    "white",
    "gray",
    "moving",
    "move",
    "moves",
    "still",
    "static",
    "left",
    "right",
    "up",
    "down",
    "toward",
    "away",
    "fast",
    "slow",
    "speed",
    "motion",
    "direction",
    "scene",
    "camera",
    "event",
    "events",
    "frame",
    "frames",
    "video",
    "image",
    "see",
    "seen",
    "one",
    "two",
    "three",
    "four",
    "five",
    "count",
    "number",
    "large",
    "small",
    "big",
    "tiny",
    "background",
    "foreground",
    "edge",
    "edges",
    "car",
    "person",
    "people",
    "road",
    "street",
    "light",
    "dark",
    "bright",
    "night",
    "day",
    "rain",
    "sky",
    "tree",
    "building",
    "describe",
    "happening",
    "happens",
    "going",
    "goes",
    "visible",
    "appear",
    "appears",
    "answer",
    "question",
    "I",
    "you",
    "we",
    "they",
    "he",
    "she",
    "them",
    "his",
    "her",
    "our",
    "your",
    "my",
    "me",
    "can",
    "could",
    "would",
    "should",
    "do",
    "does",
    "did",
    "be",
    "been",
    "has",
    "have",
    "had",
    "will",
    "shall",
    "may",
    "might",
    "must",
    "very",
    "also",
    "only",
    "just",
    "more",
    "most",
    "some",
    "any",
    "all",
    "each",
    "both",
]


def _corpus() -> list[str]:
    """A fixed corpus: every word alone, then word pairs in a fixed order."""
    lines = list(_CORPUS_WORDS)
    for i, word in enumerate(_CORPUS_WORDS):
        nxt = _CORPUS_WORDS[(i * 7 + 3) % len(_CORPUS_WORDS)]
        lines.append(f"{word} {nxt}. {word.capitalize()}? {nxt}, {i} {i * 13 % 97}!")
    return lines


def _base_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return tok


#: Printable ASCII plus the word marker: every such character is one piece, so only
#: other characters fall back to byte pieces.
DEFAULT_ALPHABET: tuple[str, ...] = (*(chr(c) for c in range(32, 127)), "▁")


def train_llama_layout_tokenizer(
    corpus: Iterable[str],
    text_vocab_size: int,
    specials: Sequence[str],
    *,
    initial_alphabet: Sequence[str] = DEFAULT_ALPHABET,
    pre_tokenizer: pre_tokenizers.PreTokenizer | None = None,
    name: str = "tokenizer",
) -> Tokenizer:
    """Train a byte-fallback BPE on ``corpus`` and lay it out like LLaMA's tokenizer.

    Ids: ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, the 256 byte pieces 3..258, then the
    learned pieces up to ``text_vocab_size``; ``specials`` (a model's own tokens)
    follow the text vocabulary. Every model in the project shares this layout, so one
    trainer keeps the tiny and the toy tokenizers from drifting apart.

    Without a ``pre_tokenizer`` each input line is one "word", so pieces may span
    words (the tiny tokenizer, frozen as it is). With one, training and encoding both
    split the same way, e.g. into words and punctuation as sentencepiece's pieces fall.
    Deterministic: the same corpus and settings give the same vocabulary. Raises
    RuntimeError when the corpus is too small to fill ``text_vocab_size``.
    """
    trained = _base_tokenizer()
    if pre_tokenizer is not None:
        trained.pre_tokenizer = pre_tokenizer
    trainer = BpeTrainer(
        vocab_size=text_vocab_size - len(_BYTE_PIECES),
        special_tokens=_BASE_SPECIALS,
        initial_alphabet=list(initial_alphabet),
        show_progress=False,
        min_frequency=1,
    )
    trained.train_from_iterator(corpus, trainer=trainer)
    state = json.loads(trained.to_str())["model"]
    # Insert the 256 byte-fallback pieces at ids 3..258, as LLaMA does, and shift the rest.
    vocab: dict[str, int] = {}
    for piece, idx in sorted(state["vocab"].items(), key=lambda kv: kv[1]):
        vocab[piece] = idx if idx < len(_BASE_SPECIALS) else idx + len(_BYTE_PIECES)
    for i, piece in enumerate(_BYTE_PIECES):
        vocab[piece] = len(_BASE_SPECIALS) + i
    if len(vocab) != text_vocab_size:
        raise RuntimeError(
            f"{name} trained to {len(vocab)} ids, expected {text_vocab_size}; extend the corpus"
        )
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
    tok = _base_tokenizer()
    if pre_tokenizer is not None:
        tok.pre_tokenizer = pre_tokenizer
    tok.model = models.BPE(
        vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True
    )
    tok.add_special_tokens([AddedToken(s, special=True) for s in _BASE_SPECIALS])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)]
    )
    return tok


def role_specials(role: Role) -> tuple[str, ...]:
    """The special tokens a model of ``role`` appends after the shared text vocabulary."""
    return TARGET_SPECIALS if role == "target" else DRAFT_SPECIALS


def build_tiny_tokenizer(role: Role) -> Tokenizer:
    """Build the shared tiny tokenizer with ``role``'s special tokens appended.

    Deterministic: the same corpus and trainer settings give the same vocabulary.
    """
    return train_llama_layout_tokenizer(
        _corpus(), TINY_TEXT_VOCAB_SIZE, role_specials(role), name="tiny tokenizer"
    )


def write_tokenizer_files(tok: Tokenizer, directory: str | Path, role: Role) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` loadable by transformers."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>" if role == "target" else "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return out


def save_tiny_tokenizer(directory: str | Path, role: Role) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` loadable by transformers."""
    return write_tokenizer_files(build_tiny_tokenizer(role), directory, role)


def text_vocab_fingerprint(pieces: Sequence[str]) -> str:
    """sha256 over the text vocabulary's pieces in id order.

    Both nodes compute it over ids ``0 .. text_vocab_size-1``; equal fingerprints mean
    a draft id means the same text on both sides.
    """
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()
