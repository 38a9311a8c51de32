"""Transport security and authentication on real servers on loopback, with real
certificates from a test CA: TLS and mutual TLS, bad certificates, bearer tokens and
their rotation, open health (Check and Watch), reflection behind auth, and the
start-up refusals (busy port, plaintext on a non-loopback address, bad port).
``test_security_deployed.py`` has both hops together, the principal in handlers, the
deploy probe and SIGHUP reloads."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from eventspec.cloud.server import VerifierServer
from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from eventspec.shared.wire.channel import call_metadata, open_channel
from eventspec.shared.wire.host import GrpcHost
from eventspec.shared.wire.security import ClientSecurity, SecurityConfigError, ServerSecurity
from tests.support import edge_harness as eh
from tests.support import tls_harness as th
from tests.support.grpc_races import refused
from tests.support.tls_harness import TOKEN_A, TOKEN_B, Pki

CALL_TIMEOUT = 5.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return th.make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
async def cloud_factory() -> AsyncIterator[list[VerifierServer]]:
    servers: list[VerifierServer] = []
    yield servers
    for s in servers:
        await s.stop(0)


async def server_info(port: int, sec: ClientSecurity | None) -> grpc.StatusCode:
    """GetServerInfo's status code (OK when it answers)."""
    async with open_channel(f"127.0.0.1:{port}", sec) as channel:
        stub = verifier_pb2_grpc.VerifierStub(channel)
        try:
            await stub.GetServerInfo(verifier_pb2.GetServerInfoRequest(),
                                     timeout=CALL_TIMEOUT, metadata=call_metadata(sec))
        except aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def run(factory: list[VerifierServer], security: ServerSecurity) -> int:
    server = await eh.start_secure_cloud(security)
    factory.append(server)
    return server.port


# -- TLS and mutual TLS -------------------------------------------------------------------

async def test_tls_with_token_happy_path_and_plaintext_refused(
    pki: Pki, tmp_path: Path, cloud_factory: list[VerifierServer]
) -> None:
    tokens = th.write_tokens(tmp_path / "tokens", edge_a=TOKEN_A)
    port = await run(cloud_factory, th.server_security(pki, token_file=tokens))
    assert await server_info(port, th.client_security(pki, token=TOKEN_A)) == grpc.StatusCode.OK
    # A plaintext client cannot talk to a TLS port at all.
    plain = ClientSecurity(token=TOKEN_A)
    assert await server_info(port, plain) == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_certificate_is_the_principal(
    pki: Pki, cloud_factory: list[VerifierServer]
) -> None:
    sec = th.server_security(pki, mtls=True, allow_principals=frozenset({"edge-a.example"}))
    port = await run(cloud_factory, sec)
    ok = await server_info(port, th.client_security(pki, leaf=pki.client_a))
    assert ok == grpc.StatusCode.OK
    # Signed by the same CA, but a principal the server does not allow.
    denied = await server_info(port, th.client_security(pki, leaf=pki.client_b))
    assert denied == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize("case", ["no client certificate", "client certificate from another CA",
                                  "expired client certificate", "server from an untrusted CA"])
async def test_bad_certificates_fail_the_handshake(
    pki: Pki, cloud_factory: list[VerifierServer], case: str
) -> None:
    port = await run(cloud_factory, th.server_security(pki, mtls=True))
    sec = {
        "no client certificate": th.client_security(pki),
        "client certificate from another CA": th.client_security(pki, leaf=pki.rogue_client),
        "expired client certificate": th.client_security(pki, leaf=pki.expired_client),
        "server from an untrusted CA": th.client_security(pki, leaf=pki.client_a,
                                                          ca=pki.other_ca),
    }[case]
    assert await server_info(port, sec) == grpc.StatusCode.UNAVAILABLE, case


async def test_expired_server_certificate_is_refused_by_the_client(
    pki: Pki, cloud_factory: list[VerifierServer]
) -> None:
    port = await run(cloud_factory, th.server_security(pki, mtls=True, leaf=pki.expired_server))
    sec = th.client_security(pki, leaf=pki.client_a)
    assert await server_info(port, sec) == grpc.StatusCode.UNAVAILABLE


async def test_certificate_replaced_on_disk_is_used_by_new_connections(
    pki: Pki, tmp_path: Path, cloud_factory: list[VerifierServer]
) -> None:
    """Renewal without restart: swap the files for a certificate from a new CA."""
    live = th.Leaf(tmp_path / "live.pem", tmp_path / "live.key")
    live.cert.write_bytes(pki.server.cert.read_bytes())
    live.key.write_bytes(pki.server.key.read_bytes())
    port = await run(cloud_factory, th.server_security(pki, leaf=live, insecure=True))
    renewed = pki.issue_server("renewed", other_ca=True)
    new_ca = pki.root / "renewed-ca.pem"
    assert await server_info(port, th.client_security(pki, ca=new_ca)) != grpc.StatusCode.OK
    live.cert.write_bytes(renewed.cert.read_bytes())
    live.key.write_bytes(renewed.key.read_bytes())
    later = os.stat(live.cert).st_mtime + 5
    os.utime(live.cert, (later, later))
    os.utime(live.key, (later, later))
    assert await server_info(port, th.client_security(pki, ca=new_ca)) == grpc.StatusCode.OK
    # SIGHUP path: the host's reload forces a re-read even with unchanged times.
    server = cloud_factory[-1]
    assert server._host is not None
    server._host.reload_tls()
    assert await server_info(port, th.client_security(pki, ca=new_ca)) == grpc.StatusCode.OK


# -- tokens -------------------------------------------------------------------------------

async def test_tokens_missing_wrong_and_rotated(
    pki: Pki, tmp_path: Path, cloud_factory: list[VerifierServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    tokens = th.write_tokens(tmp_path / "tokens", edge_a=TOKEN_A)
    port = await run(cloud_factory, th.server_security(pki, token_file=tokens))
    with caplog.at_level(logging.WARNING, logger="eventspec.shared.wire.auth"):
        missing = await server_info(port, th.client_security(pki))
        wrong = await server_info(port, th.client_security(pki, token=TOKEN_A[:-1] + "X"))
    assert missing == wrong == grpc.StatusCode.UNAUTHENTICATED
    logged = caplog.text
    assert "UNAUTHENTICATED" in logged and "GetServerInfo" in logged and "127.0.0.1" in logged
    assert TOKEN_A[:-1] not in logged  # never the token
    # Rotation: add the new token next to the old one, then retire the old one.
    th.write_tokens(tokens, edge_a=TOKEN_A, edge_b=TOKEN_B)
    _touch_later(tokens)
    assert await server_info(port, th.client_security(pki, token=TOKEN_B)) == grpc.StatusCode.OK
    assert await server_info(port, th.client_security(pki, token=TOKEN_A)) == grpc.StatusCode.OK
    th.write_tokens(tokens, edge_b=TOKEN_B)
    _touch_later(tokens)
    old = await server_info(port, th.client_security(pki, token=TOKEN_A))
    assert old == grpc.StatusCode.UNAUTHENTICATED
    assert await server_info(port, th.client_security(pki, token=TOKEN_B)) == grpc.StatusCode.OK


async def test_removing_or_emptying_the_token_file_revokes(
    pki: Pki, tmp_path: Path, cloud_factory: list[VerifierServer],
) -> None:
    """Issue 19, item 11: the tokens loaded before stay valid no longer once their file
    is emptied or deleted; a file that comes back is read again, and a malformed edit
    keeps the previous tokens (a typo must not lock every caller out)."""
    tokens = th.write_tokens(tmp_path / "tokens", edge_a=TOKEN_A)
    port = await run(cloud_factory, th.server_security(pki, token_file=tokens))
    a = th.client_security(pki, token=TOKEN_A)
    assert await server_info(port, a) == grpc.StatusCode.OK
    tokens.write_text("")
    assert await server_info(port, a) == grpc.StatusCode.UNAUTHENTICATED
    th.write_tokens(tokens, edge_a=TOKEN_A)
    _touch_later(tokens)
    assert await server_info(port, a) == grpc.StatusCode.OK
    tokens.unlink()
    assert await server_info(port, a) == grpc.StatusCode.UNAUTHENTICATED
    th.write_tokens(tokens, edge_a=TOKEN_A)
    assert await server_info(port, a) == grpc.StatusCode.OK
    tokens.write_text("edge-a:short\n")
    _touch_later(tokens)
    assert await server_info(port, a) == grpc.StatusCode.OK


#: authorization values and what the server answers (the token is TOKEN_A).
AUTHORIZATION_CASES = {
    "Bearer {t}": "OK",
    "bearer {t}": "OK",  # RFC 7235 2.1: the scheme is case-insensitive
    "BEARER {t}": "OK",
    "Bearer   {t}": "OK",  # RFC 6750 2.1: "Bearer" 1*SP b64token
    "Bearer {t} ": "UNAUTHENTICATED: the authorization metadata has whitespace after",
    "Bearer {t}   ": "UNAUTHENTICATED: the authorization metadata has whitespace after",
    "Bearer {a} {b}": "UNAUTHENTICATED: the authorization metadata has whitespace after",
    " Bearer {t}": "UNAUTHENTICATED: the authorization metadata must be 'Bearer TOKEN'",
    "Basic {t}": "UNAUTHENTICATED: the authorization metadata must be 'Bearer TOKEN'",
}


async def _answer_to(port: int, sec: ClientSecurity, authorization: str) -> str:
    """``OK``, or the refusal's code and the start of its message."""
    async with open_channel(f"127.0.0.1:{port}", sec) as channel:
        stub = verifier_pb2_grpc.VerifierStub(channel)
        try:
            await stub.GetServerInfo(verifier_pb2.GetServerInfoRequest(), timeout=CALL_TIMEOUT,
                                     metadata=(("authorization", authorization),))
        except aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    return "OK"


async def test_bearer_scheme_in_any_case_and_the_token_exactly_as_sent(
    pki: Pki, tmp_path: Path, cloud_factory: list[VerifierServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 38: the scheme is case-insensitive and one or more spaces precede the token
    (RFC 7235, RFC 6750), but the token is compared as sent: a space after it (which
    gRPC passes through) is refused with a message saying why, not stripped."""
    tokens = th.write_tokens(tmp_path / "tokens", edge_a=TOKEN_A)
    port = await run(cloud_factory, th.server_security(pki, token_file=tokens))
    sec = th.client_security(pki)  # no token of its own: the metadata is the case's
    answers = {}
    with caplog.at_level(logging.WARNING, logger="eventspec.shared.wire.auth"):
        for case in AUTHORIZATION_CASES:
            value = case.format(t=TOKEN_A, a=TOKEN_A[:16], b=TOKEN_A[16:])
            answer = await _answer_to(port, sec, value)
            expected = AUTHORIZATION_CASES[case]
            answers[case] = expected if answer.startswith(expected) else answer
    assert answers == AUTHORIZATION_CASES
    assert TOKEN_A not in caplog.text and TOKEN_A[16:] not in caplog.text  # never the token


def _touch_later(path: Path) -> None:
    later = os.stat(path).st_mtime + 5
    os.utime(path, (later, later))


async def test_bad_token_file_is_a_clear_start_up_error(pki: Pki, tmp_path: Path) -> None:
    bad = tmp_path / "tokens"
    bad.write_text("edge-a:short\n")
    with pytest.raises(SecurityConfigError, match=r"--token-file .*entry 1 \(edge-a\).*16"):
        GrpcHost("x", max_message_bytes=1 << 20, max_rpcs=4,
                 security=th.server_security(pki, token_file=bad))


# -- health and reflection ----------------------------------------------------------------

async def test_health_check_and_watch_are_open(
    pki: Pki, tmp_path: Path, cloud_factory: list[VerifierServer]
) -> None:
    """Probes carry no token; Watch (client-side health checking) must not be INTERNAL."""
    tokens = th.write_tokens(tmp_path / "tokens", edge_a=TOKEN_A)
    port = await run(cloud_factory, th.server_security(pki, token_file=tokens))
    async with open_channel(f"127.0.0.1:{port}", th.client_security(pki)) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        check = await stub.Check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
        watch = stub.Watch(health_pb2.HealthCheckRequest(service="eventspec.v1.Verifier"),
                           timeout=CALL_TIMEOUT)
        first = await watch.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()


async def test_watch_reports_not_serving_on_shutdown_on_a_plain_server() -> None:
    server = await eh.start_secure_cloud(ServerSecurity())
    try:
        async with aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(),
                                                              timeout=CALL_TIMEOUT)
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            assert server._host is not None
            await server._host.set_serving(False)
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
            watch.cancel()
    finally:
        await server.stop(0)


async def _list_services(port: int, sec: ClientSecurity, version: str) -> list[str]:
    """ListServices through the standard reflection messages, on v1alpha or v1."""
    async with open_channel(f"127.0.0.1:{port}", sec) as channel:
        call = channel.stream_stream(
            f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )(timeout=CALL_TIMEOUT, metadata=call_metadata(sec))
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        await call.done_writing()
        reply = await call.read()
        return [s.name for s in reply.list_services_response.service]


async def test_reflection_v1_and_v1alpha_behind_auth(
    pki: Pki, tmp_path: Path, cloud_factory: list[VerifierServer]
) -> None:
    tokens = th.write_tokens(tmp_path / "tokens", edge_a=TOKEN_A)
    port = await run(cloud_factory, th.server_security(pki, token_file=tokens))
    authed = th.client_security(pki, token=TOKEN_A)
    for version in ("v1", "v1alpha"):
        names = await _list_services(port, authed, version)
        assert {"eventspec.v1.Verifier", "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection"} <= set(names), names
        err = await refused(lambda v=version: _list_services(port, th.client_security(pki), v))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    # The standard client's descriptor database resolves the service over v1alpha.
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    def describe() -> str:
        creds = grpc.ssl_channel_credentials(pki.ca.read_bytes())
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(
            TOKEN_A))
        with grpc.secure_channel(f"127.0.0.1:{port}", creds,
                                 options=[("grpc.ssl_target_name_override", "localhost")]) as c:
            db = ProtoReflectionDescriptorDatabase(c)
            return str(db.FindFileContainingSymbol("eventspec.v1.Verifier").name)

    assert (await asyncio.to_thread(describe)).endswith(".proto")


async def test_no_reflection(pki: Pki, tmp_path: Path,
                             cloud_factory: list[VerifierServer]) -> None:
    tokens = th.write_tokens(tmp_path / "tokens", edge_a=TOKEN_A)
    port = await run(cloud_factory,
                     th.server_security(pki, token_file=tokens, reflection=False))
    err = await refused(lambda: _list_services(port, th.client_security(pki, token=TOKEN_A), "v1"))
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED


# -- start-up refusals --------------------------------------------------------------------

async def test_busy_port_is_a_clear_error() -> None:
    first = GrpcHost("x", max_message_bytes=1 << 20, max_rpcs=4)
    port = await first.start("127.0.0.1", 0)
    try:
        second = GrpcHost("x", max_message_bytes=1 << 20, max_rpcs=4)
        with pytest.raises(OSError, match=rf"cannot listen on 127\.0\.0\.1:{port}.*in use"):
            await second.start("127.0.0.1", port)
    finally:
        await first.stop(0)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "verifier.example"])
async def test_non_loopback_without_tls_or_auth_refuses_to_start(
    pki: Pki, tmp_path: Path, host: str
) -> None:
    plain = GrpcHost("x", max_message_bytes=1 << 20, max_rpcs=4)
    with pytest.raises(SecurityConfigError, match=r"plaintext on non-loopback.*--insecure"):
        await plain.start(host, 0)
    anonymous = GrpcHost("x", max_message_bytes=1 << 20, max_rpcs=4,
                         security=th.server_security(pki))
    with pytest.raises(SecurityConfigError, match=r"anonymous callers.*--token-file"):
        await anonymous.start(host, 0)


@pytest.mark.parametrize("port", [-1, 65536, 10**6])
async def test_port_out_of_range_is_refused(port: int) -> None:
    host = GrpcHost("x", max_message_bytes=1 << 20, max_rpcs=4)
    with pytest.raises(SecurityConfigError, match=r"--port .* out of range"):
        await host.start("127.0.0.1", port)


def test_cli_refuses_non_loopback_plaintext(tmp_path: Path) -> None:
    """The real command line: a usage error, exit 2 with the reason, before loading any
    model (issue 38: it was exit 1, after the server module had loaded)."""
    from eventspec.cloud.cli import main

    with pytest.raises(SystemExit, match="--tls-cert and --tls-key go together"):
        main(["serve", "--host", "0.0.0.0", "--tls-cert", str(tmp_path / "x.pem")])
    with pytest.raises(SystemExit) as refused:
        main(["serve", "--model", "tiny-random", "--host", "0.0.0.0", "--port", "0"])
    assert refused.value.code == 2
