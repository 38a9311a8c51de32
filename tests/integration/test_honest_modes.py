"""Every mode treats a request the same way or refuses it clearly (issue 19, items 7, 8):
a question containing ``<event>`` is plain text in every mode, and draft_only refuses
what it cannot do (stop strings, sampling, a prompt past the draft's positions) with
INVALID_ARGUMENT naming the field, instead of ignoring it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from eventspec.shared.client.edge_client import AskError, EdgeClient
from eventspec.shared.contract.types import AskSpec, FinalEvent, GenerationSettings, Mode
from tests.support import edge_harness as eh

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack() -> AsyncIterator[eh.Stack]:
    s = await eh.start_stack()
    yield s
    await s.stop()


async def _ask(stack: eh.Stack, spec: AskSpec) -> FinalEvent:
    async with EdgeClient(stack.edge_address, timeout_s=60) as client:
        return await client.ask_final(spec)


@pytest.mark.parametrize("question", ["What is <event> doing?", "<event>"])
async def test_event_placeholder_in_the_question_works_in_every_mode(stack: eh.Stack,
                                                                      question: str) -> None:
    settings = GenerationSettings(max_new_tokens=8)
    spec = await _ask(stack, AskSpec(question, mode=Mode.SPECULATIVE, generation=settings))
    base = await _ask(stack, AskSpec(question, mode=Mode.TARGET_ONLY, generation=settings))
    alone = await _ask(stack, AskSpec(question, mode=Mode.DRAFT_ONLY, generation=settings))
    assert spec.token_ids == base.token_ids and spec.answer == base.answer
    assert alone.mode == Mode.DRAFT_ONLY and alone.token_ids


async def _refused(stack: eh.Stack, spec: AskSpec) -> AskError:
    with pytest.raises(AskError) as err:
        await _ask(stack, spec)
    return err.value


async def test_draft_only_refuses_sampling(stack: eh.Stack) -> None:
    """The draft decodes greedily: a temperature would be silently ignored."""
    spec = AskSpec("What is moving?", mode=Mode.DRAFT_ONLY,
                   generation=GenerationSettings(max_new_tokens=4, temperature=0.7))
    err = await _refused(stack, spec)
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT, err
    assert "generation.temperature" in err.details and "draft_only" in err.details, err.details


async def test_draft_only_honours_stop_strings(stack: eh.Stack) -> None:
    settings = GenerationSettings(max_new_tokens=16)
    full = await _ask(stack, AskSpec("What is moving?", mode=Mode.DRAFT_ONLY,
                                     generation=settings))
    text = full.answer
    assert len(text) >= 6, text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    cut = await _ask(stack, AskSpec("What is moving?", mode=Mode.DRAFT_ONLY,
                                    generation=GenerationSettings(max_new_tokens=16,
                                                                  stop=(stop,))))
    assert cut.finish_reason.name == "STOP_STRING", (cut.finish_reason, stop, text)
    assert cut.answer == text[: text.find(stop)]
    assert len(cut.token_ids) < len(full.token_ids)
    assert tuple(cut.token_ids) == tuple(full.token_ids[: len(cut.token_ids)])


async def test_draft_only_refuses_a_question_past_the_draft_context(stack: eh.Stack) -> None:
    """A prompt past the draft model's positions produced seconds of garbage before."""
    question = "What is moving? " * 256  # within the 4,096-character cap
    positions = stack.draft.model.config.max_position_embeddings
    assert len(stack.draft.build_prompt_ids(question)) > positions
    spec = AskSpec(question, mode=Mode.DRAFT_ONLY, generation=GenerationSettings(max_new_tokens=4))
    err = await _refused(stack, spec)
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT, err
    assert "question" in err.details and str(positions) in err.details, err.details
