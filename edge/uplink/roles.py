"""The edge's view of the cloud verifier, as Protocols: what the agent needs of a link.

``eventspec.edge.uplink.channel`` (the link) and ``eventspec.edge.uplink.stream`` (a stream)
implement them over gRPC; tests implement them in memory, so the agent and its session
run without a network.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from eventspec.edge.readiness import CloudView
from eventspec.shared.contract.convert_verifier import CloudOutbound, EdgeInbound
from eventspec.shared.contract.errors import EventSpecError
from eventspec.shared.contract.estimators import RttEstimator
from eventspec.shared.contract.types import ServerInfo


class VerifierStream(Protocol):
    """One Generate call: send the edge's messages, iterate the cloud's replies."""

    uplink_bytes: int
    downlink_bytes: int

    async def send(self, msg: EdgeInbound, *, best_effort: bool = False) -> None:
        """Write one message; a ``best_effort`` write to a finished call is dropped."""
        ...

    async def done_writing(self) -> None: ...

    def replies(self) -> AsyncIterator[CloudOutbound]: ...

    def cancel(self) -> None: ...


class VerifierLink(Protocol):
    """A reused connection to one verifier (or a set of replicas behind one name)."""

    address: str
    rtt: RttEstimator
    reachable: bool
    last_error: str
    info: ServerInfo | None

    async def server_info(self, timeout_s: float = 5.0) -> ServerInfo: ...

    def fresh_info(self, max_age_s: float) -> ServerInfo | None:
        """The cached GetServerInfo answer when recent enough, else None."""
        ...

    async def diagnose(self, timeout_s: float = 5.0) -> CloudView:
        """Why the verifier does not answer: warming up (with its phase), unreachable,
        or not a Verifier."""
        ...

    def open_stream(self, timeout_s: float) -> VerifierStream: ...

    def mark_failure(self, err: EventSpecError) -> None: ...

    def mark_hung(self, stream: VerifierStream) -> None:
        """``stream``'s replica did not answer in time: send the next requests elsewhere."""
        ...

    async def close(self) -> None: ...
