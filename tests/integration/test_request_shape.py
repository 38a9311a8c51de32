"""Bounded request shape over real gRPC (issue 19, item 2): stop strings are matched after
every committed token, so their count and total length are capped, refused at once with
INVALID_ARGUMENT naming the field on the cloud's Open and the edge's Ask (every mode),
and advertised in GetServerInfo.limits; a good request alongside is unaffected."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio
from grpc import aio

from eventspec.shared.contract import convert_ask
from eventspec.shared.contract.types import (
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    AskSpec,
    GenerationSettings,
    Mode,
)
from eventspec.shared.pb.eventspec.v1 import edge_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from tests.support import cloud_harness as h
from tests.support import edge_harness as eh

pytestmark = pytest.mark.asyncio(loop_scope="module")

Q = "What is moving?"
#: A refusal is a validation, not model work: generous for a busy CI machine.
REFUSED_WITHIN_S = 10.0
MANY = tuple(f"s{i}" for i in range(100_000))
LONG = ("x" * (MAX_STOP_CHARS + 1),)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack() -> AsyncIterator[eh.Stack]:
    s = await eh.start_stack()
    yield s
    await s.stop()


async def test_server_info_advertises_the_stop_caps(stack: eh.Stack) -> None:
    async with aio.insecure_channel(f"127.0.0.1:{stack.cloud.port}") as ch:
        info = await verifier_pb2_grpc.VerifierStub(ch).GetServerInfo(
            verifier_pb2.GetServerInfoRequest(), timeout=10)
    assert info.limits.max_stop_strings == MAX_STOP_STRINGS
    assert info.limits.max_stop_chars == MAX_STOP_CHARS


@pytest.mark.parametrize(("stop", "needle"), [(MANY, "stop strings"), (LONG, "characters")],
                         ids=["count", "length"])
async def test_open_with_too_many_stop_strings_is_refused(stack: eh.Stack, stop: tuple[str, ...],
                                                          needle: str) -> None:
    frames = h.make_frames(3)
    bad = h.open_msg(Q, frames, max_new_tokens=8, stop=stop)
    t0 = time.monotonic()
    failure, good = await asyncio.gather(
        h.expect_failure(stack.cloud.port, [bad], timeout=30),
        h.run_generate(stack.cloud.port, h.open_msg(Q, frames, max_new_tokens=6,
                                                    speculative=False), timeout=30),
    )
    assert failure.code == grpc.StatusCode.INVALID_ARGUMENT, failure
    assert "generation.stop" in failure.details and needle in failure.details, failure.details
    assert time.monotonic() - t0 < REFUSED_WITHIN_S
    assert good.tokens
    await h.wait_for_sessions(stack.cloud, 0)


@pytest.mark.parametrize("mode", [Mode.SPECULATIVE, Mode.TARGET_ONLY, Mode.DRAFT_ONLY],
                         ids=lambda m: m.name.lower())
@pytest.mark.parametrize("stop", [MANY, LONG], ids=["count", "length"])
async def test_ask_with_too_many_stop_strings_is_refused(stack: eh.Stack, mode: Mode,
                                                         stop: tuple[str, ...]) -> None:
    spec = AskSpec(Q, mode=mode, generation=GenerationSettings(max_new_tokens=8, stop=stop))
    async with aio.insecure_channel(stack.edge_address) as ch:
        call = edge_pb2_grpc.EdgeAgentStub(ch).Ask(convert_ask.ask_spec_to_pb(spec),
                                                   timeout=REFUSED_WITHIN_S)
        with pytest.raises(aio.AioRpcError) as err:
            async for _ in call:
                pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
    assert "generation.stop" in (err.value.details() or ""), err.value.details()


async def test_stop_strings_within_the_caps_still_work(stack: eh.Stack) -> None:
    stop = tuple(f"never{i}" for i in range(MAX_STOP_STRINGS))
    frames = h.make_frames(3)
    out = await h.run_generate(stack.cloud.port, h.open_msg(Q, frames, max_new_tokens=6,
                                                            speculative=False, stop=stop))
    assert out.done.finish_reason.name in ("MAX_TOKENS", "EOS")
