"""The LLaMA id layout every demo-world tokenizer shares, and how one is trained and saved.

The real pair (EventGPT and Video-LLaVA) share Vicuna's 32000-token sentencepiece
vocabulary, which no package registry ships. The demo world's two tokenizer families
(``tiny`` for the random test models, ``toy`` for the trained demo pair) are stand-ins
that keep the properties the system relies on:

- the LLaMA layout: ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, then byte-fallback pieces;
- one shared text vocabulary for both models of a pair;
- each model's special tokens right after the text vocabulary: ``<image>``,
  ``<video>``, ``<pad>`` for the target and ``<ev_patch>`` for the draft, so
  ``<image>`` and ``<ev_patch>`` share the first id past the text vocabulary,
  exactly like 32000 in the real pair.

One trainer and one writer serve both families, so they cannot drift apart.
"""

from __future__ import annotations

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
from transformers import PreTrainedTokenizerFast

Role = Literal["target", "draft"]

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
_BYTE_PIECES = [f"<0x{i:02X}>" for i in range(256)]
_BASE_SPECIALS = ["<unk>", "<s>", "</s>"]
TARGET_SPECIALS = ("<image>", "<video>", "<pad>")
DRAFT_SPECIALS = ("<ev_patch>",)

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


def fast_tokenizer(tok: Tokenizer, role: Role) -> PreTrainedTokenizerFast:
    """``tok`` wrapped for transformers with ``role``'s special-token names.

    The target pads with its own ``<pad>``; the draft has none and pads with ``<unk>``
    (it never pads a real prompt), exactly as :func:`write_tokenizer_files` records.
    """
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>" if role == "target" else "<unk>",
        clean_up_tokenization_spaces=False,
    )
