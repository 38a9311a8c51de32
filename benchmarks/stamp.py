"""The provenance every committed result carries: which code, on what, run how.

Why: results without their commit could not be traced (issue 35: 0 of 66 committed JSONs
named a commit, 20 held machine paths such as ``/root/out/...``). Every benchmark that
writes a JSON puts :func:`stamp` under the key ``"stamp"``, and
``tests/unit/test_result_stamps.py`` checks the stamp of every committed result.

The GPU machine gets a copy of the working tree whose ``.git`` (if any) is not the
session's, so the caller names the commit there: ``EVENTSPEC_GIT_COMMIT`` (and
``EVENTSPEC_GIT_DIRTY=1`` when the tree had uncommitted changes) on the command line
it sends; elsewhere git is asked.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: Keys every stamp has.
STAMP_KEYS = ("commit", "dirty", "device", "versions", "command")
#: What a machine path looks like in a result (absolute paths under these roots).
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:root|home|tmp|work|Users|var/folders)/[^\s\"']*")


def git_state() -> tuple[str, bool]:
    """(commit, dirty) of the code that runs: ``EVENTSPEC_GIT_COMMIT`` (and
    ``EVENTSPEC_GIT_DIRTY``) when set, since a copied tree may carry a stale ``.git``
    (the GPU machine's did: it named the session's starting commit); else git's answer;
    ("unknown", True) when neither can tell."""
    commit = os.environ.get("EVENTSPEC_GIT_COMMIT")
    if commit:
        return commit, os.environ.get("EVENTSPEC_GIT_DIRTY") == "1"
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, check=True, timeout=10).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=ROOT, capture_output=True, text=True, check=True,
                                timeout=10).stdout
        return commit, bool(status.strip())
    except (OSError, subprocess.SubprocessError):
        return "unknown", True


def device_name() -> str:
    """The CUDA device's name, or "cpu" (torch absent or no device)."""
    try:
        import torch
    except ImportError:
        return "cpu"
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


#: A card's model in a driver's device name: one or two capitals, then digits, then an
#: optional capital ("H200", "A100" of "A100-SXM4-80GB", "L40S", "V100").
_CARD = re.compile(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)(?:\b|-)")


def card_tag(device: str, fallback: str) -> str:
    """The card's model for a result's file name ("h200" of "NVIDIA H200", "a100" of
    "NVIDIA A100-SXM4-80GB"), else ``fallback``: one name per card, however the driver
    spells the rest of it."""
    found = _CARD.search(device)
    return (found.group(1) if found else fallback).lower()


def versions() -> dict[str, str]:
    """Python and the libraries the numbers depend on ("absent" where not installed)."""
    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "triton", "grpc", "onnxruntime"):
        try:
            module = __import__(name)
            out[name] = str(getattr(module, "__version__", "?"))
        except ImportError:
            out[name] = "absent"
    return out


def scrub_paths(text: str) -> str:
    """``text`` with machine paths replaced: repository paths become relative, other
    absolute paths under home or temporary roots become ``<path>``."""
    text = text.replace(str(ROOT) + "/", "")
    return MACHINE_PATH.sub("<path>", text)


def stamp(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Commit, dirtiness, device, library versions, the command (machine paths scrubbed)
    and the date of this run."""
    commit, dirty = git_state()
    args = list(sys.argv if argv is None else argv)
    if args and args[0].endswith(".py"):
        args[0] = Path(args[0]).name
    return {"commit": commit, "dirty": dirty, "device": device_name(), "versions": versions(),
            "command": scrub_paths(shlex.join(args)),
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}


def write_result(path: Path, result: dict[str, Any], indent: int = 1) -> Path:
    """Write a benchmark's ``result`` as JSON with its :func:`stamp` (machine paths
    scrubbed), the one way results are written, so none goes out unstamped."""
    body = {**result, "stamp": stamp()}
    Path(path).write_text(scrub_paths(json.dumps(body, indent=indent)) + "\n")
    return Path(path)
