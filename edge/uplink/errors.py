"""gRPC failures talking to the cloud verifier, as domain errors an Ask caller may read.

Every call the edge makes to the cloud (``eventspec.edge.uplink.channel``,
``eventspec.edge.uplink.stream``) ends up here when it fails: the full status goes to the
edge's log for its operator, and the error passed on to the edge's clients names no
address and no hint meant for that operator. Kept apart so that rule is stated once.
"""

from __future__ import annotations

import logging

import grpc
from grpc import aio

from eventspec.shared.contract.errors import (
    DeadlineExceeded,
    EventSpecError,
    InvalidInput,
    ResourceExhausted,
    Unavailable,
)
from eventspec.shared.node.logsafe import scrub_addresses, scrub_operator_hints
from eventspec.shared.wire.status import from_grpc

log = logging.getLogger(__name__)


def rpc_error(exc: grpc.RpcError, address: str, what: str, *,
              log_failure: bool = True) -> EventSpecError:
    """Map a gRPC failure talking to the cloud onto a domain error.

    The message goes to the edge's clients, so it names no address: the operator finds
    the cloud's address with the same message in the edge's log. ``log_failure`` False:
    a poll whose caller diagnoses and logs the cause itself (rate-limited), instead of
    one raw line per poll ("backend unhealthy" for a cloud that is warming up).
    """
    code = exc.code() if isinstance(exc, aio.AioRpcError) else None
    details = (exc.details() if isinstance(exc, aio.AioRpcError) else str(exc)) or ""
    return status_error(code, details, address, what, log_failure=log_failure)


def status_error(code: grpc.StatusCode | None, details: str, address: str,
                 what: str, *, log_failure: bool = True) -> EventSpecError:
    """``rpc_error`` from a status code and its details (a call's final status)."""
    if log_failure:
        log.warning("cloud verifier at %s: %s failed: %s %s", address, what,
                    code.name if code else "", details)
    message = f"cloud verifier: {what} failed: {_for_clients(code, details)}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DeadlineExceeded(message)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidInput(message)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return ResourceExhausted(message)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, None):
        return Unavailable(message)
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        # The edge's own credentials were refused: to the edge's client this is the cloud
        # being unavailable, not the client's credentials being wrong.
        if log_failure:
            log.error("the cloud verifier at %s refused this edge (%s): check "
                      "--cloud-tls-cert and --cloud-token-file against its --allow-principal",
                      address, code.name)
        return Unavailable(f"cloud verifier: {what} failed: it refused this edge ({code.name})")
    return EventSpecError(message, from_grpc(code))


#: Statuses the channel itself raises for a cloud it cannot reach; their details name
#: the address it tried, so clients get this text instead.
_TRANSPORT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                    grpc.StatusCode.UNKNOWN, None)


def _for_clients(code: grpc.StatusCode | None, details: str) -> str:
    """What an Ask caller may read of the cloud's error: no internal address, no hint
    meant for the edge's operator (who has the full detail in the edge's log)."""
    if code in _TRANSPORT_CODES:
        return f"the cloud verifier is unreachable ({code.name if code else 'UNAVAILABLE'})"
    return scrub_operator_hints(scrub_addresses(details))
