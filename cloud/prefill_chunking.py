"""How many prompt tokens one iteration of the engine loop prefills while sessions decode.

Chunked prefill, decode first (Sarathi-Serve, Agrawal et al., OSDI 2024): a whole 2,103-
token Video-LLaVA prefill (54 ms on an H200) stalls every running session for its full
length, so a loaded server's step time doubles or worse whenever a request arrives.
Cut into chunks, each iteration runs every running session's step and then at most one
chunk of the waiting prompts, so a decoding session waits at most one chunk per step.

The rule (``--prefill-chunk auto``): a chunk may cost about what the iteration's step
costs, so decoding slows at most about twofold while a prefill is under way and a
prompt still advances by one step's worth of compute per step. From the cloud's
calibrated cost model: tokens = (step ms - prefill base ms) / prefill ms per text token,
floored to a multiple of ``CHUNK_QUANTUM`` and held within [``CHUNK_QUANTUM``, the
loop's prefill token budget floored likewise]. With nothing decoding there is no one to stall: the
oldest prompt goes whole (and those behind it, within the budget), as without chunks.
``--prefill-chunk N`` fixes N tokens; ``off`` prefills whole prompts always.
"""

from __future__ import annotations

from dataclasses import dataclass

from eventspec.shared.contract.timing import CloudCost

#: Chunks are multiples of this many tokens (and never smaller): GEMM-friendly, and a
#: lower bound on progress when the cost model says a step is very cheap.
CHUNK_QUANTUM = 64


@dataclass(frozen=True)
class ChunkPolicy:
    """``--prefill-chunk``: "off", "auto" or a fixed number of tokens."""

    mode: str  # "off" | "auto" | "fixed"
    tokens: int = 0

    @classmethod
    def parse(cls, text: str) -> ChunkPolicy:
        """Raises ValueError naming the flag for anything but off, auto or N >= 1."""
        value = text.strip().lower()
        if value in ("off", "auto"):
            return cls(value)
        try:
            tokens = int(value)
        except ValueError:
            raise ValueError(f"--prefill-chunk must be off, auto or a number of tokens, "
                             f"got {text!r}") from None
        if tokens < 1:
            raise ValueError(f"--prefill-chunk must be >= 1 token, got {tokens}")
        return cls("fixed", tokens)

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def budget(self, cost: CloudCost | None, sessions: int, step_tokens: int,
               whole_budget: int) -> int | None:
        """Prompt tokens this iteration may prefill; None: whole prompts (nothing
        decodes, or chunking is off)."""
        if not self.enabled or sessions == 0:
            return None
        if self.mode == "fixed":
            return self.tokens
        return auto_chunk_tokens(cost, sessions, step_tokens, whole_budget)


def auto_chunk_tokens(cost: CloudCost | None, sessions: int, step_tokens: int,
                      whole_budget: int) -> int:
    """The ``auto`` rule (module docstring): a chunk costing about one step."""
    upper = max(CHUNK_QUANTUM, whole_budget // CHUNK_QUANTUM * CHUNK_QUANTUM)
    if cost is None or cost.prefill_ms_per_text_token <= 0:
        return upper
    step_ms = cost.batch_step_ms(sessions, step_tokens)
    tokens = (step_ms - cost.prefill_base_ms) / cost.prefill_ms_per_text_token
    return max(CHUNK_QUANTUM, min(int(tokens) // CHUNK_QUANTUM * CHUNK_QUANTUM, upper))
