"""Real recordings from real cameras (``../shared/data/real/``): every file decodes to
the counts, polarities, resolution and time span its README states, a window of every
file renders to EventGPT frames, and a request runs end to end on every format."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest

from eventspec.edge.events.base import EventSource
from eventspec.edge.events.detect import detect_kind
from eventspec.edge.events.prophesee_raw import PropheseeRawSource
from eventspec.edge.events.render import event_pixel_values, events_to_frames, split_equal_counts
from eventspec.edge.events.sources import open_source
from eventspec.edge.events.windows import MIN_EVENTS, events_for_window, select_window
from eventspec.shared.client.edge_client import AskError, EdgeClient
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.types import FeatureMode, Mode
from tests.support import edge_harness as eh
from tests.support.edge_harness import ask

REAL = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "real"
pytestmark = pytest.mark.skipif(not REAL.is_dir(), reason=f"real recordings not found at {REAL}")


@dataclass(frozen=True)
class Expected:
    """One row of the README's table (µs; ``size`` is the stated or x/y-max+1 extent)."""

    kind: str
    events: int
    size: tuple[int, int]
    t_first: int
    t_last: int
    on: int
    off: int
    size_from: str


EXPECTED: dict[str, Expected] = {
    "aedat4_dvxplorer_tonic_test_sample.aedat4": Expected(
        "aedat4", 111_954, (320, 240), 1605537493718345, 1605537494308262, 55_023, 56_931,
        "header geometry"),
    "aedat4_davis346_eventvisionlib_sample_trimmed.aedat4": Expected(
        "aedat4", 6_676, (346, 260), 1589163147368868, 1589163147538809, 3_563, 3_113,
        "header geometry"),
    "evt2_gen3_faery_tests_sparklers.raw": Expected(
        "raw", 521_252, (640, 480), 913716224, 913812095, 185_861, 335_391,
        "header plugin field"),
    "evt2_gen3_expelliarmus_tests_sample.raw": Expected(
        "raw", 539_481, (640, 480), 1317888, 1367888, 367_855, 171_626, "header plugin field"),
    # E1: by the EVT 3.0 spec, not expelliarmus (+45,056 µs) or faery (11727467).
    "evt3_gen41_expelliarmus_tests_sample.raw": Expected(
        "raw", 219_596, (1280, 720), 11718656, 11727457, 115_532, 104_064,
        "header plugin field"),
    "evt3_gen41_expelliarmus_tests_pedestrians_5k.raw": Expected(
        "raw", 5_000, (1280, 720), 5840504, 5885714, 2_894, 2_106, "header plugin field"),
    "dat_ncars_tonic_test_sample.dat": Expected(
        "dat", 2_009, (78, 42), 0, 99952, 1_350, 659, "inferred from events"),
    "dat_ncars_expelliarmus_tests_obj_004397_td.dat": Expected(
        "dat", 4_407, (54, 61), 0, 99937, 1_671, 2_736, "inferred from events"),
    "bin_nmnist_tonic_test_sample.bin": Expected(
        "bin", 4_325, (34, 34), 654, 311175, 2_145, 2_180, "format (N-MNIST 34x34)"),
    "bin_ncaltech101_eventvisionlib_faces_easy_0001.bin": Expected(
        "bin", 67_445, (151, 173), 6, 299364, 33_770, 33_675, "inferred from events"),
    "npy_eventgpt_samples_sample1.npy": Expected(
        "npy", 132_268, (640, 480), 0, 49595, 64_714, 67_554, "flag"),
    "npy_eventgpt_dsec_interlaken_00_d_000089.npy": Expected(
        "npy", 120_836, (640, 480), 51836949776, 51836999775, 71_873, 48_963, "flag"),
    "txt_ecd_eventbasedodometry_test_events_5.txt": Expected(
        "txt", 5, (240, 180), 0, 80, 3, 2, "flag"),
}
#: The README's resolution where the file does not state one (a flag gives it).
FLAG_SIZE = {"npy": (640, 480), "txt": (240, 180)}
#: Event windows with at least MIN_EVENTS events (saccade datasets are sparse).
WINDOW_MS = {"bin": 90}


def open_real(name: str) -> EventSource:
    kind = EXPECTED[name].kind
    return open_source(f"{kind}:{REAL / name}", allow_pickle=True,
                       sensor_size=FLAG_SIZE.get(kind))


def test_every_file_is_listed() -> None:
    on_disk = {p.name for p in REAL.iterdir() if p.name not in ("README.md", "SHA256SUMS")}
    assert on_disk == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_decodes_to_the_readme(name: str) -> None:
    exp = EXPECTED[name]
    src = open_real(name)
    t0, t1 = src.time_range_us()
    assert (t0, t1 - 1) == (exp.t_first, exp.t_last)
    ev = src.events_between(t0, t1)
    assert ev.size == exp.events
    assert (int((ev["p"] == 1).sum()), int((ev["p"] == 0).sum())) == (exp.on, exp.off)
    assert src.sensor_size == exp.size
    assert src.meta.size_from == exp.size_from
    assert bool(np.all(np.diff(ev["t"]) >= 0))
    assert int(ev["x"].max()) < exp.size[0] and int(ev["y"].max()) < exp.size[1]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_format_is_detected_from_content(name: str) -> None:
    assert detect_kind(REAL / name) == EXPECTED[name].kind


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_window_renders_to_eventgpt_frames(name: str) -> None:
    src = open_real(name)
    window = select_window(src, event_window_ms=WINDOW_MS.get(EXPECTED[name].kind, 20))
    if EXPECTED[name].events < MIN_EVENTS:  # the whole file is too sparse to draw
        with pytest.raises(InvalidInput, match=f"only {EXPECTED[name].events} events"):
            events_for_window(src, window)
        return
    events = events_for_window(src, window)
    frames = events_to_frames(events, src.sensor_size)
    # EventGPT's canvas: each frame is (y.max+1) x (x.max+1) of its own events.
    splits = [events[a:b] for a, b in split_equal_counts(events.size, 5)]
    assert [f.shape for f in frames] == [
        (int(p["y"].max()) + 1, int(p["x"].max()) + 1, 3) for p in splits
    ]
    w, h = src.sensor_size
    sensor = events_to_frames(events, src.sensor_size, canvas="sensor")
    assert all(f.shape == (h, w, 3) for f in sensor)
    assert all(np.array_equal(f, s[: f.shape[0], : f.shape[1]])
               for f, s in zip(frames, sensor, strict=True))
    pix = event_pixel_values(events, src.sensor_size, 336)
    assert pix.shape == (5, 3, 336, 336) and bool(pix.isfinite().all())
    # Every pixel is white, blue (p=0) or red (p=1), and each frame drew something.
    packed = [(f[..., 0].astype(np.int64) << 16) | (f[..., 1].astype(np.int64) << 8) | f[..., 2]
              for f in frames]  # [H, W] 0xRRGGBB each
    colours = set(np.unique(np.concatenate([p.ravel() for p in packed])).tolist())
    assert colours <= {0xFFFFFF, 0x0000FF, 0xFF0000}
    assert all(bool((f != 255).any()) for f in frames)


def test_raw_windows_match_whole_decoding() -> None:
    """Windows decoded from saved block states equal slices of one whole decode."""
    name = "evt3_gen41_expelliarmus_tests_sample.raw"
    whole = open_source(f"evt3:{REAL / name}")
    blocky = PropheseeRawSource(REAL / name, block_words=1_000)
    t0, t1 = whole.time_range_us()
    all_ev = whole.events_between(t0, t1)
    for a, b in [(t0, t0 + 1), (t0 + 1234, t0 + 5678), (t1 - 300, t1), (t0 - 10, t1 + 10)]:
        ref = all_ev[(all_ev["t"] >= a) & (all_ev["t"] < b)]
        assert np.array_equal(blocky.events_between(a, b), ref)


def test_aedat4_matches_the_independent_aedat_decoder() -> None:
    aedat = pytest.importorskip("aedat")
    for name in ("aedat4_dvxplorer_tonic_test_sample.aedat4",
                 "aedat4_davis346_eventvisionlib_sample_trimmed.aedat4"):
        ref = np.concatenate([pk["events"] for pk in aedat.Decoder(str(REAL / name))
                              if "events" in pk])
        src = open_real(name)
        ev = src.events_between(*src.time_range_us())
        assert np.array_equal(ev["t"], ref["t"].astype(np.int64))
        assert np.array_equal(ev["x"], ref["x"]) and np.array_equal(ev["y"], ref["y"])
        assert np.array_equal(ev["p"], ref["on"].astype(np.uint8))


def test_davis_frames_are_the_rgb_source() -> None:
    src = open_real("aedat4_davis346_eventvisionlib_sample_trimmed.aedat4")
    assert src.has_rgb
    frames = src.rgb_frames_between(*src.time_range_us())
    assert len(frames) == 3  # the 4th frame is stamped before the first event
    assert all(img.shape == (260, 346, 3) and img.dtype == np.uint8 for _, img in frames)


async def test_a_request_runs_end_to_end_on_every_format() -> None:
    """One cloud, one edge per file, each opened from its ``KIND:PATH`` spec as
    ``eventspec-edge serve --source`` does; the answer is the cloud's (speculative ==
    target-only). Event-only files use aligned features, the DAVIS file its frames."""
    target, draft = eh.shared_models()
    adapter = eh.adapter_for(target, draft)
    first = await eh.start_stack(adapter=adapter, edge_settings={"source": "toy"})
    try:
        from dataclasses import replace

        from eventspec.edge.server import EdgeServer

        for name in sorted(EXPECTED):
            exp = EXPECTED[name]
            settings = replace(
                first.edge.settings, source=f"{exp.kind}:{REAL / name}", allow_pickle=True,
                sensor_size=FLAG_SIZE.get(exp.kind),
            )
            edge = EdgeServer(settings, draft=draft, adapter=adapter)
            await edge.start()
            try:
                address = f"127.0.0.1:{edge.port}"
                if exp.events < MIN_EVENTS:  # too few to answer: refused, as the README says
                    with pytest.raises(AskError) as err:
                        await ask(address, "What is moving?", Mode.SPECULATIVE, max_new=4)
                    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT, name
                    assert f"only {exp.events} events in the event window" in \
                        err.value.details, (name, err.value.details)
                    continue
                spec = await ask(address, "What is moving?", Mode.SPECULATIVE, max_new=4,
                                 event_window_ms=WINDOW_MS.get(exp.kind, 20))
                base = await ask(address, "What is moving?", Mode.TARGET_ONLY, max_new=4,
                                 event_window_ms=WINDOW_MS.get(exp.kind, 20))
                assert spec.token_ids == base.token_ids, name
                assert spec.answer, name
                assert spec.window is not None and spec.window.num_events >= 5, name
                has_frames = name.startswith("aedat4_davis")
                want = FeatureMode.FRAMES if has_frames else FeatureMode.ALIGNED
                assert spec.feature_mode == want, name
                async with EdgeClient(address, timeout_s=30) as client:
                    status = await client.status()
                assert (status.sensor_width, status.sensor_height) == exp.size, name
                assert (status.source_t0_us, status.source_t1_us - 1) == (
                    exp.t_first, exp.t_last), name
                assert status.sensor_size_from == exp.size_from, name
                assert status.time_base and status.source_format, name
                assert status.has_rgb == has_frames, name
            finally:
                await edge.stop(0)
    finally:
        await first.stop()


@pytest.mark.slow
def test_eventspec_edge_serve_answers_on_every_real_file(tmp_path: Path) -> None:
    """The user's commands as processes: ``eventspec-cloud serve --model toy`` once,
    then ``eventspec-edge serve --source KIND:PATH --model toy`` per file (bare PATH for
    the detected ones), and ``eventspec ask`` gets an answer from each."""
    import signal

    from tests.support.cli_processes import PACED_CLOUD, ask_json, spawn, wait_port

    cloud = spawn("eventspec-cloud", ["serve", "--model", "toy", "--port", "0", "--port-file",
                                      str(tmp_path / "c"), *PACED_CLOUD], tmp_path / "c.log")
    try:
        cport = wait_port(cloud, tmp_path / "c", tmp_path / "c.log")
        for i, name in enumerate(sorted(EXPECTED)):
            exp = EXPECTED[name]
            spec = str(REAL / name) if i % 2 else f"{exp.kind}:{REAL / name}"
            extra = ["--allow-pickle"] if exp.kind == "npy" else []
            if exp.kind in FLAG_SIZE:
                extra += ["--sensor-size", "{}x{}".format(*FLAG_SIZE[exp.kind])]
            log, port_file = tmp_path / f"e{i}.log", tmp_path / f"e{i}"
            edge = spawn("eventspec-edge", ["serve", "--cloud", f"127.0.0.1:{cport}",
                                            "--source", spec, "--model", "toy", "--port", "0",
                                            "--port-file", str(port_file), *extra], log)
            try:
                eport = wait_port(edge, port_file, log)
                if exp.events < MIN_EVENTS:
                    continue  # refused as too sparse: the in-process test checks how
                out = ask_json(eport, "speculative", "What is moving?", "--event-window-ms",
                               str(WINDOW_MS.get(exp.kind, 20)))
                assert out["answer"] and out["mode"] == "speculative", (name, out)
            finally:
                edge.send_signal(signal.SIGTERM)
                edge.wait(30)
    finally:
        cloud.send_signal(signal.SIGTERM)
        cloud.wait(30)


def test_truncated_aedat4_names_the_byte_offset(tmp_path: Path) -> None:
    data = (REAL / "aedat4_dvxplorer_tonic_test_sample.aedat4").read_bytes()
    cut = tmp_path / "cut.aedat4"
    cut.write_bytes(data[:500_000])
    with pytest.raises(InvalidInput, match=r"cut\.aedat4: byte offset 494090: packet of "
                                           r"22957 bytes runs past the end"):
        open_source(str(cut))
    cut.write_bytes(data[:100])
    with pytest.raises(InvalidInput, match=r"byte offset 14: header of 2316 bytes"):
        open_source(str(cut))


def test_truncated_raw_names_the_byte_offset(tmp_path: Path) -> None:
    data = (REAL / "evt3_gen41_expelliarmus_tests_sample.raw").read_bytes()
    cut = tmp_path / "cut.raw"
    cut.write_bytes(data[:-1])
    with pytest.raises(InvalidInput, match=r"cut\.raw: byte offset \d+: truncated"):
        open_source(str(cut))


#: What each real file's first bytes say it is ("it looks like ..."), for forced kinds.
LOOKS = {"aedat4": "aedat4", "dat": "dat", "npy": "npy", "txt": "txt"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_forced_kind_that_the_content_contradicts_is_refused(name: str) -> None:
    """``bin:`` on a DAT file used to serve 3,232 made-up events, and ``dat:`` on an
    AEDAT4 file said "truncated": every reader now checks the content first (issue 38)."""
    exp = EXPECTED[name]
    looks = "evt3" if name.startswith("evt3") else "evt2" if name.startswith("evt2") else \
        LOOKS.get(exp.kind)
    if looks is None:  # N-MNIST records carry no signature: nothing to contradict
        return
    for kind in ("aedat4", "raw", "evt2", "evt3", "dat", "bin", "txt", "npy", "npz", "dsec"):
        if kind == exp.kind or (exp.kind == "raw" and kind in ("raw", looks)) or \
                (exp.kind == "npy" and kind == "npz"):
            continue
        with pytest.raises(InvalidInput, match=rf"{name} does not look like {kind} \(it looks "
                                               rf"like {looks}\b"):
            open_source(f"{kind}:{REAL / name}", allow_pickle=True, sensor_size=(640, 480))


def test_a_renamed_aedat4_file_is_read_as_aedat4(tmp_path: Path) -> None:
    """The docs promise it: content wins over the name, and dv-processing (which opens
    only ``.aedat4`` names) gets a temporary link."""
    name = "aedat4_dvxplorer_tonic_test_sample.aedat4"
    renamed = tmp_path / "camera.bin"
    renamed.write_bytes((REAL / name).read_bytes())
    ref = open_real(name)
    for spec in (str(renamed), f"aedat4:{renamed}"):
        src = open_source(spec)
        try:
            assert src.time_range_us() == ref.time_range_us()
            assert np.array_equal(src.events_between(*src.time_range_us()),
                                  ref.events_between(*ref.time_range_us()))
        finally:
            src.close()  # type: ignore[attr-defined]
    assert not list(tmp_path.glob("*.aedat4"))
