"""KV by real length: one arena of positions, each request given the run it needs.

Why: fixed slots are sized for the longest request the server allows (the prompt, 256
question tokens and the server's answer cap), while a request needs its own prompt
plus its own answer cap. On an 80 GB card that difference was 28 slots of 4,096
positions (later 40 of 2,856) against about 50 requests of 2,231 (a 2,103-token video
prompt and a 128-token answer). Here a request takes a contiguous run of exactly
``prompt + max_new_tokens`` positions out of one arena; the static engine sees the
arena through a strided view in which a "slot" is the run's first position
(:class:`~eventspec.shared.node.static.runtime.StaticRuntime`, ``kv_positions``), so
its kernels are unchanged.

Contiguous runs rather than vLLM's paged blocks (Kwon et al., "Efficient Memory
Management for Large Language Model Serving with PagedAttention", SOSP 2023): a run
needs no block table in the attention kernels or the CUDA graphs, and a request's
length is fixed when it is admitted (its prompt and its cap are known), so nothing
grows in place. The price is fragmentation: a free run may be too short although the
arena holds enough positions in total; then the request waits in the KV queue like one
that finds memory full (``eventspec.cloud.requests.kv_queue``), and the message says which.
First fit over an address-ordered free list, merged on release (Knuth, TAOCP vol. 1,
2.5), keeps runs of similar requests packed; with widely mixed answer caps it holds
fewer requests than fixed slots (``benchmarks/bench_kv_arena.py``: 37.9 against 40.6
sessions for caps of 32 and 512 tokens, 50.5 against 40.8 for one cap), which paged KV
or compaction would fix (docs/scheduler.md, "KV by length").
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable

from eventspec.shared.contract.errors import InvalidInput, ResourceExhausted


class PositionArena:
    """First-fit allocation of contiguous runs in ``[0, size)``; not thread-safe."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise InvalidInput(f"a KV arena needs at least one position, got {size}")
        self.size = size
        #: Free runs as (start, length), ordered by start, never adjacent (merged).
        self._starts: list[int] = [0]
        self._lengths: list[int] = [size]
        self._taken: dict[int, int] = {}  # start -> length of each run handed out

    @property
    def free_positions(self) -> int:
        return sum(self._lengths)

    @property
    def largest_free(self) -> int:
        return max(self._lengths, default=0)

    @property
    def runs(self) -> int:
        """Runs handed out now."""
        return len(self._taken)

    def allocate(self, length: int) -> int | None:
        """The start of a run of ``length`` positions (the lowest that fits), or None."""
        if length < 1:
            raise InvalidInput(f"a KV run needs at least one position, got {length}")
        for i, free in enumerate(self._lengths):
            if free >= length:
                start = self._starts[i]
                if free == length:
                    del self._starts[i], self._lengths[i]
                else:
                    self._starts[i] += length
                    self._lengths[i] -= length
                self._taken[start] = length
                return start
        return None

    def release(self, start: int) -> int:
        """Give back the run that begins at ``start``; returns its length."""
        length = self._taken.pop(start, None)
        if length is None:
            raise RuntimeError(f"no KV run starts at position {start} (released twice?)")
        i = bisect.bisect_left(self._starts, start)
        merge_left = i > 0 and self._starts[i - 1] + self._lengths[i - 1] == start
        merge_right = i < len(self._starts) and start + length == self._starts[i]
        if merge_left and merge_right:
            self._lengths[i - 1] += length + self._lengths[i]
            del self._starts[i], self._lengths[i]
        elif merge_left:
            self._lengths[i - 1] += length
        elif merge_right:
            self._starts[i] = start
            self._lengths[i] += length
        else:
            self._starts.insert(i, start)
            self._lengths.insert(i, length)
        return length


class ArenaPool:
    """The scheduler's KV pool when KV is allocated by length: a request takes a run of
    its own positions, at most ``max_sessions`` at once. The same interface as
    :class:`~eventspec.cloud.scheduling.tickets.SlotPool`; a "slot" is the run's first position."""

    def __init__(self, positions: int, max_seq_len: int, max_sessions: int) -> None:
        if max_sessions < 1:
            raise InvalidInput(f"a KV pool needs at least one session, got {max_sessions}")
        self.arena = PositionArena(positions)
        self.max_seq_len = max_seq_len
        self.num_slots = max_sessions
        self._lock = threading.Lock()
        #: Called (on the releasing thread) after a run is given back (the KV queue).
        self.on_release: Callable[[], None] | None = None

    @property
    def free(self) -> int:
        """Sessions that may still start (by count; a long one may not fit a run)."""
        return self.num_slots - self.arena.runs

    @property
    def positions_free(self) -> int:
        return self.arena.free_positions

    @property
    def positions_total(self) -> int:
        return self.arena.size

    @property
    def positions_used(self) -> int:
        return self.arena.size - self.arena.free_positions

    @property
    def full_message(self) -> str:
        return (f"KV memory is full ({self.arena.runs} requests hold "
                f"{self.arena.size - self.arena.free_positions} of {self.arena.size} "
                f"positions, at most {self.num_slots} requests; GetServerInfo.limits)")

    def fits(self, positions: int) -> bool:
        """Whether a request of ``positions`` would be admitted now."""
        with self._lock:
            return self.arena.runs < self.num_slots and self.arena.largest_free >= positions

    def acquire(self, positions: int) -> int:
        """A run of ``positions`` (the request's prompt plus its answer cap); raises
        RESOURCE_EXHAUSTED saying whether sessions or positions ran out."""
        if not 0 < positions <= self.max_seq_len:
            raise InvalidInput(f"a request of {positions} positions exceeds this verifier's "
                               f"{self.max_seq_len} per request")
        with self._lock:
            if self.arena.runs >= self.num_slots:
                raise ResourceExhausted(
                    f"all {self.num_slots} sessions of KV are in use (--max-sessions); "
                    "retry later")
            start = self.arena.allocate(positions)
            if start is None:
                raise ResourceExhausted(
                    f"no free run of {positions} KV positions: {self.full_message}, the "
                    f"longest free run is {self.arena.largest_free}; retry later or raise "
                    "--kv-cache-gb")
            return start

    def release(self, slot: int) -> None:
        with self._lock:
            self.arena.release(slot)
        if self.on_release is not None:
            self.on_release()
