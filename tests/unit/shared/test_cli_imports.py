"""The client's command loads no torch and nothing of the demo world; the launch helper
starts exactly the console scripts pyproject.toml declares."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

from eventspec.shared.client.launch import ENTRY_POINTS, entry_point_command

ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("torch", "transformers", "eventspec.demoworld", "eventspec.edge", "eventspec.cloud")


def _loaded_after(code: str) -> list[str]:
    probe = (f"import sys\n{code}\n"
             f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    found: list[str] = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    return found


def test_client_and_cli_import_without_torch_or_the_demo_world() -> None:
    assert _loaded_after(
        "import eventspec.shared.client.edge_client, eventspec.shared.client.cli") == []


def test_ask_help_imports_no_torch() -> None:
    code = ("import contextlib, io\nfrom eventspec.shared.client.cli import main\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['ask', '--help'])")
    assert _loaded_after(code) == []


def test_entry_points_match_pyproject() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == ENTRY_POINTS


def test_entry_point_command_runs_the_entry_point_function() -> None:
    out = subprocess.run(entry_point_command("eventspec-cloud", ["serve", "--help"]),
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: eventspec-cloud serve")
    assert "tiny-random" in out.stdout
