"""The engine thread: the scheduler's plans run on the engine and the sampler, iteration
after iteration, and their results handed to the event loop.

Each iteration: take the commands (``StepScheduler.take_commands``, then the prefix
cache's lookups of the new prefills); plan and run one prefill call
(``eventspec.cloud.scheduling.prefill_calls``) unless its pieces ride the step; hand the first
tokens over at once (so a busy batch adds no step to a time to first token); plan and run
the batched step, one engine forward and one sampler call for every running session, the
sampler's work queued behind the forward before the loop's other host work, so the
iteration waits for the device once; hand its results over. Every hand-over is one
``call_soon_threadsafe`` (the :class:`~eventspec.cloud.scheduling.tickets.Outbox`).

Failures: an engine or sampler error fails that call's requests (a mixed step that fails
runs its pieces apart and its step plain, so a bad prompt fails alone) and the loop goes
on; an error in the loop itself is a bug: the loop ends (``dead`` says why), every request
in it fails with UNAVAILABLE, and ``on_death`` runs on the event loop so the server turns
health NOT_SERVING.

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

Every step is recorded under its kind (``eventspec.cloud.scheduling.step_kinds``: plain,
a riding piece, a tower, ...) with its times and the gap since the previous step's
completion, which is what a decoding session's inter-token latency is made of.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence

import torch

from eventspec.cloud.engine.ahead import engine_stream
from eventspec.cloud.engine.base import BatchedEngine, MixedShapeEngine, MixedStepEngine
from eventspec.cloud.process import switch_interval
from eventspec.cloud.scheduling.device_timer import DeviceTimer
from eventspec.cloud.scheduling.prefill_calls import PrefillCalls, as_error
from eventspec.cloud.scheduling.prefill_queue import AHEAD_PROMPTS, Piece
from eventspec.cloud.scheduling.sampler import BatchedSampler
from eventspec.cloud.scheduling.stats import StepObserver
from eventspec.cloud.scheduling.step_assembly import batch_of
from eventspec.cloud.scheduling.step_kinds import StepKind, step_kind
from eventspec.cloud.scheduling.step_plan import StepPlan
from eventspec.cloud.scheduling.step_scheduler import StepScheduler

log = logging.getLogger("eventspec.cloud.scheduling.scheduler")


class EngineLoop:
    """Runs ``scheduler``'s plans on ``engine`` in a thread of its own (see the module
    docstring). ``observer`` hears of each step (metrics; None costs nothing);
    ``switch_interval_s``: the interpreter's switch interval while the loop runs (None:
    leave it)."""

    def __init__(self, engine: BatchedEngine, scheduler: StepScheduler, sampler: BatchedSampler,
                 prefill: PrefillCalls, *, observer: StepObserver | None = None,
                 switch_interval_s: float | None = None,
                 clock: Callable[[], float]) -> None:
        self.engine = engine
        self.scheduler = scheduler
        self.sampler = sampler
        self.prefill = prefill
        self.observer = observer
        self.switch_interval_s = switch_interval_s
        self.dead: str | None = None  # why the loop ended, once it has
        self._clock = clock
        self._device = torch.device(getattr(engine, "device", "cpu"))
        self._device_timer = DeviceTimer(self._device)
        #: Results wait for the next step's launch (asynchronous on CUDA; _iterate).
        self._hand_over_behind = self._device.type == "cuda"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._on_death: Callable[[str], None] | None = None
        self._holds_switch_interval = False
        self._last_done: float | None = None  # the latest step's completion, while one runs
        #: Asked whether a mixed step ran at a fixed shape (None: the engine cannot say).
        self._shapes = engine if isinstance(engine, MixedShapeEngine) else None

    def start(self, loop: asyncio.AbstractEventLoop,
              on_death: Callable[[str], None] | None = None) -> None:
        """Start the thread; results are delivered on ``loop``, and ``on_death(reason)``
        runs there if the loop itself fails."""
        self._loop = loop
        self._on_death = on_death
        if self.switch_interval_s is not None:  # process-wide; see the module docstring
            switch_interval.hold(self.switch_interval_s)
            self._holds_switch_interval = True
        self._thread = threading.Thread(target=self._run, name="engine-core", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the loop and wait for it; requests still in it fail with UNAVAILABLE."""
        self.scheduler.enqueue("stop")
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._holds_switch_interval:
            self._holds_switch_interval = False
            switch_interval.let_go()

    def _run(self) -> None:
        sched = self.scheduler
        try:
            with engine_stream(self._device):
                self._iterate()
        except BaseException as exc:  # a bug in the loop must not leave streams hanging
            self.dead = f"{type(exc).__name__}: {exc}"
            log.exception("the engine loop died")
            if self._on_death is not None and self._loop is not None:
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._on_death, self.dead)
        finally:
            if self.dead is None:
                self.dead = "stopped"
            sched.shut_down()
            sched.outbox.flush(self._loop)

    def _iterate(self) -> None:
        """The iterations, until the scheduler stops.

        On CUDA a step's results are handed over once the next step is queued
        (``_step``), so the event loop's work on them (the streams' messages) overlaps
        that step on the device instead of taking the GIL while this thread plans and
        launches it. With no step to follow they go out at once: before the loop blocks
        for commands, before a prefill call of its own, and when nothing runs. Where the
        engine's call is the computation itself (CPU), they go out after each step, as
        waiting for the next call would hold them back a whole step.
        """
        sched = self.scheduler
        while not sched.stopping:
            if sched.idle:
                sched.outbox.flush(self._loop)
            self.prefill.reuse_prefixes(sched.take_commands(block=sched.idle))
            if sched.stopping:
                break
            riding: Sequence[Piece] = ()
            plan = sched.schedule_prefill()
            if plan is not None and plan.ride:
                riding = plan.pieces
            elif plan is not None:
                sched.outbox.flush(self._loop)
                self.prefill.run(plan)
                # The first token goes out now, not after the next step.
                sched.outbox.flush(self._loop)
            self._step(riding, prefilled=plan is not None and not plan.ride)
            if not (sched.running and self._hand_over_behind):  # see above
                sched.outbox.flush(self._loop)

    def _step(self, riding: Sequence[Piece], *, prefilled: bool = False,
              fell_back: bool = False) -> None:
        """One engine step and one sampler call for every running session; ``riding``
        prompt pieces go through the same forward (a mixed step), or, if it fails, in a
        call of their own before a plain step, so a bad piece fails alone. ``prefilled``
        and ``fell_back`` are for the step's kind: a prefill call of its own ran before
        it, or it follows a failed mixed step.

        The sampler's device work is queued right behind the step
        (``BatchedSampler.launch``); the towers and the riding pieces' first tokens are
        started while the device runs, and only then does the loop wait for the verdicts.
        """
        plan = self.scheduler.schedule_step(riding)
        if plan is None:
            self._last_done = None  # nothing decodes across this iteration
            if riding:
                self.prefill.run_pieces(riding, self._clock())
            return
        batch = batch_of(plan.inputs, self.engine.device)
        fixed = None  # whether the riding pieces ran at a fixed shape (None: cannot tell)
        t_engine = self._clock()
        chunk_logits: torch.Tensor | None = None
        try:
            if plan.riding:
                engine = self.engine
                assert isinstance(engine, MixedStepEngine)
                self._device_timer.start()
                logits, chunk_logits = engine.step_with_chunks(
                    batch, self.prefill.chunks_of(plan.riding))
                self._device_timer.stop()
                if self._shapes is not None:
                    fixed = self._shapes.last_mixed_fixed
        except Exception:
            log.warning("a mixed step of %d sessions and %d prompt pieces failed; "
                        "running them apart", len(plan.sessions), len(plan.riding),
                        exc_info=True)
            self.prefill.run_pieces(plan.riding, self._clock())
            self._step((), fell_back=True)
            return
        failed: Exception | None = None  # the step or its sampler call failed
        try:
            if chunk_logits is None:
                self._device_timer.start()
                logits = self.engine.step(batch)  # [N, V]
                self._device_timer.stop()
            # Queued behind the step: the host work below overlaps the device's.
            pending = self.sampler.launch(logits, plan.specs)
        except Exception as exc:
            failed = exc
        self.scheduler.outbox.flush(self._loop)  # the last step's results (see _iterate)
        beside = self._start_towers()  # towers started on the side stream after the step
        if chunk_logits is not None:  # the riding pieces' first tokens
            self.prefill.after_pieces(plan.riding, chunk_logits, t_engine, own_call=False)
        t_sampler = self._clock()
        if failed is None:
            try:
                verdicts = pending.result()  # the wait for the step's device work
            except Exception as exc:
                failed = exc
        if failed is not None:  # the batch fails, the loop goes on
            self._last_done = None  # its sessions failed: no gap runs on from it
            self.scheduler.fail(plan.tickets, as_error(failed, "step"))
            return
        t_done = self._clock()
        self.scheduler.update_step(plan, verdicts, (t_done - t_engine) * 1e3)
        kind = step_kind(plan, fixed_shape=fixed, prefilled=prefilled, fell_back=fell_back)
        self._record_step(plan, kind, batch.num_tokens, t_engine, t_sampler, t_done, beside)

    def _start_towers(self) -> int:
        """Start queued prompts' video towers on the engine's side stream
        (``PrefillCalls.embed_ahead``) once the step is launched: the host work (pinning
        the pixels, the launches) overlaps the step on the device, the tower fills what
        the step leaves of the GPU (the step's stream has the higher priority), and a
        later iteration gives the prompt its first piece once the tower is done.
        Returns how many started: the step's device time includes theirs, which
        ``--prefill-chunk slack`` learns and prices (``StepScheduler.step_timed``)."""
        if not self.scheduler.towers_ahead:
            return 0
        due = self.scheduler.prefills.towers_to_start(AHEAD_PROMPTS)
        self.prefill.embed_ahead(due)
        return sum(p.ahead is not None for p in due)

    def _record_step(self, plan: StepPlan, kind: StepKind, tokens: int, t_engine: float,
                     t_sampler: float, t_done: float, towers_beside: int = 0) -> None:
        """Count the step under its kind and split its time into engine (the calls that
        queue the step and its sampler, and the host work overlapping them), sampler (the
        wait for the verdicts) and the loop's own work (planning before the engine call,
        and the commits after the sampler), with the gap since the previous step's
        completion; its device time goes to the scheduler with the ``towers_beside`` it
        (a mixed step's includes the video tower of a prompt it starts when towers are
        not ahead: the embeddings are then made inside the timed call)."""
        sessions = len(plan.sessions)
        device_ms = self._device_timer.elapsed_ms()  # the sampler's read waited for it
        gap_ms = None if self._last_done is None else (t_done - self._last_done) * 1e3
        self._last_done = t_done
        self.scheduler.stats.observe_step(
            sessions, tokens, kind=kind, engine_ms=(t_sampler - t_engine) * 1e3,
            sampler_ms=(t_done - t_sampler) * 1e3,
            overhead_ms=((t_engine - plan.t_start) + (self._clock() - t_done)) * 1e3,
            device_ms=device_ms, gap_ms=gap_ms)
        self.scheduler.step_timed(plan, device_ms,  # --prefill-chunk slack's estimates
                                  towers_beside=towers_beside)
        if self.observer is not None:
            self.observer.on_step(sessions, tokens, t_done - t_engine, kind)
