"""KV by real length (cloud/scheduling/kv_arena.py): the arena hands out runs that never overlap,
stay inside it and merge back on release, whatever the order; the pool refuses saying
whether sessions or positions ran out."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.cloud.scheduling.kv_arena import ArenaPool, PositionArena
from eventspec.cloud.scheduling.scheduler import Scheduler
from eventspec.shared.contract.errors import InvalidInput, ResourceExhausted
from tests.support.fake_engine import TEXT_VOCAB
from tests.support.scheduler_sessions import session_factory

#: A program: allocate a run of n positions (n > 0), or release the i-th held run (-i-1).
ops = st.lists(st.one_of(st.integers(1, 40), st.integers(-8, -1)), max_size=120)


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 200), program=ops)
def test_runs_never_overlap_and_merge_back(size: int, program: list[int]) -> None:
    arena = PositionArena(size)
    held: list[tuple[int, int]] = []
    for op in program:
        if op > 0:
            start = arena.allocate(op)
            free_runs = _free_runs(size, held)
            if start is None:  # refused only when no free run is long enough
                assert all(n < op for _, n in free_runs)
                continue
            assert (start, op) == next((s, op) for s, n in free_runs if n >= op), "first fit"
            held.append((start, op))
        elif held:
            start, n = held.pop((-op - 1) % len(held))
            assert arena.release(start) == n
        taken = sorted(held)
        for (s0, n0), (s1, _) in itertools.pairwise(taken):
            assert s0 + n0 <= s1, "two runs overlap"
        assert all(s >= 0 and s + n <= size for s, n in taken)
        assert arena.free_positions == size - sum(n for _, n in held)
        assert arena.largest_free == max((n for _, n in _free_runs(size, held)), default=0)
    for start, _ in held:
        arena.release(start)
    assert arena.allocate(size) == 0, "every position merged back into one run"


def _free_runs(size: int, held: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The free runs, by start, that ``held`` leaves in [0, size)."""
    runs, at = [], 0
    for s, n in sorted(held):
        if s > at:
            runs.append((at, s - at))
        at = s + n
    if at < size:
        runs.append((at, size - at))
    return runs


def test_a_run_is_released_once() -> None:
    arena = PositionArena(10)
    start = arena.allocate(4)
    assert start == 0
    arena.release(start)
    with pytest.raises(RuntimeError, match="no KV run starts at position 0"):
        arena.release(start)
    with pytest.raises(InvalidInput):
        arena.allocate(0)


def test_the_pool_says_whether_sessions_or_positions_ran_out() -> None:
    pool = ArenaPool(100, max_seq_len=60, max_sessions=2)
    woken = []
    pool.on_release = lambda: woken.append(1)
    a = pool.acquire(60)
    assert pool.fits(40) and not pool.fits(41)
    with pytest.raises(ResourceExhausted, match=r"no free run of 41 KV positions.*longest "
                                                 r"free run is 40"):
        pool.acquire(41)
    b = pool.acquire(40)
    assert not pool.fits(1) and pool.free == 0
    with pytest.raises(ResourceExhausted, match="all 2 sessions of KV are in use"):
        pool.acquire(1)
    with pytest.raises(InvalidInput, match="exceeds this verifier's 60 per request"):
        pool.acquire(61)
    pool.release(a)
    assert woken == [1] and pool.fits(60) and pool.positions_free == 60
    pool.release(b)
    assert pool.positions_free == 100 and pool.free == 2


def test_fragmentation_makes_a_long_request_wait_not_fail_the_arena() -> None:
    # Three runs of 30 in 100; freeing the middle leaves 40 free positions in two runs
    # (30 and 10): a request of 35 does not fit although 40 are free.
    pool = ArenaPool(100, max_seq_len=60, max_sessions=8)
    a, b, c = pool.acquire(30), pool.acquire(30), pool.acquire(30)
    pool.release(b)
    assert pool.positions_free == 40 and not pool.fits(35) and pool.fits(30)
    pool.release(a)  # 0..60 merge: now it fits
    assert pool.fits(60)
    pool.release(c)


class _ArenaEngine:
    """Just what ``Scheduler.admit`` touches of an engine with KV by length."""

    device = torch.device("cpu")
    num_slots, max_seq_len, kv_positions = 4, 64, 200

    def __init__(self) -> None:
        self.reserved: dict[int, int] = {}

    def reserve(self, slot: int, positions: int) -> None:
        self.reserved[slot] = positions

    def free(self, slot: int) -> None:
        self.reserved.pop(slot, None)


def test_admit_takes_a_run_of_what_the_request_needs_and_gives_it_back_on_failure() -> None:
    engine = _ArenaEngine()
    sched = Scheduler(engine, text_vocab_size=TEXT_VOCAB)  # type: ignore[arg-type]
    assert sched.kv_by_length and isinstance(sched.pool, ArenaPool)
    ticket = sched.admit("a", session_factory(8, 20, max_seq_len=28), positions=28)
    assert engine.reserved == {ticket.slot: 28} and sched.pool.positions_free == 172
    with pytest.raises(InvalidInput, match="a session of 64 positions in KV reserved for 28"):
        sched.admit("b", session_factory(8, 20, max_seq_len=64), positions=28)
    assert engine.reserved == {ticket.slot: 28} and sched.pool.positions_free == 172
