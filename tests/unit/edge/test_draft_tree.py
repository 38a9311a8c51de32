"""The edge's side of draft trees (``edge/draft_tree.py``): nodes go out once, in id
order, parents first, grouped by the base their roots hang at; a Commit that goes down a
drafted branch makes it the tail; one that leaves the tree starts again at C's end."""

from __future__ import annotations

from eventspec.edge.draft_tree import EdgeTree
from eventspec.shared.contract.types import ROOT


def test_nodes_go_out_once_in_id_order_parents_first() -> None:
    t = EdgeTree(max_per_message=3)
    t.add_draft(10, branches=[(20, 21)])
    t.add_draft(11)
    messages = t.flush(committed_len=0)
    nodes = [n for m in messages for n in m.nodes]
    assert [n.id for n in nodes] == [0, 1, 2, 3] and [len(m.nodes) for m in messages] == [3, 1]
    assert [(n.parent, n.token_id) for n in nodes] == [(ROOT, 10), (ROOT, 20), (1, 21), (0, 11)]
    assert all(m.base == 0 for m in messages) and t.flush(0) == []
    assert nodes[1].logprob < nodes[0].logprob, "the branch is the runner-up"


def test_a_commit_down_a_branch_adopts_it() -> None:
    t = EdgeTree()
    t.add_draft(10, branches=[(20, 21, 22)])
    t.add_draft(11)
    t.flush(0)
    tail = t.on_commit(0, [20], [10, 11])  # the target chose the runner-up
    assert tail == [21, 22] and t.branch_hits == 1 and t.tail_ids == [2, 3]
    t.add_draft(23)
    (msg,) = t.flush(1)
    assert [(n.parent, n.token_id) for n in msg.nodes] == [(3, 23)]  # under the branch


def test_a_commit_off_the_tree_starts_again_at_its_end() -> None:
    t = EdgeTree()
    t.add_draft(10)
    t.flush(0)
    assert t.on_commit(0, [30, 31], [10]) == [] and t.anchor == ("root", 2)
    t.add_draft(12)
    (msg,) = t.flush(2)
    assert msg.base == 2 and msg.nodes[0].parent == ROOT


def test_a_committed_node_not_yet_sent_still_goes_out() -> None:
    """The cloud committed a token the edge drafted but had not sent: the node goes out
    with its children, or they would name a parent the cloud never saw."""
    t = EdgeTree()
    t.add_draft(10)
    t.add_draft(11)
    assert t.on_commit(0, [10], [10, 11]) == [11]
    (msg,) = t.flush(1)
    assert [(n.id, n.parent) for n in msg.nodes] == [(0, ROOT), (1, 0)] and msg.base == 0
