"""Timing model: the design-note example, monotonicity, degenerate inputs."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import pytest

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.timing import CloudCost, EdgeCost, PlanInputs, TimingPlan
from eventspec.shared.contract.timing_model import edge_depth, expected_tokens, plan, replan

# Design-note figures (A100-class, unoptimised): target prefill 568 ms, 30 ms/token;
# draft prefill 66 ms, 18.5 ms/token.
DESIGN_CLOUD = CloudCost(568.0, 0.0, 0.0, 30.0, 0.0, device="a100")
# H200 HF eager at batch 1 (REFERENCE.md): 16.7 ms for k=1, 19.5 ms for k=8.
H200_CLOUD = CloudCost(40.0, 0.015, 0.05, 16.3, 0.4, device="cuda:h200")


def _edge(d: float = 18.5, rtt: float = 0.0, prefill: float = 66.0, up: float = 0.0) -> EdgeCost:
    return EdgeCost(prefill, d, rtt, up, 0.6)


def _inputs(
    cloud: CloudCost = DESIGN_CLOUD,
    edge: EdgeCost | None = None,
    alpha: float = 0.6,
    **kw: object,
) -> PlanInputs:
    return PlanInputs(cloud, edge or _edge(), 0, 0, alpha, **kw)  # type: ignore[arg-type]


def test_design_note_example_gives_27_hidden_drafts() -> None:
    p = plan(_inputs())
    assert p.predicted_prefill_ms == 568.0
    assert p.hidden_draft_budget == 27 == math.floor((568 - 66) / 18.5)
    assert p.speculate and p.predicted_speedup > 1.0
    assert "27 hidden drafts" in p.reason


def test_upload_time_delays_prefill_end_and_unknown_uplink_counts_zero() -> None:
    edge = _edge(up=1_000_000.0)  # 1 MB/s: 185 KB of frames take 185 ms = 10 drafts
    p = plan(_inputs(edge=edge, frames_payload_bytes=185_000))
    assert p.hidden_draft_budget == 37
    aligned = plan(_inputs(edge=edge, frames_payload_bytes=185_000, payload_mode="aligned"))
    assert aligned.hidden_draft_budget == 27  # aligned bytes unknown (0) here
    assert plan(_inputs(frames_payload_bytes=185_000)).hidden_draft_budget == 27


def test_hidden_budget_caps() -> None:
    assert plan(_inputs(max_hidden_drafts=5)).hidden_draft_budget == 5
    assert plan(_inputs(max_new_tokens=10)).hidden_draft_budget == 8
    assert plan(_inputs(max_new_tokens=2)).speculate is False  # nothing left to speed up
    slow_prefill = _edge(prefill=700.0)  # edge prefill ends after the cloud's
    assert plan(_inputs(edge=slow_prefill)).hidden_draft_budget == 0


def test_hidden_drafts_trimmed_when_verify_width_costs_more_than_they_save() -> None:
    wide_is_costly = dataclasses.replace(DESIGN_CLOUD, step_base_ms=20.0, step_ms_per_token=10.0)
    p = plan(_inputs(cloud=wide_is_costly, alpha=0.5))
    assert p.hidden_draft_budget < 27


RTTS = [0.0, 1.0, 5.0, 20.0, 50.0, 100.0, 250.0, 600.0, 2000.0]
DRAFT_MS = [0.5, 1.0, 2.0, 5.0, 8.0, 12.0, 16.0, 18.5, 25.0, 30.0, 45.0, 100.0]
ALPHAS = [0.0, 0.05, 0.2, 0.45, 0.6, 0.8, 0.95, 1.0]
CLOUDS = [DESIGN_CLOUD, H200_CLOUD, CloudCost(72.0, 0.0, 0.0, 228.4, 2.4)]


@pytest.mark.parametrize("cloud", CLOUDS, ids=lambda c: c.device or "loaded")
@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("d", [2.0, 10.0, 18.5])
def test_more_rtt_never_adds_hidden_drafts_or_speedup(
    cloud: CloudCost, alpha: float, d: float
) -> None:
    plans = [
        plan(PlanInputs(cloud, _edge(d=d, rtt=r, prefill=30.0), 2056, 40, alpha)) for r in RTTS
    ]
    for a, b in itertools.pairwise(plans):
        assert b.hidden_draft_budget <= a.hidden_draft_budget
        assert b.predicted_speedup <= a.predicted_speedup * (1 + 2e-3)
        assert b.speculate <= a.speculate


@pytest.mark.parametrize("cloud", CLOUDS, ids=lambda c: c.device or "loaded")
@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("rtt", [0.0, 20.0, 150.0])
def test_slower_drafting_never_adds_hidden_drafts_or_speedup(
    cloud: CloudCost, alpha: float, rtt: float
) -> None:
    plans = [
        plan(PlanInputs(cloud, _edge(d=d, rtt=rtt, prefill=30.0), 2056, 40, alpha))
        for d in DRAFT_MS
    ]
    for a, b in itertools.pairwise(plans):
        assert b.hidden_draft_budget <= a.hidden_draft_budget
        assert b.predicted_speedup <= a.predicted_speedup * (1 + 2e-3)
        assert b.speculate <= a.speculate


@pytest.mark.parametrize("cloud", CLOUDS, ids=lambda c: c.device or "loaded")
@pytest.mark.parametrize("alpha", [0.0, 1e-9, 1e-4, 0.005])
def test_alpha_near_zero_means_no_speculation(cloud: CloudCost, alpha: float) -> None:
    p = plan(PlanInputs(cloud, _edge(d=1.0, prefill=30.0), 2056, 40, alpha))
    assert not p.speculate
    assert (p.hidden_draft_budget, p.lookahead_tokens, p.predicted_speedup) == (0, 0, 1.0)
    assert p.reason.startswith("no speculation")


@pytest.mark.parametrize("ratio", [1.0, 1.2, 2.0, 5.0])
@pytest.mark.parametrize("alpha", [0.3, 0.5, 0.7])
def test_edge_not_faster_than_cloud_step_means_no_later_round_drafts(
    ratio: float, alpha: float
) -> None:
    cloud = CloudCost(100.0, 0.0, 0.0, 20.0, 0.5)
    t1 = cloud.step_ms(1)
    p = plan(PlanInputs(cloud, _edge(d=ratio * t1, prefill=10.0), 0, 0, alpha))
    assert p.lookahead_tokens == 0
    if p.speculate:
        assert p.hidden_draft_budget > 0  # only the hidden drafts can pay
        assert "no later-round drafts" in p.reason


def test_fast_edge_gets_lookahead_and_real_speedup() -> None:
    p = plan(PlanInputs(H200_CLOUD, _edge(d=4.0, rtt=2.0, prefill=30.0), 2056, 40, 0.7))
    assert p.speculate and p.lookahead_tokens >= 2
    assert p.predicted_speedup > 1.3
    # The step verifies about gamma drafts; the edge drafts further ahead (the round trip).
    gamma = next(g for g in range(p.lookahead_tokens + 1)
                 if H200_CLOUD.step_ms(g + 1) == p.predicted_step_ms)
    assert 1 <= gamma < p.lookahead_tokens
    assert p.lookahead_tokens == edge_depth(
        PlanInputs(H200_CLOUD, _edge(d=4.0, rtt=2.0, prefill=30.0), 2056, 40, 0.7), gamma)


#: The H200's calibrated costs in ``benchmarks/results/e2e-h200-b.json``.
E2E_H200 = CloudCost(prefill_base_ms=0.0, prefill_ms_per_visual_token=0.025058,
                     prefill_ms_per_text_token=0.023930, step_base_ms=4.834,
                     step_ms_per_token=0.01117, step_ms_per_session=0.22867)


@pytest.mark.parametrize("rtt", [1.0, 20.0, 70.0])
@pytest.mark.parametrize("load", [1.0, 16.0, 64.0])
def test_the_edge_drafts_ahead_by_what_the_round_trip_hides(rtt: float, load: float) -> None:
    """With depth = lookahead alone the H200 run got 1.00 tokens per step at N = 1 and
    RTT 1 ms: each draft landed after its step had begun. The depth now covers the
    tokens the cloud commits while a commit travels to the edge and a draft comes
    back, and the reference model (``tests/support/spec_model.py``) agrees it is no worse."""
    from tests.support.spec_model import SpecInputs, cloud_step_cost, simulate

    cloud = dataclasses.replace(E2E_H200, load_sessions=load)
    inp = PlanInputs(cloud, _edge(d=3.39, rtt=rtt, prefill=45.0), 2056, 40, 0.8,
                     max_new_tokens=128)
    p = plan(inp)
    assert p.speculate and p.lookahead_tokens > 0  # a 3.39 ms drafter pays at every point
    gamma = next(g for g in range(p.lookahead_tokens + 1)
                 if cloud.step_ms(g + 1) == p.predicted_step_ms)
    assert p.lookahead_tokens > gamma  # a draft's round trip is never free

    def model(depth: int) -> float:
        return simulate(SpecInputs(
            cloud_prefill_ms=cloud.prefill_ms(2056, 40), step_cost=cloud_step_cost(cloud),
            edge_prefill_ms=45.0, draft_ms=3.39, rtt_ms=rtt, alpha=0.8, tokens=128,
            depth=depth, width=depth, batch=int(load)), trials=48).speedup

    assert model(p.lookahead_tokens) >= model(gamma) * 0.995


def test_flat_step_cost_does_not_draft_far_ahead_for_nothing() -> None:
    flat = CloudCost(500.0, 0.0, 0.0, 20.0, 0.0)
    p = plan(PlanInputs(flat, _edge(d=1.0, prefill=30.0), 0, 0, 0.2))
    assert 1 <= p.lookahead_tokens <= 6


def test_chunk_cadence() -> None:
    assert plan(_inputs()).chunk_cadence_tokens == 1  # 18.5 ms drafts: one per message
    fast = plan(PlanInputs(H200_CLOUD, _edge(d=0.5, prefill=30.0), 2056, 40, 0.7))
    assert fast.chunk_cadence_tokens == 10  # 0.25 ms per message <= 5% of 10 drafts
    capped = plan(
        PlanInputs(
            H200_CLOUD, _edge(d=0.5, prefill=30.0), 2056, 40, 0.7, per_message_overhead_ms=5.0
        )
    )
    assert capped.chunk_cadence_tokens == 16  # never more than half a step of drafts


def test_aligned_fits_uplink() -> None:
    edge = _edge(up=10e6)  # 10 MB/s
    fits = plan(_inputs(edge=edge, aligned_payload_bytes=2_100_000))  # 210 ms < 568 ms
    assert fits.aligned_fits_uplink
    slow = _edge(up=1e6)
    assert not plan(_inputs(edge=slow, aligned_payload_bytes=2_100_000)).aligned_fits_uplink
    vs_frames = plan(
        _inputs(edge=slow, aligned_payload_bytes=2_100_000, frames_payload_bytes=4_000_000)
    )
    assert vs_frames.aligned_fits_uplink  # slower than prefill, faster than frames
    unknown = plan(_inputs(aligned_payload_bytes=2_100_000))
    assert not unknown.aligned_fits_uplink and "uplink bandwidth unknown" in unknown.reason


def test_plan_mirrors_proto_fields() -> None:
    inp = PlanInputs(H200_CLOUD, _edge(d=6.0, rtt=12.0, prefill=30.0), 2056, 40, 0.55)
    first = plan(inp)
    assert [f.name for f in dataclasses.fields(TimingPlan)] == [
        "speculate",
        "hidden_draft_budget",
        "lookahead_tokens",
        "chunk_cadence_tokens",
        "aligned_fits_uplink",
        "acceptance_estimate",
        "predicted_prefill_ms",
        "predicted_step_ms",
        "predicted_speedup",
        "reason",
        "max_new_tokens",
    ]
    from eventspec.shared.pb.eventspec.v1 import common_pb2

    assert [f.name for f in common_pb2.Plan.DESCRIPTOR.fields] == [
        f.name for f in dataclasses.fields(TimingPlan)]
    assert first.acceptance_estimate == 0.55
    assert first.max_new_tokens == 0  # only the cloud's Plan states the clamped cap


def test_replan_uses_observations() -> None:
    inp = PlanInputs(H200_CLOUD, _edge(d=4.0, rtt=2.0, prefill=30.0), 2056, 40, 0.7)
    assert replan(inp, None, None) == plan(inp)
    assert not replan(inp, 0.0, None).speculate
    slower = replan(inp, None, 500.0)
    assert slower.predicted_speedup < plan(inp).predicted_speedup
    assert "rtt 500.0 ms" in slower.reason


def test_expected_tokens_formula() -> None:
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


# ---------------------------------------------------------------- degenerate inputs


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
@pytest.mark.parametrize(
    "field",
    ["prefill_base_ms", "prefill_ms_per_visual_token", "step_base_ms", "step_ms_per_token"],
)
def test_cloud_cost_rejects_bad_numbers(field: str, bad: float) -> None:
    changes: dict[str, Any] = {field: bad}
    with pytest.raises(InvalidInput, match=f"CloudCost.{field}"):
        dataclasses.replace(H200_CLOUD, **changes)


def test_zero_step_and_prefill_rejected() -> None:
    with pytest.raises(InvalidInput, match=r"step_base_ms \+ CloudCost\.step_ms_per_token"):
        CloudCost(10.0, 0.0, 0.0, 0.0, 0.0)
    zero_prefill = CloudCost(0.0, 0.0, 0.0, 10.0, 0.0)
    with pytest.raises(InvalidInput, match="prefill_base_ms: predicted prefill is 0 ms"):
        PlanInputs(zero_prefill, _edge(), 0, 0, 0.5)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, 0.0])
@pytest.mark.parametrize("field", ["draft_prefill_ms", "draft_ms_per_token"])
def test_edge_cost_rejects_bad_or_zero_times(field: str, bad: float) -> None:
    with pytest.raises(InvalidInput, match=f"EdgeCost.{field}"):
        dataclasses.replace(_edge(), **{field: bad})


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("rtt_ms", -1.0),
        ("rtt_ms", float("nan")),
        ("uplink_bytes_per_s", float("inf")),
        ("acceptance_prior", 1.5),
    ],
)
def test_edge_link_fields_validated(field: str, bad: float) -> None:
    with pytest.raises(InvalidInput, match=f"EdgeCost.{field}"):
        dataclasses.replace(_edge(), **{field: bad})


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("alpha", float("nan")),
        ("alpha", -0.1),
        ("alpha", 1.01),
        ("visual_tokens", -1),
        ("max_new_tokens", 0),
        ("max_lookahead", -1),
        ("frames_payload_bytes", 1.5),
        ("payload_mode", "jpeg"),
        ("min_speedup_margin", float("inf")),
    ],
)
def test_plan_inputs_validated(field: str, bad: object) -> None:
    changes: dict[str, Any] = {field: bad}
    with pytest.raises(InvalidInput, match=f"PlanInputs.{field}"):
        dataclasses.replace(_inputs(), **changes)


@pytest.mark.parametrize("max_lookahead", [1, 4, 32])
@pytest.mark.parametrize("rtt", [1.0, 70.0, 500.0])
def test_the_depth_never_passes_the_cloud_s_cap(max_lookahead: int, rtt: float) -> None:
    """A tail longer than the cloud's drafts cap is refused (INVALID_ARGUMENT); the
    verify cap less one is within it (``--max-verify-tokens`` <= drafts cap + 1)."""
    inp = PlanInputs(E2E_H200, _edge(d=0.5, rtt=rtt, prefill=45.0), 2056, 40, 0.9,
                     max_new_tokens=512, max_lookahead=max_lookahead)
    p = plan(inp)
    assert p.lookahead_tokens <= max_lookahead
