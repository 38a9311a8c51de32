"""The one internal event dtype, and validation/coercion onto it.

Event libraries disagree on field names and integer widths (tonic: x,y,t,p; DSEC:
u16/u8/u32 relative µs; dv-processing: timestamp,x,y,polarity). Everything inside the
edge uses :data:`EVENT_DTYPE`, so windows, rendering and sources need one code path,
and each input format only needs a thin adapter onto it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from eventspec.shared.contract.errors import InvalidInput

#: x, y in pixels; t in absolute microseconds (int64, so DSEC's t + t_offset fits);
#: p is 0 (OFF, darker) or 1 (ON, brighter).
EVENT_DTYPE = np.dtype([("x", "<u2"), ("y", "<u2"), ("t", "<i8"), ("p", "u1")])

_FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "x": ("x",),
    "y": ("y",),
    "t": ("t", "timestamp", "ts"),
    "p": ("p", "polarity", "pol"),
}


def empty_events() -> np.ndarray:
    """A zero-length event array, for sources with nothing in a window."""
    return np.zeros(0, dtype=EVENT_DTYPE)


def make_events(x: np.ndarray, y: np.ndarray, t: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Pack four equally long 1-D columns into an :data:`EVENT_DTYPE` array.

    Raises InvalidInput for ragged columns, negative or too large coordinates,
    non-integral timestamps, or polarity other than {0,1} / {-1,1} / bool.
    """
    cols = {name: np.asarray(col) for name, col in (("x", x), ("y", y), ("t", t), ("p", p))}
    lengths = {name: col.shape for name, col in cols.items()}
    if any(col.ndim != 1 for col in cols.values()) or len({s[0] for s in lengths.values()}) != 1:
        raise InvalidInput(f"event columns must be 1-D and equally long, got shapes {lengths}")
    out = np.empty(len(cols["x"]), dtype=EVENT_DTYPE)
    for name in ("x", "y"):
        col = _integral(cols[name], name)
        if col.size and (col.min() < 0 or col.max() > np.iinfo(np.uint16).max):
            raise InvalidInput(
                f"event {name} coordinates must lie in 0..65535, got {col.min()}..{col.max()}"
            )
        out[name] = col
    out["t"] = _integral(cols["t"], "t")
    out["p"] = _polarity(cols["p"])
    return out


def coerce_events(data: np.ndarray | Mapping[str, np.ndarray]) -> np.ndarray:
    """Map a structured array or a dict of columns (any int dtypes) onto EVENT_DTYPE.

    Accepts the field aliases of the common libraries (``timestamp``, ``polarity``).
    An array that already has EVENT_DTYPE is returned as is (no copy).
    """
    if isinstance(data, np.ndarray) and data.dtype == EVENT_DTYPE:
        return data
    if isinstance(data, np.ndarray):
        if data.dtype.names is None:
            raise InvalidInput(
                f"expected a structured event array with fields x,y,t,p; got a plain "
                f"{data.dtype} array of shape {data.shape} (column order would be a guess)"
            )
        names: tuple[str, ...] = data.dtype.names
    else:
        names = tuple(data.keys())
    cols: dict[str, np.ndarray] = {}
    for field, aliases in _FIELD_ALIASES.items():
        found = next((a for a in aliases if a in names), None)
        if found is None:
            raise InvalidInput(f"events lack field {field!r} (have {sorted(names)})")
        cols[field] = np.asarray(data[found]).reshape(-1)
    return make_events(cols["x"], cols["y"], cols["t"], cols["p"])


def validate_events(ev: np.ndarray, sensor_size: tuple[int, int]) -> np.ndarray:
    """Check an event array against the internal contract and return it unchanged.

    ``sensor_size`` is (width, height). Raises InvalidInput for a wrong dtype or shape,
    coordinates outside the sensor, timestamps that go backwards, or polarity not 0/1.
    Every consumer (windows by binary search, rendering by fancy indexing) relies on
    these, so a source that breaks them must fail loudly here rather than mis-render.
    """
    if not isinstance(ev, np.ndarray) or ev.dtype != EVENT_DTYPE:
        got = ev.dtype if isinstance(ev, np.ndarray) else type(ev).__name__
        raise InvalidInput(f"events must have dtype {EVENT_DTYPE}, got {got}")
    if ev.ndim != 1:
        raise InvalidInput(f"events must be a 1-D array, got shape {ev.shape}")
    width, height = sensor_size
    if width <= 0 or height <= 0:
        raise InvalidInput(f"sensor size must be positive, got {width}x{height}")
    if ev.size == 0:
        return ev
    if int(ev["x"].max()) >= width or int(ev["y"].max()) >= height:
        raise InvalidInput(
            f"event coordinates up to ({int(ev['x'].max())}, {int(ev['y'].max())}) "
            f"lie outside the {width}x{height} sensor"
        )
    if ev.size > 1 and bool(np.any(np.diff(ev["t"]) < 0)):
        first = int(np.argmax(np.diff(ev["t"]) < 0))
        raise InvalidInput(
            f"event timestamps must be non-decreasing; t[{first}]={int(ev['t'][first])} > "
            f"t[{first + 1}]={int(ev['t'][first + 1])}"
        )
    if int(ev["p"].max()) > 1:
        raise InvalidInput(f"event polarity must be 0 or 1, got {int(ev['p'].max())}")
    return ev


def sort_by_time(ev: np.ndarray) -> np.ndarray:
    """Return ``ev`` ordered by t (stable, so simultaneous events keep their order)."""
    if ev.size > 1 and bool(np.any(np.diff(ev["t"]) < 0)):
        return ev[np.argsort(ev["t"], kind="stable")]
    return ev


def sensor_size_of(ev: np.ndarray) -> tuple[int, int]:
    """(width, height) spanned by the events: max coordinate + 1 (EventGPT's canvas rule)."""
    if ev.size == 0:
        raise InvalidInput("cannot infer a sensor size from zero events; pass it explicitly")
    return int(ev["x"].max()) + 1, int(ev["y"].max()) + 1


def _integral(col: np.ndarray, name: str) -> np.ndarray:
    if col.dtype.kind in "iu":
        return col.astype(np.int64, copy=False)
    if col.dtype.kind == "b":
        return col.astype(np.int64)
    if col.dtype.kind == "f":
        if col.size and not bool(np.all(np.isfinite(col))):
            raise InvalidInput(f"event {name} has NaN or infinite values")
        as_int = col.astype(np.int64)
        if bool(np.any(as_int != col)):
            raise InvalidInput(
                f"event {name} must be integral ({'µs' if name == 't' else 'pixels'}), "
                f"got fractional {col.dtype} values"
            )
        return as_int
    raise InvalidInput(f"event {name} must be an integer column, got {col.dtype}")


def _polarity(col: np.ndarray) -> np.ndarray:
    """Polarity as 0/1: accepts {0,1}, bool, and the {-1,+1} convention of some datasets."""
    p = _integral(col, "p")
    if p.size == 0:
        return p.astype(np.uint8)
    lo, hi = int(p.min()), int(p.max())
    if lo >= 0 and hi <= 1:
        return p.astype(np.uint8)
    if lo >= -1 and hi <= 1 and not bool(np.any(p == 0)):
        return (p > 0).astype(np.uint8)
    raise InvalidInput(f"event polarity must be 0/1 (or -1/+1), got values in {lo}..{hi}")
