"""with_failover: retry once before anything was committed, never after."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from eventspec.edge.uplink.failover import with_failover
from eventspec.shared.contract.errors import InvalidInput, Unavailable


def attempts(*plans: list[str]) -> tuple[list[int], object]:
    """Attempt n yields plans[n]'s items; an item "!" raises Unavailable there."""
    calls: list[int] = []

    async def attempt(n: int) -> AsyncIterator[str]:
        calls.append(n)
        for item in plans[n]:
            if item == "!":
                raise Unavailable(f"replica {n} died")
            yield item

    return calls, attempt


def committed(event: str) -> bool:
    return event.startswith("c")


async def collect(attempt: object, **kw: object) -> list[str]:
    return [e async for e in with_failover(attempt, is_committed=committed, **kw)]  # type: ignore[arg-type]


async def test_retried_when_nothing_was_committed() -> None:
    calls, attempt = attempts(["p1", "!"], ["c1", "c2", "done"])
    assert await collect(attempt) == ["p1", "c1", "c2", "done"]
    assert calls == [0, 1]


async def test_not_retried_after_a_commit() -> None:
    calls, attempt = attempts(["c1", "!"], ["c1", "done"])
    with pytest.raises(Unavailable, match="not retried"):
        await collect(attempt)
    assert calls == [0]


async def test_gives_up_after_the_retry() -> None:
    calls, attempt = attempts(["!"], ["!"])
    with pytest.raises(Unavailable, match="failed on 2 attempt"):
        await collect(attempt)
    assert calls == [0, 1]


async def test_other_errors_are_not_retried() -> None:
    calls: list[int] = []

    async def attempt(n: int) -> AsyncIterator[str]:
        calls.append(n)
        raise InvalidInput("question is empty")
        yield ""

    with pytest.raises(InvalidInput):
        await collect(attempt)
    assert calls == [0]
