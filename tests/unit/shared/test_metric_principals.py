"""``--metrics-principals``: how /metrics' per-edge label shows a caller (issue 38)."""

from __future__ import annotations

import hashlib

import pytest

from eventspec.shared.contract.principal import ANONYMOUS_PRINCIPAL, Principal
from eventspec.shared.node.metric_principals import PRINCIPAL_LABELS, principal_label

EDGE_A = Principal("edge-a", "token")
CERT = Principal("edge-cam0.example.internal", "certificate")


def _sha12(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:12]


@pytest.mark.parametrize(("principal", "policy", "label"), [
    (EDGE_A, "name", "edge-a"),
    (EDGE_A, "hash", _sha12("edge-a")),
    (EDGE_A, "none", "redacted"),
    (CERT, "hash", _sha12("edge-cam0.example.internal")),
    (CERT, "none", "redacted"),
    # A token that happens to be named "anonymous" is a name like any other...
    (Principal("anonymous", "token"), "hash", _sha12("anonymous")),
])
def test_the_label_under_each_policy(principal: Principal, policy: str, label: str) -> None:
    assert principal_label(principal, policy) == label


@pytest.mark.parametrize("policy", PRINCIPAL_LABELS)
def test_an_unauthenticated_caller_stays_anonymous(policy: str) -> None:
    """... while no authentication names no one, so it is shown as it is."""
    assert principal_label(ANONYMOUS_PRINCIPAL, policy) == "anonymous"

