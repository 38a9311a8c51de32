"""A dv-net stream that stays down is one warning and a count, not one per retry (issue
38, item 5). A stand-in for dv-processing refuses every connection at once."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from eventspec.edge.events import live_sources
from eventspec.edge.events.live_sources import DvNetReader


def refusing_dv() -> SimpleNamespace:
    def reader(host: str, port: int) -> None:
        raise RuntimeError("connect: Connection refused [network.hpp:42]")

    return SimpleNamespace(io=SimpleNamespace(NetworkReader=reader))


def test_retries_of_a_down_stream_log_once(monkeypatch: pytest.MonkeyPatch,
                                           caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(live_sources, "dv_module", refusing_dv)
    reader = DvNetReader("127.0.0.1", 1, backoff_s=0.0, max_backoff_s=0.0)
    with caplog.at_level(logging.INFO, logger=live_sources.__name__):
        for _ in range(20):
            assert reader.read() is not None and reader.health().connected is False
        reader._down_log.flush()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "dv-net 127.0.0.1:1: connect: Connection refused; retrying (backoff up to 0 s)",
        "dv-net 127.0.0.1:1: connect: Connection refused; retrying (backoff up to 0 s) "
        "(repeated 19 times in 0 s)",
    ], lines
    assert reader.last_error == "connect: Connection refused"
