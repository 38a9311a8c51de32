"""DAT, N-MNIST .bin, ECD events.txt/.zip and AEDAT4 readers, and format detection:
written files decode back, sizes say where they came from, bad files say where."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from eventspec.edge.events.aedat4 import Aedat4Source
from eventspec.edge.events.detect import detect_kind
from eventspec.edge.events.ecd_txt import EcdTextSource
from eventspec.edge.events.nmnist_bin import NmnistBinSource
from eventspec.edge.events.prophesee_dat import PropheseeDatSource
from eventspec.edge.events.sources import open_source, parse_sensor_size
from eventspec.edge.events.types import EVENT_DTYPE
from eventspec.shared.contract.errors import InvalidInput, NotFound
from tests.support.evt_encode import encode_evt2


def _events(n: int, w: int, h: int, span: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ev = np.zeros(n, dtype=EVENT_DTYPE)
    ev["t"] = np.sort(rng.integers(0, span, n))
    ev["x"], ev["y"], ev["p"] = rng.integers(0, w, n), rng.integers(0, h, n), rng.integers(0, 2, n)
    return ev


def write_dat(path: Path, ev: np.ndarray, header: str = "% Version 2\n") -> Path:
    rec = np.zeros(ev.size, dtype=[("t", "<u4"), ("w", "<u4")])
    rec["t"] = ev["t"]
    rec["w"] = (ev["x"].astype(np.uint32) | (ev["y"].astype(np.uint32) << 14)
                | (ev["p"].astype(np.uint32) << 28))
    path.write_bytes(header.encode() + bytes([0, 8]) + rec.tobytes())
    return path


def write_nmnist(path: Path, ev: np.ndarray, overflow_after: int | None = None) -> Path:
    """40-bit records; an overflow marker (y = 240) after index ``overflow_after``."""
    t = ev["t"].astype(np.int64)
    rows = []
    for i, e in enumerate(ev):
        tt = int(t[i]) - (1 << 13 if overflow_after is not None and i > overflow_after else 0)
        rows.append([int(e["x"]), int(e["y"]), (int(e["p"]) << 7) | (tt >> 16), (tt >> 8) & 255,
                     tt & 255])
        if i == overflow_after:
            rows.append([0, 240, 0, 0, 0])
    path.write_bytes(np.asarray(rows, dtype=np.uint8).tobytes())
    return path


def test_dat_round_trip_and_size_precedence(tmp_path: Path) -> None:
    ev = _events(3000, 120, 90, 100_000)
    src = PropheseeDatSource(write_dat(tmp_path / "a.dat", ev))
    assert np.array_equal(src.events_between(*src.time_range_us()), ev)
    assert src.meta.size_from == "inferred from events"
    assert src.sensor_size == (int(ev["x"].max()) + 1, int(ev["y"].max()) + 1)
    assert np.array_equal(src.events_between(20_000, 30_000),
                          ev[(ev["t"] >= 20_000) & (ev["t"] < 30_000)])
    flagged = PropheseeDatSource(tmp_path / "a.dat", sensor_size=(304, 240))
    assert flagged.sensor_size == (304, 240) and flagged.meta.size_from == "flag"
    sized = PropheseeDatSource(write_dat(tmp_path / "b.dat", ev,
                                         "% Version 2\n% Width 640\n% Height 480\n"))
    assert sized.sensor_size == (640, 480) and sized.meta.size_from == "header geometry"


def test_dat_errors_name_the_offset(tmp_path: Path) -> None:
    ev = _events(50, 10, 10, 1000)
    path = write_dat(tmp_path / "t.dat", ev)
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(InvalidInput, match=r"t\.dat: byte offset \d+: truncated.*8-byte"):
        PropheseeDatSource(path)
    back = ev.copy()
    back["t"][20] = 0
    bad = write_dat(tmp_path / "b.dat", back)
    header = len(b"% Version 2\n") + 2
    with pytest.raises(InvalidInput, match=rf"byte offset {header + 8 * 20}: timestamp 0"):
        PropheseeDatSource(bad)
    other = tmp_path / "o.dat"
    other.write_bytes(b"% Version 2\n" + bytes([2, 12]) + bytes(24))
    with pytest.raises(InvalidInput, match="event type 2, size 12"):
        PropheseeDatSource(other)


def test_nmnist_overflow_markers_advance_time(tmp_path: Path) -> None:
    ev = _events(400, 34, 34, 20_000)
    ev["t"][200:] += 1 << 13
    path = write_nmnist(tmp_path / "n.bin", ev, overflow_after=199)
    src = NmnistBinSource(path)
    assert np.array_equal(src.events_between(*src.time_range_us()), ev)
    assert src.sensor_size == (34, 34) and src.meta.size_from.startswith("format")
    path.write_bytes(path.read_bytes() + b"\x01")
    with pytest.raises(InvalidInput, match=r"byte offset \d+: truncated.*5-byte"):
        NmnistBinSource(path)


def test_ecd_text_and_zip(tmp_path: Path) -> None:
    lines = "1468939993.067416000 33 39 1\n1468939993.067427001 158 145 1\n" \
            "1468939993.067466000 88 143 0\n"
    txt = tmp_path / "events.txt"
    txt.write_text(lines)
    src = EcdTextSource(txt, sensor_size=(240, 180))
    ev = src.events_between(*src.time_range_us())
    assert ev["t"].tolist() == [1468939993067416, 1468939993067427, 1468939993067466]
    assert ev["x"].tolist() == [33, 158, 88] and ev["p"].tolist() == [1, 1, 0]
    assert src.sensor_size == (240, 180) and src.meta.size_from == "flag"
    zipped = tmp_path / "seq.zip"
    with zipfile.ZipFile(zipped, "w") as zf:
        zf.write(txt, "shapes/events.txt")
    assert detect_kind(zipped) == "txt"
    from_zip = open_source(str(zipped), sensor_size=(240, 180))
    assert np.array_equal(from_zip.events_between(*from_zip.time_range_us()), ev)
    bad = tmp_path / "bad.txt"
    bad.write_text("0.1 2 3\n")
    with pytest.raises(InvalidInput, match="expected 4"):
        EcdTextSource(bad)


def test_detection_prefers_content_over_extension(tmp_path: Path) -> None:
    ev = _events(100, 50, 40, 10_000)
    raw_named_bin = tmp_path / "camera.bin"
    raw_named_bin.write_bytes(b"% evt 2.0\n% plugin_name hal_plugin_gen3_fx3\n"
                              + encode_evt2(ev).tobytes())
    assert detect_kind(raw_named_bin) == "raw"
    src = open_source(str(raw_named_bin))
    assert src.sensor_size == (640, 480)
    aedat = tmp_path / "x.txt"
    aedat.write_bytes(b"#!AER-DAT4.0\r\n" + bytes(64))
    assert detect_kind(aedat) == "aedat4"
    old = tmp_path / "old.aedat"
    old.write_bytes(b"#!AER-DAT2.0\r\n" + bytes(64))
    with pytest.raises(InvalidInput, match="older AEDAT"):
        detect_kind(old)
    unknown = tmp_path / "x.weird"
    unknown.write_bytes(b"\x00\x01\x02")
    with pytest.raises(InvalidInput, match="cannot tell the format"):
        open_source(str(unknown))
    with pytest.raises(NotFound):
        open_source(str(tmp_path / "missing.raw"))
    with pytest.raises(InvalidInput, match="unknown event source"):
        open_source("webcam:0")


def test_aedat4_errors(tmp_path: Path) -> None:
    pytest.importorskip("dv_processing")
    wrong = tmp_path / "a.aedat4"
    wrong.write_bytes(b"% evt 2.0\n")
    with pytest.raises(InvalidInput, match=r"does not look like aedat4 \(it looks like evt2"):
        open_source(f"aedat4:{wrong}")
    with pytest.raises(InvalidInput, match=r"byte offset 0: expected the AEDAT4 magic"):
        Aedat4Source(wrong)
    cut = tmp_path / "cut.aedat4"
    cut.write_bytes(b"#!AER-DAT4.0\r\n" + bytes(10))
    with pytest.raises(InvalidInput, match=r"cut\.aedat4"):
        open_source(str(cut))


def test_parse_sensor_size() -> None:
    assert parse_sensor_size("640x480") == (640, 480)
    for bad in ("640", "0x10", "axb", "640x"):
        with pytest.raises(InvalidInput):
            parse_sensor_size(bad)
