"""The reliability table (issue 38's closing figures, ``benchmarks/bench_reliability.py``):
one row per measurement with its verdict, cells that cannot break the table, and the
tally; and the committed run's records have the shape the table reads."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.tools import load_tool

ROOT = Path(__file__).resolve().parents[2]
render = load_tool("render_results")
KEYS = {"item", "what", "figure", "expect", "met", "raw"}


def test_each_record_is_a_row_with_its_verdict_and_the_tally_closes_it() -> None:
    checks = [
        {"item": 6, "what": "status into a closed pipe (| head)", "figure": "exit 141",
         "expect": "exit 141", "met": True, "raw": {}},
        {"item": 3, "what": "edge serve: missing --model", "figure": "exit 1 in 4.9 s: "
         "no checkpoint at <path>", "expect": "exit 2 in < 1 s", "met": False, "raw": {}},
        {"item": 1, "what": "damaged AEDAT4", "figure": "skipped: no data", "expect": "—",
         "met": None, "raw": {}},
    ]
    lines = render.KINDS["reliability"]([("run", {"checks": checks, "met": 1, "measured": 2,
                                                  "skipped": 1})])
    assert lines[0].startswith("| item | what | measured |")
    assert len(lines) == 2 + len(checks) + 1
    # A pipe in a cell is escaped, a tag-like path is not swallowed as HTML.
    assert "closed pipe (\\| head)" in lines[2] and lines[2].endswith("| met |")
    assert "&lt;path&gt;" in lines[3] and "&lt; 1 s" in lines[3]
    assert lines[3].endswith("| **missed** |") and lines[4].endswith("| skipped |")
    assert "1 of 2 met, 1 skipped" in lines[-1]
    assert all(ln.count(" | ") == 4 for ln in lines[2:]), lines  # five cells each


def test_the_committed_run_has_a_record_for_every_item() -> None:
    result = json.loads((ROOT / "benchmarks" / "results" / "reliability-cpu.json").read_text())
    assert {c["item"] for c in result["checks"]} == set(range(1, 8))
    for c in result["checks"]:
        assert set(c) == KEYS and c["met"] in (True, False, None), c
    measured = [c["met"] for c in result["checks"] if c["met"] is not None]
    assert (result["met"], result["measured"]) == (sum(measured), len(measured))
