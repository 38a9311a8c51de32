"""The merged timeline never shows a cloud event before its cause (issue 38, item 7).

A target-only request has no Drafts, so the offset came from the Commits alone, less
half the smoothed RTT: with the RTT overstated (142 ms read on loopback) the cloud's
queue and prefill were drawn before the edge had sent its Open. The Open is now a
bound of its own: the cloud cannot see a request before it was sent. The cloud's clock
here is skewed by an arbitrary amount from the edge's; a one-way trip takes 1 ms.
"""

from __future__ import annotations

import pytest

from eventspec.shared.contract.timeline import Timeline, TimelineEvent, merge

ONE_WAY_MS = 1.0


def target_only(skew_ms: float) -> tuple[Timeline, Timeline]:
    """Edge and cloud logs of one request; cloud time = edge time - ``skew_ms``."""
    def cloud(edge_ms: float) -> float:
        return edge_ms - skew_ms

    edge = [TimelineEvent("edge.uplink", 0.0, 3.0)]
    clouds = [TimelineEvent("cloud.queue", cloud(ONE_WAY_MS), cloud(2.0)),
              TimelineEvent("cloud.prefill", cloud(2.0), cloud(52.0))]
    for i in range(4):
        sent = 52.0 + 10.0 * i
        clouds.append(TimelineEvent("cloud.commit", cloud(sent), cloud(sent)))
        edge.append(TimelineEvent("edge.commit", sent + ONE_WAY_MS, sent + ONE_WAY_MS,
                                  peer_ms=cloud(sent)))
    return Timeline(tuple(edge)), Timeline(tuple(clouds))


@pytest.mark.parametrize("skew_ms", [-5_000.0, 0.0, 3.7, 86_400_000.0])
@pytest.mark.parametrize("rtt_ms", [0.0, 2.0, 142.0, 308.0])
def test_no_cloud_event_precedes_the_open_or_follows_its_arrival(skew_ms: float,
                                                                 rtt_ms: float) -> None:
    edge, cloud = target_only(skew_ms)
    t = merge(edge, cloud, rtt_ms)
    opened = t.lane("edge.uplink")[0].start_ms
    for e in t.events:
        if e.lane.startswith("cloud."):
            assert e.start_ms >= opened - 1e-9, (e, t.cloud_offset_ms, t.clock_sync)
    sent = [e.start_ms for e in t.lane("cloud.commit")]
    arrived = [e.start_ms for e in t.lane("edge.commit")]
    assert all(s <= a + 1e-9 for s, a in zip(sent, arrived, strict=True))
