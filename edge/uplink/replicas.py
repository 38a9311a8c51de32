"""The verifier replicas behind ``--cloud``: where they are, and each one's standing.

``--cloud`` names one address, a ``dns:///NAME:PORT`` that resolves to every replica,
or a list of ``IP:PORT`` replicas (:func:`cloud_target`); a list becomes one
:class:`Replica` per address (:func:`replica_targets`), each with its own channels and
its standing (``eventspec.edge.uplink.standing``): a replica that froze is out of
rotation until the :class:`Prober` hears it answer. ``eventspec.edge.uplink.channel`` opens
the channels and takes the replicas in turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from grpc import aio

from eventspec.edge.uplink.standing import ProbePolicy, ReplicaStanding
from eventspec.shared.pb.eventspec.v1 import verifier_pb2_grpc
from eventspec.shared.wire.security import SecurityConfigError

log = logging.getLogger(__name__)


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

    gRPC's round_robin cannot tell a frozen replica (its connection up, its health
    stream silent) from a busy one, and kept sending it every other request; so a
    replica that failed to answer in time leaves the rotation (:meth:`froze`) until a
    probe hears it answer, and one whose stream was dropped rests a moment (:meth:`rest`).
    """

    target: str
    channel: aio.Channel
    stub: verifier_pb2_grpc.VerifierStub
    probe_channel: aio.Channel
    probe: verifier_pb2_grpc.VerifierStub
    standing: ReplicaStanding = field(default_factory=ReplicaStanding)

    def rest(self, seconds: float) -> None:
        """Its stream was dropped: no requests for ``seconds`` while others take them."""
        self.standing.dropped(time.monotonic(), seconds)

    def froze(self, seconds: float) -> bool:
        """It did not answer in time: out of rotation until a probe answers, the first
        after ``seconds``. True when this took it out."""
        return self.standing.froze(time.monotonic(), seconds)

    def takes_requests(self) -> bool:
        return self.standing.takes_requests(time.monotonic())


#: One probe: returns once the replica answers within the deadline (s), raises if not.
ProbeCall = Callable[[Replica, float], Awaitable[object]]


class Prober:
    """Probes the replicas that froze, out of band, until each answers.

    One background task, started when a replica leaves the rotation and ended when none
    is out, so replicas that never fail cost nothing, and no Ask waits for a probe.
    """

    def __init__(self, replicas: Sequence[Replica], probe: ProbeCall,
                 policy: ProbePolicy) -> None:
        self._replicas = replicas
        self._probe = probe
        self._policy = policy
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """A replica left the rotation: look again at what to probe (on the running loop)."""
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            out = [r for r in self._replicas if r.standing.frozen]
            if not out:
                return
            # With every replica out there is nowhere else to send a request: probe at
            # once rather than wait out the rests.
            nowhere_else = len(out) == len(self._replicas)
            now = time.monotonic()
            due = [r for r in out if r.standing.probe_due(now, nowhere_else=nowhere_else)]
            if due:
                await asyncio.gather(*(self._probe_one(r) for r in due))
                continue
            wake_at = min(r.standing.next_probe_at(nowhere_else=nowhere_else) for r in out)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, wake_at - now))

    async def _probe_one(self, replica: Replica) -> None:
        """One probe; the replica goes back into rotation when it answers."""
        try:
            await self._probe(replica, self._policy.timeout_s)
        except Exception as exc:  # any failure keeps it out: it must answer to come back
            self._failed(replica, exc)
            return
        out_s = replica.standing.probe_passed(time.monotonic())
        log.info("cloud replica %s answered a probe; back in rotation after %.1f s out",
                 replica.target, out_s)

    def _failed(self, replica: Replica, exc: Exception) -> None:
        """Logged loudly the first time and then once a minute (a replica frozen for an
        hour is probed hundreds of times), at DEBUG in between."""
        standing = replica.standing
        now = time.monotonic()
        loud = standing.probe_failed(now)
        since = now if standing.out_since is None else standing.out_since
        log.log(logging.WARNING if loud else logging.DEBUG,
                "cloud replica %s does not answer its probe (%s); out of rotation for %.0f s "
                "(probes failed: %d), next probe in %.1f s", replica.target, _describe(exc),
                now - since, standing.failed_probes, standing.retry_at - now)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, aio.AioRpcError):
        return f"{exc.code().name}: {exc.details() or ''}".rstrip(": ")
    return f"{type(exc).__name__}: {exc}"
