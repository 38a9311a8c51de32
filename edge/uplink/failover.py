"""Retry a request on another cloud replica when the one serving it dies, safely.

A Generate stream lives on one replica. If that replica fails (UNAVAILABLE: crashed,
killed, drained, connection cut) before anything of the answer was committed to the
client, the whole request is run once more from the start; the channel's round_robin
picks another ready replica, since the dead one has left the READY set. Once a
committed token has reached the client, a retry could duplicate or mix answers, so the
request fails with a clear UNAVAILABLE instead. Only UNAVAILABLE is retried: a refusal
(INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ...) or a deadline would repeat elsewhere.

How the agent uses it, around its per-attempt stream (the function must start a fresh
Generate call each time it is called)::

    async for event in with_failover(
        lambda attempt: self._with_cloud(spec, info, prepared),
        is_committed=ask_event_is_committed,
    ):
        yield event
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from eventspec.shared.contract.errors import ResourceExhausted, Unavailable
from eventspec.shared.contract.types import CommitEvent, CommittedEvent, DoneEvent, FinalEvent

log = logging.getLogger(__name__)

E = TypeVar("E")

#: How every failure of the cloud that the edge reports begins (``eventspec.edge.uplink.errors``).
CLOUD_PREFIX = "cloud verifier: "
#: First and longest pause before asking a full cloud again, s.
BUSY_PAUSE_S = 0.1
MAX_BUSY_PAUSE_S = 1.0

#: One attempt of a request: ``attempt(n)`` (n = 0, 1, ...) streams its events.
Attempt = Callable[[int], AsyncIterator[E]]


def ask_event_is_committed(event: object) -> bool:
    """Whether ``event`` hands part of the verified answer to the client (previews,
    being marked as unverified drafts, do not count)."""
    return isinstance(event, CommittedEvent | FinalEvent | CommitEvent | DoneEvent)


async def with_failover(
    attempt: Attempt[E],
    *,
    is_committed: Callable[[E], bool] = ask_event_is_committed,
    retries: int = 1,
    busy_retry_s: float = 0.0,
) -> AsyncIterator[E]:
    """Stream ``attempt(0)``; on UNAVAILABLE before any committed event, ``attempt(1)``...

    At most ``retries`` extra attempts. Raises ``Unavailable`` saying whether the answer
    was cut after commits (not retried) or every attempt failed.

    RESOURCE_EXHAUSTED before any commit (the cloud full for a moment: another edge took
    the slot, or a finished session's slot is not free yet) is retried with a short,
    growing pause for up to ``busy_retry_s`` in all, on top of ``retries``.
    """
    busy_until = time.monotonic() + busy_retry_s
    pause = BUSY_PAUSE_S
    n = 0
    while True:
        committed = 0
        events = attempt(n)
        try:
            async for event in events:
                if is_committed(event):
                    committed += 1
                yield event
            return
        except ResourceExhausted:
            if committed or time.monotonic() + pause > busy_until:
                raise
            log.info("the cloud verifier is full; trying again in %.1f s", pause)
            await asyncio.sleep(pause)
            pause = min(2 * pause, MAX_BUSY_PAUSE_S)
        except Unavailable as exc:
            # "cloud verifier: " first, as every cloud failure the edge reports: clients
            # tell "the edge's cloud is down" from "the edge is unreachable" by it.
            cause = exc.message.removeprefix(CLOUD_PREFIX)
            if committed:
                raise Unavailable(
                    f"{CLOUD_PREFIX}the replica serving this request failed after part of the "
                    "answer was sent; it was not retried, so the answer is not mixed with "
                    f"another run's: {cause}"
                ) from exc
            if n == retries:
                raise Unavailable(
                    f"{CLOUD_PREFIX}failed on {n + 1} attempt(s); last error: {cause}"
                ) from exc
            n += 1
            log.warning("cloud replica failed before any commit (%s); retrying the request "
                        "on another replica (attempt %d of %d)", exc.message, n + 1, retries + 1)
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()
