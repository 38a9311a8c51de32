"""Command lines as users meet them: ``--help`` that shows every default that exists, and
none that does not; an argument error as one line."""

from __future__ import annotations

import argparse
from typing import NoReturn


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to each option's help, except where X is None or a switch's
    False: "(default: None)" says nothing the help text does not say better."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        if action.default is None or action.default is False or action.default == []:
            return help_text
        return super()._get_help_string(action) or help_text


class OneLineParser(argparse.ArgumentParser):
    """Argument errors as one line (``eventspec ask: error: ...``) and exit status 2, not
    argparse's usage block above it; its subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
