"""Property-based fuzzing of the two streaming RPCs with hypothesis, on real servers.

``Generate`` gets random sequences of edge messages (Open with random questions,
frames, numbers and profiles; tensor headers and chunks; drafts; cancels) and ``Ask``
random requests (windows, modes, generation configs, feature modes). Whatever the
input: the server answers with a status that is not INTERNAL or UNKNOWN, no session
is left behind, and the servers still answer afterwards.

The default run is a few hundred cases; ``-m slow`` runs ``FUZZ_SLOW_EXAMPLES``
(10,000 by default) of each and prints the status counts.
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import replace
from typing import Any, TypeVar

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventspec.cloud.server import VerifierServer
from eventspec.edge.config import EdgeSettings
from eventspec.edge.server import EdgeServer
from eventspec.shared.pb.eventspec.v1 import (
    common_pb2,
    edge_pb2,
    edge_pb2_grpc,
    verifier_pb2,
    verifier_pb2_grpc,
)
from tests.support import cloud_harness as ch
from tests.support import edge_harness as eh

T = TypeVar("T")
BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
DEFAULT_GENERATE, DEFAULT_ASK = 200, 80
SLOW_EXAMPLES = int(os.environ.get("FUZZ_SLOW_EXAMPLES", "10000"))


class Nodes:
    """A cloud and an edge on port 0, on an event loop in a background thread, so the
    hypothesis-driven test can stay synchronous and use the blocking stubs."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        target, draft = eh.shared_models()
        self.cloud = VerifierServer(ch.settings(max_sessions=8, input_timeout_s=0.5),
                                    target=target, cost=ch.TEST_COST)
        self.run(self.cloud.start())
        self.edge = EdgeServer(replace(EdgeSettings(), cloud=f"127.0.0.1:{self.cloud.port}",
                                       port=0, request_timeout_s=20), draft=draft)
        self.run(self.edge.start())
        self.cloud_channel = grpc.insecure_channel(f"127.0.0.1:{self.cloud.port}")
        self.edge_channel = grpc.insecure_channel(f"127.0.0.1:{self.edge.port}")
        self.verifier = verifier_pb2_grpc.VerifierStub(self.cloud_channel)
        self.agent = edge_pb2_grpc.EdgeAgentStub(self.edge_channel)
        self.codes: collections.Counter[str] = collections.Counter()
        self.details: collections.Counter[str] = collections.Counter()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)

    def wait_no_sessions(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.cloud.live_sessions:
            assert time.monotonic() < deadline, f"{self.cloud.live_sessions} session(s) leaked"
            time.sleep(0.005)

    def close(self) -> None:
        self.cloud_channel.close()
        self.edge_channel.close()
        self.run(self.edge.stop(0))
        self.run(self.cloud.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def nodes() -> Iterator[Nodes]:
    n = Nodes()
    yield n
    print("\nfuzz status counts:", dict(n.codes))  # quoted in the closing note
    print(n.details.most_common(30))
    n.close()


# -- strategies ---------------------------------------------------------------------------

_FRAME_POOL = ch.make_frames(0, n=8, size=24)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)


def mostly(valid: st.SearchStrategy[T], other: st.SearchStrategy[T]) -> st.SearchStrategy[T]:
    """``valid`` three times in four (and first when shrinking): random input should
    also reach the model work."""
    return st.integers(0, 3).flatmap(lambda k: other if k == 3 else valid)


small_or_extreme = mostly(st.integers(0, 12), st.one_of(
    st.integers(-3, 24), st.sampled_from([2**31 - 1, -(2**31), 513])))


# Finite, in-range numbers, plus values the validation refuses (negative, NaN, inf).
# Finite extremes that still give INTERNAL (temperature 1e-260 or 1e300, a profile of
# 5e-324) are issue 11's validation items: see test_known_extremes below.
unit_float = mostly(st.floats(0.0, 1.0),
                    st.sampled_from([0.0, 1.0, 1.5, -1.0, float("nan"), float("inf")]))
temperature = mostly(st.one_of(st.just(0.0), st.floats(0.05, 1.5)),
                     st.sampled_from([-1.0, float("nan"), float("inf"), float("-inf")]))
text = mostly(st.sampled_from(["What is moving?", "Describe the scene.", "Which way?"]),
              st.text(max_size=200))

frames = mostly(st.just(list(_FRAME_POOL)), st.lists(
    st.one_of(st.sampled_from(_FRAME_POOL), st.binary(max_size=64)), max_size=9
))

generation = st.builds(
    common_pb2.GenerationConfig,
    max_new_tokens=small_or_extreme,
    temperature=temperature,
    top_p=unit_float,
    seed=st.integers(0, 2**64 - 1),
    stop=mostly(st.just([]), st.lists(st.text(max_size=5), max_size=2)),
)

edge_profile = st.builds(
    common_pb2.EdgeProfile,
    draft_prefill_ms=st.floats(0.01, 1e4), draft_ms_per_token=st.floats(0.01, 1e3),
    rtt_ms=st.floats(0, 1e4), uplink_bytes_per_s=st.floats(0, 1e10),
    acceptance_prior=st.floats(0, 1),
)


@st.composite
def open_msg(draw: st.DrawFn) -> verifier_pb2.EdgeMessage:
    kw: dict[str, Any] = {
        "request_id": draw(mostly(st.just("fuzz"), st.text(max_size=40))),
        "question": draw(text),
        "generation": draw(generation),
        "deadline_ms": draw(mostly(st.just(0), st.one_of(st.integers(-1, 60_000), int64))),
        "speculative": draw(st.booleans()),
    }
    if draw(st.booleans()):
        kw["edge_profile"] = draw(edge_profile)
    if draw(st.integers(0, 9)) == 9:
        kw["aligned"] = verifier_pb2.AlignedInput(
            dtype=draw(st.integers(0, 7)), shape=draw(st.lists(st.integers(-2, 300), max_size=4)))
    else:
        kw["frames"] = verifier_pb2.FramesInput(frames=draw(frames))
    return verifier_pb2.EdgeMessage(open=verifier_pb2.Open(**kw))


after_open = st.one_of(
    st.builds(lambda b, t: verifier_pb2.EdgeMessage(drafts=verifier_pb2.Drafts(base=b,
                                                                                token_ids=t)),
              st.integers(-2, 40), st.lists(st.integers(-2, 40_000), max_size=40)),
    st.builds(lambda r: verifier_pb2.EdgeMessage(cancel=verifier_pb2.Cancel(reason=r)), text),
    st.builds(lambda n, d, s, b: verifier_pb2.EdgeMessage(tensor_header=common_pb2.TensorHeader(
        name=n, dtype=d, shape=s, total_bytes=b, num_chunks=1)),
        st.sampled_from(["features", "x", ""]), st.integers(0, 7),
        st.lists(st.integers(-1, 64), max_size=4), st.integers(-1, 1 << 20)),
    st.builds(lambda n, i, d: verifier_pb2.EdgeMessage(tensor_chunk=common_pb2.TensorChunk(
        name=n, index=i, data=d)),
        st.sampled_from(["features", "x"]), st.integers(-1, 3), st.binary(max_size=256)),
    open_msg(),
)
generate_calls = st.one_of(
    st.tuples(open_msg()).map(list),
    st.tuples(open_msg()).map(list),
    st.builds(lambda first, rest: [first, *rest], open_msg(), st.lists(after_open, max_size=4)),
    st.lists(after_open, max_size=3),
)

ask_requests = st.builds(
    lambda q, clip, ev, mode, gen, fm, jq: edge_pb2.AskRequest(
        question=q, window=edge_pb2.Window(event_window_ms=ev, **clip), mode=mode,
        generation=gen, feature_mode=fm, jpeg_quality=jq),
    mostly(text, st.sampled_from(["", "   "])),
    mostly(st.just({}), st.one_of(
        st.builds(lambda v: {"latest_ms": v}, int32),
        st.builds(lambda a, b: {"range": edge_pb2.TimeRange(t0_us=a, t1_us=b)}, int64, int64))),
    mostly(st.sampled_from([0, 20, 50]), st.one_of(st.integers(-5, 120), int32)),
    mostly(st.integers(1, 3), st.integers(0, 6)),
    generation,
    mostly(st.integers(0, 3), st.integers(0, 6)),
    mostly(st.just(0), st.one_of(st.integers(0, 101), int32)),
)


# -- properties ---------------------------------------------------------------------------

def fuzz_generate(nodes: Nodes, messages: list[verifier_pb2.EdgeMessage]) -> None:
    code = grpc.StatusCode.OK
    details = ""
    try:
        for _ in nodes.verifier.Generate(iter(messages), timeout=30):
            pass
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details()  # type: ignore[attr-defined]
    nodes.codes[f"Generate {code.name}"] += 1
    nodes.details[details[:60]] += 1
    assert code not in BAD, (code, details, messages)
    nodes.wait_no_sessions()


def fuzz_ask(nodes: Nodes, request: edge_pb2.AskRequest) -> None:
    code = grpc.StatusCode.OK
    details = ""
    try:
        for _ in nodes.agent.Ask(request, timeout=60):
            pass
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details()  # type: ignore[attr-defined]
    nodes.codes[f"Ask {code.name}"] += 1
    nodes.details["Ask " + details[:60]] += 1
    assert code not in BAD, (code, details, request)
    nodes.wait_no_sessions()


def still_answering(nodes: Nodes) -> None:
    info = nodes.verifier.GetServerInfo(verifier_pb2.GetServerInfoRequest(), timeout=10)
    assert info.model_id
    assert nodes.agent.GetStatus(edge_pb2.GetStatusRequest(), timeout=10) is not None


def _settings(n: int) -> Callable[[T], T]:
    return settings(max_examples=n, deadline=None, database=None, derandomize=n < 1000,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


@_settings(DEFAULT_GENERATE)
@given(messages=generate_calls)
def test_fuzz_generate(nodes: Nodes, messages: list[verifier_pb2.EdgeMessage]) -> None:
    fuzz_generate(nodes, messages)


@_settings(DEFAULT_ASK)
@given(request=ask_requests)
def test_fuzz_ask(nodes: Nodes, request: edge_pb2.AskRequest) -> None:
    fuzz_ask(nodes, request)


def test_servers_still_answer_after_fuzzing(nodes: Nodes) -> None:
    still_answering(nodes)


@pytest.mark.parametrize("field", ["temperature=1e-300", "temperature=1e300",
                                   "draft_ms_per_token=5e-324",
                                   "uplink_bytes_per_s=5e-324"])
def test_known_extremes(nodes: Nodes, field: str) -> None:
    name, value = field.split("=")
    gen = common_pb2.GenerationConfig(max_new_tokens=4, seed=1)
    profile = common_pb2.EdgeProfile(draft_prefill_ms=5, draft_ms_per_token=1, rtt_ms=1,
                                     acceptance_prior=0.5)
    setattr(gen if name == "temperature" else profile, name, float(value))
    open_ = verifier_pb2.Open(request_id="x", question="What is moving?", generation=gen,
                              frames=verifier_pb2.FramesInput(frames=_FRAME_POOL),
                              edge_profile=profile, speculative=True)
    fuzz_generate(nodes, [verifier_pb2.EdgeMessage(open=open_)])


@pytest.mark.slow
@_settings(SLOW_EXAMPLES)
@given(messages=generate_calls)
def test_fuzz_generate_long(nodes: Nodes, messages: list[verifier_pb2.EdgeMessage]) -> None:
    fuzz_generate(nodes, messages)


@pytest.mark.slow
@_settings(SLOW_EXAMPLES)
@given(request=ask_requests)
def test_fuzz_ask_long(nodes: Nodes, request: edge_pb2.AskRequest) -> None:
    fuzz_ask(nodes, request)


@pytest.mark.slow
def test_servers_still_answer_after_long_fuzzing(nodes: Nodes) -> None:
    still_answering(nodes)
