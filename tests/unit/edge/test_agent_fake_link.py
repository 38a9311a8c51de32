"""The edge agent against an in-memory verifier link (the ``VerifierLink`` Protocol):
limits checked before model work, target-only against a cloud of another vocabulary,
and one log line per request."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from eventspec.demoworld.tiny_draft import build_tiny_random_draft
from eventspec.edge.ask.agent import EdgeAgent
from eventspec.edge.drafting.eventgpt import DraftModel
from eventspec.edge.events.sources import open_source
from eventspec.edge.readiness import CloudState, CloudView
from eventspec.shared.contract.convert_verifier import CloudOutbound, EdgeInbound
from eventspec.shared.contract.errors import EventSpecError, FailedPrecondition, InvalidInput
from eventspec.shared.contract.estimators import RttEstimator
from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.contract.types import (
    AskSpec,
    CommitEvent,
    DoneEvent,
    FeatureMode,
    FinalEvent,
    FinishReason,
    GenerationSettings,
    Mode,
    OpenRequest,
    RequestStats,
    ServerInfo,
    ServerLimits,
    VisualGeometry,
)

ANSWER = (11, 12, 13)


class ScriptedStream:
    """Answers any Open with a target-only Plan-less script: three Commits, then Done."""

    def __init__(self) -> None:
        self.uplink_bytes = 0
        self.downlink_bytes = 0
        self.sent: list[EdgeInbound] = []

    async def send(self, msg: EdgeInbound, *, best_effort: bool = False) -> None:
        self.sent.append(msg)

    async def done_writing(self) -> None:
        return None

    async def replies(self) -> AsyncIterator[CloudOutbound]:
        for i, tok in enumerate(ANSWER):
            yield CommitEvent(i, (tok,), 0, 0, f"t{i}", 0.0)
        yield DoneEvent(FinishReason.EOS, ANSWER, "t2", RequestStats(new_tokens=3))

    def cancel(self) -> None:
        return None


class FakeLink:
    def __init__(self, info: ServerInfo) -> None:
        self.address = "in-memory"
        self.rtt = RttEstimator()
        self.reachable = True
        self.last_error = ""
        self.info: ServerInfo | None = info
        self.streams: list[ScriptedStream] = []

    async def server_info(self, timeout_s: float = 5.0) -> ServerInfo:
        assert self.info is not None
        return self.info

    def fresh_info(self, max_age_s: float) -> ServerInfo | None:
        return None  # every Ask asks the fake, as it asks a cloud it has not heard from

    async def diagnose(self, timeout_s: float = 5.0) -> CloudView:
        return CloudView(CloudState.UNREACHABLE, "in-memory")

    def open_stream(self, timeout_s: float) -> ScriptedStream:
        self.streams.append(ScriptedStream())
        return self.streams[-1]

    def mark_failure(self, err: EventSpecError) -> None:
        self.reachable, self.last_error = False, err.message

    def mark_hung(self, stream: object) -> None:
        return None

    async def close(self) -> None:
        return None


@pytest.fixture(scope="module")
def draft() -> DraftModel:
    return build_tiny_random_draft(seed=0)


def info_for(draft: DraftModel, *, fingerprint: str | None = None) -> ServerInfo:
    return ServerInfo(
        model_id="fake", vocab_size=draft.text_vocab_size, text_vocab_size=draft.text_vocab_size,
        vocab_fingerprint=fingerprint or draft.vocab_fingerprint, eos_token_id=2,
        geometry=VisualGeometry(8, 4, 16, 32), feature_modes=(FeatureMode.FRAMES,),
        cloud_cost=CloudCost(50.0, 0.0, 0.0, 10.0, 0.0), limits=ServerLimits(max_question_chars=64),
        prompt_overhead_tokens=10,
    )


def agent_for(draft: DraftModel, info: ServerInfo) -> tuple[EdgeAgent, FakeLink]:
    link = FakeLink(info)
    agent = EdgeAgent(source=open_source("synthetic"), draft=draft, link=link)
    return agent, link


async def collect(agent: EdgeAgent, spec: AskSpec) -> list[object]:
    return [e async for e in agent.ask(spec)]


async def test_oversized_question_is_refused_before_model_work(draft: DraftModel) -> None:
    agent, link = agent_for(draft, info_for(draft))
    with pytest.raises(InvalidInput, match=r"AskRequest.question: 65 characters exceed .* 64"):
        await collect(agent, AskSpec(question="x" * 65))
    assert agent.worker.jobs == 0 and link.streams == []


async def test_draft_only_has_the_default_cap(draft: DraftModel) -> None:
    agent, _ = agent_for(draft, info_for(draft))
    cap = ServerLimits().max_question_chars
    with pytest.raises(InvalidInput, match=r"AskRequest\.question"):
        await collect(agent, AskSpec(question="y" * (cap + 1), mode=Mode.DRAFT_ONLY))
    assert agent.worker.jobs == 0


async def test_token_cap_is_the_clouds(draft: DraftModel) -> None:
    agent, _ = agent_for(draft, info_for(draft))
    spec = AskSpec(question="What?", generation=GenerationSettings(max_new_tokens=10_000))
    with pytest.raises(InvalidInput, match="max_new_tokens 10000 exceeds"):
        await collect(agent, spec)
    assert agent.worker.jobs == 0


async def test_vocabulary_mismatch_refuses_speculation_but_not_target_only(
    draft: DraftModel, caplog: pytest.LogCaptureFixture
) -> None:
    agent, link = agent_for(draft, info_for(draft, fingerprint="0" * 64))
    with pytest.raises(FailedPrecondition, match="use mode target_only"):
        await collect(agent, AskSpec(question="What is moving?"))
    caplog.set_level(logging.INFO, logger="eventspec.edge.ask.agent")
    events = await collect(agent, replace(AskSpec(question="What is moving?"),
                                          mode=Mode.TARGET_ONLY))
    final = events[-1]
    assert isinstance(final, FinalEvent) and final.token_ids == ANSWER
    opened = link.streams[-1].sent[0]
    assert isinstance(opened, OpenRequest) and not opened.speculative
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ask ")]
    assert len(lines) == 1 and "target_only, EOS, 3 tokens" in lines[0]
    assert "What is moving" not in lines[0]


def _ask_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "eventspec.edge.ask.agent" and r.getMessage().startswith("ask ")]


async def test_a_refused_ask_is_one_line_with_its_code(
    draft: DraftModel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="eventspec.edge.ask.agent")
    agent, _ = agent_for(draft, info_for(draft))
    with pytest.raises(InvalidInput):
        await collect(agent, AskSpec(question="x" * 65))
    (line,) = _ask_lines(caplog)
    assert "mode speculative, INVALID_ARGUMENT, 0 tokens" in line and "xxx" not in line


async def test_an_ask_the_client_abandons_is_one_cancelled_line(
    draft: DraftModel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="eventspec.edge.ask.agent")
    agent, _ = agent_for(draft, info_for(draft))
    events = agent.ask(AskSpec(question="What is moving?", mode=Mode.TARGET_ONLY))
    await anext(events)  # the first Commit arrives, then the client goes away
    await events.aclose()
    (line,) = _ask_lines(caplog)
    assert "mode target_only, CANCELLED, 0 tokens" in line
