"""The cloud's per-request metrics probe counts a tree's nodes as draft tokens received,
as it counts a chain's tokens (before, trees showed 0 in
``eventspec:draft_tokens_received_total``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from eventspec.cloud.metrics import CloudMetrics, RequestProbe
from eventspec.shared.contract.types import ROOT, DraftNode, DraftTail


def test_chains_and_trees_both_count_their_drafts() -> None:
    registry = CollectorRegistry()
    probe = RequestProbe(CloudMetrics(registry), "edge")
    probe.on_drafts(DraftTail(0, (5, 6)))
    probe.on_drafts(DraftTail(0, (), nodes=(DraftNode(0, ROOT, 5), DraftNode(1, 0, 6),
                                            DraftNode(2, 0, 7))))
    assert registry.get_sample_value("eventspec:draft_tokens_received_total") == 5
    assert registry.get_sample_value("eventspec:drafts_received_total") == 2
