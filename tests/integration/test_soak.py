"""A bounded soak: 32 concurrent clients through a real edge and cloud on the toy models.

Slow (deselected by ``make test``). Runs ``EVENTSPEC_SOAK_S`` seconds (default 600),
then asserts no request failed and the process's RSS grew by at most
``RSS_GROWTH_BOUND_MIB`` between the end of a warm-up round and the end of the run
(leaked sessions, KV slots, tasks or buffers would show up as steady growth). Prints
the figures: requests, errors, p50/p99 latency, RSS at start and end.

    EVENTSPEC_SOAK_S=60 python -m pytest -q -s -m slow tests/integration/test_soak.py
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import pytest

from eventspec.cloud.config import CloudSettings
from eventspec.cloud.server import VerifierServer
from eventspec.edge.config import EdgeSettings
from eventspec.edge.server import EdgeServer
from eventspec.shared.client.edge_client import AskError, EdgeClient
from eventspec.shared.contract.types import AskSpec, GenerationSettings, Mode, ServerLimits
from tests.support import cloud_harness as ch

pytestmark = pytest.mark.slow

CLIENTS = 32
DEFAULT_SOAK_S = 600.0
#: RSS may grow this much after warm-up (allocator high-water marks, caches settling).
RSS_GROWTH_BOUND_MIB = 64.0
QUESTIONS = ("What is moving?", "Describe the scene.", "Which way does it go?")
MODES = (Mode.SPECULATIVE, Mode.TARGET_ONLY)


def rss_mib() -> float:
    """This process's resident set size (both servers and the clients live in it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


async def _client(address: str, n: int, until: float, latencies: list[float],
                  errors: list[str]) -> None:
    """Ask back to back until ``until`` (at least once)."""
    async with EdgeClient(address, timeout_s=300) as client:
        i = 0
        while i == 0 or time.monotonic() < until:
            spec = AskSpec(QUESTIONS[(n + i) % len(QUESTIONS)], mode=MODES[(n + i) % 2],
                           generation=GenerationSettings(max_new_tokens=16))
            t0 = time.monotonic()
            try:
                final = await client.ask_final(spec)
                if not final.token_ids:
                    errors.append("empty answer")
            except AskError as exc:
                errors.append(f"{exc.code.name}: {exc.details}")
            latencies.append(time.monotonic() - t0)
            i += 1


async def _round(address: str, duration_s: float) -> tuple[list[float], list[str]]:
    latencies: list[float] = []
    errors: list[str] = []
    until = time.monotonic() + duration_s
    await asyncio.gather(*(_client(address, n, until, latencies, errors)
                           for n in range(CLIENTS)))
    return latencies, errors


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def test_soak_32_clients_no_errors_bounded_rss() -> None:
    duration = float(os.environ.get("EVENTSPEC_SOAK_S", DEFAULT_SOAK_S))
    limits = replace(ServerLimits(), max_sessions=CLIENTS)
    cloud = VerifierServer(replace(CloudSettings(), port=0, limits=limits,
                                   max_sessions_per_principal=CLIENTS), cost=ch.TEST_COST)
    await cloud.start()
    edge = EdgeServer(replace(EdgeSettings(), cloud=f"127.0.0.1:{cloud.port}", port=0,
                              request_timeout_s=300.0))
    await edge.start()
    address = f"127.0.0.1:{edge.port}"
    try:
        warm, warm_errors = await _round(address, 0.0)  # one request per client
        assert not warm_errors, warm_errors[:5]
        start_rss = rss_mib()
        t0 = time.monotonic()
        latencies, errors = await _round(address, duration)
        elapsed = time.monotonic() - t0
        end_rss = rss_mib()
        print(f"\nsoak: {CLIENTS} clients, {elapsed:.0f} s, {len(latencies)} requests "
              f"({len(latencies) / elapsed:.2f}/s), {len(errors)} errors; latency p50 "
              f"{statistics.median(latencies):.2f} s, p99 {_p(latencies, 0.99):.2f} s, max "
              f"{max(latencies):.2f} s; RSS {start_rss:.0f} -> {end_rss:.0f} MiB "
              f"({end_rss - start_rss:+.0f}); warm-up p50 {statistics.median(warm):.2f} s")
        assert not errors, errors[:5]
        assert end_rss - start_rss <= RSS_GROWTH_BOUND_MIB
        assert cloud.live_sessions == 0 and cloud.held_slots == 0
    finally:
        await edge.stop(0)
        await cloud.stop(0)
