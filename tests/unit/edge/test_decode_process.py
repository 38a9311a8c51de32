"""``DecoderProcess``: a child that spins is ended at its deadline and replaced, one that
dies is reported with its last stderr line, and ``close`` wakes a request waiting on it.

The child here is a few lines of stdlib Python standing in for the dv-processing worker,
so these tests need no recording and no library.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from eventspec.edge.events.decode_process import DecodeFailed, DecoderProcess, DecodeTimeout

FAKE = r'''
import io, json, sys
import numpy as np
for line in sys.stdin.buffer:
    op = json.loads(line)["op"]
    if op == "spin":
        while True:
            pass
    if op == "die":
        print("boom: the library crashed", file=sys.stderr, flush=True)
        sys.exit(3)
    if op == "fail":
        sys.stdout.buffer.write(json.dumps({"ok": False, "error": "bad packet"}).encode()
                                + b"\n")
    else:
        buf = io.BytesIO()
        np.save(buf, np.arange(5), allow_pickle=False)
        blob = buf.getvalue()
        head = {"ok": True, "op": op, "blobs": [len(blob)]}
        sys.stdout.buffer.write(json.dumps(head).encode() + b"\n" + blob)
    sys.stdout.buffer.flush()
'''


@pytest.fixture
def proc(tmp_path: Path) -> Iterator[DecoderProcess]:
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE)
    p = DecoderProcess(script, {"op": "open"}, open_deadline_s=30)
    yield p
    p.close()


def test_answers_with_arrays_and_reports_failures(proc: DecoderProcess) -> None:
    assert proc.start()["op"] == "open"
    head, arrays = proc.request({"op": "read"}, 30)
    assert head["op"] == "read" and np.array_equal(arrays[0], np.arange(5))
    with pytest.raises(DecodeFailed, match="bad packet"):
        proc.request({"op": "fail"}, 30)
    assert proc.request({"op": "read"}, 30)[0]["op"] == "read"  # still serving


def test_a_spinning_child_is_ended_and_replaced(proc: DecoderProcess) -> None:
    proc.start()
    with pytest.raises(DecodeTimeout):
        proc.request({"op": "spin"}, 0.5)
    head, _ = proc.request({"op": "read"}, 30)  # a fresh child, opened again first
    assert head["op"] == "read" and proc.restarts == 1


def test_a_dead_child_says_why(proc: DecoderProcess) -> None:
    with pytest.raises(DecodeFailed, match=r"exit status 3\): boom: the library crashed"):
        proc.request({"op": "die"}, 30)


def test_close_wakes_a_request_in_flight(proc: DecoderProcess) -> None:
    proc.start()
    errors: list[BaseException] = []

    def spin() -> None:
        try:
            proc.request({"op": "spin"}, 600)
        except BaseException as exc:  # the test inspects it
            errors.append(exc)

    worker = threading.Thread(target=spin)
    worker.start()
    while not proc._lock.locked():  # the request holds the child
        worker.join(0.01)
    proc.close()
    worker.join(30)
    assert not worker.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], DecodeFailed), errors
    assert "closed" in str(errors[0])
