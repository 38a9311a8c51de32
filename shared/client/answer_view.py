"""How an answer is shown: the live terminal view, plain streaming, the table, ``--json``,
the ``--timeline`` picture.

Used by ``eventspec ask`` and ``eventspec demo``, which both import it and neither the
other. No torch, nothing of the demo world; the plotting module (matplotlib) is loaded
only when :func:`write_timeline` draws.

The views are pure: each method takes an event and returns the text to write, so what
a terminal receives is testable without one. :class:`LiveView` redraws the whole answer
in place (a 7B answer is often longer than one line, so clearing only the current line
would repeat it down the screen); :class:`PlainView` streams committed text only, for
pipes, files and ``TERM=dumb``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import sys
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TextIO

import grpc

from eventspec.shared.client.edge_client import AskError, EdgeClient
from eventspec.shared.contract.types import (
    AskEvent,
    AskSpec,
    CommittedEvent,
    FinalEvent,
    FinishReason,
    Mode,
    PreviewEvent,
    ProgressEvent,
)

MUTED, RESET = "\x1b[2m", "\x1b[0m"
#: Erase from the cursor to the end of the screen.
CLEAR_DOWN = "\x1b[J"
#: Shown for a metric that does not apply (nothing drafted, no step yet).
NOT_APPLICABLE = "–"


class AnswerView(Protocol):
    """Turns the events of one Ask into the text written to the output."""

    def start(self, waiting: str) -> str: ...

    def on_event(self, event: AskEvent) -> str: ...

    def finish(self, final: FinalEvent, suffix: str = "") -> str: ...

    def interrupt(self) -> str: ...


def wants_live(out: TextIO, environ: dict[str, str] | os._Environ[str]) -> bool:
    """In-place redraws need a terminal that understands cursor movement."""
    return out.isatty() and environ.get("TERM", "") != "dumb"


def wants_colour(no_color_flag: bool, environ: dict[str, str] | os._Environ[str]) -> bool:
    """``--no-color`` or a non-empty ``NO_COLOR`` (no-color.org) switches styling off."""
    return not no_color_flag and not environ.get("NO_COLOR")


def cells(text: str) -> int:
    """Terminal columns ``text`` occupies: wide (East Asian) characters take two."""
    return sum(2 if unicodedata.east_asian_width(c) in ("W", "F") else
               0 if unicodedata.combining(c) else 1 for c in text)


def rows_taken(text: str, width: int) -> int:
    """Rows ``text`` covers on a ``width``-column terminal, written from column 0.

    A row filled exactly leaves the cursor on it (terminals defer the wrap), so a line
    of ``width`` cells takes one row, not two.
    """
    width = max(1, width)
    return sum(max(1, math.ceil(cells(line) / width)) for line in text.split("\n"))


class LiveView:
    """Redraws committed text plus the muted preview in place, over as many rows as it
    took last time (recomputed at the current width on every draw)."""

    def __init__(self, *, colour: bool,
                 columns: Callable[[], int] = lambda: shutil.get_terminal_size().columns
                 ) -> None:
        self.colour = colour
        self._columns = columns
        self._shown = ""  # the plain text of the last draw (no escapes)
        self._committed = ""

    def _style(self, text: str) -> str:
        return f"{MUTED}{text}{RESET}" if self.colour and text else text

    def _draw(self, committed: str, muted: str) -> str:
        up = rows_taken(self._shown, self._columns()) - 1
        home = "\r" + (f"\x1b[{up}A" if up > 0 else "")
        self._shown = committed + muted
        return f"{home}{CLEAR_DOWN}{committed}{self._style(muted)}"

    def start(self, waiting: str) -> str:
        return self._draw("", waiting)

    def on_event(self, event: AskEvent) -> str:
        if isinstance(event, CommittedEvent):
            self._committed = event.text
            return self._draw(self._committed, "")
        if isinstance(event, PreviewEvent):
            tail = event.text[len(self._committed):] if event.text.startswith(
                self._committed) else ""
            return self._draw(self._committed, tail)
        if isinstance(event, ProgressEvent) and not self._committed:
            return self._draw("", f"{event.message}…")
        return ""

    def finish(self, final: FinalEvent, suffix: str = "") -> str:
        return self._draw(final.answer + suffix, "") + "\n"

    def interrupt(self) -> str:
        """Ctrl-C or an error: keep the committed text, erase the preview (or the waiting
        line), end every style and, if text remains, the line."""
        return (self._draw(self._committed, "") + (RESET if self.colour else "")
                + ("\n" if self._committed else ""))


class PlainView:
    """Streams committed text as it grows; previews and redraws never reach a pipe."""

    def __init__(self) -> None:
        self._written = ""

    def _extend(self, text: str) -> str:
        # Committed text only grows; should a detokenizer ever rewrite earlier text,
        # hold it back until the final answer rather than print a contradiction.
        if not text.startswith(self._written):
            return ""
        new, self._written = text[len(self._written):], text
        return new

    def start(self, waiting: str) -> str:
        return ""

    def on_event(self, event: AskEvent) -> str:
        return self._extend(event.text) if isinstance(event, CommittedEvent) else ""

    def finish(self, final: FinalEvent, suffix: str = "") -> str:
        if final.answer.startswith(self._written):
            return self._extend(final.answer) + suffix + "\n"
        # The final answer differs from what was streamed: say it whole on its own line.
        return ("\n" if self._written else "") + final.answer + suffix + "\n"

    def interrupt(self) -> str:
        return "\n" if self._written else ""


def finish_note(final: FinalEvent, asked_tokens: int) -> str | None:
    """One line saying why an answer ended, unless it ended by itself (EOS).

    A cut answer reads like a whole one, so ``eventspec ask`` prints this on stderr:
    the reason, the tokens received against those asked for, and what set the limit,
    e.g. ``answer cut: max_tokens (45 of 64 tokens; the cloud's context limit ...)``.
    """
    reason = final.finish_reason
    got = len(final.token_ids)
    if reason == FinishReason.EOS:
        return None
    if reason == FinishReason.STOP_STRING:
        return f"answer ended at a stop string ({got} tokens)"
    if reason == FinishReason.MAX_TOKENS:
        if got >= asked_tokens:
            why = "--max-new-tokens"
        elif final.mode == Mode.DRAFT_ONLY:
            why = "the draft model's context limit: the prompt left no more positions"
        else:
            room = final.plan.max_new_tokens if final.plan is not None else got
            why = (f"the cloud's context limit: a KV slot holds the prompt and {room} "
                   "answer tokens")
        return f"answer cut: max_tokens ({got} of {asked_tokens} tokens; {why})"
    if reason == FinishReason.DEADLINE:
        return (f"answer cut: deadline ({got} of at most {asked_tokens} tokens; the "
                "request's deadline passed: raise --timeout, or the edge's --request-timeout)")
    return f"answer cut: {reason.name.lower()} ({got} of at most {asked_tokens} tokens)"


def final_to_json(final: FinalEvent) -> dict[str, Any]:
    """The ``--json`` object: answer, ids, mode, statistics, plan and window.

    Rates that do not apply (nothing drafted, no target step) are ``null``, not 0.
    """
    s = final.stats
    return {
        "answer": final.answer,
        "token_ids": list(final.token_ids),
        "mode": final.mode.name.lower(),
        "feature_mode": final.feature_mode.name.lower() if final.feature_mode else None,
        "finish_reason": final.finish_reason.name.lower(),
        "stats": {
            "drafted": s.drafted,
            "accepted": s.accepted,
            "acceptance_rate": _rounded(acceptance_rate(final)),
            "mean_accepted_length": _rounded(mean_accepted_length(final)),
            "hidden_drafted": s.hidden_drafted,
            "hidden_accepted": s.hidden_accepted,
            "hidden_acceptance_rate": _rounded(hidden_acceptance_rate(final)),
            "target_steps": s.target_steps,
            "ttft_ms": round(s.ttft_ms, 2),
            "total_ms": round(s.total_ms, 2),
            "uplink_bytes": s.uplink_bytes,
            "downlink_bytes": s.downlink_bytes,
            "stale_drafts": s.stale_drafts,
            "prefix_cache": s.prefix_cache or None,
            "prefix_reused_tokens": s.prefix_reused_tokens,
            "drafts_on_offer": s.drafts_on_offer,
            "dry_steps": s.dry_steps,
            "tree_nodes_sent": s.tree_nodes_sent,
            "tree_nodes_pruned": s.tree_nodes_pruned,
            "tree_branch_hits": s.tree_branch_hits,
            "draft_forward_ms": round(s.draft_forward_ms, 2),
            "plans_sent": s.plans_sent,
            "steps_sat_out": s.steps_sat_out,
            "stage_ms": {k: round(v, 2) for k, v in sorted(s.stage_ms.items())},
        },
        "plan": dataclasses.asdict(final.plan) if final.plan is not None else None,
        "speculation_note": speculation_note(final),
        "window": dataclasses.asdict(final.window) if final.window is not None else None,
    }


def speculation_note(final: FinalEvent) -> str | None:
    """Why a request whose plan said "speculate" had no draft verified, or None.

    Six file runs printed "speculate: predicted 1.103x, lookahead 8" above "drafted /
    accepted 0 / 0" with nothing to reconcile the two. The cloud's counts say what
    happened: Drafts messages that arrived after it had committed past them (stale: the
    drafter ran slower than the plan assumed, or the link lagged), or none at all.
    """
    plan, s = final.plan, final.stats
    if plan is None or not plan.speculate or final.mode != Mode.SPECULATIVE:
        return None
    if s.drafted or s.hidden_drafted:
        return None
    if s.stale_drafts:
        return (f"no draft was verified: all {s.stale_drafts} Drafts messages arrived after "
                "the cloud had committed past them (the drafter ran slower than the plan's "
                "cost, or the link lagged)")
    return ("no draft was verified: none reached the cloud before the answer was done (a "
            "short answer, or the drafter's prefill outlasted the cloud's)")


def acceptance_rate(final: FinalEvent) -> float | None:
    """accepted / drafted, or None when nothing was drafted (a rate of nothing)."""
    s = final.stats
    return s.accepted / s.drafted if s.drafted else None


def mean_accepted_length(final: FinalEvent) -> float | None:
    """tau = 1 + accepted / steps, or None when nothing was drafted or no step ran."""
    s = final.stats
    return s.mean_accepted_length if s.drafted and s.target_steps else None


def hidden_acceptance_rate(final: FinalEvent) -> float | None:
    """Hidden drafts accepted / hidden drafted, or None without hidden drafts."""
    s = final.stats
    return s.hidden_accepted / s.hidden_drafted if s.hidden_drafted else None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _fixed(value: float | None) -> str:
    return NOT_APPLICABLE if value is None else f"{value:.2f}"


def stats_table(final: FinalEvent) -> str:
    """The statistics as an aligned two-column table, one indented line each."""
    s = final.stats
    rows = [
        ("mode", final.mode.name.lower()),
        ("drafted / accepted", f"{s.drafted} / {s.accepted}"),
        ("acceptance rate", _fixed(acceptance_rate(final))),
        ("mean accepted length", _fixed(mean_accepted_length(final))),
        ("hidden drafted / accepted", f"{s.hidden_drafted} / {s.hidden_accepted}"),
        ("hidden acceptance rate", _fixed(hidden_acceptance_rate(final))),
        ("target steps", str(s.target_steps)),
        ("TTFT", f"{s.ttft_ms:.1f} ms"),
        ("total", f"{s.total_ms:.1f} ms"),
        ("uplink / downlink", f"{s.uplink_bytes} / {s.downlink_bytes} bytes"),
    ]
    if final.window is not None:
        w = final.window
        rows.append(("clip", f"[{w.clip_t0_us}, {w.clip_t1_us}) µs "
                             f"({(w.clip_t1_us - w.clip_t0_us) / 1000:g} ms)"))
        rows.append(("event window", f"[{w.event_t0_us}, {w.event_t1_us}) µs, "
                                     f"{w.num_events} events"))
    if final.plan is not None:
        rows.append(("plan", final.plan.reason))
    note = speculation_note(final)
    if note is not None:
        rows.append(("speculation", note))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


async def stream_answer(client: EdgeClient, spec: AskSpec, out: TextIO, view: AnswerView,
                        *, waiting: str = "waiting for the cloud…", suffix: str = "",
                        progress: TextIO | None = None) -> FinalEvent:
    """Ask, writing what ``view`` makes of each event; ends with the answer's line.

    What the edge waits for (a cloud warming up, say) goes to ``progress`` as one line
    each, when given: the live view shows it in place, a pipe's reader on stderr."""
    out.write(view.start(waiting))
    out.flush()
    final: FinalEvent | None = None
    async for event in client.ask(spec):
        if isinstance(event, FinalEvent):
            final = event
            continue
        if isinstance(event, ProgressEvent) and progress is not None:
            print(f"{event.message} ({event.waited_s:.0f} s)", file=progress, flush=True)
        text = view.on_event(event)
        if text:
            out.write(text)
            out.flush()
    if final is None:
        raise AskError(grpc.StatusCode.INTERNAL, "the edge ended the stream without a Final")
    out.write(view.finish(final, suffix))
    out.flush()
    return final


def write_timeline(final: FinalEvent, path: Path, *, title: str) -> int:
    """Draw ``final``'s timeline to ``path`` (``--timeline``); 1 when it cannot be."""
    from eventspec.shared.client.timeline_plot import TimelineUnavailable, draw

    if final.timeline is None:
        print("error: the edge sent no timeline (an edge older than this client?)",
              file=sys.stderr)
        return 1
    try:
        lanes = draw(final.timeline, path, title=title)
    except (TimelineUnavailable, OSError, ValueError) as exc:
        print(f"error: --timeline {path}: {exc}", file=sys.stderr)
        return 1
    print(f"timeline: {path} ({len(lanes)} lanes, {sum(lanes.values())} events)",
          file=sys.stderr)
    return 0
