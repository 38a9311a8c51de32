"""Event sources from files, plus ``open_source`` which turns a CLI spec into one.

Specs: ``synthetic``, ``synthetic:SEED``, ``toy`` (the toy world's demo scene),
``toy:SEED``, ``toy:A-B`` (toy scenes A..B-1 back to back, one per second); files as
``KIND:PATH`` with KIND one of ``aedat4``, ``raw`` (EVT 2.0/3.0 from the header),
``evt2``, ``evt3``, ``dat``, ``bin`` (N-MNIST/N-Caltech101), ``txt`` (ECD events.txt or
a .zip of it), ``dsec`` (DIR or events.h5), ``npy``, ``npz``, or a bare ``PATH`` whose
format is detected (``eventspec.edge.events.detect``); live: ``dv-net:HOST:PORT``,
``dv-camera[:SERIAL]``, ``prophesee-camera[:SERIAL]`` (``eventspec.edge.events.live_sources``).

EventGPT ships its samples as ``.npy`` files holding a *pickled* dict {x, y, t, p}.
Unpickling runs code from the file, so those are only read behind an explicit
``allow_pickle=True``; structured (non-pickled) ``.npy``/``.npz`` files never need it.
"""

from __future__ import annotations

import logging
import threading
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from eventspec.edge.events.aedat4 import Aedat4Source
from eventspec.edge.events.base import (
    ArraySource,
    EventSource,
    RgbIndex,
    SourceMeta,
    check_range,
    existing_file,
    reading,
)
from eventspec.edge.events.detect import check_forced_kind, detect_kind
from eventspec.edge.events.dsec import DsecSource
from eventspec.edge.events.ecd_txt import EcdTextSource, check_text_size
from eventspec.edge.events.limits import (
    SourceLimits,
    check_npy_file,
    check_npz,
    read_npy_header,
)
from eventspec.edge.events.nmnist_bin import NmnistBinSource, check_bin_size
from eventspec.edge.events.prophesee_dat import PropheseeDatSource
from eventspec.edge.events.prophesee_raw import PropheseeRawSource
from eventspec.edge.events.synthetic import SceneSpec, ShapeSpec, SyntheticSource
from eventspec.edge.events.toy import ToySource, parse_toy_spec
from eventspec.edge.events.types import coerce_events
from eventspec.shared.contract.errors import EventSpecError, InvalidInput

log = logging.getLogger(__name__)

__all__ = [
    "Aedat4Source",
    "ArraySource",
    "DsecSource",
    "EcdTextSource",
    "EventGptNpySource",
    "EventSource",
    "NmnistBinSource",
    "NpzSource",
    "PropheseeDatSource",
    "PropheseeRawSource",
    "RgbIndex",
    "SceneSpec",
    "ShapeSpec",
    "SourceLimits",
    "SourceMeta",
    "SyntheticSource",
    "ToySource",
    "check_declared_sizes",
    "check_range",
    "npy_needs_pickle",
    "open_source",
    "parse_sensor_size",
]

SPEC_HELP = (
    "expected synthetic[:SEED], toy[:SEED|:A-B], KIND:PATH with KIND one of aedat4, raw, "
    "evt2, evt3, dat, bin, txt, dsec, npy, npz, a bare PATH (format detected), "
    "dv-net:HOST:PORT, dv-camera[:SERIAL] or prophesee-camera[:SERIAL]"
)


class NpzSource(ArraySource):
    """Events from a ``.npz`` (arrays x, y, t, p, or one structured array) or a
    structured ``.npy`` (fields x, y, t, p of any integer dtypes).

    The sensor size is max coordinate + 1 unless given. Never unpickles. ``limits`` caps
    the events and bytes its headers declare, checked before any array is read.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        sensor_size: tuple[int, int] | None = None,
        limits: SourceLimits | None = None,
    ) -> None:
        path = existing_file(path)
        with reading(path, "npz/npy"):
            events = _npz_events(path, limits or SourceLimits())
            _require_time_order(events, path)
        super().__init__(
            events, sensor_size, name=f"{path.suffix.lstrip('.')}:{path}",
            meta=SourceMeta(
                path.suffix.lstrip(".") or "npz",
                "flag" if sensor_size else "inferred from events", "µs as stored in the file",
            ),
        )


def _npz_events(path: Path, limits: SourceLimits) -> np.ndarray:
    """The events of an ``.npz`` or structured ``.npy``, its declared sizes checked first."""
    _check_declared(path, limits)
    loaded = _np_load(path)
    if isinstance(loaded, np.lib.npyio.NpzFile):
        with loaded:
            data: np.ndarray | dict[str, np.ndarray] = _columns_from_npz(loaded, path)
    else:
        data = loaded
    return _named(path, coerce_events, data)


def check_declared_sizes(kind: str, path: Path, limits: SourceLimits) -> None:
    """The caps against what a file of a whole-file ``kind`` (npz, npy, txt, bin)
    declares, read from its headers, zip directory or size alone; other kinds pass.
    For the start-up check, which refuses before anything loads."""
    if kind in ("npz", "npy"):
        if kind == "npy" and npy_needs_pickle(path):
            limits.check_bytes(path, path.stat().st_size)
        else:
            _check_declared(path, limits)
    elif kind == "txt":
        check_text_size(path, limits)
    elif kind == "bin":
        check_bin_size(path, limits)


def _check_declared(path: Path, limits: SourceLimits) -> None:
    """The caps against what an ``.npz``'s directory and headers or an ``.npy``'s header
    declare; anything else is left to ``_np_load``'s refusal."""
    with path.open("rb") as fh:
        magic = fh.read(6)
    if magic.startswith(b"PK\x03\x04"):
        with zipfile.ZipFile(path) as zf:
            check_npz(path, zf, limits)
    elif magic == b"\x93NUMPY":
        check_npy_file(path, limits)


def _named(path: Path, convert: Callable[[Any], np.ndarray], data: Any) -> np.ndarray:
    """``convert(data)``, its InvalidInput prefixed with the file (the conversion sees
    only arrays, so its messages cannot name it)."""
    try:
        return convert(data)
    except InvalidInput as exc:
        raise InvalidInput(f"{path}: {exc}") from exc


def _require_time_order(events: np.ndarray, path: Path) -> None:
    """Refuse a file whose timestamps go backwards (the README promises it).

    Sorting silently would hide a broken export (shuffled rows, concatenated
    recordings, a wrapped clock) behind plausible-looking answers.
    """
    t = events["t"]
    back = np.flatnonzero(t[1:] < t[:-1]) if t.size > 1 else np.empty(0, np.intp)
    if back.size:
        i = int(back[0]) + 1
        raise InvalidInput(
            f"{path}: timestamps are not in time order ({back.size} steps back; the first "
            f"at event {i}: t={int(t[i])} µs after t={int(t[i - 1])} µs); sort the file "
            "by t"
        )


class EventGptNpySource(ArraySource):
    """EventGPT's sample format: a ``.npy`` holding a pickled dict {x, y, t, p}.

    Refused unless ``allow_pickle`` is True, because loading a pickle executes code
    chosen by whoever wrote the file. A pickle declares no sizes: ``limits`` caps the
    file's size before unpickling and the events after (what the code in a trusted
    pickle allocates meanwhile is the trust ``allow_pickle`` gives).
    """

    def __init__(
        self,
        path: str | Path,
        allow_pickle: bool = False,
        *,
        sensor_size: tuple[int, int] | None = None,
        limits: SourceLimits | None = None,
    ) -> None:
        path = existing_file(path)
        if not allow_pickle:
            raise InvalidInput(
                f"{path} is an EventGPT .npy holding a pickled object; loading it runs code "
                "from the file. Enable allow_pickle (--allow-pickle) only for files you trust."
            )
        with reading(path, "a pickled .npy"):
            events = _pickled_events(path, limits or SourceLimits())
        super().__init__(
            events, sensor_size, name=f"npy:{path}",
            meta=SourceMeta(
                "EventGPT npy", "flag" if sensor_size else "inferred from events",
                "µs as stored (relative in EventGPT samples, absolute in DSEC-derived ones)",
            ),
        )


def _pickled_events(path: Path, limits: SourceLimits) -> np.ndarray:
    """The events of EventGPT's pickled dict, the file's size and the count capped."""
    limits.check_bytes(path, path.stat().st_size)
    try:
        loaded = np.load(path, allow_pickle=True)
    except Exception as exc:
        # Unpickling damaged bytes can raise any exception type (UnpicklingError,
        # AttributeError for a bit-flipped global name, OverflowError for a length,
        # even tokenize's TokenError); each is the file's fault, so each is named.
        raise InvalidInput(
            f"could not read {path} as a pickled .npy: {type(exc).__name__}: {exc}"
        ) from exc
    if isinstance(loaded, np.ndarray) and loaded.dtype == object and loaded.ndim == 0:
        loaded = loaded.item()
    if not isinstance(loaded, Mapping | np.ndarray):
        raise InvalidInput(
            f"{path} holds a {type(loaded).__name__}, expected a dict with x, y, t, p"
        )
    events = _named(path, coerce_events, loaded)
    limits.check_events(path, events.size, "holds")
    return events


def npy_needs_pickle(path: str | Path) -> bool:
    """Whether a ``.npy`` holds Python objects, read from its header alone (no unpickling)."""
    path = existing_file(path)
    with path.open("rb") as fh:
        return read_npy_header(fh, path).hasobject


#: Kinds that name a file or directory, and the live kinds.
FILE_KINDS = ("aedat4", "raw", "evt2", "evt3", "dat", "bin", "txt", "dsec", "npy", "npz")
LIVE_KINDS = ("dv-net", "dv-camera", "prophesee-camera")


def file_spec(spec: str, scheme: str, arg: str) -> tuple[str, str]:
    """(forced kind or "", path) of a file spec: ``KIND:PATH``, or a bare path (which may
    hold a colon); InvalidInput for an unknown kind or no path. Shared with the start-up
    check (``eventspec.edge.events.source_check``), so both read a spec alike."""
    if scheme not in FILE_KINDS:
        if ":" in spec and not Path(spec).exists():
            raise InvalidInput(f"unknown event source {spec!r}: {SPEC_HELP}")
        scheme, arg = "", spec
    if not arg:
        raise InvalidInput(f"event source {spec!r} needs a path: {SPEC_HELP}")
    return scheme, arg


def open_source(
    spec: str,
    *,
    allow_pickle: bool = False,
    sensor_size: tuple[int, int] | None = None,
    cancel: threading.Event | None = None,
    limits: SourceLimits | None = None,
) -> EventSource:
    """Build the EventSource named by a CLI spec (see the module docstring).

    ``cancel``, once set, ends an opening that runs in a decoder process (AEDAT4), so a
    node stopping during start-up does not wait for a damaged file's deadline.
    ``limits`` (``--max-source-events`` / ``--max-source-bytes``) caps what the readers
    that hold a whole file (npz, npy, txt, bin) decode; None: the defaults.

    ``KIND:PATH`` forces a reader; a bare ``PATH`` is detected from the file's first
    bytes, then its extension. ``sensor_size`` (the ``--sensor-size`` flag) is used by
    formats whose files may not state it (RAW without geometry, DAT, bin, txt, npz).
    ``npy:`` picks the structured reader or, for a pickled file, the EventGPT reader,
    which refuses unless ``allow_pickle``.
    """
    spec = spec.strip()
    scheme, _, arg = spec.partition(":")
    scheme = scheme.lower()
    if scheme == "synthetic":
        if not arg:
            return SyntheticSource()
        try:
            seed = int(arg)
        except ValueError:
            raise InvalidInput(f"synthetic seed must be an integer, got {arg!r}") from None
        return SyntheticSource(seed)
    if scheme == "toy":
        return parse_toy_spec(arg)
    if scheme in LIVE_KINDS:
        from eventspec.edge.events.live_sources import open_live_source

        return open_live_source(scheme, arg, sensor_size=sensor_size)
    scheme, arg = file_spec(spec, scheme, arg)
    try:
        if not scheme:
            scheme = detect_kind(arg)
            log.info("%s: detected format %s", arg, scheme)
        else:
            check_forced_kind(arg, scheme)
        return _open_file(scheme, arg, allow_pickle=allow_pickle, sensor_size=sensor_size,
                          cancel=cancel, limits=limits or SourceLimits())
    except EventSpecError:
        raise
    except Exception as exc:
        # The last net under every reader: a damaged file reaches zipfile, zlib, numpy's
        # header parser or a pickle in ways no reader lists (BadZipFile, zlib.error,
        # TokenError, NotImplementedError for a flipped compression id, ...). Each is the
        # file's fault: INVALID_ARGUMENT naming the file, never an INTERNAL without it.
        raise InvalidInput(
            f"{arg}: could not read it as {scheme or 'an event file'}: "
            f"{type(exc).__name__}: {str(exc)[:300]}"
        ) from exc


def _open_file(
    kind: str, arg: str, *, allow_pickle: bool, sensor_size: tuple[int, int] | None,
    cancel: threading.Event | None = None, limits: SourceLimits,
) -> EventSource:
    if kind == "dsec":
        return DsecSource(arg)
    if kind == "aedat4":
        return Aedat4Source(arg, cancel=cancel)
    if kind in ("raw", "evt2", "evt3"):
        return PropheseeRawSource(
            arg, encoding=None if kind == "raw" else kind, sensor_size=sensor_size
        )
    if kind == "dat":
        return PropheseeDatSource(arg, sensor_size=sensor_size)
    if kind == "bin":
        return NmnistBinSource(arg, sensor_size=sensor_size, limits=limits)
    if kind == "txt":
        return EcdTextSource(arg, sensor_size=sensor_size, limits=limits)
    if kind == "npz":
        return NpzSource(arg, sensor_size=sensor_size, limits=limits)
    if npy_needs_pickle(arg):
        return EventGptNpySource(arg, allow_pickle, sensor_size=sensor_size, limits=limits)
    return NpzSource(arg, sensor_size=sensor_size, limits=limits)


def parse_sensor_size(text: str) -> tuple[int, int]:
    """``WxH`` (e.g. ``640x480``) -> (width, height)."""
    w, sep, h = text.lower().partition("x")
    if not sep or not w.strip().isdigit() or not h.strip().isdigit() or not int(w) or not int(h):
        raise InvalidInput(f"sensor size must be WIDTHxHEIGHT, e.g. 640x480; got {text!r}")
    return int(w), int(h)


def _np_load(path: Path) -> np.ndarray | np.lib.npyio.NpzFile:
    """np.load without pickle, mapping every failure onto a clear InvalidInput."""
    with path.open("rb") as fh:
        magic = fh.read(6)
    # np.load treats anything that is neither npy nor zip as a raw pickle; check first
    # so garbage is reported as garbage, not as "pickled data".
    if not (magic.startswith(b"PK\x03\x04") or magic == b"\x93NUMPY"):
        raise InvalidInput(f"could not read {path}: not a .npy or .npz file")
    try:
        loaded = np.load(path, allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc):
            raise InvalidInput(
                f"{path} holds pickled Python objects (EventGPT format?); open it as "
                "npy:FILE with allow_pickle enabled, and only if you trust the file"
            ) from exc
        raise InvalidInput(f"could not read {path} as .npy/.npz: {exc}") from exc
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise InvalidInput(f"could not read {path} as .npy/.npz: {exc}") from exc
    if not isinstance(loaded, np.ndarray | np.lib.npyio.NpzFile):
        raise InvalidInput(f"{path} is not a .npy array or .npz archive")
    return loaded


def _columns_from_npz(loaded: np.lib.npyio.NpzFile, path: Path) -> dict[str, np.ndarray]:
    """Read x/y/t/p arrays (or the fields of a single structured array) from an .npz."""
    keys = list(loaded.files)
    try:
        if len(keys) == 1:
            arr = loaded[keys[0]]
            if arr.dtype.names is not None:
                return {name: arr[name] for name in arr.dtype.names}
        return {k: loaded[k] for k in keys}
    except ValueError as exc:
        if "pickle" in str(exc):
            raise InvalidInput(
                f"{path} holds pickled arrays, which are never loaded from .npz"
            ) from exc
        raise InvalidInput(f"could not read {path}: {exc}") from exc
    except (OSError, zipfile.BadZipFile) as exc:
        raise InvalidInput(f"could not read {path}: {exc}") from exc
