"""A bounded histogram of millisecond times, for percentiles over a long-running server.

Why a histogram and not a list of samples: the engine loop records a few numbers per
step for as long as the server runs, so keeping samples would grow without bound, and a
sampled reservoir cannot be subtracted (the load benchmark reads a level's share as
"after minus before"). Here the memory is fixed (:data:`BUCKETS` counts, whatever the
number of observations), two histograms subtract bucket by bucket, and a percentile is
off by at most half a bucket's width: within a factor ``sqrt(RATIO)`` (about 2 %) of the
exact nearest-rank percentile, for times between :data:`LOW_MS` and :data:`HIGH_MS`.

Only the engine thread observes; other threads read a copy (:meth:`LogHistogram.copy`):
the counts are a list of fixed length, so copying it while the engine thread adds to it
never fails (a copy may miss the observation in flight).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: The smallest time with a bucket of its own (anything below counts in the first).
LOW_MS = 0.01
#: Times above this count in the last bucket.
HIGH_MS = 100_000.0
#: Each bucket's upper bound over its lower bound.
RATIO = 1.04
_LOG_RATIO = math.log(RATIO)
#: Buckets per histogram: [LOW_MS * RATIO**i, LOW_MS * RATIO**(i + 1)) for each i.
BUCKETS = math.ceil(math.log(HIGH_MS / LOW_MS) / _LOG_RATIO) + 1


def bucket_of(ms: float) -> int:
    """The bucket a time of ``ms`` counts in."""
    if ms <= LOW_MS:
        return 0
    return min(BUCKETS - 1, int(math.log(ms / LOW_MS) / _LOG_RATIO))


def bucket_low(index: int) -> float:
    """The smallest time bucket ``index`` holds (its lower bound; the first holds less)."""
    return LOW_MS * math.exp(_LOG_RATIO * index)


def bucket_value(index: int) -> float:
    """What a percentile that falls in bucket ``index`` reads: the bucket's geometric
    middle (so the error is at most half a bucket either way)."""
    return LOW_MS * math.exp(_LOG_RATIO * (index + 0.5))


class LogHistogram:
    """Counts of times in log-spaced buckets, and their exact sum (for the mean)."""

    __slots__ = ("counts", "total_ms")

    def __init__(self, counts: Sequence[int] | None = None, total_ms: float = 0.0) -> None:
        self.counts = list(counts) if counts is not None else [0] * BUCKETS
        if len(self.counts) != BUCKETS:
            raise ValueError(f"a histogram has {BUCKETS} buckets, not {len(self.counts)}")
        self.total_ms = total_ms

    def observe(self, ms: float, weight: int = 1) -> None:
        """Count ``weight`` observations of ``ms``; a negative or NaN time is not counted
        (an unreadable timer must not shift the percentiles)."""
        if not ms >= 0.0 or weight < 1:
            return
        self.counts[bucket_of(ms)] += weight
        self.total_ms += ms * weight

    @property
    def count(self) -> int:
        return sum(self.counts)

    def copy(self) -> LogHistogram:
        return LogHistogram(self.counts, self.total_ms)

    def minus(self, before: LogHistogram) -> LogHistogram:
        """What was observed since ``before`` (an earlier copy of this histogram)."""
        return LogHistogram([a - b for a, b in zip(self.counts, before.counts, strict=True)],
                            self.total_ms - before.total_ms)

    def plus(self, other: LogHistogram) -> LogHistogram:
        """Both histograms' observations together."""
        return LogHistogram([a + b for a, b in zip(self.counts, other.counts, strict=True)],
                            self.total_ms + other.total_ms)

    def quantile_bucket(self, q: float) -> int | None:
        """The bucket of the nearest-rank ``q`` quantile (the smallest bucket holding at
        least ``ceil(q * n)`` observations at or below it); None when empty."""
        n = self.count
        if n == 0:
            return None
        rank = max(1, math.ceil(q * n))
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                return i
        return BUCKETS - 1

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile, ms, to within half a bucket; None when empty."""
        i = self.quantile_bucket(q)
        return None if i is None else bucket_value(i)

    def count_from(self, index: int) -> int:
        """Observations in bucket ``index`` and above."""
        return sum(self.counts[max(0, index):])

    def mean(self) -> float | None:
        n = self.count
        return self.total_ms / n if n else None
