"""How many sessions the verifier runs at once, and how many it admits: ``--max-sessions``
resolved against the KV the engine reserved.

Why: a fixed default of 8 sessions used 11 of an H100's 58 GiB KV budget and refused or
queued the ninth caller (issue 35). A verifier meant to serve many edges takes as many
sessions as its KV holds, as vLLM's scheduler does (``max_num_seqs`` bounded by the KV
blocks), and lets the rest wait for KV instead of refusing them. So ``--max-sessions
auto`` (the default, 0 in the settings) means:

- **on a GPU**, the sessions that run at once are those whose KV the budget holds at the
  default answer cap (a prompt with an empty question plus ``--max-new-tokens``), at most
  ``GPU_SESSION_CEILING`` (the widest step the engine captures as a CUDA graph; wider
  steps would run eagerly, several times slower); up to ``--kv-queue`` more are admitted
  and wait in the KV queue (``eventspec.cloud.requests.kv_queue``) until KV frees;
- **on a CPU**, ``CPU_AUTO_SESSIONS`` run at once (a CPU steps slowly, and its budget is
  a nominal ``CPU_DEFAULT_KV_GB`` that says little about what fits), and as on a GPU up
  to ``--kv-queue`` more wait for KV.

An explicit ``--max-sessions N`` keeps its meaning: N concurrent Generate streams, of
which those that find no KV wait in the queue.
"""

from __future__ import annotations

from dataclasses import dataclass

from eventspec.shared.node.static.buckets import SESSION_BUCKETS

__all__ = ["AUTO_SESSIONS", "CPU_AUTO_SESSIONS", "GPU_SESSION_CEILING", "SessionCapacity",
           "auto_kv_sessions", "parse_max_sessions", "session_capacity"]

#: ``--max-sessions`` 0 (or ``auto``): from the KV on a GPU, ``CPU_AUTO_SESSIONS`` on a CPU.
AUTO_SESSIONS = 0
CPU_AUTO_SESSIONS = 8
#: The most sessions one step replays from a captured CUDA graph.
GPU_SESSION_CEILING = max(SESSION_BUCKETS)


def parse_max_sessions(text: str) -> int:
    """``--max-sessions`` / ``EVENTSPEC_CLOUD_MAX_SESSIONS``: ``auto`` or an integer
    (0 is auto); ValueError otherwise (range checks are the settings' own)."""
    if text.strip().lower() == "auto":
        return AUTO_SESSIONS
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"expected auto or an integer, got {text!r}") from None


@dataclass(frozen=True)
class SessionCapacity:
    """What ``--max-sessions`` came to, and why (the start-up log and ``eventspec status``)."""

    #: Sessions whose KV is held at once (the engine's slots, the scheduler's pool).
    running: int
    #: Concurrent Generate streams admitted (the registry's cap): ``running`` plus those
    #: that may wait for KV.
    admitted: int
    #: Positions a request at the default answer cap takes (prompt plus answer cap).
    request_positions: int
    #: Such requests the KV holds at once (before any ceiling), 0 where not computed.
    kv_holds: int
    #: Why these numbers, in words.
    reason: str

    def describe(self) -> str:
        """One line: how many sessions of what length fit, how many more wait, and why."""
        waiting = self.admitted - self.running
        queue = f"; {waiting} more may wait for KV (--kv-queue)" if waiting > 0 else ""
        return (f"{self.running} sessions run at once, {self.admitted} admitted{queue} "
                f"({self.reason})")


def auto_kv_sessions(*, kv_positions: int, request_positions: int, ceiling: int) -> int:
    """Requests of ``request_positions`` that ``kv_positions`` hold side by side, at
    least 1 (the KV plan already refused a budget that holds none) and at most
    ``ceiling``."""
    if request_positions < 1:
        raise ValueError(f"a request takes at least one position, got {request_positions}")
    return max(1, min(ceiling, kv_positions // request_positions))


def session_capacity(*, requested: int, on_gpu: bool, kv_sessions: int, kv_queue: int,
                     request_positions: int, kv_holds: int) -> SessionCapacity:
    """``--max-sessions`` (``requested``, ``AUTO_SESSIONS`` for auto) resolved against
    ``kv_sessions``, the sessions the engine was built for; ``kv_holds``: requests of
    ``request_positions`` its KV holds side by side (before any ceiling)."""
    if requested != AUTO_SESSIONS:
        return SessionCapacity(
            running=kv_sessions, admitted=requested, request_positions=request_positions,
            kv_holds=kv_holds,
            reason=f"--max-sessions {requested}; the KV holds {kv_holds} requests of "
                   f"{request_positions} positions")
    if not on_gpu:
        return SessionCapacity(
            running=kv_sessions, admitted=kv_sessions + kv_queue,
            request_positions=request_positions, kv_holds=kv_holds,
            reason=f"--max-sessions auto on a CPU: {CPU_AUTO_SESSIONS} at once")
    ceiling = (f", at most {GPU_SESSION_CEILING} (the widest captured step)"
               if kv_holds > GPU_SESSION_CEILING else "")
    return SessionCapacity(
        running=kv_sessions, admitted=kv_sessions + kv_queue,
        request_positions=request_positions, kv_holds=kv_holds,
        reason=f"--max-sessions auto: the KV holds {kv_holds} requests of "
               f"{request_positions} positions, a prompt and the default answer cap"
               f"{ceiling}")
