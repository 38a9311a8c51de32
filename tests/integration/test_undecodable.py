"""Bytes that are not the request message (issue 19, item 9): every method of both
services answers INVALID_ARGUMENT naming the method, not UNKNOWN ("Unexpected <class
'DecodeError'>"), and the server goes on serving."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio
from grpc import aio

from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from tests.support import edge_harness as eh

pytestmark = pytest.mark.asyncio(loop_scope="module")

#: Field 1, length-delimited, declares 127 bytes and brings 2: no message parses it.
GARBAGE = b"\x0a\x7f\x01\x02"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack() -> AsyncIterator[eh.Stack]:
    s = await eh.start_stack()
    yield s
    await s.stop()


async def _call(address: str, method: str, kind: str) -> aio.AioRpcError:
    async with aio.insecure_channel(address) as channel:
        with pytest.raises(aio.AioRpcError) as err:
            if kind == "unary_unary":
                await channel.unary_unary(method)(GARBAGE, timeout=10)
            elif kind == "unary_stream":
                async for _ in channel.unary_stream(method)(GARBAGE, timeout=10):
                    pass
            else:
                call = channel.stream_stream(method)(timeout=10)
                await call.write(GARBAGE)
                await call.read()
    return err.value


@pytest.mark.parametrize(("node", "method", "kind"), [
    ("cloud", "/eventspec.v1.Verifier/GetServerInfo", "unary_unary"),
    ("cloud", "/eventspec.v1.Verifier/Generate", "stream_stream"),
    ("cloud", "/grpc.health.v1.Health/Check", "unary_unary"),
    ("edge", "/eventspec.v1.EdgeAgent/Ask", "unary_stream"),
    ("edge", "/eventspec.v1.EdgeAgent/GetStatus", "unary_unary"),
    ("edge", "/grpc.health.v1.Health/Check", "unary_unary"),
])
async def test_undecodable_request_is_invalid_argument(stack: eh.Stack, node: str, method: str,
                                                       kind: str) -> None:
    port = stack.cloud.port if node == "cloud" else stack.edge.port
    err = await _call(f"127.0.0.1:{port}", method, kind)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
    assert "malformed" in (err.details() or ""), err.details()
    assert method.rsplit("/", 1)[1] in (err.details() or ""), err.details()
    async with aio.insecure_channel(f"127.0.0.1:{stack.cloud.port}") as channel:
        info = await verifier_pb2_grpc.VerifierStub(channel).GetServerInfo(
            verifier_pb2.GetServerInfoRequest(), timeout=10)
    assert info.model_id
