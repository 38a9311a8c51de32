"""``eventspec-cloud serve`` as a real process: port file, health, reflection, SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from eventspec.shared.client.launch import entry_point_command
from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from eventspec.shared.wire.health import wait_for_serving
from tests.support.cli_processes import PACED_CLOUD

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 10.0


def _wait_for_port(proc: subprocess.Popen[bytes], port_file: Path) -> int:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode() if proc.stdout else ""
            pytest.fail(f"eventspec-cloud exited early with {proc.returncode}:\n{out}")
        text = port_file.read_text().strip() if port_file.exists() else ""
        if text.isdigit():
            return int(text)
        time.sleep(0.05)
    pytest.fail(f"no port file after {START_TIMEOUT_S:.0f} s")


async def _list_services(address: str) -> list[str]:
    async with aio.insecure_channel(address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        call = stub.ServerReflectionInfo(timeout=10)
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        resp = await call.read()
        await call.done_writing()
        return [s.name for s in resp.list_services_response.service]


async def _probe(address: str) -> tuple[list[str], int, str]:
    await wait_for_serving(address, timeout_s=30)
    await wait_for_serving(address, timeout_s=5, service="eventspec.v1.Verifier")
    services = await _list_services(address)
    async with aio.insecure_channel(address) as ch:
        health = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
        info = await verifier_pb2_grpc.VerifierStub(ch).GetServerInfo(
            verifier_pb2.GetServerInfoRequest(), timeout=10
        )
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    return services, info.limits.max_sessions, info.model_id


def test_serve_health_reflection_and_sigterm(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    # ROOT first, the caller's path after it (a worktree's links to its own packages).
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(
        entry_point_command("eventspec-cloud", [
            "serve", "--model", "tiny-random", "--port", "0", "--port-file", str(port_file),
            *PACED_CLOUD, "--max-sessions", "3"]),
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        port = _wait_for_port(proc, port_file)
        assert port > 0
        services, max_sessions, model_id = asyncio.run(_probe(f"127.0.0.1:{port}"))
        assert "eventspec.v1.Verifier" in services
        assert "grpc.health.v1.Health" in services
        assert max_sessions == 3
        assert model_id.startswith("tiny-random")

        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=EXIT_TIMEOUT_S)
        out = proc.stdout.read().decode() if proc.stdout else ""
        assert code == 0, out
        assert time.monotonic() - t0 < EXIT_TIMEOUT_S
        assert "shutting down" in out
        assert "Traceback" not in out, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
