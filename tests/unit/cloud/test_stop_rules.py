"""Stop conditions cut a bulk commit at exactly the token where target-only stops."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.cloud.speculation.decoding import DecodingSession
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.estimators import AcceptanceEstimator
from eventspec.shared.contract.stops import StopMatcher, first_stop
from eventspec.shared.contract.types import (
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    DraftTail,
    FinishReason,
    GenerationSettings,
)

WORDS = {10: "It", 11: " is", 12: " moving", 13: " right", 14: ".", 2: ""}
EOS = 2


def decode(ids: Sequence[int]) -> str:
    return "".join(WORDS[i] for i in ids)


def session(stop: tuple[str, ...] = (), max_new: int = 16, prompt: int = 10,
            max_seq_len: int = 100) -> DecodingSession:
    return DecodingSession(
        settings=GenerationSettings(max_new_tokens=max_new, stop=stop), slot=0,
        prompt_len=prompt, max_seq_len=max_seq_len, eos_token_id=EOS, max_verify_tokens=9,
        decode=decode, speculative=True,
    )


def one_at_a_time(tokens: list[int], **kw: object) -> DecodingSession:
    s = session(**kw)  # type: ignore[arg-type]
    for tok in tokens:
        if s.finish_reason is not None:
            break
        s.commit(0, [tok], 0, 0.0)
    return s


@pytest.mark.parametrize(
    ("stop", "max_new", "max_seq_len"),
    [(("moving",), 16, 100), (("right",), 16, 100), (("It is",), 16, 100), ((), 3, 100),
     ((), 16, 100), (("zzz",), 5, 100), ((), 16, 13), (("right",), 16, 12)],
)
def test_bulk_commit_stops_where_target_only_stops(stop: tuple[str, ...], max_new: int,
                                                   max_seq_len: int) -> None:
    """Stop strings, EOS, the token cap and the context limit (prompt 10 + answer)."""
    answer = [10, 11, 12, 13, 14, EOS]
    alone = one_at_a_time(answer, stop=stop, max_new=max_new, max_seq_len=max_seq_len)
    bulk = session(stop=stop, max_new=max_new, max_seq_len=max_seq_len)
    bulk.commit(len(answer) - 1, answer, len(answer) - 1, 0.0)
    assert bulk.committed == alone.committed
    assert bulk.finish_reason == alone.finish_reason
    assert bulk.text() == alone.text()


def test_stop_string_before_eos_in_one_commit() -> None:
    bulk = session(stop=("moving",))
    done = bulk.commit(5, [10, 11, 12, 13, 14, EOS], 5, 0.0)
    assert bulk.finish_reason == done.finish_reason == FinishReason.STOP_STRING
    assert bulk.committed == list(done.tokens) == [10, 11, 12]
    assert done.accepted == 3  # only committed drafts count as accepted
    assert done.verified == 3  # the two accepted drafts past the stop are not counted
    assert bulk.text() == "It is "


@pytest.mark.parametrize(("stop", "max_new"), [(("moving",), 16), ((), 2), ((), 16)])
def test_drafts_past_the_end_feed_the_acceptance_estimate(stop: tuple[str, ...],
                                                          max_new: int) -> None:
    """All drafts accepted, the answer ending inside them (a stop string, the cap, EOS):
    the counts must still be a valid observation (no rejection, accepted == verified),
    since Done's plan and the server-wide estimate fold them in."""
    s = session(stop=stop, max_new=max_new)
    s.commit(0, [10], 0, 0.0)
    done = s.commit(6, [11, 12, 13, 14, EOS, 11, 12], 6, 0.0)
    assert s.finish_reason is not None
    assert done.accepted == done.verified == len(done.tokens)
    stats = s.stats()
    assert s.counters.rejections == 0 and stats.accepted == stats.drafted
    estimate = AcceptanceEstimator(prior=0.5)
    estimate.observe(stats.accepted, stats.drafted, rejections=s.counters.rejections)
    assert estimate.value > 0.5


def test_a_rejection_before_the_end_still_counts() -> None:
    s = session()
    s.commit(0, [10], 0, 0.0)
    done = s.commit(1, [11, 13], 3, 0.0)  # 3 drafts, the second one rejected
    assert (done.verified, done.accepted) == (3, 1) and s.counters.rejections == 1


def test_context_limit_caps_drafts_and_ends_the_answer() -> None:
    s = session(prompt=10, max_seq_len=14)
    s.commit(0, [10], 0, 0.0)
    s.offer_drafts(DraftTail(1, (11, 12, 13, 14, 13)))
    step = s.step_input()
    assert step.start_position == 10
    assert step.start_position + len(step.tokens) <= 14  # the slot's last position is 13
    s.commit(len(step.drafts), [*step.drafts, 13], len(step.drafts), 0.0)
    assert s.finish_reason == FinishReason.MAX_TOKENS
    assert len(s.committed) == 4


# -- bounded, incremental stop matching (issue 19, item 2) -------------------------------------


def test_stop_matching_looks_only_at_new_text() -> None:
    """Each step examines the new characters plus the longest stop string's overlap,
    never the whole answer again: a long answer costs the same per token as a short one."""
    stops = tuple(f"zz{i:02d}" for i in range(MAX_STOP_STRINGS))
    matcher = StopMatcher(stops)
    text = ""
    for i in range(2000):
        text += f" w{i % 10}"
        assert matcher.feed(text) is None
    longest = max(map(len, stops))
    assert matcher.scanned <= 2000 * (3 + longest - 1)


@pytest.mark.parametrize(("texts", "stop", "at"), [
    (["It", "It is", "It is mov", "It is moving"], ("moving",), 6),  # spans three feeds
    (["ab\ufffd", "ab\u00e9x"], ("\u00e9x",), 2),  # an earlier character changed
    (["ab", "abcd"], ("zz", "cd", "bc"), 1),  # earliest occurrence wins
    (["a" * 50, "a" * 50 + "b"], ("ab",), 49),
])
def test_incremental_matching_finds_what_a_full_scan_finds(texts: list[str],
                                                            stop: tuple[str, ...],
                                                            at: int) -> None:
    matcher = StopMatcher(stop)
    found = [matcher.feed(t) for t in texts]
    assert found[:-1] == [None] * (len(texts) - 1)
    assert found[-1] == first_stop(texts[-1], stop) == at


@pytest.mark.parametrize(("stop", "needle"), [
    (tuple(f"s{i}" for i in range(MAX_STOP_STRINGS + 1)), "generation.stop"),
    (("x" * (MAX_STOP_CHARS + 1),), "generation.stop"),
    (("x" * 600, "y" * 600), "characters"),
])
def test_too_many_or_too_long_stop_strings_are_refused(stop: tuple[str, ...],
                                                       needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle):
        GenerationSettings(stop=stop).validated(64)


def test_stop_caps_follow_the_advertised_limits() -> None:
    GenerationSettings(stop=("a",) * 4).validated(64, max_stop_strings=4)
    with pytest.raises(InvalidInput, match="cap of 3"):
        GenerationSettings(stop=("a",) * 4).validated(64, max_stop_strings=3)
    with pytest.raises(InvalidInput, match="cap of 5"):
        GenerationSettings(stop=("abcdef",)).validated(64, max_stop_chars=5)


@settings(max_examples=200, deadline=None)
@given(pieces=st.lists(st.tuples(st.integers(0, 3), st.text("abc", max_size=4)), max_size=30),
       stop=st.lists(st.text("abc", min_size=1, max_size=4), min_size=1, max_size=4))
def test_incremental_matching_equals_a_full_scan(pieces: list[tuple[int, str]],
                                                 stop: list[str]) -> None:
    """Whatever the answer does (grow, or rewrite its last few characters as a tokenizer
    may), the first hit is where a full scan of the whole text first finds one."""
    matcher = StopMatcher(stop)
    text = ""
    for rewrite, piece in pieces:
        text = text[: max(0, len(text) - rewrite)] + piece
        found, full = matcher.feed(text), first_stop(text, stop)
        assert found == full
        if full is not None:
            break
