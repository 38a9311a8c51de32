"""docs/layout.md states only what the code says (issue 37): its installed names, floors,
contracts, sizes and module listing are drawn by ``tools/layout_doc.py``, and the size
rule it states holds: no module of the installed packages passes 400 lines, but the
allow-listed ones, and none of those grows."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tools import load_tool

layout = load_tool("layout_doc")


def test_the_page_is_what_the_code_draws() -> None:
    diff = layout.stale()
    assert not diff, f"docs/layout.md is stale: run python tools/layout_doc.py\n{diff}"


def test_no_module_passes_the_limit_but_the_listed_and_none_grows() -> None:
    over = layout.over_limit()
    listing = "\n".join(f"  {rel}: {n} lines (held at {layout.OVER_LIMIT.get(rel, '-')})"
                        for rel, n in sorted(over.items(), key=lambda kv: -kv[1]))
    assert layout.size_problems() == [], (
        f"modules over {layout.LIMIT} lines now:\n{listing}")


def test_the_allow_list_only_holds_real_offenders() -> None:
    for rel, allowed in layout.OVER_LIMIT.items():
        assert allowed > layout.LIMIT, rel
        assert rel in {p.relative_to(layout.ROOT).as_posix() for _, p in layout.modules()}


def test_the_size_rule_names_a_new_offender_and_one_that_grew(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = dict(layout.over_limit())
    some = next(iter(layout.OVER_LIMIT))
    fake = {**real, some: layout.OVER_LIMIT[some] + 1, "edge/new_module.py": 401}
    monkeypatch.setattr(layout, "over_limit", lambda: fake)
    problems = layout.size_problems()
    assert any(p.startswith(f"{some} grew to") for p in problems)
    assert any(p.startswith("edge/new_module.py has 401 lines") for p in problems)
    del fake[some]
    monkeypatch.setattr(layout, "over_limit", lambda: fake)
    assert any(p.startswith(f"{some} has ") and "take it off OVER_LIMIT" in p
               for p in layout.size_problems())


def test_a_stale_block_is_found_and_redrawn(tmp_path: Path) -> None:
    page = tmp_path / "layout.md"
    page.write_text("prose\n\n<!-- layout: names -->\n| old | table |\n<!-- /layout -->\nend\n")
    diff = layout.stale(page)
    assert "-| old | table |" in diff and "+| `edge/` | `eventspec.edge` |" in diff
    page.write_text(layout.render_page(page.read_text()))
    assert layout.stale(page) == ""
    assert page.read_text().startswith("prose\n\n<!-- layout: names -->\n")
    assert page.read_text().endswith("<!-- /layout -->\nend\n")


def test_a_purpose_is_the_docstrings_first_sentence_as_markdown(tmp_path: Path) -> None:
    mod = tmp_path / "m.py"
    mod.write_text('"""Uses :class:`~a.b.Thing` and ``x|y`` for a | b. Then more.\n\n'
                   'Body."""\n')
    assert layout.purpose(mod) == "Uses `Thing` and `x|y` for a \\| b."
