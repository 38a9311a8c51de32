"""Every request leaves exactly one log line on the cloud: finished, refused or cancelled.

An operator reading the cloud's log must see the requests it refused (with the code and
reason) and the ones the edge abandoned, not only those that reached Done (issue 13).
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from grpc import aio

from eventspec.cloud.server import VerifierServer
from eventspec.shared.node.logsafe import safe_request_id
from eventspec.shared.pb.eventspec.v1 import verifier_pb2_grpc
from tests.support import cloud_harness as h
from tests.support.waiting import until

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server() -> AsyncIterator[VerifierServer]:
    srv = await h.start_verifier(max_sessions=2, max_new_tokens=32)
    yield srv
    await srv.stop(0)


def request_lines(caplog: pytest.LogCaptureFixture, question: str) -> list[str]:
    """The cloud's lines about the request ``h.open_msg(question, ...)`` opened."""
    prefix = f"generate {safe_request_id(f'test-{question[:8]}')}:"
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("eventspec.cloud") and r.getMessage().startswith(prefix)]


async def one_line(caplog: pytest.LogCaptureFixture, question: str) -> str:
    """The request's one line, once written: the handler writes it in its ``finally``,
    which runs after the client has seen Done or the status."""
    await until(lambda: request_lines(caplog, question), f"the log line of {question!r}")
    (line,) = request_lines(caplog, question)
    return line


async def test_a_finished_request_is_one_line(server: VerifierServer,
                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="eventspec.cloud")
    await h.run_generate(server.port, h.open_msg("Finished?", h.make_frames(1), max_new_tokens=4,
                                                 speculative=False))
    line = await one_line(caplog, "Finished?")
    assert "MAX_TOKENS, 4 tokens" in line


async def test_a_refused_request_is_one_line_with_code_and_reason(
    server: VerifierServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="eventspec.cloud")
    failure = await h.expect_failure(server.port, [
        h.open_msg("Refused?", h.make_frames(1), max_new_tokens=33)])
    assert failure.code.name == "INVALID_ARGUMENT"
    line = await one_line(caplog, "Refused?")
    assert "INVALID_ARGUMENT, 0 tokens" in line
    assert "max_new_tokens 33 exceeds this server's cap of 32" in line


async def test_a_request_the_edge_abandons_is_one_cancelled_line(
    server: VerifierServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="eventspec.cloud")
    async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        call = verifier_pb2_grpc.VerifierStub(ch).Generate(timeout=30)
        await call.write(h.open_msg("Abandoned?", h.make_frames(1), max_new_tokens=32))
        first = await call.read()
        assert first.HasField("plan")
        call.cancel()
    await h.wait_for_sessions(server, 0)
    line = await one_line(caplog, "Abandoned?")
    # The prefill's first token may be committed before the cancel reaches the cloud
    # (a fresh-clone run saw "1 tokens"): the line is about the ending, not the count.
    assert re.search(r", CANCELLED, [01] tokens, .*the edge went away", line), line
