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

This module is the sending side and the wire types (dtypes, the header, quantisation);
the receiving side, which validates a header and reassembles the chunks, is
:mod:`eventspec.shared.contract.tensor_assembly`. Both are pure domain code: the protobuf
⇄ :class:`TensorHeaderInfo` conversion lives in ``eventspec.shared.contract.convert``.
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
NATIVE_LITTLE_ENDIAN: Final[bool] = sys.byteorder == "little"
"""Whether this host's byte order is the wire's (little-endian); if not, arrays are swapped."""


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


def valid_scale(scale: float) -> bool:
    """An int8 tensor's scale must be a positive finite float (value = q * scale)."""
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
        if scale is None or not valid_scale(scale):
            raise CodecError(f"tensor {name!r}: int8 needs a positive finite scale, got {scale!r}")
    elif scale is not None:
        raise CodecError(
            f"tensor {name!r}: scale {scale!r} given for {wire.name}; only INT8 has a scale"
        )
    flat = np.ascontiguousarray(array).reshape(-1)  # [numel]
    if not NATIVE_LITTLE_ENDIAN:
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
    if not valid_scale(scale):
        raise CodecError(f"dequantize needs a positive finite scale, got {scale!r}")
    out: np.ndarray[Any, Any] = q.astype(np.float32) * np.float32(scale)
    return out


def bf16_bits_to_float32(bits: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Widen bf16 bit patterns (uint16) to float32 exactly: bf16 is float32's top half."""
    if bits.dtype != np.uint16:
        raise CodecError(f"bf16 bit patterns must be uint16, got {bits.dtype}")
    return (bits.astype(np.uint32) << 16).view(np.float32)
