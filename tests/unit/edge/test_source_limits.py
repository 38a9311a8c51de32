"""Caps on what a file source may decode (issue 38, red-team finding 4: a 1.7 MB .npz
reached 5.9 GB of memory, a 0.5 MB zipped events.txt 1.8 GB).

The bombs here are cheap: a header or a zip directory that *declares* a huge size over a
few bytes of data. Each test proves the refusal comes from the declaration, before any
allocation: the peak of traced memory (numpy reports its arrays to tracemalloc, even
ones the kernel never backs) stays at a few MiB, where reading would allocate GiBs.
"""

from __future__ import annotations

import io
import os
import struct
import time
import tracemalloc
import zipfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from eventspec.edge import cli as edge_cli
from eventspec.edge.config import EdgeSettings
from eventspec.edge.events.ecd_txt import EcdTextSource
from eventspec.edge.events.limits import (
    DEFAULT_MAX_SOURCE_BYTES,
    DEFAULT_MAX_SOURCE_EVENTS,
    SourceLimits,
)
from eventspec.edge.events.nmnist_bin import NmnistBinSource
from eventspec.edge.events.source_check import check_source_spec
from eventspec.edge.events.sources import EventGptNpySource, NpzSource, open_source
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.node_cli import EXIT_USAGE

#: The most traced memory a refusal from a header may take.
FEW_MIB = 4 << 20


def npy_header(shape: tuple[int, ...], descr: object = "<i8") -> bytes:
    """A version 1.0 ``.npy`` header declaring ``shape`` and ``descr``, with no data."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def write_zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def small_columns(n: int = 200) -> dict[str, bytes]:
    """x, y, t, p members of ``n`` ordered events."""
    return {"x.npy": npy_bytes(np.arange(n) % 30), "y.npy": npy_bytes(np.arange(n) % 20),
            "t.npy": npy_bytes(np.arange(n) * 10), "p.npy": npy_bytes(np.arange(n) % 2)}


def refused_cheaply(open_it: Callable[[], object], match: str) -> InvalidInput:
    """The InvalidInput ``open_it`` raises, checked to come at once and to have allocated
    next to nothing on the way."""
    tracemalloc.start()
    start = time.monotonic()
    try:
        with pytest.raises(InvalidInput, match=match) as err:
            open_it()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < FEW_MIB, f"{peak / 2**20:.0f} MiB traced before the refusal"
    assert time.monotonic() - start < 2.0
    return err.value


def test_the_defaults_are_the_settings_defaults() -> None:
    settings = EdgeSettings()
    assert SourceLimits() == SourceLimits(DEFAULT_MAX_SOURCE_EVENTS, DEFAULT_MAX_SOURCE_BYTES)
    assert (settings.max_source_events, settings.max_source_bytes) == (
        DEFAULT_MAX_SOURCE_EVENTS, DEFAULT_MAX_SOURCE_BYTES)


def test_an_npz_column_declaring_more_events_than_the_cap_is_refused_from_its_header(
        tmp_path: Path) -> None:
    """Before: np.load allocated the declared 8 GB, then failed reading it ("holds
    pickled arrays", which it does not)."""
    path = write_zip(tmp_path / "bomb.npz", {**small_columns(), "x.npy": npy_header((10**9,))})
    for open_it in (lambda: open_source(f"npz:{path}"), lambda: open_source(str(path)),
                    lambda: NpzSource(path)):
        refused_cheaply(open_it, r"bomb\.npz!x\.npy: declares 1,000,000,000 events, more "
                                 r"than --max-source-events \(10,000,000\)")


def test_an_npz_member_declaring_more_bytes_than_the_cap_is_refused_from_its_header(
        tmp_path: Path) -> None:
    """Fewer events than the cap, but 64 bytes each: 576 MB declared."""
    wide = npy_header((9_000_000,), "|V64")
    path = write_zip(tmp_path / "wide.npz", {**small_columns(), "extra.npy": wide})
    refused_cheaply(lambda: NpzSource(path),
                    r"wide\.npz: its arrays declare 576,006,400 bytes, more than "
                    r"--max-source-bytes \(536,870,912\)")


def test_an_npz_member_holding_less_than_its_header_declares_is_refused_unread(
        tmp_path: Path) -> None:
    """Under the caps, but cut short: named as truncated before numpy allocates."""
    path = write_zip(tmp_path / "cut.npz", {**small_columns(), "t.npy": npy_header((10**6,))})
    refused_cheaply(lambda: NpzSource(path),
                    r"cut\.npz!t\.npy: truncated: its header declares 8,000,000 bytes of "
                    r"array data; it holds 0")


def test_a_structured_npy_declaring_more_than_the_cap_or_the_file_is_refused_from_its_header(
        tmp_path: Path) -> None:
    fields = [("x", "<u2"), ("y", "<u2"), ("t", "<i8"), ("p", "u1")]
    big = tmp_path / "big.npy"
    big.write_bytes(npy_header((10**9,), fields))
    refused_cheaply(lambda: open_source(f"npy:{big}"),
                    r"big\.npy: declares 1,000,000,000 events, more than --max-source-events")
    cut = tmp_path / "cut.npy"
    cut.write_bytes(npy_header((10**6,), fields))
    refused_cheaply(lambda: NpzSource(cut),
                    r"cut\.npy: truncated: its header declares 13,000,000 bytes")


def _declare_size(path: Path, size: int) -> None:
    """Overwrite the uncompressed size a one-member zip declares, in its local header and
    its central directory (offsets from the zip specification, APPNOTE 4.3.7 and 4.3.12)."""
    data = bytearray(path.read_bytes())
    central = data.rindex(b"PK\x01\x02")
    struct.pack_into("<I", data, 22, size)
    struct.pack_into("<I", data, central + 24, size)
    path.write_bytes(bytes(data))


def test_a_zipped_text_declaring_more_bytes_than_the_cap_is_refused_from_the_directory(
        tmp_path: Path) -> None:
    """ZipInfo.file_size is what zipfile will inflate to at most; 3.75 GiB is refused."""
    path = write_zip(tmp_path / "seq.zip", {"events.txt": b"0.000001 1 2 1\n" * 1000})
    _declare_size(path, 0xF000_0000)
    for open_it in (lambda: open_source(str(path)), lambda: EcdTextSource(path)):
        refused_cheaply(open_it, r"seq\.zip!events\.txt: decodes to 4,026,531,840 bytes, "
                                 r"more than --max-source-bytes \(536,870,912\)")


def test_text_events_are_counted_while_they_are_parsed(tmp_path: Path) -> None:
    """Text declares no count: the reader parses it in blocks and stops at the first block
    that passes the cap, so a bomb costs a block, never the whole file."""
    text = b"0.000001 1 2 1\n" * 2_000_000  # 30 MB, 2 M events
    plain = tmp_path / "events.txt"
    plain.write_bytes(text)
    zipped = write_zip(tmp_path / "seq.zip", {"events.txt": text})
    cap = SourceLimits(max_events=1000)
    for spec in (f"txt:{plain}", f"txt:{zipped}"):
        tracemalloc.start()
        try:
            with pytest.raises(InvalidInput, match=r"holds more than 1,000 events "
                                                   r"\(--max-source-events\)"):
                open_source(spec, limits=cap)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < len(text) / 2, f"{peak / 2**20:.0f} MiB traced: parsed whole?"
    at_cap = tmp_path / "at_cap.txt"
    at_cap.write_bytes(b"0.000001 1 2 1\n" * 1000)
    assert EcdTextSource(at_cap, limits=cap).num_events == 1000


def test_text_is_parsed_across_blocks_as_one_file(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Small blocks split lines and comments anywhere: the events are the same."""
    from eventspec.edge.events import ecd_txt

    rng = np.random.default_rng(5)
    rows = [f"{i * 1e-6:.6f} {rng.integers(0, 240)} {rng.integers(0, 180)} {i % 2}\n"
            for i in range(3000)]
    rows.insert(1500, "# a comment in the middle\n")
    path = tmp_path / "events.txt"
    path.write_text("".join(rows))
    whole = EcdTextSource(path, sensor_size=(240, 180)).events_between(0, 10**9)
    monkeypatch.setattr(ecd_txt, "BLOCK_BYTES", 97)
    split = EcdTextSource(path, sensor_size=(240, 180)).events_between(0, 10**9)
    assert whole.size == 3000 and np.array_equal(whole, split)


def test_readers_of_whole_files_check_the_file_size_first(tmp_path: Path) -> None:
    cap = SourceLimits(max_bytes=1 << 20)
    for name, open_it in (
        ("x.bin", lambda p: NmnistBinSource(p, limits=cap)),
        ("x.txt", lambda p: EcdTextSource(p, limits=cap)),
        ("x.npy", lambda p: EventGptNpySource(p, allow_pickle=True, limits=cap)),
    ):
        path = tmp_path / name
        with path.open("wb") as fh:  # 64 MiB, sparse: nothing written
            fh.truncate(64 << 20)
        refused_cheaply(lambda p=path, o=open_it: o(p),
                        rf"{name}: decodes to 67,108,864 bytes, more than --max-source-bytes "
                        r"\(1,048,576\)")
    events = tmp_path / "many.bin"
    with events.open("wb") as fh:  # 5 bytes an event: 2,000,000 declared by the size
        fh.truncate(10_000_000)
    refused_cheaply(lambda: NmnistBinSource(events, limits=SourceLimits(max_events=1000)),
                    r"many\.bin: declares 2,000,000 events, more than --max-source-events")


def test_a_pickled_npy_holding_more_events_than_the_cap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "sample.npy"
    cols = {k: np.arange(5000, dtype=np.int64) % 30 for k in ("x", "y", "p")}
    cols["p"] %= 2
    np.save(path, np.array({**cols, "t": np.arange(5000)}, dtype=object))
    with pytest.raises(InvalidInput, match=r"sample\.npy: holds 5,000 events, more than "
                                           r"--max-source-events \(1,000\)"):
        open_source(f"npy:{path}", allow_pickle=True, limits=SourceLimits(max_events=1000))


def test_files_under_the_caps_open_as_before(tmp_path: Path) -> None:
    npz = write_zip(tmp_path / "ok.npz", small_columns(200))
    assert NpzSource(npz, limits=SourceLimits(200, 10_000)).num_events == 200
    with pytest.raises(InvalidInput, match="more than --max-source-events"):
        NpzSource(npz, limits=SourceLimits(199, 10_000))
    with pytest.raises(InvalidInput, match="more than --max-source-bytes"):
        NpzSource(npz, limits=SourceLimits(200, 100))


def test_the_start_up_check_applies_the_caps_from_headers(tmp_path: Path) -> None:
    """``eventspec-edge serve`` refuses before torch loads: exit 2, one line."""
    path = write_zip(tmp_path / "ok.npz", small_columns(200))
    check_source_spec(f"npz:{path}", allow_pickle=False)
    with pytest.raises(InvalidInput, match=r"ok\.npz!x\.npy: declares 200 events"):
        check_source_spec(f"npz:{path}", allow_pickle=False, limits=SourceLimits(max_events=10))
    zipped = write_zip(tmp_path / "seq.zip", {"events.txt": b"0.000001 1 2 1\n" * 1000})
    with pytest.raises(InvalidInput, match=r"seq\.zip!events\.txt: decodes to 15,000 bytes"):
        check_source_spec(str(zipped), allow_pickle=False, limits=SourceLimits(max_bytes=1000))


def test_serve_refuses_a_source_over_its_caps_with_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    for name in [n for n in os.environ if n.startswith("EVENTSPEC_")]:
        monkeypatch.delenv(name)
    path = write_zip(tmp_path / "ok.npz", small_columns(200))
    with pytest.raises(SystemExit) as exited:
        edge_cli.main(["serve", "--source", f"npz:{path}", "--max-source-events", "10"])
    assert exited.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--source: " in err and "ok.npz!x.npy: declares 200 events" in err, err
    monkeypatch.setenv("EVENTSPEC_EDGE_MAX_SOURCE_BYTES", "100")
    with pytest.raises(SystemExit) as exited:
        edge_cli.main(["serve", "--source", f"npz:{path}"])
    assert exited.value.code == EXIT_USAGE
    assert "more than --max-source-bytes (100)" in capsys.readouterr().err


async def test_the_edge_server_opens_its_source_under_the_settings_caps(tmp_path: Path) -> None:
    """Text is only counted while parsed, past the start-up check: the server's own
    opening must apply the flag's cap, not the default."""
    from eventspec.edge.server import EdgeServer

    path = tmp_path / "events.txt"
    path.write_bytes(b"0.000001 1 2 1\n" * 500)
    settings = replace(EdgeSettings(), source=f"txt:{path}", port=0, max_source_events=100)
    edge = EdgeServer(settings)
    try:
        with pytest.raises(InvalidInput, match=r"events\.txt: holds more than 100 events"):
            await edge.start()
    finally:
        await edge.stop(0)
