"""The edge process: source, draft model, cloud link, and the EdgeAgent gRPC server.

Like the cloud: bind and report NOT_SERVING, load the draft model and measure its
costs, then SERVING while the cloud verifier answers; on shutdown NOT_SERVING and
``stop(grace)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventspec.edge.ask.agent import EdgeAgent
from eventspec.edge.config import EdgeSettings
from eventspec.edge.drafting.cache import DraftBackend
from eventspec.edge.drafting.checkpoint import load_draft
from eventspec.edge.drafting.eventgpt import DraftModel
from eventspec.edge.drafting.headed_backend import HeadedDraftBackend
from eventspec.edge.drafting.oracle_backend import (
    OracleDraftBackend,
    OracleSettings,
    load_answers,
    oracle_backend,
)
from eventspec.edge.drafting.static_backend import draft_backend_for, draft_engine_name
from eventspec.edge.drafting.tree import TreeShape
from eventspec.edge.events.base import EventSource
from eventspec.edge.events.limits import SourceLimits
from eventspec.edge.events.sources import open_source
from eventspec.edge.learning.commit_recorder import CommitRecorder
from eventspec.edge.learning.token_heads import load_head
from eventspec.edge.model_dirs import TOY, TOY_MISALIGNED, adapter_dir, draft_dir
from eventspec.edge.readiness import CloudState, CloudView, Readiness
from eventspec.edge.servicer import EdgeAgentServicer
from eventspec.edge.uplink.channel import CloudLink
from eventspec.edge.vision.align import load_adapter
from eventspec.edge.vision.backend import Aligner
from eventspec.shared.contract.errors import (
    ErrorCode,
    EventSpecError,
    FailedPrecondition,
    InvalidInput,
)
from eventspec.shared.node.repeat_log import RepeatLog
from eventspec.shared.node.serving import torch_dtype, warm_or_stop
from eventspec.shared.node.static.quant import QuantMode
from eventspec.shared.node.tracing import tracer_from_env
from eventspec.shared.pb.eventspec.v1 import edge_pb2, edge_pb2_grpc
from eventspec.shared.wire.host import GrpcHost
from eventspec.shared.wire.options import SMALL_REQUEST_BYTES
from eventspec.shared.wire.security import check_server_start

if TYPE_CHECKING:
    from eventspec.edge.metrics import EdgeMetrics
    from eventspec.shared.node.metrics import MetricsEndpoint

log = logging.getLogger(__name__)

SERVICE_NAME = edge_pb2.DESCRIPTOR.services_by_name["EdgeAgent"].full_name


def load_draft_for(settings: EdgeSettings) -> DraftModel:
    """The draft in the directory ``--model`` names (``toy``: the shipped toy draft)."""
    return load_draft(draft_dir(settings.model), device=settings.device,
                      dtype=torch_dtype(settings.dtype))


def oracle_for(settings: EdgeSettings, draft: DraftModel) -> OracleDraftBackend:
    """``--draft-engine oracle`` (benchmarks only): the answers file read, the oracle
    drafting in the draft model's text vocabulary."""
    assert settings.oracle_answers is not None  # EdgeSettings.check refuses otherwise
    oracle = OracleSettings(
        answers=load_answers(settings.oracle_answers), alpha=settings.oracle_alpha,
        ms_per_token=settings.oracle_ms_per_token, prefill_ms=settings.oracle_prefill_ms,
        seed=settings.oracle_seed, coverage=settings.oracle_coverage)
    return oracle_backend(oracle, text_vocab_size=draft.text_vocab_size,
                          eos_token_id=draft.eos_token_id)


def headed_backend_for(path: Path, draft: DraftModel) -> HeadedDraftBackend:
    """``--draft-head DIR``: the adapter or head there, over the HF drafter."""
    head = load_head(path, device=draft.device)
    backend = HeadedDraftBackend(draft, head, name=f"hf + {head.config.kind} {path.name}")
    log.info("drafting with the %s (trained on %s)", backend.name,
             head.config.training.get("log_source", "?"))
    return backend


def warn_on_vocab_mismatch(cloud: str, cloud_fingerprint: str, draft_fingerprint: str) -> bool:
    """Log a loud WARNING when the cloud's text vocabulary is not the draft's.

    Such a cloud still answers target_only requests, so it is "reachable"; but every
    speculative request to it is refused (drafts in another vocabulary would be
    meaningless), which an operator must learn at start-up, not from clients. Returns
    whether they differ.
    """
    if cloud_fingerprint == draft_fingerprint:
        return False
    log.warning(
        "VOCABULARY MISMATCH: the cloud %s's text vocabulary (fingerprint %s) differs from "
        "the draft model's (%s); speculative requests will be refused, only target_only "
        "(and draft_only) work. Pair the draft with a target of the same tokenizer.",
        cloud, cloud_fingerprint[:12], draft_fingerprint[:12],
    )
    return True


#: How often the edge asks the cloud how it is: while it is ready, and while it is not.
WATCH_READY_S = 5.0
WATCH_WAITING_S = 0.5


@dataclass
class EdgeServer:
    """A running edge agent: ``await start()``, then ``port``; ``await stop()``.

    ``start`` binds at once and reports NOT_SERVING (with the reason in GetStatus and
    the log) while the source opens, the draft model loads and its costs are measured;
    Asks that arrive meanwhile wait, with progress. After warm-up, health follows the
    cloud verifier: SERVING while it answers, NOT_SERVING with the reason while it is
    warming up or unreachable (an edge without ``--cloud`` serves draft_only at once).
    """

    settings: EdgeSettings
    source: EventSource | None = None
    draft: DraftModel | None = None
    adapter: Aligner | None = None
    port: int = 0
    agent: EdgeAgent | None = None
    readiness: Readiness | None = None
    _host: GrpcHost | None = None
    _servicer: EdgeAgentServicer | None = None
    _link: CloudLink | None = None
    _owned_source: EventSource | None = None
    _watcher: asyncio.Task[None] | None = None
    _health: set[asyncio.Task[None]] = field(default_factory=set)
    _last_reason: str | None = None
    #: Prometheus metrics, when ``settings.metrics_port`` is set (else None: no hooks run).
    metrics: EdgeMetrics | None = None
    metrics_port: int = 0
    _metrics_endpoint: MetricsEndpoint | None = None
    #: An OpenTelemetry tracer (tests inject one); None: from the ``OTEL_*`` environment,
    #: which leaves tracing off unless it asks for an exporter (``eventspec.shared.node.tracing``).
    tracer: Any = None
    #: The cloud's state in the log: one line per change, then one a minute with a count.
    _cloud_log: RepeatLog = field(default_factory=lambda: RepeatLog(log))

    async def start(self, *, warm: bool = True) -> int:
        """Bind and report NOT_SERVING; then (``warm``) warm up. Returns the bound port."""
        s = self.settings
        check_server_start(s.host, s.port, s.security)  # refuse before loading models
        if s.vision_backend == "onnx" and s.onnx_dir is None:
            raise InvalidInput("--vision-backend onnx needs --onnx-dir DIR, an export of "
                               "--model made by `eventspec-edge export-onnx`")
        # 64 calls in flight, plus the Asks waiting in line for a cloud slot.
        host = GrpcHost(SERVICE_NAME, max_message_bytes=s.max_message_bytes,
                        max_rpcs=64 + s.max_queued_asks,
                        security=s.security,
                        unlimited_methods=frozenset({f"/{SERVICE_NAME}/GetStatus"}),
                        max_receive_bytes=SMALL_REQUEST_BYTES)
        self.readiness = Readiness(needs_cloud=bool(s.cloud), on_change=self._health_follows)
        self._servicer = EdgeAgentServicer(self.readiness, wait_s=s.cloud_wait_s)
        edge_pb2_grpc.add_EdgeAgentServicer_to_server(self._servicer, host.server)
        if s.metrics_port is not None:
            self._start_metrics(host)
        self._servicer.tracer = (self.tracer if self.tracer is not None
                                 else tracer_from_env("eventspec-edge"))
        self.port = await host.start(s.host, s.port, health_port=s.health_port)
        self._host = host
        log.info("edge agent listening on %s:%d (NOT_SERVING while warming up)", s.host,
                 self.port)
        return await warm_or_stop(self, warm)

    async def warm_up(self) -> None:
        """Open the source, load the models, measure the draft's costs; then watch the
        cloud, whose readiness health follows from here on."""
        s = self.settings
        assert self.readiness is not None and self._servicer is not None
        readiness = self.readiness
        source = self.source
        if source is None:
            readiness.set_edge_phase("opening the event source")
            cancel = threading.Event()  # a stop during opening ends a decoder child at once
            try:
                source = await asyncio.to_thread(
                    open_source, s.source, allow_pickle=s.allow_pickle,
                    sensor_size=s.sensor_size, cancel=cancel,
                    limits=SourceLimits(s.max_source_events, s.max_source_bytes),
                )
            except asyncio.CancelledError:
                cancel.set()
                raise
            self._owned_source = source  # opened here, so closed here (live readers, files)
        draft = self.draft
        if draft is None:
            readiness.set_edge_phase("loading the draft model")
            draft = await asyncio.to_thread(load_draft_for, s)
        adapter = self.adapter
        # The toy draft brings its adapter unless told otherwise.
        adapter_name = s.adapter
        if adapter_name is None and s.model in (TOY, TOY_MISALIGNED) and self.draft is None:
            adapter_name = Path(TOY)
        if adapter is None and adapter_name is not None:
            readiness.set_edge_phase("loading the feature adapter")
            adapter = await asyncio.to_thread(load_adapter, adapter_dir(adapter_name))
        if s.vision_backend == "onnx":
            readiness.set_edge_phase("loading the ONNX vision export")
            adapter = await asyncio.to_thread(self._onnx_vision, draft, adapter, adapter_name)
        self._link = (
            CloudLink(s.cloud, max_message_bytes=s.max_message_bytes, security=s.cloud_security,
                      rest_s=s.cloud_rest_s)
            if s.cloud else None
        )
        backend: DraftBackend
        if s.draft_engine == "oracle":
            backend = await asyncio.to_thread(oracle_for, s, draft)
        elif s.draft_head is not None:
            readiness.set_edge_phase("loading the draft head")
            backend = await asyncio.to_thread(headed_backend_for, s.draft_head, draft)
        else:
            if s.draft_engine != "hf":
                readiness.set_edge_phase("building the static drafter" + (
                    f" ({s.draft_quant} weights)" if s.draft_quant != "none" else ""))
            backend = await asyncio.to_thread(
                draft_backend_for, s.draft_engine, draft, QuantMode.parse(s.draft_quant),
                s.draft_slots)
        self.agent = EdgeAgent(
            source=source,
            draft=draft,
            draft_backend=backend,
            link=self._link,
            adapter=adapter,
            acceptance_prior=s.acceptance_prior,
            default_jpeg_quality=s.default_jpeg_quality,
            request_timeout_s=s.request_timeout_s,
            rpc_timeout_s=s.rpc_timeout_s,
            preview_every=s.preview_every,
            tree_shape=(TreeShape(s.tree_nodes, s.tree_top_k, s.tree_per_forward,
                                  branch_top_k=s.tree_branch_top_k)
                        if s.tree_nodes > 0 else None),
            drafts_every=s.drafts_every,
            force_speculation=s.speculation == "always",
            readiness=readiness,
            cloud_wait_s=s.cloud_wait_s,
            first_reply_s=s.cloud_first_reply_s,
            max_queued_asks=s.max_queued_asks,
            commit_recorder=(None if s.commit_log is None else await asyncio.to_thread(
                CommitRecorder, draft, s.commit_log, s.commit_log_max_mb)),
        )
        if self.metrics is not None:
            self._bind_metrics(self.agent, source)
        readiness.set_edge_phase("measuring the draft model's costs")
        await self.agent.warm_up(profile_path=s.resolved_profile_path(draft.model_id),
                                 recalibrate=s.recalibrate)
        self._servicer.attach(
            self.agent, draft_model_id=draft.model_id,
            adapter_id=str(s.adapter) if s.adapter else ("in-memory" if adapter else ""),
            vision_backend=draft.vision.name, draft_engine=draft_engine_name(backend),
        )
        if self._link is not None:
            await self._check_cloud(self._link, draft, first=True)
            self._watcher = asyncio.create_task(self._watch_cloud(self._link, draft))
        readiness.set_edge_phase(None)
        log.info("edge agent warm on %s:%d, source %s, draft %s (%s drafter, vision %s)%s",
                 s.host, self.port, source.describe(), draft.model_id,
                 draft_engine_name(backend), draft.vision.name,
                 "" if readiness.serving else f"; NOT_SERVING: {readiness.not_serving_reason()}")

    def _onnx_vision(self, draft: DraftModel, adapter: Aligner | None,
                     adapter_name: Path | None) -> Aligner | None:
        """``--vision-backend onnx``: the draft's vision path (and the adapter, when one
        was loaded from a directory) on ONNX Runtime; returns the adapter to use.

        The export is checked against the directories loaded, and refused when stale."""
        try:
            from eventspec.edge.vision.onnx_backend import load_onnx_vision
        except ImportError as exc:
            raise FailedPrecondition(
                f"--vision-backend onnx needs ONNX Runtime ({exc}): install "
                "eventspec[edge-onnx] (CPU) or eventspec[edge-gpu] (CUDA)") from exc

        s = self.settings
        assert s.onnx_dir is not None
        loaded = (adapter_dir(adapter_name)
                  if adapter is not None and adapter_name is not None else None)
        path = load_onnx_vision(s.onnx_dir, model_dir=draft_dir(s.model), adapter_dir=loaded,
                                device=draft.device, prefer=s.vision_ort_provider,
                                cuda_graphs=s.vision_ort_cuda_graphs)
        draft.vision = path.vision
        if path.aligner is not None:
            return path.aligner
        if adapter is not None:
            log.info("the in-memory feature adapter stays on torch")
        return adapter

    def _start_metrics(self, host: GrpcHost) -> None:
        """Serve ``/metrics`` from this server's own registry (imported only when on)."""
        from eventspec.edge.metrics import EdgeMetrics
        from eventspec.shared.node.metrics import serve_metrics

        assert self._servicer is not None
        self.metrics = EdgeMetrics()
        self._servicer.metrics = self.metrics
        self._metrics_endpoint = serve_metrics(self.metrics, host.auth, self.settings.metrics_host,
                                               self.settings.metrics_port)
        self.metrics_port = self._metrics_endpoint.port

    def _bind_metrics(self, agent: EdgeAgent, source: EventSource) -> None:
        """Hook the metrics into the agent, its link and its source."""
        metrics = self.metrics
        assert metrics is not None
        agent.metrics = metrics
        link = agent.link
        metrics.bind(rtt_ms=lambda: link.rtt.value if link is not None else 0.0,
                     acceptance=lambda: agent.acceptance.value,
                     queued=lambda: agent.admission.waiting,
                     in_flight=lambda: agent.admission.in_flight, source=source)

    async def _check_cloud(self, link: CloudLink, draft: DraftModel, *, first: bool) -> None:
        """Ask the cloud how it is once, and tell readiness (and health) what it said."""
        assert self.readiness is not None
        was_ready = self.readiness.cloud.state == CloudState.READY
        try:
            info = await link.server_info(self.settings.rpc_timeout_s)
        except EventSpecError as exc:
            view = (await link.diagnose(self.settings.rpc_timeout_s)
                    if exc.code in (ErrorCode.UNAVAILABLE, ErrorCode.DEADLINE_EXCEEDED)
                    else CloudView(CloudState.UNREACHABLE, exc.message))
        else:
            view = CloudView(CloudState.READY)
            await link.sample_rtt(self.settings.rpc_timeout_s)  # the plan's rtt, every 5 s
            self._cloud_log.flush()
            if first or not was_ready:
                log.info("cloud %s ready: %s", link.address, info.model_id)
                warn_on_vocab_mismatch(link.address, info.vocab_fingerprint,
                                       draft.vocab_fingerprint)
        if view.state != CloudState.READY:
            self._log_cloud_view(link.address, view)
        self.readiness.set_cloud(view)

    def _log_cloud_view(self, address: str, view: CloudView) -> None:
        """The cloud's state, by its real cause, once when it starts and then once a
        minute with a count (the watcher polls every 0.5 s; each poll logged a raw
        "GetServerInfo failed: UNAVAILABLE ... backend unhealthy" before)."""
        if view.state == CloudState.WARMING_UP:
            # Keyed on the state, not the phase: each new phase is already one line of
            # its own ("edge agent NOT_SERVING: waiting for the cloud verifier: ...").
            self._cloud_log.report(logging.INFO, view.state, "cloud verifier at %s is warming "
                                   "up: %s", address, view.detail or "starting")
        elif view.state == CloudState.NOT_A_VERIFIER:
            self._cloud_log.report(logging.ERROR, view, "the server at %s is not an eventspec "
                                   "Verifier (GetServerInfo: UNIMPLEMENTED; another edge's "
                                   "port?); check --cloud", address)
        elif view.state == CloudState.REFUSED:
            self._cloud_log.report(logging.ERROR, view, "the cloud verifier at %s refused this "
                                   "edge (%s): check --cloud-tls-cert and --cloud-token-file "
                                   "against its --allow-principal", address, view.detail)
        else:  # answering while NOT_SERVING: the moment between calibrated and serving
            level = logging.INFO if view.detail.startswith("it answers") else logging.WARNING
            self._cloud_log.report(level, view, "cloud verifier at %s is unreachable: %s",
                                   address, view.detail or "no answer")

    async def _watch_cloud(self, link: CloudLink, draft: DraftModel) -> None:
        """Keep the view of the cloud fresh: often while it is not ready, seldom after."""
        assert self.readiness is not None
        while True:
            ready = self.readiness.cloud.state == CloudState.READY
            await self.readiness.next_change(WATCH_READY_S if ready else WATCH_WAITING_S)
            await self._check_cloud(link, draft, first=False)

    def _health_follows(self, serving: bool) -> None:
        """Readiness changed: report it on grpc.health.v1, and log each new reason."""
        assert self.readiness is not None
        if self._host is not None:
            task = asyncio.get_running_loop().create_task(self._host.set_serving(serving))
            self._health.add(task)
            task.add_done_callback(self._health.discard)
        reason = self.readiness.not_serving_reason()
        if reason != self._last_reason:
            if serving:
                log.info("edge agent SERVING")
            else:
                log.info("edge agent NOT_SERVING: %s", reason)
            self._last_reason = reason

    async def stop(self, grace_s: float | None = None) -> None:
        if self._metrics_endpoint is not None:
            self._metrics_endpoint.stop()
        if self._host is None:
            return
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        self._cloud_log.flush()  # how long the last cloud condition held
        await self._host.stop(self.settings.grace_s if grace_s is None else grace_s)
        if self._link is not None:
            await self._link.close()
        if self.agent is not None:
            await self.agent.drain_background()
            if self.agent.commit_recorder is not None:
                await asyncio.to_thread(self.agent.commit_recorder.close)
            self.agent.worker.shutdown()
        close = getattr(self._owned_source, "close", None)
        if callable(close):
            await asyncio.to_thread(close)
        self._host = None
