"""The load benchmark's plot draws from a committed results file (matplotlib is a test
dependency; without it ``plot`` says so instead of failing)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.load_report import kinds_line, main, plot

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_the_gpu_load_run_plots(tmp_path: Path) -> None:
    result = json.loads((RESULTS / "load-h200-chunk512.json").read_text())
    out = tmp_path / "load.png"
    message = plot(result, out)
    assert message == f"wrote {out}" or message.startswith("no plot")
    if out.exists():
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_names_its_one_argument() -> None:
    assert main([]) == 2


def test_a_levels_step_kinds_fit_one_line() -> None:
    gaps = {"n": 8, "mean": 14.0, "p50": 12.0, "p90": 12.0, "p99": 29.0}
    kind = {"steps": 2, "wall_ms": gaps, "device_ms": gaps | {"p50": None}, "gap_ms": gaps,
            "gaps_in_tail": 1}
    line = kinds_line({"gap_ms": gaps, "tail_from_ms": 28.5, "kinds": {"tower": kind}})
    assert line == ("step gaps p50/p99 12.0/29.0 ms, tail from 28.5 ms: tower 2 steps, "
                    "gap p50/p99 12.0/29.0, device p50 –, 1 in tail")
    assert kinds_line({"gap_ms": {"n": 0}, "kinds": {}}) == "no step gaps recorded"
