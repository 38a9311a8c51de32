"""Waiting for the cloud verifier within one Ask: for its GetServerInfo while it warms up
or is briefly unreachable (with progress for the client), and for its first reply on a
new stream (a frozen replica is failed over instead of waited for)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from eventspec.edge.readiness import CloudState, CloudView, Readiness
from eventspec.edge.uplink.roles import VerifierLink, VerifierStream
from eventspec.shared.contract.errors import ErrorCode, EventSpecError, Unavailable
from eventspec.shared.contract.types import ProgressEvent, ServerInfo

log = logging.getLogger(__name__)

#: How often an Ask that waits for the cloud asks it again, s.
CLOUD_POLL_S = 0.5
#: An Ask plans with a GetServerInfo answer at most this old (the edge server's watcher
#: refreshes it every few seconds) instead of asking again.
INFO_MAX_AGE_S = 10.0


async def cloud_info_when_ready(
link: VerifierLink, readiness: Readiness, *, wait_s: float, rpc_timeout_s: float,
) -> AsyncIterator[ProgressEvent | ServerInfo]:
    """The cloud's GetServerInfo, waiting up to ``wait_s`` for a cloud that is warming
    up or briefly unreachable; yields a ProgressEvent whenever the reason changes,
    then the info. A cloud that is not a Verifier, or a wait that runs out, gets its
    own clear error."""
    cached = link.fresh_info(INFO_MAX_AGE_S)
    if cached is not None:
        yield cached
        return
    started = time.monotonic()
    shown = None
    while True:
        try:
            info = await link.server_info(rpc_timeout_s)
        except EventSpecError as exc:
            if exc.code not in (ErrorCode.UNAVAILABLE, ErrorCode.DEADLINE_EXCEEDED):
                raise
            view = await link.diagnose(rpc_timeout_s)
        else:
            readiness.set_cloud(CloudView(CloudState.READY))
            yield info
            return
        readiness.set_cloud(view)
        waited = time.monotonic() - started
        refusal = readiness.refusal(needs_cloud=True)
        if refusal is not None:
            raise refusal
        if waited >= wait_s:
            raise readiness.timeout_error(needs_cloud=True, waited_s=waited)
        waiting = readiness.waiting(needs_cloud=True)
        if waiting is not None and waiting != shown:
            shown = waiting
            log.info("ask waits: %s", waiting.message)
            yield ProgressEvent(waiting.stage, waiting.message, round(waited, 3))
        await asyncio.sleep(min(CLOUD_POLL_S, wait_s - waited))


async def first_reply(link: VerifierLink, stream: VerifierStream, reply: asyncio.Future[Any],
                  upload: asyncio.Future[Any], *, within_s: float) -> None:
    """Wait for the cloud's first message (its Plan, sent as soon as the Open is
    admitted, before the visual input), at most ``within_s``.

    A replica that is frozen (SIGSTOPped, hung) keeps its connection open and
    answers nothing; without this bound a request waited for keepalive to declare
    the connection dead. UNAVAILABLE here, before anything is committed, lets
    ``eventspec.edge.uplink.failover`` run the request on another replica.
    """
    deadline = time.monotonic() + within_s
    while not reply.done():
        if upload.done() and not upload.cancelled() and upload.exception() is not None:
            return  # the upload failed (the call ended): the caller raises why
        left = deadline - time.monotonic()
        if left <= 0:
            link.mark_hung(stream)
            raise Unavailable(f"cloud verifier: no reply within {within_s:g} s "
                              "of the request (a hung replica?)")
        await asyncio.wait({f for f in (reply, upload) if not f.done()}, timeout=left,
                           return_when=asyncio.FIRST_COMPLETED)
