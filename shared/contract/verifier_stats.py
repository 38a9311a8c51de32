"""The verifier's live state as ``Verifier.GetStats`` reports it: plain values, no
torch, no gRPC (the contract's rule), so a client and the server read the same types.

Kept apart from ``types.py``, which holds what a request and its stream carry: these
are what an operator reads of a running server.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepKindTimes:
    """One kind of engine step since start (``eventspec.cloud.scheduling.step_kinds``:
    plain, piece, tower, multi, finishing, eager, after_prefill, fallback): how many
    ran, the percentiles of their device time and of the session gaps they ended (the
    inter-token latency the sessions saw), and how many of those gaps are in the p99
    tail of all kinds' gaps, which says which kinds make the tail. Percentiles are
    those of bounded log histograms (about 4% wide bins); 0 where none was read."""

    kind: str
    steps: int = 0
    device_ms_p50: float = 0.0
    device_ms_p99: float = 0.0
    gap_ms_p50: float = 0.0
    gap_ms_p99: float = 0.0
    gaps_in_tail: int = 0


@dataclass(frozen=True)
class VerifierStats:
    """The verifier's live state (``Verifier.GetStats``, ``eventspec status``)."""

    state: str
    model_id: str = ""
    live_sessions: int = 0
    max_sessions: int = 0
    kv_slots_used: int = 0
    kv_slots_total: int = 0
    prefills_waiting: int = 0
    requests_served: int = 0
    acceptance_ewma: float = 0.0
    engine_steps: int = 0
    mean_batch_size: float = 0.0
    mean_tokens_per_step: float = 0.0
    sessions_expired: int = 0
    uptime_s: float = 0.0
    sessions_by_principal: dict[str, int] = field(default_factory=dict)
    #: "whole", "chunks of N", "chunks: auto" or "chunks: slack R, pace P ms" (--prefill-chunk).
    prefill: str = ""
    prefill_chunks: int = 0
    #: The prefix cache now and since start (all 0 when it is off).
    prefix_cache_entries: int = 0
    prefix_cache_bytes: int = 0
    prefix_cache_budget_bytes: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_misses: int = 0
    batch_invariant: bool = False
    #: KV memory in positions now and reserved, and ``--kv-layout`` ("by-length"/"slots").
    kv_positions_used: int = 0
    kv_positions_total: int = 0
    kv_layout: str = ""
    #: Sessions run at once and admitted, of what length, and why (``--max-sessions``).
    session_capacity: str = ""
    #: Engine steps since start by kind, the kinds that ran, in the labelling rule's order.
    step_kinds: tuple[StepKindTimes, ...] = ()
