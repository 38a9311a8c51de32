"""Every committed result says which code made it, on what, run how, and holds no machine
path (issue 35: 0 of 66 results named a commit, 20 held paths like ``/root/out/...``);
benchmarks write through ``benchmarks.stamp.write_result``, which stamps and scrubs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks.stamp import MACHINE_PATH, STAMP_KEYS, scrub_paths, stamp, write_result

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
COMMIT = re.compile(r"^[0-9a-f]{40}$")


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_each_committed_result_is_stamped_and_holds_no_machine_path(path: Path) -> None:
    text = path.read_text()
    body = json.loads(text)
    st = body.get("stamp")
    assert isinstance(st, dict) and set(STAMP_KEYS) <= set(st), f"{path.name}: no full stamp"
    assert COMMIT.match(st["commit"]), f"{path.name}: commit {st['commit']!r}"
    assert st["device"] and st["device"] != "unknown"
    assert not MACHINE_PATH.search(text), f"{path.name}: {MACHINE_PATH.search(text)}"


def test_results_are_written_stamped_and_scrubbed(tmp_path: Path) -> None:
    out = write_result(tmp_path / "r.json", {"log": "/root/out/cloud.log", "ms": 1.5})
    body = json.loads(out.read_text())
    assert body["ms"] == 1.5 and body["log"] == "<path>"
    assert COMMIT.match(body["stamp"]["commit"]) and body["stamp"]["device"] == "cpu"
    assert isinstance(body["stamp"]["dirty"], bool)


def test_a_command_keeps_repository_paths_relative() -> None:
    root = Path(__file__).resolve().parents[2]
    assert stamp([str(root / "benchmarks" / "bench_load.py"), "--out",
                  str(root / "benchmarks/results/x.json")])["command"] == \
        "bench_load.py --out benchmarks/results/x.json"
    assert scrub_paths("see /tmp/abc/def and /home/u/x") == "see <path> and <path>"


def test_a_named_commit_wins_over_a_stale_git(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU machine's copied tree carried a stale ``.git``; the commit the caller names
    is the one stamped."""
    monkeypatch.setenv("EVENTSPEC_GIT_COMMIT", "ab" * 20)
    monkeypatch.setenv("EVENTSPEC_GIT_DIRTY", "1")
    st = stamp([])
    assert st["commit"] == "ab" * 20 and st["dirty"] is True and st["date"].endswith("UTC")


def test_one_key_means_one_thing_across_load_runs() -> None:
    """Two early runs timed the engine's step to its launch (0.8 ms beside an 7 ms step in
    the server) under the key later runs use for the device-timed step; they keep their
    numbers under keys that say so, and the shared key holds only device-timed ratios."""
    for path in sorted(RESULTS.glob("load-*.json")):
        for cfg in json.loads(path.read_text())["configs"]:
            for lv in cfg["levels"]:
                ratio = lv.get("in_server_over_engine")
                assert ratio is None or 0.5 < ratio < 3.0, (path.name, ratio)
