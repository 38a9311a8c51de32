"""A replica that froze (issue 38, red-team finding 6): it accepts calls and answers
nothing, while its health still says SERVING. It used to come back into rotation after
each rest, and the next Ask sent to it waited the first-reply timeout again (about 13%
of Asks waited 5.6 s). Now, once its rest is over, it is probed out of band and takes
Asks again only after a probe answers.

A real verifier and a real grpc.aio replica that freezes and thaws (forwarding to that
verifier while thawed), both on port 0; the rest is made short through its setting, and
every wait is a bounded condition.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from eventspec.edge.uplink.channel import CloudLink
from eventspec.shared.client.edge_client import EdgeClient
from eventspec.shared.contract.errors import DeadlineExceeded
from eventspec.shared.contract.types import AskSpec, GenerationSettings, Mode
from tests.support import cloud_harness as ch
from tests.support.edge_harness import edge_to, shared_models
from tests.support.frozen_replica import FreezableReplica
from tests.support.waiting import until

ASK = AskSpec(question="What is moving?", mode=Mode.TARGET_ONLY,
              generation=GenerationSettings(max_new_tokens=4))
#: An Ask that meets a frozen replica waits this long, then fails over: any Ask that
#: takes as long met it.
FIRST_REPLY_S = 4.0
REST_S = 0.5


@contextlib.asynccontextmanager
async def good_and_freezable() -> AsyncIterator[tuple[int, FreezableReplica, int]]:
    """A real verifier's port, and a freezable replica in front of it with its port."""
    target, _ = shared_models()
    good = await ch.start_verifier(target)
    replica = FreezableReplica(f"127.0.0.1:{good.port}")
    port = await replica.start()
    try:
        yield good.port, replica, port
    finally:
        await replica.stop()
        await good.stop(0)


async def timed_ask(port: int) -> float:
    """Seconds one Ask took; it must be answered."""
    started = time.monotonic()
    async with EdgeClient(f"127.0.0.1:{port}", timeout_s=60) as client:
        final = await client.ask_final(ASK)
    assert final.token_ids
    return time.monotonic() - started


async def test_a_frozen_replica_gets_no_ask_until_a_probe_answers() -> None:
    async with good_and_freezable() as (good_port, replica, port), edge_to(
            f"127.0.0.1:{good_port},127.0.0.1:{port}", cloud_first_reply_s=FIRST_REPLY_S,
            cloud_rest_s=REST_S) as edge:
        link = edge.agent.link if edge.agent is not None else None
        assert isinstance(link, CloudLink)
        frozen = link.replicas[1]
        for _ in range(4):  # both replicas serve
            await timed_ask(edge.port)
        assert replica.forwarded >= 1

        replica.freeze()
        for _ in range(6):  # the first Ask (or GetServerInfo) that meets it takes it out
            await timed_ask(edge.port)
            if frozen.standing.frozen:
                break
        assert frozen.standing.frozen and not frozen.takes_requests()
        met = replica.opened

        # Its rest runs out many times over, and it is probed, while Asks keep coming:
        # none is sent to it, and none waits for the first-reply timeout.
        out_at, took = time.monotonic(), []
        while time.monotonic() - out_at < 8 * REST_S or frozen.standing.failed_probes < 2:
            took.append(await timed_ask(edge.port))
            assert took[-1] < FIRST_REPLY_S, f"an Ask met the frozen replica: {took}"
            assert time.monotonic() - out_at < 60, "the frozen replica was not probed"
        assert replica.opened == met, "an Ask was sent to the replica while it was frozen"
        assert not frozen.takes_requests()

        # Thawed: a probe puts it back, and Asks reach it again.
        replica.thaw()
        await until(frozen.takes_requests, "a probe to put the thawed replica back",
                    timeout_s=15)
        forwarded = replica.forwarded
        for _ in range(6):
            await timed_ask(edge.port)
            if replica.forwarded > forwarded:
                break
        assert replica.forwarded > forwarded, "no Ask reached the replica once it was back"


async def test_with_no_other_replica_the_probes_start_at_once() -> None:
    """The only replica froze: there is nowhere else to send a request, so it is still
    the one picked (refusing every Ask instead would turn one slow answer into an
    outage), and it is probed without waiting out its rest: back in rotation as soon as
    it answers, not 60 s later."""
    async with good_and_freezable() as (_, replica, port):
        link = CloudLink(f"127.0.0.1:{port}", rest_s=60.0)
        try:
            assert (await link.server_info(10.0)).model_id
            replica.freeze()
            with pytest.raises(DeadlineExceeded):
                await link.server_info(0.5)
            [only] = link.replicas
            assert only.standing.frozen and not only.takes_requests()
            assert link.pick() is only
            replica.thaw()
            await until(only.takes_requests, "a probe to put the thawed replica back",
                        timeout_s=15)
            assert (await link.server_info(5.0)).model_id
        finally:
            await link.close()
