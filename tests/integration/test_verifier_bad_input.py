"""Bad input over real gRPC: every malformed stream ends with a clear status, never a hang,
and a well-formed request running alongside on the same server is unaffected."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import grpc
import pytest
import pytest_asyncio
import torch
from grpc import aio

from eventspec.cloud.server import VerifierServer
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.pb.eventspec.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from tests.support import cloud_harness as h

pytestmark = pytest.mark.asyncio(loop_scope="module")

Msgs = list[verifier_pb2.EdgeMessage]
INVALID = grpc.StatusCode.INVALID_ARGUMENT
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED

GOOD_Q = "What is moving?"
GOOD_SEED = 1003
GOOD_MAX = 12
SMALL_TENSOR_CAP = 10_000  # fp32 tiny features are 8*17*32*4 = 17408 bytes, int8 4352
SMALL_MESSAGE_CAP = 128 << 10


@pytest.fixture(scope="module")
def target() -> TargetModel:
    return build_tiny_random_target(seed=0)


@pytest.fixture(scope="module")
def reference(target: TargetModel) -> list[int]:
    return h.target_greedy(target, GOOD_Q, h.make_frames(GOOD_SEED), GOOD_MAX)


@pytest.fixture(scope="module")
def features(target: TargetModel) -> torch.Tensor:
    return h.features_for(target, h.make_frames(GOOD_SEED))  # [8, 17, 32]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server() -> AsyncIterator[VerifierServer]:
    srv = await h.start_verifier(max_sessions=8)
    yield srv
    await srv.stop(0)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def small_server() -> AsyncIterator[VerifierServer]:
    srv = await h.start_verifier(
        max_sessions=8, max_tensor_bytes=SMALL_TENSOR_CAP, max_message_bytes=SMALL_MESSAGE_CAP
    )
    yield srv
    await srv.stop(0)


def _open(**kw: object) -> verifier_pb2.EdgeMessage:
    return h.open_msg(GOOD_Q, h.make_frames(GOOD_SEED), max_new_tokens=GOOD_MAX, **kw)  # type: ignore[arg-type]


def _aligned(**kw: object) -> verifier_pb2.EdgeMessage:
    return h.aligned_open_msg(GOOD_Q, max_new_tokens=GOOD_MAX, **kw)  # type: ignore[arg-type]


def _with_open(mutate: Callable[[verifier_pb2.Open], None],
               base: verifier_pb2.EdgeMessage | None = None) -> verifier_pb2.EdgeMessage:
    msg = verifier_pb2.EdgeMessage()
    msg.CopyFrom(base if base is not None else _open())
    mutate(msg.open)
    return msg


def _with_header(msgs: Msgs, mutate: Callable[[common_pb2.TensorHeader], None]) -> Msgs:
    out = [verifier_pb2.EdgeMessage() for _ in msgs]
    for o, m in zip(out, msgs, strict=True):
        o.CopyFrom(m)
    mutate(out[0].tensor_header)
    return out


async def _good(port: int, reference: list[int], *, first: verifier_pb2.EdgeMessage | None = None,
                extra: Sequence[verifier_pb2.EdgeMessage] = ()) -> None:
    out = await h.run_generate(port, first or _open(speculative=False), extra=extra, timeout=30)
    assert out.tokens == reference, "a good request next to a bad one got different tokens"


async def _check(srv: VerifierServer, reference: list[int], msgs: Msgs, code: grpc.StatusCode,
                 needle: str, *, half_close: bool = False,
                 good: Awaitable[None] | None = None) -> h.Failure:
    """The bad stream fails with ``code`` / ``needle`` while a good one completes."""
    failure, _ = await asyncio.wait_for(
        asyncio.gather(
            h.expect_failure(srv.port, msgs, half_close=half_close, timeout=15),
            good if good is not None else _good(srv.port, reference),
        ),
        timeout=40,
    )
    assert failure.code == code, (failure.code, failure.details)
    assert needle.lower() in failure.details.lower(), failure.details
    await h.wait_for_sessions(srv, 0)
    return failure


# -- stream order and envelopes --------------------------------------------------------------


async def test_drafts_before_open(server: VerifierServer, reference: list[int]) -> None:
    f = await _check(server, reference, [h.drafts_msg(0, [1, 2, 3])], PRECONDITION,
                     "first message must be Open")
    assert "Draft" in f.details


async def test_two_opens(server: VerifierServer, reference: list[int]) -> None:
    await _check(server, reference, [_aligned(), _aligned()], PRECONDITION, "second Open")


async def test_empty_envelope_first(server: VerifierServer, reference: list[int]) -> None:
    await _check(server, reference, [verifier_pb2.EdgeMessage()], INVALID, "no content")


async def test_empty_envelope_after_open(server: VerifierServer, reference: list[int]) -> None:
    await _check(server, reference, [_aligned(), verifier_pb2.EdgeMessage()], INVALID,
                 "no content")


async def test_stream_closed_without_open(server: VerifierServer, reference: list[int]) -> None:
    await _check(server, reference, [], INVALID, "ended before its Open", half_close=True)


async def test_tensor_on_frames_request(server: VerifierServer, reference: list[int],
                                        features: torch.Tensor) -> None:
    await _check(server, reference, [_open(), *h.tensor_msgs(features)], INVALID,
                 "Open declared frames")


# -- malformed tensor streams on an aligned-features Open ------------------------------------


async def test_chunk_before_header(server: VerifierServer, reference: list[int],
                                   features: torch.Tensor) -> None:
    msgs = h.tensor_msgs(features)
    await _check(server, reference, [_aligned(), msgs[1]], INVALID, "before its header")


async def test_bad_checksum(server: VerifierServer, reference: list[int],
                            features: torch.Tensor) -> None:
    def corrupt(hdr: common_pb2.TensorHeader) -> None:
        hdr.crc32 ^= 0x1

    msgs = _with_header(h.tensor_msgs(features), corrupt)
    await _check(server, reference, [_aligned(), *msgs], INVALID, "checksum mismatch")


async def test_header_shape_differs_from_geometry(server: VerifierServer, reference: list[int],
                                                  features: torch.Tensor) -> None:
    async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        info = await verifier_pb2_grpc.VerifierStub(ch).GetServerInfo(
            verifier_pb2.GetServerInfoRequest(), timeout=10
        )
    g = info.geometry
    assert list(features.shape) == [g.num_frames, g.tokens_per_frame, g.feature_dim]
    wrong = features.reshape(g.num_frames, g.tokens_per_frame * 2, g.feature_dim // 2)
    f = await _check(server, reference, [_aligned(), *h.tensor_msgs(wrong)], INVALID,
                     "GetServerInfo.geometry")
    assert str([g.num_frames, g.tokens_per_frame, g.feature_dim]) in f.details


async def test_total_bytes_mismatch(server: VerifierServer, reference: list[int],
                                    features: torch.Tensor) -> None:
    def grow(hdr: common_pb2.TensorHeader) -> None:
        hdr.total_bytes += 4

    msgs = _with_header(h.tensor_msgs(features), grow)
    await _check(server, reference, [_aligned(), *msgs], INVALID, "total_bytes")


async def test_stream_ends_with_a_chunk_missing(server: VerifierServer, reference: list[int],
                                                features: torch.Tensor) -> None:
    msgs = h.tensor_msgs(features)
    assert len(msgs) > 3
    await _check(server, reference, [_aligned(), *msgs[:-1]], INVALID,
                 "before the aligned features were complete", half_close=True)


async def test_skipped_chunk(server: VerifierServer, reference: list[int],
                             features: torch.Tensor) -> None:
    msgs = h.tensor_msgs(features)
    await _check(server, reference, [_aligned(), msgs[0], msgs[1], msgs[3]], INVALID,
                 "missing chunk 1")


async def test_duplicate_chunk(server: VerifierServer, reference: list[int],
                               features: torch.Tensor) -> None:
    msgs = h.tensor_msgs(features)
    await _check(server, reference, [_aligned(), msgs[0], msgs[1], msgs[1]], INVALID,
                 "duplicate")


async def test_unknown_dtype(server: VerifierServer, reference: list[int],
                             features: torch.Tensor) -> None:
    def unknown(hdr: common_pb2.TensorHeader) -> None:
        hdr.dtype = 99  # type: ignore[assignment]

    msgs = _with_header(h.tensor_msgs(features), unknown)
    await _check(server, reference, [_aligned(), *msgs], INVALID, "unknown or unspecified dtype")


async def test_dtype_differs_from_open(server: VerifierServer, reference: list[int],
                                       features: torch.Tensor) -> None:
    from eventspec.shared.contract.codec import quantize_int8

    q, scale = quantize_int8(features.numpy())
    await _check(server, reference, [_aligned(dtype="float32"), *h.tensor_msgs(q, scale=scale)],
                 INVALID, "expected dtype FLOAT32")


async def test_unspecified_aligned_dtype_in_open(server: VerifierServer,
                                                 reference: list[int]) -> None:
    def unspecified(o: verifier_pb2.Open) -> None:
        o.aligned.dtype = 0  # type: ignore[assignment]

    await _check(server, reference, [_with_open(unspecified, _aligned())], INVALID,
                 "unknown dtype")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
async def test_non_finite_features(server: VerifierServer, reference: list[int],
                                   features: torch.Tensor, bad: float) -> None:
    poisoned = features.clone()
    poisoned[3, 5, 7] = bad
    await _check(server, reference, [_aligned(), *h.tensor_msgs(poisoned)], INVALID,
                 "NaN or inf")


async def test_wrong_shape_in_open(server: VerifierServer, reference: list[int]) -> None:
    await _check(server, reference, [_aligned(shape=(8, 17, 1024))], INVALID,
                 "Open declares aligned features of shape [8, 17, 1024]")


# -- size caps --------------------------------------------------------------------------------


async def test_tensor_over_max_tensor_bytes(small_server: VerifierServer, reference: list[int],
                                            features: torch.Tensor) -> None:
    from eventspec.shared.contract.codec import quantize_int8

    assert features.numel() * 4 > SMALL_TENSOR_CAP
    f = await _check(small_server, reference, [_aligned(), *h.tensor_msgs(features)], EXHAUSTED,
                     f"limit of {SMALL_TENSOR_CAP} bytes")
    assert "video_features" in f.details
    # The same features as int8 fit under the cap and complete.
    q, scale = quantize_int8(features.numpy())
    out = await h.run_generate(small_server.port, _aligned(dtype="int8"),
                               extra=h.tensor_msgs(q, scale=scale), timeout=30)
    assert out.done.stats.new_tokens == len(out.tokens) > 0


async def test_message_over_max_message_bytes(small_server: VerifierServer,
                                              reference: list[int]) -> None:
    frames = list(h.make_frames(GOOD_SEED))
    frames[0] = frames[0] + b"\0" * (SMALL_MESSAGE_CAP + 1024)  # one message past the cap
    huge = h.open_msg(GOOD_Q, frames, max_new_tokens=GOOD_MAX)
    assert huge.ByteSize() > SMALL_MESSAGE_CAP
    await _check(small_server, reference, [huge], EXHAUSTED, "larger than max")


async def test_frame_over_max_frame_bytes(reference: list[int], features: torch.Tensor) -> None:
    srv = await h.start_verifier(max_frame_bytes=1000)
    try:
        # The good request sends aligned features (its frames would be over the cap too).
        good = _good(srv.port, reference, first=_aligned(), extra=h.tensor_msgs(features))
        await _check(srv, reference, [_open()], EXHAUSTED, "over the cap of 1000", good=good)
    finally:
        await srv.stop(0)


# -- draft ids and bases -----------------------------------------------------------------------


@pytest.mark.parametrize("bad_id", [512, 513, 575, 576, 10**9, -1])
async def test_draft_ids_outside_text_vocab(server: VerifierServer, reference: list[int],
                                            bad_id: int) -> None:
    msgs = [_aligned(speculative=True), h.drafts_msg(0, [5, bad_id, 6])]
    f = await _check(server, reference, msgs, INVALID, "outside the shared text vocabulary")
    assert str(bad_id) in f.details and "512" in f.details


async def test_drafts_base_beyond_committed(server: VerifierServer,
                                            reference: list[int]) -> None:
    msgs = [_aligned(speculative=True), h.drafts_msg(5, [1, 2])]
    await _check(server, reference, msgs, INVALID, "Drafts.base 5 is outside")


async def test_drafts_tail_over_cap(server: VerifierServer, reference: list[int]) -> None:
    msgs = [_aligned(speculative=True), h.drafts_msg(0, [7] * 129)]
    await _check(server, reference, msgs, INVALID, "exceeds the cap of 128")


# -- Open fields -------------------------------------------------------------------------------


async def test_undecodable_frames(server: VerifierServer, reference: list[int]) -> None:
    frames = list(h.make_frames(GOOD_SEED))
    frames[2] = b"\x89PNG this is not an image"
    await _check(server, reference, [h.open_msg(GOOD_Q, frames)], INVALID, "could not decode")


async def test_zero_frames(server: VerifierServer, reference: list[int]) -> None:
    def no_frames(o: verifier_pb2.Open) -> None:
        o.frames.Clear()
        o.frames.SetInParent()

    f = await _check(server, reference, [_with_open(no_frames)], INVALID, "frames")
    assert "0 frames" in f.details or "no visual input" in f.details


async def test_no_visual_input(server: VerifierServer, reference: list[int]) -> None:
    await _check(server, reference, [_with_open(lambda o: o.ClearField("frames"))], INVALID,
                 "no visual input")


async def test_wrong_frame_count(server: VerifierServer, reference: list[int]) -> None:
    frames = h.make_frames(GOOD_SEED)[:7]
    await _check(server, reference, [h.open_msg(GOOD_Q, frames)], INVALID,
                 "has 7 frames; this verifier needs exactly 8")


@pytest.mark.parametrize("question", ["", "   \n"])
async def test_empty_question(server: VerifierServer, reference: list[int], question: str) -> None:
    await _check(server, reference, [h.open_msg(question, h.make_frames(GOOD_SEED))], INVALID,
                 "question is empty")


async def test_question_with_placeholders(server: VerifierServer, reference: list[int]) -> None:
    await _check(server, reference, [h.open_msg("what <video> is", h.make_frames(GOOD_SEED))],
                 INVALID, "special tokens")


async def test_max_new_tokens_over_cap(server: VerifierServer, reference: list[int]) -> None:
    msg = _with_open(lambda o: setattr(o.generation, "max_new_tokens", 10_000))
    await _check(server, reference, [msg], INVALID, "exceeds this server's cap of 512")


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("temperature", -0.5, "temperature must be"),
        ("temperature", float("nan"), "temperature must be"),
        ("top_p", 1.5, "top_p"),
        ("max_new_tokens", -3, "max_new_tokens must be >= 0"),
    ],
)
async def test_bad_generation_settings(server: VerifierServer, reference: list[int], field: str,
                                       value: float, needle: str) -> None:
    await _check(server, reference, [_with_open(lambda o: setattr(o.generation, field, value))],
                 INVALID, needle)


async def test_negative_deadline(server: VerifierServer, reference: list[int]) -> None:
    await _check(server, reference, [_with_open(lambda o: setattr(o, "deadline_ms", -1))],
                 INVALID, "deadline_ms must be >= 0")


async def test_non_finite_edge_profile(server: VerifierServer, reference: list[int]) -> None:
    await _check(server, reference,
                 [_with_open(lambda o: setattr(o.edge_profile, "rtt_ms", float("inf")))],
                 INVALID, "rtt_ms must be a finite number")


# -- garbage on the wire -----------------------------------------------------------------------


async def test_garbage_bytes_are_an_error_not_a_hang(server: VerifierServer,
                                                     reference: list[int]) -> None:
    async def garbage() -> tuple[grpc.StatusCode, str]:
        async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            call = ch.stream_stream("/eventspec.v1.Verifier/Generate")(timeout=10)
            try:
                await call.write(b"\xff\xfe\xfd not a protobuf \x00\x01")
                await call.read()
            except (grpc.RpcError, aio.UsageError, asyncio.InvalidStateError):
                pass
            return await call.code(), await call.details() or ""

    (code, details), _ = await asyncio.gather(garbage(), _good(server.port, reference))
    assert code == INVALID, (code, details)
    assert "malformed request message" in details
    await h.wait_for_sessions(server, 0)


async def test_unknown_method_is_unimplemented(server: VerifierServer) -> None:
    async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        with pytest.raises(grpc.RpcError) as err:
            await ch.unary_unary("/eventspec.v1.Verifier/Nope")(b"", timeout=10)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED



async def test_a_huge_echoed_field_is_cut_not_a_metadata_error(
        server: VerifierServer, reference: list[int], features: torch.Tensor) -> None:
    """Red-team (issue 38, finding 8): a 10,000-character TensorHeader.name was copied
    into the error, whose details then broke gRPC's metadata limit (RESOURCE_EXHAUSTED
    "metadata size exceeds soft limit"). The details are cut, the code stays right."""

    def long_name(hdr: common_pb2.TensorHeader) -> None:
        hdr.name = "x" * 10_000

    msgs = _with_header(h.tensor_msgs(features), long_name)
    failure = await _check(server, reference, [_aligned(), *msgs], INVALID,
                           "unexpected tensor name")
    assert len(failure.details) <= 1_100 and "characters cut" in failure.details
