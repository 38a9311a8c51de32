"""A damaged AEDAT4 recording cannot take the edge down (issue 38, item 1).

2,000 random bytes over one packet of the real DVXplorer recording made dv-processing
spin forever in ``getEventsTimeRange`` for the window that crosses them, holding the
GIL: Asks, status and SIGTERM all hung. Now the decoder runs in a child process with a
deadline per window: that window is refused with INVALID_ARGUMENT naming the file and
the time range, the others still decode, and the node answers and stops meanwhile.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from eventspec.edge.events.aedat4 import Aedat4Source
from eventspec.shared.client.launch import entry_point_command
from eventspec.shared.contract.errors import InvalidInput
from tests.support.cli_processes import ROOT, spawn, wait_port
from tests.support.damaged_files import damage

REAL = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "real"
DVX = REAL / "aedat4_dvxplorer_tonic_test_sample.aedat4"
pytestmark = pytest.mark.skipif(not DVX.is_file(), reason=f"real recordings not found at {REAL}")

#: Where the damage goes: inside the packets of 250..300 ms into the recording.
DAMAGE_AT, DAMAGE_BYTES = 500_000, 2_000
T_FIRST = 1605537493718345  # the README's first event
BAD = (T_FIRST + 250_000, T_FIRST + 300_000)


def damaged_copy(tmp_path: Path, name: str = "damaged.aedat4") -> Path:
    data = bytearray(DVX.read_bytes())
    rng = np.random.default_rng(1)
    data[DAMAGE_AT:DAMAGE_AT + DAMAGE_BYTES] = rng.integers(0, 256, DAMAGE_BYTES,
                                                            dtype=np.uint8).tobytes()
    out = tmp_path / name
    out.write_bytes(bytes(data))
    return out


def test_the_damaged_window_is_refused_and_the_others_decode(tmp_path: Path) -> None:
    path = damaged_copy(tmp_path)
    intact = Aedat4Source(DVX)
    src = Aedat4Source(path, window_deadline_s=1.0)
    try:
        assert src.time_range_us() == intact.time_range_us()
        t0, t1 = src.time_range_us()
        refused = []
        for a in range(t0, t1, 50_000):
            b = a + 50_000
            try:
                ev = src.events_between(a, b)
            except InvalidInput as exc:
                refused.append((a, b))
                assert str(path) in str(exc) and f"[{a}, {b}) µs" in str(exc), exc
                continue
            assert np.array_equal(ev, intact.events_between(a, b)), (a, b)
        assert refused == [BAD]
        # Asked again, a range covering the damage is refused at once, with no new child.
        restarts = src._proc.restarts
        with pytest.raises(InvalidInput, match="did not decode earlier"):
            src.events_between(t0, t1)
        assert src._proc.restarts == restarts
    finally:
        src.close()
        intact.close()


def _ask(port: int, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        entry_point_command("eventspec", ["ask", "--edge", f"127.0.0.1:{port}", "--mode",
                                          "draft_only", "--max-new-tokens", "4",
                                          "--timeout", "20", *args, "What is moving?"]),
        cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _bad_window_args() -> list[str]:
    return ["--from-ms", str(BAD[0] / 1000), "--to-ms", str(BAD[1] / 1000),
            "--event-window-ms", "50"]


def test_the_edge_refuses_the_damaged_window_answers_meanwhile_and_stops(tmp_path: Path
                                                                         ) -> None:
    """``eventspec-edge serve`` on the damaged file: the Ask over the damage fails with
    INVALID_ARGUMENT (exit 2) naming the file, ``eventspec status`` answers while it is
    being decoded, other Asks work, and SIGTERM in the middle of a spin stops the node."""
    path = damaged_copy(tmp_path)
    log, port_file = tmp_path / "e.log", tmp_path / "e.port"
    edge = spawn("eventspec-edge", ["serve", "--source", str(path), "--model", "toy",
                                    "--port", "0", "--port-file", str(port_file)], log)
    try:
        port = wait_port(edge, port_file, log)
        cmd = entry_point_command("eventspec", ["ask", "--edge", f"127.0.0.1:{port}", "--mode",
                                                "draft_only", "--max-new-tokens", "4",
                                                "--timeout", "20", *_bad_window_args(),
                                                "What is moving?"])
        asking = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        status = subprocess.run(
            entry_point_command("eventspec", ["status", f"127.0.0.1:{port}", "--json"]),
            cwd=ROOT, capture_output=True, text=True, timeout=30)
        assert status.returncode == 0, status.stderr
        _, err = asking.communicate(timeout=60)
        assert asking.returncode == 2, err
        assert "INVALID_ARGUMENT" in err and str(path) in err, err
        assert f"[{BAD[0]}, {BAD[1]}) µs" in err, err
        good = _ask(port)
        assert good.returncode == 0, good.stderr
        # SIGTERM while a window spins ([265, 295) ms crosses the damaged packets but does
        # not cover the range refused above, so it is decoded again): the node stops
        # within its drain time (--grace-s 5) plus start-up slack, not after minutes.
        spin = subprocess.Popen(
            entry_point_command("eventspec", ["ask", "--edge", f"127.0.0.1:{port}", "--mode",
                                              "draft_only", "--from-ms",
                                              str((T_FIRST + 265_000) / 1000), "--to-ms",
                                              str((T_FIRST + 295_000) / 1000),
                                              "--event-window-ms", "30", "What?"]),
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            again = subprocess.run(  # gives the Ask time to reach the decoder, and checks
                entry_point_command("eventspec", ["status", f"127.0.0.1:{port}"]),
                cwd=ROOT, capture_output=True, text=True, timeout=30)
            assert again.returncode == 0, again.stderr
            edge.send_signal(signal.SIGTERM)
            assert edge.wait(20) == 0, log.read_text()[-2000:]
        finally:
            spin.kill()
            spin.wait()
    finally:
        if edge.poll() is None:
            edge.kill()
            edge.wait()


def bitflipped_copy(tmp_path: Path) -> Path:
    """0.1% of the DVXplorer file's bits flipped (seed 112): dv-processing spins while
    opening it (red-team finding 3: the edge sat in "opening the event source")."""
    out = tmp_path / "flipped.aedat4"
    out.write_bytes(damage(DVX.read_bytes(), "bitflip", 112))
    return out


def test_a_file_that_spins_while_opening_is_refused(tmp_path: Path) -> None:
    path = bitflipped_copy(tmp_path)
    with pytest.raises(InvalidInput, match=rf"{path}: dv-processing did not finish opening"):
        Aedat4Source(path, open_deadline_s=1.0)


def test_sigterm_while_opening_a_spinning_file_ends_the_decoder(tmp_path: Path) -> None:
    """SIGTERM during "opening the event source" cancels the decoder child at once: the
    node stops within its drain time (--grace-s, 5 s by default), not after the 8 s open
    deadline that bounds the spin (before the fix: after the deadline, 8 s)."""
    path = bitflipped_copy(tmp_path)
    log, port_file = tmp_path / "e.log", tmp_path / "e.port"
    edge = spawn("eventspec-edge", ["serve", "--source", f"aedat4:{path}", "--model", "toy",
                                    "--port", "0", "--port-file", str(port_file)], log)
    try:
        wait_for_text(edge, log, "opening the event source")
        edge.send_signal(signal.SIGTERM)
        try:
            edge.wait(5)
        except subprocess.TimeoutExpired:
            pytest.fail("the edge did not stop within its 5 s drain time")
        assert "stopped while warming up" in log.read_text(), log.read_text()[-2000:]
    finally:
        if edge.poll() is None:
            edge.kill()
            edge.wait()


def wait_for_text(proc: subprocess.Popen[bytes], log: Path, text: str, bound_s: float = 60
                  ) -> None:
    deadline = time.monotonic() + bound_s
    while text not in (log.read_text() if log.exists() else ""):
        assert proc.poll() is None, log.read_text()[-2000:]
        assert time.monotonic() < deadline, f"no {text!r} in {bound_s:g} s"
        time.sleep(0.05)
