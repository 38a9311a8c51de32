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

import logging
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from shared.errors import Unavailable
from shared.types import CommitEvent, CommittedEvent, DoneEvent, FinalEvent

log = logging.getLogger(__name__)

E = TypeVar("E")

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
) -> AsyncIterator[E]:
    """Stream ``attempt(0)``; on UNAVAILABLE before any committed event, ``attempt(1)``...

    At most ``retries`` extra attempts. Raises ``Unavailable`` saying whether the answer
    was cut after commits (not retried) or every attempt failed.
    """
    for n in range(retries + 1):
        committed = 0
        events = attempt(n)
        try:
            async for event in events:
                if is_committed(event):
                    committed += 1
                yield event
            return
        except Unavailable as exc:
            if committed:
                raise Unavailable(
                    "the cloud verifier serving this request failed after part of the answer "
                    "was sent; it was not retried, so the answer is not mixed with another "
                    f"run's: {exc.message}"
                ) from exc
            if n == retries:
                raise Unavailable(
                    f"the cloud verifier failed on {n + 1} attempt(s); last error: {exc.message}"
                ) from exc
            log.warning("cloud replica failed before any commit (%s); retrying the request "
                        "on another replica (attempt %d of %d)", exc.message, n + 2, retries + 1)
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()
