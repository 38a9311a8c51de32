"""Prophesee EVT 2.0 words -> events, vectorised, following the format specification.

Spec: Prophesee, "EVT 2.0 Format", Metavision SDK documentation (data encoding
formats, ``evt2.html``). Little-endian 32-bit words, type in bits 31..28:

=====  ==============  ==============================================================
type   name            payload
=====  ==============  ==============================================================
0x0    CD_OFF          t low 6 bits (27..22), x (21..11), y (10..0); polarity 0
0x1    CD_ON           same layout; polarity 1
0x8    EVT_TIME_HIGH   bits 27..0: the high 28 bits of the 34-bit µs timestamp
0xA    EXT_TRIGGER     trigger edge (ignored here)
0xE    OTHERS          monitoring (ignored)
0xF    CONTINUED       extra data of the previous word (ignored)
=====  ==============  ==============================================================

t = TIME_HIGH << 6 | t_low. TIME_HIGH wraps every 2^34 µs (4.8 h); a drop by more than
half its range counts as a wrap. Events before the first TIME_HIGH have no time and are
dropped, as Metavision does. We decode this ourselves rather than through expelliarmus
or faery so that EVT 2.0 and 3.0 share one block-wise, seekable code path (faery and
expelliarmus agree with this decoder on both EVT 2.0 files in the real-data README).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eventspec.edge.events.types import EVENT_DTYPE
from eventspec.shared.contract.errors import InvalidInput

CD_OFF, CD_ON, TIME_HIGH, EXT_TRIGGER, OTHERS, CONTINUED = 0x0, 0x1, 0x8, 0xA, 0xE, 0xF
VALID_TYPES = frozenset({CD_OFF, CD_ON, TIME_HIGH, EXT_TRIGGER, OTHERS, CONTINUED})
_HIGH_PERIOD = 1 << 28


@dataclass(frozen=True)
class Evt2State:
    """Decoder state between blocks: TIME_HIGH including wraps (-1: none seen yet)."""

    time_high: int = -1


def decode_evt2(
    words: np.ndarray, state: Evt2State, *, byte_offset: int = 0, path: str = "<evt2>"
) -> tuple[np.ndarray, Evt2State]:
    """Decode 32-bit EVT 2.0 ``words`` from ``state`` -> (events in stream order, state)."""
    w = np.asarray(words, dtype=np.uint32).astype(np.int64)  # [N]
    if w.size == 0:
        return np.zeros(0, dtype=EVENT_DTYPE), state
    typ = w >> 28  # [N]
    bad = ~np.isin(typ, list(VALID_TYPES))
    if bool(bad.any()):
        i = int(np.argmax(bad))
        raise InvalidInput(
            f"{path}: byte offset {byte_offset + 4 * i}: word 0x{int(w[i]):08x} has type "
            f"0x{int(typ[i]):x}, which EVT 2.0 does not define (expected one of "
            f"{sorted(VALID_TYPES)}); is the file really EVT 2.0?"
        )
    is_th = typ == TIME_HIGH
    th_raw = w[is_th] & 0x0FFFFFFF  # [H]
    if th_raw.size:
        prev = state.time_high
        base_loops = (prev // _HIGH_PERIOD) * _HIGH_PERIOD if prev >= 0 else 0
        seq = np.concatenate([[prev % _HIGH_PERIOD if prev >= 0 else int(th_raw[0])], th_raw])
        wraps = np.cumsum(np.diff(seq) < -(_HIGH_PERIOD // 2))  # [H]
        th_full = base_loops + th_raw + wraps * _HIGH_PERIOD
    else:
        th_full = th_raw
    th_vals = np.zeros(w.size, dtype=np.int64)
    th_vals[is_th] = th_full
    idx = np.maximum.accumulate(np.where(is_th, np.arange(w.size), -1))  # [N]
    time_high = np.where(idx >= 0, th_vals[np.maximum(idx, 0)], state.time_high)  # [N]

    ei = np.flatnonzero(((typ == CD_OFF) | (typ == CD_ON)) & (time_high >= 0))  # [E]
    ew = w[ei]
    ev = np.empty(ei.size, dtype=EVENT_DTYPE)
    ev["t"] = (time_high[ei] << 6) | ((ew >> 22) & 0x3F)
    ev["x"] = (ew >> 11) & 0x7FF
    ev["y"] = ew & 0x7FF
    ev["p"] = typ[ei]
    return ev, Evt2State(int(time_high[-1]))

