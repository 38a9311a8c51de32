"""EventGPT draft: prompt splice, pooling, incremental decoding, rollback, checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eventspec.demoworld.tiny_draft import build_tiny_random_draft
from eventspec.demoworld.tokenizer import BOS_ID
from eventspec.edge.drafting.checkpoint import load_draft, save_clip, save_draft
from eventspec.edge.drafting.eventgpt import (
    EVENT_TOKEN_INDEX,
    PROMPT_TEMPLATE,
    DraftModel,
    EventGPTConfig,
)
from eventspec.shared.contract.errors import InvalidInput, NotFound

QUESTION = "What is moving?"


@pytest.fixture(scope="module")
def draft() -> DraftModel:
    return build_tiny_random_draft(seed=0)


@pytest.fixture(scope="module")
def pixels() -> torch.Tensor:
    return torch.randn(5, 3, 28, 28, generator=torch.Generator().manual_seed(0))


def _full_logits(draft: DraftModel, pixels: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """One uncached forward over prompt + event tokens + ``tokens`` -> logits [L, V]."""
    m = draft.model
    with torch.no_grad():
        events = m.event_tokens(m.clip_features(pixels))
        prompt = m.embed_with_events(draft.build_prompt_ids(QUESTION), events)  # [1, P, H]
        extra = m.get_input_embeddings()(torch.tensor([tokens], dtype=torch.long))
        embeds = torch.cat([prompt, extra], dim=1)
        logits: torch.Tensor = m(inputs_embeds=embeds, use_cache=False).logits[0].float()
        return logits


def _same_weights(a: DraftModel, b: DraftModel) -> None:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_prompt_has_one_placeholder_and_one_bos(draft: DraftModel) -> None:
    ids = draft.build_prompt_ids(QUESTION)
    assert ids.count(EVENT_TOKEN_INDEX) == 1 and ids.count(BOS_ID) == 1 and ids[0] == BOS_ID
    head, tail = PROMPT_TEMPLATE.format(question=QUESTION).split("<event>")
    pos = ids.index(EVENT_TOKEN_INDEX)
    assert ids[:pos] == draft.tokenizer(head).input_ids
    assert ids[pos + 1 :] == draft.tokenizer(tail).input_ids[1:]  # BOS dropped
    assert all(0 <= i < draft.text_vocab_size for i in ids if i != EVENT_TOKEN_INDEX)


@pytest.mark.parametrize("question", ["a <event> b", "<event>", "x<event><event>y {question}"])
def test_event_in_the_question_is_literal_text(draft: DraftModel, question: str) -> None:
    """Issue 19, item 7: the placeholder is the template's, never the user's: a question
    that contains ``<event>`` is tokenized as text, as the target does (it has no such
    token), so every mode takes it."""
    ids = draft.build_prompt_ids(question)
    assert ids.count(EVENT_TOKEN_INDEX) == 1 and ids.count(BOS_ID) == 1
    head, tail = PROMPT_TEMPLATE.split("<event>")
    pos = ids.index(EVENT_TOKEN_INDEX)
    assert ids[:pos] == draft.tokenizer(head).input_ids
    assert ids[pos + 1 :] == draft.tokenizer(tail.format(question=question)).input_ids[1:]


def test_identity_fields(draft: DraftModel) -> None:
    assert draft.text_vocab_size == 512  # <ev_patch> is the first special id
    assert draft.tokenizer.convert_tokens_to_ids("<ev_patch>") == 512
    assert draft.model.config.vocab_size >= 513 and draft.eos_token_id == 2
    assert draft.image_size == 28 and draft.tokens_per_frame == 5
    assert len(draft.vocab_fingerprint) == 64
    assert draft.model.config.model_type == "EventChat_llama"


def test_event_pooling_counts_and_values(draft: DraftModel, pixels: torch.Tensor) -> None:
    feats = draft.clip_features(pixels)
    assert feats.shape == (5, draft.tokens_per_frame, 32)
    with torch.no_grad():
        tokens = draft.model.event_tokens(feats)
        assert tokens.shape == (5 + draft.tokens_per_frame, 64)  # the 582 of the 7B model
        # three frames, to tell the frame axis from the token axis
        three = draft.model.event_tokens(feats[:3])
        m = draft.model.event_model
        adapted = m.feature_adaptor(m.visual_projector(feats[:3]))  # [3, 5, 64]
    assert three.shape == (3 + 5, 64)
    torch.testing.assert_close(three[:3], adapted.mean(dim=1))
    torch.testing.assert_close(three[3:], adapted.mean(dim=0))
    with pytest.raises(InvalidInput, match=r"\[F, 3, 28, 28\]"):
        draft.clip_features(torch.zeros(5, 3, 32, 32))


def test_prefill_and_steps_match_a_full_forward(draft: DraftModel, pixels: torch.Tensor) -> None:
    state, first = draft.prefill(QUESTION, pixels)
    assert first.shape == (draft.model.config.vocab_size,) and first.dtype == torch.float32
    n_prompt = len(draft.build_prompt_ids(QUESTION)) - 1 + 5 + draft.tokens_per_frame
    assert state.prompt_len == draft.seq_len(state) == n_prompt
    tokens = [draft.greedy_next(first), 17, 300]
    step1 = draft.step(state, tokens[:1])
    step2 = draft.step(state, tokens[1:])
    assert step2.shape == (2, draft.model.config.vocab_size)
    assert draft.seq_len(state) == n_prompt + 3
    full = _full_logits(draft, pixels, tokens)
    torch.testing.assert_close(first, full[n_prompt - 1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step1[0], full[n_prompt], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step2, full[n_prompt + 1 :], rtol=1e-5, atol=1e-5)
    # features computed once can be reused (aligned path)
    _state2, again = draft.prefill(QUESTION, None, clip_features=draft.clip_features(pixels))
    torch.testing.assert_close(again, first)


def test_rollback_then_step_matches_the_shorter_sequence(
    draft: DraftModel, pixels: torch.Tensor
) -> None:
    state, _ = draft.prefill(QUESTION, pixels)
    p = state.prompt_len
    draft.step(state, [5, 6, 7, 8])
    draft.rollback(state, p + 1)
    assert draft.seq_len(state) == p + 1
    after = draft.step(state, [42])
    torch.testing.assert_close(
        after[0], _full_logits(draft, pixels, [5, 42])[-1], rtol=1e-5, atol=1e-5
    )
    draft.rollback(state, draft.seq_len(state))  # no-op
    for bad in (p - 1, draft.seq_len(state) + 1):
        with pytest.raises(InvalidInput, match="roll back"):
            draft.rollback(state, bad)
    with pytest.raises(InvalidInput, match="out of range"):
        draft.step(state, [draft.model.config.vocab_size])
    with pytest.raises(InvalidInput, match="at least one"):
        draft.step(state, [])


def test_greedy_never_picks_special_ids(draft: DraftModel) -> None:
    logits = torch.zeros(draft.model.config.vocab_size)
    logits[512] = 100.0  # <ev_patch>
    logits[520] = 90.0  # padding row
    logits[7] = 1.0
    assert draft.greedy_next(logits) == 7


def test_tiny_build_depends_on_its_seed_only() -> None:
    torch.manual_seed(1)
    first = build_tiny_random_draft(3)
    torch.manual_seed(2)  # the global generator's state must not matter
    _same_weights(first, build_tiny_random_draft(3))
    a, b = build_tiny_random_draft(3), build_tiny_random_draft(4)
    assert not torch.equal(a.model.lm_head.weight, b.model.lm_head.weight)


@pytest.mark.parametrize("layout", ["4.x", "5.x"])
def test_checkpoint_with_clip_inside_loads_bit_exactly(
    draft: DraftModel, tmp_path: Path, layout: str
) -> None:
    save_draft(draft, tmp_path, layout=layout)  # type: ignore[arg-type]
    keys = load_file(tmp_path / "model.safetensors").keys()
    legacy = "model.visual_tower.visual_tower.vision_model.embeddings.class_embedding"
    assert (legacy in keys) == (layout == "4.x")
    assert {"model.visual_projector.0.weight", "model.visual_projector.2.weight"} <= keys
    assert {"model.feature_adaptor.weight", "lm_head.weight", "model.norm.weight"} <= keys
    loaded = load_draft(tmp_path)
    _same_weights(draft, loaded)
    assert loaded.vocab_fingerprint == draft.vocab_fingerprint
    assert loaded.build_prompt_ids(QUESTION) == draft.build_prompt_ids(QUESTION)


def test_sharded_checkpoint_without_clip_uses_clip_dir(draft: DraftModel, tmp_path: Path) -> None:
    ckpt, clip = tmp_path / "eventgpt", tmp_path / "clip"
    save_draft(draft, ckpt, include_clip=False, max_shard_bytes=40_000)
    save_clip(draft, clip)
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert not any("visual_tower" in k for k in index["weight_map"])
    _same_weights(draft, load_draft(ckpt, clip_path=str(clip)))
    # the same through config.mm_visual_tower, and with the CLIP config from the dir only
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["mm_visual_tower"] = str(clip)
    cfg["vision_config"] = None
    (ckpt / "config.json").write_text(json.dumps(cfg))
    _same_weights(draft, load_draft(ckpt))


def test_missing_clip_dir_is_not_found(draft: DraftModel, tmp_path: Path) -> None:
    save_draft(
        draft, tmp_path, include_clip=False, mm_visual_tower="openai/clip-vit-large-patch14-336"
    )
    with pytest.raises(NotFound, match="clip_path"):
        load_draft(tmp_path)
    with pytest.raises(NotFound, match=r"config\.json"):
        load_draft(tmp_path, clip_path=str(tmp_path / "nope"))
    with pytest.raises(NotFound):
        load_draft(tmp_path / "absent")


def test_missing_and_unexpected_keys_are_reported(draft: DraftModel, tmp_path: Path) -> None:
    save_draft(draft, tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.norm.weight"]
    weights["model.extra_head.weight"] = torch.zeros(2)
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(InvalidInput) as err:
        load_draft(tmp_path)
    msg = str(err.value)
    assert "1 missing keys ['model.norm.weight']" in msg
    assert "1 unexpected keys ['model.extra_head.weight']" in msg


def test_clip_config_inferred_from_weights(tmp_path: Path) -> None:
    """The released checkpoint has CLIP inside but no vision_config and a stale tower path."""
    base = build_tiny_random_draft(1)
    cfg = base.model.config.to_dict()
    cfg["vision_config"].update(hidden_size=64, num_attention_heads=1)  # 64-dim heads
    config = EventGPTConfig.from_dict(cfg)
    from eventspec.edge.drafting.eventgpt import EventGPTForCausalLM

    torch.manual_seed(1)
    draft = DraftModel(EventGPTForCausalLM(config), base.tokenizer, "x")
    save_draft(draft, tmp_path, mm_visual_tower="./checkpoints/clip-vit-large-patch14-336")
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["vision_config"] = None
    (tmp_path / "config.json").write_text(json.dumps(raw))
    loaded = load_draft(tmp_path)
    _same_weights(draft, loaded)
    assert loaded.clip_config.num_hidden_layers == 2 and loaded.image_size == 28


def test_clip_from_a_full_clip_model_dir(draft: DraftModel, tmp_path: Path) -> None:
    """mm_visual_tower usually names a full CLIPModel dir (text tower, projections, 4.x
    position_ids buffers): only the vision tower is taken."""
    ckpt, clip = tmp_path / "eventgpt", tmp_path / "clip"
    save_draft(draft, ckpt, include_clip=False)
    save_clip(draft, clip)
    weights = load_file(clip / "model.safetensors")
    weights["text_model.embeddings.token_embedding.weight"] = torch.zeros(4, 2)
    weights["vision_model.embeddings.position_ids"] = torch.arange(5)[None]
    weights["logit_scale"] = torch.tensor(1.0)
    weights["visual_projection.weight"] = torch.zeros(2, 32)
    save_file(weights, clip / "model.safetensors")
    vision = json.loads((clip / "config.json").read_text())
    full = {"model_type": "clip", "vision_config": vision, "text_config": {}}
    (clip / "config.json").write_text(json.dumps(full))
    _same_weights(draft, load_draft(ckpt, clip_path=str(clip)))
