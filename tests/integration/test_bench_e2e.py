"""The end-to-end benchmark's CPU rehearsal at one tiny point: real cloud and edge
processes, a delay proxy, the oracle drafter. Checks what it writes, never its speed."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import bench_e2e
from eventspec.edge.drafting.oracle_backend import BENCHMARKS_ONLY


def test_the_rehearsal_writes_identical_answers_and_the_oracle_label(tmp_path: Path) -> None:
    out = tmp_path / "e2e.json"
    code = bench_e2e.main([
        "--alphas", "0.8", "--rtt-ms", "10", "--clients", "2", "--requests", "1",
        "--cloud-prefill-ms", "100", "--cloud-step-ms", "20", "--max-new-tokens", "12",
        "--trials", "32", "--no-plot", "--uplink-mbit", "10", "--out", str(out),
        "--max-edges", "1", "--capacity-tokens", "10", "--capacity-clients", "2",
        "--capacity-rtt-ms", "4"])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["identical"] is True and result["partial"] is False
    assert result["edges"] == 1  # two clients share one edge
    assert BENCHMARKS_ONLY in result["label"] and BENCHMARKS_ONLY in result["draft_engine"]
    assert result["draft_engine"].startswith("oracle α=0.8")
    (point,) = result["points"]
    assert (point["alpha"], point["rtt_ms"], point["clients"], point["requests"]) == (0.8, 10, 2, 2)
    for key in ("speedup_p50", "speedup_p10", "share_slower_3pct", "tokens_per_step",
                "acceptance", "predicted", "achieved_over_predicted", "model_inputs",
                "hidden_drafted", "hidden_accepted", "hidden_budget"):
        assert key in point, key
    assert point["predicted"]["speedup_p50"] > 0
    assert point["model_inputs"]["rtt_ms"] == 10 and point["model_inputs"]["batch"] == 2
    assert len(result["requests"]) == 2
    assert all(r["spec_ids"] == r["target_ids"] for r in result["requests"])
    # The uplink phase: one Ask per feature mode through a 10 Mbit/s uplink.
    modes = [(u["requested"], u["feature_mode"]) for u in result["uplink"]]
    assert modes[:2] == [("frames", "frames"), ("aligned", "aligned")] and len(modes) == 3
    for u in result["uplink"]:
        assert u["uplink_bytes"] > 0 and u["rate_mbit"] == 10
        assert u["wire_ms_at_rate"] == u["uplink_bytes"] * 8 / 10e6 * 1e3
        # Only aligned features are timed by the cloud (frames ride in the Open).
        timed = u["feature_mode"] == "aligned"
        assert (u["cloud_upload_ms"] is not None) == timed
        assert (u["estimate_sample_mbit"] is not None) == timed
    # The capacity phase: both clients in one mode at a time, goodput compared.
    (cap,) = result["capacity"]
    assert (cap["clients"], cap["max_new_tokens"], cap["rtt_ms"]) == (2, 10, 4)
    for mode in ("speculative", "target_only"):
        run = cap[mode]
        assert run["requests"] == 2 and run["tokens"] > 0
        assert run["goodput_tok_s"] == run["tokens"] / run["wall_s"]
        assert run["latency_ms_p50"] <= run["latency_ms_p99"]
    assert cap["identical_share"] == 1.0
    assert cap["goodput_ratio"] == (cap["speculative"]["goodput_tok_s"]
                                    / cap["target_only"]["goodput_tok_s"])


def test_the_edges_own_drafter_runs_once_with_its_measured_acceptance(tmp_path: Path) -> None:
    out = tmp_path / "e2e-real.json"
    code = bench_e2e.main([
        "--drafter", "real", "--edge-model", "toy", "--rtt-ms", "5", "--clients", "1",
        "--requests", "1", "--cloud-prefill-ms", "100", "--cloud-step-ms", "20",
        "--max-new-tokens", "8", "--trials", "16", "--no-plot", "--out", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["drafter"] == "real" and "oracle" not in result["draft_engine"]
    (point,) = result["points"]
    assert point["identical"] is True
    # Its α is what the cloud accepted of its drafts, not a given one.
    assert point["alpha"] == (point["accepted"] / point["drafted"] if point["drafted"] else 0)
