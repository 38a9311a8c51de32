"""A flood of oversize stop lists is refused from the bytes (issue 38, red-team finding 2).

Refusing 10^6 stop strings after parsing them cost each node's event loop about 100 ms a
request (parse, a tuple of 10^6 strings, a pass over them), so a flood of such requests
slowed every other client 5-13x even though each was refused. Over real gRPC, an Ask and
a Generate Open carrying them are refused with INVALID_ARGUMENT naming the field, and the
structural point is checked directly: the generation settings are never converted (nor
parsed into Python objects) for them, while a good request alongside is. Past the edge's
request size (1 MiB: every request it takes is small) gRPC refuses an Ask before any of
it reaches Python.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import grpc
import pytest
import pytest_asyncio
from grpc import aio

from eventspec.shared.contract import convert_ask, convert_verifier, types
from eventspec.shared.contract.types import AskSpec, GenerationSettings, Mode
from eventspec.shared.pb.eventspec.v1 import common_pb2, edge_pb2_grpc
from eventspec.shared.wire.options import SMALL_REQUEST_BYTES
from tests.support import cloud_harness as h
from tests.support import edge_harness as eh

pytestmark = pytest.mark.asyncio(loop_scope="module")

Q = "What is moving?"
MILLION = tuple("abcdefgh"[i % 8] for i in range(1_000_000))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack() -> AsyncIterator[eh.Stack]:
    s = await eh.start_stack()
    yield s
    await s.stop()


class Calls:
    """Counts calls of the functions that turn a stop list into Python objects."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[int] = []
        for module in (convert_ask, convert_verifier):
            real = module.generation_from_pb

            def counting(m: common_pb2.GenerationConfig,
                         _real: Callable[..., GenerationSettings] = real) -> GenerationSettings:
                self.seen.append(len(m.stop))
                return _real(m)

            monkeypatch.setattr(module, "generation_from_pb", counting)
        real_check = types.check_stop

        def checking(stop: tuple[str, ...], *args: int) -> None:
            self.seen.append(len(stop))
            real_check(stop, *args)

        monkeypatch.setattr(types, "check_stop", checking)


async def _refused_ask(address: str, mode: Mode, stop: tuple[str, ...]) -> aio.AioRpcError:
    spec = AskSpec(Q, mode=mode, generation=GenerationSettings(max_new_tokens=8, stop=stop))
    async with aio.insecure_channel(address) as ch:
        with pytest.raises(aio.AioRpcError) as err:
            async for _ in edge_pb2_grpc.EdgeAgentStub(ch).Ask(
                    convert_ask.ask_spec_to_pb(spec), timeout=30):
                pass
    return err.value


@pytest.mark.parametrize("mode", [Mode.SPECULATIVE, Mode.DRAFT_ONLY], ids=lambda m: m.name.lower())
async def test_ask_with_a_flood_of_stop_strings_is_refused_unparsed(
        stack: eh.Stack, mode: Mode, monkeypatch: pytest.MonkeyPatch) -> None:
    """Within the edge's request size (1 MiB) the field is named: INVALID_ARGUMENT."""
    calls = Calls(monkeypatch)
    err = await _refused_ask(stack.edge_address, mode, MILLION[:300_000])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    details = err.details() or ""
    assert details.startswith("generation.stop:") and "stop strings" in details, details
    assert 300_000 not in calls.seen, "the stop list was converted before the refusal"
    final = await eh.ask(stack.edge_address, Q, mode, max_new=4)
    assert final.token_ids
    assert calls.seen, "a good Ask converts its settings (the counter works)"


async def test_ask_past_the_edge_request_size_is_refused_by_grpc(
        stack: eh.Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request the edge takes is small, so gRPC refuses a larger one from its length
    prefix (RESOURCE_EXHAUSTED naming the sizes) and none of it reaches Python."""
    calls = Calls(monkeypatch)
    err = await _refused_ask(stack.edge_address, Mode.SPECULATIVE, MILLION)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
    assert f"vs. {SMALL_REQUEST_BYTES}" in (err.details() or ""), err.details()
    assert calls.seen == []


async def test_open_with_a_million_stop_strings_is_refused_unparsed(
        stack: eh.Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = Calls(monkeypatch)
    frames = h.make_frames(5)
    failure = await h.expect_failure(
        stack.cloud.port, [h.open_msg(Q, frames, max_new_tokens=8, stop=MILLION)], timeout=30)
    assert failure.code == grpc.StatusCode.INVALID_ARGUMENT, failure
    assert failure.details.startswith("generation.stop:"), failure.details
    assert "stop strings" in failure.details, failure.details
    assert len(MILLION) not in calls.seen, "the stop list was converted before the refusal"
    good = await h.run_generate(stack.cloud.port, h.open_msg(Q, frames, max_new_tokens=4,
                                                             speculative=False), timeout=30)
    assert good.tokens
    assert calls.seen, "a good Open converts its settings (the counter works)"
    await h.wait_for_sessions(stack.cloud, 0)
