"""Draw a request's timeline (``eventspec.shared.contract.timeline``) as a Gantt chart with
matplotlib.

``eventspec ask --timeline out.png`` and ``eventspec demo --timeline out.png`` call
:func:`draw`. Edge lanes sit above cloud lanes on one time axis (the edge's clock; the
cloud's events were moved onto it when the edge merged the two logs). Verify steps and
commits are coloured by what happened to their drafts: all accepted, some rejected,
all rejected, or none verified (a plain decode step).

matplotlib is an optional dependency (``pip install 'eventspec[timeline]'``); it is
imported only here, and this module only when a picture is asked for, so ``eventspec
ask`` starts without it.
"""

from __future__ import annotations

from pathlib import Path

from eventspec.shared.contract.timeline import LANES, Timeline, TimelineEvent

LABELS = {
    "edge.render": "edge: window + render",
    "edge.uplink": "edge: uplink (Open, visual input)",
    "edge.plan": "edge: Plan received",
    "edge.draft_prefill": "edge: draft prefill",
    "edge.draft": "edge: drafting",
    "edge.drafts_sent": "edge: Drafts sent",
    "edge.commit": "edge: Commits received",
    "edge.done": "edge: Done received",
    "cloud.drafts": "cloud: Drafts received",
    "cloud.queue": "cloud: queue",
    "cloud.prefill": "cloud: prefill",
    "cloud.hidden": "cloud: hidden drafts",
    "cloud.verify": "cloud: verify steps",
    "cloud.commit": "cloud: Commits sent",
    "cloud.done": "cloud: Done sent",
}
#: Colours by what happened to a step's drafts.
ALL_ACCEPTED, SOME_REJECTED, ALL_REJECTED, NO_DRAFTS = "#2ca02c", "#ff7f0e", "#d62728", "#9e9e9e"
SPAN_COLOURS = {"edge": "#1f77b4", "cloud": "#7b4ea3"}
#: Steps annotated with "accepted/verified" when there are at most this many.
MAX_ANNOTATED = 48


class TimelineUnavailable(Exception):
    """matplotlib is not installed; the message says how to install it."""


def verdict_colour(e: TimelineEvent) -> str:
    """The colour of a verify step or commit, by its drafts' fate."""
    if e.verified <= 0:
        return NO_DRAFTS
    if e.accepted >= e.verified:
        return ALL_ACCEPTED
    return SOME_REJECTED if e.accepted > 0 else ALL_REJECTED


def draw(timeline: Timeline, path: Path, *, title: str = "") -> dict[str, int]:
    """Write the chart to ``path`` (PNG, or any format matplotlib knows by the suffix).

    Returns the lanes drawn, top to bottom, with how many events each shows: what the
    picture holds, checkable without reading pixels.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise TimelineUnavailable(
            "drawing a timeline needs matplotlib: pip install 'eventspec[timeline]'"
        ) from exc
    lanes = [lane for lane in LANES if timeline.lane(lane)]
    drawn: dict[str, int] = {}
    fig, ax = plt.subplots(figsize=(13, 0.55 * max(len(lanes), 4) + 1.8), dpi=110)
    try:
        for row, lane in enumerate(reversed(lanes)):
            events = timeline.lane(lane)
            drawn[lane] = len(events)
            _draw_lane(ax, lane, events, row)
        drawn = {lane: drawn[lane] for lane in lanes}
        ax.set_yticks(range(len(lanes)))
        ax.set_yticklabels([LABELS.get(lane, lane) for lane in reversed(lanes)], fontsize=8)
        edge_rows = sum(1 for lane in lanes if lane.startswith("edge."))
        if 0 < edge_rows < len(lanes):
            ax.axhline(len(lanes) - edge_rows - 0.5, color="black", linewidth=0.8)
        ax.set_ylim(-0.7, len(lanes) - 0.3)
        ax.set_xlabel("ms on the edge's clock (0 = the Open sent)", fontsize=9)
        ax.grid(axis="x", linestyle=":", linewidth=0.5)
        sync = (f"cloud clock offset {timeline.cloud_offset_ms:+.2f} ms: "
                f"{timeline.clock_sync}" if timeline.clock_sync else "")
        dropped = f"; {timeline.dropped} events left out" if timeline.dropped else ""
        ax.set_title(f"{title}\n{sync}{dropped}".strip(), fontsize=9)
        ax.legend(handles=[
            Patch(color=ALL_ACCEPTED, label="drafts all accepted"),
            Patch(color=SOME_REJECTED, label="some rejected"),
            Patch(color=ALL_REJECTED, label="all rejected"),
            Patch(color=NO_DRAFTS, label="no drafts (plain decode)"),
            Line2D([], [], marker="|", linestyle="", color="black", label="message"),
        ], loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=5, fontsize=8, frameon=False)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return drawn


def _draw_lane(ax: object, lane: str, events: list[TimelineEvent], row: int) -> None:
    """One lane: spans as bars, instants as ticks; verdicts coloured and annotated."""
    side = lane.split(".", 1)[0]
    bars = [e for e in events if e.end_ms > e.start_ms]
    ticks = [e for e in events if e.end_ms <= e.start_ms]
    annotate = len(events) <= MAX_ANNOTATED
    if lane in ("cloud.verify", "cloud.prefill"):
        colours = [verdict_colour(e) if lane == "cloud.verify" else SPAN_COLOURS[side]
                   for e in bars]
    else:
        colours = [SPAN_COLOURS.get(side, "#555555")] * len(bars)
    if bars:
        ax.broken_barh([(e.start_ms, e.end_ms - e.start_ms) for e in bars],  # type: ignore[attr-defined]
                       (row - 0.3, 0.6), facecolors=colours, edgecolor="white", linewidth=0.3)
    if lane == "cloud.verify" and annotate:
        for e in bars:
            ax.text((e.start_ms + e.end_ms) / 2, row + 0.34, f"{e.accepted}/{e.verified}",  # type: ignore[attr-defined]
                    ha="center", va="bottom", fontsize=6)
    if not ticks:
        return
    if lane in ("edge.commit", "cloud.commit"):
        tick_colours = [verdict_colour(e) for e in ticks]
    else:
        tick_colours = [SPAN_COLOURS.get(side, "#555555")] * len(ticks)
    ax.scatter([e.start_ms for e in ticks], [row] * len(ticks), marker="|", s=160,  # type: ignore[attr-defined]
               c=tick_colours, linewidths=1.6)
    if lane == "cloud.hidden":
        for e in ticks:
            ax.annotate(f"{e.verified} hidden drafts, {e.accepted} accepted",  # type: ignore[attr-defined]
                        (e.start_ms, row), xytext=(6, -3), textcoords="offset points",
                        fontsize=7)
    if lane == "edge.commit" and annotate:
        for e in ticks:
            ax.annotate(f"+{e.tokens}", (e.start_ms, row), xytext=(0, 8),  # type: ignore[attr-defined]
                        textcoords="offset points", ha="center", fontsize=6)
