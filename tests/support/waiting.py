"""Wait for a condition with a bound, instead of sleeping a fixed time and asserting.

A busy 2-core CI machine can run a thread or an event-loop callback late by a second or
more; a test that sleeps and then asserts fails there and passes alone. These helpers
poll until the condition holds and fail with ``what`` once ``timeout_s`` has passed.
The bounds are generous: they only decide how long a genuinely broken test takes to fail.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

#: Default bound: well above anything a loaded machine needs, far below a hung test.
DEFAULT_TIMEOUT_S = 30.0
POLL_S = 0.02


def wait_until(condition: Callable[[], object], what: str, *,
               timeout_s: float = DEFAULT_TIMEOUT_S, poll_s: float = POLL_S) -> None:
    """Block until ``condition()`` is truthy; AssertionError naming ``what`` after the bound."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        time.sleep(poll_s)


async def until(condition: Callable[[], object], what: str, *,
                timeout_s: float = DEFAULT_TIMEOUT_S, poll_s: float = POLL_S) -> None:
    """Like ``wait_until`` without blocking the event loop (the server under test runs on it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() >= deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        await asyncio.sleep(poll_s)


async def until_async(condition: Callable[[], Awaitable[object]], what: str, *,
                      timeout_s: float = DEFAULT_TIMEOUT_S, poll_s: float = POLL_S) -> None:
    """``until`` for a condition that must itself be awaited (an RPC, a health check)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await condition():
        if loop.time() >= deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        await asyncio.sleep(poll_s)
