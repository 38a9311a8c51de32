"""``--commit-log DIR``: after each speculative request, log what a draft head learns from.

Why after, and by re-feeding: the drafter's cache during a request holds whatever
context it last drafted from (often a wrong tail), while the rows a head trains on are
the drafter's hidden states along the *committed* answer (``eventspec.edge.learning.commit_log``).
One extra prefill and one forward over the committed tokens, on the model thread after
the request's answer has gone out, give exactly those rows for any drafting backend.
Only token ids and hidden states are written, never events, frames or the question.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from eventspec.edge.drafting.eventgpt import DraftModel
from eventspec.edge.learning.commit_log import CommitLogWriter, LogMeta

log = logging.getLogger(__name__)


class CommitRecorder:
    """Writes one request's committed positions to a bounded commit log."""

    def __init__(self, draft: DraftModel, root: Path, max_mb: int) -> None:
        meta = LogMeta(draft_model_id=draft.model_id, vocab_fingerprint=draft.vocab_fingerprint,
                       feature_dim=int(draft.model.config.hidden_size),
                       text_vocab_size=draft.text_vocab_size, source="edge --commit-log")
        self.draft = draft
        self.writer = CommitLogWriter(root, meta, max_bytes=max_mb << 20,
                                      requests_per_shard=16)
        log.info("logging committed positions to %s (up to %d MiB; token ids and hidden "
                 "states only)", root, max_mb)

    def record(self, question: str, pixels: torch.Tensor | None,
               clip_features: torch.Tensor | None, tokens: Sequence[int]) -> None:
        """Re-feed the committed ``tokens`` and queue their rows. Model thread only."""
        if not tokens or self.writer.full:
            return
        state, first, _ = self.draft.prefill_features(
            question, pixels, clip_features=clip_features)  # [H]
        rows = [first[None]]  # [1, H]
        if len(tokens) > 1:
            rows.append(self.draft.step_features(state, list(tokens[:-1]))[0])  # [n - 1, H]
        self.writer.add(torch.cat(rows).cpu().numpy(), np.asarray(tokens))

    def close(self) -> None:
        """Write what is queued (a partial shard)."""
        self.writer.flush()
