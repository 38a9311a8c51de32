"""A generated 1 GiB EVT 2.0 recording: opening indexes it in one streaming pass and
windows decode only their blocks, so traced memory stays far below the file size
(it is bounded by one block, whatever the length: a 10 GB file needs 10x the index
entries, about 100 bytes each, and the same blocks)."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from eventspec.edge.events.prophesee_raw import PropheseeRawSource
from eventspec.edge.events.types import EVENT_DTYPE
from tests.support.evt_encode import encode_evt2

pytestmark = pytest.mark.slow
FILE_BYTES = 1 << 30
CHUNK_EVENTS = 4_000_000


def write_large_evt2(path: Path, target_bytes: int) -> tuple[int, int]:
    """Write events at ~1 per µs in chunks; returns (events, last t)."""
    rng = np.random.default_rng(0)
    n = t_next = 0
    with path.open("wb") as fh:
        fh.write(b"% evt 2.0\n% plugin_name hal_plugin_gen3_fx3\n% end\n")
        while fh.tell() < target_bytes:
            ev = np.zeros(CHUNK_EVENTS, dtype=EVENT_DTYPE)
            ev["t"] = t_next + np.cumsum(rng.integers(0, 3, CHUNK_EVENTS))
            ev["x"] = rng.integers(0, 640, CHUNK_EVENTS)
            ev["y"] = rng.integers(0, 480, CHUNK_EVENTS)
            ev["p"] = rng.integers(0, 2, CHUNK_EVENTS)
            fh.write(encode_evt2(ev).tobytes())
            n += ev.size
            t_next = int(ev["t"][-1])
    return n, t_next


def test_large_raw_is_indexed_and_windowed_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "large.raw"
    n, t_last = write_large_evt2(path, FILE_BYTES)
    size = path.stat().st_size
    tracemalloc.start()
    try:
        started = time.perf_counter()
        src = PropheseeRawSource(path)
        index_s = time.perf_counter() - started
        _, peak_open = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        t0, t1 = src.time_range_us()
        windows = [src.events_between(t, t + 50_000) for t in (t0, (t0 + t1) // 2, t1 - 50_000)]
        _, peak_windows = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert src.num_events == n and t1 - 1 == t_last
    assert all(w.size > 10_000 for w in windows)
    assert all(bool(np.all((w["t"] >= a) & (w["t"] < a + 50_000)))
               for w, a in zip(windows, (t0, (t0 + t1) // 2, t1 - 50_000), strict=True))
    # One 512k-word block decodes with ~50 MiB of temporaries; the file is 1 GiB and
    # holds ~270M events (3.8 GB as EVENT_DTYPE). The bound does not grow with the file.
    assert peak_open < 96 << 20, (peak_open, size)
    assert peak_windows < 96 << 20, (peak_windows, size)
    print(f"\n{size / 2**30:.2f} GiB, {n} events: index {index_s:.1f} s "
          f"({n / index_s / 1e6:.1f} M events/s), peak traced {peak_open / 2**20:.0f} MiB "
          f"open, {peak_windows / 2**20:.0f} MiB for 3 windows")
