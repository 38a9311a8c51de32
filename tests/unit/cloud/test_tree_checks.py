"""The stream's checks of draft trees (issue 36): malformed trees are INVALID_ARGUMENT
naming the field and leave the bookkeeping as it was; late nodes are dropped quietly;
any well-formed tree passes whole, within the caps advertised in GetServerInfo.limits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.cloud.speculation.draft_forest import KEEP_BEHIND
from eventspec.cloud.speculation.tree_checks import TreeChecks
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.types import ROOT, DraftNode, DraftTail


def checks(max_nodes: int = 64, max_depth: int = 8) -> TreeChecks:
    return TreeChecks(max_nodes=max_nodes, max_depth=max_depth, max_per_message=32,
                      text_vocab_size=100)


def tree(*nodes: tuple[int, int, int], base: int = 0) -> DraftTail:
    return DraftTail(base, (), nodes=tuple(DraftNode(i, p, t, -0.5) for i, p, t in nodes))


@pytest.mark.parametrize(("message", "field"), [
    (tree((0, ROOT, 5), (0, 0, 6)), r"Drafts.nodes\[1\].id 0 repeats"),
    (tree((3, ROOT, 5), (2, ROOT, 6)), r"Drafts.nodes\[1\].id 2 repeats or goes back"),
    (tree((0, 7, 5)), r"Drafts.nodes\[0\].parent 7 is not an earlier node"),
    (tree((0, ROOT, 5), (4, 2, 6)), r"Drafts.nodes\[1\].parent 2 is no node of this request"),
    (tree((0, ROOT, 100)), r"Drafts.nodes\[0\].token_id 100 is outside"),
    (tree((0, ROOT, 5), (1, 0, 6), (2, 1, 7), (3, 2, 8)),
     r"Drafts.nodes\[3\] sits 4 below the committed"),
    (DraftTail(0, (5,), nodes=(DraftNode(0, ROOT, 5),)), "both token_ids"),
])
def test_a_malformed_tree_names_the_field_and_changes_nothing(message: DraftTail,
                                                              field: str) -> None:
    c = checks(max_depth=3)
    with pytest.raises(InvalidInput, match=field):
        c.check(message, 0)
    assert c.live == 0
    assert c.check(tree((0, ROOT, 5)), 0).nodes  # the request goes on


def test_a_nan_log_probability_is_refused() -> None:
    bad = DraftTail(0, (), nodes=(DraftNode(0, ROOT, 5, float("nan")),))
    with pytest.raises(InvalidInput, match=r"Drafts.nodes\[0\].logprob nan"):
        checks().check(bad, 0)


def test_the_node_caps() -> None:
    c = checks(max_nodes=4)
    c.check(tree((0, ROOT, 5), (1, 0, 6), (2, 1, 7)), 0)
    with pytest.raises(InvalidInput, match=r"5 live nodes exceed the cap of 4 per request"):
        c.check(tree((3, 2, 8), (4, 3, 9)), 0)
    c.check(tree((5, 2, 8)), 0)  # what failed left nothing behind: 4 live now
    assert c.live == 4
    c.check(tree((6, ROOT, 3), base=3), 3)  # C passed positions 0..2: their nodes are gone
    assert c.live == 3  # nodes 2 (position 2, C[-1]) and 5 stay; 6 is new
    with pytest.raises(InvalidInput, match="33 nodes exceed the cap of 32 per message"):
        c.check(tree(*((i, ROOT, 5) for i in range(100, 133))), 3)


def test_a_late_node_is_dropped_with_its_children() -> None:
    c = checks()
    c.check(tree((0, ROOT, 5), (1, 0, 6)), 0)
    c.check(tree((2, 1, 7)), 2)  # node 2 sits at position 2
    far = KEEP_BEHIND + 3  # C passed positions 0 and 1 more than KEEP_BEHIND ago
    out = c.check(tree((3, 0, 7), (4, 3, 8), (5, 2, 9)), far)
    assert [n.id for n in out.nodes] == [5] and c.stale == 2


def test_a_child_of_a_node_c_passed_a_round_trip_ago_still_arrives() -> None:
    """The edge hears of commits a round trip late: it may extend a node the cloud's C
    went through a few tokens ago. The node must reach the cloud's tree (which keeps
    what extends C); dropping it as late lost every draft below it (issue 36)."""
    c = checks()
    c.check(tree((0, ROOT, 5), (1, 0, 6)), 0)
    out = c.check(tree((2, 1, 7), (3, 2, 8)), 3)  # C is 3 long: nodes 0 and 1 passed
    assert [n.id for n in out.nodes] == [2, 3] and c.stale == 0
    assert c.live == 2, "only nodes at or past C's end count as live"


@st.composite
def random_trees(draw: st.DrawFn) -> list[tuple[int, int, int]]:
    n = draw(st.integers(1, 30))
    out: list[tuple[int, int, int]] = []
    depth: dict[int, int] = {}
    for i in range(n):
        choices = [ROOT, *[j for j in depth if depth[j] < 6]]
        parent = draw(st.sampled_from(choices))
        depth[i] = 1 if parent == ROOT else depth[parent] + 1
        out.append((i, parent, draw(st.integers(0, 99))))
    return out


@settings(max_examples=300, deadline=None)
@given(nodes=random_trees(), cut=st.integers(0, 30))
def test_any_well_formed_tree_passes_whole_in_pieces(nodes: list[tuple[int, int, int]],
                                                     cut: int) -> None:
    """A tree within the caps passes whole, split into two messages anywhere (a parent
    always before its child), and its nodes are all live before C moves."""
    c = checks(max_nodes=64, max_depth=6)
    first, second = nodes[:cut], nodes[cut:]
    kept = [n.id for part in (first, second) if part for n in c.check(tree(*part), 0).nodes]
    assert kept == [i for i, _, _ in nodes] and c.live == len(nodes) and c.stale == 0


def test_depth_counts_from_the_committed_end_so_a_kept_tree_can_grow_all_answer() -> None:
    """The edge keeps its tree across commits: 20 nodes deep under one root is fine once
    C has moved 18 tokens down it (it failed when depth counted from the root)."""
    c = checks(max_depth=3)
    for i in range(20):
        c.check(tree((i, ROOT if i == 0 else i - 1, 5)), max(0, i - 1))
    assert c.live <= 3
