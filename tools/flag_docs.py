"""Markdown tables of every flag of the user's commands, read from their argparse parsers.

    python tools/flag_docs.py > /tmp/flags.md   # paste into docs/reference/flags.md

``tests/unit/test_flag_docs.py`` checks that the document lists exactly these flags, so
the document cannot drift from the code. Run with no ``EVENTSPEC_*`` variables set, or
their values show as defaults.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable

_ENV = re.compile(r"\(?\$(EVENTSPEC_[A-Z_]+)(?:=\S+)?\)?")


def _sub(parser: argparse.ArgumentParser, *names: str) -> argparse.ArgumentParser:
    for name in names:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def commands() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    """Command line -> a function building its parser (imported lazily: the nodes' CLIs
    import no model code at parse time, but keep this script cheap anyway)."""
    from eventspec.cloud.cli import build_parser as cloud
    from eventspec.demoworld.cli import build_parser as toy
    from eventspec.edge.cli import build_parser as edge
    from eventspec.shared.client.cli import build_parser as ask
    from eventspec.shared.client.demo import build_parser as demo

    return {
        "eventspec ask": lambda: _sub(ask(), "ask"),
        "eventspec wait": lambda: _sub(ask(), "wait"),
        "eventspec status": lambda: _sub(ask(), "status"),
        "eventspec demo": demo,
        "eventspec toy train": lambda: _sub(toy(), "train"),
        "eventspec toy eval": lambda: _sub(toy(), "eval"),
        "eventspec-edge serve": lambda: _sub(edge(), "serve"),
        "eventspec-edge export-onnx": lambda: _sub(edge(), "export-onnx"),
        "eventspec-edge train-adapter": lambda: _sub(edge(), "train-adapter"),
        "eventspec-cloud serve": lambda: _sub(cloud(), "serve"),
    }


def flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The optional arguments a user can pass (``--help`` excluded)."""
    return [a for a in parser._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)]


def _default(action: argparse.Action) -> str:
    if isinstance(action, argparse._StoreTrueAction):
        return "off"
    if action.default is None or action.default == []:
        return "–"
    return f"`{action.default}`"


def table(command: str, parser: argparse.ArgumentParser) -> str:
    """One markdown table: flag, default, environment variable, what it does."""
    rows = [f"### `{command}`", "", "| flag | default | env | what |", "|---|---|---|---|"]
    for action in flags(parser):
        help_text = (action.help or "").replace("%(default)s", str(action.default))
        envs = sorted(set(_ENV.findall(help_text)))
        what = re.sub(r"\s*\([^()]*\$EVENTSPEC_[^()]*\)", "", help_text)
        what = what.replace("|", "\\|").strip()
        what = re.sub(r"\s+", " ", what).rstrip(" ;,")
        if action.choices:
            what = f"{what} (one of: {', '.join(map(str, action.choices))})".lstrip()
        rows.append(f"| `{action.option_strings[-1]}` | {_default(action)} | "
                    f"{', '.join(f'`{e}`' for e in envs) or '–'} | {what} |")
    return "\n".join(rows)


def main() -> int:
    print("\n\n".join(table(name, build()) for name, build in commands().items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
