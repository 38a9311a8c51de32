"""Token adapter and draft head: incremental steps match whole-answer forwards, caches
crop like the drafter's, directories round-trip, the commit log keeps its bound, and
training on a tiny synthetic log learns a mapping (CPU, seconds)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from eventspec.edge.learning.commit_log import CommitLogWriter, LogMeta, read_log
from eventspec.edge.learning.token_heads import (
    DraftHead,
    HeadCache,
    TokenHeadConfig,
    build_head,
    load_head,
    macs_per_token,
    save_head,
)
from eventspec.edge.learning.train import train_from_log
from eventspec.edge.learning.train_settings import HeadTraining
from eventspec.shared.contract.errors import InvalidInput

H, V = 16, 24


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny tensors: one intra-op thread, not two contending with the rest of the suite."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def config(kind: str) -> TokenHeadConfig:
    return TokenHeadConfig(kind=kind, feature_dim=H, text_vocab_size=V, hidden=12,  # type: ignore[arg-type]
                           token_dim=8)


@pytest.mark.parametrize("kind", ["adapter", "head"])
def test_steps_with_rollback_match_the_whole_answer_forward(kind: str) -> None:
    torch.manual_seed(0)
    head = build_head(config(kind)).eval()
    feats = torch.randn(1, 6, H)  # [1, n, H]
    fed = torch.tensor([[V, 3, 5, 7, 1, 2]])  # [1, n], answer start first
    whole = head(feats, fed)[0]  # [n, V]
    cache = HeadCache()
    rows = [head.step(cache, feats[0, :2], fed[0, :2]),
            head.step(cache, torch.randn(3, H), torch.tensor([9, 9, 9]))]  # a wrong tail
    cache.crop(2)
    rows[1] = head.step(cache, feats[0, 2:], fed[0, 2:])
    torch.testing.assert_close(torch.cat(rows), whole, atol=1e-5, rtol=1e-5)
    assert cache.length == 6


def test_the_head_sees_the_tokens_fed_and_the_adapter_does_not() -> None:
    torch.manual_seed(0)
    feats = torch.randn(1, 3, H)
    a, b = torch.tensor([[V, 1, 2]]), torch.tensor([[V, 4, 2]])
    adapter, head = build_head(config("adapter")), build_head(config("head"))
    assert torch.equal(adapter(feats, a), adapter(feats, b))
    assert not torch.allclose(head(feats, a)[0, 1:], head(feats, b)[0, 1:])


def test_directory_round_trip_and_cost(tmp_path: Path) -> None:
    head = build_head(config("head"))
    assert isinstance(head, DraftHead)
    save_head(head, tmp_path / "h", "# card\n")
    back = load_head(tmp_path / "h")
    assert isinstance(back, DraftHead) and back.config == head.config
    for k, v in head.state_dict().items():
        assert torch.equal(v, back.state_dict()[k])
    assert macs_per_token(head) == sum(
        m.weight.numel() for m in head.modules() if isinstance(m, torch.nn.Linear))
    with pytest.raises(InvalidInput):
        TokenHeadConfig(kind="lstm", feature_dim=H, text_vocab_size=V)  # type: ignore[arg-type]


def meta() -> LogMeta:
    return LogMeta(draft_model_id="d", vocab_fingerprint="f", feature_dim=H,
                   text_vocab_size=V, source="synthetic")


def test_commit_log_round_trip_and_bound(tmp_path: Path) -> None:
    writer = CommitLogWriter(tmp_path, meta(), max_bytes=10_000, requests_per_shard=2)
    rng = np.random.default_rng(0)
    rows = [(rng.standard_normal((n, H)), rng.integers(0, V, n)) for n in (3, 4, 5, 2)]
    for f, t in rows:
        assert writer.add(f, t)
    writer.flush()
    got_meta, requests = read_log(tmp_path)
    assert got_meta == meta() and len(requests) == 4
    for (f, t), r in zip(rows, requests, strict=True):
        np.testing.assert_array_equal(r.tokens, t)
        np.testing.assert_allclose(r.features, f.astype(np.float16))
    big = CommitLogWriter(tmp_path / "small", meta(), max_bytes=100, requests_per_shard=1)
    assert not big.add(*rows[0])
    assert big.full and not list((tmp_path / "small").glob("commits-*.npz"))
    with pytest.raises(InvalidInput):
        CommitLogWriter(tmp_path, meta(), max_bytes=1).add(np.zeros((2, H + 1)), np.zeros(2))


@pytest.mark.parametrize("kind", ["adapter", "head"])
def test_training_learns_a_synthetic_mapping(tmp_path: Path, kind: str) -> None:
    """Label = a fixed function of the features' sign pattern: learnable, not guessable."""
    rng = np.random.default_rng(1)
    writer = CommitLogWriter(tmp_path / "log", meta(), max_bytes=1 << 24)
    for _ in range(300):
        n = int(rng.integers(2, 6))
        feats = rng.standard_normal((n, H)).astype(np.float32)
        writer.add(feats, (feats[:, :4] > 0) @ np.array([1, 2, 4, 8]) % V)
    writer.flush()
    metrics = train_from_log(tmp_path / "log", tmp_path / kind,
                             HeadTraining(kind=kind, steps=300, batch=32, hidden=32, lr=1e-2))  # type: ignore[arg-type]
    assert float(metrics["held_out_top1"]) > 0.5  # type: ignore[arg-type]  # chance: 1/16
    assert (tmp_path / kind / "README.md").read_text().count("train-adapter") >= 1
    assert load_head(tmp_path / kind).config.training["kind"] == kind


def test_both_toy_drafters_are_selectable_by_name() -> None:
    from eventspec.edge.model_dirs import (
        TOY,
        TOY_DRAFT_DIR,
        TOY_MISALIGNED,
        TOY_MISALIGNED_DIR,
        draft_dir,
    )

    assert draft_dir(TOY) == TOY_DRAFT_DIR and draft_dir(TOY_MISALIGNED) == TOY_MISALIGNED_DIR
    assert (TOY_MISALIGNED_DIR / "config.json").is_file()
    assert "misaligned" in (TOY_MISALIGNED_DIR / "README.md").read_text()


def test_the_train_adapter_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from eventspec.edge.cli import main

    writer = CommitLogWriter(tmp_path / "log", meta(), max_bytes=1 << 20)
    rng = np.random.default_rng(2)
    for _ in range(20):
        writer.add(rng.standard_normal((3, H)), rng.integers(0, V, 3))
    writer.flush()
    argv = ["train-adapter", "--log", str(tmp_path / "log"), "--out", str(tmp_path / "out"),
            "--kind", "head", "--steps", "5", "--hidden", "8"]
    assert main(argv) == 0
    assert '"kind": "head"' in capsys.readouterr().out
    assert load_head(tmp_path / "out").config.kind == "head"
    assert main(argv) == 1  # the directory is no longer empty
    assert "not empty" in capsys.readouterr().err
