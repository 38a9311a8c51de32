"""Which reader a file needs, from its first bytes and then its extension.

``--source PATH`` (no kind) lands here. Content wins over the name, because files get
renamed: an AEDAT4 called ``.bin`` must not be read as 5-byte N-MNIST records (tonic's
generic AEDAT parser, reading AEDAT4 as fixed 8-byte records, turns the DVXplorer
sample's 111,954 events into 118,651 without an error).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from eventspec.edge.events.aedat4 import AEDAT4_MAGIC
from eventspec.edge.events.prophesee_raw import read_raw_header
from eventspec.shared.contract.errors import InvalidInput, NotFound

_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_BY_EXTENSION = {
    ".aedat4": "aedat4",
    ".raw": "raw",
    ".dat": "dat",
    ".bin": "bin",
    ".txt": "txt",
    ".npy": "npy",
    ".npz": "npz",
    ".h5": "dsec",
    ".hdf5": "dsec",
}


def detect_kind(path: str | Path) -> str:
    """The source kind (``aedat4``, ``raw``, ``dat``, ``bin``, ``txt``, ``npy``, ``npz``,
    ``dsec``) of ``path``; a directory is a DSEC sequence."""
    p = Path(path)
    if not p.exists():
        raise NotFound(f"event file {p} does not exist")
    if p.is_dir():
        return "dsec"
    with p.open("rb") as fh:
        head = fh.read(16)
    if head.startswith(AEDAT4_MAGIC):
        return "aedat4"
    if head.startswith(b"#!AER-DAT"):
        raise InvalidInput(
            f"{p}: byte offset 0: {head[:12]!r} is an older AEDAT version; only AEDAT 4.0 "
            "is read (convert with DV)"
        )
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if head.startswith(_HDF5_MAGIC):
        return "dsec"
    if head.startswith(b"PK\x03\x04"):
        with zipfile.ZipFile(p) as zf:
            names = zf.namelist()
        return "txt" if any(Path(n).name == "events.txt" for n in names) else "npz"
    if head.startswith(b"%"):
        header = read_raw_header(p)
        if header.encoding:
            return "raw"
        if "version" in header.fields or "data" in header.fields or p.suffix.lower() == ".dat":
            return "dat"
        return "raw"
    kind = _BY_EXTENSION.get(p.suffix.lower())
    if kind is None:
        raise InvalidInput(
            f"{p}: cannot tell the format from its first bytes {head[:8]!r} or its extension;"
            " name it as KIND:PATH (aedat4, raw, evt2, evt3, dat, bin, txt, npy, npz, dsec)"
        )
    if kind == "raw":
        raise InvalidInput(
            f"{p}: byte offset 0: a .raw file must start with a '%' header; expected "
            "'% evt 2.0' or '% evt 3.0' (force evt2:PATH or evt3:PATH for a headerless stream)"
        )
    return kind
