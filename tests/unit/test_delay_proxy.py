"""The loopback delay proxy (``tests/support/delay_proxy.py``): delay, order under jitter,
bandwidth, cuts and statistics, over raw sockets and a real gRPC call.

Timing is asserted as lower bounds only (a busy CI box can only make things slower),
and waits are for conditions with a deadline, never sleep-then-assert.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.delay_proxy import (
    READ_BYTES,
    DelayProxy,
    LinkShape,
    Pacer,
    Schedule,
    segment_bytes,
)

DEADLINE_S = 10.0
ROOT = Path(__file__).resolve().parents[2]


async def wait_until(cond: Callable[[], bool], timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


@pytest.fixture
async def echo() -> AsyncIterator[tuple[str, int]]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            writer.close()
        except ConnectionError:
            writer.transport.abort()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    yield "127.0.0.1", server.sockets[0].getsockname()[1]
    server.close()


async def read_exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    return await asyncio.wait_for(reader.readexactly(n), DEADLINE_S)


# -- the schedule, without sockets ------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    chunks=st.lists(st.tuples(st.floats(0, 0.05), st.integers(0, 5000)), min_size=1,
                    max_size=40),
    delay=st.floats(0, 50),
    jitter=st.floats(0, 50),
    rate=st.sampled_from([0.0, 1e5, 1e7]),
    seed=st.integers(0, 2**16),
)
def test_schedule_never_reorders_and_never_delivers_early(
    chunks: list[tuple[float, int]], delay: float, jitter: float, rate: float, seed: int
) -> None:
    shape = LinkShape(delay, jitter, rate)
    sched = Schedule(shape, Pacer(rate), random.Random(seed))
    now, prev, total = 0.0, -1.0, 0
    first = None
    for gap, size in chunks:
        now += gap
        first = now if first is None else first
        total += size
        due = sched.deliver_at(now, size)
        assert due >= prev  # order kept
        assert due >= now + max(0.0, delay - jitter) / 1000 - 1e-12
        if rate:
            assert due >= first + total / rate - 1e-9  # the link carries rate bytes/s
        prev = due


def test_jitter_is_deterministic_per_seed() -> None:
    def run(seed: int) -> list[float]:
        s = Schedule(LinkShape(10.0, 5.0), Pacer(0.0), random.Random(seed))
        return [s.deliver_at(i * 0.001, 100) for i in range(50)]

    assert run(1) == run(1) and run(1) != run(2)


# -- raw sockets ------------------------------------------------------------------------


async def test_round_trip_is_at_least_twice_the_delay(echo: tuple[str, int]) -> None:
    async with DelayProxy(echo, delay_ms=40.0) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        for _ in range(3):
            start = time.monotonic()
            writer.write(b"ping")
            assert await read_exactly(reader, 4) == b"ping"
            assert time.monotonic() - start >= 0.080 - 0.002
        writer.close()
        await wait_until(lambda: proxy.stats.live == 0)
        assert proxy.stats.bytes_up == proxy.stats.bytes_down == 12
        assert proxy.stats.connections == 1 and proxy.stats.cuts == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_order_is_kept_under_jitter(echo: tuple[str, int], seed: int) -> None:
    rng = random.Random(seed)
    pieces = [rng.randbytes(rng.randint(1, 3000)) for _ in range(60)]
    async with DelayProxy(echo, delay_ms=5.0, jitter_ms=5.0, seed=seed) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        for piece in pieces:  # separate writes, read as separate chunks mostly
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.001 * rng.random())
        sent = b"".join(pieces)
        assert await read_exactly(reader, len(sent)) == sent
        writer.close()
        await wait_until(lambda: proxy.stats.bytes_down == len(sent))
        assert proxy.stats.bytes_up == len(sent)


async def test_bandwidth_limit_bounds_transfer_time(echo: tuple[str, int]) -> None:
    payload = random.Random(3).randbytes(150_000)
    rate_mbit = 4.0  # 500 kB/s each way: at least 0.3 s for the payload
    async with DelayProxy(echo, rate_mbit=rate_mbit) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        start = time.monotonic()
        writer.write(payload)
        assert await read_exactly(reader, len(payload)) == payload
        assert time.monotonic() - start >= len(payload) / (rate_mbit * 1e6 / 8) - 0.002
        writer.close()


async def test_a_burst_read_at_once_still_arrives_spread_over_the_link() -> None:
    """One 40 kB write crosses a 100 kB/s link as segments, not as one late lump: the far
    side's first read holds one segment of it (gRPC's header, in the product), and the
    rest follows over about 0.4 s of link time. A lump would let the cloud time a 350 ms
    upload as 1 ms (a CI flake)."""
    arrivals: list[int] = []
    done = asyncio.Event()
    payload = random.Random(5).randbytes(40_000)

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            arrivals.append(len(data))
            if sum(arrivals) >= len(payload):
                done.set()
        writer.close()

    server = await asyncio.start_server(sink, "127.0.0.1", 0)
    target = ("127.0.0.1", server.sockets[0].getsockname()[1])
    try:
        async with DelayProxy(target, up=LinkShape(rate_bytes_per_s=100e3)) as proxy:
            _, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(payload)
            await writer.drain()
            await asyncio.wait_for(done.wait(), DEADLINE_S)
            writer.close()
    finally:
        server.close()
    assert sum(arrivals) == len(payload)
    assert len(arrivals) > 1 and arrivals[0] <= segment_bytes(100e3) < len(payload)


@given(rate=st.floats(0, 1e9))
def test_segments_are_at_least_an_mtu_and_unlimited_links_keep_whole_reads(rate: float) -> None:
    size = segment_bytes(rate)
    assert size >= 1500
    if rate == 0:
        assert size == READ_BYTES
    else:
        assert size >= rate * 0.002 - 1


async def test_cut_after_bytes_resets_the_connection(echo: tuple[str, int]) -> None:
    async with DelayProxy(echo, cut_after_bytes=1500) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"x" * 500)
        assert await read_exactly(reader, 500) == b"x" * 500  # 1000 bytes read in all
        assert proxy.stats.cuts == 0
        writer.write(b"y" * 600)  # crosses 1500 on the way up: cut, nothing delivered
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await read_exactly(reader, 600)
        assert proxy.stats.cuts == 1 and proxy.stats.bytes_up == 500
        writer.close()
        await wait_until(lambda: proxy.stats.live == 0)
        # The proxy still serves the next connection.
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"again")
        assert await read_exactly(reader, 5) == b"again"
        writer.close()
        assert proxy.stats.connections == 2


async def test_a_dead_target_closes_the_client(echo: tuple[str, int]) -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    async with DelayProxy(("127.0.0.1", port)) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await read_exactly(reader, 1)
        writer.close()


async def test_cli_prints_its_port_and_its_stats(echo: tuple[str, int]) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.delay_proxy", "--listen", "127.0.0.1:0",
        "--target", f"{echo[0]}:{echo[1]}", "--delay-ms", "10", "--jitter-ms", "1",
        "--rate-mbit", "100", cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        first = json.loads(await asyncio.wait_for(proc.stdout.readline(), DEADLINE_S))
        reader, writer = await asyncio.open_connection("127.0.0.1", first["port"])
        start = time.monotonic()
        writer.write(b"hello")
        assert await read_exactly(reader, 5) == b"hello"
        assert time.monotonic() - start >= 2 * (10 - 1) / 1000 - 0.002
        writer.close()
        proc.terminate()
        stats = json.loads(await asyncio.wait_for(proc.stdout.readline(), DEADLINE_S))
        assert stats["bytes_up"] == stats["bytes_down"] == 5 and stats["connections"] == 1
        assert await asyncio.wait_for(proc.wait(), DEADLINE_S) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


# -- gRPC through the proxy -------------------------------------------------------------


@pytest.fixture
async def grpc_target() -> AsyncIterator[tuple[str, int]]:
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    yield "127.0.0.1", port
    await server.stop(None)


CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 100),
]


async def check(stub: health_pb2_grpc.HealthStub) -> health_pb2.HealthCheckResponse:
    return await stub.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE_S,
                            wait_for_ready=True)


async def check_until_through(stub: health_pb2_grpc.HealthStub
                              ) -> health_pb2.HealthCheckResponse:
    """Check again on UNAVAILABLE until one gets through, as a client does, within
    DEADLINE_S. Why more than once: the channel can send a call on a transport that is
    already dead ("Stream removed"): the cut one before it noticed, or one the refusing
    proxy accepted and reset at once; gRPC does not retry a call that reached a
    transport. Beside two busy loops (`make test-stress`) two such calls came in a row."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            return await check(stub)
        except grpc.aio.AioRpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e
            assert time.monotonic() < deadline, f"no call got through in {DEADLINE_S} s"


async def test_grpc_call_sees_the_delay(grpc_target: tuple[str, int]) -> None:
    async with DelayProxy(grpc_target, delay_ms=25.0, jitter_ms=2.0) as proxy:
        async with grpc.aio.insecure_channel(proxy.address, options=CHANNEL_OPTIONS) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            await check(stub)  # connect first: the handshake takes round trips too
            start = time.monotonic()
            reply = await check(stub)
            assert time.monotonic() - start >= 2 * (25.0 - 2.0) / 1000 - 0.002
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert proxy.stats.bytes_up > 0 and proxy.stats.bytes_down > 0


async def test_cut_fails_the_call_in_flight_and_the_next_call_gets_through(
    grpc_target: tuple[str, int],
) -> None:
    async with DelayProxy(grpc_target, delay_ms=2.0) as proxy:
        async with grpc.aio.insecure_channel(proxy.address, options=CHANNEL_OPTIONS) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            watch = stub.Watch(health_pb2.HealthCheckRequest(), timeout=DEADLINE_S,
                               wait_for_ready=True)
            first = await asyncio.wait_for(watch.read(), DEADLINE_S)
            assert first.status == health_pb2.HealthCheckResponse.SERVING
            assert proxy.cut(refuse_for_s=0.2) == 1
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await asyncio.wait_for(watch.read(), DEADLINE_S)
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
            cut_at = time.monotonic()
            reply = await check_until_through(stub)  # waits out the refusal, reconnects
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            # Every connection before the refusal ended was reset: it cannot be sooner.
            assert time.monotonic() - cut_at >= 0.2 - 0.01
        assert proxy.stats.cuts == 1 and proxy.stats.connections >= 2
