"""The reference model of ideal speculation (``tests/support/spec_model.py``) on closed cases.

- α = 0 gives no gain: one token per step, target-only's latency (and a low α with a
  verify cost is slower: the model says when speculation does not pay);
- a free edge (c -> 0), α = 1 and RTT -> 0 commit k + 1 tokens per step at width k;
- the hidden drafts are exactly those that fit between the edge's prefill and the end of
  the cloud's, whatever the RTT (the one-way delays cancel);
- monotone in α, RTT and draft cost; deterministic per seed;
- the six anchor points of issue 26. The model gives, at depth 24 and width 4, 256
  trials, seed 0 (the issue's numbers in brackets):

  - 5.5 ms step, 3 ms drafts: 1.263 (1.27) at RTT 1 ms, 1.052 (1.06) at 20, 1.021 (1.02) at 70;
  - 22 ms step, 5 ms drafts: 1.976 (1.89) at RTT 1 ms, 1.600 (1.59) at 20, 1.251 (1.24) at 70.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.shared.contract.timing import CloudCost
from tests.support.spec_model import (
    ANCHOR_CLOUD_PREFILL_MS,
    ANCHOR_EDGE_PREFILL_MS,
    LinearStepCost,
    SpecInputs,
    best_depth_width,
    cloud_step_cost,
    main,
    simulate,
    target_only_ms,
)


def anchor_inputs(step_ms: float, draft_ms: float, rtt_ms: float, **kw: object) -> SpecInputs:
    fields: dict[str, object] = {
        "cloud_prefill_ms": ANCHOR_CLOUD_PREFILL_MS,
        "step_cost": LinearStepCost(step_ms),
        "edge_prefill_ms": ANCHOR_EDGE_PREFILL_MS,
        "draft_ms": draft_ms,
        "rtt_ms": rtt_ms,
        "alpha": 0.8,
        "tokens": 128,
        "depth": 24,
        "width": 4,
    }
    fields.update(kw)
    return SpecInputs(**fields)  # type: ignore[arg-type]


ANCHORS = [
    (5.5, 3.0, 1.0, 1.27),
    (5.5, 3.0, 20.0, 1.06),
    (5.5, 3.0, 70.0, 1.02),
    (22.0, 5.0, 1.0, 1.89),
    (22.0, 5.0, 20.0, 1.59),
    (22.0, 5.0, 70.0, 1.24),
]


@pytest.mark.parametrize(("step_ms", "draft_ms", "rtt_ms", "issue"), ANCHORS)
def test_the_issues_anchor_points(
    step_ms: float, draft_ms: float, rtt_ms: float, issue: float
) -> None:
    res = simulate(anchor_inputs(step_ms, draft_ms, rtt_ms), trials=256, seed=0)
    assert res.speedup == pytest.approx(issue, rel=0.05)
    assert res.target_ms == pytest.approx(rtt_ms + 54.4 + 127 * step_ms)


@pytest.mark.parametrize("per_token", [0.0, 0.3])
@pytest.mark.parametrize(("step_ms", "draft_ms", "rtt_ms"), [(5.5, 0.5, 1.0), (22.0, 5.0, 20.0)])
def test_alpha_zero_gives_no_gain(
    per_token: float, step_ms: float, draft_ms: float, rtt_ms: float
) -> None:
    inp = anchor_inputs(step_ms, draft_ms, rtt_ms, alpha=0.0,
                        step_cost=LinearStepCost(step_ms, per_token))
    res = simulate(inp, trials=16)
    assert res.accepted == 0 and res.hidden_accepted == 0
    assert res.tokens_per_step == 1.0
    # Each chain's first draft is for the position after the last commit the edge heard
    # of, which the never-waiting cloud has committed since: at α = 0 every tail is
    # stale on arrival, nothing is verified, and the answer takes target-only's time.
    assert res.verified == 0
    assert res.spec_ms == pytest.approx(res.target_ms, rel=1e-12)
    assert res.speedup <= 1.0 + 1e-12


def test_low_alpha_with_a_verify_cost_does_not_pay() -> None:
    inp = anchor_inputs(5.5, 0.5, 1.0, alpha=0.1, step_cost=LinearStepCost(5.5, 2.0))
    res = simulate(inp, trials=32)
    assert res.verified > 0 and res.speedup < 1.0


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_free_edge_perfect_drafts_no_network_commit_k_plus_1_per_step(k: int) -> None:
    # The depth counts from the last commit the edge has heard of, which lags the cloud
    # by one step even at RTT 0: 2k + 1 keeps k drafts ahead of every step.
    m = 60
    inp = SpecInputs(
        cloud_prefill_ms=50.0, step_cost=LinearStepCost(10.0), edge_prefill_ms=50.0,
        draft_ms=1e-4, rtt_ms=0.0, alpha=1.0, tokens=2 + m * (k + 1), depth=2 * k + 1,
        width=k,
    )
    res = simulate(inp, trials=2)
    # The first step comes before any draft (no hidden drafts: equal prefills); every
    # later one verifies k drafts and commits them plus the bonus.
    assert res.steps == 1 + m
    assert res.tokens_per_step == pytest.approx((k + 1) * m / (m + 1) + 1 / (m + 1))
    assert res.acceptance == 1.0
    decode_speedup = (inp.tokens - 1) / res.steps
    assert decode_speedup > (k + 1) * 0.98


@settings(max_examples=40, deadline=None)
@given(
    cloud_prefill=st.integers(0, 120),
    edge_prefill=st.integers(0, 120),
    draft=st.integers(1, 12),
    upload=st.integers(0, 30),
    rtt=st.sampled_from([0.0, 1.0, 20.0, 70.0]),
    alpha=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
)
def test_hidden_drafts_are_what_fits_before_the_prefill_ends(
    cloud_prefill: int, edge_prefill: int, draft: int, upload: int, rtt: float, alpha: float
) -> None:
    tokens = 64
    inp = SpecInputs(
        cloud_prefill_ms=float(cloud_prefill), step_cost=LinearStepCost(8.0),
        edge_prefill_ms=float(edge_prefill), draft_ms=float(draft), rtt_ms=rtt, alpha=alpha,
        tokens=tokens, upload_ms=float(upload),
    )
    res = simulate(inp, trials=8)
    bound = max(0, math.floor((cloud_prefill + upload - edge_prefill) / draft))
    # Integer ms make the bound exact; the edge never drafts past the answer's length.
    assert res.hidden_drafted == min(bound, tokens)
    assert 0 <= res.hidden_accepted <= res.hidden_drafted
    if alpha == 1.0:
        assert res.hidden_accepted == res.hidden_drafted


def test_hidden_drafts_do_not_depend_on_rtt() -> None:
    results = [simulate(anchor_inputs(22.0, 5.0, rtt), trials=32) for rtt in (0.0, 20.0, 200.0)]
    assert {r.hidden_drafted for r in results} == {5.0}  # floor((54.4 - 25.6) / 5)
    assert len({r.hidden_accepted for r in results}) == 1


SETTINGS = st.fixed_dictionaries({
    "step_ms": st.sampled_from([5.5, 10.0, 22.0]),
    "draft_ms": st.sampled_from([0.5, 2.0, 5.0, 9.0]),
    "rtt_ms": st.sampled_from([0.0, 1.0, 20.0, 70.0]),
    "alpha": st.sampled_from([0.0, 0.3, 0.6, 0.8, 0.95]),
    "tokens": st.sampled_from([8, 48]),
    "depth": st.integers(1, 16),
    "width": st.integers(1, 8),
})


def _inputs(s: dict[str, float]) -> SpecInputs:
    return anchor_inputs(s["step_ms"], s["draft_ms"], s["rtt_ms"], alpha=s["alpha"],
                         tokens=int(s["tokens"]), depth=int(s["depth"]), width=int(s["width"]))


# Monotone in expectation; a finite sample of an event-driven timeline can break it by
# a hair (a slower edge whose drafts happen to land just before a step), hence the slack.
SLACK = 0.01


@settings(max_examples=25, deadline=None)
@given(s=SETTINGS, more=st.sampled_from([0.05, 0.2]))
def test_speedup_does_not_fall_as_alpha_rises(s: dict[str, float], more: float) -> None:
    inp = _inputs(s)
    lo = simulate(inp, trials=24).speedup
    hi = simulate(replace(inp, alpha=min(1.0, inp.alpha + more)), trials=24).speedup
    assert hi >= lo * (1 - SLACK)


@settings(max_examples=25, deadline=None)
@given(s=SETTINGS, more=st.sampled_from([2.0, 30.0]))
def test_speedup_does_not_rise_with_rtt(s: dict[str, float], more: float) -> None:
    inp = _inputs(s)
    near = simulate(inp, trials=24).speedup
    far = simulate(replace(inp, rtt_ms=inp.rtt_ms + more), trials=24).speedup
    assert far <= near * (1 + SLACK)


@settings(max_examples=25, deadline=None)
@given(s=SETTINGS, factor=st.sampled_from([1.2, 3.0]))
def test_speedup_does_not_rise_with_draft_cost(s: dict[str, float], factor: float) -> None:
    inp = _inputs(s)
    fast = simulate(inp, trials=24).speedup
    slow = simulate(replace(inp, draft_ms=inp.draft_ms * factor), trials=24).speedup
    assert slow <= fast * (1 + SLACK)


def test_a_free_step_cost_never_makes_speculation_slower() -> None:
    # Every step commits at least one token at the plain step's cost.
    for rtt in (0.0, 70.0):
        for alpha in (0.0, 0.4, 1.0):
            res = simulate(anchor_inputs(5.5, 9.0, rtt, alpha=alpha), trials=16)
            assert res.spec_ms <= res.target_ms * (1 + 1e-12)
            assert res.speedup_p10 <= res.speedup_p50


def test_deterministic_per_seed() -> None:
    inp = anchor_inputs(22.0, 5.0, 20.0)
    assert simulate(inp, trials=32, seed=7) == simulate(inp, trials=32, seed=7)
    assert simulate(inp, trials=32, seed=7).spec_ms != simulate(inp, trials=32, seed=8).spec_ms


def test_target_only_same_transport_terms() -> None:
    inp = anchor_inputs(22.0, 5.0, 20.0, upload_ms=3.0)
    assert target_only_ms(inp) == pytest.approx(20.0 + 3.0 + 54.4 + 127 * 22.0)
    off = simulate(replace(inp, speculate=False), trials=4)
    assert off.spec_ms == pytest.approx(off.target_ms) and off.drafted == 0


def test_cloud_cost_adapter_is_the_contracts_step() -> None:
    cloud = CloudCost(prefill_base_ms=50.0, prefill_ms_per_visual_token=0.0,
                      prefill_ms_per_text_token=0.0, step_base_ms=20.0,
                      step_ms_per_token=0.02, step_ms_per_session=0.01, load_sessions=64)
    cost = cloud_step_cost(cloud)
    for drafts in (0, 3, 8):
        assert cost(64, drafts) == pytest.approx(cloud.step_ms(drafts + 1))
    assert LinearStepCost(20.0, 0.5, 0.1)(11, 3) == pytest.approx(20.0 + 1.0 + 2.0)


def test_best_depth_width_is_the_best_on_its_grid() -> None:
    inp = anchor_inputs(22.0, 5.0, 20.0)
    grid_d, grid_w = (0, 2, 8, 16), (0, 1, 4)
    best = best_depth_width(inp, depths=grid_d, widths=grid_w, trials=32, seed=3)
    assert best.width <= best.depth and best.speedup > 1.3
    for d in grid_d:
        for w in grid_w:
            if w <= d:
                res = simulate(replace(inp, depth=d, width=w), trials=32, seed=3)
                assert best.spec_ms <= res.spec_ms + 1e-9
    # Where drafts are never right and cost something to verify, it drafts nothing.
    bad = replace(inp, alpha=0.0, step_cost=LinearStepCost(22.0, 0.5))
    none = best_depth_width(bad, depths=grid_d, widths=grid_w, trials=8)
    assert (none.depth, none.width) == (0, 0)
    assert none.speedup == pytest.approx(1.0)


def test_a_few_hundred_trials_take_well_under_a_second() -> None:
    start = time.process_time()
    simulate(anchor_inputs(5.5, 0.5, 1.0, depth=32, width=16), trials=300)
    assert time.process_time() - start < 5.0  # typically ~0.2 s; slack for a busy box


def test_cli_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--step-ms", "22", "--draft-ms", "5", "--rtt-ms", "1", "20", "--alpha", "0.8",
            "--tokens", "128", "--depth", "24", "--width", "4", "--trials", "32", "--json"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["rtt_ms"] for r in rows] == [1.0, 20.0]
    assert rows[0]["speedup"] > rows[1]["speedup"] > 1.0
    assert main(["--step-ms", "22", "--draft-ms", "5", "--depth", "3"]) == 2


def test_inputs_are_checked() -> None:
    with pytest.raises(ValueError, match="alpha"):
        anchor_inputs(22.0, 5.0, 20.0, alpha=1.5)
    with pytest.raises(ValueError, match="draft_ms"):
        anchor_inputs(22.0, 0.0, 20.0)
    with pytest.raises(ValueError, match="step_cost"):
        anchor_inputs(22.0, 5.0, 20.0, step_cost=LinearStepCost(0.0))
