"""Helpers of ``bench_reliability``: commands run as a user runs them, timed, and read for
what a user sees (exit status, stderr lines, raw gRPC lines, tracebacks); nodes started
through their entry points; a node's log read for its lines about its cloud; and the one
record every measurement becomes.

A record (:func:`check`) is ``{"item", "what", "figure", "expect", "met", "raw"}``:
``figure`` the measured value as a reader reads it, ``expect`` what issue 38 asks for,
``met`` whether the figure meets it (None: not measured, ``figure`` says why), ``raw``
the numbers behind the figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import itertools
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from eventspec.shared.client.launch import entry_point_command, start_node, wait_for_port

ROOT = Path(__file__).resolve().parent.parent
#: A user's environment: importing eventspec set GRPC_VERBOSITY in this process.
USER_ENV = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
#: gRPC's C core writing to stderr itself ("E1128 04:45:28.717914 3224 add_port.cc:83] ...").
RAW_GRPC_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d", re.M)
#: A node's log line: "2026-11-28 17:35:30,975 INFO eventspec.edge.server: message".
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) ([\w.]+): (.*)$")
#: The last line a node logs once warm.
WARM_LINES = ("verifier SERVING", "edge agent warm on")


#: (machine path, what the record says instead): the run's scratch and data folders.
SHORT: list[tuple[str, str]] = []


def clip(text: str, width: int = 240) -> str:
    """``text`` cut at a word boundary (a flag cut in half would read as another flag)."""
    return text if len(text) <= width else text[:width].rsplit(" ", 1)[0] + " …"


def short(text: str) -> str:
    for path, name in SHORT:
        text = text.replace(path, name)
    return text


def check(item: int, what: str, figure: str, expect: str, met: bool | None,
          **raw: Any) -> dict[str, Any]:
    """One measurement as the JSON records it (machine paths named as in :data:`SHORT`)."""
    return {"item": item, "what": short(what), "figure": short(figure), "expect": expect,
            "met": met, "raw": raw}


@dataclass
class Ran:
    """A command's outcome as a user sees it."""

    seconds: float
    rc: int
    stderr: str

    @property
    def lines(self) -> list[str]:
        return [ln for ln in self.stderr.splitlines() if ln.strip()]

    @property
    def raw_grpc(self) -> bool:
        return bool(RAW_GRPC_LINE.search(self.stderr))

    @property
    def traceback(self) -> bool:
        return "Traceback" in self.stderr

    def first(self, width: int = 240) -> str:
        return clip(self.lines[0], width) if self.lines else ""

    def last(self, width: int = 240) -> str:
        return clip(self.lines[-1], width) if self.lines else ""

    def facts(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 2), "exit": self.rc,
                "stderr_lines": len(self.lines), "raw_grpc_line": self.raw_grpc,
                "traceback": self.traceback, "first_line": self.first()}


async def run_cli(script: str, args: Sequence[str], *, timeout_s: float = 120,
                  closed_stdout: bool = False) -> Ran:
    """``script ARGS`` as a process in a user's environment, timed from spawn to exit.
    ``closed_stdout``: its stdout is a pipe whose reader has gone (``cmd | head`` once
    head exited), so its first write fails."""
    stdout: int = asyncio.subprocess.DEVNULL
    write_end = -1
    if closed_stdout:
        read_end, write_end = os.pipe()
        os.close(read_end)
        stdout = write_end
    started = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *entry_point_command(script, args), cwd=ROOT, stdout=stdout,
            stderr=asyncio.subprocess.PIPE, env=USER_ENV)
    finally:
        if write_end >= 0:
            os.close(write_end)
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        _, err = await proc.communicate()
    assert proc.returncode is not None
    return Ran(time.monotonic() - started, proc.returncode, err.decode(errors="replace"))


def usage_check(item: int, what: str, ran: Ran, *needles: str, code: int = 2,
                within_s: float = 1.0) -> dict[str, Any]:
    """A refusal: exit ``code`` in under ``within_s``, one stderr line holding every
    needle, no raw gRPC line, no traceback."""
    said = ran.last()  # the error, after any log lines
    met = (ran.rc == code and ran.seconds < within_s and len(ran.lines) == 1
           and not ran.raw_grpc and not ran.traceback and all(n in ran.stderr for n in needles))
    figure = (f"exit {ran.rc} in {ran.seconds:.2f} s, {len(ran.lines)} line(s)"
              + (", raw gRPC line" if ran.raw_grpc else "")
              + (", traceback" if ran.traceback else "") + f": {said}")
    return check(item, what, figure, f"exit {code} in < {within_s:g} s, one line"
                 + (f" saying {' … '.join(needles)!r}" if needles else "")
                 + ", no raw gRPC line", met, **ran.facts())


class Nodes:
    """Node processes started in ``tmp`` through their entry points; all stopped at exit."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def log(self, name: str) -> Path:
        return self.tmp / f"{name}.log"

    async def start(self, name: str, script: str, args: Sequence[str], *, warm: bool = True,
                    timeout_s: float = 180) -> int:
        """Start ``script serve ARGS --port-file ...``; its port, once warm (or bound). A
        calibration profile of its own (unless ARGS name one), not the user's cache."""
        port_file = self.tmp / f"{name}.port"
        own = [] if "--profile" in args else ["--profile", str(self.tmp / f"{name}.profile")]
        proc = start_node(script, ["serve", *args, *own, "--port-file", str(port_file)],  # type: ignore[arg-type]
                          self.log(name))
        self.procs[name] = proc
        port = await wait_for_port(proc, port_file, self.log(name), timeout_s)
        if warm:
            await self.wait_text(name, WARM_LINES, timeout_s)
        return port

    async def wait_text(self, name: str, texts: Sequence[str], timeout_s: float = 120) -> float:
        """Seconds until the node's log holds one of ``texts``."""
        started = time.monotonic()
        while not any(t in self.log(name).read_text(errors="replace") for t in texts):
            proc = self.procs[name]
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode}: "
                                   f"{self.log(name).read_text()[-2000:]}")
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"{name}: none of {texts} in {timeout_s:g} s")
            await asyncio.sleep(0.05)
        return time.monotonic() - started

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def nodes(tmp: Path) -> Iterator[Nodes]:
    n = Nodes(tmp)
    try:
        yield n
    finally:
        n.stop_all()


def log_records(text: str) -> list[tuple[float, str, str, str]]:
    """(epoch seconds, level, logger, message) of each line of a node's log."""
    out = []
    for line in text.splitlines():
        m = LOG_LINE.match(line)
        if m:
            when = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append((when, m.group(2), m.group(3), m.group(4)))
    return out


#: The longest a cloud's warm-up can go unseen by an edge that was refused before: one
#: watcher poll (0.5 s) plus the channel's longest reconnect backoff (1 s).
POLL_AND_BACKOFF_S = 1.5


def warm_up_s(cloud_log: str) -> float | None:
    """Seconds from a cloud's "verifier listening" line to its "verifier SERVING" line."""
    marks = {msg.split(" ", 2)[1]: when for when, _, _, msg in log_records(cloud_log)
             if msg.startswith(("verifier listening", "verifier SERVING"))}
    if "listening" in marks and "SERVING" in marks:
        return marks["SERVING"] - marks["listening"]
    return None


def cloud_log_rate(text: str, t0: float, t1: float) -> dict[str, Any]:
    """The edge's lines about its cloud (those that say "cloud") logged in [t0, t1] (epoch
    seconds): their count, the rate a minute, the count summaries ("(repeated N times in
    T s)"), how many lines repeat the line before them, and whether any says "backend
    unhealthy" (the old wording, whatever the cause). Expected of a rate-limited log: no
    repeat, and summaries at most once a minute per condition plus one per change."""
    mine = [(w, lvl, msg) for w, lvl, name, msg in log_records(text)
            if t0 <= w <= t1 and name.startswith("eventspec.edge") and "cloud" in msg.lower()]
    all_lines = sum(1 for w, *_ in log_records(text) if t0 <= w <= t1)
    firsts = [msg for _, _, msg in mine if "(repeated " not in msg]
    summaries = [msg for _, _, msg in mine if "(repeated " in msg]
    repeats = sum(1 for a, b in itertools.pairwise(firsts) if a == b)
    minutes = max(t1 - t0, 1e-9) / 60
    allowed = len(firsts) + int(minutes) + 1
    return {"window_s": round(t1 - t0, 1), "edge_lines": all_lines,
            "cloud_lines": len(mine), "cloud_lines_per_min": round(len(mine) / minutes, 1),
            "edge_lines_per_min": round(all_lines / minutes, 1),
            "warnings": sum(1 for _, lvl, _ in mine if lvl in ("WARNING", "ERROR")),
            "repeated_lines": repeats, "summaries": summaries[:6],
            "backend_unhealthy": any("backend unhealthy" in msg for _, _, msg in mine),
            "rate_limited": repeats == 0 and len(summaries) <= allowed,
            "lines": [clip(msg, 200) for _, _, msg in mine[:12]]}


@contextlib.contextmanager
def http_server() -> Iterator[int]:
    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # the bench's output is its records
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
