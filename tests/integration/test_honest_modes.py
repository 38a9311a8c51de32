"""Every mode treats a request the same way or refuses it clearly (issue 19, items 7, 8):
a question containing ``<event>`` is plain text in every mode, and draft_only refuses
what it cannot do (stop strings, sampling, a prompt past the draft's positions) with
INVALID_ARGUMENT naming the field, instead of ignoring it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from shared.client import EdgeClient
from shared.types import AskSpec, FinalEvent, GenerationSettings, Mode
from tests.integration import edge_harness as eh

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
