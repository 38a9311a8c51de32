"""deploy/grafana's dashboard is built on metrics the nodes really export (offline check).

Every panel query names ``eventspec:`` series; each one must be a sample name that the
cloud's or the edge's registry produces (a counter's ``_total``, a histogram's
``_bucket`` / ``_sum`` / ``_count``, a gauge), so a renamed metric breaks this test
rather than a dashboard in production. The metrics reference (docs/reference/metrics.md)
must list the same metrics the registries hold.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

from eventspec.cloud.metrics import CloudMetrics
from eventspec.edge.metrics import EdgeMetrics, _LiveSourceCollector

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "eventspec-dashboard.json"
SERIES = re.compile(r"eventspec:[a-z0-9_]+")


def _families() -> dict[str, set[str]]:
    """Family name -> its sample names, from both nodes' registries (a live source too)."""
    edge = EdgeMetrics()
    stats = SimpleNamespace(received=1, dropped=0, buffered=1)
    source = SimpleNamespace(buffer=SimpleNamespace(stats=lambda: stats), finished=False,
                             health=lambda: None)
    edge.registry.register(_LiveSourceCollector(source))
    out: dict[str, set[str]] = {}
    for registry in (CloudMetrics().registry, edge.registry):
        for family in registry.collect():
            names = out.setdefault(family.name, set())
            if family.type == "counter":
                names.add(family.name + "_total")
            elif family.type == "histogram":
                names.update(family.name + s for s in ("_bucket", "_sum", "_count"))
            else:
                names.add(family.name)
    return out


def test_every_query_names_an_exported_series() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = set().union(*_families().values())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(queries) >= 20
    named = {m for q in queries for m in SERIES.findall(q)}
    assert named, "no eventspec: series in the dashboard"
    assert named - exported == set(), "dashboard names series no node exports"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_the_dashboard_shows_the_operator_questions() -> None:
    """Acceptance per edge and per position, KV slots, queue time, slow edges."""
    text = DASHBOARD.read_text()
    for series in ("spec_decode_num_accepted_tokens_per_pos_total", "accepted_tokens_by_edge_total",
                   "kv_slots_used", "request_queue_time_seconds_bucket",
                   "request_seconds_by_edge_total"):
        assert f"eventspec:{series}" in text, series


def test_the_metrics_page_lists_every_metric() -> None:
    """Counters as ``NAME_total``, histograms and gauges by their names."""
    page = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    listed = set(re.findall(r"^\| `(eventspec:[a-z0-9_]+)` \|", page, flags=re.M))
    names = {n for n, samples in _families().items() for n in
             ([n + "_total"] if n + "_total" in samples else [n])}
    assert names - listed == set(), "metrics missing from docs/reference/metrics.md"
    assert listed - names == set(), "docs/reference/metrics.md lists metrics no node exports"
