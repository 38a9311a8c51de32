"""The edge's admission queue (eventspec.edge.uplink.admission): never more in flight than
the cloud's slots, waiters admitted in arrival order, an abandoned wait leaves no trace,
and a full queue refuses at once."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.edge.uplink.admission import AdmissionQueue, cloud_slots
from eventspec.shared.contract.errors import DeadlineExceeded, ResourceExhausted
from eventspec.shared.contract.types import ServerLimits


async def _drain(gen: object) -> list[int]:
    return [place async for place in gen]  # type: ignore[attr-defined]


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 4), arrivals=st.integers(1, 12),
       releases=st.lists(st.integers(0, 11), max_size=30))
def test_admission_is_bounded_and_first_in_first_out(
    capacity: int, arrivals: int, releases: list[int],
) -> None:
    async def run() -> None:
        queue = AdmissionQueue(max_waiting=64, capacity=capacity)
        admitted: list[int] = []

        async def ask(i: int) -> None:
            await _drain(queue.enter(timeout_s=60))
            admitted.append(i)

        tasks = []
        for i in range(arrivals):
            tasks.append(asyncio.create_task(ask(i)))
            await asyncio.sleep(0)  # arrive in order
        for _ in range(5):
            await asyncio.sleep(0)
        assert admitted == list(range(min(capacity, arrivals)))
        for _ in releases:
            if queue.in_flight == 0:
                break
            queue.release()
            for _ in range(5):
                await asyncio.sleep(0)
            assert queue.in_flight <= capacity
            assert admitted == sorted(admitted)  # first in, first out
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert queue.waiting == 0  # cancelled waits leave the queue

    asyncio.run(run())


async def test_places_count_down_and_a_full_queue_refuses() -> None:
    queue = AdmissionQueue(max_waiting=2, capacity=1)
    await _drain(queue.enter(1.0))  # takes the only slot
    places: list[list[int]] = [[], []]

    async def wait(i: int) -> None:
        async for place in queue.enter(30.0):
            places[i].append(place)

    first = asyncio.create_task(wait(0))
    await asyncio.sleep(0)
    second = asyncio.create_task(wait(1))
    await asyncio.sleep(0)
    with pytest.raises(ResourceExhausted, match="queue for the cloud verifier is full"):
        await _drain(queue.enter(1.0))
    queue.release()
    await first
    queue.release()
    await second
    assert places == [[1], [2, 1]]
    assert queue.in_flight == 1


async def test_a_wait_that_runs_out_says_so_and_leaves_the_line() -> None:
    queue = AdmissionQueue(max_waiting=4, capacity=1)
    await _drain(queue.enter(1.0))
    with pytest.raises(DeadlineExceeded, match="in the edge's queue"):
        await _drain(queue.enter(0.05))
    assert queue.waiting == 0 and queue.in_flight == 1


@pytest.mark.parametrize(("limits", "slots"), [
    (ServerLimits(max_sessions=8, max_sessions_per_principal=7, kv_slots=28), 7),
    (ServerLimits(max_sessions=8, kv_slots=3), 3),
    (ServerLimits(max_sessions=8), 8),
])
def test_the_edge_keeps_to_the_smallest_advertised_cap(limits: ServerLimits, slots: int) -> None:
    assert cloud_slots(limits) == slots
