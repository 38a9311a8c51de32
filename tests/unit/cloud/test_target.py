"""The Video-LLaVA target wrapper (cloud/target.py) on the tiny random model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from eventspec.cloud.target import (
    TargetModel,
    VisualGeometry,
    load_target,
    save_target,
)
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.demoworld.tiny_tokenizer import TINY_TEXT_VOCAB_SIZE, build_tiny_tokenizer
from eventspec.shared.contract.errors import InvalidInput, NotFound
from eventspec.shared.node.imageproc import encode_jpeg, encode_png
from eventspec.shared.node.vocab import text_vocab_fingerprint


@pytest.fixture(scope="module")
def target() -> TargetModel:
    return build_tiny_random_target(seed=0)


def jpeg_frames(n: int, seed: int = 0, size: tuple[int, int] = (40, 56)) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [
        encode_jpeg(rng.integers(0, 256, (*size, 3), dtype=np.uint8), quality=90) for _ in range(n)
    ]


def test_identity_and_geometry(target: TargetModel) -> None:
    assert target.geometry == VisualGeometry(
        num_frames=8, tokens_per_frame=17, feature_dim=32, image_size=32
    )
    assert target.text_vocab_size == TINY_TEXT_VOCAB_SIZE == 512
    assert target.vocab_size % 64 == 0 and target.vocab_size >= 515
    assert (target.bos_token_id, target.eos_token_id) == (1, 2)
    pieces = build_tiny_tokenizer("draft").id_to_token
    draft_fp = text_vocab_fingerprint([str(pieces(i)) for i in range(TINY_TEXT_VOCAB_SIZE)])
    assert target.vocab_fingerprint == draft_fp  # the draft side computes the same
    assert not target.model.training


def test_prompt_has_all_placeholders_and_one_bos(target: TargetModel) -> None:
    ids = target.build_prompt_ids("What is moving?")
    n_video = target.geometry.num_frames * target.geometry.tokens_per_frame
    assert ids.count(target.video_token_id) == n_video == 136
    assert ids[0] == target.bos_token_id and ids.count(target.bos_token_id) == 1
    first = ids.index(target.video_token_id)
    assert ids[first : first + n_video] == [target.video_token_id] * n_video  # contiguous
    assert all(i < target.text_vocab_size for i in ids if i != target.video_token_id)
    text = target.decode([i for i in ids if i != target.video_token_id])
    assert text.startswith("USER:") and "What is moving?" in text and text.endswith("ASSISTANT:")
    assert ids != target.build_prompt_ids("Is it dark?")


def test_prompt_rejects_placeholders_in_question(target: TargetModel) -> None:
    for question in ["<video> again", "an <image>", "bad <s> bos"]:
        with pytest.raises(InvalidInput):
            target.build_prompt_ids(question)


def test_preprocess_frames(target: TargetModel) -> None:
    pix = target.preprocess_frames(jpeg_frames(8))
    assert pix.shape == (1, 8, 3, 32, 32) and pix.dtype == torch.float32
    assert torch.isfinite(pix).all()
    rgb = np.zeros((32, 32, 3), dtype=np.uint8)
    png = target.preprocess_frames([encode_png(rgb)] * 8)
    assert torch.allclose(png[0, 0, 0], torch.full((32, 32), -0.48145466 / 0.26862954))


@pytest.mark.parametrize(
    "frames",
    [
        [],
        jpeg_frames(7),
        jpeg_frames(9),
        [b"not an image"] * 8,
        [*jpeg_frames(7), b""],
    ],
    ids=["zero", "seven", "nine", "garbage", "one-empty"],
)
def test_preprocess_frames_errors(target: TargetModel, frames: list[bytes]) -> None:
    with pytest.raises(InvalidInput):
        target.preprocess_frames(frames)


def test_features_are_pre_projector(target: TargetModel) -> None:
    pix = target.preprocess_frames(jpeg_frames(8, seed=3))
    feats = target.video_features_from_pixels(pix)
    assert feats.shape == (8, 17, 32)
    assert not feats.requires_grad  # the tower runs without autograd, whoever calls it
    projected = target.project_video_features(feats)
    assert projected.shape == (8, 17, 64)
    with torch.inference_mode():
        ref = target.model.model.get_video_features(pixel_values_videos=pix)
    ref_t = ref.pooler_output if hasattr(ref, "pooler_output") else ref
    torch.testing.assert_close(projected, ref_t.reshape(8, 17, 64), rtol=0, atol=1e-6)
    with pytest.raises(InvalidInput):
        target.project_video_features(feats[:, :16])
    with pytest.raises(InvalidInput):
        target.project_video_features(torch.full_like(feats, float("nan")))
    with pytest.raises(InvalidInput):
        target.video_features_from_pixels(pix[:, :7])


def test_seeds_differ_and_global_rng_untouched() -> None:
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_tiny_random_target(seed=1)
    after = torch.rand(1)
    assert torch.equal(before, after)
    b = build_tiny_random_target(seed=2)
    c = build_tiny_random_target(seed=1)
    wa, wb, wc = (t.model.lm_head.weight for t in (a, b, c))
    assert torch.equal(wa, wc) and not torch.equal(wa, wb)


def test_save_load_round_trip(target: TargetModel, tmp_path: Path) -> None:
    save_target(target, tmp_path / "m")
    loaded = load_target(tmp_path / "m", device="cpu")
    assert loaded.geometry == target.geometry
    assert loaded.vocab_fingerprint == target.vocab_fingerprint
    assert (loaded.vocab_size, loaded.text_vocab_size) == (
        target.vocab_size,
        target.text_vocab_size,
    )
    assert loaded.eos_token_id == target.eos_token_id and loaded.dtype == torch.float32
    assert loaded.model_id == "m"
    question = "How many cars are there?"
    assert loaded.build_prompt_ids(question) == target.build_prompt_ids(question)
    ids = torch.tensor([target.build_prompt_ids(question)])
    pix = target.preprocess_frames(jpeg_frames(8, seed=5))
    with torch.inference_mode():
        want = target.model(input_ids=ids, pixel_values_videos=pix).logits
        got = loaded.model(input_ids=ids, pixel_values_videos=pix).logits
    assert torch.equal(want, got)


def test_load_errors(target: TargetModel, tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        load_target(tmp_path / "absent")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NotFound, match=r"config\.json"):
        load_target(empty)
    save_target(target, tmp_path / "full")
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((tmp_path / "full" / "config.json").read_text())
    with pytest.raises(NotFound, match="weights"):
        load_target(no_weights)
    for f in (tmp_path / "full").glob("tokenizer*"):
        f.unlink()
    with pytest.raises(NotFound, match="tokenizer"):
        load_target(tmp_path / "full")
    bogus = tmp_path / "bogus"
    bogus.mkdir()
    (bogus / "config.json").write_text('{"model_type": "llama"}')
    (bogus / "model.safetensors").write_bytes(b"")
    (bogus / "tokenizer.json").write_text("{}")
    with pytest.raises(InvalidInput):
        load_target(bogus)
