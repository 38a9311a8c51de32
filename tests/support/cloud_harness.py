"""Helpers to drive a real in-process Verifier over real gRPC stubs."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import grpc
import numpy as np
import torch
from grpc import aio

from eventspec.cloud.config import CloudSettings
from eventspec.cloud.server import VerifierServer
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.contract import convert_verifier
from eventspec.shared.contract.timing import CloudCost, TimingPlan
from eventspec.shared.contract.types import (
    CommitEvent,
    DoneEvent,
    GenerationSettings,
    OpenRequest,
    ServerLimits,
)
from eventspec.shared.node.imageproc import encode_png
from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc

#: (committed length, committed so far) -> the tail to send after it, a (base, tail) pair
#: for a tail from another base, or None for no message.
DraftPolicy = Callable[[int, Sequence[int]], list[int] | tuple[int, list[int]] | None]


def make_frames(seed: int, n: int = 8, size: int = 40) -> tuple[bytes, ...]:
    """n random PNG frames (lossless, so both paths see identical pixels)."""
    rng = np.random.default_rng(seed)
    return tuple(
        encode_png(rng.integers(0, 256, (size, size + 8, 3), dtype=np.uint8)) for _ in range(n)
    )


#: The cost model in-process test verifiers plan with, injected as ``VerifierServer(...,
#: cost=TEST_COST)`` (CPU tiny-random magnitudes): calibrating takes seconds to minutes
#: on a busy machine, and these tests are not about the plan. A test about calibration
#: leaves it out; ``eventspec-cloud`` itself always calibrates or reuses a saved profile.
TEST_COST = CloudCost(
    prefill_base_ms=5.0,
    prefill_ms_per_visual_token=0.05,
    prefill_ms_per_text_token=0.05,
    step_base_ms=2.0,
    step_ms_per_token=0.1,
    device="fixed",
    calibration="fixed test constants (tests.support.cloud_harness.TEST_COST)",
)


def tiny_kv_gb(slots: int) -> float:
    """A KV budget holding exactly ``slots`` default-size slots of the tiny target: 1 KiB
    of KV per position (2 layers x K,V x 4 heads x 16 x fp32), and positions per slot as
    the server sizes them when ``--max-seq-len`` is unset (prompt + 256 question tokens +
    the 512-token answer cap)."""
    from eventspec.cloud.engine.kv import auto_max_seq_len
    from eventspec.demoworld.tiny_target import build_tiny_random_target

    base = len(build_tiny_random_target(seed=0).build_prompt_ids(""))
    positions = auto_max_seq_len(base, ServerLimits().max_new_tokens, 4096)
    return (slots * positions + 512) / 2**20


def settings(*, input_timeout_s: float = 5.0, session_ttl_s: float = 600.0,
             kv_cache_gb: float | None = None, kv_queue: int = 64, kv_wait_s: float = 30.0,
             **limits: int) -> CloudSettings:
    """In-process test settings: port 0, a short grace; pass ``cost=TEST_COST`` (or the
    cost of the engine you inject) to the ``VerifierServer``, or it calibrates."""
    return replace(
        CloudSettings(),
        port=0,
        kv_cache_gb=kv_cache_gb,
        limits=replace(ServerLimits(), **limits),
        input_timeout_s=input_timeout_s,
        session_ttl_s=session_ttl_s,
        grace_s=0.5,
        kv_queue=kv_queue,
        kv_wait_s=kv_wait_s,
    )


async def start_verifier(
    target: TargetModel | None = None,
    *,
    input_timeout_s: float = 5.0,
    session_ttl_s: float = 600.0,
    kv_cache_gb: float | None = None,
    kv_queue: int = 64,
    kv_wait_s: float = 30.0,
    **limits: int,
) -> VerifierServer:
    server = VerifierServer(
        settings(input_timeout_s=input_timeout_s, session_ttl_s=session_ttl_s,
                 kv_cache_gb=kv_cache_gb, kv_queue=kv_queue, kv_wait_s=kv_wait_s, **limits),
        target=target or build_tiny_random_target(seed=0),
        cost=TEST_COST,
    )
    await server.start()
    return server


def open_msg(question: str, frames: Sequence[bytes], *, max_new_tokens: int = 16,
             speculative: bool = True, temperature: float = 0.0, seed: int = 0,
             deadline_ms: int = 0, stop: Sequence[str] = ()) -> verifier_pb2.EdgeMessage:
    from eventspec.shared.contract.timing import EdgeCost

    req = OpenRequest(
        request_id=f"test-{question[:8]}",
        question=question,
        generation=GenerationSettings(max_new_tokens=max_new_tokens, temperature=temperature,
                                      seed=seed, stop=tuple(stop)),
        frames=tuple(frames),
        edge_cost=EdgeCost(5.0, 1.0, 0.0, 0.0, 0.5) if speculative else None,
        deadline_ms=deadline_ms,
        speculative=speculative,
    )
    return verifier_pb2.EdgeMessage(open=convert_verifier.open_to_pb(req))


def drafts_msg(base: int, tail: Sequence[int]) -> verifier_pb2.EdgeMessage:
    return verifier_pb2.EdgeMessage(drafts=verifier_pb2.Drafts(base=base, token_ids=list(tail)))


@dataclass
class Outcome:
    tokens: list[int]
    done: DoneEvent
    commits: list[CommitEvent] = field(default_factory=list)
    #: Plans after the first: the cloud re-planned while the answer decoded.
    replans: list[TimingPlan] = field(default_factory=list)


async def run_generate(
    port: int,
    first: verifier_pb2.EdgeMessage,
    *,
    hidden: list[int] | None = None,
    policy: DraftPolicy | None = None,
    extra: Sequence[verifier_pb2.EdgeMessage] = (),
    timeout: float = 60.0,
) -> Outcome:
    """One Generate call: Open, optional hidden drafts, then drafts per Commit."""
    async with aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = verifier_pb2_grpc.VerifierStub(ch)
        call = stub.Generate(timeout=timeout)
        await call.write(first)
        for m in extra:
            await call.write(m)
        if hidden:
            await call.write(drafts_msg(0, hidden))
        committed: list[int] = []
        commits: list[CommitEvent] = []
        plans: list[TimingPlan] = []
        while True:
            msg = await call.read()
            assert msg is not aio.EOF, "stream ended without Done"
            event = convert_verifier.cloud_message_from_pb(msg)
            if isinstance(event, DoneEvent):
                break
            if isinstance(event, TimingPlan):
                assert not plans or commits, "a second Plan before any Commit"
                plans.append(event)
            if isinstance(event, CommitEvent):
                assert event.start == len(committed)
                committed.extend(event.token_ids)
                commits.append(event)
                if policy is not None:
                    sent = policy(len(committed), committed)
                    if sent is not None:
                        base, tail = sent if isinstance(sent, tuple) else (len(committed), sent)
                        with contextlib.suppress(grpc.RpcError, aio.UsageError):
                            await call.write(drafts_msg(base, tail))
        await call.done_writing()
        assert list(event.token_ids) == committed
        return Outcome(committed, event, commits, plans[1:])


# -- draft policies over a known target answer ----------------------------------------------


def perfect(truth: Sequence[int], k: int = 6) -> DraftPolicy:
    return lambda base, _c: list(truth[base : base + k]) or None


def all_wrong(truth: Sequence[int], vocab: int, k: int = 6) -> DraftPolicy:
    return lambda base, _c: [(t + 7) % vocab for t in truth[base : base + k]] or None


def random_wrong(truth: Sequence[int], vocab: int, seed: int, k: int = 6,
                 p: float = 0.3) -> DraftPolicy:
    rng = random.Random(seed)

    def policy(base: int, _c: Sequence[int]) -> list[int] | None:
        tail = [t if rng.random() > p else (t + 1 + rng.randrange(vocab - 1)) % vocab
                for t in truth[base : base + k]]
        return tail or None

    return policy


def stale(truth: Sequence[int], vocab: int) -> DraftPolicy:
    """Tails from an older base whose overlap disagrees with what was committed."""

    def policy(base: int, committed: Sequence[int]) -> list[int] | None:
        if base == 0:
            return None
        wrong = (committed[-1] + 1) % vocab
        return [wrong, *truth[base : base + 3]]

    return policy


def target_greedy(target: TargetModel, question: str, frames: Sequence[bytes],
                  max_new: int) -> list[int]:
    """HF ``generate`` on the same model and inputs, non-text ids suppressed."""
    ids = target.build_prompt_ids(question)
    pix = target.preprocess_frames(frames)
    with torch.inference_mode():
        out = target.model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            pixel_values_videos=pix,
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=target.eos_token_id,
            pad_token_id=target.eos_token_id,
            suppress_tokens=list(range(target.text_vocab_size, target.vocab_size)),
        )
    return [int(t) for t in out[0, len(ids) :]]


# -- aligned features, raw streams and error expectations -----------------------------------

FEATURES = "video_features"


def features_for(target: TargetModel, frames: Sequence[bytes]) -> torch.Tensor:
    """The cloud's own pre-projector video features for ``frames`` -> [F, T, D] float32."""
    feats = target.video_features_from_pixels(target.preprocess_frames(frames))
    return feats.float().contiguous()


def aligned_open_msg(question: str, *, dtype: str = "float32",
                     shape: Sequence[int] | None = None, max_new_tokens: int = 16,
                     speculative: bool = False, deadline_ms: int = 0,
                     geometry: tuple[int, int, int] = (8, 17, 32)) -> verifier_pb2.EdgeMessage:
    """Open declaring that aligned features (default: the tiny target's geometry) follow."""
    from eventspec.shared.contract.timing import EdgeCost
    from eventspec.shared.contract.types import AlignedSpec

    req = OpenRequest(
        request_id=f"aligned-{question[:8]}",
        question=question,
        generation=GenerationSettings(max_new_tokens=max_new_tokens),
        aligned=AlignedSpec(dtype=dtype, shape=tuple(shape if shape is not None else geometry)),
        edge_cost=EdgeCost(5.0, 1.0, 0.0, 0.0, 0.5) if speculative else None,
        deadline_ms=deadline_ms,
        speculative=speculative,
    )
    return verifier_pb2.EdgeMessage(open=convert_verifier.open_to_pb(req))


def tensor_msgs(tensor: torch.Tensor | np.ndarray, *, name: str = FEATURES,
                chunk_bytes: int = 4096,
                scale: float | None = None) -> list[verifier_pb2.EdgeMessage]:
    """Header then chunks of ``tensor``, as EdgeMessages, via the real codec."""
    from eventspec.shared.contract.codec import WireDtype, encode_tensor
    from eventspec.shared.contract.types import TensorChunkData

    dtype = None
    if isinstance(tensor, torch.Tensor):
        if tensor.dtype == torch.bfloat16:
            dtype = WireDtype.BFLOAT16
            tensor = tensor.view(torch.int16).numpy().view(np.uint16)
        else:
            tensor = tensor.numpy()
    header, chunks = encode_tensor(name, tensor, dtype=dtype, chunk_bytes=chunk_bytes,
                                   scale=scale)
    out = [convert_verifier.edge_message_to_pb(header)]
    out += [convert_verifier.edge_message_to_pb(TensorChunkData(name, i, bytes(c)))
            for i, c in enumerate(chunks)]
    return out


async def drain(call: aio.StreamStreamCall) -> list[verifier_pb2.CloudMessage]:
    """Read a Generate stream to its end; raises AioRpcError if it ends with an error."""
    msgs: list[verifier_pb2.CloudMessage] = []
    while True:
        msg = await call.read()
        if msg is aio.EOF:
            return msgs
        msgs.append(msg)


@dataclass
class Failure:
    code: grpc.StatusCode
    details: str
    received: list[verifier_pb2.CloudMessage]


def _expect_failure_sync(port: int, messages: Sequence[verifier_pb2.EdgeMessage],
                         half_close: bool, timeout: float,
                         channel_options: Sequence[tuple[str, int]]) -> Failure:
    finished = threading.Event()

    def requests() -> Iterator[verifier_pb2.EdgeMessage]:
        yield from messages
        if not half_close:
            finished.wait(timeout + 5)  # keep the stream open until the server ends it

    received: list[verifier_pb2.CloudMessage] = []
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=list(channel_options)) as ch:
        stub = verifier_pb2_grpc.VerifierStub(ch)
        try:
            for msg in stub.Generate(requests(), timeout=timeout):
                received.append(msg)
        except grpc.RpcError as err:
            code, details = err.code(), err.details() or ""
        else:
            code, details = grpc.StatusCode.OK, ""
        finally:
            finished.set()
    assert not any(m.HasField("done") for m in received), f"got Done: {received[-1]}"
    assert code != grpc.StatusCode.OK, "stream ended OK, expected an error status"
    return Failure(code, details, received)


async def expect_failure(port: int, messages: Sequence[verifier_pb2.EdgeMessage], *,
                         half_close: bool = False, timeout: float = 15.0,
                         channel_options: Sequence[tuple[str, int]] = ()) -> Failure:
    """Send ``messages`` on one Generate stream and return the status it ends with.

    The stream is left open (no half-close) unless asked, so a server that waits for
    more input instead of rejecting what it got shows up as DEADLINE_EXCEEDED at the
    client's deadline, never a hang. Asserts that no Done arrived.

    This uses the synchronous stub in a thread: the asyncio client reports
    ``INTERNAL: Internal error from Core`` instead of the server's status when a write
    races with the server ending the stream (grpc/grpc#36066), which would hide the
    status under test.
    """
    return await asyncio.to_thread(
        _expect_failure_sync, port, messages, half_close, timeout, channel_options
    )


async def wait_for_sessions(server: VerifierServer, n: int = 0, timeout: float = 5.0) -> None:
    """Poll until ``n`` streams are registered and ``n`` KV slots are held."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while server.live_sessions != n or server.held_slots != n:
        assert loop.time() < deadline, (
            f"live sessions {server.live_sessions}, slots held {server.held_slots}, expected {n}"
        )
        await asyncio.sleep(0.02)
