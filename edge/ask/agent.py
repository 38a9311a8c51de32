"""One question, end to end on the edge: window, render, draft, stream to the cloud.

The agent checks an Ask against the cloud's limits before any model work, waits for a
warming cloud and for a place in line (``eventspec.edge.uplink.admission``), prepares the
visual input, and then runs the request: draft-only on the edge alone
(``eventspec.edge.ask.draft_only``), or against the cloud, one attempt at a time
(``eventspec.edge.ask.cloud_attempt``, which holds the speculative flow) with a retry on
another replica when one dies before anything is committed (``eventspec.edge.uplink.failover``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from eventspec.edge.ask.checks import check_ask, draft_only_settings
from eventspec.edge.ask.cloud_attempt import CloudAttempt
from eventspec.edge.ask.draft_only import answer_draft_only
from eventspec.edge.calibration import (
    MEASURE_ROUNDS,
    EdgeMeasurement,
    agrees,
    load_saved,
    measure_drafting,
    profile_key,
    save,
)
from eventspec.edge.cost_meter import EdgeCostMeter
from eventspec.edge.drafting.batcher import DraftBatcher
from eventspec.edge.drafting.cache import DraftBackend
from eventspec.edge.drafting.eventgpt import DraftModel
from eventspec.edge.drafting.static_backend import draft_engine_name
from eventspec.edge.drafting.tree import TreeShape
from eventspec.edge.events.base import EventSource
from eventspec.edge.readiness import Readiness
from eventspec.edge.uplink.admission import AdmissionQueue, cloud_slots
from eventspec.edge.uplink.failover import ask_event_is_committed, with_failover
from eventspec.edge.uplink.roles import VerifierLink
from eventspec.edge.uplink.wait import cloud_info_when_ready
from eventspec.edge.vision.backend import Aligner
from eventspec.edge.vision.inputs import (
    PreparedVisual,
    choose_feature_mode,
    prepare_visual,
)
from eventspec.edge.worker import ModelWorker
from eventspec.shared.contract.errors import (
    EventSpecError,
    FailedPrecondition,
    Unavailable,
)
from eventspec.shared.contract.estimators import AcceptanceEstimator, ThroughputEstimator
from eventspec.shared.contract.timing import EdgeCost
from eventspec.shared.contract.types import (
    AskEvent,
    AskSpec,
    FeatureMode,
    FinalEvent,
    Mode,
    ProgressEvent,
    ServerInfo,
    ServerLimits,
)

if TYPE_CHECKING:
    from eventspec.edge.learning.commit_recorder import CommitRecorder
    from eventspec.edge.metrics import EdgeMetrics

log = logging.getLogger(__name__)

#: How requests grow draft trees unless told otherwise (``--tree-nodes`` and friends).
DEFAULT_TREE = TreeShape()


class EdgeAgent:
    """Answers questions about the source's events; one instance per edge process."""

    def __init__(
        self,
        *,
        source: EventSource,
        draft: DraftModel,
        link: VerifierLink | None,
        draft_backend: DraftBackend | None = None,
        adapter: Aligner | None = None,
        worker: ModelWorker | None = None,
        acceptance_prior: float = 0.5,
        default_jpeg_quality: int = 90,
        request_timeout_s: float = 120.0,
        rpc_timeout_s: float = 5.0,
        preview_every: int = 4,
        tree_shape: TreeShape | None = DEFAULT_TREE,
        drafts_every: int = 1,
        force_speculation: bool = False,
        readiness: Readiness | None = None,
        cloud_wait_s: float = 60.0,
        first_reply_s: float = 5.0,
        max_queued_asks: int = 256,
        commit_recorder: CommitRecorder | None = None,
    ) -> None:
        self.source = source
        self.draft = draft
        #: What drafts: the HF model itself, or the static-KV runtime over its weights
        #: (:mod:`eventspec.edge.drafting.static_backend`). Prompts and vision stay the
        #: DraftModel's.
        self.draft_backend: DraftBackend = draft_backend if draft_backend is not None else draft
        self.link = link
        self.adapter = adapter
        self.worker = worker or ModelWorker("edge-model")
        #: Draft forwards of all this edge's sessions, batched on ``worker`` (issue 36).
        self.drafting = DraftBatcher(self.worker)
        self.acceptance = AcceptanceEstimator(prior=acceptance_prior)
        self.costs = EdgeCostMeter()
        self.uplink = ThroughputEstimator()
        self.default_jpeg_quality = default_jpeg_quality
        self.request_timeout_s = request_timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self.preview_every = max(1, preview_every)
        #: How requests grow draft trees, where the drafter and the cloud can (None: chains).
        self.tree_shape = tree_shape
        #: Draft forwards (chains: tokens) per Drafts message at least (``--drafts-every``).
        self.drafts_every = max(1, drafts_every)
        self.force_speculation = force_speculation
        self.requests_served = 0
        if readiness is None:  # built from loaded models, with nobody else to tell
            readiness = Readiness(needs_cloud=link is not None)
            readiness.set_edge_phase(None)
        self.readiness = readiness
        self.cloud_wait_s = cloud_wait_s
        self.first_reply_s = first_reply_s
        self.admission = AdmissionQueue(max_waiting=max_queued_asks)
        #: Prometheus metrics (``--metrics-port``); None: nothing is recorded.
        self.metrics: EdgeMetrics | None = None
        #: What :meth:`warm_up` measured or reused (None before it ran).
        self.calibration: EdgeMeasurement | None = None
        #: ``--commit-log``: what a draft head learns from, logged after each speculative
        #: request (None: off, the default).
        self.commit_recorder = commit_recorder
        self._background: set[asyncio.Future[Any]] = set()

    # -- set-up ---------------------------------------------------------------------------

    def background(self, work: Awaitable[object]) -> None:
        """Run ``work`` without anyone waiting for it (e.g. the commit log's rows): kept
        referenced until done, and a failure is logged, not lost."""
        task = asyncio.ensure_future(work)
        self._background.add(task)

        def done(t: asyncio.Future[Any]) -> None:
            self._background.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.warning("background work failed: %s", t.exception())

        task.add_done_callback(done)

    async def drain_background(self) -> None:
        """Wait for the background work queued so far (before shutting the worker)."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def warm_up(self, *, profile_path: Path | None = None,
                      recalibrate: bool = False) -> None:
        """Measure what drafting costs here (:mod:`eventspec.edge.calibration`): a short
        warm-up on the live source, checked against the saved profile at
        ``profile_path`` for this drafter and vision backend, or a fresh measurement
        saved there (none saved when ``profile_path`` is None)."""
        try:
            spec = AskSpec(question="What is moving?", feature_mode=FeatureMode.FRAMES)
            prepared = await self._prepare(spec, need_frames=False, need_features=False)
        except EventSpecError as exc:
            log.warning("warm-up skipped: %s", exc)
            return
        draft = self.draft
        pixels = prepared.event_pixels

        def vision(px: torch.Tensor) -> object:
            return draft.event_tokens(draft.clip_features(px))

        def sync() -> None:
            if draft.device.type == "cuda":
                torch.cuda.synchronize(draft.device)

        def measure(rounds: int, warmup: int = 0) -> EdgeMeasurement:
            return measure_drafting(self.draft_backend, pixels, eos_token_id=draft.eos_token_id,
                                    rounds=rounds, vision=vision, sync=sync, warmup=warmup)

        # One round after one uncounted (it pays the one-off costs) is the spot check.
        check = await self.worker.run(partial(measure, 1, 1))
        key = profile_key(draft.device, draft.dtype, draft_engine_name(self.draft_backend),
                          draft.vision.name)
        saved = None
        if profile_path is not None and not recalibrate:
            saved = load_saved(profile_path, draft.model_id, key)
        if saved is not None and agrees(check, saved):
            chosen = saved
        else:
            if saved is not None:
                log.warning("edge calibration profile %s is stale: the warm-up drafted at "
                            "%.2f ms/token against its %.2f; measuring again", profile_path,
                            check.ms_per_token, saved.ms_per_token)
            chosen = check
            if profile_path is not None:
                chosen = await self.worker.run(partial(measure, MEASURE_ROUNDS))
                save(profile_path, draft.model_id, key, chosen)
        self.calibration = chosen
        self.costs.update(chosen.prefill_ms, chosen.ms_per_token)
        log.info("edge costs (%s; %s): vision %.1f ms, draft prefill %.1f ms, %.2f ms/token",
                 chosen.source, key, chosen.vision_ms, chosen.prefill_ms, chosen.ms_per_token)

    def edge_cost(self) -> EdgeCost:
        rtt = self.link.rtt.value if self.link is not None else 0.0
        return EdgeCost(
            draft_prefill_ms=max(self.costs.draft_prefill_ms, 0.01),
            draft_ms_per_token=max(self.costs.draft_ms_per_token, 0.01),
            rtt_ms=max(rtt, 0.0),
            uplink_bytes_per_s=self.uplink.bytes_per_s,
            acceptance_prior=self.acceptance.value,
        )

    # -- one request ----------------------------------------------------------------------

    async def ask(self, spec: AskSpec, *, deadline_s: float | None = None
                  ) -> AsyncIterator[AskEvent]:
        """Answer ``spec``; yields progress while waiting for the cloud, previews,
        committed text and one FinalEvent. ``deadline_s`` is the call's time left (the
        wait for a warming cloud ends before it).

        Logs one line per request (id, mode, outcome or error code, tokens, ms), never
        the question text at INFO.
        """
        started = time.perf_counter()
        request_id = uuid.uuid4().hex[:12]
        outcome, tokens = "CANCELLED", 0
        try:
            async for event in self._answer(spec, request_id, deadline_s):
                if isinstance(event, FinalEvent):
                    outcome, tokens = event.finish_reason.name, len(event.token_ids)
                yield event
        except EventSpecError as exc:
            outcome = exc.code.name
            raise
        except Exception as exc:
            outcome = f"INTERNAL ({type(exc).__name__})"
            raise
        finally:
            log.info("ask %s: mode %s, %s, %d tokens, %.1f ms", request_id,
                     spec.mode.name.lower(), outcome, tokens,
                     (time.perf_counter() - started) * 1e3)

    async def _answer(self, spec: AskSpec, request_id: str, deadline_s: float | None
                      ) -> AsyncIterator[AskEvent]:
        if spec.mode == Mode.DRAFT_ONLY:
            check_ask(spec, ServerLimits())
            settings = draft_only_settings(spec, self.draft)  # before any model work
            prepared = await self._prepare(spec, need_frames=False, need_features=False)
            async for event in answer_draft_only(spec, settings, prepared, self.draft,
                                                 self.worker, self.draft_backend):
                yield event
            self.requests_served += 1
            return
        if self.link is None:
            raise Unavailable(
                f"mode {spec.mode.name.lower()} needs a cloud verifier, and this edge runs "
                "without one; use mode draft_only"
            )
        info: ServerInfo | None = None
        wait_s = self.cloud_wait_s if deadline_s is None else min(self.cloud_wait_s,
                                                                   max(0.0, deadline_s - 1.0))
        async for item in cloud_info_when_ready(
                self.link, self.readiness, wait_s=wait_s, rpc_timeout_s=self.rpc_timeout_s):
            if isinstance(item, ProgressEvent):
                yield item
            else:
                info = item
        assert info is not None
        self._check_against_cloud(spec, info)  # before any model work
        # A slot on the cloud before any model work: wait in line for one
        # (eventspec.edge.uplink.admission).
        self.admission.set_capacity(cloud_slots(info.limits))
        queued_at = time.monotonic()
        budget = self.request_timeout_s if deadline_s is None else max(0.0, deadline_s - 1.0)
        async for place in self.admission.enter(budget):
            yield ProgressEvent(
                "queued", f"queued for the cloud verifier: place {place} in line "
                          f"({self.admission.in_flight} in flight)",
                round(time.monotonic() - queued_at, 3))
        try:
            feature_mode = choose_feature_mode(spec.feature_mode, self.source, self.adapter)
            prepared = await self._prepare(
                spec,
                need_frames=feature_mode == FeatureMode.FRAMES,
                need_features=feature_mode == FeatureMode.ALIGNED,
                info=info,
            )
            # A replica that dies before anything is committed gets the request re-run
            # once on another (eventspec.edge.uplink.failover); after a commit the answer fails
            # clearly
            # instead. A cloud full for a moment is asked again within the wait budget.
            left = budget - (time.monotonic() - queued_at)
            async for event in with_failover(
                lambda attempt: self._with_cloud(
                    spec, info, prepared,
                    request_id if not attempt else f"{request_id}-r{attempt}",
                ),
                is_committed=ask_event_is_committed,
                busy_retry_s=max(0.0, min(self.cloud_wait_s, left)),
            ):
                yield event
        finally:
            self.admission.release()

    def _check_against_cloud(self, spec: AskSpec, info: ServerInfo) -> None:
        """The Ask within the cloud's limits, and for speculation a cloud that reads the
        draft model's text vocabulary (else its drafts could not be verified)."""
        check_ask(spec, info.limits)
        if spec.mode == Mode.SPECULATIVE and info.vocab_fingerprint != self.draft.vocab_fingerprint:
            raise FailedPrecondition(
                f"the cloud's text vocabulary (fingerprint {info.vocab_fingerprint[:12]}) "
                f"differs from the draft model's ({self.draft.vocab_fingerprint[:12]}), so "
                "drafts cannot be verified; use mode target_only"
            )

    async def _prepare(
        self, spec: AskSpec, *, need_frames: bool, need_features: bool,
        info: ServerInfo | None = None,
    ) -> PreparedVisual:
        return await prepare_visual(
            spec, source=self.source, draft=self.draft, adapter=self.adapter,
            worker=self.worker, info=info, jpeg_quality=self.default_jpeg_quality,
            need_frames=need_frames, need_features=need_features,
        )

    async def _with_cloud(
        self, spec: AskSpec, info: ServerInfo, prepared: PreparedVisual, request_id: str
    ) -> AsyncIterator[AskEvent]:
        """One attempt against the cloud (``eventspec.edge.ask.cloud_attempt``), set up only
        when iterated, so ``with_failover`` sees a failure to start as the attempt's."""
        attempt = CloudAttempt(self, spec, info, prepared, request_id)
        async with contextlib.aclosing(attempt.run()) as events:
            async for event in events:
                if isinstance(event, FinalEvent):
                    self.requests_served += 1
                yield event
