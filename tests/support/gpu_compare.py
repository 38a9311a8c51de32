"""How two logit tensors of the GPU tests differ, kept in the ``make test-gpu`` summary.

Each GPU test that compares logits records what it measured (``record_property``), so
the committed JSON states the bitwise, fp32 and bf16 numbers behind its tolerances.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Record = Callable[[str, Any], None]


def differences(got: torch.Tensor, want: torch.Tensor) -> dict[str, Any]:
    """got, want: [N, V] logits. Returns bitwise equality, the largest absolute
    difference, the largest per-row relative error ``|got - want| / |want|`` (L2 over
    the vocabulary) and the fraction of rows whose greedy token agrees."""
    g, w = got.float(), want.float()  # [N, V]
    row_err = (g - w).norm(dim=-1) / w.norm(dim=-1).clamp_min(1e-30)  # [N]
    return {
        "bitwise": bool(torch.equal(got, want)),
        "max_abs": float((g - w).abs().max()),
        "max_row_rel": float(row_err.max()),
        "argmax_agree": float((g.argmax(-1) == w.argmax(-1)).float().mean()),
        "rows": int(g.shape[0]),
    }


def recorded(record: Record, name: str, got: torch.Tensor, want: torch.Tensor
             ) -> dict[str, Any]:
    """:func:`differences`, also recorded under ``name`` for the summary."""
    d = differences(got, want)
    record(name, d)
    return d
