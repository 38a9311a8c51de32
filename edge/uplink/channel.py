"""The edge's one reused gRPC channel to the cloud verifier (transport only).

Wraps the Verifier stub: GetServerInfo (which also samples the RTT) and Generate
streams with explicit deadlines, converting wire messages to domain types and gRPC
failures into ``eventspec.shared.contract.errors`` with a message that names the cloud.

The cloud may be several replicas (``cloud_target``): a DNS name that resolves to all
of them (``dns:///verifier.ns.svc:50061``, a Kubernetes headless Service) or a list of
addresses. The channel balances calls over them with gRPC's ``round_robin`` and drops
a replica from the rotation while its ``grpc.health.v1`` Watch says it is not serving
(client-side health checking, both through the service config). One Generate call is
one HTTP/2 stream, so a request stays on the replica it started on; moving a failed
request to another replica is ``eventspec.edge.uplink.failover``'s job.

A frozen replica keeps its connection and its last health answer, so neither of those
notices it; the link does: one that did not answer in time leaves the rotation, rests
(``--cloud-rest-s``), and is then probed with GetServerInfo out of band until it answers
(``eventspec.edge.uplink.standing``, ``cloud_replicas.Prober``).

The pieces it is built from: the replicas and ``--cloud`` parsing
(``eventspec.edge.uplink.replicas``), one Generate call (``eventspec.edge.uplink.stream``)
and the mapping of gRPC failures (``eventspec.edge.uplink.errors``).
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from eventspec.edge.readiness import CloudState, CloudView
from eventspec.edge.uplink.errors import rpc_error
from eventspec.edge.uplink.replicas import Prober, Replica, cloud_target, replica_targets
from eventspec.edge.uplink.roles import VerifierStream
from eventspec.edge.uplink.standing import ProbePolicy, ReplicaStanding
from eventspec.edge.uplink.stream import CloudStream
from eventspec.shared.contract import convert_verifier
from eventspec.shared.contract.errors import DeadlineExceeded, EventSpecError, Unavailable
from eventspec.shared.contract.estimators import RttEstimator
from eventspec.shared.contract.types import ServerInfo
from eventspec.shared.node.tracing import outgoing_metadata
from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from eventspec.shared.wire.channel import call_metadata, open_channel
from eventspec.shared.wire.interceptors import WARMING_UP_KEY
from eventspec.shared.wire.options import channel_options
from eventspec.shared.wire.security import ClientSecurity, SecurityConfigError
from eventspec.shared.wire.transport_hint import transport_fault

log = logging.getLogger(__name__)

VERIFIER_SERVICE = verifier_pb2.DESCRIPTOR.services_by_name["Verifier"].full_name

#: round_robin over every resolved replica, each watched through grpc.health.v1; the
#: idempotent GetServerInfo is retried on another replica when one is unavailable.
SERVICE_CONFIG = json.dumps({
    "loadBalancingConfig": [{"round_robin": {}}],
    "healthCheckConfig": {"serviceName": VERIFIER_SERVICE},
    "methodConfig": [{
        "name": [{"service": VERIFIER_SERVICE, "method": "GetServerInfo"}],
        "retryPolicy": {
            "maxAttempts": 3,
            "initialBackoff": "0.05s",
            "maxBackoff": "0.5s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        },
    }],
})

#: How long a replica that did not answer in time rests before its first probe
#: (``--cloud-rest-s``'s default).
REST_S = 30.0

#: The probe channel's config: round_robin over the replicas with no health checking,
#: so a probe reaches a replica that reports NOT_SERVING and hears why.
PROBE_SERVICE_CONFIG = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})


class CloudLink:
    """Reused channels with keepalive to the verifier replicas; tracks reachability and
    RTT, and which replica to use next.

    A list of replicas (``IP:PORT,IP:PORT``) gets one channel each, and the link itself
    takes them in turn, skipping one whose stream was just dropped, and one that froze
    until a probe has heard it answer (unless every one froze); a single address (including
    ``dns:///NAME:PORT``) is one channel that gRPC's round_robin balances over what the
    name resolves to. ``security`` turns on TLS (with a client certificate: mutual TLS)
    and sends its bearer token on every call. ``rest_s``: how long a replica that did
    not answer in time rests before it is probed; ``probe``: how it is probed.
    """

    def __init__(self, address: str, *, max_message_bytes: int = 8 << 20,
                 security: ClientSecurity | None = None, rest_s: float = REST_S,
                 probe: ProbePolicy | None = None) -> None:
        self.address = address
        self.rest_s = rest_s
        policy = probe or ProbePolicy()
        target = cloud_target(address)
        if (target.startswith("ipv") and security is not None and security.tls
                and not security.server_name):
            raise SecurityConfigError(
                f"--cloud {address!r} is a list of addresses: with TLS, set "
                "--cloud-tls-server-name to the name in the replicas' certificates"
            )
        self._metadata = call_metadata(security)
        options: list[tuple[str, Any]] = [
            *channel_options(max_message_bytes),
            ("grpc.service_config", SERVICE_CONFIG),
            ("grpc.enable_retries", 1),
        ]
        probe_options: list[tuple[str, Any]] = [
            *channel_options(max_message_bytes), ("grpc.service_config", PROBE_SERVICE_CONFIG),
        ]
        self.replicas: list[Replica] = []
        for one in replica_targets(target):
            channel = open_channel(one, security, options)
            probe_channel = open_channel(one, security, probe_options)
            self.replicas.append(Replica(
                one, channel, verifier_pb2_grpc.VerifierStub(channel), probe_channel,
                verifier_pb2_grpc.VerifierStub(probe_channel), ReplicaStanding(policy)))
        self._prober = Prober(self.replicas, self._probe, policy)
        self._turn = 0
        self.rtt = RttEstimator()
        self.reachable = False
        self.last_error = ""
        self.info: ServerInfo | None = None
        self._info_at = -math.inf

    def pick(self) -> Replica:
        """The next replica in turn among those that take requests. While none does:
        those resting after a dropped stream, else (every one froze) the frozen ones,
        since there is nowhere else to send the request; they are probed at once."""
        ready = ([r for r in self.replicas if r.takes_requests()]
                 or [r for r in self.replicas if not r.standing.frozen]
                 or self.replicas)
        replica = ready[self._turn % len(ready)]
        self._turn += 1
        return replica

    async def server_info(self, timeout_s: float = 5.0) -> ServerInfo:
        """Fetch GetServerInfo (cached on success); samples the RTT. Tries each replica
        once, in turn, before it gives up; one that times out leaves the rotation."""
        err: EventSpecError | None = None
        for _ in range(len(self.replicas)):
            replica = self.pick()
            try:
                pb = await replica.stub.GetServerInfo(
                    verifier_pb2.GetServerInfoRequest(), timeout=timeout_s,
                    metadata=self._metadata)
            except grpc.RpcError as exc:
                # Every caller polls and diagnoses a failure (CloudLink.diagnose); the
                # edge's watcher logs the cause, once per change (edge/server.py).
                err = rpc_error(exc, replica.target, "GetServerInfo", log_failure=False)
                if isinstance(err, DeadlineExceeded):
                    self._froze(replica, "did not answer GetServerInfo in time")
                if not isinstance(err, DeadlineExceeded | Unavailable):
                    break
                continue
            self.reachable, self.last_error = True, ""
            self.info = convert_verifier.server_info_from_pb(pb)
            self._info_at = time.monotonic()
            return self.info
        assert err is not None
        self.reachable, self.last_error = False, err.message
        raise err

    async def sample_rtt(self, timeout_s: float = 2.0, pings: int = 3) -> float | None:
        """One RTT sample (ms) into ``self.rtt``: the fastest of ``pings`` grpc.health.v1
        Checks on a replica's probe channel; None if one fails (nothing is folded in).

        Why not time GetServerInfo, as before: the cloud answers it after gathering its
        limits and costs, on a loop that may be busy calibrating, and the first call
        also set up the connection; a loopback link read 142 ms and 308 ms. Health
        costs the server nearly nothing, and the fastest of a few leaves out a moment
        when either loop was busy: what remains is the network's round trip.
        """
        replica = self.pick()
        stub = health_pb2_grpc.HealthStub(replica.probe_channel)
        best: float | None = None
        for _ in range(pings):
            t0 = time.perf_counter()
            try:
                await stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
            except grpc.RpcError:
                return None
            ms = (time.perf_counter() - t0) * 1e3
            best = ms if best is None else min(best, ms)
        assert best is not None
        self.rtt.update(best)
        return best

    def fresh_info(self, max_age_s: float) -> ServerInfo | None:
        """The last GetServerInfo answer if it is younger than ``max_age_s``; None
        otherwise (every replica serves the same model, so any one's answer will do).

        An Ask uses it instead of calling GetServerInfo itself, so it makes one call
        (Generate), not two: with round_robin over two replicas, two calls per Ask sent
        every Generate to the same replica.
        """
        if time.monotonic() - self._info_at > max_age_s:
            return None
        return self.info

    async def diagnose(self, timeout_s: float = 5.0) -> CloudView:
        """Why the cloud does not answer through the balanced channels.

        Those hide a replica whose health is NOT_SERVING (client-side health checking),
        so their calls fail with a bare UNAVAILABLE whether the cloud is warming up,
        down, or not a Verifier at all. The probe channel calls GetServerInfo without
        health checking and reads the answer: the warming-up phase from the trailing
        metadata, UNIMPLEMENTED from a server that is not a Verifier, or a transport
        failure.
        """
        replica = self.pick()
        try:
            await replica.probe.GetServerInfo(verifier_pb2.GetServerInfoRequest(),
                                              timeout=timeout_s, metadata=self._metadata)
        except aio.AioRpcError as exc:
            view = _view_of(exc)
        else:
            # It answers. Just after it turned SERVING the balanced channel's health
            # watch may not have caught up: ready, not a warning. NOT_SERVING (draining,
            # its engine down) is the cause to name.
            if await self._probe_serving(replica, timeout_s):
                return CloudView(CloudState.READY)
            view = CloudView(CloudState.UNREACHABLE, "it answers but reports NOT_SERVING")
        self.reachable, self.last_error = False, view.describe()
        return view

    @staticmethod
    async def _probe_serving(replica: Replica, timeout_s: float) -> bool:
        """Whether ``replica``'s health says SERVING, asked on its probe channel."""
        stub = health_pb2_grpc.HealthStub(replica.probe_channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def open_stream(self, timeout_s: float) -> CloudStream:
        """Start a Generate call with a deadline of ``timeout_s`` on the next replica."""
        replica = self.pick()
        call = replica.stub.Generate(timeout=timeout_s,
                                     metadata=self._metadata + outgoing_metadata())
        return CloudStream(call, replica.target, replica)

    def mark_failure(self, err: EventSpecError) -> None:
        self.reachable, self.last_error = False, err.message

    def mark_hung(self, stream: VerifierStream) -> None:
        """``stream``'s replica did not answer in time: it leaves the rotation while the
        others take the requests, and comes back once a probe hears it answer."""
        replica = getattr(stream, "replica", None)
        if isinstance(replica, Replica):
            self._froze(replica, "did not answer in time")

    def _froze(self, replica: Replica, why: str) -> None:
        """Take ``replica`` out of rotation (rest, then probes), logged once per outage."""
        if replica.froze(self.rest_s):
            log.warning("cloud replica %s %s; out of rotation: resting %g s, then probed "
                        "until it answers", replica.target, why, self.rest_s)
        self._prober.wake()

    async def _probe(self, replica: Replica, timeout_s: float) -> None:
        """The out-of-band probe: GetServerInfo on the probe channel. It reaches the
        Verifier service itself (a process whose Verifier handlers hang may still answer
        a health Check), and a cloud that is warming up refuses it."""
        await replica.probe.GetServerInfo(verifier_pb2.GetServerInfoRequest(),
                                          timeout=timeout_s, metadata=self._metadata)

    async def close(self) -> None:
        await self._prober.close()
        for replica in self.replicas:
            await replica.channel.close()
            await replica.probe_channel.close()


def _view_of(exc: aio.AioRpcError) -> CloudView:
    """The cloud's state from a failed probe call."""
    for key, value in exc.trailing_metadata() or ():
        if key == WARMING_UP_KEY:
            return CloudView(CloudState.WARMING_UP, str(value))
    code = exc.code()
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return CloudView(CloudState.NOT_A_VERIFIER)
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return CloudView(CloudState.REFUSED, code.name)
    fault = transport_fault(exc.details() or "", tls=False)
    detail = f"{code.name}" if code else ""
    return CloudView(CloudState.UNREACHABLE,
                     f"{detail}: {fault.cause}" if fault is not None else detail)
