"""Stop conditions cut a bulk commit at exactly the token where target-only stops."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from cloud.decoding import DecodingSession, StepResult
from shared.types import FinishReason, GenerationSettings

WORDS = {10: "It", 11: " is", 12: " moving", 13: " right", 14: ".", 2: ""}
EOS = 2


def decode(ids: Sequence[int]) -> str:
    return "".join(WORDS[i] for i in ids)


def session(stop: tuple[str, ...] = (), max_new: int = 16) -> DecodingSession:
    return DecodingSession(
        settings=GenerationSettings(max_new_tokens=max_new, stop=stop),
        text_vocab_size=64, eos_token_id=EOS, max_draft_tokens=16, max_verify_tokens=9,
        decode=decode, speculative=True,
    )


def one_at_a_time(tokens: list[int], **kw: object) -> DecodingSession:
    s = session(**kw)  # type: ignore[arg-type]
    for tok in tokens:
        if s.finish_reason is not None:
            break
        s.apply(StepResult([tok], 0, 0, 0.0))
    return s


@pytest.mark.parametrize(
    ("stop", "max_new"),
    [(("moving",), 16), (("right",), 16), (("It is",), 16), ((), 3), ((), 16), (("zzz",), 5)],
)
def test_bulk_commit_stops_where_target_only_stops(stop: tuple[str, ...], max_new: int) -> None:
    answer = [10, 11, 12, 13, 14, EOS]
    alone = one_at_a_time(answer, stop=stop, max_new=max_new)
    bulk = session(stop=stop, max_new=max_new)
    bulk.apply(StepResult(answer, len(answer) - 1, len(answer) - 1, 0.0))
    assert bulk.committed == alone.committed
    assert bulk.finish_reason == alone.finish_reason
    assert bulk.text == alone.text


def test_stop_string_before_eos_in_one_commit() -> None:
    bulk = session(stop=("moving",))
    bulk.apply(StepResult([10, 11, 12, 13, 14, EOS], 5, 5, 0.0))
    assert bulk.finish_reason == FinishReason.STOP_STRING
    assert bulk.committed == [10, 11, 12]
    assert bulk.text == "It is "
