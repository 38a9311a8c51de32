"""``eventspec``: the client's command. ``ask`` questions an edge agent.

``demo`` (the whole system on one machine) and ``toy`` (train or evaluate the demo
models) belong to the embedded demo world, ``shared.demoworld``: they are imported
only when chosen, so ``eventspec ask`` loads neither torch nor any model code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys

from shared.answer_view import final_to_json, stats_table, stream_answer
from shared.client import AskError, EdgeClient
from shared.types import AskSpec, FeatureMode, GenerationSettings, Mode
from shared.wire.flags import add_client_security_args, client_security_from_args

_MODES = {"speculative": Mode.SPECULATIVE, "target_only": Mode.TARGET_ONLY,
          "draft_only": Mode.DRAFT_ONLY}
_FEATURES = {"auto": FeatureMode.AUTO, "frames": FeatureMode.FRAMES,
             "aligned": FeatureMode.ALIGNED}
#: Demo-world commands: name -> help. Each parses its own arguments once chosen.
_DEMO_WORLD = {
    "demo": "run cloud + edge locally and ask one question about the demo scene",
    "toy": "train or evaluate the embedded toy-world models",
}


def _spec_from_args(args: argparse.Namespace) -> AskSpec:
    return AskSpec(
        question=args.question,
        latest_ms=args.clip_ms,
        event_window_ms=args.event_window_ms,
        mode=_MODES[args.mode],
        generation=GenerationSettings(
            max_new_tokens=args.max_new_tokens, temperature=args.temperature,
            top_p=args.top_p, seed=args.seed,
        ),
        feature_mode=_FEATURES[args.feature_mode],
    )


async def _ask(args: argparse.Namespace) -> int:
    security = client_security_from_args(args, prefix="", env_prefix="EVENTSPEC_")
    async with EdgeClient(args.edge, timeout_s=args.timeout, security=security) as client:
        try:
            live = sys.stdout.isatty() and not args.json
            final = await stream_answer(client, _spec_from_args(args), sys.stdout, live=live)
        except AskError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(final_to_json(final)))
    else:
        label = " [draft_only: unverified edge output]" if final.mode == Mode.DRAFT_ONLY else ""
        print(f"{final.answer}{label}")
        print(stats_table(final))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eventspec", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ask = sub.add_parser("ask", help="ask an edge agent a question")
    ask.add_argument("question")
    ask.add_argument("--edge", default="127.0.0.1:50062", help="HOST:PORT of the edge agent")
    ask.add_argument("--mode", choices=sorted(_MODES), default="speculative")
    ask.add_argument("--feature-mode", choices=sorted(_FEATURES), default="auto")
    ask.add_argument("--clip-ms", type=int, default=None,
                     help="the latest N ms form the clip (default: 1000, or the whole "
                          "recording if it is shorter)")
    ask.add_argument("--event-window-ms", type=int, default=50,
                     help="event window at the clip's end, ms (< 100)")
    ask.add_argument("--max-new-tokens", type=int, default=64)
    ask.add_argument("--temperature", type=float, default=0.0)
    ask.add_argument("--top-p", type=float, default=1.0)
    ask.add_argument("--seed", type=int, default=0)
    ask.add_argument("--timeout", type=float, default=300.0, help="seconds")
    ask.add_argument("--json", action="store_true", help="print one JSON object at the end")
    add_client_security_args(ask, prefix="", env_prefix="EVENTSPEC_", peer="edge agent")
    for name, help_text in _DEMO_WORLD.items():
        # Listed here for --help; ``main`` hands their arguments over before parsing.
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "demo":
        from shared.demoworld.demo import main as demo_main

        return demo_main(argv[1:])
    if argv and argv[0] == "toy":
        from shared.demoworld.cli import main as toy_main

        return toy_main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_ask(args))
    return 130


if __name__ == "__main__":
    sys.exit(main())
