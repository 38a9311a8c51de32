"""The commit log: what a token adapter or draft head learns from, bounded and opt-in.

Why: the adapter and the head (``eventspec.edge.learning.token_heads``) learn to predict the
token the cloud commits next from the drafter's hidden state there. Both are on the
edge at the end of a request: the drafter has computed its hidden state at each
committed position, and the cloud's commits are the labels. So the log holds, per
request, only those features ``[n, H]`` (float16) and committed token ids ``[n]``:
never raw events, frames or question text. Nothing is written unless a log directory
is given, and the writer stops (with one WARNING) when the next shard would pass its
byte bound.

Layout: ``meta.json`` (drafter id, text-vocabulary fingerprint, sizes) and shards
``commits-NNNNN.npz`` holding ``features`` [N, H], ``tokens`` [N] and ``offsets``
[R + 1] (request r is rows ``offsets[r]:offsets[r + 1]``). ``eventspec-edge
train-adapter --log DIR`` reads it.
"""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from eventspec.shared.contract.errors import InvalidInput, NotFound

log = logging.getLogger(__name__)

META_FILE = "meta.json"


@dataclass(frozen=True)
class LogMeta:
    """Which drafter's features these are; a head trained on them pairs with it only."""

    draft_model_id: str
    vocab_fingerprint: str
    feature_dim: int
    text_vocab_size: int
    #: Where the commits came from, e.g. "toy scenes 0-1199, toy target".
    source: str = "edge"


@dataclass(frozen=True)
class Request:
    """One request's rows: features [n, H] at committed positions, committed tokens [n].

    Row 0 is the position after the prompt (label: the answer's first token); row j
    follows the j-th committed token.
    """

    features: np.ndarray
    tokens: np.ndarray


class CommitLogWriter:
    """Appends requests to a log directory, in shards, up to ``max_bytes`` in all."""

    def __init__(self, root: Path, meta: LogMeta, *, max_bytes: int,
                 requests_per_shard: int = 256) -> None:
        if max_bytes < 1:
            raise InvalidInput(f"the commit log's bound must be >= 1 byte, got {max_bytes}")
        self.root, self.meta, self.max_bytes = root, meta, max_bytes
        self.requests_per_shard = requests_per_shard
        root.mkdir(parents=True, exist_ok=True)
        meta_path = root / META_FILE
        if meta_path.exists():
            old = LogMeta(**json.loads(meta_path.read_text()))
            if (old.vocab_fingerprint, old.feature_dim) != (meta.vocab_fingerprint,
                                                            meta.feature_dim):
                raise InvalidInput(f"{root} holds a log of another drafter "
                                   f"({old.draft_model_id!r})")
        else:
            meta_path.write_text(json.dumps(asdict(meta), indent=2))
        shards = sorted(root.glob("commits-*.npz"))
        self.written = sum(f.stat().st_size for f in shards)
        self._next = len(shards)
        self._pending: list[Request] = []
        self.full = False

    def add(self, features: np.ndarray, tokens: np.ndarray) -> bool:
        """Queue one request (features [n, H], tokens [n]); False once the log is full."""
        if self.full:
            return False
        if features.ndim != 2 or features.shape[1] != self.meta.feature_dim:
            raise InvalidInput(f"features must be [n, {self.meta.feature_dim}], got "
                               f"{features.shape}")
        if tokens.shape != (features.shape[0],):
            raise InvalidInput(f"tokens must be [{features.shape[0]}], got {tokens.shape}")
        self._pending.append(Request(features.astype(np.float16), tokens.astype(np.int32)))
        if len(self._pending) >= self.requests_per_shard:
            self.flush()
        return not self.full

    def flush(self) -> None:
        """Write the queued requests as one shard, unless that passes the bound."""
        if not self._pending:
            return
        feats = np.concatenate([r.features for r in self._pending])  # [N, H]
        toks = np.concatenate([r.tokens for r in self._pending])  # [N]
        offsets = np.cumsum([0, *(len(r.tokens) for r in self._pending)]).astype(np.int64)
        size = feats.nbytes + toks.nbytes + offsets.nbytes
        self._pending = []
        if self.written + size > self.max_bytes:
            self.full = True
            log.warning("commit log %s is full (%d of %d bytes): no more requests are logged",
                        self.root, self.written, self.max_bytes)
            return
        path = self.root / f"commits-{self._next:05d}.npz"
        np.savez(path, features=feats, tokens=toks, offsets=offsets)
        self.written += path.stat().st_size
        self._next += 1


def read_log(root: Path) -> tuple[LogMeta, list[Request]]:
    """Every request of a log directory, in the order written."""
    meta_path = root / META_FILE
    if not meta_path.is_file():
        raise NotFound(f"no commit log at {root} ({META_FILE} missing)")
    meta = LogMeta(**json.loads(meta_path.read_text()))
    requests: list[Request] = []
    for shard in sorted(root.glob("commits-*.npz")):
        with np.load(shard) as z:
            feats, toks, offsets = z["features"], z["tokens"], z["offsets"]
        for a, b in itertools.pairwise(offsets.tolist()):
            requests.append(Request(feats[a:b], toks[a:b]))
    if not requests:
        raise NotFound(f"the commit log at {root} holds no requests")
    return meta, requests
