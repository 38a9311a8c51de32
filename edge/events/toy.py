"""Toy-world scenes played back to back as an event source with RGB frames.

The embedded demo models are trained on :mod:`eventspec.demoworld`; this source shows
them the same world through the edge's ordinary path (window selection, event
rendering, frame sampling), so what the demo answers about is exactly what the models
learned. Scene ``i`` of the seed list occupies source time ``[i*D, (i+1)*D)`` µs
(``D`` = one scene's duration, 1 s): a request for the clip ``[i*D, (i+1)*D)`` sees
scene ``i``'s 8 RGB frames (the ones the trainer rendered) and its last 50 ms of
events, and the default "latest second" is the last scene.

Scenes are simulated on first use and kept in a small LRU cache, so a source over a
long seed range costs nothing until asked.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from eventspec.edge.events.base import FixedSensor, check_range
from eventspec.edge.events.types import EVENT_DTYPE, empty_events
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.toyworld.events import TOY_EVENT_DTYPE, simulate_events
from eventspec.shared.toyworld.scenes import (
    DEMO_SEED,
    SCENE_DURATION_US,
    SCENE_HEIGHT,
    SCENE_WIDTH,
    ToyScene,
    render_rgb,
    rgb_frame_times_us,
    sample_scene,
)

#: Scenes whose events and frames stay cached (a request touches one, rarely two).
CACHE_SCENES = 4
#: Every toy scene has this geometry, which is what lets scene i sit at [i*D, (i+1)*D).
TOY_SENSOR_SIZE = (SCENE_WIDTH, SCENE_HEIGHT)
TOY_SCENE_US = SCENE_DURATION_US

if TOY_EVENT_DTYPE != EVENT_DTYPE:  # pragma: no cover - guards a future edit of either
    raise RuntimeError("eventspec.demoworld's event dtype drifted from the edge's EVENT_DTYPE")


class _Scene:
    """One scene's data: events shifted to source time, frames keyed by source time."""

    def __init__(self, scene: ToyScene, offset_us: int) -> None:
        events = simulate_events(scene)
        events["t"] += offset_us
        events.flags.writeable = False
        self.scene = scene
        self.events = events  # [N] EVENT_DTYPE, sorted by t
        self.frame_times = rgb_frame_times_us(scene.duration_us) + offset_us  # [8] µs
        self.frames = [render_rgb(scene, float(t - offset_us)) for t in self.frame_times]
        for frame in self.frames:
            frame.flags.writeable = False


class ToySource(FixedSensor):
    """An EventSource over toy scenes ``seeds[0], seeds[1], ...`` played back to back.

    Deterministic: the same seeds give identical events and frames. Thread-safe (the
    edge serves requests from worker threads).
    """

    def __init__(self, seeds: Sequence[int]) -> None:
        if len(seeds) == 0:
            raise InvalidInput("a toy source needs at least one scene seed")
        # A range stays a range: "toy:0-1000000" must not build a million-int list.
        self._seeds: Sequence[int] = seeds if isinstance(seeds, range) else tuple(seeds)
        if min(self._seeds) < 0:
            raise InvalidInput("toy scene seeds must be non-negative")
        self._cache: OrderedDict[int, _Scene] = OrderedDict()
        self._lock = threading.Lock()
        self._fix_sensor(TOY_SENSOR_SIZE, has_rgb=True)

    @property
    def seeds(self) -> Sequence[int]:
        return self._seeds

    def describe(self) -> str:
        n = len(self._seeds)
        first, last = self._seeds[0], self._seeds[-1]
        contiguous = isinstance(self._seeds, range) and self._seeds.step == 1
        if n == 1:
            which = f"seed {first}"
        elif contiguous:
            which = f"seeds {first}..{last}"
        else:
            which = f"{n} seeds from {first} to {last}"
        w, h = TOY_SENSOR_SIZE
        secs = n * TOY_SCENE_US / 1e6
        return f"toy world ({which}; {n} scene{'s' * (n > 1)}, {w}x{h}, {secs:.3f} s)"

    def time_range_us(self) -> tuple[int, int]:
        return 0, len(self._seeds) * TOY_SCENE_US

    def scene_index_at(self, t_us: int) -> int:
        """Index into the seed list of the scene playing at ``t_us``."""
        index = int(t_us) // TOY_SCENE_US
        if not 0 <= index < len(self._seeds):
            raise InvalidInput(f"{t_us} µs lies outside the toy source's {self.time_range_us()}")
        return index

    def scene_at(self, t_us: int) -> ToyScene:
        """The scene playing at ``t_us`` (its seed answers what a question is about)."""
        return self._scene(self.scene_index_at(t_us)).scene

    def events_between(self, t0_us: int, t1_us: int) -> np.ndarray:
        check_range(t0_us, t1_us)
        parts = []
        for i in self._indices(t0_us, t1_us):
            ev = self._scene(i).events
            lo, hi = np.searchsorted(ev["t"], [t0_us, t1_us], side="left")
            if hi > lo:
                parts.append(ev[int(lo) : int(hi)])
        if not parts:
            return empty_events()
        # One scene: a read-only view; a range across scenes: a fresh concatenation.
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def rgb_timestamps_between(self, t0_us: int, t1_us: int) -> np.ndarray:
        check_range(t0_us, t1_us)
        stamps = [self._scene(i).frame_times for i in self._indices(t0_us, t1_us)]
        if not stamps:
            return np.zeros(0, dtype=np.int64)
        all_stamps = np.concatenate(stamps)
        inside: np.ndarray = all_stamps[(all_stamps >= t0_us) & (all_stamps < t1_us)]
        return inside

    def rgb_frames_between(self, t0_us: int, t1_us: int) -> list[tuple[int, np.ndarray]]:
        check_range(t0_us, t1_us)
        out = []
        for i in self._indices(t0_us, t1_us):
            data = self._scene(i)
            for ts, frame in zip(data.frame_times, data.frames, strict=True):
                if t0_us <= ts < t1_us:
                    out.append((int(ts), frame))
        return out

    def _indices(self, t0_us: int, t1_us: int) -> range:
        """Indices of the scenes overlapping ``[t0_us, t1_us)`` (clipped to the source)."""
        lo = max(0, int(t0_us) // TOY_SCENE_US)
        hi = min(len(self._seeds), -(-int(t1_us) // TOY_SCENE_US))
        return range(lo, max(lo, hi))

    def _scene(self, index: int) -> _Scene:
        with self._lock:
            cached = self._cache.get(index)
            if cached is not None:
                self._cache.move_to_end(index)
                return cached
        # Simulate outside the lock; two threads racing on one scene both compute the
        # same deterministic data and one copy wins.
        data = _Scene(sample_scene(int(self._seeds[index])), index * TOY_SCENE_US)
        with self._lock:
            data = self._cache.setdefault(index, data)
            self._cache.move_to_end(index)
            while len(self._cache) > CACHE_SCENES:
                self._cache.popitem(last=False)
        return data


def parse_toy_spec(arg: str) -> ToySource:
    """``""`` (the demo scene), ``"S"`` (one scene) or ``"A-B"`` (seeds A..B-1)."""
    return ToySource(toy_seeds(arg))


def toy_seeds(arg: str) -> range:
    """The seeds a ``toy:ARG`` spec names; InvalidInput for a malformed one. Apart from
    drawing the scenes, so a CLI can check the spec before any work."""
    arg = arg.strip()
    if not arg:
        return range(DEMO_SEED, DEMO_SEED + 1)
    first, dash, last = arg.partition("-")
    try:
        a = int(first)
        b = int(last) if dash else a + 1
    except ValueError:
        raise InvalidInput(
            f"toy source expects toy, toy:SEED or toy:A-B (seeds A..B-1), got toy:{arg}"
        ) from None
    if a < 0 or b <= a:
        raise InvalidInput(f"toy seed range {a}-{b} is empty or negative (B is exclusive)")
    return range(a, b)
