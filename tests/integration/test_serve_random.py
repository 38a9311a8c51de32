"""``python -m benchmarks.serve_random``: a cloud process over a random target, serving
like ``eventspec-cloud serve`` (the end-to-end benchmark's cloud on the GPU machine,
where no checkpoint loads; here the tiny size)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc

from eventspec.demoworld.tiny_target import TINY_TARGET_ID
from eventspec.shared.client.launch import stop_node, wait_for_port
from eventspec.shared.contract.convert_verifier import server_info_from_pb
from eventspec.shared.contract.types import ServerInfo
from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from eventspec.shared.wire.health import wait_for_serving

ROOT = Path(__file__).resolve().parents[2]


async def server_info(address: str) -> ServerInfo:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await verifier_pb2_grpc.VerifierStub(channel).GetServerInfo(
            verifier_pb2.GetServerInfoRequest(), timeout=30)
    return server_info_from_pb(reply)


async def test_a_random_target_serves_with_the_serve_flags(tmp_path: Path) -> None:
    port_file, log = tmp_path / "port", tmp_path / "cloud.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.serve_random", "--size", "tiny", "--device",
             "cpu", "--", "--port", "0", "--port-file", str(port_file), "--max-sessions", "3",
             "--emulate-prefill-ms", "50", "--emulate-step-ms", "10"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        port = await wait_for_port(proc, port_file, log, 120)
        await wait_for_serving(f"127.0.0.1:{port}", timeout_s=120)
        info = await server_info(f"127.0.0.1:{port}")
        assert info.model_id.startswith(TINY_TARGET_ID)
        assert info.limits.max_sessions == 3  # the serve flags were honoured
        assert "RANDOM tiny target" in log.read_text()
    finally:
        stop_node(proc)
    assert proc.returncode == 0, log.read_text()[-2000:]
