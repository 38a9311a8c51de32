"""A budget of refused calls per connection: past it, the connection's calls are held at
HEADERS, then refused.

Refusing a call costs the node's event loop even when no byte of the request is read:
grpc.aio builds the call, runs the interceptors and sends the status (a fraction of a
millisecond a call on loopback; 3.8 ms for a refused multi-megabyte Open). A client that opens
streams without a token, or keeps sending requests refused before any model work, as fast
as it can, slowed authenticated Generate 4-35x and made health probes wait 300 ms (issue
38, red-team findings 2 and 5).

So each refusal made before a call reaches the node's service counts against its
connection (the peer's address and port, ``context.peer()``): UNAUTHENTICATED and
PERMISSION_DENIED (``eventspec.shared.wire.auth``), RESOURCE_EXHAUSTED for too many open
reads, INVALID_ARGUMENT for a request refused by its bytes or that does not parse
(``eventspec.shared.wire.gate``, ``eventspec.shared.wire.interceptors``). The refusals a
well-behaved client meets under load (the node busy, every session taken), first-message
timeouts and anything the service itself answers do not count. A connection with more
than ``REFUSALS_PER_CONNECTION`` within ``REFUSAL_WINDOW_S`` seconds is *cut off* until
it has made no call for ``REFUSAL_WINDOW_S``, or for ``MAX_CUT_S`` at most, when it gets a
new budget (one log line says it was cut off). The
outermost interceptor stops each of its calls at HEADERS, before authentication, reading
no message and logging nothing, and *holds* it for half to all of ``REFUSAL_WINDOW_S``
(spread, so held calls do not all end at once), then answers RESOURCE_EXHAUSTED naming
the reason and when the cut ends (``HOLD_CUT_CALLS``; past ``MAX_HELD_CALLS`` held in
all, or with holding off, at once). Refused at once, a flooding
client opens its next stream at once, and the flood goes on at the event loop's speed
(measured: ``benchmarks/bench_stream_flood.py``); held, its calls fill the connection's
HTTP/2 stream cap (``MAX_STREAMS_PER_CONNECTION``) and the connection goes quiet, costing
a suspended coroutine a stream, as a stalled stream does under the first-message bound.

grpc.aio has no API to send GOAWAY on, or close, one connection: a
``grpc.aio.ServicerContext`` offers ``peer()`` and no transport, and the server options
``grpc.max_connection_age_ms`` / ``grpc.max_connection_idle_ms`` apply to every
connection. Shutting the connection's socket down from Python (found among the process's
descriptors by its peer) was tried: a client that reconnects then floods again at once,
with each new connection's first streams all reaching Python, and the benchmark got worse
(authenticated Generate 4.2x slower, health p50 312 ms), so a cut-off connection is kept
and quieted instead. A client that opens new connections without end is bounded by
``REFUSALS_PER_CONNECTION`` plus the stream cap per connection, not stopped.

The bookkeeping is bounded: a connection is forgotten once its window has passed, and at
most ``TRACKED_CONNECTIONS`` are tracked (the oldest forgotten first).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from grpc import aio

from eventspec.shared.wire.handlers import MethodInterceptor, wrap_handler

log = logging.getLogger(__name__)

#: Refusals a connection may earn within ``REFUSAL_WINDOW_S`` before it is cut off. A
#: well-behaved client earns none: its token is valid and its requests within bounds.
REFUSALS_PER_CONNECTION = 20
#: The window those refusals are counted in, and how long a cut-off connection must make
#: no call to be let go; each of its calls is held for half to all of it.
REFUSAL_WINDOW_S = 10.0
#: The longest a connection stays cut off, however often it calls: then it gets a new
#: budget, so a client whose credential became valid meanwhile (a token added on the
#: server after the client started) recovers on its own connection.
MAX_CUT_S = 60.0
#: Connections tracked at once; past it the oldest window is forgotten.
TRACKED_CONNECTIONS = 4096
#: Hold each call of a cut-off connection before refusing it (off: refuse it at once).
HOLD_CUT_CALLS = True
#: Calls held at once, all connections together; past it they are refused at once.
MAX_HELD_CALLS = 16384

#: Set around each call by ``RefusalBudgetInterceptor``: ``mark_refused`` flips it.
_CALL: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar(
    "eventspec_refusal", default=None)


def mark_refused() -> None:
    """Count the call being served as refused before it reached the service (a no-op
    outside ``RefusalBudgetInterceptor``). Call it just before the ``context.abort``."""
    cell = _CALL.get()
    if cell is not None:
        cell[0] = True


@dataclass
class _Window:
    #: When the refusals began to be counted, and when the entry may be forgotten: the
    #: window's end, or for a cut-off connection ``window_s`` after its last call.
    start: float
    until: float
    refusals: int = 0
    cut: bool = False
    cut_at: float = 0.0


class RefusalBudget:
    """Refusals per connection within a window; ``cut_for`` says whether a connection is
    cut off: more than ``limit`` refusals within ``window_s``, and it stays so until it
    has made no call for ``window_s``, or for ``MAX_CUT_S`` at most."""

    def __init__(self, limit: int = REFUSALS_PER_CONNECTION,
                 window_s: float = REFUSAL_WINDOW_S, *,
                 max_tracked: int = TRACKED_CONNECTIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1 or not window_s > 0 or max_tracked < 1:
            raise ValueError(f"refusal budget: limit {limit} >= 1, window {window_s} s > 0 "
                             f"and {max_tracked} tracked >= 1 needed")
        self.limit, self.window_s, self.max_tracked = limit, window_s, max_tracked
        self.clock = clock
        #: In the order of ``until`` (every update sets it to now + ``window_s`` and moves
        #: the entry to the end): forgetting walks from the front.
        self.windows: OrderedDict[str, _Window] = OrderedDict()
        #: Connections cut off so far, calls stopped because of it, and calls held now.
        self.cut_connections = 0
        self.refused_cut = 0
        self.held = 0

    def forget_old(self, now: float) -> None:
        """Drop the entries whose time has passed, and the oldest past ``max_tracked``."""
        while self.windows:
            peer, window = next(iter(self.windows.items()))
            if window.until > now and len(self.windows) <= self.max_tracked:
                return
            del self.windows[peer]

    def _touch(self, peer: str, window: _Window, now: float) -> None:
        window.until = now + self.window_s
        self.windows.move_to_end(peer)

    def cut_for(self, peer: str) -> bool:
        """Whether ``peer`` is cut off (each call of a cut-off connection keeps it so).
        Every call forgets the connections whose time has passed."""
        now = self.clock()
        self.forget_old(now)
        window = self.windows.get(peer)
        if window is None or not window.cut:
            return False
        if now - window.cut_at >= MAX_CUT_S:  # a new budget
            del self.windows[peer]
            return False
        self._touch(peer, window, now)
        self.refused_cut += 1
        return True

    def refused(self, peer: str) -> None:
        """Count one refusal of ``peer``'s; cut it off when that is one too many."""
        now = self.clock()
        self.forget_old(now)
        window = self.windows.get(peer)
        if window is None or (not window.cut and now - window.start >= self.window_s):
            window = self.windows[peer] = _Window(now, now + self.window_s)
            self.windows.move_to_end(peer)
            self.forget_old(now)
        window.refusals += 1
        if window.refusals <= self.limit or window.cut:
            return
        window.cut, window.cut_at = True, now
        self._touch(peer, window, now)
        self.cut_connections += 1
        log.warning("connection %s cut off: %d calls refused within %g s (at most %d); "
                    "its calls are %s until it makes none for %g s", peer, window.refusals,
                    self.window_s, self.limit,
                    "held, then refused" if HOLD_CUT_CALLS else "refused at once",
                    self.window_s)


class RefusalBudgetInterceptor(MethodInterceptor):
    """Refuse the calls of a connection cut off by ``budget`` at HEADERS; count the calls
    the inner interceptors refuse (``mark_refused``). Install it outermost."""

    def __init__(self, budget: RefusalBudget | None = None) -> None:
        self.budget = budget or RefusalBudget()

    def wrap(self, handler: grpc.RpcMethodHandler,
             call: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        budget = self.budget

        @contextlib.asynccontextmanager
        async def counted(context: aio.ServicerContext[Any, Any]) -> AsyncIterator[None]:
            peer = context.peer()
            if budget.cut_for(peer):
                await _stop(budget, context)
            cell = [False]
            token = _CALL.set(cell)
            try:
                yield
            finally:
                with contextlib.suppress(ValueError):  # a generator closed in another context
                    _CALL.reset(token)
                if cell[0]:
                    budget.refused(peer)

        return wrap_handler(handler, counted)


async def _stop(budget: RefusalBudget, context: aio.ServicerContext[Any, Any]) -> None:
    """End a call of a cut-off connection with RESOURCE_EXHAUSTED, after holding it for
    half to all of ``window_s`` (``HOLD_CUT_CALLS``, room permitting; spread, so that a
    flood's held calls do not all end, and come back, at once)."""
    why = (f"this connection is cut off: more than {budget.limit} of its calls were refused "
           f"within {budget.window_s:g} s (unauthenticated, not allowed, or malformed); it "
           f"stays so until it makes no call for {budget.window_s:g} s (at most "
           f"{MAX_CUT_S:g} s)")
    if HOLD_CUT_CALLS and budget.held < MAX_HELD_CALLS:
        budget.held += 1
        try:
            await asyncio.sleep(budget.window_s * (0.5 + random.random() / 2))
        finally:
            budget.held -= 1
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{why} (this call was held)")
    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
