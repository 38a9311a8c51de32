"""The verifier's live view (``Verifier.GetStats``): what it is doing now, read when asked.

Everything comes from state the server keeps anyway (the session registry, the KV slot
pool, the engine loop's counters, the acceptance estimate), so answering costs a few
attribute reads and nothing is recorded for it.
"""

from __future__ import annotations

from eventspec.cloud.runtime import VerifierRuntime
from eventspec.cloud.scheduling.prefill_chunking import ChunkPolicy
from eventspec.cloud.scheduling.prefix_cache import PrefixCache
from eventspec.cloud.scheduling.step_kind_stats import StepKindStats
from eventspec.shared.contract.verifier_stats import StepKindTimes, VerifierStats

#: Principals listed in ``sessions_by_principal`` (the busiest first).
MAX_PRINCIPALS = 32


def live_stats(rt: VerifierRuntime | None, *, phase: str, uptime_s: float) -> VerifierStats:
    """The live view; ``rt`` None (still warming up) reports ``phase`` only."""
    if rt is None:
        return VerifierStats(state=f"warming up: {phase}", uptime_s=uptime_s)
    sched = rt.scheduler
    dead = sched.dead
    state = "serving" if dead is None else f"engine stopped: {dead}"
    s = sched.stats
    batched = sum(size * n for size, n in s.batch_sizes.items())
    held = sorted(rt.registry.by_principal().items(), key=lambda kv: -kv[1])[:MAX_PRINCIPALS]
    return VerifierStats(
        state=state,
        model_id=rt.info.model_id,
        live_sessions=len(rt.registry),
        max_sessions=rt.registry.max_sessions,
        kv_slots_used=sched.live,
        kv_slots_total=sched.pool.num_slots,
        prefills_waiting=sched.waiting,
        requests_served=rt.requests_served,
        acceptance_ewma=rt.acceptance.value,
        engine_steps=s.steps,
        mean_batch_size=batched / s.steps if s.steps else 0.0,
        mean_tokens_per_step=s.step_tokens / s.steps if s.steps else 0.0,
        sessions_expired=rt.registry.expired,
        uptime_s=uptime_s,
        sessions_by_principal={str(p): n for p, n in held},
        prefill=prefill_mode(sched.chunking),
        prefill_chunks=s.prefill_chunks,
        batch_invariant=bool(getattr(sched.engine, "batch_invariant", False)),
        kv_positions_used=sched.pool.positions_used,
        kv_positions_total=sched.pool.positions_total,
        kv_layout="by-length" if sched.kv_by_length else "slots",
        session_capacity=rt.capacity.describe() if rt.capacity is not None else "",
        step_kinds=step_kind_times(s.kinds.copy()),
        **prefix_cache_view(sched.prefix_cache),
    )


def step_kind_times(kinds: StepKindStats) -> tuple[StepKindTimes, ...]:
    """The kinds that ran, from a snapshot of the loop's histograms (what
    ``bench_load`` reports per level, here since start)."""
    summary = kinds.summary()
    out = []
    for kind, k in summary["kinds"].items():
        device, gap = k["device_ms"], k["gap_ms"]
        out.append(StepKindTimes(
            kind=kind, steps=k["steps"], device_ms_p50=device["p50"] or 0.0,
            device_ms_p99=device["p99"] or 0.0, gap_ms_p50=gap["p50"] or 0.0,
            gap_ms_p99=gap["p99"] or 0.0, gaps_in_tail=k["gaps_in_tail"]))
    return tuple(out)


def prefill_mode(policy: ChunkPolicy) -> str:
    """``--prefill-chunk`` in words."""
    if not policy.enabled:
        return "whole"
    if policy.mode == "slack":
        pace = f", pace {policy.pace_ms:g} ms" if policy.pace_ms > 0 else ", no pace"
        return f"chunks: slack {policy.ratio:g}{pace}"
    return "chunks: auto" if policy.mode == "auto" else f"chunks of {policy.tokens}"


def prefix_cache_view(cache: PrefixCache | None) -> dict[str, int]:
    """The prefix cache's fields of the live view (zeros when it is off)."""
    if cache is None:
        return {}
    return {"prefix_cache_entries": len(cache), "prefix_cache_bytes": cache.bytes,
            "prefix_cache_budget_bytes": cache.max_bytes, "prefix_cache_hits": cache.hits,
            "prefix_cache_misses": cache.misses}
