"""Small recordings written on the fly, in real file layouts."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_dsec(root: Path, seed: int) -> None:
    """A DSEC sequence folder: events/left/events.h5 (Blosc) and rectified PNG frames."""
    import h5py
    import hdf5plugin

    from eventspec.shared.node.imageproc import encode_png

    rng = np.random.default_rng(seed)
    n, span_us, w, h = 60_000, 1_200_000, 64, 48
    t = np.sort(rng.integers(0, span_us, n)).astype(np.uint32)
    ev = root / "events" / "left"
    ev.mkdir(parents=True)
    with h5py.File(ev / "events.h5", "w") as f:
        blosc = hdf5plugin.Blosc(cname="zstd", clevel=3)
        f.create_dataset("events/x", data=rng.integers(0, w, n).astype(np.uint16), **blosc)
        f.create_dataset("events/y", data=rng.integers(0, h, n).astype(np.uint16), **blosc)
        f.create_dataset("events/p", data=rng.integers(0, 2, n).astype(np.uint8), **blosc)
        f.create_dataset("events/t", data=t, **blosc)
        f.create_dataset("ms_to_idx", data=np.searchsorted(t, np.arange(span_us // 1000 + 2)
                                                           * 1000).astype(np.uint64))
        f.create_dataset("t_offset", data=np.int64(5_000_000))
    img = root / "images" / "left" / "rectified"
    img.mkdir(parents=True)
    stamps = [5_000_000 + i * 50_000 for i in range(span_us // 50_000)]
    for i in range(len(stamps)):
        (img / f"{i:06d}.png").write_bytes(encode_png(rng.integers(0, 256, (h, w, 3),
                                                                   dtype=np.uint8)))
    (root / "images" / "timestamps.txt").write_text("\n".join(map(str, stamps)) + "\n")
