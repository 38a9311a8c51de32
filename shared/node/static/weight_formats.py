"""How the static runtime stores a linear weight: dense, int8, int4 or fp8 (:data:`Weight`).

The storage types alone, below both the decoder's weight layout (:mod:`.weights`, whose
layers hold a ``Weight`` per matrix) and the quantisation that fills them
(:mod:`.quant`, which rewrites a ``LanguageWeights`` layer by layer): kept apart so
that neither of those two has to import the other to name them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eventspec.shared.contract.errors import InvalidInput


@dataclass(frozen=True)
class RowScaledWeight:
    """A linear weight [N, K] as one byte per value and one scale per output row: what
    int8 and fp8 storage share."""

    q: torch.Tensor  # [N, K], one byte each
    scales: torch.Tensor  # [N]

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.q.shape[0]), int(self.q.shape[1])

    @property
    def nbytes(self) -> int:
        return self.q.numel() + self.scales.numel() * self.scales.element_size()

    def dequantize(self) -> torch.Tensor:
        """[N, K] float32: what the kernels multiply by (the tests' reference)."""
        return self.q.float() * self.scales.float()[:, None]


@dataclass(frozen=True)
class Int8Weight(RowScaledWeight):
    """int8 rows (``q`` [N, K] int8) and scales in the activations' dtype (:mod:`.quant`)."""


@dataclass(frozen=True)
class Int4Weight:
    """A linear weight [N, K] in core's packed int4 layout for its device."""

    packed: torch.Tensor  # device-specific packing of [N, K] 4-bit values
    scales_and_zeros: torch.Tensor  # [K / g, N, 2], the activations' dtype
    group_size: int
    out_features: int
    in_features: int
    #: The unpacked 4-bit values [N, K] uint8, kept only when asked (tests' reference).
    values: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    @property
    def nbytes(self) -> int:
        sz = self.scales_and_zeros
        return self.packed.numel() * self.packed.element_size() + sz.numel() * sz.element_size()

    def dequantize(self) -> torch.Tensor:
        """[N, K] float32 from the kept values (quantise with ``keep_values=True``)."""
        if self.values is None:
            raise InvalidInput("this int4 weight was packed without its values")
        n, k, g = self.out_features, self.in_features, self.group_size
        sz = self.scales_and_zeros.float().transpose(0, 1)  # [N, K/g, 2]
        q = self.values.float().view(n, k // g, g)  # [N, K/g, g]
        return ((q - 8) * sz[..., :1] + sz[..., 1:]).view(n, k)


@dataclass(frozen=True)
class Fp8Weight(RowScaledWeight):
    """float8 E4M3 rows (``q`` [N, K]) and float32 scales: the fp8 prefill's copy of a
    dense weight (:mod:`.fp8`)."""


Weight = torch.Tensor | Int8Weight | Int4Weight | Fp8Weight
"""A linear weight as the runtime holds it: dense [N, K], or quantised."""
