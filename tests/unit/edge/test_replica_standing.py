"""A cloud replica's standing (issue 38): one that froze rests, is probed, and takes
requests again only after a probe answers; one that never failed is never probed."""

from __future__ import annotations

from eventspec.edge.uplink.channel import CloudLink
from eventspec.edge.uplink.standing import Phase, ProbePolicy, ReplicaStanding

POLICY = ProbePolicy(timeout_s=1.0, first_gap_s=0.5, max_gap_s=2.0, log_every_s=60.0)


def test_a_replica_that_never_failed_takes_requests_and_is_never_probed() -> None:
    s = ReplicaStanding(POLICY)
    assert s.phase(0.0) == Phase.IN_ROTATION and s.takes_requests(0.0)
    assert not s.frozen
    assert not s.probe_due(1e9, nowhere_else=True)


def test_rest_then_probing_then_in_rotation() -> None:
    s = ReplicaStanding(POLICY)
    assert s.froze(10.0, rest_s=30.0)  # it left the rotation
    assert s.phase(10.0) == Phase.RESTING and not s.takes_requests(10.0)
    assert not s.probe_due(39.9, nowhere_else=False)
    # The rest is over: probed, and still no request until a probe answers.
    assert s.phase(40.0) == Phase.PROBING and not s.takes_requests(40.0)
    assert s.probe_due(40.0, nowhere_else=False)
    s.probe_failed(40.5)
    assert s.phase(500.0) == Phase.PROBING and not s.takes_requests(500.0)
    assert s.probe_passed(501.0) == 491.0  # seconds it was out
    assert s.phase(501.0) == Phase.IN_ROTATION and s.takes_requests(501.0)
    assert not s.frozen and not s.probe_due(1e9, nowhere_else=True)


def test_failed_probes_back_off_up_to_a_bound() -> None:
    s = ReplicaStanding(POLICY)
    s.froze(0.0, rest_s=1.0)
    t, gaps = 1.0, []
    for _ in range(5):
        assert s.probe_due(t, nowhere_else=False)
        s.probe_failed(t)
        due = s.next_probe_at(nowhere_else=False)
        assert not s.probe_due(due - 0.01, nowhere_else=False)
        gaps.append(due - t)
        t = due
    assert gaps == [0.5, 1.0, 2.0, 2.0, 2.0]


def test_back_in_rotation_starts_the_backoff_afresh() -> None:
    s = ReplicaStanding(POLICY)
    s.froze(0.0, rest_s=0.0)
    for t in (0.0, 1.0, 3.0):
        s.probe_failed(t)
    s.probe_passed(5.0)
    s.froze(6.0, rest_s=0.0)
    s.probe_failed(6.0)
    assert s.next_probe_at(nowhere_else=False) == 6.5


def test_with_nowhere_else_to_send_requests_the_rest_is_skipped() -> None:
    """Every replica out: waiting out a 30 s rest would only keep the Asks waiting."""
    s = ReplicaStanding(POLICY)
    s.froze(0.0, rest_s=30.0)
    assert not s.probe_due(0.0, nowhere_else=False)
    assert s.probe_due(0.0, nowhere_else=True)
    s.probe_failed(0.1)
    assert not s.probe_due(0.5, nowhere_else=True)  # the backoff still holds
    assert s.probe_due(0.6, nowhere_else=True)


def test_freezing_again_while_out_extends_the_rest_not_the_outage() -> None:
    s = ReplicaStanding(POLICY)
    assert s.froze(0.0, rest_s=10.0)
    assert not s.froze(5.0, rest_s=10.0)  # already out: not a new outage
    assert s.phase(14.9) == Phase.RESTING and s.phase(15.0) == Phase.PROBING
    assert s.probe_passed(20.0) == 20.0


def test_a_dropped_stream_only_rests_and_is_not_probed() -> None:
    """UNAVAILABLE (connection reset, process gone) is not a freeze: the channel sees a
    dead peer itself, so the replica rests and comes back without a probe, and it may
    still be used when no other replica takes requests."""
    s = ReplicaStanding(POLICY)
    s.dropped(0.0, rest_s=5.0)
    assert s.phase(1.0) == Phase.RESTING and not s.takes_requests(1.0)
    assert not s.frozen and not s.probe_due(1.0, nowhere_else=True)
    assert s.phase(5.0) == Phase.IN_ROTATION and s.takes_requests(5.0)


def test_failed_probes_are_logged_loudly_once_a_minute() -> None:
    s = ReplicaStanding(POLICY)
    s.froze(0.0, rest_s=0.0)
    loud = [s.probe_failed(t) for t in (1.0, 2.0, 30.0, 61.0, 62.0, 122.0)]
    assert loud == [True, False, False, True, False, True]
    assert s.failed_probes == 6


async def test_the_link_never_picks_a_frozen_replica_while_another_will_do() -> None:
    """A replica resting after a dropped stream is still preferred to one that froze;
    only when every replica froze is a frozen one picked (nowhere else to go)."""
    link = CloudLink("127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
    try:
        frozen, dropped, healthy = link.replicas
        frozen.froze(60.0)
        dropped.rest(60.0)
        assert {link.pick().target for _ in range(6)} == {healthy.target}
        healthy.froze(60.0)
        assert {link.pick().target for _ in range(6)} == {dropped.target}
        dropped.froze(60.0)
        assert {link.pick().target for _ in range(6)} == {r.target for r in link.replicas}
    finally:
        await link.close()
