"""``--prefill-chunk slack``: prompt pieces sized by the step's measured slack.

Why: a mixed step (Sarathi-Serve's stall-free batching, Agrawal et al., OSDI 2024)
carries a prompt piece through the decoding sessions' forward, and a session's time
between tokens is that step's time. With fixed 512-row pieces a step of 16 sessions took
13.1 ms alone and 20.9 ms with a piece on an H100, so ITL p99 / p50 was 2.24 at 8
requests/s; 256-row pieces brought it to 1.56 and lost capacity (TTFT p99 over 1 s at
8/s; docs/results/load-gpu.md). What a step can carry without slowing by more than R
times depends on the step: (R - 1) x its own time. So the piece follows the step, as
Sarathi-Serve's token budget does, set from the device times the engine loop measures
rather than from a profile.

The rule, each iteration while sessions decode, has three layers:

1. **Pace.** The smallest captured bucket ``b`` of piece rows
   (:data:`SLACK_PIECE_ROWS`) whose steady rate writes every waiting prompt within
   ``pace`` ms (:data:`DEFAULT_PACE_MS`) of its submission: for each waiting prompt
   ``i``, oldest first, the rows of it and of those before it fit ``b`` rows a step
   over the steps left before its deadline, a step taking the predicted time of one
   with ``b`` rows. Why: the ratio that matters to a decoding session is its slow
   steps against its typical one, and a policy that fills each step to the limit
   (layer 2 alone) makes steps alternate between full pieces and none, so the median
   is a plain step and the tail a full one. Paced pieces are as small as the arrivals
   allow and ride most steps, so a step with a piece and the typical step are alike
   (the time-to-first-token is spent up to the pace instead). The same idea as a
   constant-rate feasibility test in real-time scheduling (Liu and Layland, JACM 1973):
   the least uniform rate that meets every deadline.
2. **Slack.** A paced bucket beyond the largest one with

       predicted(step with the pieces of b) <= R x predicted(step without)

   is cut to that one (R: ``--prefill-chunk slack:R``), and with pacing off
   (``slack:R:0``) that largest bucket is the rule. The step without is the plain
   step's device time at this shape and the step with adds the pieces' rows times the
   marginal ms per row and, for each prompt whose first piece the iteration writes, its
   video tower (which runs in the same iteration, inside the timed engine call, unless
   towers run ahead: ``PrefillCalls.chunks_of`` makes a prompt's embeddings at its
   first piece). With towers ahead (``--towers-ahead``, the default) a prompt's tower
   runs on the side stream beside the step it is started after, and slows that step
   about as much as inside it (both fill the GPU): the step is priced with the towers
   the loop will start beside it (``beside``; ``tower_ms`` learned from the steps they
   ran beside), so its piece shrinks by the tower's time.
   A prompt late for its pace is paced to finish within a quarter pace from now
   (:data:`LATE_GRACE`); when even that fails, that largest bucket. A paced step with
   a tower beside it (below) takes the largest smaller bucket whose step with the
   tower is predicted within the paced step's time without it: the tower takes the
   place of piece rows, which the pace then spreads over the next steps.
3. **Backlog.** When the oldest waiting prompt has waited more than
   :data:`BACKLOG_WAIT_MS`, or :data:`PACED_BACKLOG` paces when pacing, the pieces
   take the largest bucket whatever the ratio (capacity before smoothness, see the
   constant).

The pieces are laid out as the engine pads them, each in whole 64-row tiles
(:func:`split`): a budget that ends one prompt and starts the next is cut so both fit
``b``'s tiles, so no bucket beyond the largest is needed. The floor is one tile (a
prompt always advances, whatever the estimates say); a step that would start a tower
before any tower has been measured takes the floor.

The estimates (:class:`StepTimes`) are EWMAs of measured device times, seeded from the
calibrated :class:`CloudCost` before anything is measured. Plain, pure and single
threaded: the engine thread asks for budgets and reports times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.node.static.buckets import (
    CHUNK_TILE,
    MAX_PIECES,
    MIXED_MAX_TOKENS,
    SESSION_BUCKETS,
    TOKEN_BUCKETS,
    bucket,
)

#: The piece-row buckets slack chooses from, and the engine captures mixed-step graphs
#: for: five, against three for ``--prefill-chunk 512`` (64, 512 and 576), so two more
#: graphs per (sessions, tokens) step shape: 70 more at 64 slots (35 shapes). Steps
#: alone cost about 5 ms at one session and 13 ms at 16 on an H100, and a row about 15
#: us, so at R = 1.5 the budget runs from about 128 to 512 rows; 64 is the floor.
SLACK_PIECE_ROWS: tuple[int, ...] = (64, 128, 256, 384, 512)
#: ``--prefill-chunk slack``'s R: a step with a piece within 1.5 x one without.
DEFAULT_SLACK_RATIO = 1.5
#: Weight of a new reading in every estimate: the last few steps of a shape dominate,
#: so a change of load (other work on the device, longer contexts) is followed within
#: about five steps, and one outlier moves an estimate by a quarter of its error.
EWMA_WEIGHT = 0.25
#: Capacity guard: when the oldest waiting prompt has waited this long, pieces take the
#: largest bucket, as ``--prefill-chunk 512`` does. A 2,103-token prompt takes six
#: 384-row pieces, about 120 ms at 16 sessions on the H100's step times (an estimate,
#: not a run); a wait twice that means prompts queue faster than slack pieces drain
#: them, and the TTFT SLO (p99 <= 1 s) is what breaks next (256-row pieces broke it at
#: 8/s there). ITL then degrades to 512's.
BACKLOG_WAIT_MS = 250.0
#: ``--prefill-chunk slack``'s pace: paced pieces aim to write each prompt within this
#: many ms of its submission. Below the backlog bound, so a prompt paced to its
#: deadline that runs a little late (a slow step, an estimate off) is not yet a
#: backlog; far below the 1 s TTFT SLO, which also holds the wait for a slot and the
#: first token's step.
DEFAULT_PACE_MS = 200.0
#: With pacing, the backlog bound is this many paces (400 ms at the default): a prompt
#: late for its pace is paced to :data:`LATE_GRACE`, gets R's bucket when that fails,
#: and the largest of all only once it is this late, so a burst of arrivals grows the
#: pieces a bucket at a time first.
PACED_BACKLOG = 2.0
#: A prompt late for its pace (or nearly) is paced to finish within this many paces
#: from now (100 ms at the default) rather than at once: lateness from a slow step or
#: an estimate a little off then grows its pieces by a bucket or so, instead of taking
#: R's bucket, the largest step of all (what the ITL tail was made of on the H200).
LATE_GRACE = 0.25


@dataclass(frozen=True)
class Waiting:
    """A waiting prompt as the budget sees it: rows still to write, whether its next
    piece runs the video tower (its first, with pixels to encode), whether it is a
    reused prefix's short tail (rides whole, outside the budget: ``PrefillQueue``), and
    how long ago its request was submitted (the pace's deadline counts from there)."""

    rows: int
    tower: bool = False
    tail: bool = False
    waited_ms: float = 0.0


@dataclass(frozen=True)
class Split:
    """What a budget writes: ``tokens`` for ``PrefillQueue.next_pieces`` (tails not
    counted), ``rows`` the pieces take padded to whole tiles (tails counted), and
    ``towers`` how many prompts it starts with a tower."""

    tokens: int
    rows: int
    towers: int


def tiles(rows: int) -> int:
    """Whole 64-row tiles a piece of ``rows`` rows takes."""
    return -(-rows // CHUNK_TILE)


def split(queue: Sequence[Waiting], max_tiles: int) -> Split:
    """The largest split of ``queue`` (oldest first) into ``max_tiles`` tiles, as
    ``next_pieces`` cuts it: the tails whole, then whole prompts while they fit, then
    as many whole tiles of the next as are left; at most :data:`MAX_PIECES` pieces (a
    graphed step's limit)."""
    used = sum(tiles(w.rows) for w in queue if w.tail)
    pieces = sum(1 for w in queue if w.tail)
    tokens = towers = 0
    for w in queue:
        room = max_tiles - used
        if w.tail or w.rows < 1:
            continue
        if room <= 0 or pieces >= MAX_PIECES:
            break
        take = min(w.rows, room * CHUNK_TILE)
        tokens, used, pieces = tokens + take, used + tiles(take), pieces + 1
        towers += w.tower
        if take < w.rows:
            break
    return Split(tokens, used * CHUNK_TILE, towers)


def _usable(ms: float | None) -> bool:
    return ms is not None and math.isfinite(ms) and ms >= 0


class StepTimes:
    """Online estimates of device ms: the plain step per shape (sessions bucket, tokens
    per session bucket: the static engine's padded shapes), the marginal ms per piece
    row, and the tower's ms per prompt. Before any reading: the cost model's step (times
    the measured / modelled ratio of the plain steps read so far, once there are some)
    and its prefill ms per prompt row (the larger of visual and text: a whole prompt's
    rate, tower included, so a high guess: pieces start small); the tower is unknown."""

    def __init__(self, cost: CloudCost | None, *, weight: float = EWMA_WEIGHT) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"the estimates' weight must be in (0, 1], got {weight}")
        self.cost = cost
        self.weight = weight
        self._plain: dict[tuple[int, int], float] = {}
        self._scale: float | None = None  # measured / modelled plain steps
        per_row = 0.0 if cost is None else max(cost.prefill_ms_per_visual_token,
                                               cost.prefill_ms_per_text_token)
        self.row_ms: float | None = per_row if per_row > 0 else None
        self.tower_ms: float | None = None

    @staticmethod
    def shape(sessions: int, tokens: int) -> tuple[int, int]:
        """The estimate's key for a step of ``sessions`` feeding ``tokens`` in all."""
        s = max(1, sessions)
        width = -(-max(tokens, s) // s)  # tokens per session, rounded up
        return bucket(s, SESSION_BUCKETS) or s, bucket(width, TOKEN_BUCKETS) or width

    def _ewma(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.weight * (new - old)

    def plain_ms(self, sessions: int, tokens: int) -> float | None:
        """A step without pieces at this shape (None: nothing measured, no cost model)."""
        measured = self._plain.get(self.shape(sessions, tokens))
        if measured is not None:
            return measured
        if self.cost is None:
            return None
        return self.cost.batch_step_ms(sessions, tokens) * (self._scale or 1.0)

    def predict(self, sessions: int, tokens: int, rows: int, towers: int) -> float | None:
        """A step with ``rows`` padded piece rows starting ``towers`` towers (None:
        a term it needs is not known yet)."""
        plain = self.plain_ms(sessions, tokens)
        if plain is None or (rows and self.row_ms is None) or (towers and self.tower_ms is None):
            return None
        return plain + rows * (self.row_ms or 0.0) + towers * (self.tower_ms or 0.0)

    def observe(self, sessions: int, tokens: int, rows: int, towers: int,
                ms: float | None) -> bool:
        """One step's device time (None, NaN, infinite or negative: ignored). A plain
        step (no ``rows``, no ``towers``) updates its shape; any other, what it took
        beyond the plain estimate: per row when no tower ran in it or beside it, else
        per tower after the rows' share. Returns whether the reading was used."""
        if rows < 0 or towers < 0:
            raise ValueError(f"a step cannot have {rows} piece rows or {towers} towers")
        if not _usable(ms):
            return False
        assert ms is not None
        if rows == 0 and towers == 0:
            key = self.shape(sessions, tokens)
            self._plain[key] = self._ewma(self._plain.get(key), ms)
            modelled = 0.0 if self.cost is None else self.cost.batch_step_ms(sessions, tokens)
            if modelled > 0:
                self._scale = self._ewma(self._scale, ms / modelled)
            return True
        plain = self.plain_ms(sessions, tokens)
        if plain is None:
            return False
        extra = ms - plain
        if towers == 0:
            self.row_ms = self._ewma(self.row_ms, max(0.0, extra) / rows)
        else:
            rest = extra - rows * (self.row_ms or 0.0)
            self.tower_ms = self._ewma(self.tower_ms, max(0.0, rest) / towers)
        return True


class PieceSlack:
    """The slack policy's state: R, the pace, the buckets and the estimates (module
    docstring); ``pace_ms`` 0 turns pacing off."""

    def __init__(self, ratio: float, cost: CloudCost | None, *,
                 buckets: Sequence[int] = SLACK_PIECE_ROWS, weight: float = EWMA_WEIGHT,
                 backlog_ms: float = BACKLOG_WAIT_MS,
                 pace_ms: float = DEFAULT_PACE_MS) -> None:
        if not (math.isfinite(ratio) and ratio > 1):
            raise ValueError(f"--prefill-chunk slack:R needs a finite R > 1, got {ratio}")
        if not (math.isfinite(pace_ms) and pace_ms >= 0):
            raise ValueError(f"--prefill-chunk slack:R:PACE needs a finite PACE >= 0 ms, "
                             f"got {pace_ms}")
        self.pace_ms = pace_ms
        if any(b < CHUNK_TILE or b % CHUNK_TILE for b in buckets):
            raise ValueError(f"slack buckets must be multiples of {CHUNK_TILE}, got {buckets}")
        self.ratio = ratio
        self.buckets = tuple(sorted(set(buckets)))
        self.backlog_ms = backlog_ms
        self.times = StepTimes(cost, weight=weight)

    def padded_rows(self, lengths: Sequence[int]) -> int:
        """Rows pieces of ``lengths`` take in the engine: whole tiles, up to a bucket."""
        rows = sum(tiles(n) for n in lengths) * CHUNK_TILE
        return bucket(rows, self.buckets) or rows

    def choose(self, sessions: int, tokens: int, queue: Sequence[Waiting], *,
               waited_ms: float = 0.0, beside: int = 0) -> Split:
        """This iteration's split for a step of ``sessions`` feeding ``tokens`` (the
        module docstring's rule); ``waited_ms``: how long the oldest prompt has waited;
        ``beside``: towers that will run on the side stream beside the step (towers
        ahead), priced like towers in it."""
        floor = self._floor(queue)
        if not self.buckets:
            return floor
        if waited_ms > self.backlog_bound_ms:
            top = self._split(queue, self.buckets[-1] // CHUNK_TILE)
            return top if top.tokens >= floor.tokens else floor
        within = self._within_ratio(sessions, tokens, queue, floor, beside)
        if within is None:
            return floor
        smaller = [s for s in (self._split(queue, b // CHUNK_TILE) for b in self.buckets
                               if b < within.rows) if s.tokens >= floor.tokens]
        for i, s in enumerate(smaller if self.pace_ms > 0 else ()):
            if self._meets_pace(sessions, tokens, queue, s.rows):
                return self._make_room(sessions, tokens, [floor, *smaller[:i + 1]], beside)
        return within

    def _make_room(self, sessions: int, tokens: int, splits: Sequence[Split],
                   beside: int) -> Split:
        """The paced split (``splits[-1]``, the smaller ones before it, the floor first)
        with ``beside`` towers beside its step: the largest whose step with them is
        predicted within the paced step's time without them, so a tower takes the
        place of piece rows rather than making the step it runs beside the slowest (the
        rows it displaces are paced over the next steps); the floor if none is."""
        paced = splits[-1]
        target = self.times.predict(sessions, tokens, paced.rows, paced.towers)
        if not beside or target is None:
            return paced
        for s in reversed(splits):
            ms = self.times.predict(sessions, tokens, s.rows, s.towers + beside)
            if ms is not None and ms <= target:
                return s
        return splits[0]

    @property
    def backlog_bound_ms(self) -> float:
        """The oldest prompt's wait beyond which pieces take the largest bucket:
        ``backlog_ms``, or :data:`PACED_BACKLOG` times the pace when pacing, whichever
        is longer."""
        return max(self.backlog_ms, PACED_BACKLOG * self.pace_ms)

    def _within_ratio(self, sessions: int, tokens: int, queue: Sequence[Waiting],
                      floor: Split, beside: int = 0) -> Split | None:
        """The largest bucket's split whose predicted step, with ``beside`` towers
        beside it, stays within R times the plain one (None: none, or nothing known to
        predict with)."""
        limit = self.times.plain_ms(sessions, tokens)
        for b in reversed(self.buckets):
            s = self._split(queue, b // CHUNK_TILE)
            if s.tokens < floor.tokens:
                break
            ms = self.times.predict(sessions, tokens, s.rows, s.towers + beside)
            if limit is not None and ms is not None and ms <= self.ratio * limit:
                return s
        return None

    def _meets_pace(self, sessions: int, tokens: int, queue: Sequence[Waiting],
                    rows: int) -> bool:
        """Whether ``rows`` padded rows a step write every waiting prompt within the
        pace of its submission: for each, oldest first, its rows and those before it
        (and this step's tails) fit in the steps of ``rows`` rows left before its
        deadline (at least :data:`LATE_GRACE` paces), less the towers due up to it when
        their time is known."""
        step_ms = self.times.predict(sessions, tokens, rows, 0)
        if step_ms is None or not step_ms > 0:
            return False
        tower_ms = self.times.tower_ms or 0.0
        written = sum(tiles(w.rows) for w in queue if w.tail) * CHUNK_TILE
        towers = 0
        for w in queue:
            if w.tail or w.rows < 1:
                continue
            written += tiles(w.rows) * CHUNK_TILE
            towers += w.tower
            left_ms = max(self.pace_ms - w.waited_ms, LATE_GRACE * self.pace_ms)
            left_ms -= towers * tower_ms
            if written > rows * math.floor(max(0.0, left_ms) / step_ms):
                return False
        return True

    def _floor(self, queue: Sequence[Waiting]) -> Split:
        """One tile of the oldest prompt (or its rest, if shorter), beside the tails."""
        head = next((w for w in queue if not w.tail and w.rows > 0), None)
        tail_tiles = sum(tiles(w.rows) for w in queue if w.tail)
        rows = (tail_tiles + 1) * CHUNK_TILE
        return Split(CHUNK_TILE if head is None else min(CHUNK_TILE, head.rows),
                     bucket(rows, self.buckets) or rows, int(head is not None and head.tower))

    def _split(self, queue: Sequence[Waiting], max_tiles: int) -> Split:
        """:func:`split`, its rows padded up to the bucket the engine runs them in."""
        s = split(queue, max_tiles)
        return Split(s.tokens, bucket(s.rows, self.buckets) or s.rows, s.towers)

    def observe(self, sessions: int, tokens: int, lengths: Sequence[int], towers: int,
                ms: float | None, *, widest: int = 1) -> bool:
        """A step's device time, with its pieces' ``lengths`` (none: a plain step), the
        towers it ran or that ran beside it and its ``widest`` session's tokens. Mixed
        steps the engine cannot run at a captured shape (more than :data:`MAX_PIECES`
        pieces, more rows than the largest bucket, more than :data:`MIXED_MAX_TOKENS`
        tokens a session) run eagerly at a cost the budget never predicts: not read."""
        rows = self.padded_rows(lengths) if lengths else 0
        eager = (len(lengths) > MAX_PIECES or (bool(self.buckets) and rows > self.buckets[-1])
                 or widest > MIXED_MAX_TOKENS)
        if lengths and eager:
            return False
        return self.times.observe(sessions, tokens, rows, towers, ms)
