"""``--prefill-chunk slack``: the budget rule, the estimates it reads, and the flag.

The budget is checked against what the prefill queue then really cuts
(``PrefillQueue.next_pieces`` with the budget it returned), laid out as the engine
pads it (``chunk_rows_for``): the step it predicts stays within R times the plain step
unless it is the one-tile floor, it is a captured bucket, the oldest prompt advances by
at least a tile, and more slack never gives a smaller budget. The pace: the smallest
bucket that writes every prompt by its deadline, and a stream of prompts paced has
steps more alike than one filled to R.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.cloud.live_stats import prefill_mode
from eventspec.cloud.scheduling.piece_slack import (
    BACKLOG_WAIT_MS,
    DEFAULT_PACE_MS,
    DEFAULT_SLACK_RATIO,
    LATE_GRACE,
    PACED_BACKLOG,
    SLACK_PIECE_ROWS,
    PieceSlack,
    StepTimes,
    Waiting,
    split,
)
from eventspec.cloud.scheduling.prefill_chunking import (
    ChunkPolicy,
    graphed_piece_rows,
    slack_for,
)
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
           cost: CloudCost | None = H100ISH, pace_ms: float = DEFAULT_PACE_MS) -> PieceSlack:
    """A policy whose estimates read ``seen``: (sessions, drafts each, piece rows, ms)
    (towers ran with the pieces of an odd ms reading's integer part)."""
    slack = PieceSlack(ratio, cost, pace_ms=pace_ms)
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
        slack = _slack(ratio, [(b, k, r, ms) for b, k, r, ms in seen], pace_ms=0)
        chosen = slack.choose(16, 16, [Waiting(2103)])
        assert (chosen.tokens, chosen.rows) == (rows, rows), ratio


def test_a_budget_that_ends_one_prompt_and_starts_the_next_fits_its_bucket() -> None:
    """100 rows left of A (two tiles) and B untouched: 512 rows are A's 100 and six
    tiles of B, 484 tokens, not 512 (which would pad to 576, no captured bucket)."""
    slack = _slack(3.0, [(16, 0, 0, 13.1)] * 20 + [(16, 0, 512, 20.9)] * 20, pace_ms=0)
    chosen = slack.choose(16, 16, [Waiting(100), Waiting(2103)])
    assert (chosen.tokens, chosen.rows) == (100 + 384, 512)


def test_a_prompts_tower_is_priced_and_unknown_it_takes_the_floor() -> None:
    seen = [(16, 0, 0, 13.1)] * 20 + [(16, 0, 512, 20.9)] * 20
    slack = _slack(1.5, seen, pace_ms=0)
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
    slack = _slack(1.5, [(16, 0, 0, 13.1)] * 20 + [(16, 0, 512, 20.9)] * 20, pace_ms=0)
    queue = [Waiting(2103), Waiting(2103, tower=True)]
    assert slack.choose(16, 16, queue, waited_ms=BACKLOG_WAIT_MS).tokens == 384
    assert slack.choose(16, 16, queue, waited_ms=BACKLOG_WAIT_MS + 1).tokens == 512


def test_with_pacing_the_backlog_bound_is_two_paces() -> None:
    """A prompt late for its pace gets R's bucket (384), the largest only past 400 ms."""
    slack = _slack(1.5, H100_STEPS)
    assert slack.backlog_bound_ms == PACED_BACKLOG * DEFAULT_PACE_MS == 400.0
    late = [Waiting(2103, waited_ms=300.0)]
    assert slack.choose(16, 16, late, waited_ms=300.0).tokens == 384
    assert slack.choose(16, 16, late, waited_ms=401.0).tokens == 512
    assert _slack(1.5, H100_STEPS, pace_ms=50.0).backlog_bound_ms == BACKLOG_WAIT_MS


@settings(max_examples=150, deadline=None)
@given(spec=prompts, seen=readings, ratio=st.floats(1.01, 4.0), sessions=st.integers(1, 64),
       wait=st.floats(0.0, 300.0), more=st.floats(0.0, 300.0))
def test_a_longer_wait_never_gives_a_smaller_budget(
        spec: list[tuple[int, int, bool, bool]], seen: list[tuple[int, int, int, float]],
        ratio: float, sessions: int, wait: float, more: float) -> None:
    """Every prompt waited ``more`` ms longer: the pieces never shrink (no oscillation
    between a big piece and a small one as a prompt's deadline nears)."""
    slack = _slack(ratio, seen)
    outlook = _queue(spec).outlook()

    def aged(by: float) -> list[Waiting]:
        return [Waiting(w.rows, w.tower, w.tail, by) for w in outlook]

    sooner = slack.choose(sessions, sessions, aged(wait), waited_ms=wait)
    later = slack.choose(sessions, sessions, aged(wait + more), waited_ms=wait + more)
    assert sooner.tokens <= later.tokens


def test_without_a_cost_model_the_floor_until_steps_are_measured() -> None:
    slack = PieceSlack(1.5, None, pace_ms=0)
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
    with pytest.raises(ValueError, match="cannot have 0 piece rows or -1 towers"):
        times.observe(16, 16, 0, -1, 5.0)


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


@pytest.mark.parametrize("text, ratio, pace", [
    ("slack", DEFAULT_SLACK_RATIO, DEFAULT_PACE_MS), ("SLACK:2", 2.0, DEFAULT_PACE_MS),
    (" slack:1.25 ", 1.25, DEFAULT_PACE_MS), ("slack:1.5:120", 1.5, 120.0),
    ("slack:3:0", 3.0, 0.0)])
def test_the_slack_flag_parses(text: str, ratio: float, pace: float) -> None:
    assert ChunkPolicy.parse(text) == ChunkPolicy("slack", ratio=ratio, pace_ms=pace)
    assert graphed_piece_rows(ChunkPolicy.parse(text), 4096) == SLACK_PIECE_ROWS
    assert graphed_piece_rows(ChunkPolicy.parse(text), 300) == (64, 128, 256)
    paced = f", pace {pace:g} ms" if pace else ", no pace"
    assert prefill_mode(ChunkPolicy.parse(text)) == f"chunks: slack {ratio:g}{paced}"
    assert ChunkPolicy.parse(text).budget(H100ISH, 16, 16, 2048) == CHUNK_TILE  # stateless
    made = slack_for(ChunkPolicy.parse(text), H100ISH, 4096, 4096)
    assert made is not None and (made.ratio, made.pace_ms) == (ratio, pace)


@pytest.mark.parametrize("text", ["slack:1", "slack:0.5", "slack:-2", "slack:", "slack:x",
                                  "slack:nan", "slack:inf", "slack::200"])
def test_a_bad_slack_ratio_names_the_flag(text: str) -> None:
    with pytest.raises(ValueError, match="--prefill-chunk slack:R needs a step-time ratio R > 1"):
        ChunkPolicy.parse(text)
    with pytest.raises(ValueError, match="R > 1"):
        PieceSlack(1.0, None)


@pytest.mark.parametrize("text", ["slack:1.5:-1", "slack:1.5:nan", "slack:1.5:inf",
                                  "slack:1.5:", "slack:1.5:soon"])
def test_a_bad_pace_names_the_flag(text: str) -> None:
    with pytest.raises(ValueError, match="--prefill-chunk slack:R:PACE needs a pace"):
        ChunkPolicy.parse(text)
    with pytest.raises(ValueError, match="PACE >= 0"):
        PieceSlack(1.5, None, pace_ms=-1.0)


def test_more_than_r_and_the_pace_names_the_flag() -> None:
    with pytest.raises(ValueError, match="at most R and PACE"):
        ChunkPolicy.parse("slack:1.5:200:9")


#: The H100's step of 16 (docs/results/load-gpu.md): 13.1 ms alone, 20.9 with 512 rows.
H100_STEPS = [(16, 0, 0, 13.1)] * 20 + [(16, 0, 512, 20.9)] * 20


def test_a_fresh_prompt_is_paced_to_the_smallest_bucket_that_meets_its_deadline() -> None:
    """At 200 ms: 128 rows a step (15.05 ms) write 13 x 128 = 1,664 rows in time, short
    of 2,103's 2,112; 256 rows (17.0 ms) write 11 x 256 = 2,816. Filled to R it would
    be 384 rows; pacing off, it is."""
    slack = _slack(1.5, H100_STEPS)
    assert slack.choose(16, 16, [Waiting(2103)]).tokens == 256
    assert _slack(1.5, H100_STEPS, pace_ms=0).choose(16, 16, [Waiting(2103)]).tokens == 384
    # A prompt of 800 rows needs less: 64 rows a step (14.1 ms) write 14 x 64 = 896.
    assert slack.choose(16, 16, [Waiting(800)]).tokens == 64


def test_the_pace_grows_with_the_wait_and_the_queue_and_stops_at_r() -> None:
    slack = _slack(1.5, H100_STEPS)
    waits = [slack.choose(16, 16, [Waiting(2103, waited_ms=w)]).tokens
             for w in (0.0, 60.0, 120.0, 199.0)]
    assert waits == sorted(waits) and waits[0] < waits[-1] == 384  # R's bucket, not 512
    one = slack.choose(16, 16, [Waiting(2103)]).tokens
    two = slack.choose(16, 16, [Waiting(2103), Waiting(2103)]).tokens
    assert one < two <= 384


def test_a_tower_due_on_the_way_takes_its_time_from_the_deadline() -> None:
    slack = _slack(3.0, H100_STEPS)
    for _ in range(30):  # a 64-row piece with its tower: 4.0 ms of tower
        slack.observe(16, 16, [64], 1, 13.1 + 64 * 7.8 / 512 + 4.0)
    # 87 ms left: five 256-row steps (17.0 ms each) write 1,200 rows' 19 tiles; less
    # the tower's 4 ms, four do not, and 384 rows a step are needed.
    plain = slack.choose(16, 16, [Waiting(1200, waited_ms=113.0)]).tokens
    towered = slack.choose(16, 16, [Waiting(1200, tower=True, waited_ms=113.0)]).tokens
    assert (plain, towered) == (256, 384)


@settings(max_examples=150, deadline=None)
@given(spec=prompts, seen=readings, ratio=st.floats(1.01, 4.0), sessions=st.integers(1, 64),
       wait=st.floats(0.0, 300.0), beside=st.integers(1, 2), pace=st.sampled_from([0.0, 200.0]))
def test_a_tower_beside_never_gives_a_larger_budget(
        spec: list[tuple[int, int, bool, bool]], seen: list[tuple[int, int, int, float]],
        ratio: float, sessions: int, wait: float, beside: int, pace: float) -> None:
    slack = _slack(ratio, seen, pace_ms=pace)
    outlook = [Waiting(w.rows, False, w.tail, wait) for w in _queue(spec).outlook()]
    alone = slack.choose(sessions, sessions, outlook, waited_ms=wait)
    with_tower = slack.choose(sessions, sessions, outlook, waited_ms=wait, beside=beside)
    assert with_tower.tokens <= alone.tokens


def test_a_late_prompt_is_paced_to_a_quarter_pace_not_to_rs_bucket() -> None:
    """300 rows left, 250 ms waited (the pace was 200): a quarter pace (50 ms) holds
    three 128-row steps (15.05 ms), which write them; R's bucket would be 384."""
    slack = _slack(1.5, H100_STEPS)
    assert slack.choose(16, 16, [Waiting(300, waited_ms=250.0)], waited_ms=250.0).tokens == 128
    assert slack.choose(16, 16, [Waiting(2103, waited_ms=250.0)], waited_ms=250.0).tokens == 384


def test_a_tower_beside_a_paced_step_takes_the_place_of_piece_rows() -> None:
    """60 ms waited at R = 3: 384 rows a step (18.95 ms) meet the pace. A tower of
    3.5 ms beside the step: 128 rows (15.05 + 3.5 = 18.55 ms) fit in the paced step's
    time, 256 (20.5) do not. Two towers: not even 64 rows (21.1) fit: the floor."""
    slack = _slack(3.0, H100_STEPS)
    for _ in range(40):  # a 64-row piece with its tower: 3.5 ms of tower
        slack.observe(16, 16, [64], 1, 13.1 + 64 * 7.8 / 512 + 3.5)
    queue = [Waiting(2103, waited_ms=60.0)]
    assert slack.choose(16, 16, queue, waited_ms=60.0).tokens == 384
    assert slack.choose(16, 16, queue, waited_ms=60.0, beside=1).tokens == 128
    assert slack.choose(16, 16, queue, waited_ms=60.0, beside=2).tokens == CHUNK_TILE
    # Unknown, a tower beside takes the floor, as one in the step does.
    fresh = _slack(3.0, H100_STEPS)
    assert fresh.choose(16, 16, queue, waited_ms=60.0, beside=1).tokens == CHUNK_TILE


@settings(max_examples=200, deadline=None)
@given(spec=prompts, seen=readings, ratio=st.floats(1.01, 4.0), sessions=st.integers(1, 64),
       pace=st.floats(1.0, 1000.0), waits=st.lists(st.floats(0.0, 400.0), min_size=6,
                                                    max_size=6))
def test_a_paced_budget_meets_every_deadline_and_no_smaller_bucket_does(
        spec: list[tuple[int, int, bool, bool]], seen: list[tuple[int, int, int, float]],
        ratio: float, sessions: int, pace: float, waits: list[float]) -> None:
    """Against the greedy rule (pace off): a paced choice is never larger; when it is
    smaller, its rate writes each prompt (and those before it) by its deadline in
    steps of its predicted time, and the bucket below it does not."""
    slack = _slack(ratio, seen, pace_ms=pace)
    greedy = _slack(ratio, seen, pace_ms=0)
    outlook = [Waiting(w.rows, w.tower, w.tail, waited)
               for w, waited in zip(sorted(_queue(spec).outlook(), key=lambda w: w.tail),
                                    sorted(waits, reverse=True), strict=False)]
    chosen = slack.choose(sessions, sessions, outlook)
    filled = greedy.choose(sessions, sessions, outlook)
    assert chosen.rows <= filled.rows
    if chosen.rows == filled.rows:
        return

    def in_time(rows: int) -> bool:
        step_ms = slack.times.predict(sessions, sessions, rows, 0)
        assert step_ms is not None and step_ms > 0
        tower_ms = slack.times.tower_ms or 0.0
        written = sum(-(-w.rows // CHUNK_TILE) for w in outlook if w.tail) * CHUNK_TILE
        towers = 0
        for w in (w for w in outlook if not w.tail and w.rows > 0):
            written += -(-w.rows // CHUNK_TILE) * CHUNK_TILE
            towers += w.tower
            left = max(pace - w.waited_ms, LATE_GRACE * pace) - towers * tower_ms
            steps = math.floor(max(0.0, left) / step_ms)
            if written > rows * steps:
                return False
        return True

    assert in_time(chosen.rows)
    floor = min(CHUNK_TILE, next((w.rows for w in outlook if not w.tail), CHUNK_TILE))
    below = [b for b in SLACK_PIECE_ROWS if b < chosen.rows
             and split(outlook, b // CHUNK_TILE).tokens >= floor]  # it advances the head
    if below:
        assert not in_time(below[-1])


def _stream(slack: PieceSlack, every_ms: float, prompts: int) -> tuple[list[float], list[float]]:
    """Prompts of 2,103 rows arriving every ``every_ms`` beside 16 decoding sessions on
    a device that runs exactly as the estimates say, a step after another (plain when
    no prompt waits): each step's ms and each prompt's time from arrival to its last
    row."""
    arrivals = [i * every_ms for i in range(prompts)]
    left = [2103] * prompts
    now, steps, done = 0.0, [], []
    while len(done) < prompts:
        queue = [Waiting(left[i], waited_ms=now - arrivals[i])
                 for i in range(len(done), prompts) if arrivals[i] <= now][:MAX_PIECES]
        rows, budget = 0, 0
        if queue:
            chosen = slack.choose(16, 16, queue, waited_ms=queue[0].waited_ms)
            rows, budget = chosen.rows, chosen.tokens
        ms = slack.times.predict(16, 16, rows, 0)
        assert ms is not None
        now += ms
        steps.append(ms)
        for i in range(len(done), len(done) + len(queue)):
            take = min(left[i], budget)
            left[i], budget = left[i] - take, budget - take
        while len(done) < prompts and left[len(done)] == 0:
            done.append(now - arrivals[len(done)])
    return steps, done


def test_a_paced_stream_has_steps_more_alike_than_one_filled_to_r() -> None:
    """One prompt every 300 ms on the H100's times: filled to R, steps alternate between
    384-row pieces and none (the median a plain step); paced, the median step carries a
    piece and the slowest is no slower, and every prompt is written within the pace."""
    paced, paced_done = _stream(_slack(1.5, H100_STEPS), 300.0, 12)
    filled, filled_done = _stream(_slack(1.5, H100_STEPS, pace_ms=0), 300.0, 12)

    def spread(ms: list[float]) -> float:
        ordered = sorted(ms)
        return ordered[-1] / ordered[len(ordered) // 2]

    assert spread(paced) < spread(filled)
    assert max(paced) <= max(filled)
    assert max(paced_done) <= DEFAULT_PACE_MS + max(paced)
    assert max(filled_done) < max(paced_done)  # what pacing spends: time to the first token


def test_the_outlook_says_how_long_each_prompt_has_waited() -> None:
    queue = PrefillQueue(4096)
    for submitted in (10.0, 10.25, 10.5):
        queue.add(SimpleNamespace(submitted_at=submitted),  # type: ignore[arg-type]
                  _Request(list(range(300))))  # type: ignore[arg-type]
    assert [w.waited_ms for w in queue.outlook(10.5)] == [500.0, 250.0, 0.0]
    assert [w.waited_ms for w in queue.outlook()] == [0.0, 0.0, 0.0]
