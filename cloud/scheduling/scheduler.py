"""One engine loop for every request: what the Generate streams call, and how the loop's
parts are put together.

vLLM V1's engine core and TGI's batches are the shape (not the code). Generate streams
talk only to this class: they ``admit`` a request (which takes a KV slot or fails with
RESOURCE_EXHAUSTED), ``submit_prefill`` once the visual input is ready, ``offer`` draft
tails, ``cancel``, and ``release``; results come back on the ticket's asyncio queue.

Each iteration of the loop, in a dedicated engine thread, runs one prefill call for the
oldest waiting requests (first come, first served, as many as fit
``prefill_token_budget`` prompt tokens, at least one) and samples each one's first
token, hands those over at once, then steps every running session together (each feeds
C[-1] plus the valid drafts that extend C; zero drafts is a plain decode step): one
batched forward, one sampler call that accepts or rejects every session's drafts, and
each session commits its tokens under its stop rules.

Policy: every running session steps every iteration, so none starves and nobody waits
for drafts; prefills are admitted first come, first served, one call per iteration, so a
new request stalls running sessions for at most one prefill call. A session that finishes (EOS,
stop string, token cap, context limit, cancel, deadline) gives its slot back in the same
iteration; a stream that ends any other way (disconnect, error, TTL) releases it.
The price of whole prefills: every running session waits for each prefill admitted while
it decodes, so under a stream of new requests its per-token time is the step plus
(prefills per second x prefill ms) per second of decoding. ``--prefill-chunk`` bounds
that (the static engine): the prefill call then writes *pieces* of the waiting prompts,
about one step's worth while sessions decode (``eventspec.cloud.scheduling.prefill_chunking``), and
a prompt continues where its slot ends at the next iteration; docs/scheduler.md has the
rule.

The parts, each with one job, as vLLM V1 splits them (the scheduler never runs the
model): ``eventspec.cloud.scheduling.step_scheduler`` decides (a pure ``schedule_*`` that returns
what each engine call runs, as ``eventspec.cloud.scheduling.step_plan`` values, and an ``update_*``
that takes the sampler's verdicts and commits them); ``eventspec.cloud.scheduling.engine_loop`` is
the thread that runs the plans on the engine and the sampler (the GIL switch interval,
failures, the loop's death); ``eventspec.cloud.scheduling.prefill_calls`` runs a prefill plan's
calls. Around them: ``eventspec.cloud.scheduling.tickets`` holds what the loop shares with the
streams (tickets, KV slots, the outbox), ``eventspec.cloud.scheduling.prefill_queue`` the waiting
prefills, ``eventspec.cloud.scheduling.stats`` the counters, and
``eventspec.cloud.scheduling.step_assembly`` how a step's batch is built. Everything is configured
here, at construction.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import torch

from eventspec.cloud.engine.base import (
    AheadEmbedsEngine,
    BatchedEngine,
    ChunkedPrefillEngine,
    KvByLengthEngine,
    MixedStepEngine,
    PrefillRequest,
)
from eventspec.cloud.scheduling.engine_loop import EngineLoop
from eventspec.cloud.scheduling.kv_arena import ArenaPool
from eventspec.cloud.scheduling.prefill_calls import PrefillCalls
from eventspec.cloud.scheduling.prefill_chunking import ChunkPolicy
from eventspec.cloud.scheduling.prefill_queue import DEFAULT_PREFILL_TOKEN_BUDGET
from eventspec.cloud.scheduling.prefix_cache import PrefixCache, keyed_prefix
from eventspec.cloud.scheduling.sampler import BatchedSampler, make_generator
from eventspec.cloud.scheduling.stats import SchedulerStats, StepObserver
from eventspec.cloud.scheduling.step_scheduler import NEVER_SIT_OUT, StepScheduler, neutral_prior
from eventspec.cloud.scheduling.tickets import Failure, SlotPool, Ticket
from eventspec.cloud.speculation.decoding import DecodingSession
from eventspec.cloud.speculation.sit_out import SitOut
from eventspec.shared.contract.errors import InvalidInput, Unavailable
from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.contract.types import DraftTail


class Scheduler:
    """The engine loop. ``start`` it on the event loop that will read the results."""

    def __init__(
        self,
        engine: BatchedEngine,
        *,
        text_vocab_size: int,
        prefill_token_budget: int = DEFAULT_PREFILL_TOKEN_BUDGET,
        prefill_chunk: ChunkPolicy | None = None,
        prefix_cache: PrefixCache | None = None,
        video_token_id: int = -1,
        preprocess_frames: Callable[[Sequence[bytes]], torch.Tensor] | None = None,
        mixed_steps: bool = True,
        towers_ahead: bool = True,
        chunk_cost: CloudCost | None = None,
        verify_cost: CloudCost | None = None,
        alpha_prior: Callable[[], float] = neutral_prior,
        sit_out: SitOut = NEVER_SIT_OUT,
        switch_interval_s: float | None = None,
        observer: StepObserver | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """Everything is set here, never after. ``prefill_chunk``: chunked prefill
        (``eventspec.cloud.scheduling.prefill_chunking``) where the engine can; ``prefix_cache``:
        saved prompt prefixes by content, where the engine can take them (prompts then go
        through the pieces path, whole or not); ``preprocess_frames``: the target's frame
        preprocessing, for a request that deferred its frames for an expected prefix hit
        and missed; ``mixed_steps``: chunks may ride the step's forward while sessions
        decode (``--mixed-steps``; on only where chunking is and the engine can);
        ``towers_ahead``: prompts' video towers run beside the steps, on the engine's side
        stream (``--towers-ahead``; on only with pieces and where the engine can);
        ``chunk_cost``: the cost model the ``auto`` chunk size is read from;
        ``verify_cost``: ``--verify-width auto``'s cost model (None verifies every valid
        draft), with ``alpha_prior`` the acceptance a session's drafts are expected to
        have before it has shown its own (the server-wide estimate); ``sit_out``: which
        dry sessions wait a step in a loaded batch (``eventspec.cloud.speculation.sit_out``);
        ``switch_interval_s``: the interpreter's switch interval while the loop runs
        (None: leave it; ``eventspec.cloud.scheduling.engine_loop``); ``observer`` hears of each
        step (metrics; None costs nothing)."""
        self.engine = engine
        pieces = isinstance(engine, ChunkedPrefillEngine)
        chunking = prefill_chunk if prefill_chunk is not None and pieces else ChunkPolicy("off")
        self._chunking = chunking
        self._prefix_cache = prefix_cache if pieces else None
        self._preprocess_frames = preprocess_frames
        self._video_token_id = video_token_id
        self._mixed_steps = (mixed_steps and chunking.enabled
                             and isinstance(engine, MixedStepEngine) and engine.mixed_steps)
        #: KV by length (``eventspec.cloud.scheduling.kv_arena``) where the engine keeps an arena of
        #: positions; else fixed slots of ``max_seq_len``.
        arena = engine.kv_positions if isinstance(engine, KvByLengthEngine) else None
        self.kv_by_length = bool(arena)
        self.pool: SlotPool | ArenaPool = (
            ArenaPool(arena, engine.max_seq_len, engine.num_slots) if arena
            else SlotPool(engine.num_slots, engine.max_seq_len))
        by_pieces = chunking.enabled or self._prefix_cache is not None
        self.plans = StepScheduler(
            self.pool, free_kv=engine.free, prefill_token_budget=prefill_token_budget,
            chunking=chunking, pieces=by_pieces,
            mixed_steps=self._mixed_steps, chunk_cost=chunk_cost, verify_cost=verify_cost,
            alpha_prior=alpha_prior, padded_tokens=getattr(engine, "padded_tokens", None),
            sit_out=sit_out, clock=clock,
            towers_ahead=towers_ahead and by_pieces and isinstance(engine, AheadEmbedsEngine))
        self.sampler = BatchedSampler(text_vocab_size)
        prefill = PrefillCalls(engine, self.plans, self.sampler, prefix_cache=self._prefix_cache,
                               video_token_id=video_token_id,
                               preprocess_frames=preprocess_frames, clock=clock)
        self.engine_loop = EngineLoop(engine, self.plans, self.sampler, prefill,
                                      observer=observer, switch_interval_s=switch_interval_s,
                                      clock=clock)
        self._clock = clock

    # Read-only: the parts were built from them, so a later change would not reach them.

    @property
    def chunking(self) -> ChunkPolicy:
        """Chunked prefill as it runs (off where the engine cannot)."""
        return self._chunking

    @property
    def prefix_cache(self) -> PrefixCache | None:
        """The prefix cache (None when off, or where the engine cannot take prefixes)."""
        return self._prefix_cache

    @property
    def mixed_steps(self) -> bool:
        """Whether prompt pieces ride the step's forward while sessions decode."""
        return self._mixed_steps

    @property
    def stats(self) -> SchedulerStats:
        """What the loop did (the benchmark, ``GetStats`` and the logs read it)."""
        return self.plans.stats

    @property
    def dead(self) -> str | None:
        """Why the engine loop ended, once it has."""
        return self.engine_loop.dead

    # -- the streams' side (event loop) ------------------------------------------------------

    def start(self, on_death: Callable[[str], None] | None = None) -> None:
        """Start the engine thread; results are delivered on the running event loop.

        ``on_death(reason)`` runs on that loop if the engine loop itself fails (a bug,
        not a request's error), so the server can report NOT_SERVING.
        """
        self.engine_loop.start(asyncio.get_running_loop(), on_death)

    def admit(self, request_id: str, make_session: Callable[[int], DecodingSession], *,
              positions: int | None = None) -> Ticket:
        """Take KV for a new request: a slot, or with KV by length a run of ``positions``
        (its prompt plus its answer cap; the session must stay within them). Raises
        RESOURCE_EXHAUSTED when none is free; UNAVAILABLE once the engine loop has
        ended, never a request that hangs."""
        if self.dead is not None:
            raise Unavailable(f"the verifier's engine loop has stopped ({self.dead})")
        need = self.pool.max_seq_len if positions is None else positions
        slot = self.pool.acquire(need)
        try:
            if self.kv_by_length:
                assert isinstance(self.engine, KvByLengthEngine)
                self.engine.reserve(slot, need)
            session = make_session(slot)
            if self.kv_by_length and session.max_seq_len > need:
                raise InvalidInput(f"a session of {session.max_seq_len} positions in KV "
                                   f"reserved for {need}")
        except BaseException:
            if self.kv_by_length:
                self.engine.free(slot)  # the run's reservation ends with it
            self.pool.release(slot)
            raise
        s = session.settings
        generator = make_generator(s.seed, self.engine.device) if s.temperature > 0 else None
        return Ticket(request_id, session, asyncio.Queue(), generator)

    def submit_prefill(self, ticket: Ticket, prompt_ids: Sequence[int], *,
                       pixel_values_videos: torch.Tensor | None = None,
                       video_features: torch.Tensor | None = None,
                       visual_key: str | None = None,
                       deferred_frames: tuple[bytes, ...] | None = None) -> None:
        """Queue the request's prefill; the first result follows on ``ticket.events``.
        ``visual_key`` and ``deferred_frames``: see :class:`PrefillRequest`."""
        ticket.submitted_at = self._clock()
        if self.dead is not None:
            ticket.events.put_nowait(Failure(Unavailable(
                f"the verifier's engine loop has stopped ({self.dead})")))
            return
        req = PrefillRequest(ticket.slot, list(prompt_ids), pixel_values_videos, video_features,
                             visual_key, deferred_frames)
        self.plans.enqueue("prefill", ticket, req)

    def prefix_may_hit(self, prompt_ids: Sequence[int], visual_key: str) -> bool:
        """Whether the prefix cache holds this prompt's clip now (a guess, from any
        thread): then its frames need no preprocessing unless it misses after all."""
        if self._prefix_cache is None or self._preprocess_frames is None:
            return False
        keyed = keyed_prefix(prompt_ids, visual_key, self._video_token_id)
        return keyed is not None and self._prefix_cache.may_hold(keyed[0])

    def offer(self, ticket: Ticket, tail: DraftTail) -> None:
        """Hand the engine thread the edge's drafts (read in order at its next step)."""
        ticket.mailbox.append(tail)

    def cancel(self, ticket: Ticket) -> None:
        """Finish the request as CANCELLED at the next iteration."""
        ticket.cancel_requested = True
        self.plans.enqueue("wake")

    def release(self, ticket: Ticket) -> None:
        """Forget the request and give its slot back (idempotent; the stream's last word)."""
        self.plans.enqueue("release", ticket)

    def stop(self) -> None:
        """End the loop; requests still in it fail with UNAVAILABLE."""
        self.engine_loop.stop()

    @property
    def live(self) -> int:
        """Requests holding a slot."""
        return self.pool.num_slots - self.pool.free

    @property
    def waiting(self) -> int:
        """Prefills queued in the engine loop now (read from any thread; approximate)."""
        return len(self.plans.prefills)
