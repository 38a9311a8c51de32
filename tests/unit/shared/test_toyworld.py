"""The demo world: scenes, the DVS simulator, templated Q/A and the tokenizers."""

from __future__ import annotations

import hashlib
import itertools
import random

import numpy as np
import pytest

from eventspec.cloud.model_dirs import TOY_TARGET_DIR
from eventspec.cloud.target import PROMPT_TEMPLATE as TARGET_PROMPT
from eventspec.demoworld.tiny_tokenizer import build_tiny_tokenizer
from eventspec.demoworld.tokenizer import BOS_ID, EOS_ID, UNK_ID
from eventspec.demoworld.toy_tokenizer import (
    TOY_TEXT_VOCAB_SIZE,
    build_toy_tokenizer,
    corpus_lines,
    save_toy_tokenizer,
)
from eventspec.edge.drafting.eventgpt import PROMPT_TEMPLATE as DRAFT_PROMPT
from eventspec.edge.drafting.eventgpt import SYSTEM_PROMPT
from eventspec.edge.model_dirs import TOY_DRAFT_DIR
from eventspec.shared.toyworld.events import TOY_EVENT_DTYPE, events_in_window, simulate_events
from eventspec.shared.toyworld.qa import (
    QTYPES,
    QUESTION_TEMPLATES,
    VALUES,
    all_answers,
    all_questions,
    answer_text,
    applicable_types,
    parse_answer,
    qa_pairs,
    truth,
)
from eventspec.shared.toyworld.scenes import (
    EVAL_SEED_MIN,
    RGB_FRAME_TIMES_US,
    SIZE_RANGE_PX,
    SPEED_RANGE_PX_S,
    SPLITS,
    ToyScene,
    background_luminance,
    clip_frames,
    coverage,
    luminance,
    render_rgb,
    rgb_frame_times_us,
    sample_scene,
    split_of,
)

#: Digests of the tiny tokenizer before the trainer was factored out of it: the
#: ``tiny-random`` models and their fixtures depend on these exact vocabularies.
TINY_SHA256 = {
    "target": "55e7ffe7d85dd142c7a2649fdb032310e66ad59c85f82a15758ab1411ff883c6",
    "draft": "d73c04094a84fccaade4981334b72654707bb474498b62788ddc2b580be894f0",
}
SEEDS = range(SPLITS["test"].start, SPLITS["test"].start + 200)
WINDOW = (950_000, 1_000_000)  # the edge's event window of a 1 s clip: its last 50 ms


def _first(pred: object, n: int = 1) -> list[ToyScene]:
    assert callable(pred)
    found = [sc for sc in map(sample_scene, SEEDS) if pred(sc)]
    assert len(found) >= n
    return found[:n]


# ------------------------------------------------------------------------------- scenes


def _scramble_global_rngs(seed: int) -> None:
    """Reseed the process-wide generators: the toy world must depend on its seeds only
    (a model trained on one run's data is evaluated on another's)."""
    random.seed(seed)
    np.random.seed(seed)


def test_scenes_depend_on_their_seed_only() -> None:
    _scramble_global_rngs(1)
    first = sample_scene(1_010_007)
    _scramble_global_rngs(2)
    assert sample_scene(1_010_007) == first
    assert sample_scene(1_010_007) != sample_scene(1_010_008)
    scene = sample_scene(5)
    frames = clip_frames(scene)
    _scramble_global_rngs(3)
    for a, b in zip(frames, clip_frames(sample_scene(5)), strict=True):
        assert np.array_equal(a, b)


def test_splits_are_disjoint_and_eval_seeds_are_reserved() -> None:
    ranges = sorted(SPLITS.values(), key=lambda r: r.start)
    for a, b in itertools.pairwise(ranges):
        assert a.stop <= b.start
    assert all(r.stop <= EVAL_SEED_MIN for r in ranges)
    assert split_of(0) == "train" and split_of(1_000_000) == "val"
    assert split_of(1_019_999) == "test" and split_of(EVAL_SEED_MIN) == "eval"


def test_scene_distribution_covers_every_value() -> None:
    scenes = [sample_scene(s) for s in range(600)]
    motions = [sc.motion for sc in scenes]
    assert set(motions) == {"left", "right", "up", "down", "still"}
    assert 0.05 < motions.count("still") / len(scenes) < 0.15
    assert 0.22 < sum(sc.count == 2 for sc in scenes) / len(scenes) < 0.38
    objects = [o for sc in scenes for o in sc.objects]
    assert {o.shape for o in objects} == {"circle", "square", "triangle"}
    assert {o.colour for o in objects} == {"red", "green", "blue", "yellow"}
    lo, hi = SIZE_RANGE_PX
    assert min(o.size_px for o in objects) < lo + 1 and max(o.size_px for o in objects) > hi - 1
    speeds = [abs(sum(o.velocity_px_s)) for o in objects if o.velocity_px_s != (0.0, 0.0)]
    slow, fast = SPEED_RANGE_PX_S
    assert min(speeds) < slow + 2 and max(speeds) > fast - 2
    assert len({sc.background_rgb for sc in scenes}) > 100
    for sc in scenes:
        assert all(
            o.velocity_px_s == (0.0, 0.0) if sc.motion == "still" else o.velocity_px_s != (0, 0)
            for o in sc.objects
        )
        if sc.count == 2:
            assert sc.objects[0].shape != sc.objects[1].shape


def test_objects_are_always_brighter_than_the_background() -> None:
    for seed in range(300):
        scene = sample_scene(seed)
        bg_max = float(background_luminance(scene).max())
        assert bg_max <= 45
        for obj in scene.objects:
            assert luminance(obj.rgb) > bg_max + 50, (seed, obj)


def test_objects_stay_inside_the_frame_and_apart() -> None:
    times = np.linspace(0, 1_000_000, 11)
    for seed in range(200):
        scene = sample_scene(seed)
        alphas = [coverage(o, times, scene.width, scene.height) for o in scene.objects]
        for alpha in alphas:  # [T, H, W]
            border = np.concatenate(
                [alpha[:, 0, :], alpha[:, -1, :], alpha[:, :, 0], alpha[:, :, -1]], axis=1
            )
            assert border.max() == 0.0, seed
            assert alpha.sum(axis=(1, 2)).min() > 20  # fully visible all the time
        if len(alphas) == 2:
            assert float((alphas[0] * alphas[1]).max()) == 0.0, seed


def test_frames_show_the_moving_object_where_it_should_be() -> None:
    (scene,) = _first(lambda sc: sc.motion == "right" and sc.count == 1)
    first, last = clip_frames(scene)[0], clip_frames(scene)[-1]
    assert first.shape == (64, 64, 3) and first.dtype == np.uint8
    obj = scene.objects[0]

    def centroid_x(frame: np.ndarray) -> float:
        luma = frame.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
        _ys, xs = np.nonzero(luma > 80)
        return float(xs.mean())

    travel = obj.velocity_px_s[0] * (RGB_FRAME_TIMES_US[-1] / 1e6)
    assert centroid_x(last) - centroid_x(first) == pytest.approx(travel, abs=1.5)
    assert np.array_equal(first, render_rgb(scene, 0))


def test_rgb_frame_times() -> None:
    assert RGB_FRAME_TIMES_US.tolist() == rgb_frame_times_us(1_000_000).tolist()
    assert RGB_FRAME_TIMES_US[0] == 0 and RGB_FRAME_TIMES_US[-1] == 999_999
    assert len(clip_frames(sample_scene(3))) == 8


# ------------------------------------------------------------------------------- events


def test_events_depend_on_the_scene_only_sorted_and_in_sensor() -> None:
    scene = sample_scene(1_010_001)
    _scramble_global_rngs(1)
    ev = simulate_events(scene)
    assert ev.dtype == TOY_EVENT_DTYPE
    _scramble_global_rngs(2)
    assert np.array_equal(ev, simulate_events(sample_scene(1_010_001)))
    assert bool(np.all(np.diff(ev["t"]) >= 0))
    assert ev["t"].min() >= 0 and ev["t"].max() < scene.duration_us
    assert ev["x"].max() < scene.width and ev["y"].max() < scene.height
    assert set(np.unique(ev["p"]).tolist()) <= {0, 1}


@pytest.mark.parametrize("motion", ["still", "left", "right", "up", "down"])
def test_every_last_50_ms_holds_enough_events(motion: str) -> None:
    for scene in _first(lambda sc: sc.motion == motion, 3):
        window = events_in_window(simulate_events(scene), *WINDOW)
        assert window.size >= 150, (scene.seed, window.size)


def test_noise_floor_holds_in_every_50_ms() -> None:
    scene = _first(lambda sc: sc.motion == "still")[0]
    ev = simulate_events(scene)
    counts = [events_in_window(ev, t, t + 50_000).size for t in range(0, 950_001, 10_000)]
    assert min(counts) >= 150


def test_still_scene_has_only_noise_and_noise_is_balanced() -> None:
    scene = _first(lambda sc: sc.motion == "still")[0]
    assert simulate_events(scene, noise_rate_hz_per_px=0.0).size == 0
    ev = simulate_events(scene)
    assert 0.4 < ev["p"].mean() < 0.6


def test_on_events_lead_off_events_in_the_direction_of_motion() -> None:
    """The object is brighter than the background, so ON events fire at its leading
    edge and OFF at its trailing edge: polarity alone carries the direction.

    Raw means are diluted by the uniform noise (~160 events per window, pulling both
    means to the centre by unequal amounts), so they point the right way in nearly
    all scenes (99.4% of 893 moving test-split scenes when measured); keeping only
    pixels that fired twice with one polarity, which noise almost never does, they
    point the right way in every scene, by at least ~2.7 px.
    """
    axis = {"left": ("x", -1), "right": ("x", 1), "up": ("y", -1), "down": ("y", 1)}
    scenes = _first(lambda sc: sc.motion != "still", 40)
    assert {sc.motion for sc in scenes} == set(axis)
    raw_ok = 0
    for scene in scenes:
        window = events_in_window(simulate_events(scene), *WINDOW)
        field, sign = axis[scene.motion]
        raw_ok += sign * _lead(window, field) > 0
        key = (window["y"].astype(np.int64) * 64 + window["x"]) * 2 + window["p"]
        _, inverse, counts = np.unique(key, return_inverse=True, return_counts=True)
        repeated = window[counts[inverse] >= 2]
        assert sign * _lead(repeated, field) > 1.5, (scene.seed, scene.motion)
    assert raw_ok >= 38


def _lead(events: np.ndarray, field: str) -> float:
    """Mean coordinate of the ON events minus that of the OFF events."""
    on = events[events["p"] == 1][field].astype(np.float64)
    off = events[events["p"] == 0][field].astype(np.float64)
    return float(on.mean() - off.mean())


def test_threshold_and_refractory_shape_the_stream() -> None:
    (scene,) = _first(lambda sc: sc.motion == "left")
    quiet = {"noise_rate_hz_per_px": 0.0}
    base = simulate_events(scene, **quiet)
    assert simulate_events(scene, threshold=0.1, **quiet).size > 1.5 * base.size
    assert simulate_events(scene, refractory_us=0, **quiet).size >= base.size
    long_refractory = simulate_events(scene, refractory_us=20_000, **quiet)
    assert long_refractory.size < base.size
    for pix in np.unique(long_refractory["y"].astype(np.int64) * 64 + long_refractory["x"]):
        mine = long_refractory[
            (long_refractory["y"].astype(np.int64) * 64 + long_refractory["x"]) == pix
        ]
        assert np.diff(mine["t"]).min(initial=20_000) >= 20_000 - 1


# ----------------------------------------------------------------------------------- qa


def test_qa_types_truth_and_templates() -> None:
    one = _first(lambda sc: sc.count == 1 and sc.motion == "up")[0]
    two = _first(lambda sc: sc.count == 2)[0]
    still = _first(lambda sc: sc.motion == "still")[0]
    assert applicable_types(one) == QTYPES
    assert set(applicable_types(two)) == {"direction", "count", "moving"}
    assert truth(one, "direction") == "up" and truth(one, "moving") == "yes"
    assert truth(one, "count") == "1" and truth(two, "count") == "2"
    assert truth(still, "direction") == "still" and truth(still, "moving") == "no"
    assert truth(one, "shape") == one.objects[0].shape
    assert truth(one, "colour") == one.objects[0].colour
    with pytest.raises(ValueError):
        truth(two, "colour")
    assert all(len(QUESTION_TEMPLATES[q]) >= 3 for q in QTYPES)
    assert answer_text("direction", "left") == "It is moving left."
    assert answer_text("direction", "still") == "It is not moving."
    assert answer_text("count", "2") == "There are two objects."
    assert answer_text("moving", "no") == "No, nothing is moving."


def test_qa_pairs_depend_on_their_seed_only_and_answers_match_truth() -> None:
    scene = sample_scene(1_010_003)
    _scramble_global_rngs(1)
    questions, pairs = all_questions(scene), qa_pairs(scene, 7)
    _scramble_global_rngs(2)
    assert all_questions(sample_scene(1_010_003)) == questions
    assert qa_pairs(scene, 7) == pairs
    rng = np.random.default_rng(0)
    seen = {qa.question for _ in range(50) for qa in qa_pairs(scene, rng)}
    assert len(seen) > len(applicable_types(scene)) * 2  # paraphrases vary
    for qa in all_questions(scene):
        assert qa.question in QUESTION_TEMPLATES[qa.qtype]
        assert qa.value == truth(scene, qa.qtype)
        assert parse_answer(qa.qtype, qa.answer) == qa.value


def test_parse_answer_round_trips_every_answer() -> None:
    for qtype in QTYPES:
        for value in VALUES[qtype]:
            text = answer_text(qtype, value)
            assert parse_answer(qtype, text) == value
            assert parse_answer(qtype, text.upper().rstrip(".")) == value
            assert parse_answer(qtype, f"  {text.lower()}!! ") == value


@pytest.mark.parametrize(
    ("qtype", "text", "value"),
    [
        ("direction", "It is still.", "still"),
        ("direction", "No, nothing is moving.", "still"),
        ("direction", "moving LEFT", "left"),
        ("shape", "a SQUARE, I think", "square"),
        ("colour", "It's Yellow!", "yellow"),
        ("count", "2 objects", "2"),
        ("moving", "It is not moving.", "no"),
        ("moving", "It is moving left.", "yes"),
    ],
)
def test_parse_answer_accepts_paraphrases(qtype: str, text: str, value: str) -> None:
    assert parse_answer(qtype, text) == value  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("qtype", "text"),
    [
        ("direction", ""),
        ("direction", "It is moving le"),
        ("shape", "It is a blob."),
        ("colour", "It is purple."),
        ("colour", "redder"),
        ("count", "There are objects."),
        ("moving", "asdf qwer"),
        ("shape", "<unk><unk>"),
    ],
)
def test_parse_answer_rejects_garbage(qtype: str, text: str) -> None:
    assert parse_answer(qtype, text) is None  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- tokenizer


def test_tiny_tokenizer_is_unchanged() -> None:
    for role, digest in TINY_SHA256.items():
        text = build_tiny_tokenizer(role).to_str()  # type: ignore[arg-type]
        assert hashlib.sha256(text.encode()).hexdigest() == digest


def test_toy_tokenizer_layout() -> None:
    # A rebuild giving the shipped vocabulary: test_toy_tokenizer_is_the_shipped_models_tokenizer.
    target, draft = build_toy_tokenizer("target"), build_toy_tokenizer("draft")
    assert target.token_to_id("<unk>") == UNK_ID
    assert target.token_to_id("<s>") == BOS_ID and target.token_to_id("</s>") == EOS_ID
    assert target.token_to_id("<0x00>") == 3 and target.token_to_id("<0xFF>") == 258
    assert target.token_to_id("<image>") == TOY_TEXT_VOCAB_SIZE
    assert target.token_to_id("<video>") == TOY_TEXT_VOCAB_SIZE + 1
    assert target.token_to_id("<pad>") == TOY_TEXT_VOCAB_SIZE + 2
    assert draft.token_to_id("<ev_patch>") == TOY_TEXT_VOCAB_SIZE
    assert target.get_vocab_size() == TOY_TEXT_VOCAB_SIZE + 3
    assert draft.get_vocab_size() == TOY_TEXT_VOCAB_SIZE + 1
    # One text vocabulary: ids below TOY_TEXT_VOCAB_SIZE mean the same on both sides.
    for i in range(TOY_TEXT_VOCAB_SIZE):
        assert target.id_to_token(i) == draft.id_to_token(i)


def test_toy_tokenizer_round_trips_templates_in_few_tokens() -> None:
    tok = build_toy_tokenizer("target")
    texts = [*(q for qs in QUESTION_TEMPLATES.values() for q in qs), *all_answers()]
    for text in [*texts, SYSTEM_PROMPT, "What is happening in the scene?"]:
        enc = tok.encode(text, add_special_tokens=False)
        assert UNK_ID not in enc.ids
        assert tok.decode(enc.ids) == text
        assert all(not (3 <= i <= 258) for i in enc.ids), text  # no byte fallback
    for text in texts:
        for word in text.rstrip(".?").split():
            pieces = tok.encode(word.strip(",."), add_special_tokens=False).tokens
            assert len(pieces) <= 2, (word, pieces)
    lengths = [len(tok.encode(a, add_special_tokens=False).ids) for a in all_answers()]
    assert max(lengths) <= 6


def test_toy_tokenizer_splits_prompts_around_placeholders() -> None:
    target, draft = build_toy_tokenizer("target"), build_toy_tokenizer("draft")
    video = target.token_to_id("<video>")
    prompt = TARGET_PROMPT.format(video="<video>", question="What shape is it?")
    ids = target.encode(prompt).ids
    assert ids[0] == BOS_ID and ids.count(video) == 1
    assert target.decode(ids, skip_special_tokens=False).endswith("ASSISTANT:")
    prompt = DRAFT_PROMPT.replace("<event>", "").format(question="Is anything moving?")
    ev = draft.encode(prompt).tokens
    assert "▁<ev_start>" in ev or "<ev_start>" in ev


def test_corpus_lines_depend_on_their_seeds_only() -> None:
    _scramble_global_rngs(1)
    lines = list(corpus_lines(range(3)))
    _scramble_global_rngs(2)
    assert lines == list(corpus_lines(range(3)))
    assert {"USER:", "ASSISTANT:", SYSTEM_PROMPT, "<ev_start>", "<ev_end>"} <= set(lines)
    assert set(all_answers()) <= set(lines)


def test_save_toy_tokenizer(tmp_path: object) -> None:
    from pathlib import Path

    from tokenizers import Tokenizer

    out = save_toy_tokenizer(Path(str(tmp_path)), "draft")
    loaded = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert loaded.to_str() == build_toy_tokenizer("draft").to_str()
    assert (out / "tokenizer_config.json").exists()


@pytest.mark.parametrize(("role", "model_dir"), [("target", TOY_TARGET_DIR),
                                                 ("draft", TOY_DRAFT_DIR)])
def test_toy_tokenizer_is_the_shipped_models_tokenizer(role: str, model_dir: object) -> None:
    """The corpus reads the product's prompt templates: they must still train the very
    vocabulary the shipped toy pair was trained with."""
    import json
    from pathlib import Path

    from tokenizers import Tokenizer

    shipped = Tokenizer.from_file(str(Path(str(model_dir)) / "tokenizer.json"))
    built = build_toy_tokenizer(role)  # type: ignore[arg-type]
    assert shipped.get_vocab(with_added_tokens=True) == built.get_vocab(with_added_tokens=True)
    merges = [json.loads(t.to_str())["model"]["merges"] for t in (shipped, built)]
    assert merges[0] == merges[1]
