"""`eventspec ask` says when an answer was cut (issue 19, item 10): a KV-clamped answer
(fewer tokens than asked) used to exit 0 with nothing but ``--json``'s finish_reason to
tell it from a whole one. Now one stderr line names the reason and the counts; the exit
status stays 0, since an answer arrived (README, "A cut answer")."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from eventspec.cloud.server import VerifierServer
from eventspec.edge.config import EdgeSettings
from eventspec.edge.server import EdgeServer
from eventspec.shared.client import cli
from tests.support import cloud_harness as ch
from tests.support import edge_harness as eh

Q = "What is moving?"
ROOM = 5  # answer positions a KV slot has after the prompt


async def _run_ask(capsys: pytest.CaptureFixture[str], edge_port: int, *flags: str
                   ) -> tuple[int, dict[str, object], str]:
    args = cli.build_parser().parse_args(
        ["ask", "--edge", f"127.0.0.1:{edge_port}", "--mode", "target_only", "--json",
         *flags, Q])
    status = await cli._ask(args, cli.spec_from_args(args), None)
    out = capsys.readouterr()
    return status, json.loads(out.out), out.err


async def test_a_kv_clamped_answer_says_so_on_stderr(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    target, draft = eh.shared_models()
    prompt = len(target.build_prompt_ids(Q))
    cloud = VerifierServer(replace(ch.settings(max_sessions=2), max_seq_len=prompt + ROOM),
                           target=target, cost=ch.TEST_COST)
    await cloud.start()
    edge = EdgeServer(replace(EdgeSettings(), cloud=f"127.0.0.1:{cloud.port}", port=0),
                      draft=draft)
    await edge.start()
    try:
        status, final, err = await _run_ask(capsys, edge.port, "--max-new-tokens", "64")
        assert status == 0
        assert final["finish_reason"] == "max_tokens"
        got = len(final["token_ids"])  # type: ignore[arg-type]
        assert got <= ROOM
        assert f"answer cut: max_tokens ({got} of 64 tokens; the cloud's context limit" in err
        status, final, err = await _run_ask(capsys, edge.port, "--max-new-tokens", "2")
        assert status == 0 and final["finish_reason"] == "max_tokens"
        assert "answer cut: max_tokens (2 of 2 tokens; --max-new-tokens)" in err
    finally:
        await edge.stop(0)
        await cloud.stop(0)
