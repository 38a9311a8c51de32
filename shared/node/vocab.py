"""The text-vocabulary fingerprint both nodes advertise, so a draft id means one text.

Each node computes it over its tokenizer's pieces for ids ``0 .. text_vocab_size-1``;
the edge compares the cloud's with its own before drafting. Pure (hashlib), so either
node and any client can compute it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def text_vocab_fingerprint(pieces: Sequence[str]) -> str:
    """sha256 over the text vocabulary's pieces in id order, each NUL-terminated."""
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()
