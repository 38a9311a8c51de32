"""The opt-in fp8 prefill (``eventspec-cloud serve --prefill-dtype fp8``).

A 2,103-token Video-LLaVA prefill is GEMM-bound: on an H200 the decoder's GEMMs are
about 36 of its 44 ms of device time, at ~80% of the dense bf16 tensor-core peak
(``docs/results/load-gpu.md``), so better bf16 tiles cannot bring it to 45 ms. Hopper's
fp8 tensor cores have twice the bf16 peak. Here a prompt's linear layers run as E4M3
GEMMs (``torch._scaled_mm``):

- **weights**: one scale per output channel, ``w ≈ q * s``, quantised once at start-up
  into a second copy (the bf16 weights stay for decode steps, whose answers this must
  not touch: +1 byte per parameter, 6.5 GB at 7B);
- **activations**: one scale per row, computed per GEMM from the row's absolute maximum
  (dynamic per-token scaling, as vLLM's and TensorRT-LLM's fp8 linear layers do;
  Micikevicius et al. 2022, "FP8 Formats for Deep Learning", for E4M3's range).

Only prefill calls of their own use it: the decode and verify rows of every step, and
prompt pieces riding a mixed step (one GEMM for both) stay in the model's dtype. The
KV a prompt leaves behind is therefore not the bf16 prefill's, and later tokens may
differ from a bf16 prefill's: the opt-in trades that for time to first token, which is
why the default stays the model's dtype (``benchmarks/bench_fp8_prefill.py`` measures
both the time and the agreement). The same functions run on CPU (PyTorch's CPU
``_scaled_mm``), so CI tests the code path the GPU runs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

import torch

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.attention import HAVE_TRITON
from eventspec.shared.node.static.fp8_kernels import quantize_rows_triton
from eventspec.shared.node.static.linear_dtypes import check_linear_dtype
from eventspec.shared.node.static.weight_formats import Fp8Weight
from eventspec.shared.node.static.weights import LanguageWeights, LayerWeights

FP8_DTYPE: Final = torch.float8_e4m3fn
#: The largest finite E4M3 value: a row's absolute maximum maps onto it.
FP8_MAX: Final[float] = float(torch.finfo(torch.float8_e4m3fn).max)  # 448
#: ``_scaled_mm`` needs K and N to be multiples of this.
FP8_DIM_MULTIPLE: Final[int] = 16


def fp8_unsupported_reason(weights: LanguageWeights) -> str | None:
    """Why ``weights`` cannot get an fp8 prefill on their device (None when they can)."""
    device = weights.embed.device
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            return (f"fp8 GEMMs need compute capability 8.9 or newer (Ada, Hopper); "
                    f"{torch.cuda.get_device_name(device)} has {major}.{minor}")
        if weights.embed.dtype != torch.bfloat16:
            return ("fp8 GEMMs with per-row scales write bfloat16; the model is "
                    f"{weights.embed.dtype}")
    for i, lw in enumerate(weights.layers):
        for name in ("wqkv", "wo", "w_gate_up", "w_down"):
            w = getattr(lw, name)
            if not isinstance(w, torch.Tensor):
                return f"layer {i} {name} is already quantised ({type(w).__name__})"
            if any(d % FP8_DIM_MULTIPLE for d in w.shape):
                return (f"layer {i} {name} is {list(w.shape)}: fp8 GEMMs need every "
                        f"dimension a multiple of {FP8_DIM_MULTIPLE}")
    return None


@torch.no_grad()
def quantize_fp8(w: torch.Tensor) -> Fp8Weight:
    """Per-output-channel E4M3 of a dense weight w [N, K]."""
    wf = w.float()  # [N, K]
    scales = (wf.abs().amax(dim=1) / FP8_MAX).clamp(min=1e-12)  # [N]
    q = (wf / scales[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)  # [N, K]
    return Fp8Weight(q=q, scales=scales)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row E4M3 of activations x [M, K]: ([M, K] fp8, [M, 1] float32 scales); one
    Triton pass on CUDA (:mod:`.fp8_kernels`), the same arithmetic in torch elsewhere."""
    if x.device.type == "cuda" and HAVE_TRITON and x.stride(1) == 1:
        return quantize_rows_triton(x, FP8_MAX)
    return quantize_rows_torch(x)


def quantize_rows_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_rows` in plain torch ops (the CPU path and the GPU's reference)."""
    xf = x.float()  # [M, K]
    scales = (xf.abs().amax(dim=1, keepdim=True) * (1.0 / FP8_MAX)).clamp(min=1e-12)  # [M, 1]
    return (xf / scales).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scales


def fp8_mm(x: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
    """``x @ w.T`` for x [M, K] in the model's dtype -> [M, N] in x's dtype, as an fp8
    GEMM with x's rows scaled one by one and w's output channels one by one."""
    xq, x_scales = quantize_rows(x)  # [M, K], [M, 1]
    out: torch.Tensor = torch._scaled_mm(
        xq, w.q.t(), scale_a=x_scales, scale_b=w.scales[None], out_dtype=x.dtype,
    )  # [M, N]
    return out


@torch.no_grad()
def fp8_weights(weights: LanguageWeights) -> LanguageWeights:
    """``weights`` with every layer's four matrices as :class:`Fp8Weight` copies; the
    embeddings, norms and LM head shared (the LM head stays in the model's dtype: its
    logits decide every token). InvalidInput when :func:`fp8_unsupported_reason` says
    why not."""
    reason = fp8_unsupported_reason(weights)
    if reason is not None:
        raise InvalidInput(f"fp8 linear layers: {reason}")
    layers = []
    for lw in weights.layers:
        assert isinstance(lw.wqkv, torch.Tensor) and isinstance(lw.wo, torch.Tensor)
        assert isinstance(lw.w_gate_up, torch.Tensor) and isinstance(lw.w_down, torch.Tensor)
        layers.append(LayerWeights(ln_attn=lw.ln_attn, wqkv=quantize_fp8(lw.wqkv),
                                   wo=quantize_fp8(lw.wo), ln_mlp=lw.ln_mlp,
                                   w_gate_up=quantize_fp8(lw.w_gate_up),
                                   w_down=quantize_fp8(lw.w_down)))
    return replace(weights, layers=tuple(layers))


def runtime_weights(weights: LanguageWeights, *, prefill_dtype: str, step_dtype: str,
                    batch_invariant: bool) -> tuple[LanguageWeights, LanguageWeights]:
    """(what steps run on, what prefill calls of their own run on) for ``step_dtype``
    and ``--prefill-dtype``: ``weights`` ("model"), or one set of fp8 copies shared by
    both ("fp8"). InvalidInput with ``batch_invariant``, whose prompt rows must have a
    decode step's bits. ``step_dtype`` "fp8" is an engine parameter, not a server
    flag: on an H200 ``torch._scaled_mm`` made decode steps slower than bf16 (4.65 ->
    5.26 ms at B = 1, ``fp8-prefill-full-h200.json``'s ``steps``); it is kept for
    that measurement (``bench_fp8_prefill --steps``)."""
    dtypes = (check_linear_dtype("step_dtype", step_dtype),
              check_linear_dtype("--prefill-dtype", prefill_dtype))
    if "fp8" not in dtypes:
        return weights, weights
    if batch_invariant:
        flag = "step_dtype" if step_dtype == "fp8" else "--prefill-dtype"
        raise InvalidInput(f"{flag} fp8 with --batch-invariant: an fp8 row cannot have "
                           "the model dtype's bits; choose one")
    fp8 = fp8_weights(weights)
    return (fp8 if step_dtype == "fp8" else weights), (fp8 if prefill_dtype == "fp8" else weights)


def fp8_copy_bytes(*, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                   intermediate: int) -> int:
    """Device bytes :func:`fp8_weights` adds for a LLaMA decoder of this shape
    (known before its weights are fused, so a KV budget can leave room): one per
    parameter of each layer's four matrices and a float32 scale per output channel."""
    rows_and_cols = (((heads + 2 * kv_heads) * head_dim, hidden), (hidden, heads * head_dim),
                     (2 * intermediate, hidden), (hidden, intermediate))
    return layers * sum(n * k + 4 * n for n, k in rows_and_cols)
