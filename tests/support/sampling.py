"""The target's sampling distribution, for tests that compute exact distributions.

``target_probs`` applies temperature and top-p through the sampler's own ``nucleus``,
so the distributions tests compare against are exactly what ``BatchedSampler`` draws
from.
"""

from __future__ import annotations

import torch

from eventspec.cloud.scheduling.sampler import nucleus
from eventspec.shared.contract.errors import InvalidInput


def target_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """The target's sampling distribution over the text ids: logits [n, Vt] -> probs [n, Vt]."""
    if not temperature > 0 or not 0 < top_p <= 1:
        raise InvalidInput(f"need temperature > 0 and top_p in (0, 1], got {temperature}, "
                           f"{top_p}")
    p = torch.full((logits.shape[0],), top_p if top_p < 1.0 else 2.0, device=logits.device)
    return nucleus(logits.float() / temperature, p)
