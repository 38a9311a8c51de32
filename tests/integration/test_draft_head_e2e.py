"""Every drafting backend of issue 22 through a real edge and a paced toy cloud: greedy
speculative output is token-identical to target-only with the raw misaligned drafter,
the token adapter and the draft head (``--draft-head``), and the edge reports which.
With ``--commit-log`` the edge logs each speculative request's committed tokens (and
the drafter's hidden states there), nothing for target-only ones."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from eventspec.cloud.engine.hf import HFEngine
from eventspec.cloud.engine.paced import PacedEngine
from eventspec.cloud.server import VerifierServer
from eventspec.edge.config import EdgeSettings
from eventspec.edge.events.toy import ToySource
from eventspec.edge.learning.commit_log import read_log
from eventspec.edge.model_dirs import (
    TOY_DRAFT_HEAD_DIR,
    TOY_MISALIGNED,
    TOY_MISALIGNED_DIR,
    TOY_TOKEN_ADAPTER_DIR,
)
from eventspec.edge.server import EdgeServer
from eventspec.shared.client.edge_client import EdgeClient
from eventspec.shared.contract.types import Mode
from tests.support import cloud_harness as ch
from tests.support.edge_harness import ask, slow_cost, toy_target

QUESTIONS = ["Which way is the object moving?", "How many objects are there?"]
MAX_NEW = 12


@pytest.mark.parametrize("head", [None, TOY_TOKEN_ADAPTER_DIR, TOY_DRAFT_HEAD_DIR],
                         ids=["raw", "adapter", "head"])
async def test_greedy_speculation_is_lossless_with_every_backend(
        tmp_path: Path, head: Path | None) -> None:
    target = toy_target()
    engine = PacedEngine(HFEngine(target), prefill_ms=100, step_ms=10)
    cloud = VerifierServer(ch.settings(max_sessions=2), target=target, engine=engine,
                           cost=slow_cost(0.1, 0.01))
    await cloud.start()
    edge = EdgeServer(replace(EdgeSettings(), cloud=f"127.0.0.1:{cloud.port}", port=0,
                              model=TOY_MISALIGNED, speculation="always", draft_head=head,
                              commit_log=tmp_path / "log", profile_path=tmp_path / "edge.msgpack"),
                      source=ToySource([0]))
    try:
        await edge.start()
        address = f"127.0.0.1:{edge.port}"
        async with EdgeClient(address, timeout_s=30) as client:
            status = await client.status()
        kind = "adapter" if head == TOY_TOKEN_ADAPTER_DIR else "head"
        assert status.draft_engine == ("hf" if head is None else f"hf + {kind} {head.name}")
        drafted = accepted = 0
        answers = []
        for q in QUESTIONS:
            truth = await ask(address, q, Mode.TARGET_ONLY, max_new=MAX_NEW)
            spec = await ask(address, q, Mode.SPECULATIVE, max_new=MAX_NEW)
            assert spec.token_ids == truth.token_ids, (q, spec.stats)
            assert spec.answer == truth.answer
            drafted += spec.stats.drafted
            accepted += spec.stats.accepted
            answers.append(list(spec.token_ids))
        assert drafted > 0
        if head is not None:  # the shipped networks draft what the target says
            assert accepted >= drafted / 2, (accepted, drafted)
    finally:
        await edge.stop(0)
        await cloud.stop(0)
    meta, requests = read_log(tmp_path / "log")
    assert meta.draft_model_id == TOY_MISALIGNED_DIR.name and meta.feature_dim == 192
    assert [r.tokens.tolist() for r in requests] == answers
    assert all(r.features.shape == (len(r.tokens), 192) for r in requests)
