"""``eventspec``: the client's command. ``ask`` questions an edge agent; ``wait`` waits
until a node (edge or cloud) reports SERVING, saying what it is doing meanwhile;
``status`` prints a node's live state.

``demo`` (the whole system on one machine) and ``toy`` (train or evaluate the demo
models) belong to the embedded demo world, ``eventspec.demoworld``: they are imported
only when chosen, so ``eventspec ask`` loads neither torch nor any model code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from eventspec.shared.client.answer_view import (
    AnswerView,
    LiveView,
    PlainView,
    final_to_json,
    finish_note,
    stats_table,
    stream_answer,
    wants_colour,
    wants_live,
    write_timeline,
)
from eventspec.shared.client.ask_args import (
    INT32_MAX,
    MAX_EVENT_WINDOW_MS,
    UINT64_MAX,
    ArgumentProblem,
    check_address,
    check_float_range,
    check_int_range,
    check_temperature,
    time_range_us,
)
from eventspec.shared.client.edge_client import AskError, EdgeClient
from eventspec.shared.contract.types import (
    AskSpec,
    FeatureMode,
    GenerationSettings,
    Mode,
)
from eventspec.shared.helpfmt import DefaultsHelpFormatter, OneLineParser
from eventspec.shared.wire.flags import add_client_security_args, client_security_from_args
from eventspec.shared.wire.health import NeverServing, wait_for_serving

_MODES = {"speculative": Mode.SPECULATIVE, "target_only": Mode.TARGET_ONLY,
          "draft_only": Mode.DRAFT_ONLY}
_FEATURES = {"auto": FeatureMode.AUTO, "frames": FeatureMode.FRAMES,
             "aligned": FeatureMode.ALIGNED}
#: Demo-world commands: name -> help. Each parses its own arguments once chosen.
_HANDED_OVER = {
    "demo": "run cloud + edge locally and ask one question about the demo scene",
    "toy": "train or evaluate the embedded toy-world models",
}
#: Entry-point group of commands that live above the nodes (``toy`` is the demo world's
#: trainer CLI). Found at run time, so the client imports nothing from the floor above.
COMMAND_GROUP = "eventspec.commands"
#: Exit status when stdout's reader went away (``| head -1``), as a SIGPIPE death reads.
EXIT_PIPE_CLOSED = 141


def spec_from_args(args: argparse.Namespace) -> AskSpec:
    """Check every ``ask`` argument and build the request; ArgumentProblem names a flag."""
    if not args.question.strip():
        raise ArgumentProblem("the question is empty")
    check_address("--edge", args.edge)
    if args.clip_ms is not None:
        check_int_range("--clip-ms", args.clip_ms, 1, INT32_MAX)
    window = time_range_us(args.from_ms, args.to_ms, args.clip_ms)
    check_int_range("--event-window-ms", args.event_window_ms, 1, MAX_EVENT_WINDOW_MS - 1,
                    why="EventGPT refuses 100 ms or more")
    check_int_range("--max-new-tokens", args.max_new_tokens, 1, INT32_MAX)
    check_temperature(args.temperature)
    check_float_range("--top-p", args.top_p, 0.0, 1.0, lo_open=True)
    check_int_range("--seed", args.seed, 0, UINT64_MAX)
    check_float_range("--timeout", args.timeout, 0.0, 1e9, lo_open=True, why="seconds")
    return AskSpec(
        question=args.question,
        latest_ms=args.clip_ms,
        t0_us=window[0] if window else None,
        t1_us=window[1] if window else None,
        event_window_ms=args.event_window_ms,
        mode=_MODES[args.mode],
        generation=GenerationSettings(
            max_new_tokens=args.max_new_tokens, temperature=args.temperature,
            top_p=args.top_p, seed=args.seed,
        ),
        feature_mode=_FEATURES[args.feature_mode],
        timeline=args.timeline is not None,
    )


def view_for(args: argparse.Namespace) -> AnswerView | None:
    """Live redraws in a terminal, plain streaming elsewhere, nothing for ``--json``."""
    if args.json:
        return None
    if wants_live(sys.stdout, os.environ):
        return LiveView(colour=wants_colour(args.no_color, os.environ))
    return PlainView()


async def _ask(args: argparse.Namespace, spec: AskSpec, view: AnswerView | None) -> int:
    security = client_security_from_args(args, prefix="", env_prefix="EVENTSPEC_")
    async with EdgeClient(args.edge, timeout_s=args.timeout, security=security) as client:
        try:
            if view is None:
                final = await client.ask_final(spec)
            else:
                label = (" [draft_only: unverified edge output]"
                         if spec.mode == Mode.DRAFT_ONLY else "")
                waiting = ("waiting for the edge…" if spec.mode == Mode.DRAFT_ONLY
                           else "waiting for the cloud…")
                final = await stream_answer(
                    client, spec, sys.stdout, view, waiting=waiting, suffix=label,
                    progress=None if isinstance(view, LiveView) else sys.stderr)
        except AskError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # ^C cancelled the call while gRPC was connecting, and gRPC turned the
                # cancellation into a status: the user interrupted, and that is the
                # answer (asyncio.run then raises KeyboardInterrupt: status 130).
                raise asyncio.CancelledError from exc
            if view is not None:
                sys.stdout.write(view.interrupt())
                sys.stdout.flush()
            print(f"error: {exc}", file=sys.stderr)
            return 2 if exc.code.name == "INVALID_ARGUMENT" else 1
    if view is None:
        print(json.dumps(final_to_json(final)))
    else:
        print(stats_table(final))
    sys.stdout.flush()
    note = finish_note(final, spec.generation.max_new_tokens)
    if note is not None:  # an answer arrived, so still status 0; the line says it is cut
        print(note, file=sys.stderr)
    if args.timeline is not None:
        return write_timeline(final, args.timeline, title=f"{spec.mode.name.lower()}: "
                                                          f"{spec.question[:80]!r}")
    return 0


#: ``eventspec wait``: how long nothing may answer (connection refused or closed) before
#: it gives up, unless ``--retry-refused``. A node binds its port within seconds of its
#: start (before loading models), so half a minute of silence is a wrong address or a
#: node that is not running, not one warming up.
WAIT_CONNECT_BUDGET_S = 30.0
#: ``eventspec wait``'s exit status for a fault that waiting cannot cure.
EXIT_NEVER_SERVING = 3


def _wait(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``eventspec wait HOST:PORT``: 0 once SERVING, 1 on timeout, 3 at once for a fault
    that waiting cannot cure (NeverServing); reasons on stderr, and in a terminal a live
    line counting the seconds."""
    try:
        check_address("address", args.address)
        check_float_range("--timeout", args.timeout, 0.0, 86400.0, lo_open=True)
    except ArgumentProblem as exc:
        parser.exit(2, f"eventspec wait: error: {exc}\n")
    security = client_security_from_args(args, prefix="", env_prefix="EVENTSPEC_")
    live = sys.stderr.isatty()
    shown = [False]

    def say(reason: str) -> None:
        if live and shown[0]:
            sys.stderr.write("\n")  # keep the counter's last line, start the next
        print(f"{args.address}: {reason}", file=sys.stderr, flush=True)
        shown[0] = False

    def tick(waited_s: float, reason: str) -> None:
        if live:
            sys.stderr.write(f"\r  waiting {waited_s:.0f} s: {reason or 'connecting'}\x1b[K")
            sys.stderr.flush()
            shown[0] = True

    def end_line() -> None:
        if live and shown[0]:
            sys.stderr.write("\n")

    try:
        asyncio.run(wait_for_serving(
            args.address, args.timeout, security=security, on_reason=say,
            on_tick=tick, check_identity=True,
            connect_budget_s=None if args.retry_refused else WAIT_CONNECT_BUDGET_S))
    except TimeoutError as exc:
        end_line()
        print(f"eventspec wait: {exc}", file=sys.stderr)
        return 1
    except NeverServing as exc:
        end_line()
        print(f"eventspec wait: giving up: {exc}", file=sys.stderr)
        return EXIT_NEVER_SERVING
    except KeyboardInterrupt:
        end_line()
        print("eventspec wait: interrupted", file=sys.stderr)
        return 130
    end_line()
    print(f"{args.address}: SERVING", file=sys.stderr)
    return 0


def _status(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``eventspec status HOST:PORT``: 0 with the node's live state printed, 1 if unreachable."""
    from eventspec.shared.client.status_view import StatusError, fetch_status, render, to_json

    try:
        check_address("address", args.address)
        check_float_range("--timeout", args.timeout, 0.0, 3600.0, lo_open=True)
    except ArgumentProblem as exc:
        parser.exit(2, f"eventspec status: error: {exc}\n")
    security = client_security_from_args(args, prefix="", env_prefix="EVENTSPEC_")
    try:
        status = asyncio.run(fetch_status(args.address, security=security,
                                          timeout_s=args.timeout))
    except StatusError as exc:
        print(f"eventspec status: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(to_json(status)) if args.json else render(args.address, status))
    return 0


async def _interruptible(work: Coroutine[Any, Any, int]) -> int:
    """``work``, cancelled at once by ^C.

    The loop's own SIGINT handler wakes it whichever thread the signal lands on (gRPC
    runs threads of its own); a plain Python handler ran only once the loop woke for
    another reason, so a ^C during a connection attempt waited for its 20 s timeout and
    the ask then failed instead of stopping.
    """
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    handled = False
    if task is not None:
        try:
            loop.add_signal_handler(signal.SIGINT, task.cancel)
            handled = True
        except (RuntimeError, ValueError, NotImplementedError):
            pass  # not the main thread (main() called from a thread): no ^C to handle
    try:
        return await work
    finally:
        if handled:
            loop.remove_signal_handler(signal.SIGINT)


def build_parser() -> argparse.ArgumentParser:
    """The ``eventspec`` parser; ``--help`` shows every default."""
    parser = OneLineParser(prog="eventspec", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ask = sub.add_parser("ask", help="ask an edge agent a question",
                         formatter_class=DefaultsHelpFormatter)
    ask.add_argument("question", help="the question (the edge caps it at 4096 characters)")
    ask.add_argument("--edge", default="127.0.0.1:50062", help="HOST:PORT of the edge agent")
    ask.add_argument("--mode", choices=sorted(_MODES), default="speculative",
                     help="who answers: speculative (edge drafts, cloud verifies), "
                          "target_only (the cloud alone), draft_only (the edge alone, "
                          "unverified)")
    ask.add_argument("--feature-mode", choices=sorted(_FEATURES), default="auto",
                     help="visual path to the cloud: frames (8 JPEGs), aligned (adapted "
                          "event features), auto (frames when the source has RGB)")
    ask.add_argument("--clip-ms", type=int, default=None,
                     help="the clip is the latest N ms of the source (unset: 1000); a "
                          "source holding less is used whole")
    ask.add_argument("--from-ms", type=float, default=None,
                     help="clip start in the source's clock, ms (with --to-ms; the clock "
                          "--json's window reports)")
    ask.add_argument("--to-ms", type=float, default=None,
                     help="clip end in the source's clock, ms, exclusive (with --from-ms)")
    ask.add_argument("--event-window-ms", type=int, default=50,
                     help="event window at the clip's end, ms, 1..99 (EventGPT refuses "
                          "100 or more)")
    ask.add_argument("--max-new-tokens", type=int, default=64,
                     help="answer tokens at most (>= 1; the cloud caps it, 512 by default)")
    ask.add_argument("--temperature", type=float, default=0.0,
                     help="0 is greedy; > 0 samples (same distribution as the target's)")
    ask.add_argument("--top-p", type=float, default=1.0, help="nucleus mass, in (0, 1]")
    ask.add_argument("--seed", type=int, default=0,
                     help="seed of the sampling generator, 0..2^64-1")
    ask.add_argument("--timeout", type=float, default=300.0, help="deadline of the call, s")
    ask.add_argument("--json", action="store_true", help="print one JSON object at the end")
    ask.add_argument("--no-color", action="store_true",
                     help="no styling in the live view (also: a non-empty $NO_COLOR)")
    ask.add_argument("--timeline", type=Path, default=None, metavar="PNG",
                     help="draw the request's timeline (edge and cloud lanes, one clock) to "
                          "this file; needs matplotlib: pip install 'eventspec[timeline]'")
    add_client_security_args(ask, prefix="", env_prefix="EVENTSPEC_", peer="edge agent")
    wait = sub.add_parser("wait", help="wait until a node reports SERVING (prints what it "
                                       "is doing meanwhile)",
                          description="Wait until a node reports SERVING. Exit status: 0 "
                                      "SERVING; 1 --timeout ran out; 2 a usage error; 3 at "
                                      "once for what waiting cannot cure (nothing listening "
                                      "for 30 s without --retry-refused, a TLS or protocol "
                                      "mismatch, not an eventspec node, a refused token, an "
                                      "edge whose --cloud is wrong); 130 interrupted.",
                          formatter_class=DefaultsHelpFormatter)
    wait.add_argument("address", help="HOST:PORT of an edge agent or a cloud verifier")
    wait.add_argument("--timeout", type=float, default=600.0,
                      help="give up after this many seconds (exit 1)")
    wait.add_argument("--retry-refused", action="store_true",
                      help="keep trying while nothing listens at the address (a node not "
                           f"started yet); without it, wait gives up (exit "
                           f"{EXIT_NEVER_SERVING}) after {WAIT_CONNECT_BUDGET_S:.0f} s of "
                           "refused connections")
    add_client_security_args(wait, prefix="", env_prefix="EVENTSPEC_", peer="node")
    status = sub.add_parser("status", help="print a node's live state: an edge agent's "
                                           "GetStatus or a cloud verifier's GetStats",
                            formatter_class=DefaultsHelpFormatter)
    status.add_argument("address", help="HOST:PORT of an edge agent or a cloud verifier")
    status.add_argument("--timeout", type=float, default=10.0, help="deadline of each call, s")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    add_client_security_args(status, prefix="", env_prefix="EVENTSPEC_", peer="node")
    for name, help_text in _HANDED_OVER.items():
        # Listed here for --help; ``main`` hands their arguments over before parsing.
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _installed_command(name: str) -> Callable[[list[str]], int]:
    """The ``eventspec.commands`` entry point called ``name``: the demo world registers
    ``toy`` there, as its own package, so this CLI does not import it."""
    found = importlib.metadata.entry_points(group=COMMAND_GROUP, name=name)
    if not found:
        raise SystemExit(f"eventspec {name}: not installed (no {COMMAND_GROUP!r} entry "
                         f"point {name!r}; reinstall eventspec)")
    command: Callable[[list[str]], int] = next(iter(found)).load()
    return command


def main(argv: list[str] | None = None) -> int:
    """Every command, with a closed stdout (``| head``) ending quietly: exit 141, as a
    shell reports SIGPIPE, no traceback (``status`` and ``demo`` printed one)."""
    try:
        return _main(argv)
    except BrokenPipeError:
        _stdout_to_devnull()
        return EXIT_PIPE_CLOSED


def _stdout_to_devnull() -> None:
    """The reader went away: point stdout at /dev/null, so the interpreter's flush at
    exit does not raise a second BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "demo":
        from eventspec.shared.client.demo import main as demo_main

        return demo_main(argv[1:])
    if argv and argv[0] in _HANDED_OVER:
        return _installed_command(argv[0])(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "wait":
        return _wait(parser, args)
    if args.command == "status":
        return _status(parser, args)
    try:
        spec = spec_from_args(args)
    except ArgumentProblem as exc:
        parser.exit(2, f"eventspec ask: error: {exc}\n")
    logging.basicConfig(level=logging.WARNING)
    view = view_for(args)
    try:
        return asyncio.run(_interruptible(_ask(args, spec, view)))
    except (KeyboardInterrupt, asyncio.CancelledError):
        with contextlib.suppress(BrokenPipeError):
            sys.stdout.write(view.interrupt() if view is not None else "")
            sys.stdout.flush()
        print("eventspec ask: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
