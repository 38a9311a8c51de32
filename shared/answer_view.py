"""How an answer is shown: the live terminal stream, the statistics table, ``--json``.

Used by ``eventspec ask`` and ``eventspec demo``. No torch, nothing of the demo world.
"""

from __future__ import annotations

from typing import Any, TextIO

import grpc

from shared.client import AskError, EdgeClient
from shared.types import AskSpec, CommittedEvent, FinalEvent, PreviewEvent

MUTED, RESET, CLEAR_LINE = "\x1b[2m", "\x1b[0m", "\r\x1b[2K"


def final_to_json(final: FinalEvent) -> dict[str, Any]:
    """The ``--json`` object: answer, ids, mode and the statistics."""
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
            "acceptance_rate": round(s.acceptance_rate, 4),
            "mean_accepted_length": round(s.mean_accepted_length, 4),
            "hidden_drafted": s.hidden_drafted,
            "hidden_accepted": s.hidden_accepted,
            "target_steps": s.target_steps,
            "ttft_ms": round(s.ttft_ms, 2),
            "total_ms": round(s.total_ms, 2),
            "uplink_bytes": s.uplink_bytes,
            "downlink_bytes": s.downlink_bytes,
            "stale_drafts": s.stale_drafts,
            "stage_ms": {k: round(v, 2) for k, v in sorted(s.stage_ms.items())},
        },
    }


def stats_table(final: FinalEvent) -> str:
    """The statistics as an aligned two-column table, one indented line each."""
    s = final.stats
    rows = [
        ("mode", final.mode.name.lower()),
        ("drafted / accepted", f"{s.drafted} / {s.accepted}"),
        ("acceptance rate", f"{s.acceptance_rate:.2f}"),
        ("mean accepted length", f"{s.mean_accepted_length:.2f}"),
        ("hidden drafted / accepted", f"{s.hidden_drafted} / {s.hidden_accepted}"),
        ("target steps", str(s.target_steps)),
        ("TTFT", f"{s.ttft_ms:.1f} ms"),
        ("total", f"{s.total_ms:.1f} ms"),
        ("uplink / downlink", f"{s.uplink_bytes} / {s.downlink_bytes} bytes"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


async def stream_answer(
    client: EdgeClient, spec: AskSpec, out: TextIO, *, live: bool
) -> FinalEvent:
    """Ask; in a terminal show the muted preview, replaced by committed text."""
    final: FinalEvent | None = None
    committed = ""
    async for event in client.ask(spec):
        if isinstance(event, PreviewEvent) and live:
            out.write(f"{CLEAR_LINE}{committed}{MUTED}{event.text[len(committed):]}{RESET}")
            out.flush()
        elif isinstance(event, CommittedEvent):
            committed = event.text
            if live:
                out.write(f"{CLEAR_LINE}{committed}")
                out.flush()
        elif isinstance(event, FinalEvent):
            final = event
    if live:
        out.write(f"{CLEAR_LINE}")
    if final is None:
        raise AskError(grpc.StatusCode.INTERNAL, "the edge ended the stream without a Final")
    return final
