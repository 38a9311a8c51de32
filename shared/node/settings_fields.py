"""Each node setting declared once: a dataclass field whose metadata says how it is set.

``port: int = setting(50061, help="...")`` on ``CloudSettings`` is the whole of
``--port``: the flag (named after the field unless ``flag`` says otherwise), how its text
parses (from the field's annotation: str, int, float, bool or Path, each perhaps
``| None``; anything else names a ``parse``), its ``--help`` with the default and
``$EVENTSPEC_CLOUD_PORT`` (and so docs/reference/flags.md, which tools/flag_docs.py
reads off the parser), the variable's reading, and the field the parsed flag fills.
Written three times over (field, ``from_env`` line, ``build_parser`` call), the copies of
a setting could drift apart, and each new setting cost three edits (issue 37).

The fields of an object a setting lives in (``CloudSettings.limits.max_sessions``) are
declared on the field that holds it, with ``nested``. Torch-free; imports neither node.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import types
import typing
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

#: Where a field's ``Setting`` (or ``nested``'s name -> ``Setting``) sits in its metadata.
_KEY = "eventspec.setting"

#: Spellings of a switch variable (``EVENTSPEC_EDGE_ALLOW_PICKLE=1``).
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

#: What a variable's text must be, per annotated type, for its refusal.
_WHAT = {int: "an integer", float: "a number"}


class SettingsError(ValueError):
    """A flag or environment value the node cannot run with; the message names it."""

    def in_environment(self, env_prefix: str) -> str:
        """The message for a value that came from the environment: a leading ``--flag``
        becomes ``$<PREFIX>FLAG (--flag)``, so the line names what to fix."""
        text = str(self)
        flag, sep, rest = text.partition(" ")
        if flag.startswith("--") and sep:
            return f"${env_name(env_prefix, flag)} ({flag}) {rest}"
        return text


def env_name(env_prefix: str, flag: str) -> str:
    """``--session-ttl-s`` -> ``EVENTSPEC_CLOUD_SESSION_TTL_S`` (for that prefix)."""
    return env_prefix + flag.removeprefix("--").upper().replace("-", "_")


@dataclasses.dataclass(frozen=True)
class Setting:
    """How a user sets one field: by flag, or by the variable named after the flag."""

    #: What ``--help`` says; the default and the variable are appended to it.
    help: str
    #: ``--<field-name>`` unless given (``--profile`` sets ``profile_path``).
    flag: str = ""
    #: Text -> value, ValueError saying why not; None: by the field's annotation.
    parse: Callable[[str], Any] | None = None
    #: The values a text setting may take (the flag's, and checked in the variable's).
    choices: tuple[str, ...] = ()
    #: A bool taken as ``--flag on|off`` (it defaults on) instead of a bare switch.
    on_off: bool = False
    metavar: str | None = None
    #: A serving endpoint (health, metrics): listed after ``--port-file`` and
    #: ``--log-level``, next to the security flags, as ``--help`` has always shown them.
    endpoint: bool = False


def setting(default: Any, *, help: str, flag: str = "",
            parse: Callable[[str], Any] | None = None, choices: Iterable[str] = (),
            on_off: bool = False, metavar: str | None = None, endpoint: bool = False) -> Any:
    """A dataclass field with its default and how it is set (``Setting``'s arguments)."""
    spec = Setting(help=help, flag=flag, parse=parse, choices=tuple(choices), on_off=on_off,
                   metavar=metavar, endpoint=endpoint)
    return dataclasses.field(default=default, metadata={_KEY: spec})


def nested(default_factory: Callable[[], Any], **settings: Setting) -> Any:
    """A dataclass field holding an object, some of whose fields are settings: each
    keyword names one of them (``max_sessions=Setting(...)``), in the order of --help."""
    return dataclasses.field(default_factory=default_factory, metadata={_KEY: settings})


class Dataclass(Protocol):
    """A dataclass instance (what ``dataclasses.fields`` takes)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]


D = TypeVar("D", bound=Dataclass)


@dataclasses.dataclass(frozen=True)
class Declared:
    """One setting of a settings class, resolved: where it lives, its flag, its type."""

    #: The field, or the field holding an object and that object's field.
    path: tuple[str, ...]
    spec: Setting
    #: str, int, float, bool or Path (the annotation without ``| None``); else ``parse``.
    kind: Any
    flag: str

    @property
    def dest(self) -> str:
        """Where argparse puts the flag's value (its default name)."""
        return self.flag.removeprefix("--").replace("-", "_")

    def of(self, settings: object) -> Any:
        """This setting's value in ``settings``."""
        for name in self.path:
            settings = getattr(settings, name)
        return settings

    def from_text(self, text: str, variable: str) -> Any:
        """The value ``$variable=text`` sets; SettingsError naming both if the text is none."""
        if self.spec.parse is not None:
            try:
                return self.spec.parse(text)
            except ValueError as exc:
                raise SettingsError(f"${variable}={text!r}: {exc}") from None
        if self.kind is bool:
            word = text.strip().lower()
            if word in _TRUE + _FALSE:
                return word in _TRUE
            raise SettingsError(f"${variable}={text!r} is not a switch (1 or 0)")
        if self.kind in _WHAT:
            try:
                return self.kind(text)
            except ValueError:
                raise SettingsError(f"${variable}={text!r} is not {_WHAT[self.kind]}") from None
        return Path(text) if self.kind is Path else text


@functools.cache
def declared(cls: type) -> tuple[Declared, ...]:
    """The settings ``cls`` declares, in its fields' order (a field's ``nested`` ones at
    its place). TypeError for an annotation that says nothing of how text parses."""
    out: list[Declared] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(_KEY)
        if isinstance(spec, Setting):
            out.append(_resolve((f.name,), spec, hints[f.name]))
        elif spec is not None:
            inner = typing.get_type_hints(hints[f.name])
            out += [_resolve((f.name, name), s, inner[name]) for name, s in spec.items()]
    return tuple(out)


def _default(f: dataclasses.Field[Any]) -> Any:
    """A field's default (a fresh object, for a factory)."""
    factory: Any = f.default_factory
    return f.default if factory is dataclasses.MISSING else factory()


def _resolve(path: tuple[str, ...], spec: Setting, hint: Any) -> Declared:
    kind = hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        kinds = [k for k in typing.get_args(hint) if k is not type(None)]
        kind = kinds[0] if len(kinds) == 1 else hint
    if spec.parse is None and kind not in (str, int, float, bool, Path):
        raise TypeError(f"{'.'.join(path)}: a {hint} setting needs a parse")
    if spec.on_off and kind is not bool:
        raise TypeError(f"{'.'.join(path)}: on_off is for bool settings")
    return Declared(path, spec, kind, spec.flag or "--" + path[-1].replace("_", "-"))


def _build(cls: type[D], values: dict[tuple[str, ...], Any], given: dict[str, Any]) -> D:
    """``cls`` with these values (a nested one replaces its field in the default object)."""
    kwargs = dict(given)
    inner: dict[str, dict[str, Any]] = {}
    for path, value in values.items():
        if len(path) == 1:
            kwargs[path[0]] = value
        else:
            inner.setdefault(path[0], {})[path[1]] = value
    for name, changes in inner.items():
        kwargs[name] = dataclasses.replace(_default(cls.__dataclass_fields__[name]), **changes)
    return cls(**kwargs)


def settings_from_env(cls: type[D], env_prefix: str) -> D:
    """Defaults overridden by ``<env_prefix>FLAG`` variables, one per declared setting
    (unset or empty: the default). Raises SettingsError naming a variable that does not
    parse; what the node cannot run with is ``check()``'s to say."""
    values = {}
    for d in declared(cls):
        variable = env_name(env_prefix, d.flag)
        text = os.environ.get(variable)
        if text:
            values[d.path] = d.from_text(text, variable)
    return _build(cls, values, {})


def settings_from_args(cls: type[D], args: argparse.Namespace, **given: Any) -> D:
    """The settings the flags of ``add_setting_flags`` describe; ``given`` sets the
    fields that are no one setting (the security objects, from their own flags)."""
    values = {}
    for d in declared(cls):
        value = getattr(args, d.dest)
        values[d.path] = value == "on" if d.spec.on_off else value
    return _build(cls, values, given)


def add_setting_flags(parser: argparse.ArgumentParser, defaults: Dataclass, env_prefix: str,
                      *, endpoints: bool) -> None:
    """A flag for each declared setting of ``defaults`` (the endpoints', or the others),
    defaulting to its value there (the environment's), its variable named in its help."""
    for d in declared(type(defaults)):
        if d.spec.endpoint != endpoints:
            continue
        default = d.of(defaults)
        kwargs: dict[str, Any] = {"metavar": d.spec.metavar} if d.spec.metavar else {}
        switch = d.kind is bool and not d.spec.on_off
        if switch:
            kwargs["action"] = "store_true"
        elif d.spec.on_off:
            kwargs["choices"], default = ["on", "off"], "on" if default else "off"
        elif d.spec.parse is not None:
            kwargs["type"] = _flag_type(d.spec.parse)
        elif d.kind is not str:
            kwargs["type"] = d.kind
        if d.spec.choices:
            kwargs["choices"] = list(d.spec.choices)
        variable = env_name(env_prefix, d.flag)
        parser.add_argument(d.flag, default=default, **kwargs,
                            help=f"{d.spec.help} (${variable}{'=1' if switch else ''})")


def _flag_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` for argparse: its ValueError's message becomes the refusal's."""
    def flag_value(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return flag_value


def require_choice(flag: str, value: str, choices: Collection[str]) -> None:
    """One of ``choices`` (argparse checks a flag's; this checks a variable's too)."""
    if value not in choices:
        raise SettingsError(f"{flag} must be one of {', '.join(choices)}, got {value!r}")


def check_choices(settings: Dataclass) -> None:
    """Every setting declared with ``choices`` holds one of them; SettingsError naming
    its flag (a variable's value reaches the settings unchecked by argparse)."""
    for d in declared(type(settings)):
        if d.spec.choices:
            require_choice(d.flag, d.of(settings), d.spec.choices)
