"""The end-to-end benchmark's arguments: ``--alphas`` entries and how requests are
spread over clients (pure logic; the harness itself runs in
tests/integration/test_bench_e2e.py)."""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import e2e_nodes, e2e_pool
from benchmarks.bench_e2e import main, per_client, split
from benchmarks.bench_e2e import parser as main_parser
from benchmarks.e2e_nodes import Drafter, cloud_args, edge_args
from benchmarks.e2e_pool import question_pool, scenes_needed
from benchmarks.e2e_report import table
from eventspec.shared.client.edge_client import AskError


def test_an_alpha_entry_takes_the_default_pace_or_its_own() -> None:
    assert Drafter.parse("0.8", 4.12) == Drafter(0.8, 4.12)
    assert Drafter.parse("0@56.6", 4.12) == Drafter(0.0, 56.6)
    assert Drafter.parse("0@56.6", 4.12).name == "0@56.6"


@pytest.mark.parametrize("text", ["x", "0.8@", "1.5", "-0.1", "0.5@-1", "0.5@fast"])
def test_a_bad_alpha_entry_is_refused_with_its_text(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="--alphas"):
        Drafter.parse(text, 5.0)


def test_main_refuses_bad_entries_and_a_capacity_alpha_it_never_runs(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--alphas", "0.5@x"]) == 2
    assert "--alphas" in capsys.readouterr().err
    assert main(["--alphas", "0.5", "--capacity-tokens", "16", "--capacity-alpha", "0.8"]) == 2
    assert "--capacity-alpha 0.8" in capsys.readouterr().err


@given(requests=st.integers(1, 5), point=st.integers(0, 40), n=st.integers(1, 64))
def test_every_point_asks_at_least_its_requests(requests: int, point: int, n: int) -> None:
    args = argparse.Namespace(requests=requests, point_requests=point)
    k = per_client(args, n)
    assert k >= requests and n * k >= point
    assert k == requests or n * (k - 1) < point  # no more than needed


def test_clients_get_disjoint_questions_of_the_pool() -> None:
    pool = question_pool(12)
    parts = split(pool, 4, 3)
    assert [len(p) for p in parts] == [3, 3, 3, 3]
    texts = [q.text for p in parts for q in p]
    assert len(set(texts)) == 12


def test_a_real_drafter_edge_gets_no_oracle_flags() -> None:
    args = argparse.Namespace(scenes=4, edge_model="toy-misaligned", speculation="auto",
                              edge_args=["--draft-head", "/models/head"],
                              oracle_ms_per_token=2.0, oracle_prefill_ms=20.0, seed=0)
    real = edge_args(args, "127.0.0.1:1", Path("a.json"), Drafter(0.0, 2.0, real=True),
                     Path("p.msgpack"))
    assert not [a for a in real if a.startswith("--oracle") or a == "--draft-engine"]
    assert real[-2:] == ["--draft-head", "/models/head"] and "toy-misaligned" in real
    oracle = edge_args(args, "127.0.0.1:1", Path("a.json"), Drafter(0.8, 2.0),
                       Path("p.msgpack"))
    assert oracle[oracle.index("--draft-engine") + 1] == "oracle"
    assert oracle[oracle.index("--oracle-alpha") + 1] == "0.8"
    assert Drafter(0.0, 2.0, real=True).name == "real"


@given(n=st.integers(1, 300), scenes=st.integers(1, 16))
@settings(max_examples=30, deadline=None)
def test_the_edges_source_covers_every_question_of_the_pool(n: int, scenes: int) -> None:
    """A 64-client GPU run's pool spans more toy scenes than the default 8; an edge
    whose source is shorter answers INVALID_ARGUMENT (clip outside the source)."""
    pool = question_pool(n)
    need = scenes_needed(pool, scenes)
    assert need >= scenes
    assert all(q.scene < need for q in pool)


async def test_a_node_started_in_a_reused_logs_folder_reports_its_own_port(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--logs DIR`` reused: the last run's ``cloud.port`` must not be read as this
    run's (the harness then waited 300 s on a dead port)."""
    (tmp_path / "cloud.port").write_text("1")

    def fake_node(node: str, args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        port_file = args[args.index("--port-file") + 1]
        code = ("import time, sys; time.sleep(0.2); open(sys.argv[1], 'w').write('12345');"
                " time.sleep(60)")
        return subprocess.Popen([sys.executable, "-c", code, port_file])

    async def serving(address: str, timeout_s: float) -> None:
        return None

    monkeypatch.setattr(e2e_nodes, "start_node", fake_node)
    monkeypatch.setattr(e2e_nodes, "wait_for_serving", serving)
    nodes = e2e_nodes.Nodes(tmp_path, [])
    try:
        assert await nodes.start("eventspec-cloud", "cloud", []) == "127.0.0.1:12345"
    finally:
        nodes.stop()


def test_the_cloud_accepts_the_capacity_phase_s_longest_answer() -> None:
    """``--capacity-tokens 128 512`` with ``--max-new-tokens 128``: a cloud capped at
    128 refused the 512-token answers (INVALID_ARGUMENT) before anything was measured."""
    args = main_parser().parse_args(["--max-new-tokens", "128", "--capacity-tokens", "128",
                                     "512"])
    out = cloud_args(args, 64)
    assert out[out.index("--max-new-tokens") + 1] == "512"
    assert out[out.index("--max-sessions") + 1] == "66"


class _RefusingEdge:
    """An EdgeClient stand-in whose every Ask fails with ``code``."""

    def __init__(self, code: grpc.StatusCode) -> None:
        self.code = code

    def __call__(self, address: str, timeout_s: float) -> _RefusingEdge:
        return self

    async def __aenter__(self) -> _RefusingEdge:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def ask_final(self, spec: object) -> None:
        raise AskError(self.code, "feature mode aligned needs a feature adapter")


async def test_an_uplink_mode_the_edge_refuses_is_a_row_not_the_end_of_the_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU run's edges (tiny-random, no adapter) refuse aligned features with
    FAILED_PRECONDITION; that ended the whole run after its last latency point."""
    monkeypatch.setattr(e2e_pool, "EdgeClient", _RefusingEdge(grpc.StatusCode.FAILED_PRECONDITION))
    rows = await e2e_pool.uplink_rows("127.0.0.1:1", question_pool(1)[0], 8, 10.0)
    assert [r["requested"] for r in rows] == ["frames", "aligned", "auto"]
    assert all("adapter" in r["error"] for r in rows)
    assert "refused" in table({"points": [], "uplink": rows, "draft_engine": "oracle"})
    monkeypatch.setattr(e2e_pool, "EdgeClient", _RefusingEdge(grpc.StatusCode.UNAVAILABLE))
    with pytest.raises(AskError):
        await e2e_pool.uplink_rows("127.0.0.1:1", question_pool(1)[0], 8, 10.0)


@given(repeats=st.integers(1, 9))
def test_a_requests_rounds_start_with_its_coin_and_alternate(repeats: int) -> None:
    """``--pair-repeats``: both modes lead equally often (one more for the coin's mode
    when the rounds are odd), so a drift during the pair weighs on both."""
    for q in question_pool(6):
        orders = e2e_pool.pair_orders(q.text, repeats)
        assert len(orders) == repeats and orders[0] == e2e_pool.speculative_first(q.text)
        assert all(a != b for a, b in itertools.pairwise(orders))
        assert abs(sum(orders) - repeats / 2) <= 0.5


def test_a_requests_row_compares_the_median_of_each_modes_rounds() -> None:
    from eventspec.shared.contract.types import (
        FinalEvent,
        FinishReason,
        Mode,
        RequestStats,
    )

    def final(ids: tuple[int, ...]) -> FinalEvent:
        return FinalEvent(answer="", token_ids=ids, mode=Mode.SPECULATIVE, feature_mode=None,
                          finish_reason=FinishReason.MAX_TOKENS, plan=None, window=None,
                          stats=RequestStats(drafted=4, accepted=3, target_steps=5))

    spec = [(final((1, 2)), 100.0), (final((1, 2)), 80.0), (final((1, 2)), 300.0)]
    base = [(final((1, 2)), 120.0), (final((1, 2)), 90.0), (final((1, 2)), 110.0)]
    row = e2e_pool.pair_row("q", spec, base)
    assert (row["spec_ms"], row["target_ms"]) == (100.0, 110.0)
    assert row["speedup"] == 1.1 and row["same_across_runs"]
    assert row["spec_ms_runs"] == [100.0, 80.0, 300.0] and row["drafted"] == 4
    assert not e2e_pool.pair_row("q", [(final((1, 3)), 1.0)], base)["same_across_runs"]


def test_main_refuses_zero_pair_repeats(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--pair-repeats", "0"]) == 2
    assert "--pair-repeats" in capsys.readouterr().err
