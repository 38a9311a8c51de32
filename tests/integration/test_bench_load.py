"""The load benchmark at one tiny point on CPU: open-loop arrivals through the real
server, whole vs chunked prefill vs prefix reuse. Checks what it writes, never speed."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from benchmarks import bench_load


def test_the_load_benchmark_reports_every_config_and_identical_answers(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    code = bench_load.main([
        "--rates", "20", "--requests", "4", "--answer-tokens", "6", "--clips", "2",
        "--questions-per-clip", "2", "--configs", "whole:off:0", "reuse:8:0.05:apart",
        "--out", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["answers_identical_across_configs"] is True
    whole, reuse = result["configs"]
    assert whole["config"] == {"name": "whole", "prefill_chunk": "off", "prefix_cache_gb": 0.0,
                               "mixed_steps": True, "graphed": True, "gc_freeze": True,
                               "towers_ahead": True}
    assert reuse["config"]["mixed_steps"] is False
    for run in (whole, reuse):
        (level,) = run["levels"]
        assert level["requests"] == 4 and level["goodput_tok_s"] > 0
        assert level["ttft_ms_p50"] <= level["ttft_ms_p99"]
        assert level["ttft_growth"] is None or level["ttft_growth"] > 0
        assert level["itl_ms_p50"] <= level["itl_ms_p99"]
        assert level["engine_step_ms"] <= level["in_server_step_ms"]
        assert len(level["gc_passes_by_generation"]) == 3
        assert level["gc_pause_ms_max"] <= level["gc_pause_ms_total"]
        assert "answers" not in level
        # Whole prompts, or pieces in calls of their own ("apart"): no step carries one.
        kinds = level["step_kinds"]
        assert set(kinds["kinds"]) <= {"after_prefill", "plain"} and kinds["kinds"]
        assert kinds["gap_ms"]["n"] == sum(k["gap_ms"]["n"] for k in kinds["kinds"].values())
        assert set(run["capacity_at_slo_per_s"]) == {"6"}
    assert whole["levels"][0]["prefix_hits"] == 0  # the cache is off
    # Two clips, two questions each, round-robin: the second round can hit.
    assert reuse["levels"][0]["prefix_hits"] + reuse["levels"][0]["prefix_misses"] == 4
    assert reuse["levels"][0]["prefix_misses"] >= 2
    # Chunks per prompt: none without chunking; with 8-token chunks a ~150-token toy
    # prompt takes several (unless it arrived with nothing decoding: then whole).
    assert whole["levels"][0]["chunks_per_prefill"] == 0
    assert reuse["levels"][0]["chunks_per_prefill"] >= 1


@pytest.mark.parametrize("ttft, growth", [
    ([100.0, 100.0, 300.0, 300.0], 3.0),  # a queue building: the later half waits longer
    ([120.0, 80.0, 100.0, 100.0], 1.0),  # steady
    ([100.0, 200.0, 300.0], 2.5),  # odd: the later half holds the middle request
    ([50.0], None), ([], None), ([0.0, 10.0], None)])
def test_ttft_growth_compares_the_later_half_with_the_earlier(
        ttft: list[float], growth: float | None) -> None:
    assert bench_load.ttft_growth(ttft) == (None if growth is None else pytest.approx(growth))


def test_a_config_names_how_its_chunks_run() -> None:
    parse = bench_load.Config.parse
    assert parse("m:512:0") == bench_load.Config("m", "512", 0.0, True, True, True)
    assert parse("m:512:0:apart") == bench_load.Config("m", "512", 0.0, False, True, True)
    assert parse("m:512:0:eager") == bench_load.Config("m", "512", 0.0, True, False, True)
    assert parse("m:512:0:eager:thaw") == bench_load.Config("m", "512", 0.0, True, False, False)
    assert parse("m:512:0:inline") == bench_load.Config("m", "512", 0.0, True, True, True,
                                                        towers_ahead=False)
    assert parse("m:512:0").towers_ahead
    # slack's R after PREFILL_CHUNK: two numbers are R and the GiB, one is the GiB.
    assert parse("s:slack:0") == bench_load.Config("s", "slack", 0.0, True, True, True)
    assert parse("s:slack:1.25:0.5") == bench_load.Config("s", "slack:1.25", 0.5,
                                                          True, True, True)
    assert parse("s:slack:1.5:0:eager") == bench_load.Config("s", "slack:1.5", 0.0,
                                                             True, False, True)
    assert parse("s:slack:0:eager") == bench_load.Config("s", "slack", 0.0, True, False, True)
    # Three numbers: R, the pace and the GiB.
    assert parse("p:slack:2:200:0") == bench_load.Config("p", "slack:2:200", 0.0,
                                                         True, True, True)
    assert parse("p:slack:2:0:1:inline") == bench_load.Config("p", "slack:2:0", 1.0, True,
                                                              True, True, towers_ahead=False)
    options = re.escape("apart, eager, inline, thaw")
    for bad in ("m:512:0:fast", "m:512:0:thaw:thaw", "s:slack:1:0", "m:lots:0",
                "p:slack:2:-5:0", "p:slack:2:200:1:0"):
        with pytest.raises(argparse.ArgumentTypeError, match=options):
            parse(bad)
