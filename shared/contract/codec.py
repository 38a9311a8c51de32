"""Tensors on the wire: one header, then ordered raw chunks.

Why this shape: gRPC refuses messages over its size limit (4 MiB by default) and
one huge message is several times slower than a stream of ~1 MiB chunks
(REFERENCE.md, gRPC). Like KServe v2 / Triton, a tensor travels as a header
(name, dtype, shape, byte count, CRC-32, chunk count, int8 scale) followed by raw
little-endian bytes. Tensors are not compressed (activations barely shrink);
they are quantised instead (:func:`quantize_int8`).

The chunk stream is **ordered**: gRPC delivers the messages of one stream in the
order they were sent, so chunk ``i`` must arrive right after chunk ``i - 1``. An
out-of-order, repeated or skipped index therefore means a broken sender, and the
receiver rejects it instead of buffering. Ordering is what lets the receiver
copy every chunk straight into one buffer preallocated from the header.

Zero-element tensors (a shape containing 0) are supported: ``total_bytes`` is 0,
``num_chunks`` is 0 and no chunk follows the header.

This module is pure domain code: the protobuf ⇄ :class:`TensorHeaderInfo`
conversion lives in ``eventspec.shared.contract.convert``.
"""

from __future__ import annotations

import enum
import math
import sys
import zlib
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from eventspec.shared.contract.errors import CodecError

DEFAULT_CHUNK_BYTES: Final[int] = 1 << 20
"""About 1 MiB per chunk: well under gRPC's 4 MiB default, large enough to be cheap."""

_INT8_QMAX: Final[int] = 127
_NATIVE_LITTLE_ENDIAN: Final[bool] = sys.byteorder == "little"


class WireDtype(enum.Enum):
    """Element types allowed on the wire; values equal the proto ``Dtype`` numbers."""

    FLOAT32 = 1
    FLOAT16 = 2
    BFLOAT16 = 3
    INT8 = 4
    UINT8 = 5
    INT64 = 6

    @classmethod
    def from_wire(cls, value: int) -> WireDtype:
        """Map a proto enum number; 0 (unspecified) and unknown numbers are errors."""
        try:
            return cls(value)
        except ValueError:
            known = ", ".join(f"{d.value}={d.name}" for d in cls)
            raise CodecError(
                f"unknown tensor dtype {value} on the wire (expected one of {known})"
            ) from None

    @classmethod
    def from_name(cls, name: str) -> WireDtype:
        """``"float16"`` -> FLOAT16 (the lower-case member name), or a clear error."""
        try:
            return cls[name.upper()]
        except KeyError:
            known = sorted(d.label for d in cls)
            raise CodecError(f"unknown dtype {name!r}; expected one of {known}") from None

    @property
    def label(self) -> str:
        """The dtype's name as ``AlignedSpec`` and the CLIs spell it (``"float16"``)."""
        return self.name.lower()

    @classmethod
    def from_numpy(cls, dtype: np.dtype[Any]) -> WireDtype:
        """The wire type of a numpy dtype (bf16 has none: pass ``BFLOAT16`` explicitly)."""
        for wire, np_dtype in _NUMPY_DTYPE.items():
            if wire is not WireDtype.BFLOAT16 and np.dtype(np_dtype) == dtype:
                return wire
        names = ", ".join(np.dtype(t).name for w, t in _NUMPY_DTYPE.items()
                          if w is not WireDtype.BFLOAT16)
        raise CodecError(f"array dtype {dtype} cannot be sent (supported: {names})")

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        """The numpy dtype a received array has (bf16 arrives as its uint16 bit pattern)."""
        return np.dtype(_NUMPY_DTYPE[self])

    @property
    def itemsize(self) -> int:
        """Bytes per element on the wire."""
        return self.numpy_dtype.itemsize


# wire dtype -> numpy dtype of the array the codec hands out. numpy has no bfloat16, so
# bf16 travels and arrives as the raw uint16 pattern (REFERENCE.md, "Tensors on the wire").
_NUMPY_DTYPE: Final[dict[WireDtype, type[np.generic]]] = {
    WireDtype.FLOAT32: np.float32,
    WireDtype.FLOAT16: np.float16,
    WireDtype.BFLOAT16: np.uint16,
    WireDtype.INT8: np.int8,
    WireDtype.UINT8: np.uint8,
    WireDtype.INT64: np.int64,
}


@dataclass(frozen=True)
class TensorHeaderInfo:
    """Everything the receiver needs to preallocate and validate one tensor."""

    name: str
    dtype: WireDtype
    shape: tuple[int, ...]
    total_bytes: int
    crc32: int
    num_chunks: int
    scale: float = 0.0


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _valid_scale(scale: float) -> bool:
    return math.isfinite(scale) and scale > 0.0


def encode_tensor(
    name: str,
    array: np.ndarray[Any, Any],
    *,
    dtype: WireDtype | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    scale: float | None = None,
) -> tuple[TensorHeaderInfo, list[memoryview]]:
    """Split ``array`` into a header and zero-copy chunks of its little-endian bytes.

    The chunks are slices of one contiguous buffer that they keep alive, so sending
    costs no copy here (the transport still copies into its messages). ``dtype``
    defaults to the array's own; bf16 is sent as a uint16 array with
    ``dtype=WireDtype.BFLOAT16``. An int8 array needs ``scale`` (value = q * scale, see
    :func:`quantize_int8`); other dtypes must not have one.
    """
    if not name:
        raise CodecError("tensor name must be non-empty")
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
        raise CodecError(f"chunk_bytes must be a positive int, got {chunk_bytes!r}")
    wire = dtype if dtype is not None else WireDtype.from_numpy(array.dtype)
    if array.dtype != wire.numpy_dtype:
        raise CodecError(
            f"tensor {name!r}: {wire.name} is sent from a {wire.numpy_dtype} array, "
            f"got {array.dtype}"
        )
    if wire is WireDtype.INT8:
        if scale is None or not _valid_scale(scale):
            raise CodecError(f"tensor {name!r}: int8 needs a positive finite scale, got {scale!r}")
    elif scale is not None:
        raise CodecError(
            f"tensor {name!r}: scale {scale!r} given for {wire.name}; only INT8 has a scale"
        )
    flat = np.ascontiguousarray(array).reshape(-1)  # [numel]
    if not _NATIVE_LITTLE_ENDIAN:
        flat = flat.byteswap()
    payload = memoryview(flat.view(np.uint8).data)  # [total_bytes] uint8 view, no copy
    total = payload.nbytes
    chunks = [payload[off : off + chunk_bytes] for off in range(0, total, chunk_bytes)]
    header = TensorHeaderInfo(
        name=name,
        dtype=wire,
        shape=tuple(int(s) for s in array.shape),
        total_bytes=total,
        crc32=zlib.crc32(payload),
        num_chunks=len(chunks),
        scale=float(scale) if scale is not None else 0.0,
    )
    return header, chunks


def quantize_int8(array: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], float]:
    """Symmetric per-tensor int8: ``q = round(x / scale)`` in [-127, 127].

    Why: zlib/blosc shrink activations only to 0.7-0.87 of their size, while int8
    halves fp16 (REFERENCE.md). The scale is rounded to float32 first, so it
    survives the proto's ``float scale`` field unchanged and both ends
    dequantise identically. An all-zero tensor gets scale 1.0 (any positive works).
    The round trip's error is at most ``scale / 2`` per element.
    """
    if not np.issubdtype(array.dtype, np.floating):
        raise CodecError(f"quantize_int8 needs a floating array, got {array.dtype}")
    x = array.astype(np.float32, copy=False)  # [...] same shape
    if x.size > 0 and not bool(np.isfinite(x).all()):
        raise CodecError("quantize_int8: tensor contains NaN or infinity")
    amax = float(np.abs(x).max()) if x.size > 0 else 0.0
    scale = float(np.float32(amax / _INT8_QMAX))
    if scale == 0.0:
        scale = 1.0 if amax == 0.0 else float(np.finfo(np.float32).tiny)
    q = np.clip(np.rint(x / np.float32(scale)), -_INT8_QMAX, _INT8_QMAX).astype(np.int8)
    return q, scale


def dequantize(q: np.ndarray[Any, Any], scale: float) -> np.ndarray[Any, Any]:
    """``q * scale`` in float32 (same shape)."""
    if q.dtype != np.int8:
        raise CodecError(f"dequantize needs an int8 array, got {q.dtype}")
    if not _valid_scale(scale):
        raise CodecError(f"dequantize needs a positive finite scale, got {scale!r}")
    out: np.ndarray[Any, Any] = q.astype(np.float32) * np.float32(scale)
    return out


def bf16_bits_to_float32(bits: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Widen bf16 bit patterns (uint16) to float32 exactly: bf16 is float32's top half."""
    if bits.dtype != np.uint16:
        raise CodecError(f"bf16 bit patterns must be uint16, got {bits.dtype}")
    return (bits.astype(np.uint32) << 16).view(np.float32)


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
        size = memoryview(data).nbytes
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
        self._view[self._received : end] = memoryview(data).cast("B")
        self._received = end
        self._next_index = index + 1

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
        if not _NATIVE_LITTLE_ENDIAN:
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
    expected_bytes = _numel(h.shape) * h.dtype.itemsize
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
        if not _valid_scale(h.scale):
            raise CodecError(f"{label}: INT8 needs a positive finite scale, received {h.scale!r}")
    elif h.scale != 0.0:
        raise CodecError(
            f"{label}: scale {h.scale!r} given for {h.dtype.name}; only INT8 has a scale"
        )
