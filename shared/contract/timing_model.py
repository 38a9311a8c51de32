"""One deterministic cost model for the timing budget, run identically on both nodes.

Why one pure function: the edge and the cloud each call :func:`plan` on the same
exchanged profiles and reach the same budget without an extra round trip
(DESIGN.md, "Timing budget negotiation"). Everything here is plain float
arithmetic on frozen dataclasses, so the result is bit-identical on both ends.

The model, in ms (t1 = step_ms(1), T(g) = step_ms(g + 1), d = draft ms/token,
c = d / t1, E(g) = (1 - a^(g+1)) / (1 - a), Leviathan et al. 2023):

* **Hidden drafts.** The edge sends ``Open`` and the payload at t = 0; the cloud
  has it at ``rtt/2 + U`` (U = payload bytes / uplink, 0 when the uplink is
  unknown) and ends prefill at ``rtt/2 + U + P``. The edge finishes its prefill
  at D; draft i leaves at ``D + i*d`` and lands ``rtt/2`` later. Drafts travel
  behind the payload on the same ordered stream, so they never beat it. Hence
  ``k_time = floor((U + P - D) / d)``: the one-way delays cancel, more RTT never
  adds hidden drafts, slower drafting removes them, and a slow upload leaves the
  edge more time. A hidden draft is kept only while its expected saving exceeds
  its marginal verify cost: ``a^i * v > step_ms_per_token``, where v, the best
  ms/token any lookahead could reach (``min_g T(g)/E(g)``), is a lower bound on
  what an accepted token saves. Capped by ``max_hidden_drafts`` and by
  ``max_new_tokens - 2`` (the prefill yields one token and a final step always
  yields at least one).
* **Later rounds.** The cloud never waits. If ``c >= 1`` the edge cannot get
  ahead of a cloud that decodes alone, so later drafts arrive too late: lookahead
  0. Otherwise a step with lookahead g commits ``E'(g) = min(E(g), T(g)/d)``
  tokens: the edge must also produce, during the step, every token the step
  consumes (drafts and the bonus its tail must match), or it falls behind. A
  step keeps the edge's tail valid with probability ``s = a^(g+1)``; after a
  break the edge hears of it ``rtt/2`` later and its first new draft lands
  ``rtt/2 + d`` after that, while the cloud keeps decoding alone at 1/t1, so the
  cloud runs plain for ``R = (rtt + d) / (1 - c)``. Renewal-reward rate:
  ``r(g) = (E'/(1-s) + R/t1) / (T/(1-s) + R)`` tokens/ms (g = 0 gives 1/t1,
  plain decoding); the lookahead is the smallest g within 0.1% of the best r.
* **Depth.** The lookahead g is what each step should find to verify; the edge's tail
  is counted from the last commit it has *heard*, which lags the cloud: a commit
  reaches the edge ``rtt/2`` after it, and a draft made then lands ``rtt/2 + d`` later,
  while the cloud keeps committing ``E'(g)`` tokens per ``T(g)``. So the edge drafts
  ``depth = g + ceil(E'(g) * (rtt + d) / T(g))`` ahead (``lookahead_tokens``), capped
  at ``max_lookahead`` (the cloud's verify cap less one, which its configuration keeps
  within the cap on a drafts message: a deeper tail would be refused). With depth g
  alone, every draft of a fast cloud at B = 1 landed after its step had begun: 1.00
  tokens per step on an H200 at RTT 1 ms, where the Monte-Carlo of
  ``tests/support/spec_model.py`` gives 1.10x for depth 3
  (``benchmarks/results/e2e-h200-b.json``).
* **Speedup** over target-only on the same stack for N = max_new_tokens:
  ``base = rtt + U + P + (N-1)*t1``; ``spec = rtt + U + P + T(k) + (N-1-E(k))/r``
  (k hidden drafts verified in the first step, or ``(N-1)/r`` when k = 0).
  Speculate iff ``base/spec > 1 + min_speedup_margin`` with the best r (so the
  decision is monotone in RTT and draft speed); otherwise the edge stops
  drafting (hidden 0, lookahead 0) and the request decodes target-only.
* **Cadence** and **aligned fit**: see :func:`_chunk_cadence`, :func:`_aligned_fits`.

Known simplifications: the draft-side payload preparation time, the cloud's
cheaper prefill when aligned features skip its video tower, and the partial
drafts available while the edge ramps back up after a break are not modelled.
"""

from __future__ import annotations

import dataclasses
import math

from eventspec.shared.contract.timing import PlanInputs, TimingPlan

_FLOOR_EPS = 1e-9
"""Absorbs float noise so that a ratio that is an exact integer (54 / 2) floors to it."""
_LOOKAHEAD_TOLERANCE = 1e-3
"""The lookahead is the smallest whose rate is within this fraction of the best."""


def expected_tokens(alpha: float, gamma: int) -> float:
    """Leviathan et al. 2023: expected tokens per step verifying ``gamma`` drafts."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def _upload_ms(payload_bytes: int, uplink_bytes_per_s: float) -> float:
    """Upload time in ms; 0 when the uplink is unknown (it then cannot be counted)."""
    if uplink_bytes_per_s <= 0:
        return 0.0
    return 1000.0 * payload_bytes / uplink_bytes_per_s


def _later_rate(inp: PlanInputs, gamma: int) -> float:
    """Committed tokens per ms of cloud time with lookahead ``gamma`` (module docstring)."""
    cloud, edge, a = inp.cloud, inp.edge, inp.alpha
    t1 = cloud.step_ms(1)
    if gamma == 0:
        return 1.0 / t1
    step = cloud.step_ms(gamma + 1)
    # The edge must produce what the step consumes, or it falls behind.
    e = min(expected_tokens(a, gamma), step / edge.draft_ms_per_token)
    survive = a ** (gamma + 1)
    if survive >= 1.0:
        return e / step
    c = edge.draft_ms_per_token / t1
    recovery_ms = (edge.rtt_ms + edge.draft_ms_per_token) / (1.0 - c)
    per_break = 1.0 / (1.0 - survive)  # expected steps between breaks
    return (e * per_break + recovery_ms / t1) / (step * per_break + recovery_ms)


def _choose_lookahead(inp: PlanInputs) -> tuple[int, float, float]:
    """(lookahead, its rate, best rate) for later rounds, rates in tokens/ms.

    Candidates run from 1 up to the first lookahead at which the edge cannot keep
    up (``E(g) * d > T(g)``): wider ones would only be nominal, since an edge that
    falls behind is never that far ahead. The lookahead is the smallest candidate
    within ``_LOOKAHEAD_TOLERANCE`` of the best rate, so a flat step cost does not
    push the edge to draft far ahead for a vanishing gain.
    """
    t1 = inp.cloud.step_ms(1)
    d = inp.edge.draft_ms_per_token
    rates = [1.0 / t1]  # index = lookahead; 0 is plain decoding
    if d < t1:
        for gamma in range(1, inp.max_lookahead + 1):
            rates.append(_later_rate(inp, gamma))
            if expected_tokens(inp.alpha, gamma) * d > inp.cloud.step_ms(gamma + 1):
                break  # edge-limited: wider lookaheads are nominal
    best = max(rates)
    if best <= rates[0]:
        return 0, rates[0], rates[0]
    gamma = next(g for g, r in enumerate(rates) if r >= best * (1.0 - _LOOKAHEAD_TOLERANCE))
    return gamma, rates[gamma], best


def edge_depth(inp: PlanInputs, gamma: int) -> int:
    """How far ahead of the last commit it heard the edge drafts, so that each step
    finds ``gamma`` drafts despite the round trip (module docstring, "Depth")."""
    if gamma <= 0:
        return 0
    d = inp.edge.draft_ms_per_token
    step = inp.cloud.step_ms(gamma + 1)
    per_step = min(expected_tokens(inp.alpha, gamma), step / d)
    lag = math.ceil(per_step * (inp.edge.rtt_ms + d) / step - _FLOOR_EPS)
    return min(gamma + max(0, lag), max(gamma, inp.max_lookahead))


def _token_value_floor_ms(inp: PlanInputs) -> float:
    """min over g of T(g)/E(g): the least an accepted token can save, for any lookahead."""
    return min(
        inp.cloud.step_ms(g + 1) / expected_tokens(inp.alpha, g)
        for g in range(inp.max_lookahead + 1)
    )


def _hidden_budget(inp: PlanInputs, prefill_ms: float, upload_ms: float) -> tuple[int, int]:
    """(time budget, kept budget) for hidden drafts; see the module docstring."""
    edge = inp.edge
    slack = upload_ms + prefill_ms - edge.draft_prefill_ms
    k_time = max(0, math.floor(slack / edge.draft_ms_per_token + _FLOOR_EPS))
    cap = min(k_time, inp.max_hidden_drafts, max(0, inp.max_new_tokens - 2))
    marginal = inp.cloud.step_ms_per_token
    value = _token_value_floor_ms(inp)
    kept = 0
    while kept < cap and inp.alpha ** (kept + 1) * value > marginal:
        kept += 1
    return k_time, kept


def _spec_decode_ms(inp: PlanInputs, hidden: int, rate: float) -> float:
    """Expected post-prefill decode time with ``hidden`` drafts, then rate ``rate``."""
    remaining = inp.max_new_tokens - 1
    if remaining <= 0:
        return 0.0
    if hidden == 0:
        return remaining / rate
    first = inp.cloud.step_ms(hidden + 1)
    left = max(0.0, remaining - expected_tokens(inp.alpha, hidden))
    return first + left / rate


def _chunk_cadence(inp: PlanInputs) -> int:
    """Draft tokens per ``Drafts`` message.

    One per token unless the per-message cost (serialisation, HTTP/2 framing,
    wake-ups) exceeds ``max_message_overhead_fraction`` of the drafting time it
    covers; never batch more than half a target step's worth of drafts, because
    the cloud picks drafts up at step boundaries and later ones would miss a step.
    RTT plays no part: batching delays every draft by the same amount either way.
    """
    d = inp.edge.draft_ms_per_token
    t1 = inp.cloud.step_ms(1)
    by_overhead = math.ceil(
        inp.per_message_overhead_ms / (inp.max_message_overhead_fraction * d) - _FLOOR_EPS
    )
    by_latency = math.floor(t1 / (2.0 * d) + _FLOOR_EPS)
    return max(1, min(by_overhead, by_latency))


def _aligned_fits(inp: PlanInputs, prefill_ms: float) -> tuple[bool, str]:
    """Aligned features fit if their upload takes no longer than the prefill or the frames."""
    uplink = inp.edge.uplink_bytes_per_s
    if inp.aligned_payload_bytes <= 0:
        return False, "aligned payload size unknown"
    if uplink <= 0:
        return False, "uplink bandwidth unknown"
    aligned_ms = _upload_ms(inp.aligned_payload_bytes, uplink)
    frames_ms = _upload_ms(inp.frames_payload_bytes, uplink)
    if aligned_ms <= prefill_ms:
        return True, f"aligned upload {aligned_ms:.1f} ms <= prefill {prefill_ms:.1f} ms"
    if inp.frames_payload_bytes > 0 and aligned_ms <= frames_ms:
        return True, f"aligned upload {aligned_ms:.1f} ms <= frames upload {frames_ms:.1f} ms"
    return False, f"aligned upload {aligned_ms:.1f} ms > prefill {prefill_ms:.1f} ms"


def plan(inputs: PlanInputs) -> TimingPlan:
    """Negotiate the timing budget; deterministic, identical on edge and cloud."""
    inp = inputs
    cloud, edge = inp.cloud, inp.edge
    prefill = cloud.prefill_ms(inp.visual_tokens, inp.text_tokens)
    payload = (
        inp.frames_payload_bytes if inp.payload_mode == "frames" else inp.aligned_payload_bytes
    )
    upload = _upload_ms(payload, edge.uplink_bytes_per_s)
    t1 = cloud.step_ms(1)
    c = edge.draft_ms_per_token / t1

    gamma, rate, best_rate = _choose_lookahead(inp)
    k_time, hidden = _hidden_budget(inp, prefill, upload)
    fixed = edge.rtt_ms + upload + prefill
    base_ms = fixed + (inp.max_new_tokens - 1) * t1
    # Decide on the best rate (monotone in RTT and draft speed by construction);
    # report the chosen lookahead's, which is at most 0.1% lower.
    best_speedup = base_ms / (fixed + _spec_decode_ms(inp, hidden, best_rate))
    speedup = base_ms / (fixed + _spec_decode_ms(inp, hidden, rate))
    fits, fits_why = _aligned_fits(inp, prefill)
    speculate = best_speedup > 1.0 + inp.min_speedup_margin

    facts = (
        f"alpha={inp.alpha:.3f}, c=t_draft/t_step={c:.2f}, prefill {prefill:.1f} ms, "
        f"step {t1:.1f} ms, rtt {edge.rtt_ms:.1f} ms, upload {upload:.1f} ms; "
        f"{fits_why}"
    )
    if not speculate:
        return TimingPlan(
            speculate=False,
            hidden_draft_budget=0,
            lookahead_tokens=0,
            chunk_cadence_tokens=1,
            aligned_fits_uplink=fits,
            acceptance_estimate=inp.alpha,
            predicted_prefill_ms=prefill,
            predicted_step_ms=t1,
            predicted_speedup=1.0,
            reason=(
                f"no speculation: predicted {best_speedup:.3f}x with {hidden} hidden drafts and "
                f"lookahead {gamma} is not above 1 + {inp.min_speedup_margin:g}; "
                f"decoding target-only ({facts})"
            ),
        )
    depth = edge_depth(inp, gamma)
    later = (
        f"lookahead {depth} (about {gamma} verified per step)"
        if gamma > 0
        else "no later-round drafts (edge too slow or alpha too low to get ahead)"
    )
    return TimingPlan(
        speculate=True,
        hidden_draft_budget=hidden,
        lookahead_tokens=depth,
        chunk_cadence_tokens=_chunk_cadence(inp),
        aligned_fits_uplink=fits,
        acceptance_estimate=inp.alpha,
        predicted_prefill_ms=prefill,
        predicted_step_ms=cloud.step_ms(gamma + 1),
        predicted_speedup=speedup,
        reason=(
            f"speculate: predicted {speedup:.3f}x over target-only; {hidden} hidden drafts "
            f"({k_time} fit before prefill ends), {later} ({facts})"
        ),
    )


def replan(
    previous_inputs: PlanInputs,
    observed_alpha: float | None,
    observed_rtt_ms: float | None,
) -> TimingPlan:
    """Re-run :func:`plan` with the observed acceptance and RTT (``None`` keeps the old)."""
    inp = previous_inputs
    if observed_alpha is not None:
        inp = dataclasses.replace(inp, alpha=observed_alpha)
    if observed_rtt_ms is not None:
        inp = dataclasses.replace(inp, edge=dataclasses.replace(inp.edge, rtt_ms=observed_rtt_ms))
    return plan(inp)
