"""A dv-net stream that stays down is one warning and a count, not one per retry (issue
38, item 5); and a stream decoder that stops its heartbeats (dv-processing spinning on
a damaged packet) is ended and the stream reconnected (item 1)."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest

from eventspec.edge.events import live_sources
from eventspec.edge.events.live_sources import DvNetReader
from tests.support.ports import refusing_port


def test_retries_of_a_down_stream_log_once(caplog: pytest.LogCaptureFixture) -> None:
    with refusing_port() as port:
        reader = DvNetReader("127.0.0.1", port, backoff_s=0.0, max_backoff_s=0.0)
        with caplog.at_level(logging.INFO, logger=live_sources.__name__):
            for _ in range(5):
                assert reader.read() is not None and not reader.health().connected
            reader._down_log.flush()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0] == (f"dv-net 127.0.0.1:{port}: connect: Connection refused; retrying "
                        "(backoff up to 0 s)"), lines
    assert re.fullmatch(r".*Connection refused; retrying \(backoff up to 0 s\) "
                        r"\(repeated 4 times in \d+ s\)", lines[1]), lines
    assert "Connection refused" in reader.last_error


SPINNER = r'''
import json, sys, time
out = sys.stdout.buffer
out.write(json.dumps({"connected": [32, 24]}).encode() + b"\n"); out.flush()
for _ in range(3):
    time.sleep(0.1)
    out.write(json.dumps({"hb": 1}).encode() + b"\n"); out.flush()
while True:  # the library spinning: no more heartbeats
    pass
'''


def test_a_decoder_that_stops_its_heartbeats_is_ended_and_reconnected(tmp_path: Path
                                                                      ) -> None:
    worker = tmp_path / "spinner.py"
    worker.write_text(SPINNER)
    reader = DvNetReader("127.0.0.1", 1, backoff_s=0.0, max_backoff_s=0.0, stall_s=0.5,
                         worker=worker)
    try:
        deadline = time.monotonic() + 60
        while reader.reconnects < 1:  # connected, stalled, ended, connected again
            assert time.monotonic() < deadline, reader.health()
            assert reader.read() is not None
        assert "decoder stalled for 0.5 s" in reader.last_error
    finally:
        reader.close()
