"""The results pages are their JSON: tables re-rendered unchanged, quoted figures true.

``docs/results/*.md`` hold hand-written prose around tables that
``tools/render_results.py`` renders from ``benchmarks/results/*.json``. Like the stub
drift check, re-rendering must change nothing: a JSON re-measured, renamed or removed
without ``make results`` fails here. Figures the prose quotes are checked against the
same JSON below, with the claims they carry (answers identical, bitwise equal, a goal
met), so a re-run that changes them fails until the text follows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.tools import load_tool

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
render = load_tool("render_results")


def _json(name: str) -> Any:
    return json.loads((RESULTS / name).read_text())


def _page(name: str) -> str:
    return (ROOT / "docs" / "results" / name).read_text()


def test_the_pages_are_what_their_json_renders_to() -> None:
    stale = render.stale()
    assert stale == [], "\n".join(diff for _, diff in stale) + "\nrun make results"


def test_every_page_has_a_rendered_table_and_no_block_is_empty() -> None:
    for page in (ROOT / "docs" / "results").glob("*.md"):
        if page.name == "index.md":
            continue
        bodies = [m.group("body") for m in render.BLOCK.finditer(page.read_text())]
        assert bodies, f"{page.name} renders no table"
        assert all(b.startswith("| ") and "Data: `benchmarks/results/" in b for b in bodies)


def test_a_recorded_stamp_is_shown_and_a_missing_one_says_so() -> None:
    line = render.provenance("x.json", {"device": "NVIDIA H100", "stamp": {
        "commit": "0123abc", "date": "2026-11-28"}, "command": "python -m benchmarks.x"})
    assert line == ("Data: `benchmarks/results/x.json` · device NVIDIA H100 · commit 0123abc "
                    "· date 2026-11-28 · command `python -m benchmarks.x`")
    assert "commit not recorded" in render.provenance("y.json", {})
    dirty = render.provenance("z.json", {"device": "cuda", "stamp": {
        "commit": "0123456789abcdef0123", "dirty": True, "device": "NVIDIA H200"}})
    assert "device NVIDIA H200 · commit 0123456789ab (with uncommitted changes)" in dirty
    old = render.provenance("w.json", {"command": "python -m benchmarks.w", "stamp": {
        "commit": "abcdef0123456789", "command": "unknown", "backfilled": "from git history"}})
    assert "commit abcdef012345 (backfilled: the commit that added the file" in old
    assert "command `python -m benchmarks.w`" in old  # the stamp's "unknown" is no record


def test_an_unknown_kind_or_a_missing_file_stops_the_renderer() -> None:
    with pytest.raises(SystemExit, match="unknown results kind"):
        render.render_block("no-such-kind engine_h200.json")
    with pytest.raises(SystemExit, match="does not exist"):
        render.render_block("engine-steps no-such-run.json")


def test_the_engine_figures_are_the_json() -> None:
    result = _json("engine_h200.json")
    page = _page("engine-gpu.md")
    assert f"{result['prefill_ms']:.1f} ms" in page
    assert f"{result['hf_eager']['hf_step_k0_ms']:.1f} ms (k = 0)" in page
    assert f"{result['warm_up']['seconds']:.1f} s" in page


def test_the_token_adapter_command_is_the_json() -> None:
    assert _json("token-adapter-toy.json")["command"] in _page("token-adapter.md")


@pytest.mark.parametrize("name", ["capacity-cpu.json", "capacity-cpu-paced50-20.json",
                                  "capacity-cpu-static.json"])
def test_the_cpu_capacity_answers_were_identical(name: str) -> None:
    assert _json(name)["answers_identical"] is True
    assert "Answers were identical across all rows of each run." in _page("cpu.md")


def test_the_cpu_load_answers_were_identical() -> None:
    assert _json("load-cpu.json")["answers_identical_across_configs"] is True
    assert "Answers were identical across the\nthree configurations" in _page("cpu.md")


def test_the_e2e_rehearsal_commands_are_the_json() -> None:
    page = _page("cpu.md").replace("\\\n    ", "")
    assert _json("e2e-cpu-capacity.json")["command"] in page
    assert _json("e2e-cpu-rehearsal.json")["command"] in page


def test_the_h100_kv_figures_are_the_json() -> None:
    page = _page("capacity-gpu.md")
    for name in ("capacity-h100-by-length-t128-gil5ms.json",
                 "capacity-h100-by-length-t128.json"):
        result = _json(name)
        assert result["kv_layout"] == "by-length"
        assert f"an arena of {result['kv_arena_positions']:,} positions" in page


def test_the_real_drafters_answered_identically() -> None:
    for f in ("raw-misaligned", "token-adapter", "draft-head", "aligned"):
        run = _json(f"e2e-cpu-drafter-{f}.json")
        assert run["identical"] and run["drafter"] == "real", f
    assert "Answers were identical, speculative vs target-only, in every request." in \
        _page("token-adapter.md")


def test_the_batch_invariant_claims_are_the_json() -> None:
    gemm = _json("invariant-kernels-h200.json")
    assert all(all(v.values()) for v in gemm["gemm"]["row_invariant"].values())
    agreement = _json("batch-invariance-h200-invariant.json")
    assert all(v == 1.0 for k, v in agreement.items() if k.endswith("_bitwise"))
    cost = _json("batch-invariant-cost-h200.json")
    inv = cost["invariant"]["invariance"]
    assert all(v == 1.0 for k, v in inv.items() if k.endswith("_bitwise"))
    for shape in _json("invariant-cross-tiles-h200.json")["cross_gemm"]["shapes"].values():
        built = [c for c in shape["configs"].values() if "error" not in c]
        assert built and all(c["equal_to_table"] for c in built)
    capacity = _json("capacity-cuda-full-size-random-static-t128-invariant.json")
    assert capacity["batch_invariant"] and capacity["answers_identical"]
    assert capacity["answers_agreeing_with_target_only_N1"] == 1.0
    rates = {(lv["mode"], lv["concurrency"]): lv["tokens_per_s"] for lv in capacity["levels"]}
    quoted = " / ".join(f"{rates[('target_only', n)]}" for n in (1, 16, 64))
    assert f"{quoted} tokens/s" in _page("engine-gpu.md")


def test_the_graphed_capacity_goal_is_the_json() -> None:
    capacity = _json("load-h100-graphed-capacity.json")
    by_name = {c["config"]["name"]: c["capacity_at_slo_per_s"]["128"]
               for c in capacity["configs"]}
    assert by_name["whole"] == 0.0 and by_name["mixed512"] == 8.0
    assert "**Goal ≥ 1.5×: met**" in _page("load-gpu.md")


def test_the_h200_reuse_hit_is_the_json() -> None:
    assert _json("prefill-h200.json")["device"] == "NVIDIA H200"
    reuse = _json("load-h200-reuse-graphed.json")
    hit = next(lv for c in reuse["configs"] if c["config"]["name"] == "reuse"
               for lv in c["levels"] if lv["rate_per_s"] == 1.0)["ttft_ms_p50_hit"]
    assert f"{hit:.1f} ms at 1 request/s" in _page("load-gpu.md")


def test_the_gc_freeze_figures_are_the_json() -> None:
    by = {c["config"]["name"]: c for c in _json("gc-freeze-cpu.json")["configs"]}
    assert by["frozen"]["config"]["gc_freeze"] and not by["thawed"]["config"]["gc_freeze"]
    page = _page("load-gpu.md")
    assert f"took {by['thawed']['full_gc_pass_ms']:.0f} ms over" in page
    assert f"it took {by['frozen']['full_gc_pass_ms']:.1f} ms over" in page


def test_the_default_reuse_figures_are_the_json() -> None:
    run = _json("load-h100-reuse-default.json")
    hits = {lv["rate_per_s"]: lv["ttft_ms_p50_hit"] for lv in run["configs"][0]["levels"]}
    assert f"{hits[1.0]:.1f} ms at 1/s and {hits[4.0]:.1f} ms at 4/s" in _page("load-gpu.md")


def test_the_toy_eval_figures_are_the_json() -> None:
    result = _json("toy-eval-draft-quant-cpu.json")
    page = _page("toy-world.md")
    quants = result["by_draft_quant"]
    assert len({json.dumps(q, sort_keys=True) for q in quants.values()}) == 1  # alike
    q = quants["none"]
    assert f"{q['accepted']} of {q['drafted']} drafts accepted in each" in page
    assert f"Acceptance {q['acceptance_rate']:.3f}" in page
    assert f"mean accepted length of {q['mean_accepted_length']:.2f}" in page
    assert f"averaged {result['adapter_cos_mean']:.3f}" in page
    assert f"({result['questions']} questions on {result['scenes']} held-out" in \
        page.replace("\n", " ")
