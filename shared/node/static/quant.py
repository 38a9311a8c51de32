"""Weight-only quantisation of the static runtime's linear layers: int8 and int4.

A decode step at batch 1 reads every weight once and does little arithmetic on it, so
its time is the weights' bytes over the memory bandwidth. Storing them in 8 or 4 bits
and widening them inside the matmul cuts those bytes by 2x or 4x (gpt-fast; Frantar et
al. 2022, GPTQ, for why 4-bit grouped weights keep a 7B model's quality).

- **int8**: symmetric, one scale per output channel: ``w ≈ q * s``, q in [-127, 127].
- **int4**: asymmetric, grouped along the input dimension (group 128 at 7B; smaller
  models take the largest of 128/64/32 that divides every input width), in PyTorch
  core's ``_weight_int4pack_mm`` format as gpt-fast writes it: ``w ≈ (q - 8) * s + z``,
  q in [0, 15], ``scales_and_zeros`` [K / g, N, 2].

The kernels are PyTorch core's, so the same code runs on the CPU (CI) and the GPU:

| | CPU | CUDA |
|---|---|---|
| int8 | ``_weight_int8pack_mm`` | a Triton kernel (:mod:`.quant_kernels`) |
| int4 | ``_weight_int4pack_mm_for_cpu`` | ``_weight_int4pack_mm`` (bf16 only) |

Core's CUDA ``_weight_int8pack_mm`` exists but runs one thread per output: on an H100
the 7B decoder's linear layers took 55 ms per token through it, against 5.2 ms in
bf16 (``python -m benchmarks.probe_quant_kernels``; the log in
``benchmarks/results/logs/quant_kernels_h100.log``), hence the Triton kernel. Core's CUDA
int4 kernel (gpt-fast's tinygemm) is fast for a draft step (3.33 ms per token for the
7B drafter on an H100) but slow for a long prefill (346 ms for 737 tokens, against 27 ms
in bf16; ``benchmarks/results/edge_h100.json``). Triton int4 kernels we tried prefilled
faster but drafted slower than bf16 and were not kept, so steps with few rows keep core's
kernel, and from :data:`.int4_dense.INT4_DENSE_MIN_ROWS` rows a CUDA int4 matmul widens
the weight once (one Triton pass over core's packing, :mod:`.int4_dense`) and runs the
dense GEMM. torchao was the other
candidate; its int4 path needs a package that cannot be installed on these machines
(``../shared/REFERENCE.md``), and its int8 path is fast only under ``torch.compile``.

The LM head stays in the model's dtype: its logits decide every draft, and at 7B it is
~0.26 GB, under a tenth of the int4 decoder's bytes.

The storage types (``Int8Weight``, ``Int4Weight``, ``Weight``) live in
:mod:`.weight_formats`, below both this module and :mod:`.weights`, and are named from
here too.
"""

from __future__ import annotations

import enum
from dataclasses import replace
from typing import Final

import torch

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.fp8 import fp8_mm
from eventspec.shared.node.static.int4_dense import dequantize_int4, prefers_dense
from eventspec.shared.node.static.weight_formats import Fp8Weight
from eventspec.shared.node.static.weight_formats import Int4Weight as Int4Weight
from eventspec.shared.node.static.weight_formats import Int8Weight as Int8Weight
from eventspec.shared.node.static.weight_formats import Weight as Weight
from eventspec.shared.node.static.weights import LanguageWeights, LayerWeights

#: int4 group sizes tried, largest first (128 is gpt-fast's and GPTQ's default).
INT4_GROUP_SIZES: Final[tuple[int, ...]] = (128, 64, 32)
#: ``innerKTiles`` of core's int4 packing, largest first (8 is gpt-fast's).
_INNER_K_TILES: Final[tuple[int, ...]] = (8, 4, 2)


class QuantMode(enum.Enum):
    """``--draft-quant``: how the drafter's linear weights are stored."""

    NONE = "none"
    INT8 = "int8"
    INT4 = "int4"

    @classmethod
    def parse(cls, value: str) -> QuantMode:
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(m.value for m in cls)
            raise InvalidInput(f"draft quantisation {value!r} is not one of {choices}") from None


def quantize_int8(w: torch.Tensor) -> Int8Weight:
    """Per-output-channel symmetric int8 of ``w`` [N, K] (scales in ``w``'s dtype)."""
    wf = w.float()  # [N, K]
    scales = (wf.abs().amax(dim=1) / 127).clamp(min=1e-12)  # [N]
    scales = scales.to(w.dtype)  # the kernels multiply by the rounded scale: quantise with it
    q = (wf / scales.float()[:, None]).round().clamp(-127, 127).to(torch.int8)  # [N, K]
    return Int8Weight(q.contiguous(), scales.contiguous())


def int4_group_size(in_features: int) -> int:
    """The largest supported group that divides ``in_features`` (and packs)."""
    for g in INT4_GROUP_SIZES:
        if in_features % g == 0 and _inner_k_tiles(in_features) is not None:
            return g
    raise InvalidInput(
        f"int4 needs an input width divisible by one of {INT4_GROUP_SIZES}; this model has "
        f"a layer with {in_features} inputs (use --draft-quant int8)"
    )


def _inner_k_tiles(in_features: int) -> int | None:
    for t in _INNER_K_TILES:
        if in_features % (16 * t) == 0:
            return t
    return None


def quantize_int4(
    w: torch.Tensor, group_size: int | None = None, *, keep_values: bool = False
) -> Int4Weight:
    """Grouped asymmetric int4 of ``w`` [N, K], packed for ``w``'s device."""
    n, k = int(w.shape[0]), int(w.shape[1])
    g = group_size if group_size is not None else int4_group_size(k)
    if k % g or n % 16:  # core's CPU packing needs N % 16, its CUDA one N % 8
        raise InvalidInput(f"int4 needs [N, K] with N % 16 == 0 and K % {g} == 0, got [{n}, {k}]")
    tiles = _inner_k_tiles(k)
    if tiles is None:
        raise InvalidInput(f"int4 packing needs K divisible by 32, got {k}")
    if w.device.type == "cuda" and w.dtype != torch.bfloat16:
        raise InvalidInput(f"int4 on CUDA needs a bfloat16 model, this one is {w.dtype}")
    wg = w.float().view(n, k // g, g)  # [N, K/g, g]
    lo, hi = wg.amin(dim=-1, keepdim=True), wg.amax(dim=-1, keepdim=True)  # [N, K/g, 1]
    scales = ((hi - lo) / 15).clamp(min=1e-6).to(w.dtype).float()
    zeros = (lo + 8 * scales).to(w.dtype).float()  # the value of the middle code, 8
    q = ((wg - zeros) / scales + 8).round().clamp(0, 15)  # [N, K/g, g]
    values = q.view(n, k).to(torch.uint8)  # [N, K]
    sz = torch.stack([scales[..., 0], zeros[..., 0]], dim=-1)  # [N, K/g, 2]
    sz = sz.transpose(0, 1).contiguous().to(w.dtype)  # [K/g, N, 2]
    if w.device.type == "cuda":
        pairs = (values[:, ::2] << 4) | values[:, 1::2]  # [N, K/2] uint8
        packed = torch.ops.aten._convert_weight_to_int4pack(pairs.contiguous(), tiles)
    else:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            values.to(torch.int32).contiguous(), tiles
        )
    return Int4Weight(packed, sz, g, n, k, values if keep_values else None)


def linear(x: torch.Tensor, w: Weight) -> torch.Tensor:
    """``x @ w.T`` for x [M, K] -> [M, N], whatever ``w``'s storage."""
    if isinstance(w, torch.Tensor):
        return x @ w.t()
    if isinstance(w, Fp8Weight):
        return fp8_mm(x, w)
    if isinstance(w, Int8Weight):
        if x.device.type == "cuda":
            from eventspec.shared.node.static.quant_kernels import int8_weight_mm

            return int8_weight_mm(x, w.q, w.scales)
        out: torch.Tensor = torch.ops.aten._weight_int8pack_mm(x, w.q, w.scales)
        return out
    if prefers_dense(int(x.shape[0]), x.device):
        return x @ dequantize_int4(w).t()
    if x.device.type == "cuda":
        out = torch.ops.aten._weight_int4pack_mm(x, w.packed, w.group_size, w.scales_and_zeros)
    else:
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, w.packed, w.group_size, w.scales_and_zeros
        )
    return out


def linear_add_(h: torch.Tensor, x: torch.Tensor, w: Weight) -> torch.Tensor:
    """``h += x @ w.T`` in place (the residual add; fused into the GEMM when dense)."""
    if isinstance(w, torch.Tensor):
        return h.addmm_(x, w.t())
    if isinstance(w, Int8Weight) and x.device.type == "cuda":
        from eventspec.shared.node.static.quant_kernels import int8_weight_mm

        return int8_weight_mm(x, w.q, w.scales, accumulate_into=h)
    if isinstance(w, Int4Weight) and prefers_dense(int(x.shape[0]), x.device):
        return h.addmm_(x, dequantize_int4(w).t())
    return h.add_(linear(x, w))


def weight_nbytes(w: Weight) -> int:
    """Bytes a step reads for this weight."""
    if isinstance(w, torch.Tensor):
        return w.numel() * w.element_size()
    return w.nbytes


def quantize_language_weights(
    weights: LanguageWeights, mode: QuantMode, *, keep_values: bool = False
) -> LanguageWeights:
    """Every layer's four matrices quantised (``mode``); embeddings, norms and the LM
    head as they were. ``keep_values`` keeps int4's unpacked codes for reference checks."""
    if mode is QuantMode.NONE:
        return weights

    def q(w: Weight) -> Weight:
        assert isinstance(w, torch.Tensor), "weights are quantised once"
        if mode is QuantMode.INT8:
            return quantize_int8(w)
        return quantize_int4(w, keep_values=keep_values)

    layers = tuple(
        LayerWeights(
            ln_attn=lw.ln_attn, wqkv=q(lw.wqkv), wo=q(lw.wo), ln_mlp=lw.ln_mlp,
            w_gate_up=q(lw.w_gate_up), w_down=q(lw.w_down),
        )
        for lw in weights.layers
    )
    return replace(weights, layers=layers)


def dequantized_weights(weights: LanguageWeights) -> LanguageWeights:
    """The dense float32-exact equivalent of quantised weights, in the model's dtype
    (the reference the quantised runtime is checked against)."""

    def d(w: Weight) -> torch.Tensor:
        if isinstance(w, torch.Tensor):
            return w
        return w.dequantize().to(weights.embed.dtype)

    layers = tuple(
        LayerWeights(
            ln_attn=lw.ln_attn, wqkv=d(lw.wqkv), wo=d(lw.wo), ln_mlp=lw.ln_mlp,
            w_gate_up=d(lw.w_gate_up), w_down=d(lw.w_down),
        )
        for lw in weights.layers
    )
    return replace(weights, layers=layers)
