"""One declaration per setting (eventspec.shared.node.settings_fields): the flag, the
variable, the help and the field all come from the field's ``setting``, on a made-up
settings class with one setting of each kind (the nodes' own: test_node_settings.py)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from eventspec.shared.node.settings_fields import (
    Setting,
    SettingsError,
    add_setting_flags,
    check_choices,
    declared,
    nested,
    setting,
    settings_from_args,
    settings_from_env,
)

PREFIX = "EVENTSPEC_TEST_"


def _pair(text: str) -> tuple[int, int]:
    a, sep, b = text.partition("x")
    if not sep:
        raise ValueError(f"want AxB, got {text!r}")
    return int(a), int(b)


@dataclass(frozen=True)
class Inner:
    cap: int = 8
    other: int = 1


@dataclass(frozen=True)
class Demo:
    name: str = setting("toy", help="a name")
    count: int = setting(3, help="how many")
    ratio: float | None = setting(None, help="a share")
    where: Path | None = setting(None, flag="--place", help="a path")
    size: tuple[int, int] | None = setting(None, parse=_pair, metavar="AxB", help="a size")
    loud: bool = setting(False, help="a switch")
    fast: bool = setting(True, on_off=True, help="on or off")
    mode: str = setting("a", choices=("a", "b"), help="a or b")
    inner: Inner = nested(Inner, cap=Setting(help="the cap"))
    port: int | None = setting(None, endpoint=True, help="an endpoint")
    given: str = field(default="not a setting")


@pytest.fixture(autouse=True)
def _no_test_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith(PREFIX)]:
        monkeypatch.delenv(name)


def _parser(defaults: Demo) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="demo")
    add_setting_flags(parser, defaults, PREFIX, endpoints=False)
    parser.add_argument("--between")
    add_setting_flags(parser, defaults, PREFIX, endpoints=True)
    return parser


def test_flags_follow_the_fields_with_the_endpoints_apart() -> None:
    flags = [a.option_strings[0] for a in _parser(Demo())._actions[1:]]
    assert flags == ["--name", "--count", "--ratio", "--place", "--size", "--loud", "--fast",
                     "--mode", "--cap", "--between", "--port"]
    assert [d.path for d in declared(Demo)][-2:] == [("inner", "cap"), ("port",)]


def test_help_names_the_variable_and_a_switch_takes_one() -> None:
    actions = {a.option_strings[0]: a for a in _parser(Demo())._actions[1:]}
    assert actions["--count"].help == "how many ($EVENTSPEC_TEST_COUNT)"
    assert actions["--place"].help == "a path ($EVENTSPEC_TEST_PLACE)"
    assert actions["--loud"].help == "a switch ($EVENTSPEC_TEST_LOUD=1)"
    assert actions["--cap"].help == "the cap ($EVENTSPEC_TEST_CAP)"
    assert actions["--fast"].choices == ["on", "off"] and actions["--fast"].default == "on"
    assert actions["--mode"].choices == ["a", "b"]
    assert actions["--size"].metavar == "AxB"


def test_the_flags_fill_the_fields() -> None:
    args = _parser(Demo()).parse_args(
        ["--name", "x", "--count", "4", "--ratio", "0.5", "--place", "/p", "--size", "2x3",
         "--loud", "--fast", "off", "--mode", "b", "--cap", "9", "--port", "7"])
    assert settings_from_args(Demo, args, given="g") == Demo(
        name="x", count=4, ratio=0.5, where=Path("/p"), size=(2, 3), loud=True, fast=False,
        mode="b", inner=Inner(cap=9), port=7, given="g")


def test_a_flag_that_does_not_parse_is_argparses_refusal(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser(Demo()).parse_args(["--size", "2"])
    assert "argument --size: want AxB, got '2'" in capsys.readouterr().err


def test_the_variables_fill_the_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, text in {"NAME": "x", "COUNT": "4", "RATIO": "0.5", "PLACE": "/p",
                       "SIZE": "2x3", "LOUD": "yes", "FAST": "0", "MODE": "b", "CAP": "9",
                       "PORT": "7"}.items():
        monkeypatch.setenv(PREFIX + name, text)
    assert settings_from_env(Demo, PREFIX) == Demo(
        name="x", count=4, ratio=0.5, where=Path("/p"), size=(2, 3), loud=True, fast=False,
        mode="b", inner=Inner(cap=9), port=7)


def test_an_empty_variable_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PREFIX + "COUNT", "")
    assert settings_from_env(Demo, PREFIX) == Demo()


def test_the_environment_is_the_flags_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PREFIX + "CAP", "12")
    parser = _parser(settings_from_env(Demo, PREFIX))
    assert settings_from_args(Demo, parser.parse_args([])).inner == Inner(cap=12)
    assert settings_from_args(Demo, parser.parse_args(["--cap", "5"])).inner == Inner(cap=5)


@pytest.mark.parametrize(("name", "text", "message"), [
    ("COUNT", "many", "$EVENTSPEC_TEST_COUNT='many' is not an integer"),
    ("RATIO", "half", "$EVENTSPEC_TEST_RATIO='half' is not a number"),
    ("LOUD", "maybe", "$EVENTSPEC_TEST_LOUD='maybe' is not a switch (1 or 0)"),
    ("FAST", "maybe", "$EVENTSPEC_TEST_FAST='maybe' is not a switch (1 or 0)"),
    ("SIZE", "2", "$EVENTSPEC_TEST_SIZE='2': want AxB, got '2'"),
    ("CAP", "lots", "$EVENTSPEC_TEST_CAP='lots' is not an integer"),
])
def test_a_variable_that_does_not_parse_is_named(
        name: str, text: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PREFIX + name, text)
    with pytest.raises(SettingsError) as refused:
        settings_from_env(Demo, PREFIX)
    assert str(refused.value) == message


def test_a_choice_outside_the_declared_ones_names_the_flag() -> None:
    check_choices(Demo())
    with pytest.raises(SettingsError) as refused:
        check_choices(Demo(mode="c"))
    assert refused.value.in_environment(PREFIX) == (
        "$EVENTSPEC_TEST_MODE (--mode) must be one of a, b, got 'c'")


def test_a_type_without_a_parse_is_refused_at_declaration() -> None:
    @dataclass(frozen=True)
    class Bad:
        pair: tuple[int, int] = setting((1, 2), help="no parse")

    with pytest.raises(TypeError, match=r"pair: .* needs a parse"):
        declared(Bad)

    @dataclass(frozen=True)
    class NotBool:
        level: int = setting(1, on_off=True, help="on_off on an int")

    with pytest.raises(TypeError, match="on_off is for bool"):
        declared(NotBool)
