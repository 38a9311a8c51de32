"""README.md stays true: its commands parse, its flags exist, its tables match the JSON.

What this checks, cheaply (no server is started):

- every Python block parses as a file (no top-level ``async with``), and the client
  snippet is the one ``docs/first-hour.md`` has, which
  ``tests/integration/test_cli_first_hour.py`` runs against a live toy edge;
- every ``eventspec`` / ``eventspec-cloud`` / ``eventspec-edge`` command in an ``sh`` block
  parses with that command's real argparse parser;
- every ``--flag`` the README names belongs to one of the user's commands, a benchmark
  script or the health probe;
- the ``--source`` table lists every kind ``edge/events/sources.py`` accepts;
- the H200 engine table is ``benchmarks/results/engine_h200.json`` formatted as
  ``bench_engine.py --table`` does, and the CPU capacity rows are the capacity JSONs;
- the pasted demo run is self-consistent (speedup = ratio of the medians);
- relative links and their anchors exist, and every ``make`` target named exists.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import pytest

from tests.support.tools import load_tool

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
flag_docs = load_tool("flag_docs")


def _blocks(text: str, lang: str | None = None) -> list[str]:
    """Fenced code blocks (``lang`` None: every block)."""
    found = re.findall(r"^```([a-z]*)\n(.*?)^```", text, flags=re.M | re.S)
    return [body for tag, body in found if lang is None or tag == lang]


def _commands(text: str) -> list[list[str]]:
    """Command lines in ``sh`` code blocks (continuations joined, comments and env
    prefixes dropped) that start with one of the user's commands."""
    out = []
    for body in _blocks(text, "sh"):
        for line in body.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue
            while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
                words = words[1:]
            if words and words[-1] == "&":
                words = words[:-1]
            if words and words[0] in ("eventspec", "eventspec-cloud", "eventspec-edge"):
                out.append(words)
    return out


@pytest.fixture(autouse=True)
def _no_eventspec_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in [n for n in os.environ if n.startswith("EVENTSPEC_")]:
        monkeypatch.delenv(name)


def test_python_blocks_run_as_files() -> None:
    blocks = _blocks(README, "python")
    assert blocks
    for body in blocks:
        ast.parse(body)  # a top-level ``async with`` / ``await`` is a SyntaxError


def test_the_client_snippet_is_the_one_a_test_runs() -> None:
    docs = (ROOT / "docs" / "first-hour.md").read_text()
    assert _blocks(README, "python")[0] == _blocks(docs, "python")[0]


def test_every_command_parses_with_its_parser() -> None:
    parsers = flag_docs.commands()
    commands = _commands(README)
    assert len(commands) >= 6
    for words in commands:
        n = 3 if words[1:2] == ["toy"] else 2
        name = " ".join(words[:n])
        assert name in parsers, f"README runs an unknown command: {' '.join(words)}"
        parsers[name]().parse_args(words[n:])  # SystemExit(2) on an unknown flag


def _known_flags() -> set[str]:
    known = {"--help"}
    for build in flag_docs.commands().values():
        for action in flag_docs.flags(build()):
            known.update(action.option_strings)
    scripts = [*ROOT.glob("benchmarks/*.py"), ROOT / "deploy/docker/grpc_health_probe.py"]
    for path in scripts:
        known.update(re.findall(r"[\"'](--[a-z0-9][a-z0-9-]*)[\"']", path.read_text()))
    return known


def test_every_flag_named_exists() -> None:
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", README))
    unknown = sorted(named - _known_flags())
    assert unknown == [], f"README names flags no command has: {unknown}"


def test_the_source_table_lists_every_kind() -> None:
    tree = ast.parse((ROOT / "edge" / "events" / "sources.py").read_text())
    kinds: list[str] = ["toy", "synthetic"]
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and (
                node.targets[0].id in ("FILE_KINDS", "LIVE_KINDS")):
            kinds += list(ast.literal_eval(node.value))
    section = README.split("## Input formats", 1)[1].split("\n## ", 1)[0]
    first_cells = re.findall(r"^\| (.*?) \|", section, flags=re.M)
    for kind in kinds:
        spelled = re.compile(rf"`{re.escape(kind)}[:`\[]")
        assert any(spelled.search(cell) for cell in first_cells), f"--source {kind} missing"
    # toy:A-B is half-open, as parse_toy_spec says.
    assert "half-open" in section and "A..B-1" in section


def test_the_engine_table_is_the_json() -> None:
    result = json.loads((ROOT / "benchmarks/results/engine_h200.json").read_text())
    replay = result["replay_only_ms"]
    rows = []
    for s in result["steps"]:
        alone = replay["B{}_q{}".format(s["B"], s["k"] + 1)]
        rows.append(f"| {s['B']} | {s['k']} | {s['ms']:.2f} | {alone:.2f} "
                    f"| {s['floor_ms']:.2f} | {s['ratio']:.2f} |")
    assert "\n".join(rows) in README
    assert f"{result['prefill_ms']:.1f} ms" in README
    assert f"{result['hf_eager']['hf_step_k0_ms']:.1f} ms (k = 0)" in README
    assert f"{result['warm_up']['seconds']:.1f} s" in README


def test_the_token_adapter_table_is_the_json() -> None:
    from benchmarks.bench_token_adapter import readme_rows

    result = json.loads((ROOT / "benchmarks/results/token-adapter-toy.json").read_text())
    assert "\n".join(readme_rows(result)) in README
    assert result["command"] in README


@pytest.mark.parametrize("name, label", [
    ("capacity-cpu.json", "HF reference"),
    ("capacity-cpu-paced50-20.json", "paced 50 ms / 20 ms per step"),
])
def test_the_cpu_capacity_rows_are_the_json(name: str, label: str) -> None:
    result = json.loads((ROOT / "benchmarks/results" / name).read_text())
    assert result["answers_identical"] is True
    ratios = result["throughput_vs_one_at_a_time"]
    for mode, text in (("target_only", "target-only"),
                       ("oracle_edge_alpha0.8_k4", "oracle edge α 0.8")):
        levels = {lv["concurrency"]: lv for lv in result["levels"] if lv["mode"] == mode}
        cells = [f"{levels[n]['tokens_per_s']:.1f} ({ratios[f'{mode}@{n}']:.2f}×)"
                 for n in (1, 4, 16)]
        top = levels[16]
        row = (f"| {label} | {text} | {' | '.join(cells)} | "
               f"{top['latency_p50_s']:.3f} / {top['latency_p99_s']:.3f} |")
        assert row in README, row


def test_the_demo_run_is_consistent() -> None:
    block = next(b for b in _blocks(README) if "speedup (ratio of medians)" in b)
    spec = float(re.search(r"^  speculative\s+([\d.]+) ms", block, re.M).group(1))  # type: ignore[union-attr]
    base = float(re.search(r"^  target-only\s+([\d.]+) ms", block, re.M).group(1))  # type: ignore[union-attr]
    speedup = float(re.search(r"ratio of medians\)\s+([\d.]+)x", block).group(1))  # type: ignore[union-attr]
    assert abs(base / spec - speedup) < 0.006
    assert "identical token ids: True" in block
    assert f"from {base} ms to {spec} ms" in README.replace("\n", " ")


def _slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_links_and_anchors_exist() -> None:
    for target in re.findall(r"\]\(([^)\s]+)\)", README):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else ROOT / "README.md"
        assert file.exists(), target
        if anchor:
            headings = re.findall(r"^#+ (.*)$", file.read_text(), flags=re.M)
            assert anchor in {_slug(h) for h in headings}, target


def test_make_targets_named_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, flags=re.M))
    for target in set(re.findall(r"`make ([a-z-]+)", README)):
        assert target in targets, f"make {target}"


def test_the_load_table_is_the_json() -> None:
    from benchmarks.bench_load import readme_rows

    result = json.loads((ROOT / "benchmarks/results/load-cpu.json").read_text())
    assert "\n".join(readme_rows(result)) in README
    assert result["answers_identical_across_configs"] is True
    for name in ("load-h200-causal.json", "load-h200-t512.json"):
        gpu = json.loads((ROOT / "benchmarks/results" / name).read_text())
        assert "\n".join(readme_rows(gpu)) in README
    for name in ("load-h200-reuse-fast.json", "load-h100-reuse.json", "load-h100-mixed.json"):
        fast = json.loads((ROOT / "benchmarks/results" / name).read_text())
        assert "\n".join(f"  {row}" for row in readme_rows(fast)) in README, name


def test_the_h100_capacity_tables_are_the_json() -> None:
    from benchmarks.bench_capacity import server_gap_rows

    for name in ("capacity-h100-by-length-t128-gil5ms.json",
                 "capacity-h100-by-length-t128.json"):
        result = json.loads((ROOT / "benchmarks/results" / name).read_text())
        assert "\n".join(server_gap_rows(result)) in README, name
        assert result["kv_layout"] == "by-length"
        assert f"an arena of {result['kv_arena_positions']:,} positions" in README


def test_the_drafter_table_is_the_json() -> None:
    from benchmarks.e2e_report import drafter_rows

    names = [("raw misaligned", "raw-misaligned"), ("token adapter", "token-adapter"),
             ("draft head", "draft-head"), ("aligned pair", "aligned")]
    runs = [(name, json.loads((ROOT / f"benchmarks/results/e2e-cpu-drafter-{f}.json")
                              .read_text())) for name, f in names]
    assert "\n".join(drafter_rows(runs)) in README
    assert all(r["identical"] and r["drafter"] == "real" for _, r in runs)


def test_the_e2e_capacity_table_is_the_json() -> None:
    from benchmarks.e2e_capacity import capacity_table

    result = json.loads((ROOT / "benchmarks/results/e2e-cpu-capacity.json").read_text())
    assert capacity_table(result["capacity"]) in README
    assert result["command"] in README.replace("\\\n    ", "")


def test_the_batch_invariant_gemm_table_is_the_json() -> None:
    from benchmarks.bench_invariant_kernels import readme_rows

    result = json.loads((ROOT / "benchmarks/results/invariant-kernels-h200.json").read_text())
    assert "\n".join(readme_rows(result)) in README
    assert all(all(v.values()) for v in result["gemm"]["row_invariant"].values())
    agreement = json.loads((ROOT / "benchmarks/results/batch-invariance-h200-invariant.json")
                           .read_text())
    assert all(v == 1.0 for k, v in agreement.items() if k.endswith("_bitwise"))


def test_the_batch_invariant_cost_table_and_claims_are_the_json() -> None:
    from benchmarks.bench_invariant_cost import table

    cost = json.loads((ROOT / "benchmarks/results/batch-invariant-cost-h200.json").read_text())
    assert table(cost) in README
    inv = cost["invariant"]["invariance"]
    assert all(v == 1.0 for k, v in inv.items() if k.endswith("_bitwise"))
    cross = json.loads((ROOT / "benchmarks/results/invariant-cross-tiles-h200.json")
                       .read_text())
    for shape in cross["cross_gemm"]["shapes"].values():
        built = [c for c in shape["configs"].values() if "error" not in c]
        assert built and all(c["equal_to_table"] for c in built)
    capacity = json.loads((ROOT / "benchmarks/results/"
                           "capacity-cuda-full-size-random-static-t128-invariant.json")
                          .read_text())
    assert capacity["batch_invariant"] and capacity["answers_identical"]
    assert capacity["answers_agreeing_with_target_only_N1"] == 1.0
    rates = {(lv["mode"], lv["concurrency"]): lv["tokens_per_s"] for lv in capacity["levels"]}
    assert "150.9 / 637.8 / 743.5 tokens/s" in README
    assert [rates[("target_only", n)] for n in (1, 16, 64)] == [150.9, 637.8, 743.5]


def test_the_uplink_rows_are_the_json() -> None:
    result = json.loads((ROOT / "benchmarks/results/e2e-h200-uplink.json").read_text())
    shown = [result["uplink"][i] for i in (0, 1, 2, 4, 5, 7)]  # the README's six rows
    for u in shown:
        cells = (f"| {u['rate_mbit']:g} Mbit/s | {u['requested']} | "
                 + ("frames" if u["feature_mode"] == "frames" else
                    "fp16 features" if u["uplink_bytes"] > 3e6 else "int8 features")
                 + f" | {u['uplink_bytes']:,} | {u['ttft_ms']:,.0f} | "
                 f"{u['wire_ms_at_rate']:,.0f} | ")
        sample = u["estimate_sample_mbit"]
        cells += f"{sample:.1f} Mbit/s |" if sample is not None else "– |"
        assert cells in README, cells


def test_the_gpu_e2e_tables_are_the_json() -> None:
    from benchmarks.e2e_capacity import capacity_table
    from benchmarks.e2e_report import table

    result = json.loads((ROOT / "benchmarks/results/e2e-h200-b.json").read_text())
    assert capacity_table(result["capacity"]) in README
    for line in table(result).split("\n")[2:2 + len(result["points"])]:
        assert line in README


def test_the_graphed_prefill_and_mixed_step_tables_are_the_json() -> None:
    from benchmarks.bench_load import readme_rows
    from benchmarks.engine_prefill import mixed_rows, prefill_rows

    parts = json.loads((ROOT / "benchmarks/results/prefill-h100.json").read_text())
    assert "\n".join(prefill_rows(parts)) in README
    assert "\n".join(mixed_rows(parts)) in README
    for name in ("load-h100-graphed-capacity.json", "load-h100-mixed-graphed-vs-eager.json",
                 "load-h100-reuse-graphed.json"):
        load = json.loads((ROOT / "benchmarks/results" / name).read_text())
        assert "\n".join(readme_rows(load)) in README, name
    capacity = json.loads((ROOT / "benchmarks/results/load-h100-graphed-capacity.json")
                          .read_text())
    by_name = {c["config"]["name"]: c["capacity_at_slo_per_s"]["128"]
               for c in capacity["configs"]}
    assert by_name["whole"] == 0.0 and by_name["mixed512"] == 8.0
    assert "**Goal ≥ 1.5×: met**" in README


def test_the_h200_graphed_tables_are_the_json() -> None:
    from benchmarks.bench_load import readme_rows
    from benchmarks.engine_prefill import mixed_rows, prefill_rows

    parts = json.loads((ROOT / "benchmarks/results/prefill-h200.json").read_text())
    assert parts["device"] == "NVIDIA H200"
    assert "\n".join(prefill_rows(parts)) in README
    assert "\n".join(mixed_rows(parts)) in README
    for name in ("load-h200-graphed-capacity.json", "load-h200-reuse-graphed.json"):
        load = json.loads((ROOT / "benchmarks/results" / name).read_text())
        assert "\n".join(readme_rows(load)) in README, name
    reuse = json.loads((ROOT / "benchmarks/results/load-h200-reuse-graphed.json").read_text())
    hit = next(lv for c in reuse["configs"] if c["config"]["name"] == "reuse"
               for lv in c["levels"] if lv["rate_per_s"] == 1.0)["ttft_ms_p50_hit"]
    assert f"{hit:.1f} ms at 1 request/s" in README


def test_the_gc_freeze_numbers_are_the_json() -> None:
    cpu = json.loads((ROOT / "benchmarks/results/gc-freeze-cpu.json").read_text())
    by = {c["config"]["name"]: c for c in cpu["configs"]}
    assert by["frozen"]["config"]["gc_freeze"] and not by["thawed"]["config"]["gc_freeze"]
    assert f"took {by['thawed']['full_gc_pass_ms']:.0f} ms over" in README
    assert f"it took {by['frozen']['full_gc_pass_ms']:.1f} ms over" in README


def test_the_default_reuse_numbers_are_the_json() -> None:
    run = json.loads((ROOT / "benchmarks/results/load-h100-reuse-default.json").read_text())
    hits = {lv["rate_per_s"]: lv["ttft_ms_p50_hit"] for lv in run["configs"][0]["levels"]}
    assert f"{hits[1.0]:.1f} ms at 1/s and {hits[4.0]:.1f} ms at 4/s" in README
