"""The KV-layout simulation (benchmarks/bench_kv_arena.py) runs and keeps its order:
a layout that never fragments admits at least what first fit does, and with one answer
cap KV by length holds more sessions than fixed slots of the server's longest request."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import bench_kv_arena


def test_the_simulation_reports_each_mix_and_layout(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    assert bench_kv_arena.main(["--requests", "300", "--mixes", "128", "32,512",
                                "--out", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["caps"], r["layout"].split()[0]) for r in runs] == [
        ([128], "by-length"), ([128], "slots"), ([128], "never"),
        ([32, 512], "by-length"), ([32, 512], "slots"), ([32, 512], "never")]
    assert all(r["served"] == 300 for r in runs)
    one_cap, slots, bound = runs[:3]
    assert one_cap["mean_sessions_holding_kv"] > slots["mean_sessions_holding_kv"]
    for first_fit, ideal in ((runs[0], runs[2]), (runs[3], runs[5])):
        assert ideal["mean_sessions_holding_kv"] >= first_fit["mean_sessions_holding_kv"]
    assert bound["head_blocked_by_fragmentation"] == 0
