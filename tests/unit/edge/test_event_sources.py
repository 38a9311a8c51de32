"""Event sources: synthetic, DSEC-shaped HDF5, npz/npy, pickled EventGPT .npy, open_source."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from eventspec.edge.events.sources import (
    DsecSource,
    EventGptNpySource,
    NpzSource,
    SyntheticSource,
    npy_needs_pickle,
    open_source,
)
from eventspec.edge.events.synthetic import SceneSpec, ShapeSpec
from eventspec.edge.events.types import EVENT_DTYPE, validate_events
from eventspec.shared.contract.errors import InvalidInput, NotFound
from eventspec.shared.node.imageproc import encode_png

T_OFFSET = 1_000_000_000


def _random_events(n: int, span_us: int, seed: int, size: tuple[int, int]) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ev = np.empty(n, dtype=EVENT_DTYPE)
    ev["x"] = rng.integers(0, size[0], n)
    ev["y"] = rng.integers(0, size[1], n)
    ev["t"] = np.sort(rng.integers(0, span_us, n))
    ev["p"] = rng.integers(0, 2, n)
    return ev


def _write_dsec(root: Path, rel: np.ndarray, *, with_index: bool = True) -> None:
    import h5py
    import hdf5plugin

    ev_dir = root / "events" / "left"
    ev_dir.mkdir(parents=True)
    blosc = hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE)
    with h5py.File(ev_dir / "events.h5", "w") as f:
        for name, dtype in (("x", "u2"), ("y", "u2"), ("p", "u1"), ("t", "u4")):
            f.create_dataset(f"events/{name}", data=rel[name].astype(dtype), chunks=(256,), **blosc)
        if with_index:
            n_ms = int(rel["t"][-1]) // 1000 + 2
            f.create_dataset(
                "ms_to_idx", data=np.searchsorted(rel["t"], np.arange(n_ms) * 1000, "left")
            )
        f.create_dataset("t_offset", data=np.int64(T_OFFSET))


def _write_frames(root: Path, stamps: list[int]) -> list[np.ndarray]:
    img_dir = root / "images" / "left" / "rectified"
    img_dir.mkdir(parents=True)
    frames = []
    for i, _ in enumerate(stamps):
        frame = np.full((6, 8, 3), 20 * i, dtype=np.uint8)
        (img_dir / f"{i:06d}.png").write_bytes(encode_png(frame))
        frames.append(frame)
    (root / "images" / "timestamps.txt").write_text("".join(f"{s}\n" for s in stamps))
    return frames


@pytest.fixture(scope="module")
def dsec_events() -> np.ndarray:
    return _random_events(5000, 200_000, seed=1, size=(640, 480))


def test_synthetic_depends_on_its_seed_only_and_has_rgb_and_events() -> None:
    np.random.seed(1)
    a = SyntheticSource(7, duration_ms=400)
    np.random.seed(2)  # the global generator's state must not matter
    b = SyntheticSource(7, duration_ms=400)
    c = SyntheticSource(8, duration_ms=400)
    ea, eb = a.events_between(*a.time_range_us()), b.events_between(*b.time_range_us())
    assert np.array_equal(ea, eb)
    assert not np.array_equal(ea, c.events_between(*c.time_range_us()))
    validate_events(ea, a.sensor_size)
    assert a.time_range_us() == (0, 400_000)
    assert set(np.unique(ea["p"]).tolist()) == {0, 1}
    frames = a.rgb_frames_between(0, 400_000)
    assert a.has_rgb and len(frames) == 12  # 30 fps
    ts, img = frames[3]
    assert ts == 100_000 and img.shape == (72, 96, 3) and img.dtype == np.uint8
    assert np.array_equal(img, b.rgb_frames_between(ts, ts + 1)[0][1])
    assert a.rgb_frames_between(0, 1_000) != [] and a.rgb_frames_between(1, 1_000) == []


def test_synthetic_events_follow_the_moving_shape() -> None:
    # A bright square moving right: ON events on its leading (right) edge, OFF trailing.
    shape = ShapeSpec("square", (250, 250, 250), 6.0, (20.0, 24.0), (40.0, 0.0))
    scene = SceneSpec(width=64, height=48, duration_ms=200, shapes=(shape,), noise_rate_hz=0.0)
    src = SyntheticSource(scene=scene)
    ev = src.events_between(100_000, 200_000)
    assert ev.size > 100
    cx = shape.centre_at(0.15, 64, 48)[0]
    assert ev["x"][ev["p"] == 1].mean() > cx > ev["x"][ev["p"] == 0].mean()


def test_dsec_reads_events_windows_and_frames(tmp_path: Path, dsec_events: np.ndarray) -> None:
    _write_dsec(tmp_path, dsec_events)
    stamps = [T_OFFSET + 10_000, T_OFFSET + 60_000, T_OFFSET + 110_000]
    frames = _write_frames(tmp_path, stamps)
    with DsecSource(tmp_path) as src:
        assert src.sensor_size == (640, 480) and src.has_rgb
        t0, t1 = src.time_range_us()
        assert t0 == T_OFFSET + int(dsec_events["t"][0])
        assert t1 == T_OFFSET + int(dsec_events["t"][-1]) + 1
        assert np.array_equal(src.events_between(t0, t1)["x"], dsec_events["x"])
        t_abs = dsec_events["t"] + T_OFFSET
        for a, b in [(12_345, 62_345), (0, 1), (50_000, 50_000), (199_000, 400_000), (-5, 10)]:
            got = src.events_between(T_OFFSET + a, T_OFFSET + b)
            mask = (t_abs >= T_OFFSET + a) & (t_abs < T_OFFSET + b)
            assert np.array_equal(got["t"], t_abs[mask]), (a, b)
            assert np.array_equal(got["y"], dsec_events["y"][mask])
            assert np.array_equal(got["p"], dsec_events["p"][mask])
        got_frames = src.rgb_frames_between(T_OFFSET + 50_000, T_OFFSET + 120_000)
        assert [ts for ts, _ in got_frames] == stamps[1:]
        assert np.array_equal(got_frames[0][1], frames[1])
        with pytest.raises(InvalidInput, match="inverted"):
            src.events_between(T_OFFSET + 10, T_OFFSET)
    opened = open_source(f"dsec:{tmp_path}")
    assert isinstance(opened, DsecSource) and "5000 events" in opened.describe()


def test_dsec_without_ms_to_idx_bisects(tmp_path: Path, dsec_events: np.ndarray) -> None:
    _write_dsec(tmp_path, dsec_events, with_index=False)
    src = DsecSource(tmp_path / "events" / "left" / "events.h5")
    assert not src.has_rgb
    got = src.events_between(T_OFFSET + 30_000, T_OFFSET + 31_000)
    t = dsec_events["t"]
    assert np.array_equal(got["t"] - T_OFFSET, t[(t >= 30_000) & (t < 31_000)])
    src.close()


def test_dsec_errors(tmp_path: Path, dsec_events: np.ndarray) -> None:
    with pytest.raises(NotFound):
        DsecSource(tmp_path / "missing")
    (tmp_path / "events" / "left").mkdir(parents=True)
    with pytest.raises(NotFound, match=r"events\.h5"):
        DsecSource(tmp_path)
    (tmp_path / "events" / "left" / "events.h5").write_bytes(b"not hdf5")
    with pytest.raises(InvalidInput, match="HDF5"):
        DsecSource(tmp_path)


def test_dsec_file_without_events_says_so(tmp_path: Path) -> None:
    import h5py

    path = tmp_path / "events.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("t_offset", data=np.int64(0))
    with pytest.raises(InvalidInput, match=r"no /events group \(/ holds \['t_offset'\]\)"):
        DsecSource(path)
    with h5py.File(path, "a") as f:
        f.create_dataset("events/x", data=np.zeros(3, np.uint16))
        f.create_dataset("events/t", data=np.zeros(3, np.int64))
    with pytest.raises(InvalidInput, match=r"no /events/\{y,p\}"):
        DsecSource(path)


def test_npz_and_structured_npy_round_trip(tmp_path: Path) -> None:
    ev = _random_events(300, 50_000, seed=2, size=(32, 24))
    np.savez(tmp_path / "a.npz", x=ev["x"].astype(np.int32), y=ev["y"], t=ev["t"], p=ev["p"])
    structured = np.zeros(300, dtype=[("t", "<u8"), ("x", "<i2"), ("y", "<i2"), ("p", "<i1")])
    for name in ("x", "y", "t", "p"):
        structured[name] = ev[name]
    np.save(tmp_path / "b.npy", structured)
    for spec in (f"npz:{tmp_path / 'a.npz'}", f"npy:{tmp_path / 'b.npy'}"):
        src = open_source(spec)
        assert isinstance(src, NpzSource)
        assert np.array_equal(src.events_between(*src.time_range_us()), ev)
        assert src.sensor_size == (int(ev["x"].max()) + 1, int(ev["y"].max()) + 1)
    assert NpzSource(tmp_path / "a.npz", sensor_size=(640, 480)).sensor_size == (640, 480)


def test_npz_refuses_unsorted_timestamps(tmp_path: Path) -> None:
    np.savez(tmp_path / "u.npz", x=[1, 2, 3], y=[0, 0, 0], t=[30, 10, 20], p=[1, 0, 1])
    with pytest.raises(InvalidInput, match=r"not in time order .*event 1: t=10 µs after t=30"):
        NpzSource(tmp_path / "u.npz")
    # Equal timestamps are in order.
    np.savez(tmp_path / "s.npz", x=[1, 2, 3], y=[0, 0, 0], t=[10, 10, 20], p=[1, 0, 1])
    assert NpzSource(tmp_path / "s.npz").events_between(0, 100)["x"].tolist() == [1, 2, 3]


def test_eventgpt_pickled_npy_needs_opt_in(tmp_path: Path) -> None:
    path = tmp_path / "sample.npy"
    ev = _random_events(200, 40_000, seed=3, size=(64, 48))
    np.save(path, np.array({k: ev[k] for k in ("x", "y", "t", "p")}, dtype=object))
    with pytest.raises(InvalidInput, match="allow_pickle"):
        open_source(f"npy:{path}")
    with pytest.raises(InvalidInput, match="runs code"):
        EventGptNpySource(path)
    src = open_source(f"npy:{path}", allow_pickle=True)
    assert isinstance(src, EventGptNpySource)
    assert np.array_equal(src.events_between(*src.time_range_us()), ev)


def test_damaged_pickled_npy_names_the_file(tmp_path: Path) -> None:
    """A cut or bit-flipped EventGPT .npy fails as InvalidInput naming the file (issue 38:
    "pickle data was truncated" came with no file name, an unknown global as a bare
    AttributeError); so do values out of range once unpickled."""
    path = tmp_path / "sample.npy"
    ev = _random_events(200, 40_000, seed=3, size=(64, 48))
    np.save(path, np.array({k: ev[k] for k in ("x", "y", "t", "p")}, dtype=object))
    whole = path.read_bytes()
    cut = tmp_path / "cut.npy"
    cut.write_bytes(whole[: len(whole) - 40])
    with pytest.raises(InvalidInput, match=r"cut\.npy.*truncated"):
        open_source(f"npy:{cut}", allow_pickle=True)
    renamed = tmp_path / "global.npy"
    renamed.write_bytes(whole.replace(b"_reconstruct", b"_reconstbuct"))
    with pytest.raises(InvalidInput, match=r"global\.npy"):
        open_source(f"npy:{renamed}", allow_pickle=True)
    wide = tmp_path / "wide.npy"
    big = {k: ev[k] for k in ("x", "y", "t", "p")}
    big["p"] = big["p"] * 100
    np.save(wide, np.array(big, dtype=object))
    with pytest.raises(InvalidInput, match=r"wide\.npy.*polarity"):
        open_source(f"npy:{wide}", allow_pickle=True)
    np.savez(tmp_path / "far.npz", x=[1, 60000], y=[0, 0], t=[1, 2], p=[1, 0])
    with pytest.raises(InvalidInput, match=r"far\.npz.*outside the 10x10 sensor"):
        open_source(f"npz:{tmp_path / 'far.npz'}", sensor_size=(10, 10))


def test_npy_loader_never_unpickles_without_opt_in(tmp_path: Path) -> None:
    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (pytest.fail, ("unpickled without allow_pickle",))

    path = tmp_path / "evil.npy"
    arr = np.empty((), dtype=object)
    arr[()] = Boom()
    with path.open("wb") as fh:
        np.lib.format.write_array(fh, arr, allow_pickle=True)
    assert npy_needs_pickle(path)
    with pytest.raises(InvalidInput):
        open_source(f"npy:{path}")
    with pytest.raises(InvalidInput):
        NpzSource(path)


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("webcam:0", InvalidInput),
        ("synthetic:abc", InvalidInput),
        ("npz:", InvalidInput),
        ("npz:/definitely/not/here.npz", NotFound),
        ("npy:/definitely/not/here.npy", NotFound),
        ("dsec:/definitely/not/here", NotFound),
    ],
)
def test_open_source_errors(spec: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        open_source(spec)


def test_open_source_garbage_file(tmp_path: Path) -> None:
    (tmp_path / "junk.npz").write_bytes(b"\x00garbage")
    with pytest.raises(InvalidInput, match=r"junk\.npz does not look like npz \(it looks like "
                                           "a file with no format signature"):
        open_source(f"npz:{tmp_path / 'junk.npz'}")
    with pytest.raises(InvalidInput, match="could not read"):
        NpzSource(tmp_path / "junk.npz")


def test_open_source_synthetic_seed() -> None:
    src = open_source("synthetic:5")
    assert isinstance(src, SyntheticSource) and src.scene.seed == 5
    assert "synthetic:5" in src.describe()
