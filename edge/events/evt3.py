"""Prophesee EVT 3.0 words -> events, vectorised, following the format specification.

Spec: Prophesee, "EVT 3.0 Format", Metavision SDK documentation (data encoding
formats, ``evt3.html``). EVT 3.0 is a stream of little-endian 16-bit words whose top
4 bits give the type; events carry only what changed since the previous word:

=====  ==============  ==============================================================
type   name            payload (bits 11..0)
=====  ==============  ==============================================================
0x0    EVT_ADDR_Y      y (bits 10..0); bit 11 is the system type (ignored)
0x2    EVT_ADDR_X      polarity (bit 11), x (bits 10..0): one event at (x, y, t)
0x3    VECT_BASE_X     polarity (bit 11), x (bits 10..0): base of the next vectors
0x4    VECT_12         12-bit validity mask: events at base_x + i; then base_x += 12
0x5    VECT_8          8-bit validity mask (bits 7..0); then base_x += 8
0x6    EVT_TIME_LOW    the low 12 bits of the 24-bit timestamp
0x7    CONTINUED_4     extra data of the previous word (ignored)
0x8    EVT_TIME_HIGH   the high 12 bits of the 24-bit timestamp
0xA    EXT_TRIGGER     trigger edge (ignored here)
0xE    OTHERS          monitoring (ignored)
0xF    CONTINUED_12    extra data of the previous word (ignored)
=====  ==============  ==============================================================

Time, read literally: TIME_HIGH sets bits 23..12 and TIME_LOW sets bits 11..0 of the
current time, and each keeps its value until the next word of its type. A decrease of
TIME_LOW is NOT a wrap (TIME_HIGH carries the wrap; expelliarmus 1.1.12 adds 4096 µs
there and ends 45 ms late on an 8.8 ms file, see the real-data README note E1), and a
backward TIME_LOW step is taken as written (faery 0.7.1 ignores it). Only TIME_HIGH
wraps, every 2^24 µs; a drop of TIME_HIGH by more than half its range counts as one.
So a stream's time is the camera clock modulo 2^24 µs at its first TIME_HIGH, plus
the wraps seen since (Metavision has the same limit).
Events before the first TIME_HIGH have no time and are dropped, as Metavision does.

The decoder is a pure function of (words, state) -> (events, state), so a large file
can be decoded in blocks from a saved state (see ``eventspec.edge.events.prophesee_raw``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eventspec.edge.events.types import EVENT_DTYPE
from eventspec.shared.contract.errors import InvalidInput

ADDR_Y, ADDR_X, VECT_BASE_X, VECT_12, VECT_8 = 0x0, 0x2, 0x3, 0x4, 0x5
TIME_LOW, CONTINUED_4, TIME_HIGH, EXT_TRIGGER, OTHERS, CONTINUED_12 = (
    0x6, 0x7, 0x8, 0xA, 0xE, 0xF,
)
VALID_TYPES = frozenset(
    {ADDR_Y, ADDR_X, VECT_BASE_X, VECT_12, VECT_8, TIME_LOW, CONTINUED_4, TIME_HIGH,
     EXT_TRIGGER, OTHERS, CONTINUED_12}
)
_HIGH_PERIOD = 1 << 12  # TIME_HIGH values before a wrap


@dataclass(frozen=True)
class Evt3State:
    """Decoder state between blocks. ``time_high`` includes wraps (-1: none seen yet)."""

    time_high: int = -1
    time_low: int = 0
    y: int = 0
    base_x: int = 0
    pol: int = 0


def _ffill(is_set: np.ndarray) -> np.ndarray:
    """Index of the last word at or before each position where ``is_set`` (-1 if none)."""
    idx = np.where(is_set, np.arange(is_set.size), -1)  # [N]
    return np.maximum.accumulate(idx) if idx.size else idx


def decode_evt3(
    words: np.ndarray, state: Evt3State, *, byte_offset: int = 0, path: str = "<evt3>"
) -> tuple[np.ndarray, Evt3State]:
    """Decode 16-bit EVT 3.0 ``words`` starting from ``state``.

    Returns (EVENT_DTYPE events in stream order, the state after the last word).
    ``byte_offset`` (of ``words[0]`` in the file) and ``path`` only name the place of a
    word of an undefined type in the InvalidInput raised for it.
    """
    w = np.asarray(words, dtype=np.uint16).astype(np.int64)  # [N]
    n = w.size
    if n == 0:
        return np.zeros(0, dtype=EVENT_DTYPE), state
    typ = w >> 12  # [N]
    payload = w & 0xFFF  # [N]
    bad = ~np.isin(typ, list(VALID_TYPES))
    if bool(bad.any()):
        i = int(np.argmax(bad))
        raise InvalidInput(
            f"{path}: byte offset {byte_offset + 2 * i}: word 0x{int(w[i]):04x} has type "
            f"0x{int(typ[i]):x}, which EVT 3.0 does not define (expected one of "
            f"{sorted(VALID_TYPES)}); is the file really EVT 3.0?"
        )

    # TIME_HIGH with wraps: a drop of more than half the range is one wrap forward.
    is_th = typ == TIME_HIGH
    th_raw = payload[is_th]  # [H]
    prev_th = state.time_high
    if th_raw.size:
        base_loops = (prev_th // _HIGH_PERIOD) * _HIGH_PERIOD if prev_th >= 0 else 0
        prev_low12 = prev_th % _HIGH_PERIOD if prev_th >= 0 else int(th_raw[0])
        seq = np.concatenate([[prev_low12], th_raw])  # [H+1]
        wraps = np.cumsum(np.diff(seq) < -(_HIGH_PERIOD // 2))  # [H]
        th_full = base_loops + th_raw + wraps * _HIGH_PERIOD  # [H]
    else:
        th_full = th_raw
    th_vals = np.zeros(n, dtype=np.int64)
    th_vals[is_th] = th_full
    last_th = _ffill(is_th)
    time_high = np.where(last_th >= 0, th_vals[np.maximum(last_th, 0)], state.time_high)

    is_tl = typ == TIME_LOW
    last_tl = _ffill(is_tl)
    time_low = np.where(last_tl >= 0, payload[np.maximum(last_tl, 0)], state.time_low)
    t_word = time_high * _HIGH_PERIOD + time_low  # [N] µs, valid where time_high >= 0

    is_y = typ == ADDR_Y
    last_y = _ffill(is_y)
    y_word = np.where(last_y >= 0, payload[np.maximum(last_y, 0)] & 0x7FF, state.y)

    # Vectors: base_x is the last VECT_BASE_X plus 12/8 per vector word since it.
    is_bx = typ == VECT_BASE_X
    inc = np.where(typ == VECT_12, 12, 0) + np.where(typ == VECT_8, 8, 0)  # [N]
    cum_incl = np.cumsum(inc)  # [N]
    cum_excl = cum_incl - inc
    last_bx = _ffill(is_bx)
    j = np.maximum(last_bx, 0)
    base_x = np.where(
        last_bx >= 0, (payload[j] & 0x7FF) + cum_excl - cum_incl[j], state.base_x + cum_excl
    )  # [N] base x in effect at each word
    vpol = np.where(last_bx >= 0, payload[j] >> 11, state.pol)  # [N]

    # Single events.
    ai = np.flatnonzero(typ == ADDR_X)  # [A]
    # Vector events: one per set bit, x = base + bit.
    vi = np.flatnonzero((typ == VECT_12) | (typ == VECT_8))  # [V]
    masks = np.where(typ[vi] == VECT_12, payload[vi], payload[vi] & 0xFF)  # [V]
    bits = (masks[:, None] >> np.arange(12)) & 1  # [V, 12]
    r, c = np.nonzero(bits)  # [E_v] row-major: word order, then bit order
    word_of = np.concatenate([ai, vi[r]])  # [E]
    x = np.concatenate([payload[ai] & 0x7FF, base_x[vi[r]] + c])  # [E]
    p = np.concatenate([payload[ai] >> 11, vpol[vi[r]]])  # [E]
    order = np.argsort(word_of, kind="stable")
    word_of, x, p = word_of[order], x[order], p[order]
    keep = time_high[word_of] >= 0  # no time before the first TIME_HIGH
    word_of, x, p = word_of[keep], x[keep], p[keep]

    ev = np.empty(word_of.size, dtype=EVENT_DTYPE)
    if bool((x > 0xFFFF).any()):
        i = int(word_of[int(np.argmax(x > 0xFFFF))])
        raise InvalidInput(
            f"{path}: byte offset {byte_offset + 2 * i}: vector runs past x=65535; "
            "expected VECT_BASE_X before vectors"
        )
    ev["x"] = x
    ev["y"] = y_word[word_of]
    ev["t"] = t_word[word_of]
    ev["p"] = p
    end = Evt3State(
        time_high=int(time_high[-1]),
        time_low=int(time_low[-1]),
        y=int(y_word[-1]),
        base_x=int(base_x[-1] + inc[-1]),
        pol=int(vpol[-1]),
    )
    return ev, end

