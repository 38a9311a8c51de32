"""One INFO line per Generate request, however it ends.

Operators read the verifier's traffic from this line alone: the request id (already
made safe by ``eventspec.shared.node.logsafe``), the principal, the mode, the outcome
(a finish reason such as ``EOS``, or the status code of a refusal, failure or cancellation), the
tokens committed and the time taken. The question text never appears here: it is the user's
data, and it is not needed to operate the server.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from eventspec.shared.contract.types import RequestStats

log = logging.getLogger(__name__)

#: Longest error message quoted in the line (messages can echo peer-sent names).
MAX_DETAIL_CHARS = 160


@dataclass
class RequestRecord:
    """What the line says; filled in as the request goes."""

    principal: str
    request_id: str = "-"
    mode: str = "-"
    #: A finish reason or a status code; a stream closed without either was cancelled.
    outcome: str = "CANCELLED"
    tokens: int = 0
    detail: str = ""
    stats: RequestStats | None = None
    started: float = field(default_factory=time.perf_counter)

    def finish(self, reason: str, stats: RequestStats) -> None:
        """The answer ended with ``reason`` (EOS, MAX_TOKENS, ...)."""
        self.outcome, self.stats, self.tokens = reason, stats, stats.new_tokens

    def fail(self, code: str, message: str) -> None:
        """The request ended with status ``code``; the first failure wins."""
        if self.stats is None and not self.detail:
            self.outcome, self.detail = code, message

    def log(self) -> None:
        ms = (time.perf_counter() - self.started) * 1e3
        extra = ""
        if self.stats is not None:
            s = self.stats
            extra = (f", drafted {s.drafted} accepted {s.accepted} (tau "
                     f"{s.mean_accepted_length:.2f}), hidden {s.hidden_accepted}/"
                     f"{s.hidden_drafted}, ttft {s.ttft_ms:.1f} ms")
        elif self.detail:
            extra = f": {self.detail[:MAX_DETAIL_CHARS]!r}"
        log.info("generate %s: principal %s, mode %s, %s, %d tokens, %.1f ms%s",
                 self.request_id, self.principal, self.mode, self.outcome, self.tokens, ms,
                 extra)
