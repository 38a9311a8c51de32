"""``eventspec toy train``'s steps run on CPU at a tiny scale and write loadable models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from cloud.target import load_target
from edge.align import load_adapter
from edge.draft_checkpoint import load_draft

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--scenes", "12", "--steps", "2", "--batch", "4", "--val-scenes", "2",
        "--workers", "1", "--device", "cpu", "--log-every", "1"]


def _run(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_trainers_write_models_that_load(tmp_path: Path) -> None:
    target_dir, draft_dir, adapter_dir = tmp_path / "t", tmp_path / "d", tmp_path / "a"
    feats = tmp_path / "f.safetensors"
    metrics = json.loads(_run("cloud.toy", "train", *TINY, "--out", str(target_dir)))
    assert metrics["steps"] == 2 and set(metrics["validation"]) >= {"direction", "colour"}
    json.loads(_run("edge.toy", "train-draft", *TINY, "--out", str(draft_dir)))
    _run("cloud.toy", "export-features", "--model", str(target_dir), "--seeds", "0-12",
         "--out", str(feats), "--device", "cpu", "--workers", "1")
    json.loads(_run("edge.toy", "train-adapter", "--draft", str(draft_dir), "--features",
                    str(feats), "--out", str(adapter_dir), "--steps", "3", "--batch", "4",
                    "--device", "cpu", "--workers", "1"))
    target = load_target(target_dir)
    draft = load_draft(draft_dir)
    adapter = load_adapter(adapter_dir)
    assert target.vocab_fingerprint == draft.vocab_fingerprint
    g = target.geometry
    assert adapter.config.dst == (g.num_frames, g.tokens_per_frame, g.feature_dim)
    assert (target_dir / "README.md").read_text().startswith("# toy-video-llava")
    assert all(p.dtype == torch.float32 for p in target.model.parameters())
