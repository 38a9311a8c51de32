"""Issue 38's closing figures: each Deliver item measured with the real processes, the way
a user starts and calls them (``eventspec-edge serve``, ``eventspec-cloud serve``,
``eventspec ...``; toy models, loopback), against what the issue asks for.

1. A damaged AEDAT4 recording (the real DVXplorer file with 2,000 seeded random bytes over
   one packet, in a temporary copy): seconds from ``eventspec ask`` to INVALID_ARGUMENT
   and what it names, ``eventspec status`` meanwhile, another Ask, and seconds from
   SIGTERM to exit while a damaged window decodes.
2. Forced wrong kinds and a renamed AEDAT4 file.
3. Usage and source errors on every command: seconds to exit, exit status, stderr lines,
   raw gRPC lines.
4. ``eventspec wait`` where nothing listens, at another gRPC service, at an HTTP server.
5. The edge's log lines a minute while its cloud comes up and warms, with an unreachable
   cloud, and with ``--cloud`` at another edge.
6. A plaintext client at a TLS edge, and commands whose stdout is closed (``| head``).
7. The RTT a real Ask's plan uses, the timeline's clocks, plans that speculate.

    python -m benchmarks.bench_reliability --out benchmarks/results/reliability-cpu.json

Every record is ``{item, what, figure, expect, met, raw}`` (``reliability_probe.check``).
The real recordings are read from ``--data`` (default ``../shared/data/real`` beside the
checkout); without them items 1 and 2's file cases are recorded as skipped. About 4 min
on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import reliability_probe as rp
from benchmarks.reliability_probe import check, nodes, run_cli
from benchmarks.stamp import write_result
from eventspec.shared.client.answer_view import speculation_note
from eventspec.shared.client.edge_client import EdgeClient
from eventspec.shared.contract.types import AskSpec, GenerationSettings, Mode
from eventspec.shared.wire.host import GrpcHost
from tests.support.ports import refusing_port
from tests.support.tls_harness import make_pki

DVX = "aedat4_dvxplorer_tonic_test_sample.aedat4"
DAT = "dat_ncars_tonic_test_sample.dat"
#: Where the damage goes: inside the packets 250..300 ms into the DVXplorer recording.
DAMAGE_AT, DAMAGE_BYTES, SEED = 500_000, 2_000, 1
T_FIRST = 1605537493718345  # its first event, µs
BAD = (T_FIRST + 250_000, T_FIRST + 300_000)
WINDOW_DEADLINE_S = 4.0  # edge/events/aedat4.py's per-window deadline
GRACE_S = 5.0  # the edge's --grace-s default (its drain timeout)
PACE = ["--emulate-prefill-ms", "50", "--emulate-step-ms", "10"]
EDGE = ["--model", "toy", "--port", "0"]
Records = list[dict[str, Any]]


def ask_args(port: int, *extra: str) -> list[str]:
    return ["ask", "--edge", f"127.0.0.1:{port}", "--mode", "draft_only", "--max-new-tokens",
            "4", "--timeout", "20", *extra, "What is moving?"]


def window(a_us: int, b_us: int) -> list[str]:
    return ["--from-ms", str(a_us / 1000), "--to-ms", str(b_us / 1000), "--event-window-ms",
            str((b_us - a_us) // 1000)]


def damaged_copy(src: Path, out: Path) -> Path:
    data = bytearray(src.read_bytes())
    rng = np.random.default_rng(SEED)
    data[DAMAGE_AT:DAMAGE_AT + DAMAGE_BYTES] = rng.integers(0, 256, DAMAGE_BYTES,
                                                            dtype=np.uint8).tobytes()
    out.write_bytes(bytes(data))
    return out


async def item1(data: Path, tmp: Path) -> Records:
    if not (data / DVX).is_file():
        return [check(1, "damaged AEDAT4", f"skipped: {DVX} not under --data", "—", None)]
    path = damaged_copy(data / DVX, tmp / "damaged.aedat4")
    out: Records = []
    with nodes(tmp) as n:
        port = await n.start("damaged", "eventspec-edge", ["--source", str(path), *EDGE])
        asking = asyncio.create_task(run_cli("eventspec", ask_args(port, *window(*BAD))))
        await asyncio.sleep(0.8)  # the Ask reaches the decoder
        status = await run_cli("eventspec", ["status", f"127.0.0.1:{port}"])
        during = not asking.done()
        ask = await asking
        named = str(path) in ask.stderr and f"[{BAD[0]}, {BAD[1]}) µs" in ask.stderr
        bound = WINDOW_DEADLINE_S + 2
        out.append(check(1, "Ask over the damaged window",
                         f"exit {ask.rc} in {ask.seconds:.2f} s, INVALID_ARGUMENT "
                         f"{'naming' if named else 'NOT naming'} the file and µs range",
                         f"INVALID_ARGUMENT naming file and range within {bound:g} s (window "
                         f"deadline {WINDOW_DEADLINE_S:g} s + 2 s)",
                         ask.rc == 2 and "INVALID_ARGUMENT" in ask.stderr and named
                         and ask.seconds <= bound, **ask.facts()))
        out.append(check(1, "eventspec status while it decodes",
                         f"exit {status.rc} in {status.seconds:.2f} s, "
                         f"{'before' if during else 'after'} the Ask ended",
                         "answers (exit 0) while the Ask is still decoding",
                         status.rc == 0 and during, **status.facts()))
        good = await run_cli("eventspec", ask_args(port))
        out.append(check(1, "another Ask (intact window) after it",
                         f"exit {good.rc} in {good.seconds:.2f} s", "answered (exit 0)",
                         good.rc == 0, **good.facts()))
        spin = asyncio.create_task(run_cli("eventspec", ask_args(
            port, *window(T_FIRST + 265_000, T_FIRST + 295_000))))
        await run_cli("eventspec", ["status", f"127.0.0.1:{port}"])  # the Ask reaches it
        proc = n.procs["damaged"]
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        while proc.poll() is None and time.monotonic() - started < 60:
            await asyncio.sleep(0.02)
        took = time.monotonic() - started
        out.append(check(1, "SIGTERM while a damaged window decodes",
                         f"exit {proc.poll()} {took:.2f} s after SIGTERM",
                         f"stops within its drain timeout (--grace-s {GRACE_S:g} s, the Ask "
                         "in flight may run that long) + 0.5 s to exit (was 30+ s, kill -9)",
                         proc.poll() == 0 and took <= GRACE_S + 0.5, seconds=round(took, 2),
                         exit=proc.poll()))
        await spin
    return out


async def item2(data: Path, tmp: Path) -> Records:
    if not (data / DVX).is_file() or not (data / DAT).is_file():
        return [check(2, "forced kinds", f"skipped: {DVX} or {DAT} not under --data", "—",
                      None)]
    serve = ["serve", "--model", "toy"]
    out = [rp.usage_check(2, f"edge serve --source bin:{DAT}",
                 await run_cli("eventspec-edge", [*serve, "--source", f"bin:{data / DAT}"]),
                 "does not look like bin (it looks like dat"),
           rp.usage_check(2, f"edge serve --source dat:{DVX}",
                 await run_cli("eventspec-edge", [*serve, "--source", f"dat:{data / DVX}"]),
                 "does not look like dat (it looks like aedat4")]
    renamed = tmp / "recording.bin"
    shutil.copyfile(data / DVX, renamed)
    with nodes(tmp) as n:
        started = time.monotonic()
        port = await n.start("renamed", "eventspec-edge", ["--source", str(renamed), *EDGE])
        warm = time.monotonic() - started
        async with EdgeClient(f"127.0.0.1:{port}", timeout_s=30) as client:
            status = await client.status()
        ask = await run_cli("eventspec", ask_args(port))
    said = f"{status.source} ({status.source_format})"
    out.append(check(2, "an AEDAT4 file renamed .bin (bare path)",
                     f"warm in {warm:.1f} s, Ask exit {ask.rc}; source: {said}",
                     "read as AEDAT4: the edge serves it and an Ask answers",
                     ask.rc == 0 and "aedat4" in status.source_format.lower(),
                     warm_s=round(warm, 2), ask=ask.facts(), source=said))
    return out


async def item3(data: Path, tmp: Path) -> Records:
    npy = data / "npy_eventgpt_samples_sample1.npy"
    truncated = tmp / "truncated.npy"
    if npy.is_file():
        truncated.write_bytes(npy.read_bytes()[: npy.stat().st_size // 2])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        b = str(busy.getsockname()[1])
        cases: list[tuple[str, str, list[str], tuple[str, ...]]] = [
            ("edge", "missing file", ["--source", "/nope/x.dat"], ("does not exist",)),
            ("edge", "unknown kind", ["--source", "foo:x.dat"], ("unknown event source",)),
            ("edge", "--host 0.0.0.0 without TLS", ["--host", "0.0.0.0"], ("plaintext",)),
            ("edge", "busy --port", ["--port", b], ("is in use",)),
            ("edge", "busy --health-port", ["--port", "0", "--health-port", b], ("in use",)),
            ("edge", "missing --model directory", ["--model", "/nope/model"], ("/nope/model",)),
            ("cloud", "--host 0.0.0.0 without TLS", ["--host", "0.0.0.0"], ("plaintext",)),
            ("cloud", "busy --port", ["--port", b], ("is in use",)),
            ("cloud", "--max-sessions -3", ["--max-sessions", "-3"], ("--max-sessions",)),
            ("cloud", "missing --model directory", ["--model", "/nope/model"],
             ("/nope/model",)),
        ]
        if npy.is_file():
            cases.append(("edge", "truncated pickled .npy", ["--source", f"npy:{truncated}",
                                                              "--allow-pickle"],
                          (str(truncated),)))
        out = []
        for node, what, args, needles in cases:
            model = [] if "--model" in args else ["--model", "toy"]
            ran = await run_cli(f"eventspec-{node}", ["serve", *model, *args], timeout_s=60)
            out.append(rp.usage_check(3, f"{node} serve: {what}", ran, *needles))
    client = [("ask --max-new-tokens -1", ["ask", "--max-new-tokens", "-1", "x"]),
              ("ask --from-ms without --to-ms", ["ask", "--from-ms", "5", "x"]),
              ("status without an address", ["status"]),
              ("status 127.0.0.1:notaport", ["status", "127.0.0.1:notaport"]),
              ("wait nohost", ["wait", "nohost"]),
              ("demo --runs 0", ["demo", "--runs", "0"]),
              ("toy eval --nope", ["toy", "eval", "--nope"])]
    for what, args in client:
        out.append(rp.usage_check(3, f"eventspec {what}", await run_cli("eventspec", args)))
    return out


async def item4() -> Records:
    out = []
    with refusing_port() as port:
        ran = await run_cli("eventspec", ["wait", f"127.0.0.1:{port}"], timeout_s=120)
    out.append(check(4, "wait: nothing listens (no --retry-refused)",
                     f"exit {ran.rc} after {ran.seconds:.1f} s: {ran.last()}",
                     "exit 3 after the connect budget (30 s), not the --timeout (600 s)",
                     ran.rc == 3 and ran.seconds <= 35, **ran.facts()))
    host = GrpcHost("not.eventspec.Thing", max_message_bytes=1 << 20, max_rpcs=8)
    other = await host.start("127.0.0.1", 0)
    await host.set_serving(True)
    try:
        ran = await run_cli("eventspec", ["wait", f"127.0.0.1:{other}"], timeout_s=120)
    finally:
        await host.stop(0)
    with rp.http_server() as web:
        ran2 = await run_cli("eventspec", ["wait", f"127.0.0.1:{web}"], timeout_s=120)
    for what, r in (("another gRPC service (health SERVING)", ran), ("an HTTP server", ran2)):
        out.append(check(4, f"wait: {what}", f"exit {r.rc} after {r.seconds:.2f} s: "
                         f"{r.last()}", "exit 3 at once (< 5 s), not after --timeout",
                         r.rc == 3 and r.seconds < 5, **r.facts()))
    return out


def log_check(what: str, rate: dict[str, Any], cause: str, before: str) -> dict[str, Any]:
    met = rate["rate_limited"] and not rate["backend_unhealthy"] and any(
        cause in ln for ln in rate["lines"])
    return check(5, what, f"{rate['cloud_lines']} lines about the cloud in "
                 f"{rate['window_s']:g} s ({rate['cloud_lines_per_min']:g}/min; all lines "
                 f"{rate['edge_lines_per_min']:g}/min), {rate['repeated_lines']} repeated",
                 f"once per cause naming it ({cause!r}), then a count once a minute; "
                 f"no 'backend unhealthy' (before: {before})", met, **rate)


async def item5(tmp: Path, unreachable_s: float, watch_s: float) -> Records:
    out = []
    with nodes(tmp) as n:  # (a) the edge first, its cloud later on the same port
        cport = rp.free_port()
        t0 = time.time()
        await n.start("edge-a", "eventspec-edge", [*EDGE, "--cloud", f"127.0.0.1:{cport}"],
                      warm=False)
        await asyncio.sleep(unreachable_s)
        bound = time.time()
        await n.start("cloud-a", "eventspec-cloud", [
            "--model", "toy", "--port", str(cport), "--recalibrate", "--profile",
            str(tmp / "cloud.profile")], warm=False)
        await n.wait_text("edge-a", [f"cloud 127.0.0.1:{cport} ready"], 300)
        t1 = time.time()
        text = n.log("edge-a").read_text(errors="replace")
        warm_s = rp.warm_up_s(n.log("cloud-a").read_text(errors="replace"))
    rate = rp.cloud_log_rate(text, t0, t1)
    warming = rp.cloud_log_rate(text, bound, t1)
    out.append(log_check(f"edge log: cloud down {unreachable_s:g} s, then starting and "
                         f"warming until ready", rate, "warming up",
                         "55 lines in 14 s while it warmed"))
    # A warm-up shorter than a poll (0.5 s) plus the channel's reconnect backoff (at most
    # 1 s) after the refusals may pass unseen: then no line can name it, and none should.
    unseen = warm_s is not None and warm_s < rp.POLL_AND_BACKOFF_S
    if not out[-1]["met"] and unseen and rate["rate_limited"] and not rate["backend_unhealthy"]:
        out[-1]["met"] = True
    out[-1]["figure"] += (f"; from the cloud's start to ready ({warming['window_s']:g} s): "
                          f"{warming['cloud_lines']} lines about it; its warm-up after "
                          f"binding {warm_s if warm_s is None else round(warm_s, 1)} s"
                          + (" (shorter than a poll and a reconnect: no poll saw it)"
                             if unseen and not any("warming up" in ln for ln in rate["lines"])
                             else ""))
    out[-1]["raw"]["while_warming"] = {k: warming[k] for k in (
        "window_s", "cloud_lines", "cloud_lines_per_min", "edge_lines", "lines")}
    with refusing_port() as dead, nodes(tmp) as n:  # (b) and (c), side by side
        t0 = time.time()
        x = await n.start("edge-b", "eventspec-edge", [*EDGE, "--cloud", f"127.0.0.1:{dead}"],
                          warm=False)
        await n.start("edge-c", "eventspec-edge", [*EDGE, "--cloud", f"127.0.0.1:{x}"],
                      warm=False)
        await asyncio.sleep(watch_s - (time.time() - t0))
        t1 = time.time()
    stopped = time.time()
    for name, what, cause, before in (
            ("edge-b", "unreachable cloud (nothing listens)", "connection refused",
             "225 lines in 90 s"),
            ("edge-c", "--cloud at another edge", "not an eventspec Verifier",
             "129 ERROR + 176 WARNING lines in 90 s")):
        text = n.log(name).read_text(errors="replace")
        rate = rp.cloud_log_rate(text, t0, t1)
        rate["summaries"] = rp.cloud_log_rate(text, t0, stopped)["summaries"]  # with stop
        out.append(log_check(f"edge log: {what}", rate, cause, before))
    return out


async def item6_7(tmp: Path, asks: int) -> Records:
    out = []
    pki = make_pki(tmp)
    with nodes(tmp) as n:
        port = await n.start("tls-edge", "eventspec-edge", [
            *EDGE, "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key)])
        for what, args, code in (
                ("ask", ask_args(port), 1), ("status", ["status", f"127.0.0.1:{port}"], 1),
                ("wait", ["wait", f"127.0.0.1:{port}"], 3)):
            ran = await run_cli("eventspec", args)
            hinted = "add --tls" in ran.stderr
            out.append(check(6, f"plaintext {what} at a TLS edge",
                             f"exit {ran.rc} in {ran.seconds:.2f} s, hint "
                             f"{'given' if hinted else 'MISSING'}: {ran.last()}",
                             f"exit {code} with the hint 'add --tls', no raw gRPC line or "
                             "traceback", ran.rc == code and hinted and not ran.raw_grpc
                             and not ran.traceback, **ran.facts()))
    with nodes(tmp) as n:
        cloud = await n.start("cloud", "eventspec-cloud", ["--model", "toy", "--port", "0",
                                                            *PACE])
        port = await n.start("edge", "eventspec-edge", [*EDGE, "--cloud",
                                                        f"127.0.0.1:{cloud}"])
        address = f"127.0.0.1:{port}"
        for what, args in (("status", ["status", address]),
                           ("status --json", ["status", address, "--json"]),
                           ("ask", ask_args(port)), ("demo --runs 1", ["demo", "--runs", "1"])):
            ran = await run_cli("eventspec", args, closed_stdout=True, timeout_s=300)
            out.append(check(6, f"{what} into a closed pipe (| head)",
                             f"exit {ran.rc} in {ran.seconds:.2f} s"
                             + (", traceback" if ran.traceback else ", no traceback"),
                             "exit 141 (as ask), no traceback", ran.rc == 141
                             and not ran.traceback and "BrokenPipeError" not in ran.stderr,
                             **ran.facts()))
        out += await item7(address, asks)
    return out


async def item7(address: str, asks: int) -> Records:
    rtts, early, silent, spec, runs = [], 0, 0, 0, []
    async with EdgeClient(address, timeout_s=60) as client:
        for i in range(asks):
            mode = Mode.TARGET_ONLY if i % 3 == 2 else Mode.SPECULATIVE
            final = await client.ask_final(AskSpec(
                question="Which way is the object moving?", mode=mode, timeline=True,
                generation=GenerationSettings(max_new_tokens=16)))
            assert final.plan is not None and final.timeline is not None
            m = re.search(r"rtt ([\d.]+) ms", final.plan.reason)
            rtts.append(float(m.group(1)) if m else float("nan"))
            events = final.timeline.events
            opened = min(e.start_ms for e in events if e.lane == "edge.uplink")
            before = sum(1 for e in events if e.lane.startswith("cloud.")
                         and e.start_ms < opened)
            early += before
            said = final.plan.speculate and mode == Mode.SPECULATIVE
            spec += said
            silent += said and not final.stats.drafted and speculation_note(final) is None
            runs.append({"mode": mode.name, "plan_rtt_ms": rtts[-1], "speculate": said,
                         "drafted": final.stats.drafted, "cloud_events_before_open": before,
                         "clock_sync": final.timeline.clock_sync})
        status = await client.status()
    status_rtt = round(status.link.rtt_ms, 3)
    return [
        check(7, "loopback RTT in the plan", f"{max(rtts):g} ms at most over {asks} Asks "
              f"(status: {status_rtt} ms)", "≤ 2 ms on loopback (was 142 and 308 ms)",
              max(rtts) <= 2.0 and status_rtt <= 2.0, plan_rtt_ms=rtts,
              status_rtt_ms=status_rtt, runs=runs),
        check(7, "cloud timeline events before the edge's Open",
              f"{early} over {asks} Asks", "0 (was 4 ms before the Open)", early == 0),
        check(7, "plans that said speculate and drafted 0 without saying why",
              f"{silent} of {spec}", "0: a plan that speculates drafts, or says why not",
              silent == 0)]


async def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=rp.ROOT.parent / "shared" / "data" / "real",
                   help="the real recordings (README there)")
    p.add_argument("--unreachable-s", type=float, default=20.0)
    p.add_argument("--watch-s", type=float, default=75.0)
    p.add_argument("--asks", type=int, default=6)
    p.add_argument("--only", default="1,2,3,4,5,6")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    only = set(args.only.split(","))
    records: Records = []
    with tempfile.TemporaryDirectory(prefix="bench-reliability-") as name:
        tmp = Path(name)
        rp.SHORT[:] = [(str(tmp), "$TMP"), (str(args.data), "$DATA")]
        steps = {"1": lambda: item1(args.data, tmp / "1"), "2": lambda: item2(args.data, tmp / "2"),
                 "3": lambda: item3(args.data, tmp / "3"), "4": item4,
                 "5": lambda: item5(tmp / "5", args.unreachable_s, args.watch_s),
                 "6": lambda: item6_7(tmp / "6", args.asks)}
        for key, step in steps.items():
            if key in only:
                (tmp / key).mkdir()
                got = await step()  # type: ignore[operator]
                for r in got:
                    print(json.dumps({k: r[k] for k in ("item", "what", "figure", "met")}),
                          flush=True)
                records += got
    met = [r["met"] for r in records if r["met"] is not None]
    out = {"machine": os.uname().nodename, "cpus": os.cpu_count(),
           "load_avg_1m_at_start": os.getloadavg()[0], "checks": records,
           "met": sum(met), "measured": len(met),
           "skipped": sum(1 for r in records if r["met"] is None)}
    print(f"{sum(met)} of {len(met)} met", flush=True)
    if args.out is not None:
        write_result(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
