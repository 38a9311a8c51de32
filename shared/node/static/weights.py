"""The static runtime's view of a LLaMA decoder: fused weights, RoPE tables.

Any LLaMA decoder: the cloud's Video-LLaVA language model and the edge's EventGPT LLM
both hand theirs over (``decoder`` is the ``LlamaModel``-like module with ``layers``,
``embed_tokens``, ``norm`` and ``rotary_emb``; ``lm_head`` the output projection).

The weights are the loaded HF model's own tensors, never a second copy: the q/k/v and
gate/up projections are concatenated once (one GEMM instead of three, and two instead
of one, as gpt-fast and vLLM do) and the HF modules' parameters are then re-pointed
at views of the fused tensors. The HF model keeps computing exactly what it computed
before (same values), and a 7B target does not hold 13 GB of weights twice.

RoPE is taken from the HF model's own rotary module (so any static rope scaling,
``linear``, ``llama3``, ``yarn``..., and its attention factor come out right) and
tabulated once for every position of a slot. RMSNorm follows ``LlamaRMSNorm`` to
the cast: normalise in float32, cast back, then scale by the weight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from eventspec.shared.node.static.weight_formats import Weight

#: Rope variants whose frequencies depend on the running sequence length: a table
#: computed once cannot reproduce them.
_DYNAMIC_ROPE = ("dynamic", "longrope")


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer; every matrix is [out, in] as in ``nn.Linear``, dense or
    weight-only quantised (:mod:`.weight_formats`, :mod:`.quant`)."""

    ln_attn: torch.Tensor  # [H]
    wqkv: Weight  # [(Hq + 2 Hkv) D, H]
    wo: Weight  # [H, Hq D]
    ln_mlp: torch.Tensor  # [H]
    w_gate_up: Weight  # [2 I, H]
    w_down: Weight  # [H, I]


@dataclass(frozen=True)
class LanguageWeights:
    """Everything the static forward reads, plus the shapes it needs."""

    embed: torch.Tensor  # [V, H]
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float

    @property
    def hidden(self) -> int:
        return int(self.embed.shape[1])

    @property
    def vocab(self) -> int:
        return int(self.lm_head.shape[0])

    @property
    def weight_bytes(self) -> int:
        """Bytes a decode step must read: every matrix once (embedding rows aside)."""
        total = int(self.lm_head.nbytes)
        for lw in self.layers:
            for t in (lw.wqkv, lw.wo, lw.w_gate_up, lw.w_down):
                total += int(t.nbytes)
        return total


def llama_unsupported_reason(decoder: Any, lm_head: Any) -> str | None:
    """Why the static runtime cannot run this decoder (None when it can).

    It implements the LLaMA decoder exactly: bias-free projections, SiLU gated MLP,
    RMSNorm, full causal attention with a static (position-only) rotary embedding. The
    caller vouches for the architecture (a ``LlamaModel`` or a subclass such as
    EventGPT's); this checks the configuration knobs that would change the arithmetic.
    """
    if decoder is None or not hasattr(decoder, "layers") or lm_head is None:
        return "the model has no decoder layers / lm_head"
    cfg = decoder.config
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        return "biased attention/MLP projections are not implemented"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} is not silu"
    rope = getattr(cfg, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", "default") if isinstance(rope, dict) else "default"
    if rope_type in _DYNAMIC_ROPE:
        return f"rope type {rope_type!r} depends on the sequence length"
    if getattr(cfg, "sliding_window", None):
        return "sliding-window attention is not implemented"
    if int(cfg.num_attention_heads) % int(cfg.num_key_value_heads):
        return "num_attention_heads is not a multiple of num_key_value_heads"
    return None


def _share(module: Any, fused: torch.Tensor) -> None:
    """Re-point ``module.weight`` at a view of the fused tensor (same values)."""
    module.weight.data = fused


@torch.no_grad()
def fuse_llama_weights(decoder: Any, lm_head: Any) -> LanguageWeights:
    """Fuse q/k/v and gate/up of every layer, sharing storage with the HF modules."""
    lm = decoder
    cfg = lm.config
    layers = []
    for layer in lm.layers:
        attn, mlp = layer.self_attn, layer.mlp
        q, k, v = attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight
        wqkv = torch.cat([q, k, v], dim=0).contiguous()  # [(Hq + 2 Hkv) D, H]
        nq, nk = q.shape[0], k.shape[0]
        _share(attn.q_proj, wqkv[:nq])
        _share(attn.k_proj, wqkv[nq : nq + nk])
        _share(attn.v_proj, wqkv[nq + nk :])
        gate, up = mlp.gate_proj.weight, mlp.up_proj.weight
        w_gate_up = torch.cat([gate, up], dim=0).contiguous()  # [2 I, H]
        _share(mlp.gate_proj, w_gate_up[: gate.shape[0]])
        _share(mlp.up_proj, w_gate_up[gate.shape[0] :])
        layers.append(
            LayerWeights(
                ln_attn=layer.input_layernorm.weight.detach(),
                wqkv=wqkv,
                wo=attn.o_proj.weight.detach(),
                ln_mlp=layer.post_attention_layernorm.weight.detach(),
                w_gate_up=w_gate_up,
                w_down=mlp.down_proj.weight.detach(),
            )
        )
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    return LanguageWeights(
        embed=lm.embed_tokens.weight.detach(),
        layers=tuple(layers),
        norm=lm.norm.weight.detach(),
        lm_head=lm_head.weight.detach(),
        num_heads=int(cfg.num_attention_heads),
        num_kv_heads=int(cfg.num_key_value_heads),
        head_dim=head_dim,
        eps=float(cfg.rms_norm_eps),
    )


@torch.no_grad()
def rope_tables(
    decoder: Any, max_seq_len: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, D] for positions 0..T-1, from the HF rotary module, in the model dtype.

    HF computes them in float32 and casts to the activations' dtype before rotating;
    storing the cast tables reproduces that rounding.
    """
    rotary = decoder.rotary_emb
    probe = torch.zeros(1, device=device, dtype=dtype)
    positions = torch.arange(max_seq_len, device=device)[None]  # [1, T]
    cos, sin = rotary(probe, position_ids=positions)  # each [1, T, D]
    return cos[0].to(dtype).contiguous(), sin[0].to(dtype).contiguous()  # [T, D]
