"""The end-to-end benchmark's arguments: ``--alphas`` entries and how requests are
spread over clients (pure logic; the harness itself runs in
tests/integration/test_bench_e2e.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.bench_e2e import main, per_client, split
from benchmarks.e2e_nodes import Drafter, edge_args
from benchmarks.e2e_pool import question_pool


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
