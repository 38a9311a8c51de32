"""``--prefill-chunk slack``: the budget rule, the estimates it reads, and the flag.

The budget is checked against what the prefill queue then really cuts
(``PrefillQueue.next_pieces`` with the budget it returned), laid out as the engine
pads it (``chunk_rows_for``): the step it predicts stays within R times the plain step
unless it is the one-tile floor, it is a captured bucket, the oldest prompt advances by
at least a tile, and more slack never gives a smaller budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.cloud.live_stats import prefill_mode
from eventspec.cloud.scheduling.piece_slack import (
    BACKLOG_WAIT_MS,
    DEFAULT_SLACK_RATIO,
    SLACK_PIECE_ROWS,
    PieceSlack,
    StepTimes,
    Waiting,
)
from eventspec.cloud.scheduling.prefill_chunking import ChunkPolicy, graphed_piece_rows
from eventspec.cloud.scheduling.prefill_queue import Piece, PrefillQueue
from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.node.static.buckets import CHUNK_TILE, MAX_PIECES
from eventspec.shared.node.static.chunk_staging import chunk_rows_for

H100ISH = CloudCost(prefill_base_ms=0.0, prefill_ms_per_visual_token=0.025,
                    prefill_ms_per_text_token=0.024, step_base_ms=4.8,
                    step_ms_per_token=0.011, step_ms_per_session=0.23)


@dataclass
class _Request:
    """What the queue reads of a prefill request."""

    input_ids: list[int]
    pixel_values_videos: object | None = None


#: A waiting prompt: (length, rows already written, rows reused from a prefix, pixels).
prompts = st.lists(st.tuples(st.integers(1, 2200), st.integers(0, 2199), st.booleans(),
                             st.booleans()), min_size=1, max_size=6)


def _queue(spec: list[tuple[int, int, bool, bool]]) -> PrefillQueue:
    """A queue of prompts: a reused one has its prefix (all but at most 80 rows)
    written, an unreused one ``done`` rows (0: untouched, its tower due if pixels)."""
    queue = PrefillQueue(4096)
    for n, done, reused, pixels in spec:
        pending = queue.add(object(), _Request(list(range(n)), object() if pixels else None))  # type: ignore[arg-type]
        if reused and n > 1:
            pending.done = pending.reused = max(1, n - 1 - done % 80)
        else:
            pending.done = done % n
            if pending.done:
                pending.embeds = object()  # type: ignore[assignment]  # its first piece ran
    return queue


readings = st.lists(st.tuples(st.integers(1, 64), st.integers(0, 3),
                              st.sampled_from([0, 64, 128, 256, 384, 512]),
                              st.floats(0.5, 60.0)), max_size=12)


def _slack(ratio: float, seen: list[tuple[int, int, int, float]],
           cost: CloudCost | None = H100ISH) -> PieceSlack:
    """A policy whose estimates read ``seen``: (sessions, drafts each, piece rows, ms)
    (towers ran with the pieces of an odd ms reading's integer part)."""
    slack = PieceSlack(ratio, cost)
    for b, k, rows, ms in seen:
        towers = int(ms) % 2 if rows else 0
        slack.observe(b, b * (k + 1), [rows] if rows else [], towers, ms)
    return slack


def _cut(queue: PrefillQueue, tokens: int) -> list[Piece]:
    return queue.next_pieces(tokens, lambda ticket: True)


@settings(max_examples=200, deadline=None)
@given(spec=prompts, seen=readings, ratio=st.floats(1.01, 4.0), sessions=st.integers(1, 64),
       drafts=st.integers(0, 4))
def test_the_budget_keeps_the_ratio_fits_a_bucket_and_advances_a_tile(
        spec: list[tuple[int, int, bool, bool]], seen: list[tuple[int, int, int, float]],
        ratio: float, sessions: int, drafts: int) -> None:
    slack = _slack(ratio, seen)
    queue = _queue(spec)
    tokens = sessions * (1 + drafts)
    outlook = queue.outlook()
    heads = [(w, p) for w, p in zip(outlook, queue._waiting, strict=False) if not w.tail]
    chosen = slack.choose(sessions, tokens, outlook)
    pieces = _cut(queue, chosen.tokens)
    lengths = [p.end - p.start for p in pieces]
    towers = sum(p.tower for p in pieces)
    if sum(w.tail for w in outlook) < MAX_PIECES and heads:  # it plans what is cut
        assert (slack.padded_rows(lengths), towers) == (chosen.rows, chosen.towers)
    predicted = slack.times.predict(sessions, tokens, slack.padded_rows(lengths), towers)
    plain = slack.times.plain_ms(sessions, tokens)
    assert plain is not None
    floor = min(CHUNK_TILE, heads[0][0].rows) if heads else CHUNK_TILE
    if chosen.tokens > floor:  # not the floor: within R under its own estimates
        assert predicted is not None and predicted <= ratio * plain * (1 + 1e-9)
    if len(pieces) <= MAX_PIECES:  # a graphed step holds them: in a captured bucket
        assert chunk_rows_for(lengths, SLACK_PIECE_ROWS) in SLACK_PIECE_ROWS
    if heads:  # the oldest prompt advances by a tile (or finishes)
        head, pending = heads[0]
        first = next(p for p in pieces if p.pending is pending)
        assert first.end - first.start >= min(CHUNK_TILE, head.rows)
        assert all((p.end - p.start) % CHUNK_TILE == 0 for p in pieces if not p.finishes)


@settings(max_examples=150, deadline=None)
@given(spec=prompts, seen=readings, low=st.floats(1.01, 3.0), more=st.floats(0.0, 3.0),
       sessions=st.integers(1, 64))
def test_more_slack_never_gives_a_smaller_budget(
        spec: list[tuple[int, int, bool, bool]], seen: list[tuple[int, int, int, float]],
        low: float, more: float, sessions: int) -> None:
    outlook = _queue(spec).outlook()
    tight = _slack(low, seen).choose(sessions, sessions, outlook)
    loose = _slack(low + more, seen).choose(sessions, sessions, outlook)
    assert tight.tokens <= loose.tokens


def test_the_h100s_step_of_16_gets_384_rows_at_1_5() -> None:
    """docs/results/load-gpu.md: 13.1 ms alone, 20.9 ms with a 512-row piece (7.8 ms,
    about 15 us a row). At R = 1.5 the step may grow by 6.55 ms: 384 rows (5.85 ms)."""
    seen = [(16, 0, 0, 13.1)] * 20 + [(16, 0, 512, 20.9)] * 20
    for ratio, rows in ((1.5, 384), (2.0, 512), (1.25, 128)):
        slack = _slack(ratio, [(b, k, r, ms) for b, k, r, ms in seen])
        chosen = slack.choose(16, 16, [Waiting(2103)])
        assert (chosen.tokens, chosen.rows) == (rows, rows), ratio


def test_a_budget_that_ends_one_prompt_and_starts_the_next_fits_its_bucket() -> None:
    """100 rows left of A (two tiles) and B untouched: 512 rows are A's 100 and six
    tiles of B, 484 tokens, not 512 (which would pad to 576, no captured bucket)."""
    slack = _slack(3.0, [(16, 0, 0, 13.1)] * 20 + [(16, 0, 512, 20.9)] * 20)
    chosen = slack.choose(16, 16, [Waiting(100), Waiting(2103)])
    assert (chosen.tokens, chosen.rows) == (100 + 384, 512)


def test_a_prompts_tower_is_priced_and_unknown_it_takes_the_floor() -> None:
    seen = [(16, 0, 0, 13.1)] * 20 + [(16, 0, 512, 20.9)] * 20
    slack = _slack(1.5, seen)
    assert slack.times.tower_ms is None
    assert slack.choose(16, 16, [Waiting(2103, tower=True)]).tokens == CHUNK_TILE
    # A finishing prompt then a new one whose tower is due: the floor stops at A's end.
    assert slack.choose(16, 16, [Waiting(30), Waiting(2103, tower=True)]).tokens == 30
    for _ in range(30):  # a 64-row piece with its tower: 13.1 + 0.96 + 4.0 ms
        slack.observe(16, 16, [64], 1, 13.1 + 64 * 7.8 / 512 + 4.0)
    assert slack.times.tower_ms == pytest.approx(4.0, rel=0.01)
    # 6.55 ms of slack: the tower's 4, then 2.55 ms of rows: 128 (1.95 ms).
    assert slack.choose(16, 16, [Waiting(2103, tower=True)]).tokens == 128
    assert slack.choose(16, 16, [Waiting(2103)]).tokens == 384


def test_a_backlog_takes_the_largest_bucket() -> None:
    slack = _slack(1.5, [(16, 0, 0, 13.1)] * 20 + [(16, 0, 512, 20.9)] * 20)
    queue = [Waiting(2103), Waiting(2103, tower=True)]
    assert slack.choose(16, 16, queue, waited_ms=BACKLOG_WAIT_MS).tokens == 384
    assert slack.choose(16, 16, queue, waited_ms=BACKLOG_WAIT_MS + 1).tokens == 512


def test_without_a_cost_model_the_floor_until_steps_are_measured() -> None:
    slack = PieceSlack(1.5, None)
    assert slack.choose(4, 4, [Waiting(1000)]).tokens == CHUNK_TILE
    slack.observe(4, 4, [], 0, 10.0)
    slack.observe(4, 4, [64], 0, 11.0)  # 1/64 ms a row: 5 ms of slack holds 320
    assert slack.choose(4, 4, [Waiting(1000)]).tokens == 256


@settings(max_examples=100, deadline=None)
@given(plain=st.floats(1.0, 50.0), per_row=st.floats(0.001, 0.1), tower=st.floats(0.0, 20.0),
       rows=st.sampled_from(SLACK_PIECE_ROWS), sessions=st.integers(1, 64))
def test_the_estimates_converge_to_the_measured_times(
        plain: float, per_row: float, tower: float, rows: int, sessions: int) -> None:
    times = StepTimes(H100ISH)
    for _ in range(60):
        times.observe(sessions, sessions, 0, 0, plain)
        times.observe(sessions, sessions, rows, 0, plain + rows * per_row)
        times.observe(sessions, sessions, rows, 1, plain + rows * per_row + tower)
    assert times.plain_ms(sessions, sessions) == pytest.approx(plain, rel=1e-3)
    assert times.row_ms == pytest.approx(per_row, rel=1e-3)
    assert times.tower_ms == pytest.approx(tower, rel=1e-3, abs=1e-3)
    assert times.predict(sessions, sessions, rows, 1) == pytest.approx(
        plain + rows * per_row + tower, rel=1e-3)


@pytest.mark.parametrize("bad", [None, math.nan, math.inf, -math.inf, -1.0])
def test_a_bad_reading_is_ignored(bad: float | None) -> None:
    times = StepTimes(H100ISH)
    times.observe(16, 16, 0, 0, 13.1)
    times.observe(16, 16, 512, 0, 20.9)
    times.observe(16, 16, 64, 1, 30.0)
    before = (times.plain_ms(16, 16), times.row_ms, times.tower_ms, times.plain_ms(2, 2))
    for rows, towers in ((0, 0), (512, 0), (64, 1)):
        assert not times.observe(16, 16, rows, towers, bad)
    assert (times.plain_ms(16, 16), times.row_ms, times.tower_ms,
            times.plain_ms(2, 2)) == before
    with pytest.raises(ValueError, match="cannot start 1 towers"):
        times.observe(16, 16, 0, 1, 5.0)


def test_a_shape_never_measured_follows_the_measured_over_the_model() -> None:
    """Plain steps at 16 sessions run at twice the model: a step of 8, never measured,
    is expected at twice its model too (the seed follows the device)."""
    times = StepTimes(H100ISH)
    assert times.plain_ms(8, 8) == pytest.approx(H100ISH.batch_step_ms(8, 8))
    for _ in range(40):
        times.observe(16, 16, 0, 0, 2 * H100ISH.batch_step_ms(16, 16))
    assert times.plain_ms(8, 8) == pytest.approx(2 * H100ISH.batch_step_ms(8, 8), rel=1e-3)
    # Before any mixed step, rows cost the calibrated whole-prompt rate (a high guess).
    assert times.row_ms == H100ISH.prefill_ms_per_visual_token


def test_steps_the_engine_runs_eagerly_are_not_read() -> None:
    slack = PieceSlack(1.5, H100ISH)
    assert not slack.observe(16, 16, [10] * (MAX_PIECES + 1), 0, 50.0)
    assert not slack.observe(16, 16, [600], 0, 50.0)
    assert not slack.observe(16, 16 * 12, [64], 0, 50.0, widest=12)
    assert slack.times.row_ms == H100ISH.prefill_ms_per_visual_token
    assert slack.observe(16, 16, [100, 30], 0, 20.0)  # three tiles: the 256 bucket


@pytest.mark.parametrize("text, ratio", [("slack", DEFAULT_SLACK_RATIO), ("SLACK:2", 2.0),
                                         (" slack:1.25 ", 1.25)])
def test_the_slack_flag_parses(text: str, ratio: float) -> None:
    assert ChunkPolicy.parse(text) == ChunkPolicy("slack", ratio=ratio)
    assert graphed_piece_rows(ChunkPolicy.parse(text), 4096) == SLACK_PIECE_ROWS
    assert graphed_piece_rows(ChunkPolicy.parse(text), 300) == (64, 128, 256)
    assert prefill_mode(ChunkPolicy.parse(text)) == f"chunks: slack {ratio:g}"
    assert ChunkPolicy.parse(text).budget(H100ISH, 16, 16, 2048) == CHUNK_TILE  # stateless


@pytest.mark.parametrize("text", ["slack:1", "slack:0.5", "slack:-2", "slack:", "slack:x",
                                  "slack:nan", "slack:inf", "slack:1.5:2"])
def test_a_bad_slack_ratio_names_the_flag(text: str) -> None:
    with pytest.raises(ValueError, match="--prefill-chunk slack:R needs a step-time ratio R > 1"):
        ChunkPolicy.parse(text)
    with pytest.raises(ValueError, match="R > 1"):
        PieceSlack(1.0, None)
