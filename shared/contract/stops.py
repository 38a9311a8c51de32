"""Stop strings matched as an answer grows, looking only at what changed. Pure.

Both the cloud's decoding session (after every committed token, on the engine thread)
and the edge's draft_only answers use it. A stop list is capped
(``eventspec.shared.contract.types.MAX_STOP_STRINGS`` / ``MAX_STOP_CHARS``) and each
step scans only the new text plus the longest stop string's overlap, so a request cannot multiply
the per-token work of the loop that serves everyone (issue 19).
"""

from __future__ import annotations

from collections.abc import Sequence


def first_stop(text: str, stop: Sequence[str]) -> int | None:
    """Index in ``text`` of the earliest stop string, or None when none occurs."""
    hits = [text.find(s) for s in stop if s in text]
    return min(hits) if hits else None


def changed_from(old: str, new: str) -> int:
    """Length of the common prefix of ``old`` and ``new``.

    Decoding C again after a token usually only appends, but a tokenizer may rewrite the
    last few characters (an incomplete UTF-8 sequence, a merged space), so the common
    prefix is found by comparing slices (C speed), halving the span each time.
    """
    n = min(len(old), len(new))
    if new.startswith(old[:n]):
        return n
    lo, hi = 0, n  # old[:lo] == new[:lo]; old[:hi] != new[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if old[lo:mid] == new[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class StopMatcher:
    """The earliest stop string in a growing answer, looking only at what changed.

    A full scan of every stop string over the whole answer after every token costs
    O(stops x answer) per token; here each feed scans only the characters that changed
    since the last one plus the longest stop string's overlap into what came before,
    which is O(new text) per step for the capped stop list (``MAX_STOP_STRINGS``).
    """

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = tuple(stop)
        self._overlap = max((len(s) for s in self.stop), default=1) - 1
        self._text = ""
        #: Characters examined so far (what the O(new text) test measures).
        self.scanned = 0

    def feed(self, text: str) -> int | None:
        """The index in ``text`` (the whole answer now) of its earliest stop string.

        Text before the last feed's changes was already found free of stop strings, so
        only matches that end in the changed part are new.
        """
        if not self.stop:
            return None
        start = max(0, changed_from(self._text, text) - self._overlap)
        self._text = text
        window = text[start:]
        self.scanned += len(window)
        at = first_stop(window, self.stop)
        return None if at is None else start + at
