"""``eventspec toy`` lives in the demo world, above the client: the client's CLI finds
it through the ``eventspec.commands`` entry point instead of importing it."""

from __future__ import annotations

import importlib.metadata

import pytest

from eventspec.shared.client import cli


def test_eventspec_toy_reaches_the_demo_worlds_cli(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["toy", "--help"])
    assert done.value.code == 0
    assert "{train,eval}" in capsys.readouterr().out


def test_a_missing_entry_point_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **_: importlib.metadata.EntryPoints(()))
    with pytest.raises(SystemExit, match=r"eventspec toy: not installed .*reinstall eventspec"):
        cli.main(["toy", "train"])
