"""The verifier replicas behind ``--cloud``: where they are, and each one's standing.

``--cloud`` names one address, a ``dns:///NAME:PORT`` that resolves to every replica,
or a list of ``IP:PORT`` replicas (:func:`cloud_target`); a list becomes one
:class:`Replica` per address (:func:`replica_targets`), each with its own channels and a
rest period after it failed to answer. ``eventspec.edge.cloud_link`` opens the channels
and takes the replicas in turn.
"""

from __future__ import annotations

import ipaddress
import math
import time
from dataclasses import dataclass

from grpc import aio

from eventspec.shared.pb.eventspec.v1 import verifier_pb2_grpc
from eventspec.shared.wire.security import SecurityConfigError


def _ip_family(host: str) -> int | None:
    try:
        return ipaddress.ip_address(host.strip("[]")).version
    except ValueError:
        return None


def cloud_target(address: str) -> str:
    """The gRPC target for ``--cloud``: one ``HOST:PORT``, a ``dns:///NAME:PORT`` (every
    address the name resolves to), or a comma-separated list of ``IP:PORT`` replicas."""
    parts = [p.strip() for p in address.split(",") if p.strip()]
    if not parts:
        raise SecurityConfigError("--cloud is empty: give HOST:PORT, dns:///NAME:PORT or a list")
    if len(parts) == 1:
        return parts[0]
    families = set()
    for part in parts:
        host, sep, port = part.rpartition(":")
        family = _ip_family(host)
        if not sep or not port.isdigit() or family is None:
            raise SecurityConfigError(
                f"--cloud {address!r}: a list of replicas must be IP:PORT entries ({part!r} is "
                "not); for names use one dns:///NAME:PORT that resolves to all of them"
            )
        families.add(family)
    if len(families) > 1:
        raise SecurityConfigError(f"--cloud {address!r}: do not mix IPv4 and IPv6 replicas")
    return f"ipv{families.pop()}:{','.join(parts)}"


def replica_targets(target: str) -> list[str]:
    """``ipv4:A,B`` (a list of replicas) -> one target each; anything else is one."""
    scheme, sep, rest = target.partition(":")
    if sep and scheme in ("ipv4", "ipv6") and "," in rest:
        return [f"{scheme}:{one}" for one in rest.split(",")]
    return [target]


@dataclass
class Replica:
    """One verifier the edge can send a request to: its channels and its standing.

    A replica that failed to answer in time sits out until ``resting_until``: gRPC's
    round_robin cannot tell a frozen replica (its connection up, its health stream
    silent) from a busy one, and kept sending it every other request.
    """

    target: str
    channel: aio.Channel
    stub: verifier_pb2_grpc.VerifierStub
    probe_channel: aio.Channel
    probe: verifier_pb2_grpc.VerifierStub
    resting_until: float = -math.inf

    def rest(self, seconds: float) -> None:
        self.resting_until = max(self.resting_until, time.monotonic() + seconds)

    @property
    def resting(self) -> bool:
        return time.monotonic() < self.resting_until

