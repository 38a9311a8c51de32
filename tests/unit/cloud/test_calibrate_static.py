"""Calibration and its spot check on the static engine in both KV layouts (issue 35: the
full-size cloud did not start at its defaults because calibration prefilled slot 0 of a
KV-by-length arena without reserving a run there: "prompt of 2083 tokens does not fit a
slot of 0"). The same code path as on a GPU, on the tiny target on CPU."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from eventspec.cloud import calibrate
from eventspec.cloud.config import CloudSettings
from eventspec.cloud.engine.kv import plan_kv
from eventspec.cloud.engine.static.build import SCRATCH_SLOTS, build_static_engine
from eventspec.cloud.server import build_engine
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from tests.support import cloud_harness as h


@pytest.fixture(scope="module")
def target() -> TargetModel:
    return build_tiny_random_target(seed=0)


@pytest.mark.parametrize("layout", ["by-length", "slots"])
def test_the_static_engine_calibrates_at_the_servers_defaults(
        target: TargetModel, layout: str) -> None:
    """``build_engine`` at the server's defaults (KV by length is the default layout),
    then one calibration round and the spot check; afterwards nothing is held, so every
    session the server admits still has its KV."""
    settings = replace(h.settings(kv_cache_gb=h.tiny_kv_gb(8)), engine="static",
                       kv_layout=layout)
    engine = build_engine(settings, target)
    assert (engine.kv_positions is not None) == (layout == "by-length")  # type: ignore[attr-defined]
    cost, samples = calibrate.measure_cloud_cost(target, engine, repeats=1)
    assert cost.step_base_ms > 0 and cost.prefill_ms_per_visual_token >= 0
    assert any(key.startswith("step_b2_") for key in samples), "batched steps were measured"
    assert calibrate.spot_check(target, engine, cost) > 0
    occupancy = engine.occupancy  # type: ignore[attr-defined]
    for slot in range(engine.num_slots):
        assert not occupancy.is_live(slot) and occupancy.filled(slot) == 0
    if layout == "by-length":
        assert occupancy.room(0) == 0, "calibration's runs end with it"


def test_calibration_fits_its_batches_into_a_small_arena(target: TargetModel) -> None:
    """An arena that holds two calibration sessions only: the batch sizes stop there
    instead of running into the arena's end."""
    run = calibrate.calibration_run_positions(target)
    kv = plan_kv(bytes_per_token=1, max_seq_len=run, device=target.device,
                 kv_cache_gb=(3 * run) / (1 << 30), memory_fraction=0.9, max_slots=8,
                 scratch_slots=SCRATCH_SLOTS, by_length=True)
    engine = build_static_engine(target, kv, use_graphs=False)
    assert engine.kv_positions == 2 * run
    _, samples = calibrate.measure_cloud_cost(target, engine, repeats=1)
    measured = {int(key.split("_")[1][1:]) for key in samples if key.startswith("step_b")}
    assert measured == {1, 2}


async def test_a_server_at_its_defaults_says_how_many_sessions_fit(
        target: TargetModel, tmp_path: Path) -> None:
    """The static engine at the server's own defaults (``--max-sessions auto``, KV by
    length) calibrates, serves, and GetStats says what the session limit came to."""
    from grpc import aio

    from eventspec.cloud.server import VerifierServer
    from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc

    settings = replace(CloudSettings(), port=0, grace_s=0.5, engine="static",
                       kv_cache_gb=h.tiny_kv_gb(8), profile_path=tmp_path / "cloud.msgpack")
    assert settings.limits.max_sessions == 0
    server = VerifierServer(settings, target=target)  # no cost given: it calibrates
    await server.start()
    try:
        async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stats = await verifier_pb2_grpc.VerifierStub(ch).GetStats(
                verifier_pb2.GetStatsRequest(), timeout=10)
            info = await verifier_pb2_grpc.VerifierStub(ch).GetServerInfo(
                verifier_pb2.GetServerInfoRequest(), timeout=10)
    finally:
        await server.stop()
    assert stats.kv_layout == "by-length" and stats.state == "serving"
    assert stats.max_sessions == info.limits.max_sessions == 8 + settings.kv_queue
    assert stats.session_capacity.startswith(f"8 sessions run at once, {8 + settings.kv_queue} "
                                             "admitted")
    assert "measured at warm-up" in info.profile.calibration


def test_each_engine_configuration_keeps_its_own_default_profile() -> None:
    """A profile measured at the defaults once priced --batch-invariant steps (19 ms at
    16 sessions on an H100, against 12.5 predicted): its one-session spot check passed,
    so the verify-width rule chose widths the invariant kernels could not afford. The
    default profile file now names what changes the costs: engine and invariance."""
    base = CloudSettings(device="cuda", dtype="bfloat16")
    paths = {
        base.resolved_profile_path("m"),
        replace(base, batch_invariant=True).resolved_profile_path("m"),
        replace(base, engine="hf").resolved_profile_path("m"),
        replace(base, engine="hf", batch_invariant=True).resolved_profile_path("m"),
    }
    assert len(paths) == 4
    explicit = replace(base, batch_invariant=True, profile_path=Path("/x/mine.msgpack"))
    assert explicit.resolved_profile_path("m") == Path("/x/mine.msgpack")
