"""Registry of live requests: the concurrency caps, KV release and a TTL sweep.

Every Generate stream registers a session here for its lifetime. Besides the server's
cap, each authenticated principal may hold at most ``per_principal`` sessions, so one
caller (one edge, one token) cannot take every slot from the others; anonymous callers
(a loopback server without authentication) cannot be told apart and share the server
cap only. The KV cache is
released exactly once, whichever way the stream ends (Done, Cancel, disconnect,
deadline, error) or, as a safety net, when the TTL sweep finds a session older than
its time to live.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from eventspec.shared.contract.errors import ResourceExhausted
from eventspec.shared.contract.principal import ANONYMOUS_PRINCIPAL, Principal

log = logging.getLogger(__name__)


@dataclass
class SessionHandle:
    """What the registry knows of one live request."""

    request_id: str
    created: float
    release: Callable[[], Awaitable[None]]
    principal: Principal = ANONYMOUS_PRINCIPAL
    task: asyncio.Task[object] | None = None
    #: Ends the stream itself with a clear status (cancelling a gRPC handler's task
    #: from outside leaves the client waiting for a status until its deadline).
    expire: Callable[[str], None] | None = None
    released: bool = False
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def release_once(self) -> None:
        """Free the KV cache once, however many paths ask for it."""
        async with self._lock:
            if self.released:
                return
            self.released = True
            await self.release()


class SessionRegistry:
    """Caps concurrent sessions and guarantees their KV is released."""

    def __init__(
        self, max_sessions: int, ttl_s: float, clock: Callable[[], float] = time.monotonic,
        *, per_principal: int | None = None,
    ) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.max_sessions = max_sessions
        self.per_principal = per_principal or max_sessions
        self._held: dict[Principal, int] = {}
        self.ttl_s = ttl_s
        self._clock = clock
        self._sessions: dict[int, SessionHandle] = {}
        self._next_key = 0
        self.expired = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def held_by(self, principal: Principal) -> int:
        """Sessions ``principal`` holds now."""
        return self._held.get(principal, 0)

    def by_principal(self) -> dict[Principal, int]:
        """Sessions held now, per principal (a copy, for the live view)."""
        return dict(self._held)

    def open(
        self,
        request_id: str,
        release: Callable[[], Awaitable[None]],
        expire: Callable[[str], None] | None = None,
        principal: Principal = ANONYMOUS_PRINCIPAL,
    ) -> int:
        """Register a session or raise RESOURCE_EXHAUSTED at a cap. Returns its key.

        ``expire(message)``, if given, is how the sweep ends the session's stream;
        without it the sweep cancels the registering task.
        """
        if len(self._sessions) >= self.max_sessions:
            raise ResourceExhausted(
                f"the verifier is at its cap of {self.max_sessions} concurrent sessions; "
                "retry later or raise --max-sessions"
            )
        held = self.held_by(principal)
        if principal.method != ANONYMOUS_PRINCIPAL.method and held >= self.per_principal:
            raise ResourceExhausted(
                f"principal {principal.name!r} already holds {held} concurrent sessions, the "
                f"per-principal cap (--max-sessions-per-principal {self.per_principal}); "
                "retry when one ends"
            )
        key = self._next_key
        self._next_key += 1
        self._sessions[key] = SessionHandle(
            request_id, self._clock(), release, task=asyncio.current_task(), expire=expire,
            principal=principal,
        )
        self._held[principal] = held + 1
        return key

    def attach(
        self, key: int, release: Callable[[], Awaitable[None]],
        expire: Callable[[str], None] | None = None,
    ) -> None:
        """Set how a registered session is released and expired, once it holds resources
        (the cap is checked first, so the caller learns the most specific limit)."""
        handle = self._sessions[key]
        handle.release = release
        handle.expire = expire

    async def close(self, key: int) -> None:
        """Release the session's KV (once) and forget it."""
        handle = self._sessions.pop(key, None)
        if handle is not None:
            left = self._held.get(handle.principal, 0) - 1
            if left > 0:
                self._held[handle.principal] = left
            else:
                self._held.pop(handle.principal, None)
            await handle.release_once()

    async def sweep(self) -> int:
        """Cancel and release sessions older than the TTL. Returns how many."""
        now = self._clock()
        old = [k for k, h in self._sessions.items() if now - h.created > self.ttl_s]
        for key in old:
            handle = self._sessions[key]
            log.warning("session %s exceeded its TTL of %.0f s; releasing", handle.request_id,
                        self.ttl_s)
            if handle.expire is not None:
                handle.expire(f"session exceeded the verifier's TTL of {self.ttl_s:g} s")
            elif handle.task is not None and not handle.task.done():
                handle.task.cancel()
            await self.close(key)
            self.expired += 1
        return len(old)

    async def run_sweeper(self, interval_s: float) -> None:
        """Sweep forever every ``interval_s`` (run as a background task)."""
        while True:
            await asyncio.sleep(interval_s)
            await self.sweep()

    async def close_all(self) -> None:
        for key in list(self._sessions):
            await self.close(key)
