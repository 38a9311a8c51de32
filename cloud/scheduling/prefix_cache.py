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

Bounded by bytes (``--prefix-cache-gb``, reserved out of the default KV budget at
start-up, on top of an explicit ``--kv-cache-gb``), least recently used first out. Only
the engine thread touches it.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from eventspec.cloud.engine.base import ChunkedPrefillEngine, PrefillRequest
from eventspec.cloud.scheduling.prefill_queue import Pending

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


def visual_key(*, frames: Sequence[bytes] | None = None,
               tensor: torch.Tensor | None = None) -> str:
    """The content hash of a request's visual input: its frames' encoded bytes (each
    length-prefixed, so the split between frames counts) or a tensor's dtype, shape and
    bytes. The server computes it off the engine thread, from the frames as they arrived
    (so a repeated clip can skip their preprocessing) or from the aligned features."""
    h = hashlib.blake2b(digest_size=20)
    if frames is not None:
        h.update(b"frames")
        for frame in frames:
            h.update(len(frame).to_bytes(8, "little"))
            h.update(frame)
    elif tensor is not None:
        v = tensor.detach().to("cpu").contiguous()
        h.update(f"tensor{v.dtype}{tuple(v.shape)}".encode())
        if v.numel():
            h.update(v.view(torch.uint8).numpy().data)  # the tensor's own buffer: no copy
    else:
        raise ValueError("visual_key needs frames or a tensor")
    return h.hexdigest()


def prefix_key(prompt_ids: Sequence[int], length: int, visual: str) -> str:
    """The cache key of a prompt's first ``length`` ids and its visual input's
    :func:`visual_key`."""
    h = hashlib.blake2b(digest_size=20)
    h.update(np.asarray([int(i) for i in prompt_ids[:length]], dtype=np.int64).tobytes())
    h.update(visual.encode())
    return h.hexdigest()


def keyed_prefix(prompt_ids: Sequence[int], visual: str, video_token_id: int
                 ) -> tuple[str, int] | None:
    """(key, prefix length) of a prompt whose visual input has :func:`visual_key`
    ``visual``, or None when it has no <video> rows. At least one row stays to prefill:
    the first answer token comes from its logits."""
    length = min(prefix_length(prompt_ids, video_token_id), len(prompt_ids) - 1)
    if length < 1:
        return None
    return prefix_key(prompt_ids, length, visual), length


def request_key(req: PrefillRequest, video_token_id: int) -> tuple[str, int] | None:
    """:func:`keyed_prefix` of a prefill request; a request not keyed on its way in has
    its visual tensor hashed here (None without one)."""
    vkey = req.visual_key
    if vkey is None:
        visual = req.pixel_values_videos if req.pixel_values_videos is not None \
            else req.video_features
        if visual is None:
            return None
        vkey = visual_key(tensor=visual)
    return keyed_prefix(req.input_ids, vkey, video_token_id)


class PrefixCache:
    """Saved prefixes by key, at most ``max_bytes`` in all, least recently used out."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"the prefix cache needs a positive budget, got {max_bytes} bytes")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, Prefix] = OrderedDict()
        #: The keys held, replaced whole on every change: other threads read it (one
        #: reference read under the GIL) to guess whether a request will hit.
        self._keys: frozenset[str] = frozenset()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every entry and every count: a cold cache again (the load benchmark
        starts each level so). Only while no request is in the engine loop."""
        self._entries.clear()
        self._keys = frozenset()
        self.bytes = self.hits = self.misses = self.evictions = 0

    def may_hold(self, key: str) -> bool:
        """Whether ``key`` was held a moment ago: safe from any thread, and only a guess
        (the engine thread may evict it next), so a caller that acts on it needs a way
        back (:func:`reuse_prefix` preprocesses deferred frames on a miss)."""
        return key in self._keys

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
        self._keys = frozenset(self._entries)
        return True


def reuse_prefix(engine: ChunkedPrefillEngine, cache: PrefixCache, pending: Pending,
                 video_token_id: int,
                 preprocess_frames: Callable[[Sequence[bytes]], torch.Tensor] | None = None
                 ) -> None:
    """Look a queued prefill's clip and prompt prefix up; on a hit copy the saved K/V
    into its slot, so its prefill starts after them; on a miss remember the key, so
    :func:`keep_prefix` saves it once written, and preprocess the frames of a request
    that deferred them (it expected a hit: :meth:`PrefixCache.may_hold`) with
    ``preprocess_frames``. Sets the request's verdict. The cache never fails a request:
    an error in it is logged and the prompt is prefilled whole; only the deferred
    frames' preprocessing may raise (the caller fails that request alone)."""
    req, session = pending.request, pending.ticket.session
    session.prefix_cache = "miss"
    try:
        keyed = request_key(req, video_token_id)
        entry = cache.get(keyed[0]) if keyed is not None else None
        if entry is not None and keyed is not None and entry.length == keyed[1]:
            engine.load_prefix(req.slot, entry.k, entry.v)
            pending.done = pending.reused = keyed[1]
            session.prefix_reused_tokens = keyed[1]
            session.prefix_cache = "hit"
            return
        if keyed is not None:
            pending.prefix_key, pending.prefix_len = keyed
    except Exception:
        log.exception("the prefix cache failed; the prompt is prefilled whole")
    if req.deferred_frames is not None and req.pixel_values_videos is None:
        if preprocess_frames is None:
            raise RuntimeError("a request deferred its frames, but nothing can preprocess them")
        # The rare race: evicted between the request's guess and now (engine thread).
        pending.request = replace(req, pixel_values_videos=preprocess_frames(
            req.deferred_frames), deferred_frames=None)


def keep_prefix(engine: ChunkedPrefillEngine, cache: PrefixCache, pending: Pending) -> None:
    """Keep a missed prompt's prefix, now written, for the next question on its clip."""
    if pending.prefix_key is None:
        return
    try:
        k, v = engine.save_prefix(pending.request.slot, pending.prefix_len)
        cache.put(pending.prefix_key, Prefix(k, v, pending.prefix_len))
    except Exception:
        log.exception("the prefix cache could not keep a prefix")
