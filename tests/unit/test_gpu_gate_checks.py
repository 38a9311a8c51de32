"""The GPU gate's judgement of drafts (``benchmarks/gpu_gate.py``): verified drafts are
required wherever a random drafter could have had one verified."""

from __future__ import annotations

from benchmarks.gpu_gate import drafts_verified


def spec(drafted: int, hidden: int, ttft_ms: float, draft_prefill_ms: float) -> dict[str, float]:
    return {"drafted": drafted, "hidden_drafted": hidden, "ttft_ms": ttft_ms,
            "draft_prefill_ms": draft_prefill_ms}


def test_drafts_are_required_where_the_draft_prefill_ends_before_the_first_token() -> None:
    ok, detail = drafts_verified(spec(0, 0, ttft_ms=200.0, draft_prefill_ms=36.0))
    assert not ok and detail == "0 drafted (0 hidden)"
    assert drafts_verified(spec(1, 8, ttft_ms=200.0, draft_prefill_ms=36.0))[0]


def test_a_prefill_longer_than_the_first_token_makes_the_check_not_applicable() -> None:
    ok, detail = drafts_verified(spec(0, 0, ttft_ms=215.3, draft_prefill_ms=338.2))
    assert ok and detail.startswith("not applicable: the draft prefill (338.2 ms)")


def test_an_unknown_draft_prefill_keeps_the_check_strict() -> None:
    assert not drafts_verified(spec(0, 0, ttft_ms=215.3, draft_prefill_ms=0.0))[0]
