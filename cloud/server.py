"""The verifier process: gRPC server lifecycle, warm-up, health and shutdown.

The server binds and reports NOT_SERVING first, loads the model, reserves KV slots from
the memory budget, calibrates (or reads the calibration profile), starts the engine
loop, then flips health to SERVING. On shutdown it reports NOT_SERVING again, stops with
a grace period so in-flight requests can finish, then stops the engine loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eventspec.cloud.calibrate import Progress, load_or_calibrate, no_progress
from eventspec.cloud.config import CloudSettings
from eventspec.cloud.engine.base import BatchedEngine, ChunkedPrefillEngine, KvByLengthEngine
from eventspec.cloud.engine.choice import choose_engine
from eventspec.cloud.engine.hf import HFEngine
from eventspec.cloud.engine.kv import (
    GIB,
    auto_max_seq_len,
    check_beside_explicit_kv,
    device_free_bytes,
    kv_bytes_per_token,
    plan_kv,
)
from eventspec.cloud.engine.paced import PacedEngine
from eventspec.cloud.engine.static.build import (
    SCRATCH_SLOTS,
    build_static_engine,
    fp8_copy_bytes_for,
)
from eventspec.cloud.model_dirs import model_dir
from eventspec.cloud.process import gc_freeze
from eventspec.cloud.requests.kv_queue import KvWaitQueue
from eventspec.cloud.requests.session_capacity import (
    AUTO_SESSIONS,
    CPU_AUTO_SESSIONS,
    GPU_SESSION_CEILING,
    SessionCapacity,
    auto_kv_sessions,
    session_capacity,
)
from eventspec.cloud.requests.sessions import SessionRegistry
from eventspec.cloud.runtime import VerifierRuntime, server_info_for
from eventspec.cloud.scheduling.prefill_chunking import ChunkPolicy, graphed_piece_rows
from eventspec.cloud.scheduling.prefix_cache import PrefixCache
from eventspec.cloud.scheduling.scheduler import Scheduler
from eventspec.cloud.scheduling.stats import StepObserver
from eventspec.cloud.servicer import VerifierServicer
from eventspec.cloud.target import TargetModel, load_target
from eventspec.shared.contract.estimators import AcceptanceEstimator
from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.node.serving import torch_dtype, warm_or_stop
from eventspec.shared.node.tracing import tracer_from_env
from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from eventspec.shared.wire.host import GrpcHost

if TYPE_CHECKING:
    from eventspec.cloud.metrics import CloudMetrics
    from eventspec.shared.node.metrics import MetricsEndpoint

log = logging.getLogger(__name__)

SERVICE_NAME = verifier_pb2.DESCRIPTOR.services_by_name["Verifier"].full_name

class WarmUpStopped(Exception):
    """The server was told to stop while it was still warming up."""


def load_target_for(settings: CloudSettings) -> TargetModel:
    """The target in the directory ``--model`` names (``toy``: the shipped toy target)."""
    return load_target(model_dir(settings.model), device=settings.device,
                       dtype=torch_dtype(settings.dtype))


def prefix_cache_for(settings: CloudSettings, engine: BatchedEngine) -> PrefixCache | None:
    """``--prefix-cache-gb``'s cache, where the engine can reuse prefixes (logged if not)."""
    if settings.prefix_cache_gb <= 0:
        return None
    if not isinstance(engine, ChunkedPrefillEngine):
        log.warning("--prefix-cache-gb needs the static engine (this one is %s): no prefix "
                    "cache", type(engine).__name__)
        return None
    log.info("prefix cache: %.2f GiB for saved prompt prefixes", settings.prefix_cache_gb)
    return PrefixCache(int(settings.prefix_cache_gb * GIB))


def slot_positions(settings: CloudSettings, target: TargetModel) -> int:
    """``--max-seq-len``, or the prompt plus room for a question and the answer cap
    (:func:`~eventspec.cloud.engine.kv.auto_max_seq_len`); at most the model's."""
    if settings.max_seq_len is not None:
        return min(settings.max_seq_len, target.max_positions)
    return auto_max_seq_len(len(target.build_prompt_ids("")), settings.limits.max_new_tokens,
                            target.max_positions)


def default_request_positions(settings: CloudSettings, target: TargetModel,
                              max_seq_len: int) -> int:
    """KV positions a request at the default answer cap takes: the prompt with an empty
    question plus ``--max-new-tokens``, at most a session's positions."""
    return min(max_seq_len, len(target.build_prompt_ids("")) + settings.limits.max_new_tokens)


def build_engine(settings: CloudSettings, target: TargetModel) -> BatchedEngine:
    """The chosen engine with KV slots reserved from the memory budget (logged).

    ``--max-sessions auto`` (:mod:`eventspec.cloud.requests.session_capacity`): on a GPU, as many
    sessions as the KV holds at the default answer cap (at most the widest captured step);
    on a CPU, ``CPU_AUTO_SESSIONS``."""
    kind = choose_engine(settings.engine, target, settings.batch_invariant,
                         fp8=settings.fp8_flag)
    text_config = target.model.config.get_text_config(decoder=True)
    auto = settings.limits.max_sessions == AUTO_SESSIONS
    on_gpu = target.device.type == "cuda"
    max_seq_len = slot_positions(settings, target)
    kv = plan_kv(
        bytes_per_token=kv_bytes_per_token(text_config, target.dtype),
        max_seq_len=max_seq_len,
        device=target.device,
        kv_cache_gb=settings.kv_cache_gb,
        memory_fraction=settings.kv_memory_fraction,
        max_slots=settings.limits.max_sessions if not auto
        else GPU_SESSION_CEILING if on_gpu else CPU_AUTO_SESSIONS,
        scratch_slots=SCRATCH_SLOTS if kind == "static" else 0,
        reserved_bytes=int(settings.prefix_cache_gb * GIB) + (
            fp8_copy_bytes_for(text_config) if settings.fp8_flag else 0)
        if kind == "static" else 0,
        by_length=kind == "static" and settings.kv_layout == "by-length",
    )
    if auto and on_gpu and kv.arena_positions:  # by length: what the arena holds at the cap
        kv = dataclasses.replace(kv, num_slots=auto_kv_sessions(
            kv_positions=kv.arena_positions, ceiling=GPU_SESSION_CEILING,
            request_positions=default_request_positions(settings, target, max_seq_len)))
    if kind == "static" and settings.fp8_flag and settings.kv_cache_gb is not None and on_gpu:
        check_beside_explicit_kv(kv, free_bytes=device_free_bytes(target.device),
                                 beside_bytes=fp8_copy_bytes_for(text_config),
                                 beside=f"{settings.fp8_flag}'s weight copy")
    log.info("KV capacity: %s", kv.describe())  # the engine is built with exactly these
    engine: BatchedEngine
    if kind == "static":
        graphed = settings.mixed_steps and target.device.type == "cuda"
        policy = ChunkPolicy.parse(settings.prefill_chunk)
        engine = build_static_engine(
            target, kv, batch_invariant=settings.batch_invariant,
            chunk_buckets=graphed_piece_rows(policy, kv.max_seq_len) if graphed else (),
            prefill_dtype=settings.prefill_dtype)
        if settings.batch_invariant and policy.enabled:
            log.warning("--prefill-chunk %s with --batch-invariant: the chunks run in calls "
                        "of their own (a batch-invariant step cannot carry them), slower than "
                        "whole prompts; --prefill-chunk off prefills whole prompts",
                        settings.prefill_chunk)
    else:
        engine = HFEngine(target, num_slots=kv.num_slots, max_seq_len=kv.max_seq_len)
    if settings.emulate_prefill_ms or settings.emulate_step_ms:
        engine = PacedEngine(engine, prefill_ms=settings.emulate_prefill_ms,
                             step_ms=settings.emulate_step_ms)
    return engine


def build_runtime(
    settings: CloudSettings,
    target: TargetModel | None = None,
    *,
    engine: BatchedEngine | None = None,
    cost: CloudCost | None = None,
    progress: Progress = no_progress,
    observer: StepObserver | None = None,
) -> VerifierRuntime:
    """Load (or take) the target, reserve KV, calibrate, and assemble the runtime. Blocking.

    ``engine`` and ``cost`` let tests inject a test double (e.g. a slowed engine that
    stands in for a loaded cloud) together with the cost model that describes it. Without
    ``cost``, a paced engine plans with the costs it is paced to, and any other engine
    with the saved profile (spot-checked) or a fresh calibration. ``progress`` hears each warm-up
    phase (the server reports it while NOT_SERVING). ``observer`` hears of every engine
    step (the metrics). The scheduler's engine loop is started later, on the serving
    event loop.
    """
    if target is None:
        progress("loading the target model")
        target = load_target_for(settings)
    if engine is None:
        progress("reserving KV memory and building the engine")
        engine = build_engine(settings, target)
    if cost is None and isinstance(engine, PacedEngine) and engine.step_ms > 0:
        cost = engine.known_cost()
    elif cost is None:
        cost = load_or_calibrate(target, engine, settings.resolved_profile_path(target.model_id),
                                 recalibrate=settings.recalibrate, progress=progress,
                                 kernels=settings.kernels)
    capacity = capacity_of(settings, target, engine)
    log.info("sessions: %s", capacity.describe())
    settings = dataclasses.replace(settings, limits=dataclasses.replace(
        settings.limits, max_sessions=capacity.admitted))
    info = server_info_for(target, cost, settings, engine)
    acceptance = AcceptanceEstimator(prior=0.5)
    interval_ms = settings.gil_switch_interval_ms
    scheduler = Scheduler(
        engine, text_vocab_size=target.text_vocab_size,
        prefill_chunk=ChunkPolicy.parse(settings.prefill_chunk),
        prefix_cache=prefix_cache_for(settings, engine), video_token_id=target.video_token_id,
        preprocess_frames=target.preprocess_frames, mixed_steps=settings.mixed_steps,
        towers_ahead=settings.towers_ahead,
        chunk_cost=cost, verify_cost=cost if settings.verify_width == "auto" else None,
        alpha_prior=lambda: acceptance.value, sit_out=settings.sit_out_policy(),
        switch_interval_s=interval_ms / 1e3 if interval_ms > 0 else None, observer=observer)
    runtime = VerifierRuntime(
        settings=settings, target=target, scheduler=scheduler,
        registry=SessionRegistry(settings.limits.max_sessions, settings.session_ttl_s,
                                 per_principal=settings.per_principal_cap),
        info=info, acceptance=acceptance, capacity=capacity)
    if settings.kv_queue > 0:
        pool = runtime.scheduler.pool
        runtime.kv_queue = KvWaitQueue(settings.kv_queue, pool.fits)
        pool.on_release = runtime.kv_queue.wake_from_thread
    return runtime


def capacity_of(settings: CloudSettings, target: TargetModel,
                engine: BatchedEngine) -> SessionCapacity:
    """``--max-sessions`` resolved against the KV ``engine`` was built with."""
    request = default_request_positions(settings, target, engine.max_seq_len)
    arena = engine.kv_positions if isinstance(engine, KvByLengthEngine) else None
    holds = engine.num_slots if arena is None else arena // request
    return session_capacity(
        requested=settings.limits.max_sessions, on_gpu=target.device.type == "cuda",
        kv_sessions=engine.num_slots, kv_queue=settings.kv_queue, request_positions=request,
        kv_holds=holds)


@dataclass
class VerifierServer:
    """A running verifier: ``await start()``, then ``port``; ``await stop()``."""

    settings: CloudSettings
    target: TargetModel | None = None
    engine: BatchedEngine | None = None
    cost: CloudCost | None = None
    port: int = 0
    runtime: VerifierRuntime | None = None
    _host: GrpcHost | None = None
    _servicer: VerifierServicer = field(default_factory=VerifierServicer)
    _sweeper: asyncio.Task[None] | None = None
    _engine_down: asyncio.Task[None] | None = None
    _stopping: bool = False
    #: Whether this server holds the garbage collector's freeze (``gc_freeze``).
    _gc_frozen: bool = False
    #: Prometheus metrics, when ``settings.metrics_port`` is set (else None: no hooks run).
    metrics: CloudMetrics | None = None
    metrics_port: int = 0
    _metrics_endpoint: MetricsEndpoint | None = None
    #: An OpenTelemetry tracer (tests inject one); None: from the ``OTEL_*`` environment,
    #: which leaves tracing off unless it asks for an exporter (``eventspec.shared.node.tracing``).
    tracer: Any = None

    async def start(self, *, warm: bool = True) -> int:
        """Bind, report NOT_SERVING, warm up, report SERVING. Returns the bound port."""
        limits = self.settings.limits
        host = GrpcHost(SERVICE_NAME, max_message_bytes=limits.max_message_bytes,
                        max_rpcs=self.settings.admission_ceiling * 4 + 16,
                        security=self.settings.security,
                        unlimited_methods=frozenset({f"/{SERVICE_NAME}/GetServerInfo",
                                                     f"/{SERVICE_NAME}/GetStats"}),
                        first_message_timeout_s=self.settings.first_message_timeout_s)
        if self.settings.metrics_port is not None:
            self._start_metrics(host)
        verifier_pb2_grpc.add_VerifierServicer_to_server(self._servicer, host.server)
        self.port = await host.start(self.settings.host, self.settings.port,
                                     health_port=self.settings.health_port)
        self._host = host
        log.info("verifier listening on %s:%d (NOT_SERVING while warming up)",
                 self.settings.host, self.port)
        return await warm_or_stop(self, warm)

    async def warm_up(self) -> None:
        """Load the model and calibrate off the loop, then report SERVING."""
        assert self._host is not None
        self.runtime = await asyncio.to_thread(
            build_runtime, self.settings, self.target, engine=self.engine, cost=self.cost,
            progress=self._warming, observer=self.metrics,
        )
        if self.metrics is not None:
            self._bind_metrics(self.runtime)
        self.runtime.tracer = (self.tracer if self.tracer is not None
                               else tracer_from_env("eventspec-cloud"))
        self.runtime.scheduler.start(on_death=self._engine_died)
        if self.settings.gc_freeze and not self._gc_frozen:
            await asyncio.to_thread(gc_freeze.hold)
            self._gc_frozen = True
        self._servicer.attach(self.runtime)
        self._sweeper = asyncio.create_task(
            self.runtime.registry.run_sweeper(min(60.0, self.settings.session_ttl_s / 4))
        )
        await self._host.set_serving(True)
        info = self.runtime.info
        log.info("verifier SERVING %s (vocab %d, %d visual tokens; planning with prefill "
                 "%.1f ms, step %.1f ms + %.2f ms/token + %.2f ms/extra session [%s]; "
                 "capacity %d KV slots x %d tokens)",
                 info.model_id, info.vocab_size, info.geometry.visual_tokens,
                 info.cloud_cost.prefill_ms(info.geometry.visual_tokens,
                                            info.prompt_overhead_tokens),
                 info.cloud_cost.step_base_ms, info.cloud_cost.step_ms_per_token,
                 info.cloud_cost.step_ms_per_session, info.cloud_cost.calibration,
                 info.limits.kv_slots,
                 info.limits.kv_tokens_per_slot)

    def _start_metrics(self, host: GrpcHost) -> None:
        """Serve ``/metrics`` from this server's own registry (imported only when on)."""
        from eventspec.cloud.metrics import CloudMetrics
        from eventspec.shared.node.metrics import is_loopback, serve_metrics

        s = self.settings
        self.metrics = CloudMetrics(principals=s.metrics_principals)
        self._metrics_endpoint = serve_metrics(self.metrics, host.auth, s.metrics_host,
                                               s.metrics_port)
        self.metrics_port = self._metrics_endpoint.port
        if s.metrics_principals == "name" and not is_loopback(s.metrics_host):
            log.warning("metrics on %s name every authenticated caller in the per-edge "
                        "series; --metrics-principals hash or none keeps the names off "
                        "/metrics", s.metrics_host)

    def _bind_metrics(self, runtime: VerifierRuntime) -> None:
        """Hook the metrics into the runtime, its scheduler and its gauges."""
        metrics = self.metrics
        assert metrics is not None
        runtime.metrics = metrics
        sched, registry = runtime.scheduler, runtime.registry
        pool = sched.pool
        metrics.bind(running=lambda: len(registry), waiting=lambda: sched.waiting,
                     kv_used=lambda: sched.live, kv_total=pool.num_slots,
                     positions_used=lambda: pool.positions_used,
                     positions_total=pool.positions_total)

    def _warming(self, phase: str) -> None:
        """A warm-up phase began: log it, and let callers see it while NOT_SERVING.

        Runs on the warm-up thread, which nothing else can interrupt: a server told to
        stop meanwhile ends warm-up here, at the next phase, so a signal during a long
        calibration does not wait for all of it.
        """
        if self._stopping:
            raise WarmUpStopped(f"stopped while warming up (before: {phase})")
        log.info("warming up: %s", phase)
        self._servicer.phase = phase

    def _engine_died(self, reason: str) -> None:
        """The engine loop failed: report NOT_SERVING so load balancers move on."""
        log.error("engine loop died (%s); health is NOT_SERVING", reason)
        if self._host is not None:
            self._engine_down = asyncio.create_task(self._host.set_serving(False))

    async def stop(self, grace_s: float | None = None) -> None:
        """NOT_SERVING, then stop with a grace period for in-flight requests."""
        self._stopping = True
        if self._metrics_endpoint is not None:
            self._metrics_endpoint.stop()
        if self._host is None:
            return
        await self._host.stop(self.settings.grace_s if grace_s is None else grace_s)
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.runtime is not None:
            await self.runtime.registry.close_all()
            await asyncio.to_thread(self.runtime.scheduler.stop)
            release = getattr(self.runtime.scheduler.engine, "release", None)
            if self.engine is None and release is not None:  # one it built itself
                release()
        if self._gc_frozen:
            gc_freeze.let_go()
            self._gc_frozen = False
        self._host = None

    async def wait(self) -> None:
        if self._host is not None:
            await self._host.wait()

    @property
    def live_sessions(self) -> int:
        """Registered Generate streams."""
        return len(self.runtime.registry) if self.runtime is not None else 0

    @property
    def held_slots(self) -> int:
        """KV slots held by requests (every way a request ends gives its slot back)."""
        return self.runtime.scheduler.live if self.runtime is not None else 0
