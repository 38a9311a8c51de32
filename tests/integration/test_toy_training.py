"""``eventspec toy train`` as a process: it trains all three stages at a tiny scale into
``--out`` (or a new directory), honours each stage's steps, never touches the shipped
models without ``--install``, and refuses sizes that cannot work with one clear line."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from eventspec.cloud.model_dirs import SHIPPED_MODELS as CLOUD_MODELS
from eventspec.cloud.target import load_target
from eventspec.edge.drafting.checkpoint import load_draft
from eventspec.edge.model_dirs import SHIPPED_MODELS as EDGE_MODELS
from eventspec.edge.vision.align import load_adapter
from eventspec.shared.client.launch import entry_point_command

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--scenes", "12", "--steps", "2", "--batch", "4", "--val-scenes", "2",
        "--adapter-scenes", "12", "--adapter-batch", "4", "--workers", "1",
        "--device", "cpu", "--log-every", "1"]


def _toy(*args: str, cwd: Path = ROOT, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(entry_point_command("eventspec", ["toy", *args]), cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _digest(*dirs: Path) -> str:
    h = hashlib.sha256()
    for d in dirs:
        for f in sorted(d.rglob("*")):
            if f.is_file():
                h.update(str(f).encode())
                h.update(f.read_bytes())
    return h.hexdigest()


def test_train_writes_all_stages_to_out_and_leaves_the_shipped_models(tmp_path: Path) -> None:
    shipped = _digest(CLOUD_MODELS, EDGE_MODELS)
    out = tmp_path / "models"
    run = _toy("train", *TINY, "--adapter-steps", "3", "--out", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert _digest(CLOUD_MODELS, EDGE_MODELS) == shipped
    target_dir, draft_dir = out / "toy-video-llava", out / "toy-eventgpt"
    adapter_dir = out / "toy-adapter"
    assert result["outputs"] == {"target": str(target_dir), "draft": str(draft_dir),
                                 "adapter": str(adapter_dir)}
    # --steps sets every stage; --adapter-steps overrides it for the adapter.
    steps = {name: json.loads((d / "training.json").read_text())["steps"]
             for name, d in (("target", target_dir), ("draft", draft_dir),
                             ("adapter", adapter_dir))}
    assert steps == {"target": 2, "draft": 2, "adapter": 3}
    assert set(result["target"]["validation"]) >= {"direction", "colour"}
    target = load_target(target_dir)
    draft = load_draft(draft_dir)
    adapter = load_adapter(adapter_dir)
    assert target.vocab_fingerprint == draft.vocab_fingerprint
    g = target.geometry
    assert adapter.config.dst == (g.num_frames, g.tokens_per_frame, g.feature_dim)
    assert (target_dir / "README.md").read_text().startswith("# toy-video-llava")
    assert all(p.dtype == torch.float32 for p in target.model.parameters())


def test_train_defaults_to_a_new_directory(tmp_path: Path) -> None:
    """Only the adapter, paired against the shipped target and draft: the cheapest stage."""
    run = _toy("train", "--stages", "adapter", "--adapter-scenes", "2", "--adapter-steps", "1",
               "--adapter-batch", "2", "--workers", "1", "--device", "cpu", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    (new,) = tmp_path.glob("toy-models-*")
    assert [p.name for p in new.iterdir()] == ["toy-adapter"]
    assert json.loads((new / "toy-adapter" / "training.json").read_text())["steps"] == 1


@pytest.mark.parametrize(("args", "expected"), [
    (["--scenes", "8"], "minimum is --scenes 22"),
    (["--adapter-scenes", "1", "--stages", "adapter"], "minimum is 2"),
    (["--steps", "0"], "--target-steps must be at least 1, got 0"),
    (["--adapter-steps", "0"], "--adapter-steps must be at least 1, got 0"),
    (["--stages", "target,vision"], "unknown stage 'vision'"),
    (["--out", str(CLOUD_MODELS)], "use --install"),
    (["--out", str(EDGE_MODELS / "toy-eventgpt")], "use --install"),
])
def test_train_refuses_bad_settings_in_one_line(args: list[str], expected: str,
                                                tmp_path: Path) -> None:
    out = [] if "--out" in args else ["--out", str(tmp_path / "new")]
    run = _toy("train", *args, *out, timeout=60)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], run.stderr


def test_train_refuses_an_occupied_out_and_out_with_install(tmp_path: Path) -> None:
    (tmp_path / "toy-video-llava").mkdir()
    (tmp_path / "toy-video-llava" / "config.json").write_text("{}")
    run = _toy("train", "--stages", "target", "--out", str(tmp_path), timeout=60)
    assert run.returncode == 2 and "already holds a model" in run.stderr
    run = _toy("train", "--install", "--out", str(tmp_path), timeout=60)
    assert run.returncode == 2 and "not allowed with argument" in run.stderr


@pytest.mark.slow
def test_eval_judges_the_shipped_models_through_the_nodes() -> None:
    """``toy eval`` starts both nodes through their entry points and asks over gRPC."""
    # A cloud slower than any drafter here (the int4 CPU kernel's prefill of the toy
    # prompt takes ~0.5 s), so every drafter gets its drafts verified.
    run = _toy("eval", "--scenes", "1", "--json", "--cloud-prefill-ms", "1500",
               "--cloud-step-ms", "60", "--speculation", "always",
               "--draft-quant", "none,int8,int4", timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert result["scenes"] == 1 and result["questions"] >= 3
    assert result["target_accuracy"] >= 0.6
    assert 0.0 < result["adapter_cos_mean"] <= 1.0
    by_quant = result["by_draft_quant"]
    assert list(by_quant) == ["none", "int8", "int4"]
    for row in by_quant.values():
        assert row["questions"] == result["questions"] and row["drafted"] > 0
        assert 0.0 <= row["acceptance_rate"] <= 1.0 and row["mean_accepted_length"] >= 1.0


def test_eval_refuses_an_unknown_draft_quant_in_one_line() -> None:
    run = _toy("eval", "--draft-quant", "none,int3", timeout=60)
    assert run.returncode == 2
    assert "--draft-quant takes a comma-separated list of none, int8, int4" in run.stderr
