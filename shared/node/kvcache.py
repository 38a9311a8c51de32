"""Cutting a transformers KV cache back to a prefix: the one way both nodes do it.

The edge rolls its draft cache back after a Commit cuts its tail; the cloud's reference
engine crops a slot to the step's start position. Both hold a ``DynamicCache``, and its
``crop`` is easy to call wrongly: in transformers 5.x ``Cache.crop(n)`` takes a
*negative* ``n``, the count of positions to drop (5.23 raises on a positive one; 4.x
read it as an absolute length), and ``crop(0)`` is not guaranteed to be a no-op (it
trims sliding-window layers). So this helper takes the length to keep, computes the
count itself, and does nothing when the lengths are equal.

It needs neither torch nor transformers: it types the cache structurally, so the
module loads wherever the nodes' shared code does.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Protocol

from eventspec.shared.contract.errors import InvalidInput


class CroppableCache(Protocol):
    """The two methods of a transformers ``Cache`` the crop needs."""

    def get_seq_length(self) -> int: ...

    def crop(self, tokens_to_remove: int, /) -> None: ...


def crop_cache(cache: CroppableCache, keep_len: int, *, floor: int = 0) -> None:
    """Keep the first ``keep_len`` positions of ``cache``; refuse to cut below ``floor``.

    ``floor`` is the part that must survive, e.g. the draft's prompt (its event tokens
    cannot be re-fed as ids), so a bad request fails loudly here instead of leaving a
    cache that silently disagrees with the token sequence its owner believes it holds.
    """
    length = int(cache.get_seq_length())
    if not max(floor, 0) <= keep_len <= length:
        held = f"the cache holds {length}" + (f", {floor} of them prompt" if floor else "")
        raise InvalidInput(f"cannot roll back to {keep_len} positions: {held}")
    if keep_len < length:
        cache.crop(keep_len - length)


def cache_kwarg(model: object) -> str:
    """The name ``model.forward`` takes its KV cache under: ``cache`` from the
    transformers release that renamed it (``past_key_values`` then warns a FutureWarning
    at every call), ``past_key_values`` before (5.17 on the GPU machines)."""
    forward = type(model).forward  # type: ignore[attr-defined]
    return _cache_kwarg_of(forward)


@functools.cache
def _cache_kwarg_of(forward: Callable[..., object]) -> str:
    params = inspect.signature(forward).parameters
    return "cache" if "cache" in params else "past_key_values"
