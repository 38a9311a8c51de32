"""The load benchmark's plot draws from a committed results file (matplotlib is a test
dependency; without it ``plot`` says so instead of failing)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.load_report import main, plot

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
