"""The user's commands as processes: eventspec-cloud, eventspec-edge, eventspec ask / demo."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from eventspec.shared.client.launch import entry_point_command
from tests.support.cli_processes import PACED_CLOUD, ROOT, ask_json, spawn, wait_port
from tests.support.recordings import write_dsec


def test_serve_and_ask_json_on_a_dsec_sequence(tmp_path: Path) -> None:
    seq = tmp_path / "seq"
    seq.mkdir()
    write_dsec(seq, seed=21)
    cloud = spawn("eventspec-cloud", ["serve", "--model", "tiny-random", "--port", "0",
                    "--port-file", str(tmp_path / "c"), *PACED_CLOUD], tmp_path / "c.log")
    edge = None
    try:
        cport = wait_port(cloud, tmp_path / "c", tmp_path / "c.log")
        edge = spawn("eventspec-edge", ["serve", "--cloud", f"127.0.0.1:{cport}", "--source",
                       f"dsec:{seq}", "--model", "tiny-random", "--port", "0",
                       "--port-file", str(tmp_path / "e")], tmp_path / "e.log")
        eport = wait_port(edge, tmp_path / "e", tmp_path / "e.log")
        for q in ("What is moving?", "Is anything turning left?"):
            a = ask_json(eport, "speculative", q, "--clip-ms", "800")
            b = ask_json(eport, "target_only", q, "--clip-ms", "800")
            assert a["token_ids"] == b["token_ids"]
            assert a["mode"] == "speculative" and b["mode"] == "target_only"
            for key in ("drafted", "accepted", "acceptance_rate", "mean_accepted_length",
                        "hidden_drafted", "hidden_accepted", "target_steps", "ttft_ms",
                        "total_ms", "uplink_bytes", "downlink_bytes"):
                assert key in a["stats"]
            assert b["stats"]["target_steps"] == len(b["token_ids"])
        bad = subprocess.run(
            entry_point_command("eventspec", ["ask", "--edge", f"127.0.0.1:{eport}",
                                              "--event-window-ms", "150", "What?"]),
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )
        assert bad.returncode != 0 and "100" in bad.stderr
    finally:
        for proc in (edge, cloud):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (edge, cloud):
            if proc is not None:
                assert proc.wait(timeout=30) == 0


#: The demo's own bound on each wait (a node's start-up and warm-up, each request), and
#: the test's bound on the whole demo: both nodes warming, 12 requests, shutting down.
DEMO_WAIT_S = 240.0
DEMO_TOTAL_S = 540.0
#: The demo paces its cloud to these costs (``eventspec demo`` defaults).
PACED_PREFILL_MS, PACED_STEP_MS = 200.0, 30.0


def test_demo_json_reports_identical_answers() -> None:
    try:
        out = subprocess.run(
            entry_point_command("eventspec", ["demo", "--json", "--timeout", f"{DEMO_WAIT_S:g}"]),
            cwd=ROOT, capture_output=True, text=True, timeout=DEMO_TOTAL_S)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        raise AssertionError(f"demo not done within {DEMO_TOTAL_S:g} s: {err}") from None
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["identical"] is True
    assert result["token_ids"] == result["target_only"]["token_ids"]
    assert result["answer"] == result["target_only"]["answer"]
    assert result["stats"]["target_steps"] > 0
    # The embedded toy pair answers its demo scene correctly.
    assert result["correct"] is True, result
    assert result["answer"] == "It is moving right."
    # A paced cloud plans with its known costs, never a calibration of the machine.
    assert result["plan"]["predicted_prefill_ms"] == pytest.approx(PACED_PREFILL_MS)
    assert result["plan"]["predicted_step_ms"] >= PACED_STEP_MS
    # Medians of several warm requests per mode, with their spread; the speedup is the
    # ratio of the medians, and drafts are counted over all speculative runs.
    assert result["runs"] == 5
    for mode in ("speculative_total_ms", "target_only_total_ms"):
        spread = result[mode]
        assert 0 < spread["min"] <= spread["median"] <= spread["max"]
    assert result["target_only"]["total_ms"] == result["target_only_total_ms"]["median"]
    assert result["speedup"] == pytest.approx(
        result["target_only_total_ms"]["median"] / result["speculative_total_ms"]["median"],
        rel=1e-3)
    # The toy draft agrees with the toy target: against a 200 ms prefill the plan drafts,
    # and its drafts are accepted; every accepted token is one the target agreed to.
    assert result["runs_drafting"] >= 1, result["plan"]
    assert 0 < result["accepted_total"] <= result["drafted_total"]
    assert (result["runs_drafting"] == 0) == (result["drafted_total"] == 0)
    stats = result["stats"]
    assert stats["accepted"] <= stats["drafted"]
    if stats["accepted"]:
        # Accepted drafts save target steps: fewer steps than answer tokens.
        assert stats["target_steps"] < len(result["token_ids"]), stats
