"""``benchmarks/step_trace.py`` (``bench_engine --trace-dir``) on CPU with the tiny target:
the same calls the GPU run makes, host activity only, both traces written as gzip chrome
JSON a viewer opens, and a stamped sidecar that names them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from benchmarks.engine_agreement import QUESTION, pixels
from benchmarks.stamp import MACHINE_PATH, card_tag
from benchmarks.step_trace import without_graphs, write_step_traces
from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.demoworld.tiny_target import build_tiny_random_target


@pytest.fixture(scope="module")
def engine() -> StaticEngine:
    target = build_tiny_random_target(seed=0)
    eng = StaticEngine(target, num_slots=2, max_seq_len=512, use_graphs=False,
                       compile_layers=False)
    eng.prefill([PrefillRequest(slot=0, input_ids=target.build_prompt_ids(QUESTION),
                                pixel_values_videos=pixels(target, 0))])
    return eng


def test_both_traces_and_their_sidecar_are_written(engine: StaticEngine,
                                                   tmp_path: Path) -> None:
    ctx = engine.occupancy.filled(0)
    body = write_step_traces(engine, ctx, tmp_path, "tiny", warmup=1, steps=2)
    names = {"trace-step-b1-k0-graphed-tiny.json.gz", "trace-step-b1-k0-eager-tiny.json.gz"}
    # Only the gzip traces and the sidecar: no raw, unstamped trace JSON is left behind.
    assert {p.name for p in tmp_path.iterdir()} == names | {"trace-step-b1-k0-tiny.json"}
    for t in body["traces"]:
        raw = gzip.decompress((tmp_path / t["file"]).read_bytes()).decode()
        events = json.loads(raw)["traceEvents"]
        assert isinstance(events, list) and events
        assert any(e.get("name") == "step#0" for e in events)
        assert not MACHINE_PATH.search(raw)
        assert t["bytes"] == (tmp_path / t["file"]).stat().st_size
        assert len(t["step_ms"]) == t["steps"] and t["step_ms_median"] > 0
    side = json.loads((tmp_path / "trace-step-b1-k0-tiny.json").read_text())
    assert {t["file"] for t in side["traces"]} == names
    assert side["traces"][0]["graph_replayed"] is False  # CPU: no graphs
    assert side["stamp"]["device"] == "cpu" and side["context"] == ctx


def test_the_graphs_come_back_after_an_eager_block(engine: StaticEngine) -> None:
    graphs = engine.step_graphs
    with pytest.raises(RuntimeError), without_graphs(engine):
        assert engine.step_graphs == {} and engine.step_graphs is not graphs
        raise RuntimeError("a failed step")
    assert engine.step_graphs is graphs


def test_a_card_is_named_by_its_model() -> None:
    assert card_tag("NVIDIA H200", "cuda") == "h200"
    assert card_tag("cpu", "cpu") == "cpu"
    assert card_tag("NVIDIA H100 80GB HBM3", "cpu") == "h100"
    assert card_tag("NVIDIA A100-SXM4-80GB", "cuda") == "a100"
    assert card_tag("Tesla V100-SXM2-16GB", "cuda") == "v100"
    assert card_tag("NVIDIA L40S", "cuda") == "l40s"
    assert card_tag("NVIDIA GeForce RTX 4090", "cuda") == "cuda"
