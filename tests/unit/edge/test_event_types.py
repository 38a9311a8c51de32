"""The internal event dtype: coercion from other layouts and validation errors."""

from __future__ import annotations

import numpy as np
import pytest

from eventspec.edge.events.types import EVENT_DTYPE, coerce_events, make_events, validate_events
from eventspec.shared.contract.errors import InvalidInput


def _events(xs: list[int], ys: list[int], ts: list[int], ps: list[int]) -> np.ndarray:
    return make_events(np.array(xs), np.array(ys), np.array(ts), np.array(ps))


def test_valid_events_pass_unchanged() -> None:
    ev = _events([0, 3], [1, 2], [10, 10], [0, 1])
    assert validate_events(ev, (4, 3)) is ev
    assert ev.dtype == EVENT_DTYPE
    assert validate_events(np.zeros(0, EVENT_DTYPE), (4, 3)).size == 0


@pytest.mark.parametrize(
    ("ev", "size", "match"),
    [
        (np.zeros(3, dtype=[("x", "i4"), ("y", "i4"), ("t", "i8"), ("p", "i1")]), (4, 4), "dtype"),
        (np.zeros((2, 2), dtype=EVENT_DTYPE), (4, 4), "1-D"),
        (_events([4], [0], [0], [0]), (4, 4), "outside"),
        (_events([0], [4], [0], [0]), (4, 4), "outside"),
        (_events([0, 0], [0, 0], [5, 4], [0, 0]), (4, 4), "non-decreasing"),
        (_events([0], [0], [0], [0]), (0, 4), "positive"),
    ],
)
def test_validate_rejects(ev: np.ndarray, size: tuple[int, int], match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        validate_events(ev, size)


def test_validate_rejects_bad_polarity() -> None:
    ev = _events([0], [0], [0], [1])
    ev["p"][0] = 2
    with pytest.raises(InvalidInput, match="polarity"):
        validate_events(ev, (4, 4))


def test_coerce_maps_aliases_int_widths_and_signed_polarity() -> None:
    src = np.zeros(3, dtype=[("timestamp", "<u4"), ("x", "<i4"), ("y", "<i2"), ("polarity", "i1")])
    src["timestamp"] = [1, 2, 3]
    src["x"] = [5, 6, 7]
    src["y"] = [1, 1, 2]
    src["polarity"] = [-1, 1, -1]
    ev = coerce_events(src)
    assert ev.dtype == EVENT_DTYPE
    assert ev["t"].tolist() == [1, 2, 3]
    assert ev["x"].tolist() == [5, 6, 7]
    assert ev["p"].tolist() == [0, 1, 0]


@pytest.mark.parametrize(
    ("cols", "match"),
    [
        ({"x": [0], "y": [0], "t": [0]}, "lack field 'p'"),
        ({"x": [-1], "y": [0], "t": [0], "p": [0]}, "0..65535"),
        ({"x": [0], "y": [0], "t": [0.5], "p": [0]}, "integral"),
        ({"x": [0], "y": [0], "t": [0], "p": [3]}, "polarity"),
        ({"x": [0, 1], "y": [0], "t": [0], "p": [0]}, "equally long"),
    ],
)
def test_coerce_rejects(cols: dict[str, list[float]], match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        coerce_events({k: np.asarray(v) for k, v in cols.items()})


def test_coerce_refuses_plain_2d_arrays() -> None:
    with pytest.raises(InvalidInput, match="column order"):
        coerce_events(np.zeros((4, 4), dtype=np.int64))
