"""The oracle drafter (benchmarks only): right with probability α, deterministic per
position, paced, and refusing what it cannot draft."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from eventspec.edge.drafting.cache import DraftCache
from eventspec.edge.drafting.oracle_backend import (
    BENCHMARKS_ONLY,
    OracleDraftBackend,
    OracleSettings,
    load_answers,
)
from eventspec.edge.drafting.static_backend import draft_engine_name
from eventspec.shared.contract.errors import InvalidInput

V, EOS = 50, 2
ANSWER = (*[7, 9, 11, 13, 17, 19, 23, 29, 31, 37] * 4, EOS)  # 41 tokens


def oracle(alpha: float, *, ms: float = 0.0, prefill_ms: float = 0.0, seed: int = 0,
           answers: dict[str, tuple[int, ...]] | None = None) -> OracleDraftBackend:
    answers = {"q": ANSWER} if answers is None else answers
    return OracleDraftBackend(OracleSettings(answers, alpha, ms, prefill_ms, seed), V, EOS)


def draft_along_answer(backend: OracleDraftBackend, question: str = "q") -> list[int]:
    """Draft every position from the true prefix, as the cloud's commits lead the edge."""
    drafter = DraftCache(backend)
    drafter.prefill(question, None)
    return [drafter.draft_next(ANSWER[:p]) for p in range(len(ANSWER))]


def test_alpha_one_drafts_the_answer_and_alpha_zero_never_does() -> None:
    assert draft_along_answer(oracle(1.0)) == list(ANSWER)
    wrong = draft_along_answer(oracle(0.0))
    assert all(d != a for d, a in zip(wrong, ANSWER, strict=True))
    assert EOS not in wrong and all(0 <= d < V for d in wrong)


def test_alpha_is_the_share_of_right_drafts() -> None:
    # 60 questions x 41 positions: a binomial(2460, 0.8) is within +-0.03 with
    # probability > 0.999; the seed is fixed, so this is one draw, checked.
    answers = {f"q{i}": ANSWER for i in range(60)}
    backend = oracle(0.8, answers=answers)
    right = total = 0
    for q in answers:
        drafts = draft_along_answer(backend, q)
        right += sum(d == a for d, a in zip(drafts, ANSWER, strict=True))
        total += len(drafts)
    assert abs(right / total - 0.8) < 0.03


def test_a_position_drafts_the_same_token_after_a_rollback() -> None:
    backend = oracle(0.5, seed=3)
    drafter = DraftCache(backend)
    drafter.prefill("q", None)
    first = [drafter.draft_next(ANSWER[:p]) for p in range(12)]
    # A Commit cuts the tail at 4 and the edge drafts on: the cache is rolled back.
    again = [drafter.draft_next(ANSWER[:p]) for p in range(4, 12)]
    assert drafter.rollbacks >= 1
    assert again == first[4:]
    # A fresh request with the same question and seed draws the same coins.
    assert draft_along_answer(oracle(0.5, seed=3))[:12] == first
    assert draft_along_answer(oracle(0.5, seed=4))[:12] != first


def test_drafts_past_the_answer_and_for_an_unknown_question_are_arbitrary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = oracle(1.0)
    drafter = DraftCache(backend)
    drafter.prefill("q", None)
    past = drafter.draft_next(ANSWER)  # after EOS: nothing is right
    assert past != EOS
    with caplog.at_level(logging.WARNING, logger="eventspec.edge.drafting.oracle_backend"):
        unknown = DraftCache(backend)
        unknown.prefill("not in the file", None)
        drafts = [unknown.draft_next(ANSWER[:p]) for p in range(len(ANSWER))]
    # It knows no answer, so its drafts are arbitrary ids (never EOS): right only by
    # chance, about 1 in 48 here.
    assert EOS not in drafts
    assert sum(d == a for d, a in zip(drafts, ANSWER, strict=True)) <= 4
    assert "not in the file" in caplog.text


def test_pacing_is_a_lower_bound() -> None:
    backend = oracle(1.0, ms=4.0, prefill_ms=15.0)
    drafter = DraftCache(backend)
    t0 = time.perf_counter()
    drafter.prefill("q", None)
    assert (time.perf_counter() - t0) * 1e3 >= 15.0
    t0 = time.perf_counter()
    for p in range(10):
        drafter.draft_next(ANSWER[:p])
    # 9 forwards (the first draft reads the prefill's row): never faster than paced.
    assert (time.perf_counter() - t0) * 1e3 >= 9 * 4.0


def test_the_label_says_oracle_and_benchmarks_only() -> None:
    name = draft_engine_name(oracle(0.8, ms=5.0))
    assert name.startswith("oracle α=0.8, 5 ms/token") and BENCHMARKS_ONLY in name


def test_the_answers_file_is_checked(tmp_path: Path) -> None:
    good = tmp_path / "a.json"
    good.write_text(json.dumps({"q": [1, 2, 3]}))
    assert load_answers(good) == {"q": (1, 2, 3)}
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps({"what?": "an answer"}))
    with pytest.raises(InvalidInput, match="'what\\?'"):
        load_answers(bad)
    with pytest.raises(InvalidInput, match="outside the text vocabulary"):
        oracle(1.0, answers={"q": (V + 1,)})
    with pytest.raises(InvalidInput, match="--oracle-alpha"):
        oracle(1.5)


def tree_oracle(alpha: float, coverage: float, *, ms: float = 0.0,
                answers: dict[str, tuple[int, ...]] | None = None) -> OracleDraftBackend:
    answers = {"q": ANSWER} if answers is None else answers
    return OracleDraftBackend(OracleSettings(answers, alpha, ms, 0.0, 0, coverage), V, EOS)


def test_q_zero_keeps_chains_and_q_above_zero_expands_trees() -> None:
    assert not DraftCache(tree_oracle(0.8, 0.0)).expands_in_one_forward
    assert DraftCache(tree_oracle(0.8, 0.75)).expands_in_one_forward


def test_tree_children_rank_the_chain_draft_first_and_hold_the_truth_at_rate_q() -> None:
    """Rank 1 is the chain's draft; where it is wrong on the true path, the truth is among
    the other k - 1 children with probability q (60 questions x 41 positions, one
    seeded draw); k distinct ids, never EOS unless it is the truth or the top-1."""
    answers = {f"q{i}": ANSWER for i in range(60)}
    backend = tree_oracle(0.8, 0.75, answers=answers)
    chain = oracle(0.8, answers=answers)
    wrong = covered = 0
    for q in answers:
        drafter = DraftCache(backend)
        drafter.prefill(q, None)
        rows = drafter.expand([ANSWER[:p] for p in range(len(ANSWER))], 4)
        chain_drafts = draft_along_answer(chain, q)
        for p, row in enumerate(rows):
            tokens = [t for t, _ in row]
            assert len(set(tokens)) == 4 and tokens[0] == chain_drafts[p]
            assert all(t != EOS for t in tokens[1:] if t != ANSWER[p])
            assert row[0][1] > row[1][1] == row[3][1], "calibrated: log α, then the rest"
            if tokens[0] != ANSWER[p]:
                wrong += 1
                covered += ANSWER[p] in tokens[1:]
    assert wrong > 300 and abs(covered / wrong - 0.75) < 0.06


def test_tree_children_off_the_true_path_never_hold_the_truth_beyond_top_1() -> None:
    drafter = DraftCache(tree_oracle(0.0, 1.0))
    drafter.prefill("q", None)
    off = (ANSWER[0] + 1,)  # a context the answer never had
    (row,) = drafter.expand([off], 4)
    assert ANSWER[1] not in [t for t, _ in row[1:]]


def test_a_tree_expansion_is_paced_once_however_many_nodes() -> None:
    drafter = DraftCache(tree_oracle(0.8, 0.75, ms=30.0))
    drafter.prefill("q", None)
    t0 = time.perf_counter()
    drafter.expand([ANSWER[:p] for p in range(8)], 4)
    assert (time.perf_counter() - t0) * 1e3 >= 30.0
    assert drafter.drafted_total == 1, "one forward"
