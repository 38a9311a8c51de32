"""Every reader's failure names its file (issue 38, red-team finding 7: 14 of 203 damaged
files came back as numpy or zlib text alone: "Maximum allowed dimension exceeded",
"array is too big", "File is not a zip file", "Error -3 while decompressing data").

``open_source`` has a last net that names the file, so these call the readers
themselves, as tools and tests do, and as every window read after opening does: the
name must come from the reader's own door. The damaged files are made here, small.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from eventspec.edge.events.dsec import DsecSource
from eventspec.edge.events.ecd_txt import EcdTextSource
from eventspec.edge.events.prophesee_dat import PropheseeDatSource
from eventspec.edge.events.sources import NpzSource, open_source
from eventspec.shared.contract.errors import InvalidInput


def _flip(data: bytes, start: int, stop: int) -> bytes:
    out = bytearray(data)
    for i in range(start, stop):
        out[i] ^= 0x5A
    return bytes(out)


def _deflated(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _header(shape: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": "<i8", "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _columns(n: int = 5000) -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    return {"x.npy": _npy(rng.integers(0, 30, n)), "y.npy": _npy(rng.integers(0, 20, n)),
            "t.npy": _npy(np.arange(n) * 7), "p.npy": _npy(rng.integers(0, 2, n))}


def _text(n: int = 5000) -> bytes:
    return "".join(f"{i * 1e-5:.6f} {i % 30} {i % 20} {i % 2}\n" for i in range(n)).encode()


def _inflate_error_npz(path: Path) -> Path:
    data = _deflated(_columns())
    path.write_bytes(_flip(data, 200, 260))  # inside x.npy's deflate stream
    return path


def _inflate_error_zip(path: Path) -> Path:
    path.write_bytes(_flip(_deflated({"events.txt": _text()}), 100, 160))
    return path


def _bad_directory_zip(path: Path) -> Path:
    data = bytearray(_deflated({"events.txt": _text()}))
    central = data.rindex(b"PK\x01\x02")
    data[central:central + 4] = b"XXXX"
    path.write_bytes(bytes(data))
    return path


def _cut_npz(path: Path) -> Path:
    data = _deflated(_columns())
    path.write_bytes(data[: len(data) // 2])  # no end-of-directory record
    return path


def _absurd_dims_npz(path: Path) -> Path:
    cols = _columns()
    cols["x.npy"] = _header((2**40, 2**40, 2**40))
    path.write_bytes(_deflated(cols))
    return path


def _too_big_npy(path: Path) -> Path:
    path.write_bytes(_header((2**62,)))
    return path


def _bad_version_dat(path: Path) -> Path:
    path.write_bytes(b"% Version x\n" + bytes([0, 8]) + bytes(80))
    return path


#: (file name, how it is damaged, the reader, the library's words that used to come alone)
CASES: list[tuple[str, Callable[[Path], Path], Callable[[Path], object], str]] = [
    ("inflate.npz", _inflate_error_npz, NpzSource, "Error -3 while decompressing"),
    ("inflate.zip", _inflate_error_zip, EcdTextSource, "Error -3 while decompressing"),
    ("directory.zip", _bad_directory_zip, EcdTextSource, "central directory"),
    ("cut.npz", _cut_npz, NpzSource, "not a zip file"),
    ("dims.npz", _absurd_dims_npz, NpzSource, "events"),
    ("big.npy", _too_big_npy, NpzSource, "events"),
    ("version.dat", _bad_version_dat, PropheseeDatSource, "invalid literal"),
]


@pytest.mark.parametrize(("name", "make", "reader", "words"), CASES,
                         ids=[c[0] for c in CASES])
def test_a_reader_names_the_file_it_failed_on(
    tmp_path: Path, name: str, make: Callable[[Path], Path],
    reader: Callable[[Path], object], words: str,
) -> None:
    path = make(tmp_path / name)
    with pytest.raises(InvalidInput) as err:
        reader(path)
    message = str(err.value)
    assert name in message and words in message, message
    assert "pickled" not in message, message  # no array here is pickled
    with pytest.raises(InvalidInput, match=name.replace(".", r"\.")):
        open_source(str(path))


def _write_dsec(path: Path, n: int = 20_000, x_max: int = 640) -> Path:
    """A DSEC-shaped events.h5, Blosc chunks of 1,000 events, t = 10 µs apart."""
    import h5py
    import hdf5plugin

    blosc = hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE)
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        for key, data in (("x", rng.integers(0, x_max, n)), ("y", rng.integers(0, 480, n)),
                          ("p", rng.integers(0, 2, n)), ("t", np.arange(n) * 10)):
            f.create_dataset(f"events/{key}", data=data.astype("u4"), chunks=(1000,), **blosc)
    return path


def _damage_chunk(path: Path, dataset: str, index: int) -> None:
    """Overwrite most of one stored chunk, found through HDF5's own chunk index."""
    import h5py

    with h5py.File(path, "r") as f:
        chunk = f[dataset].id.get_chunk_info(index)
    data = path.read_bytes()
    path.write_bytes(_flip(data, chunk.byte_offset + 16, chunk.byte_offset + chunk.size))


def test_a_damaged_dsec_chunk_names_the_file_when_opened_and_in_a_window(
        tmp_path: Path) -> None:
    """DSEC decodes its Blosc chunks window by window, long after opening, where no
    ``open_source`` net is: h5py's "filter returned failure" must name the file."""
    path = _write_dsec(tmp_path / "events.h5")
    _damage_chunk(path, "events/x", 10)  # x at t = 100..110 ms
    with DsecSource(path) as src:
        assert src.events_between(0, 50_000).size == 5000  # an undamaged window still reads
        with pytest.raises(InvalidInput, match=r"events\.h5: could not read it as DSEC: "
                                               r"OSError: .*filter"):
            src.events_between(100_000, 110_000)
    first = _write_dsec(tmp_path / "first.h5")
    _damage_chunk(first, "events/t", 0)  # read at opening, for the first event's time
    with pytest.raises(InvalidInput, match=r"first\.h5: could not read it as DSEC"):
        DsecSource(first)


def test_dsec_events_outside_the_sensor_name_the_file(tmp_path: Path) -> None:
    path = _write_dsec(tmp_path / "wide.h5", x_max=700)
    with DsecSource(path) as src, pytest.raises(InvalidInput, match=r"wide\.h5: .*640x480"):
        src.events_between(0, 50_000)
