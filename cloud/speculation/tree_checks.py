"""The structural checks of draft trees, run on the stream before anything reaches the
engine thread: what makes a tree message malformed (the edge is broken) rather than late.

Why here and stateful: a tree arrives in pieces (each ``Drafts`` message carries only
nodes not sent before, docs/trees.md), so whether a parent exists, whether an id was
used before and how deep a node sits depend on what the request sent earlier. The
stream keeps that bookkeeping per request; the cloud's tree itself
(:mod:`eventspec.cloud.speculation.draft_forest`) lives on the engine thread and never sees a
malformed node.

Rules (each violation is INVALID_ARGUMENT naming the field, and the session goes on
without that message):

- ids increase within a request, so an id is never reused and a parent always comes
  before its child: no duplicate, no cycle;
- a parent is ``ROOT`` (-1) or an id sent before;
- a node sits at most ``max_tree_depth`` below the committed answer's end (the edge's
  tree is kept across steps and re-rooted as C grows, so depth counts from C, not from
  the root the tree first hung at);
- a request holds at most ``max_tree_nodes`` live nodes (those the committed answer has
  not passed yet), at most ``max_draft_tokens`` per message.

A node whose parent the committed answer passed more than ``KEEP_BEHIND`` positions ago
is late, not wrong: it is dropped quietly (counted as stale), with its descendants in
the same message. Nearer ones are kept, since the edge hears of commits a round trip
late and may still be extending a node C went through (the cloud's tree decides).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from eventspec.cloud.speculation.draft_forest import KEEP_BEHIND
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.types import ROOT, DraftNode, DraftTail

__all__ = ["TreeChecks"]


#: A node's attribute -> its column in the wire's packed form (``Drafts.node_ids``...).
_COLUMN = {"id": "node_ids", "parent": "node_parents", "token_id": "node_tokens",
           "logprob": "node_logprobs"}


def _node_name(i: int, attr: str) -> str:
    """The field of node ``i`` sent as a ``DraftNode`` message (``attr`` "" for the node)."""
    return f"Drafts.nodes[{i}]" + (f".{attr}" if attr else "")


def _column_name(i: int, attr: str) -> str:
    """The field of node ``i`` sent as the packed columns."""
    return f"Drafts.{_COLUMN[attr]}[{i}]" if attr else f"Drafts.node_ids[{i}]'s node"


@dataclass
class TreeChecks:
    """One request's tree bookkeeping on the stream."""

    max_nodes: int
    max_depth: int
    max_per_message: int
    text_vocab_size: int
    #: Known node id -> (position in the answer, depth below its root): the live ones
    #: and, for ``KEEP_BEHIND`` positions, those the committed answer has passed (a
    #: child of one may still extend C: the edge hears of commits a round trip late).
    _live: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: How many known nodes sit at each position (the live count without a walk).
    _at: dict[int, int] = field(default_factory=dict)
    _committed_len: int = 0
    _last_id: int = -1
    #: Nodes dropped as late (their parent was passed by the committed answer).
    stale: int = 0

    def check(self, tail: DraftTail, committed_len: int) -> DraftTail:
        """``tail`` with its late nodes dropped, or InvalidInput naming the field.

        ``committed_len``: the committed tokens the stream has received (the edge has
        seen at most these). Nothing is recorded unless the whole message passes."""
        if tail.nodes and tail.token_ids:
            raise InvalidInput("Drafts carries both token_ids (a chain) and nodes (a tree); "
                               "send one")
        nodes_field = "Drafts.node_ids" if tail.columns else "Drafts.nodes"
        if len(tail.nodes) > self.max_per_message:
            raise InvalidInput(f"{nodes_field}: {len(tail.nodes)} nodes exceed the cap of "
                               f"{self.max_per_message} per message "
                               "(GetServerInfo.limits.max_draft_tokens)")
        self._forget_passed(committed_len)
        added: dict[int, tuple[int, int]] = {}
        late: set[int] = set()
        kept: list[DraftNode] = []
        last = self._last_id
        name = _column_name if tail.columns else _node_name
        for i, node in enumerate(tail.nodes):
            if node.id <= last:
                raise InvalidInput(f"{name(i, 'id')} {node.id} repeats or goes back: ids "
                                   f"increase within a request (the last was {last})")
            last = node.id
            if not 0 <= node.token_id < self.text_vocab_size:
                raise InvalidInput(f"{name(i, 'token_id')} {node.token_id} is outside the "
                                   f"shared text vocabulary [0, {self.text_vocab_size})")
            if node.logprob != node.logprob or node.logprob > 0:  # NaN, or a probability > 1
                raise InvalidInput(f"{name(i, 'logprob')} {node.logprob} is not a "
                                   "log-probability (<= 0)")
            if node.parent in late:  # its parent was late: so is it
                late.add(node.id)
                continue
            place = self._place(node, tail.base, added, name, i)
            if place is None:
                late.add(node.id)
                continue
            below = place[0] - (committed_len - 1)
            if below > self.max_depth:
                raise InvalidInput(f"{name(i, '')} sits {below} below the committed answer's end, "
                                   f"deeper than {self.max_depth} "
                                   "(GetServerInfo.limits.max_tree_depth)")
            added[node.id] = place
            kept.append(node)
        live = self.live + sum(pos >= committed_len - 1 for pos, _ in added.values())
        if live > self.max_nodes:
            raise InvalidInput(f"{nodes_field}: {live} live nodes exceed the cap of "
                               f"{self.max_nodes} per request "
                               "(GetServerInfo.limits.max_tree_nodes)")
        self._last_id = last
        self._live.update(added)
        for pos, _ in added.values():
            self._at[pos] = self._at.get(pos, 0) + 1
        self.stale += len(late)
        return replace(tail, nodes=tuple(kept)) if late else tail

    def _place(self, node: DraftNode, base: int, added: dict[int, tuple[int, int]],
               name: Callable[[int, str], str], i: int) -> tuple[int, int] | None:
        """(position, depth) of ``node``; None when its parent is late (passed)."""
        if node.parent == ROOT:
            return base, 1
        if node.parent >= node.id:
            raise InvalidInput(f"{name(i, 'parent')} {node.parent} is not an earlier node: "
                               f"a parent is sent before its children (node {node.id})")
        parent = added.get(node.parent) or self._live.get(node.parent)
        if parent is not None:
            return parent[0] + 1, parent[1] + 1
        if node.parent > self._last_id and node.parent not in added:
            raise InvalidInput(f"{name(i, 'parent')} {node.parent} is no node of this "
                               "request")
        return None  # sent earlier and passed by the committed answer: late

    def _forget_passed(self, committed_len: int) -> None:
        """Forget nodes ``KEEP_BEHIND`` positions behind C's end (as the cloud's tree does)."""
        self._committed_len = max(self._committed_len, committed_len)
        floor = committed_len - 1 - KEEP_BEHIND
        if not any(pos < floor for pos in self._at):
            return
        self._live = {i: v for i, v in self._live.items() if v[0] >= floor}
        self._at = {pos: n for pos, n in self._at.items() if pos >= floor}

    @property
    def live(self) -> int:
        """Live nodes now: those the committed answer has not passed."""
        return sum(n for pos, n in self._at.items() if pos >= self._committed_len - 1)
