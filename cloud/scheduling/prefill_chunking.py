"""How many prompt tokens one iteration of the engine loop prefills while sessions decode.

Chunked prefill, decode first (Sarathi-Serve, Agrawal et al., OSDI 2024): a whole 2,103-
token Video-LLaVA prefill (54 ms on an H200) stalls every running session for its full
length, so a loaded server's step time doubles or worse whenever a request arrives.
Cut into chunks, each iteration runs every running session's step and then at most one
chunk of the waiting prompts, so a decoding session waits at most one chunk per step.

The rule (``--prefill-chunk auto``): a chunk may cost about what the iteration's step
costs, so decoding slows at most about twofold while a prefill is under way and a
prompt still advances by one step's worth of compute per step; but never fewer than
``AUTO_MIN_CHUNK_TOKENS``, below which a chunk call costs the same whatever its size.
From the cloud's calibrated cost model: tokens = (step ms - prefill base ms) / prefill
ms per prompt token (the larger of its visual and text rates: a Video-LLaVA prompt is
almost all video), floored to a multiple of ``CHUNK_QUANTUM`` and held within
[``AUTO_MIN_CHUNK_TOKENS``, the loop's prefill token budget floored likewise]. With
nothing decoding there is no one to stall: the oldest prompt goes whole (and those
behind it, within the budget), as without chunks. ``--prefill-chunk N`` fixes N tokens;
``off`` prefills whole prompts always. ``--prefill-chunk slack`` (or ``slack:R``, or
``slack:R:PACE``) sizes each iteration's pieces from the measured step times: as small
as writes every prompt within PACE ms (200) of its submission, and so that a step with
a piece stays within R (1.5) times one without: :mod:`eventspec.cloud.scheduling.piece_slack`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from eventspec.cloud.scheduling.piece_slack import (
    DEFAULT_PACE_MS,
    DEFAULT_SLACK_RATIO,
    SLACK_PIECE_ROWS,
    PieceSlack,
)
from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.node.static.buckets import CHUNK_TILE

#: Chunks are multiples of this many tokens (and never smaller): GEMM-friendly, and a
#: lower bound on progress when the cost model says a step is very cheap.
CHUNK_QUANTUM = 64

#: The smallest ``auto`` chunk. A chunk is one eager 32-layer pass, and at full size on
#: an H200 a pass of up to 512 tokens costs 11-14 ms whatever its size (kernel launches,
#: not arithmetic): a 2,103-token prompt took 475 ms in 64-token chunks and 68 ms in
#: 512-token ones against 59 ms whole, and 1,024-token chunks took 59.5 ms
#: (``benchmarks/results/chunked-prefill-h200.json``, ``python -m
#: benchmarks.probe_chunked_prefill``). The cost model has no per-call term
#: (calibration fits ``prefill_base_ms`` = 0), so without this floor the rule gives
#: launch-bound chunks: on the H200's calibrated costs (0.024 ms per prompt token, a
#: step of 4.8 ms alone, 8.5 ms at 16 sessions) 192 tokens at B = 1, 320 at B = 16.
AUTO_MIN_CHUNK_TOKENS = 1024


@dataclass(frozen=True)
class ChunkPolicy:
    """``--prefill-chunk``: "off", "auto", a fixed number of tokens, or "slack" with
    its step-time ratio R (``ratio``) and its pace (``pace_ms``, 0: off)."""

    mode: str  # "off" | "auto" | "fixed" | "slack"
    tokens: int = 0
    ratio: float = 0.0  # slack's R
    pace_ms: float = 0.0  # slack's pace

    @classmethod
    def parse(cls, text: str) -> ChunkPolicy:
        """Raises ValueError naming the flag for anything but off, auto, N >= 1, slack,
        slack:R with a finite R > 1, or slack:R:PACE with a finite PACE >= 0 ms."""
        value = text.strip().lower()
        if value in ("off", "auto"):
            return cls(value)
        if value == "slack" or value.startswith("slack:"):
            ratio, pace = _slack_params(text, value)
            return cls("slack", ratio=ratio, pace_ms=pace)
        try:
            tokens = int(value)
        except ValueError:
            raise ValueError(f"--prefill-chunk must be off, auto, slack[:R[:PACE]] or a "
                             f"number of tokens, got {text!r}") from None
        if tokens < 1:
            raise ValueError(f"--prefill-chunk must be >= 1 token, got {tokens}")
        return cls("fixed", tokens)

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def budget(self, cost: CloudCost | None, sessions: int, step_tokens: int,
               whole_budget: int) -> int | None:
        """Prompt tokens this iteration may prefill; None: whole prompts (nothing
        decodes, or chunking is off). ``slack`` needs the measured times this call has
        not got: the scheduler asks its :class:`~.piece_slack.PieceSlack` instead, and
        a caller without one gets slack's floor, one tile."""
        if not self.enabled or sessions == 0:
            return None
        if self.mode == "fixed":
            return self.tokens
        if self.mode == "slack":
            return CHUNK_TILE
        return auto_chunk_tokens(cost, sessions, step_tokens, whole_budget)


def _slack_params(text: str, value: str) -> tuple[float, float]:
    """R and the pace of ``slack`` (the defaults), ``slack:R`` or ``slack:R:PACE``;
    ValueError naming the flag."""
    parts = value.split(":")[1:]
    if len(parts) > 2:
        raise ValueError(f"--prefill-chunk slack takes at most R and PACE "
                         f"(slack:R:PACE), got {text!r}")
    ratio = _number(parts[0]) if parts else DEFAULT_SLACK_RATIO
    if not (math.isfinite(ratio) and ratio > 1):
        raise ValueError(f"--prefill-chunk slack:R needs a step-time ratio R > 1 (a step "
                         f"with a piece within R times one without), got {text!r}")
    pace = _number(parts[1]) if len(parts) == 2 else DEFAULT_PACE_MS
    if not (math.isfinite(pace) and pace >= 0):
        raise ValueError(f"--prefill-chunk slack:R:PACE needs a pace of PACE >= 0 ms (each "
                         f"prompt written within PACE ms of its submission; 0: off), "
                         f"got {text!r}")
    return ratio, pace


def _number(text: str) -> float:
    """``text`` as a float, NaN if it is none."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def graphed_piece_rows(policy: ChunkPolicy, max_seq_len: int) -> tuple[int, ...]:
    """The prompt-piece row buckets the static engine captures mixed-step graphs for
    (``StaticRuntime(chunk_buckets=...)``): with ``--prefill-chunk N``, N rounded up to
    whole 64-row tiles, one tile more (a step whose budget ends one prompt and starts
    the next carries two pieces, each padded to whole tiles), and one tile alone (a
    new question after a reused clip, a prompt's last words). With ``slack``, its
    buckets (:data:`~.piece_slack.SLACK_PIECE_ROWS`: five against ``N``'s three; its
    budgets are cut to fit them, so no extra tile). None for ``off``, and none for
    ``auto``, whose budgets vary step by step: its pieces run eagerly."""
    if policy.mode == "slack":
        return tuple(r for r in SLACK_PIECE_ROWS if r <= max_seq_len)
    if policy.mode != "fixed":
        return ()
    tile = CHUNK_TILE
    rows = -(-policy.tokens // tile) * tile  # whole tiles
    return tuple(sorted(r for r in {tile, rows, rows + tile} if r <= max_seq_len))


def slack_for(policy: ChunkPolicy, cost: CloudCost | None, max_seq_len: int,
              token_budget: int) -> PieceSlack | None:
    """``--prefill-chunk slack``'s state, over the buckets the engine captures within
    the loop's prefill token budget; None under any other policy."""
    if policy.mode != "slack":
        return None
    cap = max(CHUNK_TILE, token_budget)
    return PieceSlack(policy.ratio, cost, pace_ms=policy.pace_ms,
                      buckets=[b for b in graphed_piece_rows(policy, max_seq_len) if b <= cap])


def auto_chunk_tokens(cost: CloudCost | None, sessions: int, step_tokens: int,
                      whole_budget: int) -> int:
    """The ``auto`` rule (module docstring): a chunk costing about one step, and at
    least ``AUTO_MIN_CHUNK_TOKENS`` (the budget permitting)."""
    upper = max(CHUNK_QUANTUM, whole_budget // CHUNK_QUANTUM * CHUNK_QUANTUM)
    lower = min(AUTO_MIN_CHUNK_TOKENS, upper)
    per_token = 0.0 if cost is None else max(cost.prefill_ms_per_visual_token,
                                             cost.prefill_ms_per_text_token)
    if cost is None or per_token <= 0:
        return upper
    step_ms = cost.batch_step_ms(sessions, step_tokens)
    tokens = (step_ms - cost.prefill_base_ms) / per_token
    return max(lower, min(int(tokens) // CHUNK_QUANTUM * CHUNK_QUANTUM, upper))
