"""The live view over real gRPC (issue 21): Verifier.GetStats, the edge's GetStatus, and
``eventspec status HOST:PORT`` on either node.

While an Ask is in flight (the cloud paced to a slow prefill, so there is time to look),
the cloud reports one live session holding one KV slot and the edge one Ask in flight;
afterwards both count the request as served and hold nothing.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from eventspec.cloud.server import VerifierServer
from eventspec.shared.client import cli
from eventspec.shared.client.edge_client import EdgeClient
from eventspec.shared.client.status_view import fetch_status
from eventspec.shared.contract.types import AskSpec, GenerationSettings, Mode
from tests.support import cloud_harness as ch
from tests.support import edge_harness as eh


async def _poll(address: str, kind: str, ready: object, timeout_s: float = 10.0) -> object:
    """Ask ``address`` until ``ready(message)`` holds, at most ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        status = await fetch_status(address)
        assert status.kind == kind
        if ready(status.message):  # type: ignore[operator]
            return status.message
        assert loop.time() < deadline, f"never ready: {status.message}"
        await asyncio.sleep(0.02)


async def test_live_sessions_slots_and_asks_while_a_request_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    stack = await eh.start_stack(slow=(1.0, 0.02))
    cloud_addr = f"127.0.0.1:{stack.cloud.port}"
    try:
        async with EdgeClient(stack.edge_address, timeout_s=60) as client:
            ask = asyncio.create_task(client.ask_final(AskSpec(
                "What is moving?", mode=Mode.TARGET_ONLY,
                generation=GenerationSettings(max_new_tokens=4))))
            busy = await _poll(cloud_addr, "cloud", lambda m: m.live_sessions == 1)
            assert busy.kv_slots_used == 1  # type: ignore[attr-defined]
            assert busy.kv_slots_total >= 1  # type: ignore[attr-defined]
            assert 0 < busy.kv_positions_used <= busy.kv_positions_total  # type: ignore[attr-defined]
            assert busy.kv_layout == "slots"  # the HF engine on CPU  # type: ignore[attr-defined]
            assert busy.state == "serving"  # type: ignore[attr-defined]
            edge = await _poll(stack.edge_address, "edge", lambda m: m.asks_in_flight == 1)
            assert edge.serving and edge.cloud_slots >= 1  # type: ignore[attr-defined]
            final = await ask
        after = await _poll(cloud_addr, "cloud", lambda m: m.live_sessions == 0)
        edge_after = await _poll(stack.edge_address, "edge", lambda m: m.asks_in_flight == 0)
        rc_cloud = await asyncio.to_thread(cli.main, ["status", cloud_addr])
        text_cloud = capsys.readouterr().out
        rc_edge = await asyncio.to_thread(cli.main, ["status", stack.edge_address, "--json"])
        json_edge = json.loads(capsys.readouterr().out)
    finally:
        await stack.stop()
    assert final.stats.new_tokens > 0
    assert after.requests_served == 1 and after.kv_slots_used == 0  # type: ignore[attr-defined]
    assert after.engine_steps >= final.stats.target_steps - 1  # type: ignore[attr-defined]
    assert edge_after.requests_served == 1  # type: ignore[attr-defined]
    # Every step under its kind: the first after the prompt's own call, then plain ones.
    kinds = {k.kind: k for k in after.step_kinds}  # type: ignore[attr-defined]
    assert sum(k.steps for k in kinds.values()) == after.engine_steps  # type: ignore[attr-defined]
    assert set(kinds) <= {"after_prefill", "plain"} and kinds["plain"].steps >= 1
    assert kinds["plain"].gap_ms_p99 >= kinds["plain"].gap_ms_p50 > 0
    assert re.search(r"^    plain steps +\d+: device p50/p99 [\d.]+/[\d.]+ ms, gaps p50/p99 "
                     r"[\d.]+/[\d.]+ ms \(\d+ in the ITL p99 tail\)$", text_cloud, flags=re.M)
    assert re.search(r"^    after_prefill steps +1: .*, no session gaps$", text_cloud, flags=re.M)
    assert rc_cloud == 0 and rc_edge == 0
    assert text_cloud.startswith(f"cloud verifier {cloud_addr}: serving")
    assert "KV slots" in text_cloud
    assert re.search(r"^  capacity +\d+ sessions run at once, \d+ admitted \(--max-sessions",
                     text_cloud, flags=re.M), "the status says how many fit and why"
    assert re.search(r"^  KV positions +0 of [\d,]+ in use \(slots\)$", text_cloud, flags=re.M)
    assert re.search(r"^  prefill +whole$", text_cloud, flags=re.M)
    assert re.search(r"^  prefix cache +off$", text_cloud, flags=re.M)
    assert re.search(r"^  batch-invariant +no$", text_cloud, flags=re.M)
    assert re.search(r"^  requests served +1$", text_cloud, flags=re.M)
    assert json_edge["node"] == "edge" and json_edge["requests_served"] == "1"
    assert json_edge["asks_in_flight"] == 0 and json_edge["serving"] is True


async def test_stats_while_warming_up_and_an_unreachable_node(
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = VerifierServer(ch.settings(), target=eh.shared_models()[0], cost=ch.TEST_COST)
    await server.start(warm=False)  # bound, NOT_SERVING, nothing loaded
    try:
        status = await fetch_status(f"127.0.0.1:{server.port}")
    finally:
        await server.stop(0)
    assert status.kind == "cloud"
    assert status.message.state == "warming up: starting"  # type: ignore[attr-defined]
    rc = await asyncio.to_thread(cli.main, ["status", f"127.0.0.1:{server.port}",
                                            "--timeout", "2"])
    assert rc == 1
    assert "cannot reach" in capsys.readouterr().err
