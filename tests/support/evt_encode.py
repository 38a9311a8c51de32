"""Encoders of the Prophesee EVT 2.0 and 3.0 formats, for round-trip tests and files
the tests generate; the product only decodes (``eventspec.edge.events.evt2`` / ``evt3``).
"""

from __future__ import annotations

import numpy as np

from eventspec.edge.events import evt2, evt3


def encode_evt2(events: np.ndarray) -> np.ndarray:
    """Encode time-sorted EVENT_DTYPE events as EVT 2.0 words (uint32): a TIME_HIGH
    whenever t >> 6 changes, then one CD word per event."""
    t = events["t"].astype(np.int64)
    hi = t >> 6  # [E]
    new_hi = np.ones(t.size, dtype=bool)
    new_hi[1:] = hi[1:] != hi[:-1]
    cd = (
        (events["p"].astype(np.int64) << 28)
        | ((t & 0x3F) << 22)
        | (events["x"].astype(np.int64) << 11)
        | events["y"].astype(np.int64)
    )  # [E]
    th_words = (evt2.TIME_HIGH << 28) | (hi & 0x0FFFFFFF)  # [E]
    out = np.empty(t.size + int(new_hi.sum()), dtype=np.int64)
    pos = np.arange(t.size) + np.cumsum(new_hi)  # [E] slot of each CD word
    out[pos] = cd
    out[pos[new_hi] - 1] = th_words[new_hi]
    return out.astype(np.uint32)


def encode_evt3(events: np.ndarray, *, vectorise: bool = True) -> np.ndarray:
    """Encode time-sorted EVENT_DTYPE events as EVT 3.0 words (uint16).

    A reference encoder (a Python loop, not fast): it writes TIME_HIGH / TIME_LOW when
    they change, ADDR_Y when y changes, and, when ``vectorise``, runs of same-polarity
    events at one (t, y) as VECT_BASE_X + VECT_12. Times must be >= 0; they wrap every
    2^24 µs as on a camera.
    """
    out: list[int] = []
    th = tl = y_cur = -1
    i, n = 0, events.size
    t_all, x_all, y_all, p_all = (events[k].astype(np.int64) for k in ("t", "x", "y", "p"))
    while i < n:
        t, x, y, p = int(t_all[i]), int(x_all[i]), int(y_all[i]), int(p_all[i])
        hi, lo = (t >> 12) & 0xFFF, t & 0xFFF
        if hi != th:
            out.append((evt3.TIME_HIGH << 12) | hi)
            th, tl = hi, -1
        if lo != tl:
            out.append((evt3.TIME_LOW << 12) | lo)
            tl = lo
        if y != y_cur:
            out.append((evt3.ADDR_Y << 12) | y)
            y_cur = y
        # A run: same t, y, p and x strictly increasing within 12 of the first.
        j = i + 1
        if vectorise:
            while (
                j < n and t_all[j] == t and y_all[j] == y and p_all[j] == p
                and x < x_all[j] < x + 12 and x_all[j] > x_all[j - 1]
            ):
                j += 1
        if j - i >= 2:
            mask = 0
            for k in range(i, j):
                mask |= 1 << int(x_all[k] - x)
            out.append((evt3.VECT_BASE_X << 12) | (p << 11) | x)
            out.append((evt3.VECT_12 << 12) | mask)
        else:
            out.append((evt3.ADDR_X << 12) | (p << 11) | x)
            j = i + 1
        i = j
    return np.asarray(out, dtype=np.uint16)
