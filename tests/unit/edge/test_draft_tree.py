"""The edge's draft tree (``edge/drafting/tree.py``): grown likeliest path first within its
budget, nodes sent once in id order with parents first, re-rooted on commits (kept
below C's new end, pruned elsewhere), and restarted at C's end when C leaves it."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.edge.drafting.tree import EdgeTree, Key, TreeShape
from eventspec.shared.contract.types import ROOT

LOG_TOP, LOG_OTHER = math.log(0.8), math.log(0.1)


def kids(*tokens: int) -> list[tuple[int, float]]:
    """Children in rank order: the first is the top-1."""
    return [(t, LOG_TOP if i == 0 else LOG_OTHER) for i, t in enumerate(tokens)]


def test_nodes_go_out_once_in_id_order_parents_first() -> None:
    t = EdgeTree(max_per_message=3, shape=TreeShape(top_k=2))
    (root,) = t.frontier(4)
    assert root == ("root", 0) and t.expand(root, kids(10, 20)) == 2
    first = t.frontier(1)[0]
    assert t.path(first) == [10], "the likeliest leaf grows first"
    t.expand(first, kids(11, 21))
    messages = t.flush(committed_len=0)
    nodes = [n for m in messages for n in m.nodes]
    assert [n.id for n in nodes] == [0, 1, 2, 3] and [len(m.nodes) for m in messages] == [3, 1]
    assert [(n.parent, n.token_id) for n in nodes] == [(ROOT, 10), (ROOT, 20), (0, 11), (0, 21)]
    assert all(m.base == 0 for m in messages) and t.flush(0) == []
    assert t.best_path() == [10, 11]


def test_growth_follows_cumulative_probability_within_the_budget() -> None:
    """A deep likely chain is grown before an unlikely sibling; once the budget is full
    only the likeliest leaf grows (the path the cloud verifies next never waits), until
    the cloud's cap on live nodes stops everything."""
    t = EdgeTree(shape=TreeShape(node_budget=6, top_k=2, per_forward=1, cloud_nodes=10))
    t.expand(t.frontier(1)[0], kids(10, 20))  # 0.8 / 0.1
    t.expand(t.frontier(1)[0], kids(11, 21))  # 10 -> 0.64 beats 20 at 0.1
    t.expand(t.frontier(1)[0], kids(12, 22))  # 10, 11 -> 0.512
    assert t.live == 6 and t.best_path() == [10, 11, 12]
    (only,) = t.frontier(4)
    assert t.path(only) == [10, 11, 12], "over the budget: the likeliest leaf alone"
    t.expand(only, kids(13, 23))
    (last,) = t.frontier(4)
    t.expand(last, kids(14, 24))
    t.flush(0)
    assert t.cloud_live() == 10 and t.frontier(4) == [], "the cloud's cap of 10 is reached"


def test_off_the_likeliest_path_a_node_keeps_its_top_branch_children() -> None:
    """The anchor and the likeliest path branch into the top k; a node off it (a sibling,
    where a rejection lands) grows its top ``branch_top_k`` only: a chain under each
    sibling carries the next step on after a rejection, and its own siblings (second
    order) are not worth their nodes (benchmarks/pipeline_sim.py: 2.06 tokens a step at
    48 nodes a step, against 2.00 at 87 with every node branching, 128 nodes, 19 ms)."""
    t = EdgeTree(shape=TreeShape(top_k=3, branch_top_k=1))
    assert t.expand(("root", 0), kids(10, 20, 30)) == 3
    assert t.expand(0, kids(11, 21, 31)) == 3, "on the likeliest path: the top 3"
    assert t.expand(1, kids(40, 41, 42)) == 1, "the sibling 20: its top-1 alone"
    assert t.expand(3, kids(12, 22, 32)) == 3, "10 -> 11 is still the likeliest path"
    wide = EdgeTree(shape=TreeShape(top_k=3, branch_top_k=3))
    wide.expand(("root", 0), kids(10, 20, 30))
    assert wide.expand(1, kids(40, 41, 42)) == 3


def test_a_commit_down_a_sibling_keeps_its_subtree_and_prunes_the_rest() -> None:
    t = EdgeTree(shape=TreeShape(top_k=2, branch_top_k=2))
    t.expand(("root", 0), kids(10, 20))
    t.expand(1, kids(30, 31))  # grow under the sibling 20 (id 1)
    t.expand(0, kids(11, 12))
    t.flush(0)
    t.on_commit(0, [20])  # the target chose the runner-up
    assert t.branch_hits == 1 and t.anchor == 1 and t.best_path() == [30]
    assert t.live == 2 and t.nodes_pruned == 3, "10 and its two children are gone"
    assert t.path(t.frontier(1)[0]) == [30]
    (leaf,) = t.frontier(1)
    t.expand(leaf, kids(40))
    (msg,) = t.flush(1)
    assert [(n.parent, n.token_id) for n in msg.nodes] == [(leaf, 40)]


def test_a_commit_off_the_tree_starts_again_at_its_end() -> None:
    t = EdgeTree()
    t.expand(("root", 0), kids(10))
    t.flush(0)
    t.on_commit(0, [30, 31])
    assert t.anchor == ("root", 2) and t.misses == 1 and t.live == 0
    assert t.frontier(1) == [("root", 2)]
    t.expand(("root", 2), kids(12))
    (msg,) = t.flush(2)
    assert msg.base == 2 and msg.nodes[0].parent == ROOT


def test_a_committed_node_not_yet_sent_still_goes_out() -> None:
    """The cloud committed a token the edge drafted but had not sent: the node goes out
    with its children, or they would name a parent the cloud never saw."""
    t = EdgeTree(shape=TreeShape(top_k=1))
    t.expand(("root", 0), kids(10))
    t.expand(0, kids(11))
    t.on_commit(0, [10])
    (msg,) = t.flush(1)
    assert [(n.id, n.parent) for n in msg.nodes] == [(0, ROOT), (1, 0)] and msg.base == 0


def test_the_depth_cap_and_the_answer_cap_and_eos_end_growth() -> None:
    t = EdgeTree(shape=TreeShape(max_depth=2, top_k=1))
    t.expand(("root", 0), kids(10))
    t.expand(0, kids(11))
    assert t.frontier(4) == [], "two below C's end"
    t = EdgeTree(shape=TreeShape(top_k=2))
    t.expand(("root", 0), kids(2, 5))
    assert t.frontier(4, stop_token=2) == [1], "nothing grows after EOS"
    assert t.frontier(4, max_position=1) == [], "the answer ends at one token"


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10_000), ops=st.lists(st.integers(0, 9), min_size=1, max_size=60),
       budget=st.integers(2, 40), top_k=st.integers(1, 4))
def test_bookkeeping_holds_under_any_growth_and_commits(seed: int, ops: list[int], budget: int,
                                                        top_k: int) -> None:
    """Whatever grows and whatever is committed: the budget holds (beyond it, one node per
    call), the cloud's cap always holds, every node sent names a parent sent before it
    (or a root), and after a commit every node offered to grow lies below C's new end."""
    import random

    rng = random.Random(seed)
    t = EdgeTree(max_per_message=7,
                 shape=TreeShape(node_budget=budget, top_k=top_k, cloud_nodes=3 * budget))
    committed: list[int] = []
    sent: set[int] = set()
    for op in ops:
        if op < 6:
            live = t.live
            keys = t.frontier(3)
            assert len(keys) <= 1 or live + top_k * len(keys) <= budget
            for key in keys:
                t.expand(key, kids(*rng.sample(range(50), top_k)))
            assert t.cloud_live() <= 3 * budget
        elif op < 8:
            for msg in t.flush(len(committed)):
                for n in msg.nodes:
                    assert n.parent == ROOT or n.parent in sent
                    sent.add(n.id)
        else:  # commit one or two tokens: the best path's, a sibling's, or off the tree
            choice = rng.random()
            best = t.best_path()
            tokens = (best[:2] if choice < 0.5 and best else [rng.randrange(50)])
            before = len(committed)
            t.on_commit(before, tokens)
            committed.extend(tokens)
            assert t.committed_len == len(committed)
            for key in t.frontier(budget):
                assert t.is_live(key)
                assert len(t.path(key)) <= t.max_depth
    keys: list[Key] = t.frontier(4)
    assert all(t.is_live(k) for k in keys)
