"""Check a ``--source`` spec the way ``open_source`` would refuse it, without opening it.

Why apart from opening: the edge opens its source during warm-up, after importing
torch and binding its port, 5 to 14 s after the command was typed; a misspelt path or
kind then came back as a late "failed" and exit 1. This check reads at most a file's
first bytes (a zip's directory, a ``.npy`` header), so ``eventspec-edge serve`` can
refuse in a fraction of a second with exit 2, before any model or network work. That
includes a file over ``--max-source-events`` / ``--max-source-bytes`` by what it
declares (headers, a zip's directory, its size). What only decoding can find (a damaged
packet, events out of order, text past the event cap) is still the reader's.
"""

from __future__ import annotations

import pickletools
from pathlib import Path

from eventspec.edge.events.base import existing_file, reading
from eventspec.edge.events.detect import check_forced_kind, detect_kind
from eventspec.edge.events.limits import SourceLimits, read_npy_header
from eventspec.edge.events.sources import (
    LIVE_KINDS,
    check_declared_sizes,
    file_spec,
    npy_needs_pickle,
)
from eventspec.edge.events.toy import toy_seeds
from eventspec.shared.contract.errors import InvalidInput, NotFound


def check_source_spec(spec: str, *, allow_pickle: bool,
                      limits: SourceLimits | None = None) -> None:
    """InvalidInput/NotFound for a spec ``open_source`` is bound to refuse: an unknown
    kind, a malformed seed or address, a missing file, a file whose content contradicts
    its forced kind or whose format cannot be told, a pickled ``.npy`` without
    ``allow_pickle``, a file that declares more than ``limits`` (None: the defaults).
    Returns None when the spec may open."""
    spec = spec.strip()
    scheme, _, arg = spec.partition(":")
    scheme = scheme.lower()
    if scheme == "synthetic":
        if arg and not arg.strip().lstrip("-").isdigit():
            raise InvalidInput(f"synthetic seed must be an integer, got {arg!r}")
        return
    if scheme == "toy":
        toy_seeds(arg)
        return
    if scheme in LIVE_KINDS:
        if scheme == "dv-net":
            host, sep, port = arg.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise InvalidInput(f"dv-net needs HOST:PORT, got {arg!r}")
        return
    scheme, arg = file_spec(spec, scheme, arg)
    path = Path(arg)
    if not path.exists():
        raise NotFound(f"event file {path} does not exist")
    kind = scheme or detect_kind(path)
    check_forced_kind(path, kind)
    if kind == "npy" and path.is_file() and npy_needs_pickle(path):
        if not allow_pickle:
            raise InvalidInput(
                f"{path} is an EventGPT .npy holding a pickled object; loading it runs code "
                "from the file. Pass --allow-pickle only for files you trust."
            )
        check_pickle_complete(path)
    if path.is_file():
        with reading(path, kind):
            check_declared_sizes(kind, path, limits or SourceLimits())


def check_pickle_complete(path: str | Path) -> None:
    """InvalidInput naming ``path`` when its pickled object is cut short or garbled, found
    by walking the pickle's opcodes (``pickletools.genops``: nothing is executed or
    built), so a truncated EventGPT ``.npy`` is refused at start-up, not in warm-up."""
    path = existing_file(path)
    with path.open("rb") as fh:
        read_npy_header(fh, path)  # past the header, to the pickle
        try:
            for _ in pickletools.genops(fh):
                pass
        except ValueError as exc:
            raise InvalidInput(f"could not read {path} as a pickled .npy: the pickle is "
                               f"truncated or damaged ({exc})") from exc
