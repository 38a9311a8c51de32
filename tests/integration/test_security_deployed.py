"""Security as deployed, on real servers on loopback with certificates from a test CA:
client -> edge (TLS and a token) -> cloud (mutual TLS) in one ask, the caller's
principal inside handlers, the deploy image's health probe over mutual TLS, an edge the
cloud refuses, and SIGHUP reloading certificates on both servers."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from eventspec.cloud.server import VerifierServer
from eventspec.edge.config import EdgeSettings
from eventspec.edge.server import EdgeServer
from eventspec.shared.client.edge_client import AskError, EdgeClient
from eventspec.shared.contract.types import AskSpec, GenerationSettings, Mode
from eventspec.shared.wire.channel import call_metadata, open_channel
from eventspec.shared.wire.host import GrpcHost
from eventspec.shared.wire.security import ClientSecurity
from tests.support import edge_harness as eh
from tests.support import tls_harness as th
from tests.support.tls_harness import TOKEN_B, Pki
from tests.support.waiting import until_async

CALL_TIMEOUT = 5.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return th.make_pki(tmp_path_factory.mktemp("pki"))


# -- both hops: client -> edge (TLS + token), edge -> cloud (mutual TLS) ----------------

async def test_ask_through_tls_edge_and_mtls_cloud(pki: Pki, tmp_path: Path) -> None:
    _target, draft = eh.shared_models()
    cloud = await eh.start_secure_cloud(th.server_security(
        pki, mtls=True, allow_principals=frozenset({"edge-a.example"})))
    client_tokens = th.write_tokens(tmp_path / "client-tokens", app=TOKEN_B)
    edge = EdgeServer(replace(
        EdgeSettings(), cloud=f"127.0.0.1:{cloud.port}", port=0,
        security=th.server_security(pki, token_file=client_tokens),
        cloud_security=th.client_security(pki, leaf=pki.client_a),
    ), draft=draft)
    await edge.start()
    try:
        spec = AskSpec("What is moving?", mode=Mode.TARGET_ONLY,
                       generation=GenerationSettings(max_new_tokens=6))
        address = f"127.0.0.1:{edge.port}"
        async with EdgeClient(address, timeout_s=60,
                              security=th.client_security(pki, token=TOKEN_B)) as client:
            final = await client.ask_final(spec)
            assert final.token_ids and final.mode == Mode.TARGET_ONLY
            status = await client.status()
            assert status is not None
        async with EdgeClient(address, timeout_s=10,
                              security=th.client_security(pki)) as anonymous:
            with pytest.raises(AskError) as err:
                await anonymous.ask_final(spec)
            assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(AskError) as err:
                await anonymous.status()
            assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await edge.stop(0)
        await cloud.stop(0)


# -- the principal reaches the handler; the deploy probe speaks TLS -----------------------

async def test_handlers_see_the_callers_principal(pki: Pki, tmp_path: Path) -> None:
    """Per-principal limits need the principal inside the servicer
    (eventspec.shared.contract.principal)."""
    from eventspec.shared.contract.principal import current_principal

    async def who(request: bytes, context: aio.ServicerContext) -> bytes:
        await asyncio.sleep(0)
        return str(current_principal()).encode()

    tokens = th.write_tokens(tmp_path / "tokens", app=TOKEN_B)
    host = GrpcHost("test.Who", max_message_bytes=1 << 20, max_rpcs=4,
                    security=th.server_security(pki, mtls=True, token_file=tokens))
    host.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "test.Who", {"Me": grpc.unary_unary_rpc_method_handler(who)}),))
    port = await host.start("127.0.0.1", 0)
    try:
        for sec, expected in [
            (th.client_security(pki, leaf=pki.client_a), b"certificate:edge-a.example"),
            (th.client_security(pki, leaf=pki.client_a, token=TOKEN_B), b"token:app"),
        ]:
            async with open_channel(f"127.0.0.1:{port}", sec) as channel:
                me = channel.unary_unary("/test.Who/Me")
                assert await me(b"", timeout=CALL_TIMEOUT, metadata=call_metadata(sec)) == expected
    finally:
        await host.stop(0)


async def test_deploy_health_probe_over_mutual_tls(
    pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    path = Path(__file__).parents[2] / "deploy" / "docker" / "grpc_health_probe.py"
    spec = importlib.util.spec_from_file_location("grpc_health_probe", path)
    assert spec is not None and spec.loader is not None
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    cloud = await eh.start_secure_cloud(th.server_security(pki, mtls=True))
    try:
        # The server's own files, as the pod's env names them; client_a stands in for a
        # certificate issued for both server and client auth.
        monkeypatch.setenv("EVENTSPEC_CLOUD_TLS_CERT", str(pki.client_a.cert))
        monkeypatch.setenv("EVENTSPEC_CLOUD_TLS_KEY", str(pki.client_a.key))
        monkeypatch.setenv("EVENTSPEC_CLOUD_TLS_CA", str(pki.ca))
        addr = f"127.0.0.1:{cloud.port}"
        assert await asyncio.to_thread(probe.main, [addr, "--tls-env", "EVENTSPEC_CLOUD_"]) == 0
        assert await asyncio.to_thread(probe.main, [addr, "--timeout", "2"]) == 2  # plaintext
    finally:
        await cloud.stop(0)


async def test_edge_refused_by_the_cloud_is_unavailable_to_its_client(
    pki: Pki, tmp_path: Path
) -> None:
    """The client's credentials were fine; the edge's were not: not UNAUTHENTICATED."""
    _, draft = eh.shared_models()
    cloud = await eh.start_secure_cloud(th.server_security(
        pki, mtls=True, allow_principals=frozenset({"edge-a.example"})))
    edge = EdgeServer(replace(
        EdgeSettings(), cloud=f"127.0.0.1:{cloud.port}", port=0,
        cloud_security=th.client_security(pki, leaf=pki.client_b),  # not allowed
    ), draft=draft)
    await edge.start()
    try:
        async with EdgeClient(f"127.0.0.1:{edge.port}", timeout_s=30) as client:
            with pytest.raises(AskError) as err:
                await client.ask_final(AskSpec("What is moving?", mode=Mode.TARGET_ONLY))
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        assert "refused this edge (PERMISSION_DENIED)" in err.value.details
    finally:
        await edge.stop(0)
        await cloud.stop(0)


# -- SIGHUP reloads certificates on both servers ------------------------------------------

async def _health_status(port: int, sec: ClientSecurity) -> grpc.StatusCode:
    async with open_channel(f"127.0.0.1:{port}", sec) as channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                            timeout=CALL_TIMEOUT)
        except aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("node", ["cloud", "edge"])
async def test_sighup_reloads_a_certificate_whose_file_times_did_not_change(
    pki: Pki, tmp_path: Path, node: str
) -> None:
    """A real SIGHUP to the process: the replaced files keep their old modification
    times, so only the signal can make the server read them."""
    import signal

    live = th.Leaf(tmp_path / "live.pem", tmp_path / "live.key")
    live.cert.write_bytes(pki.server.cert.read_bytes())
    live.key.write_bytes(pki.server.key.read_bytes())
    security = th.server_security(pki, leaf=live, insecure=True)
    server: VerifierServer | EdgeServer
    if node == "cloud":
        server = await eh.start_secure_cloud(security)
    else:
        _, draft = eh.shared_models()
        server = EdgeServer(replace(EdgeSettings(), port=0, security=security), draft=draft)
        await server.start()
    try:
        renewed = pki.issue_server(f"sighup-{node}", other_ca=True)
        new_ca = pki.root / f"sighup-{node}-ca.pem"
        stamps = {p: os.stat(p) for p in (live.cert, live.key)}
        live.cert.write_bytes(renewed.cert.read_bytes())
        live.key.write_bytes(renewed.key.read_bytes())
        for path, st in stamps.items():
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        new_client = th.client_security(pki, ca=new_ca)
        assert await _health_status(server.port, new_client) == grpc.StatusCode.UNAVAILABLE
        os.kill(os.getpid(), signal.SIGHUP)

        async def renewed_in_use() -> bool:  # once the loop has run the handler
            return await _health_status(server.port, new_client) == grpc.StatusCode.OK

        await until_async(renewed_in_use, "the renewed certificate serves after SIGHUP",
                          timeout_s=20, poll_s=0.1)
        assert await _health_status(server.port, th.client_security(pki)) != grpc.StatusCode.OK
    finally:
        await server.stop(0)
