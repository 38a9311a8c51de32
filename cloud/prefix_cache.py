"""Prompt prefixes kept for reuse: a clip asked about again skips its video prefill.

Why: the edge's window is the same clip while the camera watches one scene, and users
ask several questions about it; each question paid the whole video prefill again (a
2,103-token Video-LLaVA prompt: the tower, the projector and 2k positions of the
decoder). vLLM's automatic prefix caching and SGLang's RadixAttention make a repeated
prefix free; this is the same idea at the granularity that matters here, one entry per
(visual input, prompt prefix).

The key is a content hash: BLAKE2b over the prompt's token ids up to the end of its
video rows and over the visual input's bytes (the frames' pixel tensor or the aligned
features, with dtype and shape), so two requests share an entry only when every
position of the prefix would be computed from identical inputs. Causal attention then
makes the prefix's K/V identical too, which is why reuse is lossless: the request's own
text continues from the copied positions (copy-on-reuse into its own slot; the static
engine's slots are contiguous, so sharing blocks read-only would need paged KV).

Bounded by bytes (``--prefix-cache-gb``, reserved out of the KV budget at start-up),
least recently used first out. Only the engine thread touches it.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from eventspec.cloud.engine.base import ChunkedPrefillEngine
from eventspec.cloud.prefill_queue import Pending

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prefix:
    """A saved prompt prefix: K and V, each [layers, Hkv, length, D] (or the engine's
    own layout), and its length in positions."""

    k: torch.Tensor
    v: torch.Tensor
    length: int

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.k) + tensor_bytes(self.v)


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def prefix_length(prompt_ids: Sequence[int], video_token_id: int) -> int:
    """Positions up to and including the last <video> row (0 when there is none): the
    part of the prompt that depends on the clip and not on the question."""
    for i in range(len(prompt_ids) - 1, -1, -1):
        if int(prompt_ids[i]) == video_token_id:
            return i + 1
    return 0


def prefix_key(prompt_ids: Sequence[int], length: int, visual: torch.Tensor) -> str:
    """The content hash of a prompt's first ``length`` ids and its visual input."""
    h = hashlib.blake2b(digest_size=20)
    h.update(np.asarray([int(i) for i in prompt_ids[:length]], dtype=np.int64).tobytes())
    v = visual.detach().to("cpu").contiguous()
    h.update(f"{v.dtype}{tuple(v.shape)}".encode())
    if v.numel():
        h.update(v.view(torch.uint8).numpy().data)  # the tensor's own buffer: no copy
    return h.hexdigest()


class PrefixCache:
    """Saved prefixes by key, at most ``max_bytes`` in all, least recently used out."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"the prefix cache needs a positive budget, got {max_bytes} bytes")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, Prefix] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> Prefix | None:
        """The entry (now the most recently used), counting a hit or a miss."""
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def put(self, key: str, entry: Prefix) -> bool:
        """Keep ``entry`` under ``key``, evicting the least recently used until it fits;
        False (nothing kept) when it alone exceeds the budget."""
        if entry.nbytes > self.max_bytes:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes
        while self._entries and self.bytes + entry.nbytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= evicted.nbytes
            self.evictions += 1
        self._entries[key] = entry
        self.bytes += entry.nbytes
        return True


def reuse_prefix(engine: ChunkedPrefillEngine, cache: PrefixCache, pending: Pending,
                 video_token_id: int) -> None:
    """Look a queued prefill's clip and prompt prefix up; on a hit copy the saved K/V
    into its slot, so its prefill starts after them; on a miss remember the key, so
    :func:`keep_prefix` saves it once written. Sets the request's verdict. The cache
    never fails a request: an error here is logged and the prompt is prefilled whole."""
    req, session = pending.request, pending.ticket.session
    visual = req.pixel_values_videos if req.pixel_values_videos is not None \
        else req.video_features
    # At least one row stays to prefill: the first token comes from its logits.
    length = min(prefix_length(req.input_ids, video_token_id), len(req.input_ids) - 1)
    session.prefix_cache = "miss"
    if visual is None or length < 1:
        return
    try:
        key = prefix_key(req.input_ids, length, visual)
        entry = cache.get(key)
        if entry is None or entry.length != length:
            pending.prefix_key, pending.prefix_len = key, length
            return
        engine.load_prefix(req.slot, entry.k, entry.v)
    except Exception:
        log.exception("the prefix cache failed; the prompt is prefilled whole")
        return
    pending.done = length
    session.prefix_reused_tokens = length
    session.prefix_cache = "hit"


def keep_prefix(engine: ChunkedPrefillEngine, cache: PrefixCache, pending: Pending) -> None:
    """Keep a missed prompt's prefix, now written, for the next question on its clip."""
    if pending.prefix_key is None:
        return
    try:
        k, v = engine.save_prefix(pending.request.slot, pending.prefix_len)
        cache.put(pending.prefix_key, Prefix(k, v, pending.prefix_len))
    except Exception:
        log.exception("the prefix cache could not keep a prefix")
