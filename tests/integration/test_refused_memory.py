"""A refused call keeps none of its request once it has ended, and a connection gets few
calls read before any credential (issue 38, red-team finding 1).

600 refused 4 MiB calls grew a node by 1-2.7 GB for good: ``grpc.aio`` kept the state of
every request-streaming call whose stream was not read to its end (every call is one
here, ``eventspec.shared.wire.gate``), and the exception a call was aborted with, whose
frames held the request, lived in a reference cycle with that state, which only a full
garbage collection breaks. The check here: with the cyclic collector off, no copy of the
request is left on the server once its calls have ended. The memory itself, process and
all, is measured by ``benchmarks/bench_refused_memory.py``.

Health needs no credential, so its requests are read whole from anyone, up to the
message cap: a connection may have ``OPEN_READS_PER_CONNECTION`` of them waiting for
their message, and the next is refused before it is read.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.wire.gate import OPEN_READS_PER_CONNECTION
from eventspec.shared.wire.host import GrpcHost
from eventspec.shared.wire.refusals import RefusalBudget
from eventspec.shared.wire.security import ServerSecurity
from tests.support.waiting import until

TOKEN = "tests-0123456789abcdef0123456789abcdef"
#: Under the 8 MiB cap, and a length no other object in the process has.
SIZE = (3 << 20) + 7
CALLS = 24
CONCURRENCY = 4
UPLOAD = "/test.Refusing/Upload"


async def _refuse_after_reading(requests: AsyncIterator[bytes], context: Any
                                ) -> AsyncIterator[bytes]:
    """A stream handler that reads a message and refuses it, as the cloud refuses an
    Open whose frame is over its cap (the refusal is raised inside the frames that hold
    the message)."""
    async for message in requests:
        raise InvalidInput(f"a {len(message)}-byte message is over this test's cap")
    yield b""


@pytest.fixture
def no_cyclic_gc() -> Iterator[None]:
    """Only reference counting frees memory: what a reference cycle holds stays held."""
    was = gc.isenabled()
    gc.disable()
    yield
    if was:
        gc.enable()


def _server_copies(sent: bytes) -> int:
    """Objects of the request's size alive in this process, the client's own aside."""
    return sum(1 for o in gc.get_objects() for r in gc.get_referents(o)
               if type(r) is bytes and len(r) == SIZE and r is not sent)


@pytest.mark.parametrize("method,authenticated,code", [
    # Health is open: unauthenticated, read whole, refused by the parse.
    ("/grpc.health.v1.Health/Check", False, grpc.StatusCode.INVALID_ARGUMENT),
    # A stream refused from inside the handler, after reading its first message.
    (UPLOAD, True, grpc.StatusCode.INVALID_ARGUMENT),
])
async def test_refused_calls_keep_no_copy_of_their_request(
        no_cyclic_gc: None, method: str, authenticated: bool, code: grpc.StatusCode) -> None:
    host = GrpcHost("test.Refusing", max_message_bytes=8 << 20, max_rpcs=64,
                    security=ServerSecurity(tokens=(("tests", TOKEN),)))
    host.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "test.Refusing", {"Upload": grpc.stream_stream_rpc_method_handler(
            _refuse_after_reading)}),))
    # What one refusal leaves is measured here: past the refused-call budget
    # (``eventspec.shared.wire.refusals``, its own test) the connection's calls would be
    # held instead of read.
    host.refusals.budget = RefusalBudget(limit=CALLS)
    port = await host.start("127.0.0.1", 0)
    await host.set_serving(True)
    # A length-delimited field 1 that is not UTF-8: not a HealthCheckRequest.
    sent = b"\x0a\x80\x80\xc0\x01" + b"\xff" * (SIZE - 5)
    assert len(sent) == SIZE
    metadata = (("authorization", f"Bearer {TOKEN}"),) if authenticated else ()
    codes: list[grpc.StatusCode] = []
    try:
        async with aio.insecure_channel(
                f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 16 << 20)]
        ) as channel:
            unary = channel.unary_unary(method)
            stream = channel.stream_stream(method)

            async def caller(n: int) -> None:
                for _ in range(n):
                    try:
                        if method == UPLOAD:
                            async for _reply in stream(iter([sent]), metadata=metadata,
                                                       timeout=30):
                                pass
                        else:
                            await unary(sent, metadata=metadata, timeout=30)
                    except aio.AioRpcError as exc:
                        codes.append(exc.code())

            await asyncio.gather(*(caller(CALLS // CONCURRENCY) for _ in range(CONCURRENCY)))
        assert codes == [code] * CALLS
        await until(lambda: _server_copies(sent) == 0,
                    "the server holds no copy of a refused request")
    finally:
        await host.stop(0)


async def test_a_connection_gets_few_health_calls_read_at_once() -> None:
    host = GrpcHost("test.Refusing", max_message_bytes=8 << 20, max_rpcs=64,
                    security=ServerSecurity(tokens=(("tests", TOKEN),)))
    port = await host.start("127.0.0.1", 0)
    await host.set_serving(True)
    address = f"127.0.0.1:{port}"
    check = "/grpc.health.v1.Health/Check"
    request = health_pb2.HealthCheckRequest().SerializeToString()
    send = asyncio.Event()

    async def held_back() -> AsyncIterator[bytes]:
        await send.wait()
        yield request

    try:
        # A private subchannel each: a connection of their own.
        async with aio.insecure_channel(address, options=[("test.connection", 1)]) as one, \
                aio.insecure_channel(address, options=[("test.connection", 2)]) as two:
            waiting = [one.stream_unary(check)(held_back(), timeout=30)
                       for _ in range(OPEN_READS_PER_CONNECTION)]
            await until(lambda: sum(host.gate.open_reads.waiting.values())
                        == OPEN_READS_PER_CONNECTION, "the held calls wait for their message")
            with pytest.raises(aio.AioRpcError) as refused:
                await one.unary_unary(check)(request, timeout=30)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "waiting for their request message" in (refused.value.details() or "")
            # Another connection is not held back by this one's.
            await two.unary_unary(check)(request, timeout=30)
            send.set()
            await asyncio.gather(*waiting)
            await until(lambda: not host.gate.open_reads.waiting, "the slots are given back")
            await one.unary_unary(check)(request, timeout=30)
    finally:
        await host.stop(0)
