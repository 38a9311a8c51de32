"""A 40 MB tensor through a real in-process grpc.aio server, chunked, bit-exact.

The service is defined ad hoc with a generic handler (no new .proto): requests are
``EdgeMessage`` with ``tensor_header`` / ``tensor_chunk``, the reply is a
``TensorHeader`` echoing what the server reassembled. The same bytes as one
message must be refused with RESOURCE_EXHAUSTED, proving the size limits are real.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

import grpc
import numpy as np
import pytest

from eventspec.shared.contract.codec import (
    TensorHeaderInfo,
    WireDtype,
    encode_tensor,
)
from eventspec.shared.contract.errors import CodecError
from eventspec.shared.contract.tensor_assembly import TensorAssembler
from eventspec.shared.pb.eventspec.v1 import common_pb2, verifier_pb2
from eventspec.shared.wire.status import to_grpc

MiB = 1 << 20
MAX_MESSAGE = 4 * MiB + 64 * 1024  # 4 MiB plus framing slack
LIMITS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
]
METHOD = "/eventspec.test.TensorSink/Upload"
DEADLINE_S = 60.0


def _header_from_pb(h: common_pb2.TensorHeader) -> TensorHeaderInfo:
    return TensorHeaderInfo(
        name=h.name,
        dtype=WireDtype.from_wire(h.dtype),
        shape=tuple(h.shape),
        total_bytes=h.total_bytes,
        crc32=h.crc32,
        num_chunks=h.num_chunks,
        scale=h.scale,
    )


def _header_to_pb(h: TensorHeaderInfo) -> common_pb2.TensorHeader:
    return common_pb2.TensorHeader(
        name=h.name,
        dtype=h.dtype.value,  # type: ignore[arg-type]
        shape=list(h.shape),
        total_bytes=h.total_bytes,
        crc32=h.crc32,
        num_chunks=h.num_chunks,
        scale=h.scale,
    )


class _Sink:
    """Reassembles one tensor per call and keeps it for the test to compare."""

    def __init__(self) -> None:
        self.received: list[np.ndarray] = []

    async def upload(
        self,
        requests: AsyncIterator[verifier_pb2.EdgeMessage],
        context: grpc.aio.ServicerContext[verifier_pb2.EdgeMessage, common_pb2.TensorHeader],
    ) -> common_pb2.TensorHeader:
        assembler: TensorAssembler | None = None
        header_pb = common_pb2.TensorHeader()
        try:
            async for msg in requests:
                kind = msg.WhichOneof("kind")
                if kind == "tensor_header":
                    header_pb = msg.tensor_header
                    assembler = TensorAssembler(
                        _header_from_pb(header_pb), max_bytes=64 * MiB, expected_name="big"
                    )
                elif kind == "tensor_chunk" and assembler is not None:
                    chunk = msg.tensor_chunk
                    assembler.add_chunk(chunk.index, chunk.data, name=chunk.name)
                else:
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"unexpected {kind}")
            if assembler is None:
                raise CodecError("the stream ended without a tensor header")
            tensor = assembler.finish()
        except CodecError as exc:
            await context.abort(to_grpc(exc.code), exc.message)
        self.received.append(tensor)
        return header_pb


@asynccontextmanager
async def _serve(sink: _Sink) -> AsyncIterator[str]:
    server = grpc.aio.server(options=LIMITS)
    handler = grpc.method_handlers_generic_handler(
        "eventspec.test.TensorSink",
        {
            "Upload": grpc.stream_unary_rpc_method_handler(
                sink.upload,
                request_deserializer=verifier_pb2.EdgeMessage.FromString,
                response_serializer=common_pb2.TensorHeader.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    assert port > 0
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


def _upload_stub(
    channel: grpc.aio.Channel,
) -> grpc.aio.StreamUnaryMultiCallable[verifier_pb2.EdgeMessage, common_pb2.TensorHeader]:
    return channel.stream_unary(
        METHOD,
        request_serializer=verifier_pb2.EdgeMessage.SerializeToString,
        response_deserializer=common_pb2.TensorHeader.FromString,
    )


def _messages(
    header: TensorHeaderInfo, chunks: Iterable[memoryview]
) -> Iterable[verifier_pb2.EdgeMessage]:
    yield verifier_pb2.EdgeMessage(tensor_header=_header_to_pb(header))
    for i, c in enumerate(chunks):
        yield verifier_pb2.EdgeMessage(
            tensor_chunk=common_pb2.TensorChunk(name=header.name, index=i, data=bytes(c))
        )


def _big_tensor() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((10, 1000, 1000), dtype=np.float32)  # 40 MB


@pytest.mark.asyncio
async def test_40mb_tensor_streams_in_chunks_bit_exact() -> None:
    tensor = _big_tensor()
    header, chunks = encode_tensor("big", tensor)
    assert header.total_bytes == 40_000_000 and header.num_chunks == 39
    sink = _Sink()
    async with _serve(sink) as target, grpc.aio.insecure_channel(target, options=LIMITS) as ch:
        reply = await _upload_stub(ch)(_messages(header, chunks), timeout=DEADLINE_S)
    assert reply.crc32 == header.crc32 == zlib.crc32(tensor.tobytes())
    assert len(sink.received) == 1
    assert np.array_equal(sink.received[0], tensor)


@pytest.mark.asyncio
async def test_corrupted_chunk_is_invalid_argument() -> None:
    tensor = np.arange(3 * MiB // 4, dtype=np.float32)  # 3 MiB, 3 chunks
    header, chunks = encode_tensor("big", tensor)
    bad = [*chunks[:-1], memoryview(b"\x00" * len(chunks[-1]))]
    sink = _Sink()
    async with _serve(sink) as target, grpc.aio.insecure_channel(target, options=LIMITS) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _upload_stub(ch)(_messages(header, bad), timeout=DEADLINE_S)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "checksum mismatch" in (info.value.details() or "")
    assert sink.received == []


@pytest.mark.asyncio
async def test_40mb_as_one_message_is_resource_exhausted() -> None:
    tensor = _big_tensor()
    header, _ = encode_tensor("big", tensor, chunk_bytes=1 << 30)
    assert header.num_chunks == 1
    one = list(_messages(header, [memoryview(tensor).cast("B")]))
    sink = _Sink()
    permissive = [
        ("grpc.max_receive_message_length", 64 * MiB),
        ("grpc.max_send_message_length", 64 * MiB),
    ]
    async with _serve(sink) as target:
        # The client's own send limit refuses it before it leaves...
        async with grpc.aio.insecure_channel(target, options=LIMITS) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _upload_stub(ch)(iter(one), timeout=DEADLINE_S)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # ...and a client without that limit is refused by the server's receive limit.
        async with grpc.aio.insecure_channel(target, options=permissive) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _upload_stub(ch)(iter(one), timeout=DEADLINE_S)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert sink.received == []
