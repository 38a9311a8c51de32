"""The answer views as pure functions: events + terminal width -> the text written."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest

from eventspec.shared.client.answer_view import (
    CLEAR_DOWN,
    MUTED,
    NOT_APPLICABLE,
    RESET,
    LiveView,
    PlainView,
    final_to_json,
    finish_note,
    rows_taken,
    stats_table,
    wants_colour,
    wants_live,
)
from eventspec.shared.contract.timing import TimingPlan
from eventspec.shared.contract.types import (
    CommittedEvent,
    FeatureMode,
    FinalEvent,
    FinishReason,
    Mode,
    PreviewEvent,
    RequestStats,
    WindowInfo,
)


def _final(answer: str, stats: RequestStats | None = None, *, plan: bool = False,
           window: bool = False) -> FinalEvent:
    return FinalEvent(
        answer=answer, token_ids=(1, 2), mode=Mode.SPECULATIVE,
        feature_mode=FeatureMode.FRAMES, finish_reason=FinishReason.EOS,
        stats=stats or RequestStats(target_steps=3, total_ms=12.0),
        plan=TimingPlan(False, 0, 0, 4, True, 0.5, 200.0, 30.0, 1.0, "c >= 1: no gain")
        if plan else None,
        window=WindowInfo(0, 1_000_000, 950_000, 1_000_000, 1234) if window else None,
    )


def test_rows_taken_counts_wrapped_and_explicit_lines() -> None:
    assert rows_taken("", 10) == 1
    assert rows_taken("x" * 10, 10) == 1  # a full row defers the wrap
    assert rows_taken("x" * 11, 10) == 2
    assert rows_taken("x" * 25 + "\n" + "y", 10) == 4
    assert rows_taken("界" * 5, 10) == 1 and rows_taken("界" * 6, 10) == 2


def test_live_view_moves_up_over_every_row_the_last_draw_took() -> None:
    view = LiveView(colour=True, columns=lambda: 10)
    first = view.start("waiting for the cloud…")
    assert first == f"\r{CLEAR_DOWN}{MUTED}waiting for the cloud…{RESET}"
    # 22 cells on a 10-column terminal: 3 rows, so the next draw goes up 2.
    out = view.on_event(PreviewEvent(0, (1,), "It is moving to the right."))
    assert out.startswith(f"\r\x1b[2A{CLEAR_DOWN}")
    assert out.endswith(f"{MUTED}It is moving to the right.{RESET}")
    out = view.on_event(CommittedEvent(0, (1,), "It is moving"))
    assert out == f"\r\x1b[2A{CLEAR_DOWN}It is moving"
    out = view.on_event(PreviewEvent(3, (2,), "It is moving left."))
    assert out == f"\r\x1b[1A{CLEAR_DOWN}It is moving{MUTED} left.{RESET}"
    end = view.finish(_final("It is moving right."), " [label]")
    assert end == f"\r\x1b[1A{CLEAR_DOWN}It is moving right. [label]\n"


def test_live_view_redraws_a_long_answer_in_place_not_down_the_screen() -> None:
    view = LiveView(colour=False, columns=lambda: 20)
    text = ""
    written = []
    for word in ("a long answer " * 10).split():
        text += word + " "
        written.append(view.on_event(CommittedEvent(0, (1,), text)))
    # Each draw returns to the first row of the previous one: the ups match its rows.
    prev = ""
    for out, shown in zip(written, _prefixes(text), strict=True):
        up = rows_taken(prev, 20) - 1
        assert out.startswith("\r" + (f"\x1b[{up}A" if up else "") + CLEAR_DOWN)
        prev = shown
    assert all(MUTED not in w for w in written)


def _prefixes(text: str) -> list[str]:
    words, acc, out = text.split(), "", []
    for w in words:
        acc += w + " "
        out.append(acc)
    return out


def test_live_view_without_colour_writes_no_style() -> None:
    view = LiveView(colour=False, columns=lambda: 80)
    out = view.start("waiting") + view.on_event(PreviewEvent(0, (1,), "draft"))
    assert MUTED not in out and RESET not in out and "draft" in out


def test_interrupt_erases_the_preview_keeps_committed_and_ends_the_line() -> None:
    view = LiveView(colour=True, columns=lambda: 80)
    view.on_event(CommittedEvent(0, (1,), "It is"))
    view.on_event(PreviewEvent(2, (2,), "It is red"))
    out = view.interrupt()
    assert out == f"\r{CLEAR_DOWN}It is{RESET}\n"
    waiting = LiveView(colour=True, columns=lambda: 80)
    waiting.start("waiting for the cloud…")
    assert waiting.interrupt() == f"\r{CLEAR_DOWN}{RESET}"  # nothing left to keep


def test_plain_view_streams_committed_text_only() -> None:
    view = PlainView()
    out = [view.start("waiting"),
           view.on_event(PreviewEvent(0, (1,), "draft text")),
           view.on_event(CommittedEvent(0, (1,), "It is")),
           view.on_event(CommittedEvent(2, (2,), "It is red.")),
           view.finish(_final("It is red."))]
    assert out == ["", "", "It is", " red.", "\n"]
    assert "".join(out) == "It is red.\n"


def test_plain_view_repeats_a_final_answer_that_differs_from_the_stream() -> None:
    view = PlainView()
    view.on_event(CommittedEvent(0, (1,), "It is"))
    assert view.finish(_final("Its red.")) == "\nIts red.\n"
    assert PlainView().interrupt() == ""


def test_metrics_that_do_not_apply_are_a_dash_and_null() -> None:
    nothing = _final("x", RequestStats(target_steps=3, total_ms=5.0))
    table = stats_table(nothing)
    for row in ("acceptance rate", "mean accepted length", "hidden acceptance rate"):
        line = next(ln for ln in table.splitlines() if row in ln)
        assert line.rstrip().endswith(NOT_APPLICABLE), line
    stats = final_to_json(nothing)["stats"]
    assert stats["acceptance_rate"] is None
    assert stats["mean_accepted_length"] is None
    assert stats["hidden_acceptance_rate"] is None
    some = final_to_json(_final("x", RequestStats(drafted=4, accepted=3, target_steps=2,
                                                  hidden_drafted=2, hidden_accepted=1)))
    assert some["stats"]["acceptance_rate"] == 0.75
    assert some["stats"]["mean_accepted_length"] == 2.5
    assert some["stats"]["hidden_acceptance_rate"] == 0.5


def test_json_carries_plan_and_window() -> None:
    out = final_to_json(_final("x", plan=True, window=True))
    json.dumps(out)
    assert out["plan"]["speculate"] is False and out["plan"]["reason"] == "c >= 1: no gain"
    assert out["window"] == {"clip_t0_us": 0, "clip_t1_us": 1_000_000,
                             "event_t0_us": 950_000, "event_t1_us": 1_000_000,
                             "num_events": 1234}
    assert final_to_json(_final("x"))["plan"] is None
    table = stats_table(_final("x", plan=True, window=True))
    assert "1234 events" in table and "c >= 1: no gain" in table


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_live_only_on_a_terminal_that_is_not_dumb_and_no_color_is_honoured() -> None:
    assert wants_live(_Tty(), {"TERM": "xterm"})
    assert not wants_live(_Tty(), {"TERM": "dumb"})
    assert not wants_live(io.StringIO(), {"TERM": "xterm"})
    assert wants_colour(False, {})
    assert not wants_colour(True, {})
    assert not wants_colour(False, {"NO_COLOR": "1"})
    assert wants_colour(False, {"NO_COLOR": ""})


@pytest.mark.parametrize(("reason", "mode", "asked", "expected"), [
    (FinishReason.EOS, Mode.SPECULATIVE, 64, None),
    (FinishReason.MAX_TOKENS, Mode.SPECULATIVE, 2, "answer cut: max_tokens (2 of 2 tokens; "
                                                   "--max-new-tokens)"),
    (FinishReason.MAX_TOKENS, Mode.DRAFT_ONLY, 64, "the draft model's context limit"),
    (FinishReason.STOP_STRING, Mode.SPECULATIVE, 64, "answer ended at a stop string (2 tokens)"),
    (FinishReason.DEADLINE, Mode.TARGET_ONLY, 64, "answer cut: deadline (2 of at most 64"),
    (FinishReason.CANCELLED, Mode.TARGET_ONLY, 64, "answer cut: cancelled"),
])
def test_finish_note_names_every_end_but_eos(reason: FinishReason, mode: Mode, asked: int,
                                             expected: str | None) -> None:
    final = dataclasses.replace(_final("ab"), finish_reason=reason, mode=mode)
    note = finish_note(final, asked)
    if expected is None:
        assert note is None
    else:
        assert note is not None and expected in note, note


def test_a_plan_that_speculated_but_verified_no_draft_says_why() -> None:
    """"speculate: predicted 1.103x, lookahead 8" above "drafted / accepted 0 / 0" is
    reconciled by a line that says what happened (issue 38, item 7)."""
    said_yes = TimingPlan(True, 7, 8, 2, False, 0.5, 50.0, 10.0, 1.103,
                          "speculate: predicted 1.103x")
    stale = dataclasses.replace(_final("x", RequestStats(target_steps=12, stale_drafts=5)),
                                plan=said_yes)
    assert "all 5 Drafts messages arrived after the cloud had committed past them" in \
        stats_table(stale)
    assert "arrived after" in final_to_json(stale)["speculation_note"]
    none = dataclasses.replace(_final("x", RequestStats(target_steps=2)), plan=said_yes)
    assert "none reached the cloud" in stats_table(none)
    drafted = dataclasses.replace(
        _final("x", RequestStats(drafted=3, accepted=1, target_steps=4)), plan=said_yes)
    assert "speculation" not in stats_table(drafted)
    assert final_to_json(drafted)["speculation_note"] is None
    said_no = _final("x", RequestStats(target_steps=3), plan=True)
    assert final_to_json(said_no)["speculation_note"] is None
