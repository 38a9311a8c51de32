"""What ``eventspec-edge`` and ``eventspec-cloud`` share as commands: how a bad setting is
refused, the flags of ``serve`` (each node's settings, declared once on its settings
dataclass through ``eventspec.shared.node.settings_fields``, those both declare alike in
``eventspec.shared.node.node_settings``), the value checks, and ``serve``'s run.

The convention both nodes follow: every setting ``--some-flag`` has the environment
variable ``<PREFIX>SOME_FLAG`` (``EVENTSPEC_CLOUD_SESSION_TTL_S`` for ``--session-ttl-s``),
whose value is the flag's default and is named in its ``--help``; a flag given on the
command line wins. A value that does not parse, or that the node cannot run with, ends
the command before anything starts: one line on stderr naming the flag or the variable,
exit status 2 (as argparse's own refusals).

Torch-free and importing neither node (``make lint`` checks the floors): the nodes pass
in what is theirs (their settings, their server, their tiny random model).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import importlib.metadata
import logging
import math
import socket
import sys
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, NoReturn, Protocol, TypeVar

from eventspec.shared.helpfmt import DefaultsHelpFormatter
from eventspec.shared.node.serving import (
    LOG_FORMAT,
    NodeServer,
    quiet_progress_bars,
    run_node,
)
from eventspec.shared.node.settings_fields import SettingsError as SettingsError
from eventspec.shared.node.settings_fields import add_setting_flags, settings_from_args
from eventspec.shared.node.settings_fields import env_name as env_name
from eventspec.shared.wire.flags import add_server_security_args, server_security_from_args
from eventspec.shared.wire.security import (
    SecurityConfigError,
    ServerSecurity,
    check_server_start,
)

#: Exit status of a refused flag or environment value, as argparse's own.
EXIT_USAGE = 2

#: ``--log-level`` names (``logging`` refuses others with a traceback).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def refuse(prog: str, message: str) -> NoReturn:
    """One line on stderr naming the flag or variable, then exit 2 (nothing started)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def refuse_missing_directories(prog: str, dirs: dict[str, str | Path | None],
                               builtin: dict[str, tuple[str, ...]]) -> None:
    """Refuse a flag that names a directory which is not there (one line, exit 2), before
    torch is imported and the port bound; unchecked, a node found it only when it loaded
    the model, after binding (exit 1 after about 5 s; issue 38). ``dirs``: flag -> value
    (None: not given); ``builtin``: flag -> the names it takes instead of a directory."""
    for flag, value in dirs.items():
        names = builtin.get(flag, ())
        if value is None or str(value) in names:
            continue
        path = Path(value)
        if not path.is_dir():
            what = "is not a directory" if path.exists() else "does not exist"
            also = f" (or one of: {', '.join(names)})" if names else ""
            refuse(prog, f"{flag} {value} {what}: give a directory{also}")


class CheckedSettings(Protocol):
    """A node's settings: a frozen dataclass that can say what it cannot run with."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def model(self) -> str: ...

    @property
    def seed(self) -> int: ...

    @property
    def grace_s(self) -> float: ...

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def security(self) -> ServerSecurity: ...

    @property
    def health_port(self) -> int | None: ...

    @property
    def metrics_port(self) -> int | None: ...

    @property
    def metrics_host(self) -> str: ...

    def check(self) -> None: ...


S = TypeVar("S", bound=CheckedSettings)


def env_defaults(prog: str, env_prefix: str, from_env: Callable[[], S]) -> S:
    """The settings the environment describes, checked, to serve as the flags' defaults.

    A variable that does not parse, or whose value the node cannot run with, exits 2
    naming the variable (even if a flag would override it: a bad environment is fixed,
    not shadowed).
    """
    try:
        settings = from_env()
        settings.check()
    except SettingsError as exc:
        refuse(prog, exc.in_environment(env_prefix))
    return settings


def checked(prog: str, settings: S) -> S:
    """``settings`` if the node can run with them; else exit 2 naming the flag."""
    try:
        settings.check()
    except SettingsError as exc:
        refuse(prog, str(exc))
    return settings


def add_run_args(parser: argparse.ArgumentParser, node: str) -> None:
    """``--port-file`` and ``--log-level``: how the process runs, not a setting."""
    parser.add_argument("--port-file", type=Path, default=None,
                        help="write the bound port here as soon as it is bound (for --port "
                             f"0; {node} is NOT_SERVING until warm: wait with eventspec wait)")
    parser.add_argument("--log-level", default="INFO", choices=LOG_LEVELS,
                        type=str.upper, help="log threshold")


def add_serve_flags(parser: argparse.ArgumentParser, defaults: CheckedSettings,
                    env_prefix: str, node: str) -> None:
    """``serve``'s flags, in the order both nodes list them: one per setting its settings
    class declares, defaulting to ``defaults`` (the environment's), then ``--port-file``
    and ``--log-level``, the endpoints' (health, metrics), and the security flags."""
    add_setting_flags(parser, defaults, env_prefix, endpoints=False)
    add_run_args(parser, node)
    add_setting_flags(parser, defaults, env_prefix, endpoints=True)
    add_server_security_args(parser, env_prefix)


def add_serve_command(sub: Any, prog: str, from_env: Callable[[], CheckedSettings],
                      env_prefix: str, *, help: str, node: str) -> argparse.ArgumentParser:
    """The ``serve`` subcommand: ``--help`` shows every default (the environment's, read
    by ``from_env`` and checked first) and its variable."""
    serve_cmd: argparse.ArgumentParser = sub.add_parser(
        "serve", help=help, formatter_class=DefaultsHelpFormatter)
    add_serve_flags(serve_cmd, env_defaults(prog, env_prefix, from_env), env_prefix, node)
    return serve_cmd


def serve_settings(prog: str, cls: type[S], args: argparse.Namespace, env_prefix: str,
                   **given: Any) -> S:
    """The settings ``serve``'s flags describe, with the security its security flags
    describe (and ``given``, a node's other objects), checked: a bad value exits with one
    line."""
    return checked(prog, settings_from_args(
        cls, args, security=server_security_from_args(args, env_prefix), **given))


# -- value checks: SettingsError naming the flag --------------------------------------

def require_int(flag: str, value: int, lo: int, hi: int | None = None, note: str = "") -> None:
    """``lo <= value`` (``<= hi``): "--port must be in 0..65535 (0 picks one), got 70000"."""
    if lo <= value and (hi is None or value <= hi):
        return
    span = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
    raise SettingsError(f"{flag} must be {span}{f' ({note})' if note else ''}, got {value}")


def require_seconds(flag: str, value: float, *, zero_ok: bool) -> None:
    """A finite duration, > 0 (or >= 0 when ``zero_ok``)."""
    if math.isfinite(value) and (value > 0 or (zero_ok and value == 0)):
        return
    raise SettingsError(f"{flag} must be {'>=' if zero_ok else '>'} 0 seconds, got {value:g}")


def require_fraction(flag: str, value: float, *, zero_ok: bool) -> None:
    """A finite value in (0, 1] (or [0, 1] when ``zero_ok``)."""
    if math.isfinite(value) and value <= 1 and (value > 0 or (zero_ok and value == 0)):
        return
    raise SettingsError(f"{flag} must be in {'[' if zero_ok else '('}0, 1], got {value:g}")


# -- serve ----------------------------------------------------------------------------

#: The entry-point group of the built-in models (``--model tiny-random``): the demo world
#: registers them (``pyproject.toml``), so no node imports it.
BUILTIN_MODELS = "eventspec.builtin_models"


#: The checkout's own ``pyproject.toml``, where this module runs from a source tree.
SOURCE_PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def find_entry_point(group: str, name: str) -> importlib.metadata.EntryPoint | None:
    """The installed entry point, else the same one read from the checkout's
    ``pyproject.toml``: a source tree run from ``PYTHONPATH`` without installing (the GPU
    machine's ``make test-gpu`` / ``make gpu-gate`` and benchmarks) has no metadata, and
    the table stays declared once either way."""
    found = importlib.metadata.entry_points(group=group, name=name)
    if found:
        return next(iter(found))
    try:
        table = tomllib.loads(SOURCE_PYPROJECT.read_text())["project"]["entry-points"][group]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return None
    value = table.get(name)
    return importlib.metadata.EntryPoint(name, value, group) if isinstance(value, str) else None


def builtin_model(prog: str, node: str, name: str) -> Callable[[Path, int], Path]:
    """The ``eventspec.builtin_models`` entry point ``<node>.<name>``: a function that
    writes the model into a scratch directory for a seed and returns its path (``serve``'s
    ``scratch_model``). Found now, loaded only when called, so the port checks still come
    before torch is imported; missing, it is one line and exit 2."""
    key = f"{node}.{name}"
    entry_point = find_entry_point(BUILTIN_MODELS, key)
    if entry_point is None:
        refuse(prog, f"--model {name}: not installed (no {BUILTIN_MODELS!r} entry point "
                     f"{key!r}; reinstall eventspec)")

    def write(scratch: Path, seed: int) -> Path:
        made: Path = entry_point.load()(scratch, seed)
        return made

    return write


def serve(prog: str, args: argparse.Namespace, log: logging.Logger, settings: S,
          server: Callable[[S], NodeServer], *,
          scratch_model: Callable[[Path, int], Path] | None = None) -> int:
    """Run ``serve`` until SIGTERM/SIGINT: logging, then the node's server; exit status.

    ``scratch_model`` (for ``--model tiny-random``) writes a model into a temporary
    directory (removed on exit) for the seed and returns its path, which then stands in
    ``settings.model``: the server loads it like any other model directory.
    """
    try:  # the server's own refusal of an exposed address, before torch is imported
        check_server_start(settings.host, settings.port, settings.security)
    except SecurityConfigError as exc:
        refuse(prog, str(exc))
    for flag, host, port in (("--port", settings.host, settings.port),
                             ("--health-port", settings.host, settings.health_port),
                             ("--metrics-port", settings.metrics_host, settings.metrics_port)):
        busy = port_refusal(host, port, flag) if port is not None else None
        if busy is not None:
            refuse(prog, busy)
    logging.basicConfig(level=args.log_level, format=LOG_FORMAT)
    quiet_progress_bars()
    with contextlib.ExitStack() as scratch:
        if scratch_model is not None:
            tmp = Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix=f"{prog}-")))
            settings = dataclasses.replace(settings, model=str(scratch_model(tmp, settings.seed)))
        return run_node(server(settings), args.port_file, log, settings.grace_s, prog)


def port_refusal(host: str, port: int, flag: str = "--port") -> str | None:
    """Why ``host:port`` cannot be listened on (in use, or not an address of this
    machine), or None. Tried with a plain socket before the node imports torch (5 s)
    and binds, so the refusal is immediate: exit 2, one line. Port 0 always binds."""
    if port == 0:
        return None
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"--host {host}: cannot resolve it ({exc.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        # As a listener binds: a port held only by closed connections (TIME_WAIT) is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return (f"{flag} {port}: {host}:{port} is in use by another process; pick "
                        "another port (0 picks a free one) or stop that process")
            return f"--host {host} {flag} {port}: cannot listen there ({exc.strerror})"
    return None
