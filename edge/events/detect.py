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


#: The names used in "it looks like ..." for each content kind.
_LOOKS = {
    "aedat4": "aedat4 (AEDAT 4.0)", "aedat-old": "an older AEDAT version",
    "npy": "npy (a NumPy .npy array)", "dsec": "dsec (HDF5)", "npz": "npz (a zip of arrays)",
    "zip-txt": "txt (a zip holding events.txt)", "raw": "raw (Prophesee RAW)",
    "evt2": "evt2 (Prophesee RAW, EVT 2.0)", "evt3": "evt3 (Prophesee RAW, EVT 3.0)",
    "dat": "dat (Prophesee DAT)", "txt": "txt (text)",
}
#: Forced kind -> the content kinds it reads. ``None``: a file with no signature, which
#: only the formats without one (headerless EVT, DAT, N-MNIST records, text) can be.
_READS: dict[str, frozenset[str | None]] = {
    "aedat4": frozenset({"aedat4"}),
    "raw": frozenset({"raw", "evt2", "evt3"}),
    "evt2": frozenset({"raw", "evt2", None}),
    "evt3": frozenset({"raw", "evt3", None}),
    "dat": frozenset({"dat", None}),
    "bin": frozenset({None}),
    "txt": frozenset({"txt", "zip-txt", None}),
    "npy": frozenset({"npy"}),
    "npz": frozenset({"npz", "npy"}),
    "dsec": frozenset({"dsec"}),
}
_TEXT = frozenset(b"0123456789.-+eE \t\r\n#,")


def content_kind(path: Path) -> str | None:
    """What ``path``'s first bytes say it is (a key of ``_LOOKS``), or None when they
    carry no signature. Reads the head only (a zip's directory for zips)."""
    with path.open("rb") as fh:
        head = fh.read(4096)
    if head.startswith(AEDAT4_MAGIC):
        return "aedat4"
    if head.startswith(b"#!AER-DAT"):
        return "aedat-old"
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if head.startswith(_HDF5_MAGIC):
        return "dsec"
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()
        except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError) as exc:
            raise InvalidInput(f"{path}: starts like a zip file but is not one: {exc}") from exc
        return "zip-txt" if any(Path(n).name == "events.txt" for n in names) else "npz"
    if head.startswith(b"%"):
        header = read_raw_header(path)
        if header.encoding:
            return header.encoding
        if "version" in header.fields or "data" in header.fields or path.suffix.lower() == ".dat":
            return "dat"
        return "raw"
    if head and b"\0" not in head and sum(b in _TEXT for b in head) >= 0.95 * len(head):
        return "txt"
    return None


def check_forced_kind(path: str | Path, kind: str) -> None:
    """Refuse ``KIND:PATH`` when the file's content says it is another format, before a
    reader decodes garbage from it (``bin:`` on a DAT file served 3,232 made-up events).

    InvalidInput: "FILE does not look like KIND (it looks like OTHER)". A directory is
    left to the readers (only ``dsec`` takes one); so is a missing file (NotFound there).
    """
    p = Path(path)
    if kind not in _READS or not p.is_file():
        return
    found = content_kind(p)
    if found in _READS[kind]:
        return
    looks = _LOOKS[found] if found is not None else "a file with no format signature"
    raise InvalidInput(f"{p} does not look like {kind} (it looks like {looks})")


def detect_kind(path: str | Path) -> str:
    """The source kind (``aedat4``, ``raw``, ``dat``, ``bin``, ``txt``, ``npy``, ``npz``,
    ``dsec``) of ``path``; a directory is a DSEC sequence."""
    p = Path(path)
    if not p.exists():
        raise NotFound(f"event file {p} does not exist")
    if p.is_dir():
        return "dsec"
    found = content_kind(p)
    if found == "aedat-old":
        with p.open("rb") as fh:
            head = fh.read(12)
        raise InvalidInput(
            f"{p}: byte offset 0: {head!r} is an older AEDAT version; only AEDAT 4.0 "
            "is read (convert with DV)"
        )
    if found in ("evt2", "evt3"):
        return "raw"
    if found == "zip-txt":
        return "txt"
    if found is not None:
        return found
    kind = _BY_EXTENSION.get(p.suffix.lower())
    if kind is None:
        with p.open("rb") as fh:
            head = fh.read(8)
        raise InvalidInput(
            f"{p}: cannot tell the format from its first bytes {head!r} or its extension;"
            " name it as KIND:PATH (aedat4, raw, evt2, evt3, dat, bin, txt, npy, npz, dsec)"
        )
    if kind == "raw":
        raise InvalidInput(
            f"{p}: byte offset 0: a .raw file must start with a '%' header; expected "
            "'% evt 2.0' or '% evt 3.0' (force evt2:PATH or evt3:PATH for a headerless stream)"
        )
    return kind
