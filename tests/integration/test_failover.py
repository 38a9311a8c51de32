"""Three cloud replicas behind round_robin (the toy target, paced so a request takes a
while): a replica killed mid-request is failed over only when nothing was committed,
the answer is identical to target-only, and load spreads over the survivors."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from eventspec.cloud.engine.hf import HFEngine
from eventspec.cloud.engine.paced import PacedEngine
from eventspec.cloud.server import VerifierServer
from eventspec.edge.uplink.channel import CloudLink
from eventspec.edge.uplink.failover import with_failover
from eventspec.edge.uplink.replicas import cloud_target
from eventspec.shared.client.launch import entry_point_command
from eventspec.shared.contract.errors import Unavailable
from eventspec.shared.contract.timing import TimingPlan
from eventspec.shared.contract.types import CommitEvent, DoneEvent, GenerationSettings, OpenRequest
from eventspec.shared.wire.health import wait_for_serving
from eventspec.shared.wire.security import SecurityConfigError
from tests.support import cloud_harness as ch
from tests.support import edge_harness as eh

QUESTION = "What is moving?"
PREFILL_S, STEP_S = 0.6, 0.08
MAX_NEW = 8

toy_target = eh.toy_target


@dataclass
class Replicas:
    servers: list[VerifierServer]
    link: CloudLink

    def serving(self) -> list[int]:
        return [i for i, s in enumerate(self.servers) if s.live_sessions]


@pytest.fixture
async def replicas() -> AsyncIterator[Replicas]:
    target = toy_target()
    servers = []
    for _ in range(3):
        engine = PacedEngine(HFEngine(target), prefill_ms=PREFILL_S * 1e3, step_ms=STEP_S * 1e3)
        server = VerifierServer(ch.settings(max_sessions=4), target=target, engine=engine,
                                cost=eh.slow_cost(PREFILL_S, STEP_S))
        await server.start()
        servers.append(server)
    link = CloudLink(",".join(f"127.0.0.1:{s.port}" for s in servers))
    await link.server_info(5.0)
    yield Replicas(servers, link)
    await link.close()
    for s in servers:
        await s.stop(0)


def open_request(seed: int = 0) -> OpenRequest:
    return OpenRequest(
        request_id="failover",
        question=QUESTION,
        generation=GenerationSettings(max_new_tokens=MAX_NEW, seed=seed),
        frames=ch.make_frames(seed),
        aligned=None,
        edge_cost=None,
        deadline_ms=60_000,
        speculative=False,
    )


async def generate(link: CloudLink, req: OpenRequest, planned: list[str] | None = None
                   ) -> AsyncIterator[CommitEvent | DoneEvent]:
    """One target-only Generate attempt over the edge's real transport; the replica is
    appended to ``planned`` when its Plan arrives (the request is admitted, in prefill)."""
    stream = link.open_stream(60.0)
    finished = False
    try:
        await stream.send(req)
        async for msg in stream.replies():
            if isinstance(msg, TimingPlan) and planned is not None:
                planned.append(stream.replica.target if stream.replica else "")
            if isinstance(msg, CommitEvent | DoneEvent):
                yield msg
            if isinstance(msg, DoneEvent):
                finished = True
                await stream.done_writing()
                return
        raise Unavailable("the cloud closed the stream without Done")
    finally:
        if not finished:
            stream.cancel()


async def answer(link: CloudLink, req: OpenRequest, attempts: list[int] | None = None,
                 planned: list[str] | None = None) -> tuple[int, ...]:
    def attempt(n: int) -> AsyncIterator[CommitEvent | DoneEvent]:
        if attempts is not None:
            attempts.append(n)
        return generate(link, req, planned)

    async for event in with_failover(attempt):
        if isinstance(event, DoneEvent):
            return tuple(event.token_ids)
    raise AssertionError("no Done")


async def wait_until(pred: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


async def test_replica_killed_before_commit_is_retried_on_another(replicas: Replicas) -> None:
    req = open_request()
    baseline = await answer(replicas.link, req)
    assert len(baseline) > 0
    await wait_until(lambda: not replicas.serving())  # the baseline's session is released
    attempts: list[int] = []
    task = asyncio.create_task(answer(replicas.link, req, attempts))
    await wait_until(lambda: replicas.serving())  # the Open reached a replica: prefill runs
    [victim] = replicas.serving()
    await replicas.servers[victim].stop(0)  # dies during prefill: nothing committed yet
    got = await asyncio.wait_for(task, 30)
    assert got == baseline
    assert attempts == [0, 1]


async def test_replica_killed_after_a_commit_fails_clearly(replicas: Replicas) -> None:
    req = open_request(seed=1)
    seen: list[CommitEvent | DoneEvent] = []

    async def run() -> None:
        async for event in with_failover(lambda n: generate(replicas.link, req)):
            seen.append(event)

    task = asyncio.create_task(run())
    await wait_until(lambda: any(isinstance(e, CommitEvent) for e in seen))
    [victim] = replicas.serving()
    await replicas.servers[victim].stop(0)
    with pytest.raises(Unavailable, match="not retried"):
        await asyncio.wait_for(task, 30)
    assert not any(isinstance(e, DoneEvent) for e in seen)  # no answer, no mixed answer


async def test_load_spreads_over_the_survivors(replicas: Replicas) -> None:
    await replicas.servers[0].stop(0)
    survivors = replicas.servers[1:]
    peak = [0, 0]

    async def watch() -> None:
        while True:
            for i, s in enumerate(survivors):
                peak[i] = max(peak[i], s.live_sessions)
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    try:
        reqs = [open_request(seed=i) for i in range(4)]
        results = await asyncio.gather(*(answer(replicas.link, r) for r in reqs))
    finally:
        watcher.cancel()
    assert all(results)
    assert peak[0] >= 1 and peak[1] >= 1, peak  # both survivors served, the dead one none
    assert replicas.servers[0].live_sessions == 0


def test_cloud_target_forms() -> None:
    assert cloud_target("verifier:50061") == "verifier:50061"
    assert cloud_target("dns:///verifier.ns.svc:50061") == "dns:///verifier.ns.svc:50061"
    assert cloud_target("10.0.0.1:1, 10.0.0.2:2") == "ipv4:10.0.0.1:1,10.0.0.2:2"
    assert cloud_target("[::1]:1,[::1]:2") == "ipv6:[::1]:1,[::1]:2"
    with pytest.raises(SecurityConfigError, match="dns:///NAME:PORT"):
        cloud_target("a.example:1,b.example:2")


async def test_a_replica_reporting_not_serving_gets_no_new_requests(replicas: Replicas) -> None:
    """Client-side health checking: the edge's channel watches grpc.health.v1 on every
    replica (the service config's healthCheckConfig) and skips one that is draining."""
    draining = replicas.servers[0]
    assert draining._host is not None
    await draining._host.set_serving(False)
    # The channel's health Watch has delivered NOT_SERVING: the replica is out of rotation.
    channel = replicas.link.replicas[0].channel
    await wait_until(lambda: channel.get_state(try_to_connect=True)
                     == grpc.ChannelConnectivity.TRANSIENT_FAILURE)
    peak = [0, 0, 0]

    async def watch() -> None:
        while True:
            for i, s in enumerate(replicas.servers):
                peak[i] = max(peak[i], s.live_sessions)
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.gather(*(answer(replicas.link, open_request(seed=i)) for i in range(4)))
    finally:
        watcher.cancel()
    assert peak[0] == 0, peak
    assert peak[1] >= 1 and peak[2] >= 1, peak


async def test_replica_killed_with_sigkill_mid_prefill(tmp_path: Path) -> None:
    """A real crash: a replica process killed with SIGKILL (connection reset, no goodbye)
    while its request is in prefill. The request reruns on the survivor, unchanged."""
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        entry_point_command("eventspec-cloud", [
            "serve", "--model", "toy", "--port", "0", "--port-file",
            str(port_file), "--emulate-prefill-ms", "2000", "--emulate-step-ms", "50",
            "--log-level", "WARNING"]),
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    target = toy_target()
    survivor = VerifierServer(ch.settings(max_sessions=4), target=target,
                              engine=PacedEngine(HFEngine(target), prefill_ms=300, step_ms=20),
                              cost=eh.slow_cost(0.3, 0.02))
    await survivor.start()
    link: CloudLink | None = None
    try:
        deadline = time.monotonic() + 180
        while not (port_file.exists() and port_file.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "replica did not start"
            await asyncio.sleep(0.2)
        # The port is written at bind time; the replica serves once warm.
        await wait_for_serving(f"127.0.0.1:{port_file.read_text()}", timeout_s=180)
        link = CloudLink(f"127.0.0.1:{port_file.read_text()},127.0.0.1:{survivor.port}")
        await link.server_info(10.0)
        req = open_request(seed=3)
        baseline = await answer(link, req)
        await wait_until(lambda: survivor.live_sessions == 0)
        # Two at once: round_robin puts one on each replica.
        attempts: list[int] = []
        planned: list[str] = []
        both = asyncio.gather(answer(link, req, attempts, planned),
                              answer(link, req, attempts, planned))
        await wait_until(lambda: survivor.live_sessions == 1, timeout=20)
        # Both have their Plan: the other one is now in the process's 2 s prefill.
        process = link.replicas[0].target
        await wait_until(lambda: process in planned, timeout=20)
        proc.send_signal(signal.SIGKILL)
        results = await asyncio.wait_for(both, 60)
        assert list(results) == [baseline, baseline]
        assert sorted(attempts) == [0, 0, 1]  # exactly one request was rerun
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if link is not None:
            await link.close()
        await survivor.stop(0)
