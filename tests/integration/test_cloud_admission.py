"""Issue 11's limits on the verifier, over real gRPC on loopback: the first-message and
features timeouts, per-principal session caps with two token principals, network frame
caps, max_new_tokens clamped to the context, safe request ids, and the one log line
per request (refusals and cancellations included, never the question)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import grpc
import pytest
from grpc import aio

from eventspec.cloud.config import CloudSettings
from eventspec.cloud.server import VerifierServer
from eventspec.shared.contract import convert_verifier
from eventspec.shared.contract.timing import EdgeCost, TimingPlan
from eventspec.shared.contract.types import (
    AlignedSpec,
    CommitEvent,
    DoneEvent,
    FinishReason,
    GenerationSettings,
    OpenRequest,
)
from eventspec.shared.node.imageproc import encode_png
from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from tests.support import cloud_harness as h
from tests.support import edge_harness as eh
from tests.support.tls_harness import TOKEN_A, TOKEN_B
from tests.support.waiting import until

Q = "Describe the scene."
LONG_Q, LONG_SEED = "What is moving?", 1000  # greedy answer runs past 300 tokens


async def _start(**changes: object) -> VerifierServer:
    target, _ = eh.shared_models()
    base = h.settings(max_sessions=4, input_timeout_s=30.0)
    server = VerifierServer(replace(base, **changes), target=target,  # type: ignore[arg-type]
                            cost=h.TEST_COST)
    await server.start()
    return server


def _open(question: str = Q, *, request_id: str = "req-1", frames: Sequence[bytes] | None = None,
          aligned: bool = False, uplink: float = 0.0, max_new_tokens: int = 8,
          seed: int = 1003) -> verifier_pb2.EdgeMessage:
    req = OpenRequest(
        request_id=request_id,
        question=question,
        generation=GenerationSettings(max_new_tokens=max_new_tokens),
        frames=None if aligned else tuple(frames or h.make_frames(seed)),
        aligned=AlignedSpec("float32", (8, 17, 32)) if aligned else None,
        edge_cost=EdgeCost(5.0, 1.0, 1.0, uplink, 0.5),
        speculative=True,
    )
    return verifier_pb2.EdgeMessage(open=convert_verifier.open_to_pb(req))


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "eventspec.cloud.requests.log"]


@pytest.fixture
async def plain() -> AsyncIterator[VerifierServer]:
    server = await _start(first_message_timeout_s=0.5, features_base_timeout_s=0.3)
    yield server
    await server.stop(0)


# -- timeouts -----------------------------------------------------------------------------


async def test_a_stream_that_never_sends_open_is_ended_by_the_first_message_timeout(
    plain: VerifierServer, caplog: pytest.LogCaptureFixture
) -> None:
    assert plain._host is not None
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger="eventspec.shared.wire.gate"):
        failure = await h.expect_failure(plain.port, [], timeout=20)
    elapsed = time.monotonic() - t0
    assert failure.code == grpc.StatusCode.DEADLINE_EXCEEDED
    # The server's bound ended it, not the client's 20 s deadline: the details say so.
    assert "no complete request message within 0.5 s" in failure.details, failure.details
    assert "first-message timeout" in failure.details
    assert elapsed >= 0.5 * 0.9, elapsed
    assert plain._host.limit.in_flight == 0  # it never took an RPC slot
    gate = [r.getMessage() for r in caplog.records if r.name == "eventspec.shared.wire.gate"]
    assert any("DEADLINE_EXCEEDED" in line and "first-message" in line for line in gate), gate


@pytest.mark.parametrize("uplink, expected_s", [(0.0, 0.4), (69632.0, 1.3)])
async def test_features_timeout_scales_with_the_declared_size_over_the_uplink(
    plain: VerifierServer, uplink: float, expected_s: float
) -> None:
    """17408 declared bytes: 0.3 s + 4 x 17408 B / uplink (unknown = 1 MiB/s)."""
    t0 = time.monotonic()
    failure = await h.expect_failure(plain.port, [_open(aligned=True, uplink=uplink)],
                                     timeout=20)
    elapsed = time.monotonic() - t0
    assert failure.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert f"did not arrive within {expected_s:.1f} s" in failure.details, failure.details
    assert "17408 declared bytes" in failure.details
    assert elapsed >= expected_s * 0.9, elapsed  # the server's bound; details say which
    await h.wait_for_sessions(plain, 0)


# -- per-principal session caps ------------------------------------------------------------


@pytest.fixture
async def two_principals() -> AsyncIterator[VerifierServer]:
    from eventspec.shared.wire.security import ServerSecurity

    security = ServerSecurity(tokens=(("app-a", TOKEN_A), ("app-b", TOKEN_B)))
    server = await _start(max_sessions_per_principal=2, security=security)
    yield server
    await server.stop(0)


async def _hold(stub: verifier_pb2_grpc.VerifierStub, token: str) -> aio.StreamStreamCall:
    """A Generate holding a session: Open for aligned features that are never sent."""
    call = stub.Generate(timeout=30, metadata=(("authorization", f"Bearer {token}"),))
    await call.write(_open(aligned=True))
    msg = await asyncio.wait_for(call.read(), timeout=10)
    assert msg is not aio.EOF and msg.HasField("plan"), msg
    return call


async def test_one_principal_cannot_take_every_slot(
    two_principals: VerifierServer, caplog: pytest.LogCaptureFixture
) -> None:
    server = two_principals
    registry = server.runtime.registry if server.runtime else None
    assert registry is not None
    async with aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = verifier_pb2_grpc.VerifierStub(channel)
        a1, a2 = await _hold(stub, TOKEN_A), await _hold(stub, TOKEN_A)
        third = stub.Generate(timeout=10, metadata=(("authorization", f"Bearer {TOKEN_A}"),))
        with caplog.at_level(logging.INFO, logger="eventspec.cloud.requests.log"):
            await third.write(_open(aligned=True, request_id="a-third"))
            with pytest.raises(aio.AioRpcError) as err:
                await third.read()
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = err.value.details() or ""
        assert "principal 'app-a'" in details
        assert "--max-sessions-per-principal 2" in details
        assert any("a-third" in line and "RESOURCE_EXHAUSTED" in line and "token:app-a" in line
                   for line in _lines(caplog)), _lines(caplog)
        # The other principal still gets a slot while app-a is at its cap.
        b1 = await _hold(stub, TOKEN_B)
        assert server.live_sessions == 3
        # A slot given back is usable by app-a again.
        a1.cancel()
        await h.wait_for_sessions(server, 2)
        a3 = await _hold(stub, TOKEN_A)
        for call in (a2, a3, b1):
            call.cancel()
    await h.wait_for_sessions(server, 0)
    assert registry._held == {}  # every count given back


async def test_server_info_advertises_the_per_principal_cap(
    two_principals: VerifierServer,
) -> None:
    """A client can plan around the cap before it hits it (GetServerInfo.limits)."""
    async with aio.insecure_channel(f"127.0.0.1:{two_principals.port}") as channel:
        info = await verifier_pb2_grpc.VerifierStub(channel).GetServerInfo(
            verifier_pb2.GetServerInfoRequest(), timeout=10,
            metadata=(("authorization", f"Bearer {TOKEN_B}"),))
    assert info.limits.max_sessions_per_principal == 2
    assert convert_verifier.server_info_from_pb(info).limits.max_sessions_per_principal == 2


def test_the_per_principal_default_leaves_a_slot_free() -> None:
    limits = replace(CloudSettings().limits, max_sessions=8)
    assert replace(CloudSettings(), limits=limits).per_principal_cap == 7
    assert replace(CloudSettings(), limits=replace(limits, max_sessions=1)).per_principal_cap == 1
    assert replace(CloudSettings(), limits=limits,
                   max_sessions_per_principal=3).per_principal_cap == 3


# -- frames -------------------------------------------------------------------------------


def _flat_png(width: int, height: int) -> bytes:
    import numpy as np

    return encode_png(np.zeros((height, width, 3), dtype=np.uint8))


@pytest.mark.parametrize("size, says", [
    ((5000, 5000), "image of 5000x5000 exceeds 8294400 pixels"),
    ((2000, 40), "aspect ratio 50.0, over the cap of 4"),
])
async def test_oversized_or_elongated_frames_are_refused_naming_the_frame(
    plain: VerifierServer, caplog: pytest.LogCaptureFixture, size: tuple[int, int], says: str
) -> None:
    frames = list(h.make_frames(1003))
    frames[3] = _flat_png(*size)  # a few KB of PNG, megapixels once decoded
    with caplog.at_level(logging.INFO, logger="eventspec.cloud.requests.log"):
        failure = await h.expect_failure(plain.port, [_open(frames=frames)])
    assert failure.code == grpc.StatusCode.INVALID_ARGUMENT
    assert failure.details.startswith("frame 3: "), failure.details
    assert says in failure.details
    assert not failure.received  # refused before the Plan: no session, no KV slot
    assert any("INVALID_ARGUMENT" in line and "frame 3" in line for line in _lines(caplog))
    await h.wait_for_sessions(plain, 0)


# -- max_new_tokens and the context -------------------------------------------------------


async def _generate(port: int, first: verifier_pb2.EdgeMessage
                    ) -> tuple[TimingPlan, list[int], DoneEvent]:
    async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = verifier_pb2_grpc.VerifierStub(channel).Generate(timeout=60)
        await call.write(first)
        plan: TimingPlan | None = None
        tokens: list[int] = []
        while True:
            msg = await call.read()
            assert msg is not aio.EOF
            event = convert_verifier.cloud_message_from_pb(msg)
            if isinstance(event, TimingPlan):
                plan = event
            elif isinstance(event, CommitEvent):
                tokens.extend(event.token_ids)
            elif isinstance(event, DoneEvent):
                await call.done_writing()
                assert plan is not None
                return plan, tokens, event


async def test_max_new_tokens_is_clamped_to_the_context_left_and_reported() -> None:
    target, _ = eh.shared_models()
    prompt_len = len(target.build_prompt_ids(LONG_Q))
    server = await _start(max_seq_len=prompt_len + 5)
    try:
        first = _open(LONG_Q, seed=LONG_SEED, max_new_tokens=64)
        plan, tokens, done = await _generate(server.port, first)
        assert plan.max_new_tokens == 5
        assert done.final_plan is not None and done.final_plan.max_new_tokens == 5
        assert len(tokens) == 5
        assert done.finish_reason == FinishReason.MAX_TOKENS
        # Within the context, the request's own cap is what the Plan says.
        plan, tokens, done = await _generate(
            server.port, _open(LONG_Q, seed=LONG_SEED, max_new_tokens=3))
        assert plan.max_new_tokens == 3 and len(tokens) == 3
    finally:
        await server.stop(0)


# -- request ids and the request log ------------------------------------------------------


async def test_request_ids_are_capped_and_sanitised_before_logging(
    plain: VerifierServer, caplog: pytest.LogCaptureFixture
) -> None:
    evil = "id\nINFO forged: admin logged in\r\x1b[31m" + "x" * 500
    with caplog.at_level(logging.DEBUG):
        await _generate(plain.port, _open(request_id=evil))
        await h.expect_failure(plain.port, [_open(request_id=evil, frames=[b"x"] * 8)])
    records = [r.getMessage() for r in caplog.records]
    assert not any("\n" in m or "\r" in m or "\x1b" in m for m in records)
    assert not any("x" * 65 in m for m in records)
    lines = _lines(caplog)
    assert len(lines) == 2 and all("id_INFO_forged" in line for line in lines), lines
    assert all(f"({len(evil)} chars)" in line for line in lines)


async def test_one_line_per_request_with_outcome_never_the_question(
    plain: VerifierServer, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "Where is the zebra hiding?"
    with caplog.at_level(logging.DEBUG):
        await _generate(plain.port, _open(secret, request_id="ok-1"))
        async with aio.insecure_channel(f"127.0.0.1:{plain.port}") as channel:
            call = verifier_pb2_grpc.VerifierStub(channel).Generate(timeout=30)
            await call.write(_open(secret, request_id="gone-1", seed=LONG_SEED,
                                   max_new_tokens=400))
            while not (await call.read()).HasField("commit"):
                pass  # the answer is under way
            call.cancel()
        await h.wait_for_sessions(plain, 0)
        # The cancelled handler logs its line in its finally, after the stream has ended.
        await until(lambda: any(line.startswith("generate gone-1:") for line in _lines(caplog)),
                    "the cancelled request's log line")
    lines = _lines(caplog)
    ok = [line for line in lines if line.startswith("generate ok-1:")]
    gone = [line for line in lines if line.startswith("generate gone-1:")]
    assert len(ok) == 1 and len(gone) == 1, lines
    assert "mode speculative/frames" in ok[0] and " ms" in ok[0]
    assert any(reason in ok[0] for reason in ("EOS", "MAX_TOKENS")), ok[0]
    assert "CANCELLED" in gone[0] and "mode speculative/frames" in gone[0]
    info = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert not any("zebra" in m for m in info)
