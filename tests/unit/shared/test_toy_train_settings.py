"""``toy train``'s checks, before any work: minimum sizes, steps per stage, output places."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventspec.cloud.model_dirs import TOY_TARGET_DIR
from eventspec.demoworld.cli import build_parser, train_run
from eventspec.demoworld.train.settings import (
    STAGES,
    TrainRun,
    TrainUsageError,
    check,
    output_dirs,
)
from eventspec.edge.model_dirs import TOY_ADAPTER_DIR, TOY_DRAFT_DIR, TOY_MISALIGNED_DIR


def _run(tmp_path: Path, *flags: str) -> TrainRun:
    args = build_parser().parse_args(["train", "--out", str(tmp_path / "out"), *flags])
    return train_run(args, "cpu")


def test_scenes_minimum_is_exact_for_the_batch(tmp_path: Path) -> None:
    check(_run(tmp_path, "--scenes", "22", "--batch", "64"), install=False)
    with pytest.raises(TrainUsageError, match="minimum is --scenes 22"):
        check(_run(tmp_path, "--scenes", "21", "--batch", "64"), install=False)
    check(_run(tmp_path, "--scenes", "2", "--batch", "4"), install=False)
    # The adapter alone does not render training scenes for the target or the draft.
    check(_run(tmp_path, "--scenes", "1", "--stages", "adapter"), install=False)


def test_steps_per_stage(tmp_path: Path) -> None:
    run = _run(tmp_path)
    assert (run.target.steps, run.draft.steps, run.adapter.steps) == (3000, 3000, 6000)
    run = _run(tmp_path, "--steps", "5")
    assert (run.target.steps, run.draft.steps, run.adapter.steps) == (5, 5, 5)
    run = _run(tmp_path, "--steps", "5", "--draft-steps", "7", "--adapter-steps", "9")
    assert (run.target.steps, run.draft.steps, run.adapter.steps) == (5, 7, 9)


def test_outputs_default_to_a_new_directory_and_install_to_the_shipped_ones() -> None:
    a = output_dirs(None, install=False)
    assert a["target"].parent.name.startswith("toy-models-")
    assert {p.parent for p in a.values()} == {a["target"].parent}
    assert [p.name for p in a.values()] == ["toy-video-llava", "toy-eventgpt", "toy-adapter",
                                            "toy-eventgpt-misaligned"]
    assert output_dirs(None, install=True) == {
        "target": TOY_TARGET_DIR, "draft": TOY_DRAFT_DIR, "adapter": TOY_ADAPTER_DIR,
        "misaligned": TOY_MISALIGNED_DIR}
    with pytest.raises(TrainUsageError, match="not both"):
        output_dirs(Path("x"), install=True)
    for shipped in (TOY_TARGET_DIR.parent, TOY_DRAFT_DIR, TOY_ADAPTER_DIR / "sub"):
        with pytest.raises(TrainUsageError, match="--install"):
            output_dirs(shipped, install=False)


def test_every_stage_is_known() -> None:
    assert STAGES == ("target", "draft", "adapter", "misaligned")


def test_the_misaligned_drafter_is_asked_for_not_default(tmp_path: Path) -> None:
    assert _run(tmp_path).stages == ("target", "draft", "adapter")
    run = _run(tmp_path, "--stages", "misaligned", "--misaligned-steps", "12")
    assert run.stages == ("misaligned",) and run.misaligned.steps == 12
    assert run.outputs["misaligned"].name == TOY_MISALIGNED_DIR.name
    check(run, install=False)
