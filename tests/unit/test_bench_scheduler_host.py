"""``benchmarks/bench_scheduler_host.py``: the engine loop over an engine that costs
nothing runs every session to its end and splits each step's time."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.bench_scheduler_host import main


def test_the_null_engine_run_splits_the_steps_time(tmp_path: Path) -> None:
    out = tmp_path / "host.json"
    assert main(["--sessions", "1", "4", "--steps", "6", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["sessions"] for r in rows] == [1, 4]
    for r in rows:
        assert r["steps"] >= 6  # every session decoded its tokens (one step per token)
        parts = r["overhead_ms"] + r["sampler_ms"] + r["engine_ms"]
        assert 0 < parts <= r["iteration_ms"] * 1.5
