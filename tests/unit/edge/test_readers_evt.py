"""Prophesee EVT 2.0 / 3.0: encoder -> decoder round trips, block-wise decoding, time
wraps, header geometry precedence, and clear errors for corrupt or mislabelled files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.edge.events.evt2 import Evt2State, decode_evt2
from eventspec.edge.events.evt3 import TIME_HIGH, TIME_LOW, Evt3State, decode_evt3
from eventspec.edge.events.prophesee_raw import PropheseeRawSource, read_raw_header
from eventspec.edge.events.sources import open_source
from eventspec.edge.events.types import EVENT_DTYPE
from eventspec.shared.contract.errors import InvalidInput
from tests.support.evt_encode import encode_evt2, encode_evt3


@st.composite
def event_streams(draw: st.DrawFn, first_below: int = 1 << 24) -> np.ndarray:
    """Time-sorted events on a 1280x720 sensor, with runs that EVT3 vectorises.

    The first time lies below one TIME_HIGH period (a stream's time is only known
    modulo it until it wraps) and gaps are short of half a period, so several wraps
    happen and each is seen.
    """
    n = draw(st.integers(1, 300))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    gaps = rng.integers(0, 1 << 20, n)
    gaps[0] = 0
    t = rng.integers(0, first_below) + np.cumsum(gaps)
    if draw(st.booleans()):  # bursts at one timestamp along a row, as sensors produce
        t = np.repeat(t[: max(1, n // 6)], 6)[:n]
    ev = np.zeros(t.size, dtype=EVENT_DTYPE)
    ev["t"] = t
    ev["x"] = rng.integers(0, 1280, t.size)
    ev["y"] = rng.integers(0, 720, t.size)
    ev["p"] = rng.integers(0, 2, t.size)
    if draw(st.booleans()):
        ev["y"] = 17  # one row: consecutive x's form vectors
        ev["x"] = np.sort(ev["x"]) % 1280
        ev = ev[np.lexsort((ev["x"], ev["t"]))]
    return ev


def _split(words: np.ndarray, cuts: list[int]) -> list[np.ndarray]:
    points = sorted({c % (words.size + 1) for c in cuts})
    return np.split(words, points)


@settings(max_examples=80, deadline=None)
@given(ev=event_streams(), cuts=st.lists(st.integers(0, 10_000), max_size=5),
       vectorise=st.booleans())
def test_evt3_round_trip_in_any_blocks(ev: np.ndarray, cuts: list[int], vectorise: bool) -> None:
    words = encode_evt3(ev, vectorise=vectorise)
    out, state = [], Evt3State()
    for block in _split(words, cuts):
        got, state = decode_evt3(block, state)
        out.append(got)
    assert np.array_equal(np.concatenate(out), ev)


@settings(max_examples=80, deadline=None)
@given(ev=event_streams(first_below=1 << 34), cuts=st.lists(st.integers(0, 10_000), max_size=5))
def test_evt2_round_trip_in_any_blocks(ev: np.ndarray, cuts: list[int]) -> None:
    words = encode_evt2(ev)
    out, state = [], Evt2State()
    for block in _split(words, cuts):
        got, state = decode_evt2(block, state)
        out.append(got)
    assert np.array_equal(np.concatenate(out), ev)


def test_evt3_vectors_expand_from_base_x() -> None:
    words = np.array([
        (TIME_HIGH << 12) | 5, (TIME_LOW << 12) | 7, (0x0 << 12) | 9,  # t = 5*4096+7, y = 9
        (0x3 << 12) | (1 << 11) | 100,  # VECT_BASE_X x=100, p=1
        (0x4 << 12) | 0b100000000101,  # VECT_12: x = 100, 102, 111; base -> 112
        (0x5 << 12) | 0b10000001,  # VECT_8: x = 112, 119
        (0x2 << 12) | 3,  # ADDR_X x=3, p=0
    ], dtype=np.uint16)
    ev, state = decode_evt3(words, Evt3State())
    assert ev["x"].tolist() == [100, 102, 111, 112, 119, 3]
    assert ev["p"].tolist() == [1, 1, 1, 1, 1, 0]
    assert set(ev["y"].tolist()) == {9} and set(ev["t"].tolist()) == {5 * 4096 + 7}
    assert state.base_x == 120


def test_evt3_time_low_decrease_is_not_a_wrap() -> None:
    """E1: a lower TIME_LOW under the same TIME_HIGH is a step back, not +4096 µs."""
    words = np.array([
        (TIME_HIGH << 12) | 0xB2D, (TIME_LOW << 12) | 0x32B, (0x2 << 12) | 1,
        (TIME_LOW << 12) | 0x320, (0x2 << 12) | 2,
    ], dtype=np.uint16)
    ev, _ = decode_evt3(words, Evt3State())
    assert ev["t"].tolist() == [0xB2D * 4096 + 0x32B, 0xB2D * 4096 + 0x320]


def test_evt3_time_high_wrap_counts_once() -> None:
    words = np.array([
        (TIME_HIGH << 12) | 0xFFF, (TIME_LOW << 12) | 0xFFF, (0x2 << 12) | 1,
        (TIME_HIGH << 12) | 0x000, (TIME_LOW << 12) | 0x001, (0x2 << 12) | 2,
    ], dtype=np.uint16)
    ev, state = decode_evt3(words, Evt3State())
    assert ev["t"].tolist() == [(1 << 24) - 1, (1 << 24) + 1]
    more, _ = decode_evt3(np.array([(TIME_HIGH << 12) | 1, (0x2 << 12) | 3], np.uint16), state)
    assert more["t"].tolist() == [(1 << 24) + 4096 + 1]


def test_events_before_the_first_time_high_are_dropped() -> None:
    ev, _ = decode_evt3(np.array([(0x2 << 12) | 1, (TIME_HIGH << 12) | 1, (0x2 << 12) | 2],
                                 np.uint16), Evt3State())
    assert ev["x"].tolist() == [2]
    ev2, _ = decode_evt2(np.array([(1 << 28) | 5, (0x8 << 28) | 3], np.uint32), Evt2State())
    assert ev2.size == 0


def _write_raw(path: Path, header: str, words: np.ndarray) -> Path:
    path.write_bytes(header.encode() + words.tobytes())
    return path


def _events(n: int = 5_000, span: int = 2_000_000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ev = np.zeros(n, dtype=EVENT_DTYPE)
    ev["t"] = np.sort(rng.integers(10, span, n))
    ev["x"], ev["y"] = rng.integers(0, 300, n), rng.integers(0, 200, n)
    ev["p"] = rng.integers(0, 2, n)
    return ev


@pytest.mark.parametrize(
    ("header", "size", "size_from"),
    [
        ("% geometry 320x240\n% plugin_name hal_plugin_gen41_evk3\n", (320, 240),
         "header geometry"),
        ("% format EVT3;height=260;width=346\n", (346, 260), "header format field"),
        ("% plugin_name hal_plugin_gen3_fx3\n", (640, 480), "header plugin field"),
        ("% plugin_name hal_plugin_imx636_evk4\n", (1280, 720), "header plugin field"),
        ("% integrator_name Prophesee\n", (300, 200), "flag"),
        ("", (None, None), "inferred from events"),
    ],
)
def test_sensor_size_precedence(tmp_path: Path, header: str, size: tuple[int, int],
                                size_from: str) -> None:
    ev = _events()
    flag = (300, 200) if size_from == "flag" else None
    path = _write_raw(tmp_path / "a.raw", "% evt 3.0\n" + header + "% end\n", encode_evt3(ev))
    src = PropheseeRawSource(path, sensor_size=flag)
    expected = size if size[0] else (int(ev["x"].max()) + 1, int(ev["y"].max()) + 1)
    assert src.sensor_size == expected and src.meta.size_from == size_from
    assert np.array_equal(src.events_between(*src.time_range_us()), ev)


def test_windows_seek_through_blocks(tmp_path: Path) -> None:
    ev = _events(20_000)
    path = _write_raw(tmp_path / "b.raw", "% evt 2.0\n", encode_evt2(ev))
    src = PropheseeRawSource(path, block_words=997)
    assert len(src._blocks) > 10
    for a, b in [(0, 50), (123_456, 345_678), (1_999_000, 3_000_000), (500_000, 500_000)]:
        ref = ev[(ev["t"] >= a) & (ev["t"] < b)]
        assert np.array_equal(src.events_between(a, b), ref)


def test_truncated_file_names_offset(tmp_path: Path) -> None:
    path = _write_raw(tmp_path / "t.raw", "% evt 2.0\n", encode_evt2(_events(100)))
    path.write_bytes(path.read_bytes() + b"\x01\x02")
    with pytest.raises(InvalidInput, match=r"t\.raw: byte offset \d+: truncated.*4-byte EVT2"):
        PropheseeRawSource(path)


def test_mislabelled_encoding_names_offset_and_word(tmp_path: Path) -> None:
    header = "% evt 3.0\n"
    words = encode_evt2(_events(100)).view(np.uint16)  # EVT 2.0 data behind an EVT 3.0 header
    path = _write_raw(tmp_path / "m.raw", header, words)
    with pytest.raises(InvalidInput, match=r"m\.raw: byte offset \d+: .*EVT 3\.0 does not"):
        PropheseeRawSource(path)


def test_forced_encoding_disagreeing_with_header(tmp_path: Path) -> None:
    path = _write_raw(tmp_path / "f.raw", "% evt 2.0\n", encode_evt2(_events(100)))
    with pytest.raises(InvalidInput, match=r"does not look like evt3 \(it looks like evt2"):
        open_source(f"evt3:{path}")
    with pytest.raises(InvalidInput, match="header says evt2"):
        PropheseeRawSource(path, encoding="evt3")


def test_headerless_stream_needs_a_forced_kind(tmp_path: Path) -> None:
    ev = _events(500)
    path = tmp_path / "bare.raw"
    path.write_bytes(encode_evt3(ev).tobytes())
    with pytest.raises(InvalidInput, match="must start with a '%' header"):
        open_source(str(path))
    src = open_source(f"evt3:{path}", sensor_size=(300, 200))
    assert np.array_equal(src.events_between(*src.time_range_us()), ev)


def test_header_parse(tmp_path: Path) -> None:
    path = _write_raw(tmp_path / "h.raw", "% date 2020\n% evt 3.0\n% serial_number 7\n% end\n",
                      np.zeros(0, np.uint16))
    header = read_raw_header(path)
    assert header.encoding == "evt3" and header.fields["serial_number"] == "7"
    assert header.data_offset == len(b"% date 2020\n% evt 3.0\n% serial_number 7\n% end\n")
    with pytest.raises(InvalidInput, match="holds no events"):
        PropheseeRawSource(path)
