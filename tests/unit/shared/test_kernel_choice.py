"""The static runtime's kernel choice: one pure function, pinned for every combination.

``_before`` is the decision logic ``StaticRuntime.__init__`` (and its forward, prefill,
mixed-step and warm-up branches) worked out inline before the choice had a type of its
own, transcribed as it was; every combination of its six inputs must give the same
decisions through :func:`choose_kernels`. The named cases below spell the main rows out.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from eventspec.shared.node.static import kernels as static_kernels
from eventspec.shared.node.static import layers
from eventspec.shared.node.static.invariant import invariant_linear, invariant_rms_norm
from eventspec.shared.node.static.invariant_kernels import (
    dense_invariant_linear,
    dense_invariant_linear_add_,
)
from eventspec.shared.node.static.kernel_choice import (
    KernelChoice,
    LinearKernel,
    NormKernel,
    PieceAttention,
    PromptAttention,
    StepAttention,
    choose_kernels,
)
from eventspec.shared.node.static.layer_forward import layer_functions
from eventspec.shared.node.static.quant import linear, linear_add_

INPUTS = ("cuda", "have_triton", "dense_weights", "batch_invariant", "use_graphs",
          "compile_layers")


def _before(cuda: bool, have_triton: bool, dense_weights: bool, batch_invariant: bool,
            use_graphs: bool, compile_layers: bool) -> dict[str, Any]:
    """The old ``__init__``'s flags and the branches that read them."""
    triton_gpu = cuda and have_triton
    invariant_kernels = batch_invariant and triton_gpu and dense_weights
    plain_invariant = batch_invariant and not invariant_kernels
    graphs = use_graphs and cuda and not plain_invariant
    use_splitkv = triton_gpu and not batch_invariant
    fused = triton_gpu and not plain_invariant
    norm, lin = "torch", "library"
    if plain_invariant:
        norm, lin = "invariant-tiles", "invariant-tiles"
    if invariant_kernels:
        lin = "invariant-triton"
    if fused:
        norm = "triton"
        if compile_layers and not batch_invariant:
            norm = "compiled"
    if invariant_kernels:  # _step_attention's branches, in order
        step = "fixed-split"
    elif batch_invariant:
        step = "invariant-torch"
    elif use_splitkv:
        step = "splitkv"
    else:
        step = "reference"
    if invariant_kernels:  # _prompt_attention's
        prompt = "fixed-split"
    elif batch_invariant:
        prompt = "invariant-torch"
    else:
        prompt = "sdpa"
    return {
        "invariant_kernels": invariant_kernels, "graphs": graphs, "fused_layers": fused,
        "norm": norm, "linear": lin, "step_attention": step, "prompt_attention": prompt,
        "piece_attention": "fixed-split" if fused else "reference",  # _forward_mixed's
        "mixed_steps": not batch_invariant,  # step_with_pieces refuses, no chunk buckets
        "plan_prompt_lengths": cuda and not batch_invariant,  # warm_up's
    }


def _after(choice: KernelChoice) -> dict[str, Any]:
    return {
        "invariant_kernels": choice.invariant_kernels, "graphs": choice.graphs,
        "fused_layers": choice.fused_layers, "norm": str(choice.norm),
        "linear": str(choice.linear), "step_attention": str(choice.step_attention),
        "prompt_attention": str(choice.prompt_attention),
        "piece_attention": str(choice.piece_attention), "mixed_steps": choice.mixed_steps,
        "plan_prompt_lengths": choice.plan_prompt_lengths,
    }


def _choose(cuda: bool, have_triton: bool, dense_weights: bool, batch_invariant: bool,
            use_graphs: bool, compile_layers: bool) -> KernelChoice:
    return choose_kernels(device_type="cuda" if cuda else "cpu", have_triton=have_triton,
                          dense_weights=dense_weights, batch_invariant=batch_invariant,
                          use_graphs=use_graphs, compile_layers=compile_layers)


@pytest.mark.parametrize("flags", list(itertools.product([False, True], repeat=len(INPUTS))),
                         ids=lambda f: "-".join(n for n, v in zip(INPUTS, f, strict=True) if v)
                         or "none")
def test_every_combination_decides_what_the_old_init_did(flags: tuple[bool, ...]) -> None:
    choice = _choose(*flags)
    assert _after(choice) == _before(*flags)
    assert choice.batch_invariant == flags[INPUTS.index("batch_invariant")]
    assert choice.reason


def test_cpu_runs_the_plain_torch_layers_without_graphs() -> None:
    for triton in (False, True):
        c = _choose(False, triton, True, False, True, True)
        assert (c.linear, c.norm, c.step_attention, c.prompt_attention) == (
            LinearKernel.LIBRARY, NormKernel.TORCH, StepAttention.REFERENCE,
            PromptAttention.SDPA)
        assert not c.graphs and not c.fused_layers and c.mixed_steps
        assert not c.plan_prompt_lengths
        assert "no graphs (not CUDA)" in c.reason


def test_cuda_with_triton_fuses_the_layers_and_splits_kv() -> None:
    for dense in (False, True):  # int8/int4 weights take the same fused layer (quant.linear)
        c = _choose(True, True, dense, False, True, False)
        assert (c.linear, c.norm, c.step_attention, c.prompt_attention, c.piece_attention) == (
            LinearKernel.LIBRARY, NormKernel.TRITON, StepAttention.SPLITKV,
            PromptAttention.SDPA, PieceAttention.FIXED_SPLIT)
        assert c.graphs and c.fused_layers and c.mixed_steps and c.plan_prompt_lengths
    assert _choose(True, True, True, False, True, True).norm is NormKernel.COMPILED
    assert not _choose(True, True, True, False, False, False).graphs


def test_cuda_without_triton_keeps_the_torch_layers_but_graphs() -> None:
    c = _choose(True, False, True, False, True, True)
    assert (c.linear, c.norm, c.step_attention) == (
        LinearKernel.LIBRARY, NormKernel.TORCH, StepAttention.REFERENCE)
    assert c.graphs and not c.fused_layers and c.piece_attention is PieceAttention.REFERENCE
    assert c.plan_prompt_lengths


def test_batch_invariant_on_cuda_with_triton_and_dense_weights_takes_the_triton_kernels(
) -> None:
    c = _choose(True, True, True, True, True, True)
    assert c.invariant_kernels
    assert (c.linear, c.norm, c.step_attention, c.prompt_attention) == (
        LinearKernel.INVARIANT_TRITON, NormKernel.TRITON, StepAttention.FIXED_SPLIT,
        PromptAttention.FIXED_SPLIT)  # no Inductor norm: it picks its reduction by shape
    assert c.graphs and c.fused_layers
    assert not c.mixed_steps and not c.plan_prompt_lengths


@pytest.mark.parametrize(("cuda", "triton", "dense", "lacking"), [
    (False, True, True, "CUDA"), (True, False, True, "Triton"),
    (True, True, False, "dense weights"), (False, False, False, "CUDA, Triton, dense weights"),
])
def test_batch_invariant_elsewhere_takes_the_plain_path_unfused_and_ungraphed(
        cuda: bool, triton: bool, dense: bool, lacking: str) -> None:
    c = _choose(cuda, triton, dense, True, True, True)
    assert not c.invariant_kernels
    assert (c.linear, c.norm, c.step_attention, c.prompt_attention) == (
        LinearKernel.INVARIANT_TILES, NormKernel.INVARIANT_TILES,
        StepAttention.INVARIANT_TORCH, PromptAttention.INVARIANT_TORCH)
    assert not c.graphs and not c.fused_layers and not c.mixed_steps
    assert f"the Triton kernels need {lacking})" in c.reason


def test_the_choice_is_frozen() -> None:
    c = _choose(False, False, True, False, False, False)
    with pytest.raises(AttributeError):
        c.graphs = True  # type: ignore[misc]


def test_each_choice_resolves_to_its_functions() -> None:
    plain = layer_functions(_choose(False, False, True, False, False, False))
    assert (plain.norm, plain.lin, plain.lin_add_) == (layers.rms_norm, linear, linear_add_)
    tiles = layer_functions(_choose(False, False, True, True, False, False))
    assert (tiles.norm, tiles.lin) == (invariant_rms_norm, invariant_linear)
    fused = layer_functions(_choose(True, True, True, False, True, False))
    assert (fused.norm, fused.lin, fused.lin_add_) == (static_kernels.rms_norm, linear,
                                                       linear_add_)
    triton = layer_functions(_choose(True, True, True, True, True, False))
    assert (triton.norm, triton.lin, triton.lin_add_) == (
        static_kernels.rms_norm, dense_invariant_linear, dense_invariant_linear_add_)
    compiled = layer_functions(_choose(True, True, True, False, True, True))
    assert compiled.norm not in (layers.rms_norm, static_kernels.rms_norm)
