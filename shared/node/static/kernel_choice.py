"""Which kernels the static runtime runs: decided once, by one pure function.

:func:`choose_kernels` takes what the decision depends on (the device's type, whether
Triton is installed, whether every layer's weights are dense, ``batch_invariant``, and
the caller's ``use_graphs`` / ``compile_layers``) and returns one frozen
:class:`KernelChoice` naming every kernel the runtime runs, with the reason in words
(logged at construction). :class:`.runtime.StaticRuntime` reads its decisions from it and
from nowhere else; :func:`.layer_forward.layer_functions` turns it into callables.

The rules (``tests/unit/shared/test_kernel_choice.py`` pins each combination):

- **CUDA with Triton, not batch-invariant**: fused layers (Triton RMSNorm, RoPE + KV
  write and SiLU-mul; cuBLAS GEMMs with the residual in ``addmm_``, int8/int4 through
  :mod:`.quant`), split-KV attention for steps, SDPA for prompts, prompt lengths planned
  at warm-up, mixed steps' pieces through the fixed-split kernel; graphs as asked.
  ``compile_layers`` swaps the Triton RMSNorm for Inductor's.
- **CUDA with Triton, batch-invariant, dense weights**: the same fused layers with the
  batch-invariant Triton GEMM (:mod:`.invariant_kernels`) and fixed-split attention for
  steps and prompts; graphs as asked; no mixed steps, no Inductor (it picks its
  reduction by shape), no prompt-length plan.
- **Batch-invariant anywhere else** (CPU, CUDA without Triton, int8/int4 weights): the
  plain torch path of :mod:`.invariant` (tiled linear layers and norms, in-order
  attention), unfused and without graphs.
- **Otherwise** (CPU, or CUDA without Triton): the plain torch layer functions and dense
  masked attention for steps, SDPA for prompts, no fused kernels; graphs only on CUDA.
  The dtype decides nothing here (the kernels take each of float32, float16, bfloat16).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "KernelChoice",
    "LinearKernel",
    "NormKernel",
    "PieceAttention",
    "PromptAttention",
    "StepAttention",
    "choose_kernels",
]


class LinearKernel(StrEnum):
    """Every linear layer's GEMM (the LM head's too)."""

    #: :func:`.quant.linear` / ``linear_add_``: cuBLAS (``addmm_``) or the int8/int4 kernels.
    LIBRARY = "library"
    #: :func:`.invariant.invariant_linear`: the library GEMM in fixed tiles of rows.
    INVARIANT_TILES = "invariant-tiles"
    #: :func:`.invariant_kernels.invariant_mm`: the batch-invariant Triton GEMM (dense).
    INVARIANT_TRITON = "invariant-triton"


class NormKernel(StrEnum):
    """RMSNorm."""

    TORCH = "torch"  # :func:`.layers.rms_norm`
    INVARIANT_TILES = "invariant-tiles"  # :func:`.invariant.invariant_rms_norm`
    TRITON = "triton"  # :func:`.kernels.rms_norm`
    COMPILED = "compiled"  # ``torch.compile(layers.rms_norm)``


class StepAttention(StrEnum):
    """Attention of a step's (decode or verify) queries."""

    SPLITKV = "splitkv"  # :func:`.attention.splitkv_attention`
    FIXED_SPLIT = "fixed-split"  # :func:`.invariant_kernels.fixed_split_attention`
    INVARIANT_TORCH = "invariant-torch"  # :func:`.invariant.invariant_attention`
    REFERENCE = "reference"  # :func:`.attention.reference_attention`


class PromptAttention(StrEnum):
    """Attention of prompt pieces (prefill, chunks)."""

    SDPA = "sdpa"  # :func:`.pieces.sdpa_piece_attention`
    FIXED_SPLIT = "fixed-split"  # :func:`.invariant_kernels.prefill_fixed_split_attention`
    INVARIANT_TORCH = "invariant-torch"  # :func:`.pieces.invariant_piece_attention`


class PieceAttention(StrEnum):
    """Attention of a fixed-shape mixed step's prompt pieces (:mod:`.mixed_steps`)."""

    FIXED_SPLIT = "fixed-split"  # :func:`.invariant_kernels.fixed_split_attention`
    REFERENCE = "reference"  # :func:`.attention.reference_attention`


@dataclass(frozen=True)
class KernelChoice:
    """Every kernel decision of one :class:`.runtime.StaticRuntime` (see the module
    docstring); built by :func:`choose_kernels`."""

    #: Batch-invariant arithmetic (``--batch-invariant``), as asked.
    batch_invariant: bool
    linear: LinearKernel
    norm: NormKernel
    step_attention: StepAttention
    prompt_attention: PromptAttention
    piece_attention: PieceAttention
    #: The fused CUDA layer (Triton RoPE + KV write and SiLU-mul, the residual in the
    #: GEMM's epilogue); else the plain torch layer functions of :mod:`.layers`.
    fused_layers: bool
    #: CUDA graphs per step bucket, captured at warm-up.
    graphs: bool
    #: Mixed steps (decode rows and prompt pieces in one forward) are allowed.
    mixed_steps: bool
    #: Warm-up plans the prompt attention at every rounded length (CUDA SDPA).
    plan_prompt_lengths: bool
    #: Why, in words, for the logs.
    reason: str

    @property
    def invariant_kernels(self) -> bool:
        """Batch-invariant through the Triton kernels (not the plain torch path)."""
        return self.linear is LinearKernel.INVARIANT_TRITON


def choose_kernels(
    *,
    device_type: str,
    have_triton: bool,
    dense_weights: bool,
    batch_invariant: bool,
    use_graphs: bool,
    compile_layers: bool,
) -> KernelChoice:
    """The runtime's kernels for this device, install, weight format and mode.

    ``device_type``: ``torch.device.type`` of the weights ("cuda", "cpu", ...);
    ``dense_weights``: :func:`.invariant_kernels.all_dense` of the weights (no
    int8/int4 layer). ``use_graphs`` and ``compile_layers`` are the caller's wishes:
    graphs run only on CUDA and never on the plain invariant path, and Inductor's
    RMSNorm only in the fused, non-invariant layer.
    """
    cuda = device_type == "cuda"
    triton_gpu = cuda and have_triton
    invariant_kernels = batch_invariant and triton_gpu and dense_weights
    plain_invariant = batch_invariant and not invariant_kernels
    fused = triton_gpu and not plain_invariant
    graphs = use_graphs and cuda and not plain_invariant
    if invariant_kernels:
        linear, step, prompt = (LinearKernel.INVARIANT_TRITON, StepAttention.FIXED_SPLIT,
                                PromptAttention.FIXED_SPLIT)
    elif plain_invariant:
        linear, step, prompt = (LinearKernel.INVARIANT_TILES, StepAttention.INVARIANT_TORCH,
                                PromptAttention.INVARIANT_TORCH)
    else:
        linear, prompt = LinearKernel.LIBRARY, PromptAttention.SDPA
        step = StepAttention.SPLITKV if triton_gpu else StepAttention.REFERENCE
    if fused:
        norm = (NormKernel.COMPILED if compile_layers and not batch_invariant
                else NormKernel.TRITON)
    else:
        norm = NormKernel.INVARIANT_TILES if plain_invariant else NormKernel.TORCH
    piece = PieceAttention.FIXED_SPLIT if fused else PieceAttention.REFERENCE
    return KernelChoice(
        batch_invariant=batch_invariant, linear=linear, norm=norm, step_attention=step,
        prompt_attention=prompt, piece_attention=piece, fused_layers=fused, graphs=graphs,
        mixed_steps=not batch_invariant, plan_prompt_lengths=cuda and not batch_invariant,
        reason=_reason(device_type, have_triton, dense_weights, batch_invariant, use_graphs,
                       graphs, fused),
    )  # fmt: skip


def _reason(device_type: str, have_triton: bool, dense: bool, batch_invariant: bool,
            use_graphs: bool, graphs: bool, fused: bool) -> str:
    where = f"{device_type}, {'with' if have_triton else 'without'} Triton, " + (
        "dense weights" if dense else "int8/int4/fp8 weights")
    if batch_invariant and fused:
        how = "batch-invariant through the Triton GEMM and fixed-split attention"
    elif batch_invariant:
        lacking = [name for name, ok in (("CUDA", device_type == "cuda"), ("Triton", have_triton),
                                         ("dense weights", dense)) if not ok]
        how = ("batch-invariant on the plain torch path (the Triton kernels need "
               + ", ".join(lacking) + ")")
    elif fused:
        how = "fused Triton layers, split-KV attention"
    else:
        how = "the plain torch layers, dense masked attention"
    if graphs:
        shown = "CUDA graphs"
    elif use_graphs:
        shown = "no graphs (" + ("plain invariant path" if device_type == "cuda"
                                 else "not CUDA") + ")"
    else:
        shown = "no graphs (not asked)"
    return f"{where}: {how}; {shown}"
