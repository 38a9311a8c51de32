"""Fuzz every reader with damaged copies of the real recordings (issue 38, item 1).

Each real file is damaged three ways (random bytes over 2,000 bytes, 0.1% of bits
flipped, cut short), with fixed seeds, then opened as ``--source`` opens it and read
through a few windows, in one child process. Every case must end, within a bound, in a
result or a clear error that names the file: never a hang, never a numpy/zlib/library
message without the file (a "crash" here).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import zipfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli_processes import ROOT
from tests.support.damaged_files import MODES, Case, damage

REAL = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "real"
pytestmark = pytest.mark.skipif(not REAL.is_dir(), reason=f"real recordings not found at {REAL}")

#: The forced kind of each file family, and the size flag a file without one needs.
KINDS = {"aedat4_": "aedat4", "evt2_": "raw", "evt3_": "raw", "dat_": "dat", "bin_": "bin",
         "npy_": "npy", "txt_": "txt"}
SIZES = {"npy": (640, 480), "txt": (240, 180), "npz": (34, 34)}
SEEDS = (1, 2)
#: A case may take this long (AEDAT4: open 8 s + 4 windows x 4 s when every one spins).
CASE_BOUND_S = 60.0


def containers(tmp_path: Path) -> list[tuple[Path, str]]:
    """The N-MNIST recording's events re-written in the formats no real file here uses:
    a compressed and a stored ``.npz``, a structured ``.npy`` and a zipped ``events.txt``
    (zip and zlib errors were the red team's nameless messages)."""
    from eventspec.edge.events.sources import open_source

    src = open_source(f"bin:{REAL / 'bin_nmnist_tonic_test_sample.bin'}")
    ev = src.events_between(*src.time_range_us())
    cols = {k: ev[k] for k in ("x", "y", "t", "p")}
    folder = tmp_path / "made"
    folder.mkdir()
    np.savez_compressed(folder / "nmnist_compressed.npz", **cols)
    np.savez(folder / "nmnist_stored.npz", **cols)
    np.save(folder / "nmnist_structured.npy", ev)
    text = "".join(f"{int(t) / 1e6:.6f} {x} {y} {p}\n" for x, y, t, p in
                   zip(ev["x"], ev["y"], ev["t"], ev["p"], strict=True))
    with zipfile.ZipFile(folder / "nmnist_events.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("events.txt", text)
    return [(folder / "nmnist_compressed.npz", "npz"), (folder / "nmnist_stored.npz", "npz"),
            (folder / "nmnist_structured.npy", "npy"), (folder / "nmnist_events.zip", "txt")]


def cases(tmp_path: Path) -> list[Case]:
    out = []
    real = [(p, next(k for prefix, k in KINDS.items() if p.name.startswith(prefix)))
            for p in sorted(REAL.iterdir()) if p.name not in ("README.md", "SHA256SUMS")]
    for src, kind in real + containers(tmp_path):
        data = src.read_bytes()
        for mode in MODES:
            for seed in SEEDS:
                copy = tmp_path / f"{mode}{seed}_{src.name}"
                copy.write_bytes(damage(data, mode, seed))
                spec = f"{kind}:{copy}" if seed % 2 else str(copy)  # forced, then detected
                out.append(Case(str(copy), spec, mode, seed, SIZES.get(kind)))
    return out


def test_every_reader_gives_a_result_or_a_clear_error_for_damaged_files(tmp_path: Path
                                                                       ) -> None:
    todo = cases(tmp_path)
    cases_file = tmp_path / "cases.json"
    cases_file.write_text(json.dumps([asdict(c) for c in todo]))
    child = subprocess.Popen([sys.executable, "-m", "tests.support.damaged_files",
                              str(cases_file)], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
    assert child.stdout is not None
    results: list[dict] = []
    buf = b""
    current = -1
    deadline = time.monotonic() + CASE_BOUND_S
    try:
        while len(results) < len(todo):
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                hung = todo[current] if current >= 0 else "starting"
                assert left > 0 and select.select([child.stdout], [], [], left)[0], (
                    f"no result within {CASE_BOUND_S:g} s: {hung}")
                chunk = os.read(child.stdout.fileno(), 65536)
                assert chunk, f"the fuzz child died (exit {child.wait()}) in {hung}"
                buf += chunk
            line, buf = buf.split(b"\n", 1)
            msg = json.loads(line)
            current, deadline = msg["i"], time.monotonic() + CASE_BOUND_S
            if msg["event"] == "end":
                results.append(msg)
    finally:
        child.kill()
        child.wait()
    crashes = [(r["spec"], r["message"]) for r in results if r["outcome"] == "crash"]
    assert not crashes, crashes
    nameless = [(r["spec"], r["message"]) for r in results
                if r["outcome"] == "error" and Path(r["path"]).name not in r["message"]]
    assert not nameless, nameless
