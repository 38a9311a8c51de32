"""The edge's readiness (eventspec.edge.readiness): one answer for health, GetStatus and waiting
Asks, with a distinct error for each way of not being ready."""

from __future__ import annotations

import pytest

from eventspec.edge.readiness import CloudState, CloudView, Readiness
from eventspec.shared.contract.errors import ErrorCode, WarmingUp


async def test_health_follows_the_edge_then_its_cloud() -> None:
    heard: list[bool] = []
    r = Readiness(needs_cloud=True, on_change=heard.append)
    assert not r.serving and r.not_serving_reason().startswith("the edge agent is warming up")
    r.set_edge_phase(None)
    assert r.not_serving_reason() == "waiting for the cloud verifier: connecting"
    r.set_cloud(CloudView(CloudState.WARMING_UP, "calibrating, round 2 of 3"))
    assert r.not_serving_reason() == "waiting for the cloud verifier: calibrating, round 2 of 3"
    r.set_cloud(CloudView(CloudState.READY))
    assert r.serving and r.not_serving_reason() == ""
    r.set_cloud(CloudView(CloudState.READY))  # no change, no news
    r.set_cloud(CloudView(CloudState.UNREACHABLE, "UNAVAILABLE"))
    assert heard == [False, False, True, False]


async def test_an_edge_without_a_cloud_serves_once_warm() -> None:
    r = Readiness(needs_cloud=False)
    r.set_edge_phase(None)
    assert r.serving
    assert r.waiting(needs_cloud=True) is not None  # a cloud mode would still wait


@pytest.mark.parametrize(("view", "code", "words"), [
    (CloudView(CloudState.WARMING_UP, "calibrating, round 3 of 3"), ErrorCode.UNAVAILABLE,
     "cloud verifier: still warming up (calibrating, round 3 of 3) after waiting 2.0 s"),
    (CloudView(CloudState.UNREACHABLE, "UNAVAILABLE"), ErrorCode.UNAVAILABLE,
     "cloud verifier: unreachable: UNAVAILABLE after waiting 2.0 s"),
])
async def test_a_wait_that_runs_out_says_why(view: CloudView, code: ErrorCode, words: str
                                             ) -> None:
    r = Readiness(needs_cloud=True)
    r.set_edge_phase(None)
    r.set_cloud(view)
    err = r.timeout_error(needs_cloud=True, waited_s=2.0)
    assert err.code == code and words in err.message, err.message
    assert isinstance(err, WarmingUp) == (view.state == CloudState.WARMING_UP)


async def test_a_cloud_that_is_not_a_verifier_is_refused_without_waiting() -> None:
    r = Readiness(needs_cloud=True)
    r.set_edge_phase(None)
    r.set_cloud(CloudView(CloudState.NOT_A_VERIFIER))
    err = r.refusal(needs_cloud=True)
    assert err is not None and err.code == ErrorCode.FAILED_PRECONDITION
    assert r.refusal(needs_cloud=False) is None
