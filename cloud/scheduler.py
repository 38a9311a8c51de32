"""One engine loop for every request: ready sessions -> one batched step -> one sampler call.

vLLM V1's engine core and TGI's batches are the shape (not the code). Generate streams
talk only to this module: they ``admit`` a request (which takes a KV slot or fails with
RESOURCE_EXHAUSTED), ``submit_prefill`` once the visual input is ready, ``offer`` draft
tails, ``cancel``, and ``release``; results come back on the ticket's asyncio queue.

Each iteration of the loop, in a dedicated engine thread:

1. take the commands that arrived (prefills to queue, releases);
2. **run one prefill call** for the oldest waiting requests (first come, first served,
   as many as fit ``prefill_token_budget`` prompt tokens, at least one), and sample each
   one's first token from the prefill's logits (checking one hidden draft);
3. **step every running session together**: each says what it feeds (C[-1] plus the
   valid drafts that extend C; zero drafts is a plain decode step), the engine runs one
   batched forward over the flattened tokens, the sampler accepts or rejects every
   session's drafts in one call, and each session commits its tokens under its stop
   rules;
4. hand every result to the event loop in one ``call_soon_threadsafe`` (a prefilled
   session's first token is handed over right after its prefill, before the step, so a
   busy batch does not add a step to its time to first token).

Policy: every running session steps every iteration, so none starves and nobody waits
for drafts; prefills are admitted first come, first served, one call per iteration, so a
new request stalls running sessions for at most one prefill call. A session that finishes (EOS,
stop string, token cap, context limit, cancel, deadline) gives its slot back in the same
iteration; a stream that ends any other way (disconnect, error, TTL) releases it.
The price of whole prefills: every running session waits for each prefill admitted while
it decodes, so under a stream of new requests its per-token time is the step plus
(prefills per second x prefill ms) per second of decoding. ``--prefill-chunk`` bounds
that (the static engine): step 2 then writes *pieces* of the waiting prompts, about one
step's worth while sessions decode (``eventspec.cloud.prefill_chunking``), and a prompt
continues where its slot ends at the next iteration; docs/scheduler.md has the rule.

Why a thread and not an engine-core process: the loop's own Python work per step is
tens of microseconds per session (``benchmarks/bench_scheduler_host.py``), small beside
a forward, and torch releases the GIL inside its kernels; a process would add a msgpack
round trip per step and a second copy of the request state. The thread's price is the
GIL: it gives the lock up at every torch call and, while the gRPC event loop holds it,
waits up to the interpreter's switch interval (5 ms by default) to get it back, a few
dozen times a step. On an H100 at 16 and 64 sessions that put the step at 1.28 and
1.23 times the device's time; with the interval at 0.1 ms (``switch_interval_s``, the
server's ``--gil-switch-interval-ms``, set while the loop runs) 1.08 and 1.13
(docs/scheduler.md, "The server as fast as its engine").

This module is the loop. Around it: ``eventspec.cloud.tickets`` holds what it shares
with the streams (tickets, KV slots, the outbox), ``eventspec.cloud.prefill_queue`` the
waiting prefills and how many go into one call, ``eventspec.cloud.scheduler_stats`` its
counters, ``eventspec.cloud.step_assembly`` how a step's batch is built, and
``eventspec.cloud.scheduler_prefill`` the loop's prefill calls (a mixin of this class).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

import torch

from eventspec.cloud import switch_interval
from eventspec.cloud.decoding import Committed, DecodingSession
from eventspec.cloud.device_timer import DeviceTimer
from eventspec.cloud.engine.base import (
    BatchedEngine,
    ChunkedPrefillEngine,
    KvByLengthEngine,
    MixedStepEngine,
    PrefillRequest,
)
from eventspec.cloud.kv_arena import ArenaPool
from eventspec.cloud.prefill_chunking import ChunkPolicy
from eventspec.cloud.prefill_queue import DEFAULT_PREFILL_TOKEN_BUDGET, Piece, PrefillQueue
from eventspec.cloud.prefix_cache import PrefixCache, keyed_prefix, reuse_prefix
from eventspec.cloud.sampler import BatchedSampler, SampleSpec, make_generator
from eventspec.cloud.scheduler_prefill import PrefillPhase, as_error
from eventspec.cloud.scheduler_stats import SchedulerStats, StepObserver
from eventspec.cloud.step_assembly import batch_of, trim_drafts
from eventspec.cloud.tickets import Failure, Outbox, SchedulerEvent, SlotPool, Ticket
from eventspec.shared.contract.errors import InvalidInput, Unavailable
from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.contract.types import DraftTail, FinishReason

log = logging.getLogger(__name__)


class Scheduler(PrefillPhase):
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
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._prefills = PrefillQueue(prefill_token_budget)  # checks the budget first
        self.engine = engine
        #: Chunked prefill (``eventspec.cloud.prefill_chunking``) where the engine can.
        pieces = isinstance(engine, ChunkedPrefillEngine)
        self.chunking = prefill_chunk if prefill_chunk is not None and pieces \
            else ChunkPolicy("off")
        #: Saved prompt prefixes by content (``eventspec.cloud.prefix_cache``), where the
        #: engine can take them; prompts then go through the pieces path, whole or not.
        self.prefix_cache = prefix_cache if pieces else None
        self._video_token_id = video_token_id
        #: The target's frame preprocessing (set by the server): a request that deferred
        #: its frames for an expected prefix hit gets them preprocessed here if it misses.
        self.preprocess_frames: Callable[[Sequence[bytes]], torch.Tensor] | None = None
        self._pieces = self.chunking.enabled or self.prefix_cache is not None
        #: Chunks ride the step's forward (``MixedStepEngine``) while sessions decode;
        #: set False to run each chunk in a call of its own (``--mixed-steps off``).
        self.mixed_steps = (self.chunking.enabled and isinstance(engine, MixedStepEngine)
                            and engine.mixed_steps)
        #: The cost model the ``auto`` chunk size is read from (set by the server).
        self.chunk_cost: CloudCost | None = None
        self.sampler = BatchedSampler(text_vocab_size)
        #: KV by length (``eventspec.cloud.kv_arena``) where the engine keeps an arena of
        #: positions; else fixed slots of ``max_seq_len``.
        arena = engine.kv_positions if isinstance(engine, KvByLengthEngine) else None
        self.kv_by_length = bool(arena)
        self.pool: SlotPool | ArenaPool = (
            ArenaPool(arena, engine.max_seq_len, engine.num_slots) if arena
            else SlotPool(engine.num_slots, engine.max_seq_len))
        self.stats = SchedulerStats()
        self._device_timer = DeviceTimer(torch.device(getattr(engine, "device", "cpu")))
        self._clock = clock
        self._commands: queue.SimpleQueue[tuple[str, Ticket | None, object]] = queue.SimpleQueue()
        self._running: list[Ticket] = []
        self._last_step = (0, 0)  # sessions and tokens of the latest step (chunk sizing)
        self._outbox = Outbox()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.dead: str | None = None  # why the loop ended, once it has
        self._on_death: Callable[[str], None] | None = None
        #: Set before ``start`` to hear of each step (metrics); None costs nothing.
        self.observer: StepObserver | None = None
        #: ``--verify-width auto``: the cost model that trims each step's drafts
        #: (:mod:`eventspec.shared.contract.verify_width`); None verifies every valid draft.
        self.verify_cost: CloudCost | None = None
        #: The acceptance a session's drafts are expected to have before it has shown its
        #: own (the server-wide estimate).
        self.alpha_prior: Callable[[], float] = lambda: 0.5
        #: The interpreter's switch interval while the loop runs (None: leave it); the
        #: interpreter's own comes back when the last loop stops (``switch_interval``).
        self.switch_interval_s: float | None = None
        self._holds_switch_interval = False

    # -- the streams' side (event loop) ------------------------------------------------------

    def start(self, on_death: Callable[[str], None] | None = None) -> None:
        """Start the engine thread; results are delivered on the running event loop.

        ``on_death(reason)`` runs on that loop if the engine loop itself fails (a bug,
        not a request's error), so the server can report NOT_SERVING.
        """
        self._loop = asyncio.get_running_loop()
        self._on_death = on_death
        if self.switch_interval_s is not None:  # process-wide; see the module docstring
            switch_interval.hold(self.switch_interval_s)
            self._holds_switch_interval = True
        self._thread = threading.Thread(target=self._run, name="engine-core", daemon=True)
        self._thread.start()

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
        self._commands.put(("prefill", ticket, req))

    def prefix_may_hit(self, prompt_ids: Sequence[int], visual_key: str) -> bool:
        """Whether the prefix cache holds this prompt's clip now (a guess, from any
        thread): then its frames need no preprocessing unless it misses after all."""
        if self.prefix_cache is None or self.preprocess_frames is None:
            return False
        keyed = keyed_prefix(prompt_ids, visual_key, self._video_token_id)
        return keyed is not None and self.prefix_cache.may_hold(keyed[0])

    def offer(self, ticket: Ticket, tail: DraftTail) -> None:
        """Hand the engine thread the edge's drafts (read in order at its next step)."""
        ticket.mailbox.append(tail)

    def cancel(self, ticket: Ticket) -> None:
        """Finish the request as CANCELLED at the next iteration."""
        ticket.cancel_requested = True
        self._commands.put(("wake", None, None))

    def release(self, ticket: Ticket) -> None:
        """Forget the request and give its slot back (idempotent; the stream's last word)."""
        self._commands.put(("release", ticket, None))

    def stop(self) -> None:
        """End the loop; requests still in it fail with UNAVAILABLE."""
        self._commands.put(("stop", None, None))
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._holds_switch_interval:
            self._holds_switch_interval = False
            switch_interval.let_go()

    @property
    def live(self) -> int:
        """Requests holding a slot."""
        return self.pool.num_slots - self.pool.free

    @property
    def waiting(self) -> int:
        """Prefills queued in the engine loop now (read from any thread; approximate)."""
        return len(self._prefills)

    # -- the engine thread -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._take_commands(block=not self._running and not self._prefills)
                if self._stopping:
                    break
                riding: list[Piece] = []
                if self._pieces:
                    riding = self._prefill_chunk()
                else:
                    self._prefill_one()
                # The first token goes out now, not after the next step.
                self._outbox.flush(self._loop)
                self._step_all(riding)
                self._outbox.flush(self._loop)
        except BaseException as exc:  # a bug in the loop must not leave streams hanging
            self.dead = f"{type(exc).__name__}: {exc}"
            log.exception("the engine loop died")
            if self._on_death is not None and self._loop is not None:
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._on_death, self.dead)
        finally:
            self._shut_down()

    def _shut_down(self) -> None:
        """Fail every request in the loop or on its way in with UNAVAILABLE, and give
        back the slots of those whose streams already let go."""
        if self.dead is None:
            self.dead = "stopped"
        down = Unavailable("the verifier's engine loop stopped")
        for t in [*self._running, *self._prefills.tickets()]:
            self._end(t, Failure(down))
        self._running.clear()
        self._prefills.clear()
        while True:  # release what the streams still hold
            try:
                kind, ticket, _ = self._commands.get_nowait()
            except queue.Empty:
                break
            if ticket is not None and kind == "prefill":
                self._end(ticket, Failure(down))
            elif ticket is not None and kind != "stop":
                self._free_slot(ticket)
        self._outbox.flush(self._loop)

    def _take_commands(self, *, block: bool) -> None:
        try:
            cmd = self._commands.get() if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, ticket, payload = cmd
            if kind == "stop":
                self._stopping = True
            elif kind == "prefill" and ticket is not None and ticket.slot_held:
                assert isinstance(payload, PrefillRequest)
                pending = self._prefills.add(ticket, payload)
                if self.prefix_cache is not None:
                    assert isinstance(self.engine, ChunkedPrefillEngine)
                    try:
                        reuse_prefix(self.engine, self.prefix_cache, pending,
                                     self._video_token_id, self.preprocess_frames)
                    except Exception as exc:  # its deferred frames failed: it alone fails
                        self._end(ticket, Failure(as_error(exc, "prefill")))
            elif kind == "release" and ticket is not None:
                self._forget(ticket)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return

    def _step_all(self, riding: list[Piece] | None = None) -> None:
        """One engine step and one sampler call for every running session; ``riding``
        prompt pieces go through the same forward (a mixed step), or, if it fails, in a
        call of their own before a plain step, so a bad piece fails alone."""
        t_start = self._clock()
        ready = [t for t in list(self._running) if not self._ended_early(t)]
        if not ready:
            if riding:
                self._run_pieces(riding, t_start)
            return
        inputs = []
        for t in ready:
            self._read_mailbox(t)
            inputs.append(t.session.step_input())
        if self.verify_cost is not None and any(inp.drafts for inp in inputs):
            # The static engine pads every session to the longest: price steps by it.
            inputs = trim_drafts([t.session.counters for t in ready], inputs,
                                 self.verify_cost, self.alpha_prior(),
                                 getattr(self.engine, "padded_tokens", None))
        batch = batch_of(inputs, self.engine.device)
        specs = [self._spec(t, len(inp.tokens), inp.drafts) for t, inp in zip(ready, inputs,
                                                                              strict=True)]
        t_engine = self._clock()
        chunk_logits: torch.Tensor | None = None
        if riding:
            engine = self.engine
            assert isinstance(engine, MixedStepEngine)
            try:
                self._device_timer.start()
                logits, chunk_logits = engine.step_with_chunks(batch, self._chunks_of(riding))
                self._device_timer.stop()
            except Exception:
                log.warning("a mixed step of %d sessions and %d prompt pieces failed; "
                            "running them apart", len(ready), len(riding), exc_info=True)
                self._run_pieces(riding, self._clock())
                self._step_all()
                return
            self._after_pieces(riding, chunk_logits, t_engine, own_call=False)
        try:
            if chunk_logits is None:
                self._device_timer.start()
                logits = self.engine.step(batch)  # [N, V]
                self._device_timer.stop()
            t_sampler = self._clock()
            verdicts = self.sampler(logits, specs)
        except Exception as exc:  # the batch fails, the loop goes on
            error = as_error(exc, "step")
            for t in ready:
                self._end(t, Failure(error))
            return
        t_done = self._clock()
        step_ms = (t_done - t_engine) * 1e3
        for t, inp, v in zip(ready, inputs, verdicts, strict=True):
            done = t.session.commit(v.accepted, v.tokens, len(inp.drafts), step_ms)
            if done.finish_reason is None:
                self._outbox.post(t, done)
            else:
                self._end(t, done)
        self._record_step(len(ready), batch.num_tokens, t_start, t_engine, t_sampler, t_done)

    def _record_step(self, sessions: int, tokens: int, t_start: float, t_engine: float,
                     t_sampler: float, t_done: float) -> None:
        """Count the step and split its time into engine, sampler and the loop's own work
        (everything before the engine call and after the sampler, commits included)."""
        self._last_step = (sessions, tokens)
        self.stats.observe_step(
            sessions, tokens, engine_ms=(t_sampler - t_engine) * 1e3,
            sampler_ms=(t_done - t_sampler) * 1e3,
            overhead_ms=((t_engine - t_start) + (self._clock() - t_done)) * 1e3,
            device_ms=self._device_timer.elapsed_ms())  # the sampler's read waited for it
        if self.observer is not None:
            self.observer.on_step(sessions, tokens, t_done - t_engine)

    def _ended_early(self, ticket: Ticket) -> bool:
        """Finish a cancelled or overdue request before it takes engine time."""
        session = ticket.session
        if ticket.cancel_requested:
            session.finish(FinishReason.CANCELLED)
        elif session.deadline_passed():
            session.finish(FinishReason.DEADLINE)
        else:
            return False
        n = len(session.committed)
        self._end(ticket, Committed(n, (), 0, 0, session.finish_reason))
        return True

    def _read_mailbox(self, ticket: Ticket) -> None:
        box = ticket.mailbox
        while box:
            ticket.session.offer_drafts(box.popleft())

    def _spec(self, ticket: Ticket, rows: int, drafts: Sequence[int]) -> SampleSpec:
        s = ticket.session.settings
        return SampleSpec(rows, tuple(drafts), s.temperature, s.top_p, ticket.generator)

    def _end(self, ticket: Ticket, event: SchedulerEvent) -> None:
        """Post the request's last result and give its slot back."""
        self._forget(ticket)
        self._outbox.post(ticket, event)

    def _forget(self, ticket: Ticket) -> None:
        if ticket in self._running:
            self._running.remove(ticket)
        self._prefills.forget(ticket)
        self._free_slot(ticket)

    def _free_slot(self, ticket: Ticket) -> None:
        if ticket.slot_held:
            ticket.slot_held = False
            self.engine.free(ticket.slot)
            self.pool.release(ticket.slot)

