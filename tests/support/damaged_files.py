"""Damaged copies of the real recordings, and a child process that opens each one with
every reader and reads windows from it (issue 38's fuzz).

Run as ``python -m tests.support.damaged_files CASES.json``: for each case it prints a
``start`` line, then an ``end`` line whose ``outcome`` is ``ok`` (opened and every
window read), ``error`` (a clear refusal: InvalidInput/NotFound/FailedPrecondition,
whose text names the file) or ``crash`` (anything else: type and message). The parent
reads those lines with a deadline, so a reader that hangs fails the case that hung.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

MODES = ("overwrite", "bitflip", "truncate")


@dataclass(frozen=True)
class Case:
    """One damaged copy: where it is, what damage, and how to open it."""

    path: str
    spec: str
    mode: str
    seed: int
    sensor_size: tuple[int, int] | None = None


def damage(data: bytes, mode: str, seed: int) -> bytes:
    """``overwrite``: 2,000 random bytes at a random offset past the first 64;
    ``bitflip``: 0.1% of the bits (at least 8) flipped anywhere; ``truncate``: cut at a
    random point."""
    rng = np.random.default_rng(seed)
    out = bytearray(data)
    n = len(out)
    if mode == "overwrite":
        size = min(2_000, max(1, n // 4))
        at = int(rng.integers(min(64, n - size), n - size + 1))
        out[at:at + size] = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    elif mode == "bitflip":
        bits = max(8, n * 8 // 1000)
        where = rng.integers(0, n * 8, bits)
        for b in where:
            out[int(b) // 8] ^= 1 << (int(b) % 8)
    elif mode == "truncate":
        out = out[: int(rng.integers(1, n))]
    else:
        raise ValueError(mode)
    return bytes(out)


def run_case(case: Case, windows: int = 4) -> dict[str, object]:
    """Open the copy as the edge would and read ``windows`` 20 ms windows across it."""
    from eventspec.edge.events.sources import open_source
    from eventspec.shared.contract.errors import FailedPrecondition, InvalidInput, NotFound

    try:
        src = open_source(case.spec, allow_pickle=True, sensor_size=case.sensor_size)
        try:
            t0, t1 = src.time_range_us()
            for a in np.linspace(t0, max(t0, t1 - 20_000), windows).astype(np.int64):
                src.events_between(int(a), int(a) + 20_000)
                src.rgb_frames_between(int(a), int(a) + 20_000)
        finally:
            close = getattr(src, "close", None)
            if callable(close):
                close()
    except (InvalidInput, NotFound, FailedPrecondition) as exc:
        return {"outcome": "error", "message": str(exc)[:500]}
    except Exception as exc:  # the fuzz looks for exactly these
        return {"outcome": "crash", "message": f"{type(exc).__name__}: {str(exc)[:500]}"}
    return {"outcome": "ok", "message": ""}


def main(cases_file: str) -> None:
    cases = [Case(**{**c, "sensor_size": tuple(c["sensor_size"]) if c["sensor_size"] else None})
             for c in json.loads(Path(cases_file).read_text())]
    for i, case in enumerate(cases):
        print(json.dumps({"i": i, "event": "start"}), flush=True)
        start = time.monotonic()
        result = run_case(case)
        print(json.dumps({"i": i, "event": "end", "s": round(time.monotonic() - start, 3),
                          **asdict(case), **result}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
