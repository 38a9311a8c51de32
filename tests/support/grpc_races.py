"""What ``grpc.aio``'s client reports when it loses a known race, for tests of refusals.

When a request's write lands after the server has already ended the call (a refusal at
HEADERS, before the handler read anything), the client overwrites the server's status
with INTERNAL "Internal error from Core": a client-side bug, open upstream
(grpc/grpc#36066; fix proposed in grpc/grpc#43486). A test of what the server refused
with retries such a call (:func:`refused`) or, where each call counts, accepts exactly
this pair and asserts the server's side from the server's own counters.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
from grpc import aio

#: (code, details) the client reports instead of the server's status when it loses the race.
CLIENT_RACE = (grpc.StatusCode.INTERNAL, "Internal error from Core")


def is_client_race(exc: aio.AioRpcError) -> bool:
    return (exc.code(), exc.details()) == CLIENT_RACE


async def refused(call: Callable[[], Awaitable[object]], attempts: int = 3) -> aio.AioRpcError:
    """The error a refused ``call`` ends with, calling again (up to ``attempts`` times)
    while the client's race hides the server's status; fails if the call succeeds."""
    for _ in range(attempts):
        try:
            await call()
        except aio.AioRpcError as exc:
            if not is_client_race(exc):
                return exc
        else:
            raise AssertionError("the call was not refused")
    raise AssertionError(f"every one of {attempts} attempts lost the client's race")
