"""A connection whose calls keep being refused is cut off; others are not (issue 38,
red-team findings 2 and 5).

A real ``GrpcHost`` on port 0 (TLS and bearer tokens, the test CA): one connection keeps
calling without a token. Past the refusal budget its calls are stopped at HEADERS, before
authentication (the auth interceptor sees no more of them), and answered
RESOURCE_EXHAUSTED naming the reason, while another connection's authenticated calls,
made during the cut-off with the flooding connection's calls held, keep succeeding. Once
the flooding connection has been idle for the window, it is forgotten.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest_asyncio
from grpc import aio
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from eventspec.shared.wire.channel import call_metadata, open_channel
from eventspec.shared.wire.host import GrpcHost
from eventspec.shared.wire.refusals import RefusalBudget
from eventspec.shared.wire.security import ClientSecurity
from tests.support import tls_harness as th
from tests.support.grpc_races import CLIENT_RACE
from tests.support.waiting import until

LIMIT = 5
WINDOW_S = 2.0
#: Each client on a connection of its own (gRPC otherwise shares one among a process's
#: channels with the same settings).
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


@pytest_asyncio.fixture
async def host(tmp_path: Path) -> AsyncIterator[tuple[GrpcHost, th.Pki]]:
    (tmp_path / "pki").mkdir()
    pki = th.make_pki(tmp_path / "pki")
    tokens = th.write_tokens(tmp_path / "tokens", edge_a=th.TOKEN_A)
    node = GrpcHost("eventspec.v1.Verifier", max_message_bytes=1 << 20, max_rpcs=8,
                    security=th.server_security(pki, token_file=tokens))
    node.refusals.budget = RefusalBudget(LIMIT, WINDOW_S)
    await node.start("127.0.0.1", 0)
    try:
        yield node, pki
    finally:
        await node.stop(0)


async def _list_services(channel: aio.Channel, security: ClientSecurity) -> list[str]:
    """One reflection call (it needs a credential, as every method but health)."""
    call = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=30,
        metadata=call_metadata(security))
    names: list[str] = []
    async for resp in call:
        names += [s.name for s in resp.list_services_response.service]
    return names


async def _code(channel: aio.Channel, security: ClientSecurity) -> tuple[grpc.StatusCode, str]:
    try:
        await _list_services(channel, security)
    except aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def _refused_as(outcomes: list[tuple[grpc.StatusCode, str]], code: grpc.StatusCode) -> bool:
    """Every call got ``code``, or the client's race hid it (:data:`CLIENT_RACE`); each
    call counts against the budget, so none is retried: the server's side of each refusal
    is asserted from its own counters."""
    return all(c == code or (c, d) == CLIENT_RACE for c, d in outcomes)


async def test_a_flooding_connection_is_cut_off_and_others_are_served(
        host: tuple[GrpcHost, th.Pki]) -> None:
    node, pki = host
    address = f"127.0.0.1:{node.port}"
    denied: list[str] = []
    assert node.auth is not None
    node.auth.on_denied = denied.append
    good_sec = th.client_security(pki, token=th.TOKEN_A)
    bad_sec = th.client_security(pki)  # no token
    async with open_channel(address, good_sec, OWN_CONNECTION) as good, \
            open_channel(address, bad_sec, OWN_CONNECTION) as bad:
        assert "grpc.health.v1.Health" in await _list_services(good, good_sec)
        codes = [await _code(bad, bad_sec) for _ in range(LIMIT + 1)]
        assert _refused_as(codes, grpc.StatusCode.UNAUTHENTICATED), codes
        assert node.refusals.budget.cut_connections == 1
        # Cut off: its calls are held at HEADERS, then refused; auth never sees them.
        held = [asyncio.create_task(_code(bad, bad_sec)) for _ in range(20)]
        await until(lambda: node.refusals.budget.held == 20, "the 20 calls are held")
        for _ in range(5):
            assert "grpc.health.v1.Health" in await _list_services(good, good_sec)
        outcomes = await asyncio.gather(*held)
        assert _refused_as(outcomes, grpc.StatusCode.RESOURCE_EXHAUSTED), outcomes
        assert all("cut off" in d and "unauthenticated" in d
                   for c, d in outcomes if (c, d) != CLIENT_RACE), outcomes
        assert len(denied) == LIMIT + 1, denied
        assert node.refusals.budget.refused_cut == 20
        # The good connection was never counted.
        assert len(node.refusals.budget.windows) == 1


async def test_an_idle_connection_is_forgotten(host: tuple[GrpcHost, th.Pki]) -> None:
    node, pki = host
    address = f"127.0.0.1:{node.port}"
    bad_sec = th.client_security(pki)
    good_sec = th.client_security(pki, token=th.TOKEN_A)
    budget = node.refusals.budget
    async with open_channel(address, bad_sec, OWN_CONNECTION) as bad:
        for _ in range(LIMIT + 1):
            await _code(bad, bad_sec)
        assert budget.cut_connections == 1
        (flooder,) = budget.windows
    # Once it has been idle for the window, any call forgets it.
    async with open_channel(address, good_sec, OWN_CONNECTION) as good:
        deadline = asyncio.get_running_loop().time() + 30
        while flooder in budget.windows:
            assert asyncio.get_running_loop().time() < deadline, budget.windows
            assert await _list_services(good, good_sec)
            await asyncio.sleep(0.1)
    assert not budget.windows
