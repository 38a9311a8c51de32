"""A newcomer's first hour (issue 13), as processes: what the commands say when used wrong.

Every argument is checked before any network call (one line, exit 2, no traceback);
the servers refuse flags that would fail every request; a closed pipe ends quietly;
a wrong address or vocabulary says what is wrong; ranges and short recordings follow
the window rule of docs/reference/limits.md.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventspec.shared.client.launch import entry_point_command
from tests.support.cli_processes import PACED_CLOUD

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, args: list[str], timeout: float = 120,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(entry_point_command(script, args), cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)


def _one_clear_line(out: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--seed", "-1"], "--seed must be in 0.."),
        (["--clip-ms", "99999999999"], "--clip-ms must be in 1..2147483647"),
        (["--clip-ms", "0"], "--clip-ms"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be in 1.."),
        (["--top-p", "0"], "--top-p must be in (0, 1]"),
        (["--event-window-ms", "0"], "--event-window-ms must be in 1..99"),
        (["--event-window-ms", "100"], "EventGPT refuses"),
        (["--temperature", "inf"], "--temperature"),
        (["--edge", "127.0.0.1"], "needs a port"),
        (["--edge", "127.0.0.1:99999"], "1..65535"),
        (["--from-ms", "10"], "--from-ms and --to-ms go together"),
        (["--from-ms", "20", "--to-ms", "10"], "must be before"),
        (["--from-ms", "-1", "--to-ms", "10"], "--from-ms must be >= 0"),
        (["--clip-ms", "500", "--from-ms", "0", "--to-ms", "10"], "not both"),
        (["--seed", "x"], "invalid int value"),
    ],
)
def test_ask_refuses_bad_arguments_before_the_network(args: list[str], needle: str) -> None:
    # Port 9 (discard) on loopback: a network call would fail differently and slowly.
    out = _run("eventspec", ["ask", "--edge", "127.0.0.1:9", *args, "What?"], timeout=30)
    _one_clear_line(out, "eventspec ask: error:", needle)


@pytest.mark.parametrize(
    ("script", "args", "env", "needle"),
    [
        ("eventspec-cloud", ["--port", "70000"], {}, "--port must be in 0..65535"),
        ("eventspec-cloud", ["--port", "-1"], {}, "--port must be in 0..65535"),
        ("eventspec-edge", ["--port", "65536"], {}, "--port must be in 0..65535"),
        ("eventspec-cloud", ["--max-new-tokens", "-1"], {}, "--max-new-tokens must be in 1.."),
        ("eventspec-cloud", ["--max-new-tokens", "0"], {}, "--max-new-tokens must be in 1.."),
        ("eventspec-cloud", ["--max-sessions", "-1"], {}, "--max-sessions must be >= 0 (0: auto)"),
        ("eventspec-cloud", ["--emulate-step-ms", "-1"], {}, "--emulate-step-ms"),
        ("eventspec-cloud", [], {"EVENTSPEC_CLOUD_PORT": "fifty"}, "$EVENTSPEC_CLOUD_PORT"),
        ("eventspec-edge", ["--request-timeout", "-1"], {}, "--request-timeout must be > 0"),
        ("eventspec-edge", ["--request-timeout", "nan"], {}, "--request-timeout"),
        ("eventspec-edge", ["--cloud", "127.0.0.1"], {}, "needs a port"),
        ("eventspec-edge", ["--cloud", "127.0.0.1:1,10.0.0.2"], {}, "'10.0.0.2' needs a port"),
        ("eventspec-edge", ["--jpeg-quality", "0"], {}, "--jpeg-quality"),
        ("eventspec-edge", [], {"EVENTSPEC_EDGE_PORT": "x"}, "$EVENTSPEC_EDGE_PORT"),
    ],
)
def test_servers_refuse_bad_flags_and_variables_at_start_up(
    script: str, args: list[str], env: dict[str, str], needle: str
) -> None:
    started = time.monotonic()
    out = _run(script, ["serve", "--port", "0", *args], timeout=60,
               env=dict(os.environ, **env))
    _one_clear_line(out, f"{script}: error:", needle)
    # Refused before any model is loaded.
    assert time.monotonic() - started < 30


def _bad_recording(kind: str, where: Path) -> Path:
    import h5py
    import numpy as np

    if kind == "dsec":
        path = where / "no-events.h5"
        with h5py.File(path, "w") as f:
            f["t_offset"] = np.array([0])
        return path
    path = where / "unsorted.npz"
    np.savez(path, t=np.array([5, 3, 9]), x=np.array([1, 2, 3]), y=np.array([1, 2, 3]),
             p=np.array([0, 1, 0]))
    return path


@pytest.mark.parametrize(("kind", "needle"), [
    ("dsec", "is not a DSEC events file: it has no /events group"),
    ("npz", "timestamps are not in time order"),
])
def test_edge_refuses_a_broken_recording_in_one_line(kind: str, needle: str,
                                                     tmp_path: Path) -> None:
    path = _bad_recording(kind, tmp_path)
    out = _run("eventspec-edge", ["serve", "--port", "0", "--source", str(path), "--model",
                                  "tiny-random", "--cloud", "127.0.0.1:9"], timeout=120)
    assert out.returncode == 1, (out.stdout, out.stderr)
    errors = [ln for ln in out.stderr.splitlines() if " ERROR " in ln]
    assert len(errors) == 1 and needle in errors[0] and str(path) in errors[0], out.stderr
    assert "Traceback" not in out.stderr


def _spawn(script: str, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:
        return subprocess.Popen(entry_point_command(script, args), cwd=ROOT, stdout=f,
                                stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))


#: The last line a node logs once warm (the port file is written at bind time, before).
WARM_LINES = ("verifier SERVING", "edge agent warm on")


def _port(proc: subprocess.Popen[bytes], port_file: Path, log: Path) -> int:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}: {log.read_text()[-3000:]}")
        text = log.read_text(errors="replace") if log.exists() else ""
        if port_file.exists() and port_file.read_text() and any(w in text for w in WARM_LINES):
            return int(port_file.read_text())
        time.sleep(0.1)
    raise AssertionError(f"no port or not warm: {log.read_text()[-3000:]}")


def _stop(*procs: subprocess.Popen[bytes] | None) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        if proc is not None:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int, Path]]:
    """A toy cloud and a toy edge over two 1 s toy scenes (source time [0, 2 s))."""
    tmp = tmp_path_factory.mktemp("firsthour")
    cloud = _spawn("eventspec-cloud", ["serve", "--model", "toy", "--port", "0", "--port-file",
                                       str(tmp / "c"), *PACED_CLOUD], tmp / "c.log")
    edge = None
    try:
        cport = _port(cloud, tmp / "c", tmp / "c.log")
        edge = _spawn("eventspec-edge", ["serve", "--cloud", f"127.0.0.1:{cport}", "--source",
                                         "toy:0-2", "--model", "toy", "--port", "0",
                                         "--port-file", str(tmp / "e")], tmp / "e.log")
        eport = _port(edge, tmp / "e", tmp / "e.log")
        yield cport, eport, tmp
    finally:
        _stop(edge, cloud)


def _ask_json(eport: int, *args: str) -> dict[str, object]:
    out = _run("eventspec", ["ask", "--edge", f"127.0.0.1:{eport}", "--json",
                             "--max-new-tokens", "8", *args, "Which way is the object moving?"])
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_edge_pointed_at_the_cloud_says_which_service_it_is(
    nodes: tuple[int, int, Path],
) -> None:
    cport, _, _ = nodes
    out = _run("eventspec", ["ask", "--edge", f"127.0.0.1:{cport}", "What?"], timeout=60)
    assert out.returncode == 1, out.stderr
    assert "does not serve the eventspec.v1.EdgeAgent service" in out.stderr
    assert "cloud verifier" in out.stderr and "Traceback" not in out.stderr


def test_an_edge_started_on_the_clouds_port_names_the_busy_port(
    nodes: tuple[int, int, Path],
) -> None:
    """Binds are exclusive (no SO_REUSEPORT): a second server on a taken port must fail
    at start-up, saying which port, instead of sharing it and splitting the traffic. The
    port is tried before any model work: a usage error, one line, exit 2 (issue 38)."""
    cport, _, _ = nodes
    out = _run("eventspec-edge", ["serve", "--cloud", f"127.0.0.1:{cport}", "--source", "toy",
                                  "--model", "toy", "--port", str(cport)], timeout=120)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert f"--port {cport}: 127.0.0.1:{cport} is in use" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr


def test_json_carries_plan_window_and_null_rates_for_target_only(
    nodes: tuple[int, int, Path],
) -> None:
    _, eport, _ = nodes
    result = _ask_json(eport, "--mode", "target_only")
    stats = result["stats"]
    assert isinstance(stats, dict)
    assert stats["drafted"] == 0 and stats["acceptance_rate"] is None
    assert stats["mean_accepted_length"] is None and stats["hidden_acceptance_rate"] is None
    window = result["window"]
    assert window == {"clip_t0_us": 1_000_000, "clip_t1_us": 2_000_000,
                      "event_t0_us": 1_950_000, "event_t1_us": 2_000_000,
                      "num_events": window["num_events"]}  # type: ignore[index]
    assert isinstance(result["plan"], dict) and "reason" in result["plan"]


def test_a_time_range_and_a_clip_longer_than_the_recording(
    nodes: tuple[int, int, Path],
) -> None:
    _, eport, _ = nodes
    first = _ask_json(eport, "--from-ms", "0", "--to-ms", "1000", "--event-window-ms", "40")
    assert first["window"]["clip_t0_us"] == 0  # type: ignore[index]
    assert first["window"]["clip_t1_us"] == 1_000_000  # type: ignore[index]
    assert first["window"]["event_t0_us"] == 960_000  # type: ignore[index]
    # The recording holds 2000 ms: 2001 ms (and anything longer) is the whole of it.
    for clip in ("2001", "2147483647"):
        whole = _ask_json(eport, "--clip-ms", clip)
        assert whole["window"]["clip_t0_us"] == 0  # type: ignore[index]
        assert whole["window"]["clip_t1_us"] == 2_000_000  # type: ignore[index]
    outside = _run("eventspec", ["ask", "--edge", f"127.0.0.1:{eport}", "--from-ms", "1500",
                                 "--to-ms", "2500", "What?"])
    assert outside.returncode == 2 and "INVALID_ARGUMENT" in outside.stderr
    assert "outside the source" in outside.stderr


def test_a_real_ask_loads_no_torch_and_nothing_of_the_nodes(
    nodes: tuple[int, int, Path],
) -> None:
    """The whole of ``eventspec ask`` against live nodes, not only its imports: any lazy
    import on the way (streaming, the table, --json) would show up here."""
    import sys

    _, eport, _ = nodes
    probe = ("import sys\nfrom eventspec.shared.client.cli import main\n"
             "code = main(['ask', '--edge', "
             f"'127.0.0.1:{eport}', '--json', '--max-new-tokens', '4', 'What is moving?'])\n"
             "heavy = sorted(m for m in ('torch', 'transformers', 'eventspec.edge', "
             "'eventspec.cloud', 'eventspec.demoworld') if m in sys.modules)\n"
             "print(repr(heavy), file=sys.stderr)\nraise SystemExit(code)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["answer"]
    assert out.stderr.strip().splitlines()[-1] == "[]", out.stderr


def test_a_closed_pipe_ends_quietly(nodes: tuple[int, int, Path]) -> None:
    _, eport, _ = nodes
    proc = subprocess.Popen(
        entry_point_command("eventspec", ["ask", "--edge", f"127.0.0.1:{eport}",
                                          "--max-new-tokens", "8", "What is moving?"]),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first byte (``| head -0``)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_plain_streaming_off_a_terminal(nodes: tuple[int, int, Path]) -> None:
    _, eport, _ = nodes
    out = _run("eventspec", ["ask", "--edge", f"127.0.0.1:{eport}", "--max-new-tokens", "12",
                             "Which way is the object moving?"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("It is moving")
    assert "\x1b" not in out.stdout and "\r" not in out.stdout
    assert any(ln.strip().startswith("acceptance rate") for ln in lines)


def _ask_on_a_terminal(eport: int, *flags: str, **env: str) -> str:
    """What ``eventspec ask`` writes to a pseudo-terminal (TERM=xterm), escapes and all."""
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        entry_point_command("eventspec", ["ask", "--edge", f"127.0.0.1:{eport}",
                                          "--max-new-tokens", "8", *flags,
                                          "Which way is the object moving?"]),
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE,
        env={**{k: v for k, v in os.environ.items() if k != "NO_COLOR"}, "TERM": "xterm",
             **env},
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # EIO: the command closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else ""
    return b"".join(chunks).decode()


def test_a_terminal_gets_the_live_view_and_no_color_turns_styling_off(
    nodes: tuple[int, int, Path],
) -> None:
    _, eport, _ = nodes
    muted, redraw = "\x1b[2m", "\r\x1b[J"
    styled = _ask_on_a_terminal(eport)
    assert styled.startswith(f"{redraw}{muted}waiting for the cloud…"), styled[:80]
    assert styled.count(redraw) >= 3  # waiting, then each commit redrawn in place
    assert "It is moving" in styled and "acceptance rate" in styled
    for plain in (_ask_on_a_terminal(eport, "--no-color"),
                  _ask_on_a_terminal(eport, NO_COLOR="1")):
        assert plain.startswith(f"{redraw}waiting for the cloud…"), plain[:80]
        assert muted not in plain and "\x1b[0m" not in plain
        assert plain.count(redraw) >= 3 and "It is moving" in plain


def test_a_cloud_of_another_vocabulary_is_a_loud_warning(
    nodes: tuple[int, int, Path],
) -> None:
    cport, _, tmp = nodes
    log = tmp / "mismatch.log"
    edge = _spawn("eventspec-edge", ["serve", "--cloud", f"127.0.0.1:{cport}", "--source",
                                     "toy", "--model", "tiny-random", "--port", "0",
                                     "--port-file", str(tmp / "m")], log)
    try:
        eport = _port(edge, tmp / "m", log)
        text = log.read_text()
        assert "WARNING" in text and "VOCABULARY MISMATCH" in text, text[-3000:]
        # Target-only still works against it.
        result = _ask_json(eport, "--mode", "target_only")
        assert result["mode"] == "target_only"
    finally:
        _stop(edge)


def test_ctrl_c_ends_with_one_line_and_status_130() -> None:
    import socket

    with socket.socket() as silent:  # accepts, never answers: the ask hangs until ^C
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        proc = subprocess.Popen(
            entry_point_command("eventspec", ["ask", "--edge", f"127.0.0.1:{port}", "What?"]),
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        # ^C once the ask is under way: its channel has connected to the silent server.
        silent.settimeout(60)
        try:
            conn, _ = silent.accept()
        except TimeoutError:
            proc.kill()
            raise AssertionError(f"the ask never connected: {proc.communicate()}") from None
        with conn:  # held open: the ask waits for an answer that never comes
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["eventspec ask: interrupted"], err
    assert out == ""


def test_the_docs_python_client_runs_as_a_file(nodes: tuple[int, int, Path]) -> None:
    import re
    import sys

    _, eport, tmp = nodes
    doc = (ROOT / "docs" / "reference" / "client.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", doc, flags=re.S)
    assert snippet is not None
    script = tmp / "ask.py"
    script.write_text(snippet.group(1).replace("127.0.0.1:50062", f"127.0.0.1:{eport}"))
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("It is moving "), out.stdout
