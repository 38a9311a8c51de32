"""``tools/pyspy_steps.py``: the engine thread's samples of a raw py-spy profile, in
buckets per step. Checked on hand-made stacks and on the committed profiles, whose
figures ``docs/results/load-gpu.md`` quotes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tools import ROOT, load_tool

tool = load_tool("pyspy_steps")
RESULTS = ROOT / "benchmarks" / "results"

LOOP = ("thread (9): engine-core;Thread.run (threading.py:1);EngineLoop._run (engine_loop.py:1);"
        "EngineLoop._iterate (cloud/scheduling/engine_loop.py:140)")


def test_each_stack_lands_in_its_first_bucket_and_other_threads_are_left_out() -> None:
    lines = [
        f"{LOOP};EngineLoop._step (e.py:1);BatchedSampler.__call__ (s.py:78);"
        "BatchedSampler._greedy (s.py:93);_padded_rows_and_drafts (s.py:195) 40\n",
        f"{LOOP};EngineLoop._step (e.py:1);BatchedSampler.__call__ (s.py:78);"
        "BatchedSampler._greedy (s.py:94) 3\n",
        f"{LOOP};EngineLoop._step (e.py:1);StaticRuntime.step (r.py:274);"
        "StepStaging.load (st.py:101) 2\n",
        f"{LOOP};EngineLoop._step (e.py:1);PendingVerdicts.result (s.py:109);"
        "_HostRows.tolist (s.py:92);Event.synchronize (streams.py:254) 5\n",
        "thread (8): asyncio_0;BaseEventLoop.run_forever (base_events.py:1) 99\n",
        "thread (9): engine-core;Thread.run (threading.py:1) 7\n",  # outside the iterations
    ]
    assert tool.summarise(lines) == {
        "wait: the sampler's pageable index copy": 40, "sampler (host side)": 3,
        "loading the step (staging)": 2, "wait: the verdicts' event": 5}


def test_the_committed_profile_gives_the_quoted_figures(
        capsys: pytest.CaptureFixture[str]) -> None:
    """One session at 2274699: the figures docs/results/load-gpu.md quotes."""
    profile = RESULTS / "pyspy-load-b1-h200-2274699.txt.gz"
    load = RESULTS / "load-h200-handover-profiled-b1.json"
    assert tool.main([str(profile), "--load", str(load)]) == 0
    out = capsys.readouterr().out
    assert "4519 steps" in out
    assert "    0.228      258  sampler (host side)" in out
    assert "    0.191      216  loading the step (staging)" in out


def test_within_splits_one_function_by_what_it_called() -> None:
    lines = [
        f"{LOOP};StepStaging.load (st.py:101);StepStaging.to_device (st.py:93) 6\n",
        f"{LOOP};StepStaging.load (st.py:102) 4\n",
        f"{LOOP};StepStaging.load (st.py:101);StepStaging.to_device (st.py:93);"
        "Tensor.pin_memory (t.py:1) 1\n",
        "thread (8): asyncio_0;StepStaging.load (st.py:102) 50\n",  # not the engine thread
    ]
    assert tool.within(lines, "StepStaging.load") == {"StepStaging.to_device:93": 7,
                                                       "StepStaging.load:102": 4}


def test_the_steps_come_from_the_load_run(tmp_path: Path) -> None:
    run = tmp_path / "load.json"
    run.write_text('{"configs": [{"levels": [{"step_kinds": {"kinds": '
                   '{"plain": {"steps": 7}, "piece": {"steps": 3}}}}]}]}')
    assert tool.load_steps(run) == 10
