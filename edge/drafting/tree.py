"""The edge's draft tree: grown by likelihood below C, sent once, re-rooted on commits. Pure.

Why (issue 36): a chain dies at its first rejection and the edge hears of it a round
trip later, so at RTT 20 ms the cloud decoded alone for about two steps after every
rejection. The edge now keeps a tree below the committed answer C and grows it without
waiting for commits: each forward expands the unexpanded nodes whose whole path is the
likeliest (cumulative draft log-probability, as EAGLE-2, Li et al. 2024, and SpecExec,
Svirschevski et al. 2024), each into its top-k children, within a node budget and a
depth cap. When a Commit arrives the tree is re-rooted at C's new end: what C went
through becomes the path above the new root, every branch it ruled out is pruned, and
growth goes on below. The cloud keeps the same tree
(:mod:`eventspec.cloud.speculation.draft_forest`)
and, when the target's correction is a child the edge drafted, goes on down it with no
round trip.

A node's parent is another node's id, or a root key ``("root", base)``: the token right
after the first ``base`` committed tokens (sent as ``parent=-1`` in a message whose
``base`` is that length). Ids increase in creation order and a parent is created before
its children, so nodes sent in id order always name a parent sent before.

Log-probabilities are cumulative from the tree's first root; re-rooting subtracts the
same amount from every live node, so the order of the frontier never needs recomputing.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from eventspec.shared.contract.types import ROOT, DraftNode, DraftTail

__all__ = ["EdgeTree", "Key", "TreeShape"]

Key = int | tuple[str, int]  # a node id, or ("root", base)


@dataclass(frozen=True)
class TreeShape:
    """How an edge grows its trees (``--tree-nodes``, ``--tree-top-k``, ``--tree-per-forward``,
    ``--tree-branch-top-k``): live nodes at most, children per expansion on the likeliest
    path, nodes expanded per draft forward; the cloud's caps (``max_tree_depth`` below C's
    end, ``max_tree_nodes`` live); and children per expansion off the likeliest path."""

    node_budget: int = 128
    top_k: int = 4
    per_forward: int = 8
    max_depth: int = 64
    cloud_nodes: int = 512
    branch_top_k: int = 1


@dataclass
class _Node:
    parent: Key
    token: int
    logprob: float  # the drafter's log-probability of this token after its path
    cum: float  # sum of ``logprob`` from the first root (ordering only)
    depth: int  # position in the answer (C[depth] if committed)
    children: dict[int, int] = field(default_factory=dict)  # token -> id


@dataclass(frozen=True)
class _Unsent:
    node: DraftNode
    root_base: int | None  # the base a root hangs at; None for a non-root node


class EdgeTree:
    """One request's draft tree on the edge: growth, ids, unsent nodes, C's place in it.

    The shape's ``node_budget`` caps the live nodes (those below C's end), ``max_depth``
    a node's distance below C's end; ``top_k`` children per expansion."""

    def __init__(self, max_per_message: int = 128, shape: TreeShape = TreeShape()) -> None:
        self.max_per_message = max(1, max_per_message)
        self.node_budget = max(1, shape.node_budget)
        self.max_depth = max(1, shape.max_depth)
        self.top_k = max(1, shape.top_k)
        self.per_forward = max(1, shape.per_forward)
        self.branch_top_k = max(1, min(shape.branch_top_k, self.top_k))
        self.cloud_nodes = max(1, shape.cloud_nodes)
        #: Sent nodes by position: the cloud counts a node live until C passes its
        #: position, even on a branch C ruled out, and refuses a request over its cap.
        self._sent_at: dict[int, int] = {}
        self._ids = itertools.count()
        self._nodes: dict[int, _Node] = {}
        self._root_children: dict[int, int] = {}  # children of the anchor when it is a root
        self._expanded: set[Key] = set()
        self._unsent: list[_Unsent] = []
        self._pending: list[int] = []
        #: Where C's last token stands: a node id, or a root key when C is off the tree.
        self.anchor: Key = ("root", 0)
        #: Commits that left the edge's likeliest path but stayed in the tree.
        self.branch_hits = 0
        #: Commits that left the tree (growth starts again at C's end).
        self.misses = 0
        self.nodes_sent = 0
        self.nodes_pruned = 0

    # -- reading -----------------------------------------------------------------------

    def _kids(self, key: Key) -> dict[int, int]:
        if isinstance(key, tuple):
            return self._root_children if key == self.anchor else {}
        node = self._nodes.get(key)
        return node.children if node is not None else {}

    def _cum(self, key: Key) -> float:
        return self._nodes[key].cum if isinstance(key, int) else self._anchor_cum()

    def _anchor_cum(self) -> float:
        return self._nodes[self.anchor].cum if isinstance(self.anchor, int) else 0.0

    def _depth(self, key: Key) -> int:
        """Position in the answer of the token after ``key`` (its children's)."""
        return self._nodes[key].depth + 1 if isinstance(key, int) else key[1]

    @property
    def committed_len(self) -> int:
        """C's length as the tree knows it (the anchor's children's position, and the
        tokens pending past it)."""
        return self._depth(self.anchor) + len(self._pending)

    @property
    def live(self) -> int:
        """Nodes below C's end (what the budget counts)."""
        count, stack = 0, list(self._kids(self.anchor).values())
        while stack:
            count += 1
            stack.extend(self._nodes[stack.pop()].children.values())
        return count

    def path(self, key: Key) -> list[int]:
        """Tokens from C's end down to ``key`` (inclusive): its draft context after C."""
        out: list[int] = []
        while isinstance(key, int) and key != self.anchor:
            node = self._nodes[key]
            out.append(node.token)
            key = node.parent
        out.reverse()
        return out

    def best_path(self) -> list[int]:
        """The likeliest path below C's end, child by child: what the cloud verifies next
        (the edge's preview)."""
        if self._pending:
            return []
        return [self._nodes[nid].token for nid in self._likeliest_ids()]

    def _likeliest_ids(self) -> Iterator[int]:
        """The nodes of the likeliest path below C's end, child by child: the child with
        the highest log-probability (the newest on a tie)."""
        kids = self._kids(self.anchor)
        while kids:
            nid = max(kids.values(), key=lambda i: (self._nodes[i].logprob, i))
            yield nid
            kids = self._nodes[nid].children

    def _on_best_path(self, key: Key) -> bool:
        """``key`` is C's end or on the likeliest path below it (where the next step's
        rejection can land, so its siblings are worth drafting)."""
        return key == self.anchor or (isinstance(key, int) and key in self._likeliest_ids())

    def cloud_live(self) -> int:
        """An upper bound of the nodes the cloud holds live now: sent or about to be, at
        positions C (as the edge knows it) has not passed."""
        end = self.committed_len - 1
        return sum(n for pos, n in self._sent_at.items() if pos >= end) + len(self._unsent)

    def frontier(self, m: int, *, stop_token: int | None = None,
                 max_position: int | None = None) -> list[Key]:
        """Up to ``m`` unexpanded nodes to grow next, likeliest path first: within the depth
        cap, below ``max_position`` (the answer's token cap), never after ``stop_token``.

        The likeliest one grows whenever the cloud's cap has room, so the path the cloud
        verifies next never waits; the others only while the node budget has room
        (``top_k`` children each): they are the branches a rejection falls back on."""
        cloud_room = (self.cloud_nodes - self.cloud_live()) // self.top_k
        room = (self.node_budget - self.live) // self.top_k
        if cloud_room <= 0 or m <= 0:
            return []
        if self._pending:  # only C's end's children can tell where C went
            return [] if self.anchor in self._expanded else [self.anchor]
        base_depth = self.committed_len
        limit = base_depth + self.max_depth
        if max_position is not None:
            limit = min(limit, max_position)
        candidates: list[tuple[float, int, Key]] = []
        stack: list[Key] = [self.anchor]
        while stack:
            key = stack.pop()
            kids = self._kids(key)
            stack.extend(kids.values())
            if key in self._expanded or self._depth(key) >= limit:
                continue
            if (isinstance(key, int) and stop_token is not None
                    and self._nodes[key].token == stop_token):
                continue
            candidates.append((-self._cum(key), key if isinstance(key, int) else -1, key))
        best = heapq.nsmallest(min(m, max(room, 1), cloud_room), candidates,
                               key=lambda c: (c[0], c[1]))
        return [c[2] for c in best] if room > 0 else [c[2] for c in best[:1]]

    # -- growing -----------------------------------------------------------------------

    def expand(self, key: Key, children: Sequence[tuple[int, float]]) -> int:
        """Add ``key``'s drafted children ``(token, logprob)``; returns how many are new.
        A key the commits have since ruled out (or passed) is ignored (0)."""
        if not self.is_live(key) or key in self._expanded:
            return 0
        self._expanded.add(key)
        added = 0
        k = self.top_k if self._on_best_path(key) else self.branch_top_k
        for token, logprob in children[:k]:
            added += self._child(key, int(token), float(logprob))
        if key == self.anchor and self._pending:
            pending, self._pending = self._pending, []
            self._catch_up(pending)
        return added

    def _catch_up(self, pending: list[int]) -> None:
        """C's end was waiting at a node that now has children: follow the pending tokens."""
        restart_at = self.committed_len + len(pending)
        if pending[0] not in self._kids(self.anchor):
            self._restart(restart_at)
            return
        self.on_commit(restart_at - len(pending), pending)

    def is_live(self, key: Key) -> bool:
        """``key`` is C's end or below it."""
        if key == self.anchor:
            return True
        while isinstance(key, int):
            node = self._nodes.get(key)
            if node is None:
                return False
            key = node.parent
            if key == self.anchor:
                return True
        return False

    def _child(self, parent: Key, token: int, logprob: float) -> int:
        kids = self._root_children if isinstance(parent, tuple) else self._nodes[parent].children
        if token in kids:
            return 0
        node_id = next(self._ids)
        kids[token] = node_id
        self._nodes[node_id] = _Node(parent, token, logprob, self._cum(parent) + logprob,
                                     self._depth(parent))
        root_base = parent[1] if isinstance(parent, tuple) else None
        wire_parent = ROOT if isinstance(parent, tuple) else parent
        self._unsent.append(_Unsent(DraftNode(node_id, wire_parent, token, logprob), root_base))
        return 1

    # -- sending -----------------------------------------------------------------------

    def flush(self, committed_len: int, sent_at_ms: float = 0.0) -> list[DraftTail]:
        """The unsent nodes as messages, in id order: a new message where a root's base
        changes or the per-message cap is reached."""
        out: list[DraftTail] = []
        base: int | None = None
        batch: list[DraftNode] = []
        for item in self._unsent:
            root = item.root_base
            if batch and (len(batch) >= self.max_per_message
                          or (root is not None and base is not None and root != base)):
                out.append(DraftTail(base if base is not None else committed_len, (),
                                     sent_at_ms, tuple(batch)))
                batch, base = [], None
            if root is not None:
                base = root
            batch.append(item.node)
        if batch:
            out.append(DraftTail(base if base is not None else committed_len, (), sent_at_ms,
                                 tuple(batch)))
        self.nodes_sent += len(self._unsent)
        for item in self._unsent:
            pos = self._nodes[item.node.id].depth if item.node.id in self._nodes else 0
            self._sent_at[pos] = self._sent_at.get(pos, 0) + 1
        end = self.committed_len - 1
        self._sent_at = {p: n for p, n in self._sent_at.items() if p >= end}
        self._unsent = []
        return out

    @property
    def unsent(self) -> int:
        return len(self._unsent)

    # -- commits -----------------------------------------------------------------------

    def on_commit(self, committed_before: int, tokens: Sequence[int]) -> None:
        """Fold committed ``tokens`` (after ``committed_before`` tokens): C's end moves down
        the tree, or, where C leaves it, growth starts again at C's new end.

        C often ends one token past the tree: the cloud verified every draft it had and
        added its own token after the deepest. If that deepest node is not expanded yet
        (its forward may be under way), C's end waits there with the token pending: the
        expansion then tells whether the tree goes on under it or starts again."""
        if not tokens:
            return
        likeliest = [] if self._pending else self.best_path()
        toks = [*self._pending, *(int(t) for t in tokens)]
        restart_at = self.committed_len + len(tokens)
        at: Key = self.anchor
        for i, tok in enumerate(toks):
            nxt = self._kids(at).get(tok)
            if nxt is None:
                if at in self._expanded or not self.is_live(at):
                    self._restart(restart_at)
                    return
                self._pending = toks[i:]  # past an unexpanded node: wait for its children
                break
            at = nxt
        else:
            self._pending = []
        if toks[: len(likeliest)] != likeliest[: len(toks)]:
            self.branch_hits += 1
        if isinstance(at, int) and at != self.anchor:
            before = self.live
            self._reanchor(at)
            self.nodes_pruned += max(0, before - self.live - (len(toks) - len(self._pending)))

    @property
    def pending(self) -> int:
        """Committed tokens past the deepest node on C (waiting for its expansion)."""
        return len(self._pending)

    def _restart(self, committed_len: int) -> None:
        self.misses += 1
        self._pending = []
        self.nodes_pruned += self.live
        self.anchor = ("root", committed_len)
        self._nodes.clear()
        self._root_children = {}
        self._expanded.clear()
        self._unsent = []

    def _reanchor(self, at: int) -> None:
        """Keep ``at``, everything below it and its unsent ancestors (they must still go
        out, or their children would name no parent); forget the rest."""
        below: set[int] = set()
        stack = [at]
        while stack:
            nid = stack.pop()
            below.add(nid)
            stack.extend(self._nodes[nid].children.values())
        unsent = {u.node.id for u in self._unsent}
        ancestors: set[int] = set()
        key: Key = self._nodes[at].parent
        while isinstance(key, int) and key in self._nodes:  # older ones are forgotten
            if key in unsent:
                ancestors.add(key)
            key = self._nodes[key].parent
        keep = below | ancestors
        self._nodes = {i: n for i, n in self._nodes.items() if i in keep}
        for i in ancestors:  # ancestors keep only the child on C's path
            node = self._nodes[i]
            node.children = {t: c for t, c in node.children.items() if c in keep}
        self._root_children = {}
        self.anchor = at
        self._expanded = {k for k in self._expanded if isinstance(k, int) and k in below}
        self._unsent = [u for u in self._unsent if u.node.id in keep]
