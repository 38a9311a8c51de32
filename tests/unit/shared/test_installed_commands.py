"""``eventspec toy`` lives in the demo world, above the client: the client's CLI finds
it through the ``eventspec.commands`` entry point instead of importing it. The nodes'
``--model tiny-random`` writers live there too, found through ``eventspec.builtin_models``."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest

from eventspec.cloud import model_dirs as cloud_model_dirs
from eventspec.edge import model_dirs as edge_model_dirs
from eventspec.shared.client import cli
from eventspec.shared.node import node_cli

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())


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


# ``--model tiny-random``: the node CLIs find the demo world's writers through the
# ``eventspec.builtin_models`` entry points, so no node imports the demo world.
BUILTIN_MODELS = {
    "edge.tiny-random": "eventspec.demoworld.tiny_draft:write_scratch_draft",
    "cloud.tiny-random": "eventspec.demoworld.tiny_target:write_scratch_target",
}


def test_the_builtin_model_entry_points_are_declared_and_installed() -> None:
    declared = PYPROJECT["project"]["entry-points"][node_cli.BUILTIN_MODELS]
    assert declared == BUILTIN_MODELS
    installed = {ep.name: ep.value
                 for ep in importlib.metadata.entry_points(group=node_cli.BUILTIN_MODELS)}
    assert installed == BUILTIN_MODELS, "reinstall eventspec: its entry points are stale"
    for name in BUILTIN_MODELS:
        node, model = name.split(".", 1)
        assert model == {"edge": edge_model_dirs, "cloud": cloud_model_dirs}[node].TINY_RANDOM
        assert callable(next(iter(importlib.metadata.entry_points(
            group=node_cli.BUILTIN_MODELS, name=name))).load())


def test_builtin_model_writes_through_the_entry_point(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    calls: list[tuple[Path, int]] = []

    class Found:
        def load(self) -> object:
            return lambda scratch, seed: calls.append((scratch, seed)) or scratch / "m"

    def entry_points(**kw: str) -> list[Found]:
        assert kw == {"group": "eventspec.builtin_models", "name": "edge.tiny-random"}
        return [Found()]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    write = node_cli.builtin_model("eventspec-edge", "edge", "tiny-random")
    assert calls == []  # found now, loaded (torch and all) only when the server starts
    assert write(tmp_path, 7) == tmp_path / "m"
    assert calls == [(tmp_path, 7)]


def test_a_missing_builtin_model_is_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **_: importlib.metadata.EntryPoints(()))
    monkeypatch.setattr(node_cli, "SOURCE_PYPROJECT", Path("/nonexistent/pyproject.toml"))
    with pytest.raises(SystemExit) as done:
        node_cli.builtin_model("eventspec-cloud", "cloud", "tiny-random")
    assert done.value.code == 2
    assert ("--model tiny-random: not installed (no 'eventspec.builtin_models' entry point "
            "'cloud.tiny-random'; reinstall eventspec)") in capsys.readouterr().err


def test_a_source_tree_without_metadata_finds_the_models_in_its_pyproject(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU machine runs the checkout from PYTHONPATH, with no installed metadata."""
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **_: importlib.metadata.EntryPoints(()))
    for key, value in BUILTIN_MODELS.items():
        found = node_cli.find_entry_point(node_cli.BUILTIN_MODELS, key)
        assert found is not None and found.value == value and callable(found.load())
    assert node_cli.find_entry_point(node_cli.BUILTIN_MODELS, "edge.nonesuch") is None
