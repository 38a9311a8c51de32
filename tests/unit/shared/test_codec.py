"""Tensor codec: bit-exact round trips and every malformed stream rejected clearly."""

from __future__ import annotations

import dataclasses
import math
import zlib

import numpy as np
import pytest

from eventspec.shared.contract.codec import (
    DEFAULT_CHUNK_BYTES,
    TensorHeaderInfo,
    WireDtype,
    dequantize,
    encode_tensor,
    quantize_int8,
)
from eventspec.shared.contract.errors import CodecError, InvalidInput
from eventspec.shared.contract.tensor_assembly import TensorAssembler

MiB = 1 << 20


def _sample(dtype: WireDtype, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Random values of ``dtype`` (bf16 as the uint16 bit patterns of real bf16 values)."""
    rng = np.random.default_rng(seed)
    if dtype is WireDtype.BFLOAT16:
        x = (rng.standard_normal(shape) * 100).astype(np.float32)
        return (x.view(np.uint32) >> 16).astype(np.uint16)
    np_dtype = dtype.numpy_dtype
    if np.issubdtype(np_dtype, np.floating):
        return (rng.standard_normal(shape) * 100).astype(np_dtype)
    info = np.iinfo(np_dtype)
    return rng.integers(info.min, info.max, shape, dtype=np.int64).astype(np_dtype)


def _roundtrip(
    name: str, t: np.ndarray, chunk_bytes: int, scale: float | None = None,
    dtype: WireDtype | None = None,
) -> np.ndarray:
    header, chunks = encode_tensor(name, t, dtype=dtype, chunk_bytes=chunk_bytes, scale=scale)
    asm = TensorAssembler(header, max_bytes=64 * MiB, expected_name=name)
    for i, c in enumerate(chunks):
        assert not asm.done
        asm.add_chunk(i, bytes(c), name=name)
    assert asm.done
    assert asm.received_bytes == header.total_bytes
    assert asm.received_chunks == header.num_chunks
    return asm.finish()


def _bits(t: np.ndarray) -> np.ndarray:
    """Same-width integer view, so NaN payloads and -0.0 compare bit for bit."""
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[t.itemsize]
    return np.ascontiguousarray(t).view(width)


DTYPES = list(WireDtype)
SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 4), (8, 257, 16)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_roundtrip_is_bit_exact(dtype: WireDtype, shape: tuple[int, ...]) -> None:
    t = _sample(dtype, shape)
    scale = 0.5 if dtype is WireDtype.INT8 else None
    out = _roundtrip("x", t, chunk_bytes=1000, scale=scale, dtype=dtype)
    assert out.dtype == dtype.numpy_dtype
    assert tuple(out.shape) == shape
    assert np.array_equal(_bits(out), _bits(t))


@pytest.mark.parametrize("chunk_bytes", [1, 2, 3, 7, 64, 4095, 4096, 4097, 1 << 30])
def test_chunk_sizes_from_one_byte_to_more_than_total(chunk_bytes: int) -> None:
    t = _sample(WireDtype.FLOAT32, (32, 32))  # 4096 bytes
    header, chunks = encode_tensor("x", t, chunk_bytes=chunk_bytes)
    assert header.num_chunks == math.ceil(4096 / chunk_bytes) == len(chunks)
    assert all(len(c) <= chunk_bytes for c in chunks)
    assert np.array_equal(_roundtrip("x", t, chunk_bytes), t)


def test_special_float_values_survive() -> None:
    t = np.array([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45], np.float32)
    for x in (t, t.astype(np.float16)):
        assert np.array_equal(_bits(_roundtrip("x", x, 3)), _bits(x))
    bf16 = (t.view(np.uint32) >> 16).astype(np.uint16)
    out = _roundtrip("x", bf16, 3, dtype=WireDtype.BFLOAT16)
    assert np.array_equal(out, bf16)


def test_non_contiguous_and_bf16_sent_as_uint16_pattern() -> None:
    base = _sample(WireDtype.BFLOAT16, (6, 4))
    t = base.T  # non-contiguous view
    header, chunks = encode_tensor("x", t, dtype=WireDtype.BFLOAT16)
    assert header.dtype is WireDtype.BFLOAT16 and header.shape == (4, 6)
    payload = b"".join(bytes(c) for c in chunks)
    expected = np.ascontiguousarray(t).astype("<u2").tobytes()
    assert payload == expected
    assert header.crc32 == zlib.crc32(expected)
    assert np.array_equal(_roundtrip("x", t, 5, dtype=WireDtype.BFLOAT16), t)


def test_bf16_widens_to_float32_exactly() -> None:
    x = np.array([1.0, -2.5, 3.140625, 0.0, -0.0, float("inf")], np.float32)  # exact in bf16
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)
    header, chunks = encode_tensor("x", bits, dtype=WireDtype.BFLOAT16)
    asm = TensorAssembler(header, max_bytes=MiB)
    asm.add_chunk(0, chunks[0])
    assert np.array_equal(_bits(asm.finish_float32()), _bits(x))


def test_bf16_needs_a_uint16_array() -> None:
    with pytest.raises(CodecError, match="BFLOAT16 is sent from a uint16 array"):
        encode_tensor("x", np.zeros(2, np.float16), dtype=WireDtype.BFLOAT16)


def test_chunks_are_zero_copy_slices() -> None:
    t = np.zeros(1024, dtype=np.float32)
    _, chunks = encode_tensor("x", t, chunk_bytes=1024)
    t[0] = 1.0  # visible through the chunk: no copy was made
    assert bytes(chunks[0][:4]) == np.array([1.0], np.float32).tobytes()


def test_default_chunk_size_is_one_mib() -> None:
    header, chunks = encode_tensor("x", np.zeros(MiB // 2 + 1, dtype=np.float32))
    assert MiB == DEFAULT_CHUNK_BYTES
    assert header.num_chunks == 3 and [len(c) for c in chunks] == [MiB, MiB, 4]


def test_empty_tensor_has_no_chunks_and_round_trips() -> None:
    t = np.zeros((3, 0, 5), dtype=np.float16)
    header, chunks = encode_tensor("empty", t)
    assert (header.total_bytes, header.num_chunks, chunks) == (0, 0, [])
    asm = TensorAssembler(header, max_bytes=0)
    assert asm.done
    out = asm.finish()
    assert out.shape == (3, 0, 5) and out.dtype == np.float16


def test_int8_quantize_roundtrip_and_finish_float32() -> None:
    x = np.random.default_rng(3).standard_normal((8, 257, 32)).astype(np.float32)
    q, scale = quantize_int8(x)
    assert q.dtype == np.int8 and int(np.abs(q).max()) == 127
    assert scale == float(np.float32(scale))  # survives the proto's float field
    header, chunks = encode_tensor("feats", q, scale=scale)
    assert header.dtype is WireDtype.INT8 and header.scale == scale
    asm = TensorAssembler(header, max_bytes=MiB)
    for i, c in enumerate(chunks):
        asm.add_chunk(i, c)
    y = asm.finish_float32()
    assert y.dtype == np.float32
    assert np.array_equal(y, dequantize(q, scale))
    assert float(np.abs(y - x).max()) <= scale / 2 + 1e-6  # the codec's stated error


def test_quantize_edge_cases() -> None:
    q, scale = quantize_int8(np.zeros(4, np.float32))
    assert scale == 1.0 and np.array_equal(q, np.zeros(4, dtype=np.int8))
    with pytest.raises(CodecError, match="NaN or infinity"):
        quantize_int8(np.array([1.0, float("nan")]))
    with pytest.raises(CodecError, match="floating"):
        quantize_int8(np.ones(3, dtype=np.int64))
    with pytest.raises(CodecError, match="positive finite scale"):
        dequantize(np.ones(2, dtype=np.int8), 0.0)
    with pytest.raises(CodecError, match="int8"):
        dequantize(np.ones(2), 1.0)


def test_finish_float32_casts_non_int8() -> None:
    header, chunks = encode_tensor("x", np.arange(4, dtype=np.float16))
    asm = TensorAssembler(header, max_bytes=MiB)
    asm.add_chunk(0, chunks[0])
    assert asm.finish_float32().dtype == np.float32


def test_codec_error_is_invalid_input() -> None:
    assert issubclass(CodecError, InvalidInput)


# ---------------------------------------------------------------- encode errors


def test_encode_rejects_bad_arguments() -> None:
    with pytest.raises(CodecError, match="cannot be sent"):
        encode_tensor("x", np.zeros(2, dtype=np.float64))
    with pytest.raises(CodecError, match="int8 needs a positive finite scale"):
        encode_tensor("x", np.zeros(2, dtype=np.int8))
    with pytest.raises(CodecError, match="int8 needs a positive finite scale"):
        encode_tensor("x", np.zeros(2, dtype=np.int8), scale=float("inf"))
    with pytest.raises(CodecError, match="only INT8 has a scale"):
        encode_tensor("x", np.zeros(2, np.float32), scale=1.0)
    with pytest.raises(CodecError, match="chunk_bytes"):
        encode_tensor("x", np.zeros(2, np.float32), chunk_bytes=0)
    with pytest.raises(CodecError, match="non-empty"):
        encode_tensor("", np.zeros(2, np.float32))


# ---------------------------------------------------------------- header errors


def _header(**overrides: object) -> TensorHeaderInfo:
    header, _ = encode_tensor("feats", np.zeros((4, 8), np.float32), chunk_bytes=64)  # 2 chunks
    return dataclasses.replace(header, **overrides)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, 7, 99, -1])
def test_unknown_wire_dtype_number(value: int) -> None:
    with pytest.raises(CodecError, match=f"unknown tensor dtype {value}"):
        WireDtype.from_wire(value)


def test_wire_dtype_numbers_match_proto() -> None:
    assert [d.value for d in WireDtype] == [1, 2, 3, 4, 5, 6]
    assert WireDtype.from_wire(3) is WireDtype.BFLOAT16


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"dtype": 0}, "unknown or unspecified dtype"),
        ({"dtype": "float32"}, "unknown or unspecified dtype"),
        ({"shape": (4, -8)}, r"shape\[1\] is negative"),
        ({"shape": (4, 2.5)}, r"shape\[1\] is 2.5, not an int"),
        ({"shape": (4, 9)}, "= 144 bytes, but the header declares total_bytes=128"),
        ({"total_bytes": 127}, "= 128 bytes, but the header declares total_bytes=127"),
        ({"num_chunks": 0}, "num_chunks=0 is inconsistent with 128 bytes"),
        ({"num_chunks": 129}, "num_chunks=129 is inconsistent"),
        ({"num_chunks": -1}, "num_chunks=-1 is inconsistent"),
        ({"crc32": 1 << 32}, "not a 32-bit"),
        ({"scale": 0.5}, "only INT8 has a scale"),
        ({"name": ""}, "empty name"),
    ],
)
def test_malformed_header_rejected_before_allocation(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(CodecError, match=message):
        TensorAssembler(_header(**overrides), max_bytes=MiB)


def test_empty_tensor_with_chunks_rejected() -> None:
    header = _header(shape=(4, 0), total_bytes=0, num_chunks=1)
    with pytest.raises(CodecError, match="empty tensor has no chunks"):
        TensorAssembler(header, max_bytes=MiB)


def test_header_over_cap_rejected() -> None:
    with pytest.raises(CodecError, match="128 bytes exceed the limit of 127 bytes"):
        TensorAssembler(_header(), max_bytes=127)
    huge = _header(shape=(1 << 40,), total_bytes=4 << 40, num_chunks=4 << 20)
    with pytest.raises(CodecError, match="exceed the limit"):
        TensorAssembler(huge, max_bytes=MiB)  # never tries to allocate 4 TiB


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_int8_header_needs_positive_finite_scale(scale: float) -> None:
    header = _header(dtype=WireDtype.INT8, shape=(4, 32), scale=scale)
    with pytest.raises(CodecError, match="INT8 needs a positive finite scale"):
        TensorAssembler(header, max_bytes=MiB)


def test_expectations_name_shape_dtype() -> None:
    with pytest.raises(CodecError, match="expected 'video_features', received 'feats'"):
        TensorAssembler(_header(), max_bytes=MiB, expected_name="video_features")
    with pytest.raises(CodecError, match=r"expected shape \[\*, 16\], received \[4, 8\]"):
        TensorAssembler(_header(), max_bytes=MiB, expected_shape=(None, 16))
    with pytest.raises(CodecError, match=r"expected shape \[4\], received \[4, 8\]"):
        TensorAssembler(_header(), max_bytes=MiB, expected_shape=(4,))
    with pytest.raises(CodecError, match="expected dtype FLOAT16, received FLOAT32"):
        TensorAssembler(_header(), max_bytes=MiB, expected_dtype=WireDtype.FLOAT16)
    TensorAssembler(_header(), max_bytes=MiB, expected_shape=(None, 8))  # wildcard ok


# ---------------------------------------------------------------- stream errors


def _stream() -> tuple[TensorAssembler, list[bytes]]:
    t = np.arange(64, dtype=np.float32)  # 256 B
    header, chunks = encode_tensor("feats", t, chunk_bytes=100)  # 100, 100, 56
    return TensorAssembler(header, max_bytes=MiB), [bytes(c) for c in chunks]


def test_duplicate_chunk() -> None:
    asm, chunks = _stream()
    asm.add_chunk(0, chunks[0])
    with pytest.raises(CodecError, match=r"duplicate or out-of-order chunk 0 \(expected chunk 1"):
        asm.add_chunk(0, chunks[0])


def test_out_of_order_chunk() -> None:
    asm, chunks = _stream()
    asm.add_chunk(0, chunks[0])
    asm.add_chunk(1, chunks[1])
    with pytest.raises(CodecError, match=r"out-of-order chunk 1 \(expected chunk 2"):
        asm.add_chunk(1, chunks[2])


def test_missing_chunk() -> None:
    asm, chunks = _stream()
    asm.add_chunk(0, chunks[0])
    with pytest.raises(CodecError, match="missing chunk 1: received chunk 2 instead"):
        asm.add_chunk(2, chunks[2])


@pytest.mark.parametrize("index", [3, 100, -1])
def test_out_of_range_chunk(index: int) -> None:
    asm, chunks = _stream()
    with pytest.raises(CodecError, match=f"chunk index {index} out of range .header declared 3"):
        asm.add_chunk(index, chunks[0])


def test_trailing_data_in_last_chunk() -> None:
    asm, chunks = _stream()
    asm.add_chunk(0, chunks[0])
    asm.add_chunk(1, chunks[1])
    with pytest.raises(CodecError, match="ending at byte 257, past the declared total of 256"):
        asm.add_chunk(2, chunks[2] + b"\x00")


def test_short_last_chunk() -> None:
    asm, chunks = _stream()
    asm.add_chunk(0, chunks[0])
    asm.add_chunk(1, chunks[1])
    with pytest.raises(CodecError, match="last chunk 2 ends at byte 255 of 256: 1 bytes missing"):
        asm.add_chunk(2, chunks[2][:-1])


def test_bytes_exhausted_before_declared_chunk_count() -> None:
    asm, chunks = _stream()
    with pytest.raises(CodecError, match="all 256 bytes arrived by chunk 0"):
        asm.add_chunk(0, b"".join(chunks))


def test_empty_chunk() -> None:
    asm, _ = _stream()
    with pytest.raises(CodecError, match="chunk 0 is empty"):
        asm.add_chunk(0, b"")


def test_wrong_chunk_name() -> None:
    asm, chunks = _stream()
    with pytest.raises(CodecError, match="carries name 'other', expected 'feats'"):
        asm.add_chunk(0, chunks[0], name="other")


def test_bad_checksum() -> None:
    asm, chunks = _stream()
    asm.add_chunk(0, chunks[0])
    asm.add_chunk(1, b"\xff" + chunks[1][1:])
    asm.add_chunk(2, chunks[2])
    assert asm.done
    with pytest.raises(CodecError, match="checksum mismatch: header crc32 0x"):
        asm.finish()


def test_finish_before_done() -> None:
    asm, chunks = _stream()
    asm.add_chunk(0, chunks[0])
    with pytest.raises(CodecError, match="incomplete: received 1 of 3 chunks, 100 of 256 bytes"):
        asm.finish()


def test_assembler_is_poisoned_after_an_error_and_single_use() -> None:
    asm, chunks = _stream()
    with pytest.raises(CodecError):
        asm.add_chunk(1, chunks[1])
    with pytest.raises(CodecError, match=r"stream already failed: .*missing chunk 0"):
        asm.add_chunk(0, chunks[0])
    ok, chunks = _stream()
    for i, c in enumerate(chunks):
        ok.add_chunk(i, c)
    ok.finish()
    with pytest.raises(CodecError, match="already finished"):
        ok.finish()
