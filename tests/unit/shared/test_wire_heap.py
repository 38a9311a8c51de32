"""The heap trimmer returns freed memory after a burst, and only then (issue 38, red-team
finding 1: refused calls' memory stayed with glibc, idle or not)."""

from __future__ import annotations

import mmap
import platform

import pytest

from eventspec.shared.wire.heap import Glibc, HeapTrimmer, faulted_bytes
from tests.support.waiting import until

MB = 1 << 20


class FakeProcess:
    """Free bytes in glibc's heaps and bytes faulted in so far, set by the test; a trim
    leaves the free bytes counted as free, as glibc does."""

    def __init__(self) -> None:
        self.free = 0
        self.faulted = 0
        self.trimmed = 0

    def free_bytes(self) -> int:
        return self.free

    def trim(self) -> bool:
        self.trimmed += 1
        return True


def trimmer(fake: FakeProcess, period_s: float = 1.0) -> HeapTrimmer:
    return HeapTrimmer(period_s=period_s, min_bytes=32 * MB, glibc=lambda: fake,
                       faulted=lambda: fake.faulted)


async def test_trims_after_a_burst_of_new_memory_that_is_free_again() -> None:
    fake = FakeProcess()
    t = trimmer(fake)
    fake.faulted, fake.free = 31 * MB, 100 * MB  # little new memory
    assert not await t.check()
    fake.faulted, fake.free = 200 * MB, 10 * MB  # new memory, still in use
    assert not await t.check()
    fake.free = 180 * MB  # the burst's requests are freed
    assert await t.check()
    assert (fake.trimmed, t.trims) == (1, 1)
    # Still counted as free after the trim, but nothing new was touched: no trim.
    assert not await t.check()
    # The trimmed pages used and freed again fault in anew: trimmed again.
    fake.faulted += 40 * MB
    assert await t.check()
    assert fake.trimmed == 2


async def test_the_running_trimmer_trims_after_a_burst_and_stops() -> None:
    fake = FakeProcess()
    t = trimmer(fake, period_s=0.01)
    t.start()
    try:
        fake.faulted, fake.free = 100 * MB, 100 * MB
        await until(lambda: fake.trimmed == 1, "a trim after the burst")
    finally:
        await t.stop()
    assert t._task is None


async def test_without_glibc_the_trimmer_does_nothing() -> None:
    t = HeapTrimmer(glibc=lambda: None)
    t.start()
    assert not await t.check()
    await t.stop()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_glibc_and_the_fault_count_are_read_here() -> None:
    glibc = Glibc.load()
    assert glibc is not None
    assert glibc.free_bytes() >= 0
    glibc.trim()
    # A fresh anonymous mapping, written page by page: every page is faulted in here (a
    # bytearray may reuse pages the allocator already holds, and then faults in none).
    with mmap.mmap(-1, 8 * MB) as fresh:
        if hasattr(mmap, "MADV_NOHUGEPAGE"):  # a huge page is one fault for 2 MiB
            fresh.madvise(mmap.MADV_NOHUGEPAGE)
        before = faulted_bytes()
        for offset in range(0, 8 * MB, mmap.PAGESIZE):
            fresh[offset] = 1
        assert faulted_bytes() - before >= 4 * MB
