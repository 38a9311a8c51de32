"""Receiving a tensor: validate its header, then copy its ordered chunks into place.

The sending side and the wire types are :mod:`eventspec.shared.contract.codec` (whose
docstring describes the format). This side is kept apart because it is the one that
faces a hostile or broken peer: every check that stops a header from making the
receiver allocate too much, or a chunk stream from landing out of order, lives here.
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Final

import numpy as np

from eventspec.shared.contract.codec import (
    NATIVE_LITTLE_ENDIAN,
    TensorHeaderInfo,
    WireDtype,
    bf16_bits_to_float32,
    dequantize,
    valid_scale,
)
from eventspec.shared.contract.errors import CodecError


class TensorAssembler:
    """Reassembles one tensor from its ordered chunks into a preallocated buffer.

    The header is validated before any allocation, so a hostile or broken header
    can neither make the receiver allocate more than ``max_bytes`` nor declare a
    shape that disagrees with its byte count. After the first error the assembler
    is poisoned: every later call repeats that error, because a stream that went
    wrong once cannot be trusted to resynchronise.
    """

    def __init__(
        self,
        header: TensorHeaderInfo,
        *,
        max_bytes: int,
        expected_name: str | None = None,
        expected_shape: tuple[int | None, ...] | None = None,
        expected_dtype: WireDtype | None = None,
    ) -> None:
        """Validate ``header``; ``None`` entries in ``expected_shape`` match any size."""
        _validate_header(header, max_bytes=max_bytes)
        label = f"tensor {header.name!r}"
        if expected_name is not None and header.name != expected_name:
            raise CodecError(
                f"unexpected tensor name: expected {expected_name!r}, received {header.name!r}"
            )
        if expected_dtype is not None and header.dtype is not expected_dtype:
            raise CodecError(
                f"{label}: expected dtype {expected_dtype.name}, received {header.dtype.name}"
            )
        if expected_shape is not None and (
            len(expected_shape) != len(header.shape)
            or any(
                e is not None and e != s for e, s in zip(expected_shape, header.shape, strict=True)
            )
        ):
            want = "[" + ", ".join("*" if e is None else str(e) for e in expected_shape) + "]"
            raise CodecError(f"{label}: expected shape {want}, received {list(header.shape)}")
        self.header: Final[TensorHeaderInfo] = header
        self._label = label
        self._buffer = bytearray(header.total_bytes)  # [total_bytes], filled in order
        self._view = memoryview(self._buffer)
        self._next_index = 0
        self._received = 0
        self._failed: str | None = None
        self._finished = False

    @property
    def received_bytes(self) -> int:
        """Payload bytes copied so far (for uplink statistics)."""
        return self._received

    @property
    def received_chunks(self) -> int:
        """Chunks accepted so far."""
        return self._next_index

    @property
    def done(self) -> bool:
        """True once every declared chunk and byte has arrived."""
        return (
            self._failed is None
            and self._next_index == self.header.num_chunks
            and self._received == self.header.total_bytes
        )

    def _fail(self, message: str) -> CodecError:
        self._failed = message
        return CodecError(message)

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise CodecError(f"{self._label}: stream already failed: {self._failed}")
        if self._finished:
            raise CodecError(f"{self._label}: already finished")

    def add_chunk(
        self, index: int, data: bytes | bytearray | memoryview, *, name: str | None = None
    ) -> None:
        """Copy chunk ``index`` into place; ``name``, when given, must match the header."""
        self._check_usable()
        self._check_place(index, name)
        end = self._check_extent(index, memoryview(data).nbytes)
        self._view[self._received : end] = memoryview(data).cast("B")
        self._received = end
        self._next_index = index + 1

    def _check_place(self, index: int, name: str | None) -> None:
        """The chunk belongs to this tensor and is the next one of the ordered stream."""
        h = self.header
        if name is not None and name != h.name:
            raise self._fail(
                f"{self._label}: chunk {index} carries name {name!r}, expected {h.name!r}"
            )
        if index < 0 or index >= h.num_chunks:
            raise self._fail(
                f"{self._label}: chunk index {index} out of range "
                f"(header declared {h.num_chunks} chunks, 0..{h.num_chunks - 1})"
            )
        if index < self._next_index:
            raise self._fail(
                f"{self._label}: duplicate or out-of-order chunk {index} "
                f"(expected chunk {self._next_index}; the stream is ordered)"
            )
        if index > self._next_index:
            raise self._fail(
                f"{self._label}: missing chunk {self._next_index}: received chunk {index} "
                "instead (the stream is ordered)"
            )

    def _check_extent(self, index: int, size: int) -> int:
        """Where chunk ``index`` of ``size`` bytes ends; it must neither overrun the
        declared total nor leave the last chunk short (or a later chunk nothing)."""
        h = self.header
        if size == 0:
            raise self._fail(f"{self._label}: chunk {index} is empty")
        end = self._received + size
        if end > h.total_bytes:
            raise self._fail(
                f"{self._label}: chunk {index} carries {size} bytes, ending at byte {end}, "
                f"past the declared total of {h.total_bytes} (trailing data)"
            )
        is_last = index == h.num_chunks - 1
        if is_last and end != h.total_bytes:
            raise self._fail(
                f"{self._label}: last chunk {index} ends at byte {end} of {h.total_bytes}: "
                f"{h.total_bytes - end} bytes missing"
            )
        if not is_last and end == h.total_bytes:
            raise self._fail(
                f"{self._label}: all {h.total_bytes} bytes arrived by chunk {index}, "
                f"but the header declared {h.num_chunks} chunks"
            )
        return end

    def finish(self) -> np.ndarray[Any, Any]:
        """Verify completeness and CRC-32; return the array (int8 stays quantised, bf16
        arrives as uint16 bit patterns).

        The array is a view of the assembler's buffer (no copy); the assembler
        cannot be reused afterwards.
        """
        self._check_usable()
        h = self.header
        if not self.done:
            raise self._fail(
                f"{self._label}: incomplete: received {self._next_index} of {h.num_chunks} "
                f"chunks, {self._received} of {h.total_bytes} bytes"
            )
        crc = zlib.crc32(self._view)
        if crc != h.crc32:
            raise self._fail(
                f"{self._label}: checksum mismatch: header crc32 {h.crc32:#010x}, "
                f"payload crc32 {crc:#010x}"
            )
        self._finished = True
        arr = np.frombuffer(self._buffer, dtype=h.dtype.numpy_dtype)  # [numel], aliases buffer
        if not NATIVE_LITTLE_ENDIAN:
            arr = arr.byteswap()
        return arr.reshape(h.shape)  # [*shape]

    def finish_float32(self) -> np.ndarray[Any, Any]:
        """Like :meth:`finish`, as float32: int8 dequantised with ``header.scale``, bf16
        widened exactly, other types cast."""
        arr = self.finish()
        if self.header.dtype is WireDtype.INT8:
            return dequantize(arr, self.header.scale)
        if self.header.dtype is WireDtype.BFLOAT16:
            return bf16_bits_to_float32(arr)
        return arr.astype(np.float32)


def _validate_header(h: TensorHeaderInfo, *, max_bytes: int) -> None:
    """Reject a header before anything is allocated for it."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise CodecError(f"max_bytes must be a non-negative int, got {max_bytes!r}")
    if not isinstance(h.name, str) or not h.name:
        raise CodecError("tensor header has an empty name")
    label = f"tensor {h.name!r}"
    if not isinstance(h.dtype, WireDtype):
        raise CodecError(
            f"{label}: unknown or unspecified dtype {h.dtype!r} "
            f"(expected one of {', '.join(d.name for d in WireDtype)})"
        )
    for axis, dim in enumerate(h.shape):
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
            raise CodecError(f"{label}: shape[{axis}] is {dim!r}, not an int")
        if dim < 0:
            raise CodecError(f"{label}: shape[{axis}] is negative ({dim})")
    expected_bytes = math.prod(h.shape) * h.dtype.itemsize
    if h.total_bytes != expected_bytes:
        raise CodecError(
            f"{label}: shape {list(h.shape)} x {h.dtype.itemsize} bytes ({h.dtype.name}) = "
            f"{expected_bytes} bytes, but the header declares total_bytes={h.total_bytes}"
        )
    if h.total_bytes > max_bytes:
        raise CodecError(f"{label}: {h.total_bytes} bytes exceed the limit of {max_bytes} bytes")
    if h.total_bytes == 0:
        if h.num_chunks != 0:
            raise CodecError(
                f"{label}: an empty tensor has no chunks, but the header declares "
                f"num_chunks={h.num_chunks}"
            )
    elif not 1 <= h.num_chunks <= h.total_bytes:
        raise CodecError(
            f"{label}: num_chunks={h.num_chunks} is inconsistent with {h.total_bytes} bytes "
            f"(expected 1..{h.total_bytes})"
        )
    if not 0 <= h.crc32 < 1 << 32:
        raise CodecError(f"{label}: crc32 {h.crc32} is not a 32-bit unsigned value")
    if h.dtype is WireDtype.INT8:
        if not valid_scale(h.scale):
            raise CodecError(f"{label}: INT8 needs a positive finite scale, received {h.scale!r}")
    elif h.scale != 0.0:
        raise CodecError(
            f"{label}: scale {h.scale!r} given for {h.dtype.name}; only INT8 has a scale"
        )
