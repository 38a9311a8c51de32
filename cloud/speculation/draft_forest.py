"""One request's drafts at the cloud, kept across steps as a tree. Pure; the engine thread's.

Why a tree, and why kept: a chain dies at its first rejection, and the edge's next tail
needs a round trip to arrive, so the steps between decode alone (issue 36: 0.04-1.3
drafts on offer per step against 4). A tree keeps the edge's alternatives: when the
target's correction is a sibling the edge also drafted, the next step continues down
that branch with no round trip. SpecInfer (Miao et al. 2024) and EAGLE-2 (Li et al.
2024) verify trees within one step; SpecEdge (Park et al. 2025) sends trees from the
edge; here the verifier also keeps the tree between steps and follows the committed
text through it.

The model: every node stands for one token at one position of the answer (its parent's
position plus one; a root's parent is the committed prefix of its message's ``base``).
A node is *on C* when it and all its ancestors equal the committed answer C, *ahead*
when it lies past C's end under a node on C, and dead otherwise (dropped at once). The
*anchors* are the nodes on C at C's last position; each step verifies the likeliest path
below them: the child with the highest draft log-probability (the newest on a tie, so a
chain re-sent from the same base behaves like "the newest tail wins"), then its best
child, and so on, up to the verify width. Children are merged by token, so a chain
re-sent with the same prefix adds nothing twice.

Nodes on C are kept ``KEEP_BEHIND`` positions back, so nodes sent after their parent was
committed still find it; older ones are forgotten, and a child of a forgotten node is
late (stale).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from eventspec.shared.contract.types import ROOT, DraftNode

__all__ = ["KEEP_BEHIND", "DraftForest"]

#: Positions behind C's end whose nodes on C stay known as parents.
KEEP_BEHIND = 64


@dataclass(eq=False, slots=True)
class _Node:
    token: int  # -1 for the virtual parent of a base's roots
    pos: int  # position in the answer (C[pos] if on C)
    logprob: float = 0.0
    seq: int = 0  # insertion order; a re-sent node is renewed
    on_c: bool = False
    children: dict[int, _Node] = field(default_factory=dict)  # token -> child
    wire_ids: list[int] = field(default_factory=list)


class DraftForest:
    """The tree (or forest, over several bases) of one request's drafts."""

    def __init__(self) -> None:
        self._by_id: dict[int, _Node] = {}
        #: Nodes on C by position (the anchors at ``synced - 1``), and the virtual
        #: parents of each base's roots (on C by definition: C's prefix).
        self._on_c: dict[int, list[_Node]] = {}
        self._virtual: dict[int, _Node] = {}
        self._synced = 0
        self._seq = 0
        #: Nodes dropped because the committed answer ruled them out, since start.
        self.pruned = 0

    # -- adding ------------------------------------------------------------------------

    def add_chain(self, base: int, tokens: Sequence[int], committed: Sequence[int]) -> int:
        """A chain tail (the whole tail from ``base``, as chains are sent); returns the
        tokens stored ahead of C."""
        self.sync(committed)
        parent = self._virtual_at(base)
        ahead = 0
        for tok in tokens:
            child = self._attach(parent, int(tok), 0.0, None, committed)
            if child is None:
                break
            ahead += child.pos >= self._synced
            parent = child
        return ahead

    def add_nodes(self, base: int, nodes: Sequence[DraftNode],
                  committed: Sequence[int]) -> tuple[int, int]:
        """New tree nodes (checked by :class:`~eventspec.cloud.speculation.tree_checks.TreeChecks`);
        returns (stored ahead of C, dropped as late or ruled out)."""
        self.sync(committed)
        ahead = dropped = 0
        for n in nodes:
            parent = self._virtual_at(base) if n.parent == ROOT else self._by_id.get(n.parent)
            child = None if parent is None else self._attach(
                parent, n.token_id, n.logprob, n.id, committed)
            if child is None:
                dropped += 1
            else:
                ahead += child.pos >= self._synced
        return ahead, dropped

    def _virtual_at(self, base: int) -> _Node:
        node = self._virtual.get(base)
        if node is None:
            node = self._virtual[base] = _Node(-1, base - 1, on_c=True)
            self._on_c.setdefault(base - 1, []).append(node)
        return node

    def _attach(self, parent: _Node, token: int, logprob: float, wire_id: int | None,
                committed: Sequence[int]) -> _Node | None:
        """Add (or renew) ``parent``'s child ``token``; None when it is dead (inside C but
        off it, or under a node that is not on C there)."""
        pos = parent.pos + 1
        inside = pos < len(committed)
        if inside and not (parent.on_c and committed[pos] == token):
            return None
        if not inside and parent.pos == len(committed) - 1 and not parent.on_c:
            return None  # under C's last position, but the parent is not C[-1]
        self._seq += 1
        child = parent.children.get(token)
        if child is None:
            child = parent.children[token] = _Node(token, pos, on_c=inside)
            if inside:
                self._on_c.setdefault(pos, []).append(child)
        child.logprob, child.seq = logprob, self._seq
        if wire_id is not None:
            child.wire_ids.append(wire_id)
            self._by_id[wire_id] = child
        return child

    # -- following C -------------------------------------------------------------------

    def sync(self, committed: Sequence[int]) -> None:
        """Follow the tokens committed since the last call through the tree: what they
        match goes on C, what they rule out is dropped."""
        for p in range(self._synced, len(committed)):
            tok = committed[p]
            for anchor in self._on_c.get(p - 1, []):
                for t, child in list(anchor.children.items()):
                    if t == tok:
                        if not child.on_c:
                            child.on_c = True
                            self._on_c.setdefault(p, []).append(child)
                    else:
                        del anchor.children[t]
                        self._drop(child)
        self._synced = max(self._synced, len(committed))
        self._forget_before(self._synced - 1 - KEEP_BEHIND)

    def _drop(self, node: _Node) -> None:
        stack = [node]
        while stack:
            n = stack.pop()
            self.pruned += 1
            for i in n.wire_ids:
                self._by_id.pop(i, None)
            stack.extend(n.children.values())

    def _forget_before(self, pos: int) -> None:
        for p in [p for p in self._on_c if p < pos]:
            for n in self._on_c.pop(p):
                for i in n.wire_ids:
                    self._by_id.pop(i, None)
        for b in [b for b in self._virtual if b - 1 < pos]:
            del self._virtual[b]

    # -- what to verify ----------------------------------------------------------------

    def path(self, width: int) -> list[int]:
        """The likeliest path of at most ``width`` drafts extending C (after :meth:`sync`)."""
        frontier = [c for a in self._on_c.get(self._synced - 1, [])
                    for c in a.children.values()]
        out: list[int] = []
        while frontier and len(out) < width:
            best = max(frontier, key=lambda n: (n.logprob, n.seq))
            out.append(best.token)
            frontier = list(best.children.values())
        return out

    def match_depth(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` (what follows C) the kept tree holds as one path below
        C's end (after :meth:`sync`): what a step verifying every kept branch at once
        (tree attention; SpecInfer, EAGLE-2) would accept before its correction, where
        :meth:`path` verifies only the likeliest branch. The simulator
        (``benchmarks/pipeline_sim.py --verify tree``) prices that alternative with it."""
        frontier = [c for a in self._on_c.get(self._synced - 1, []) for c in a.children.values()]
        depth = 0
        for tok in tokens:
            nxt = [c for c in frontier if c.token == tok]
            if not nxt:
                break
            depth += 1
            frontier = [c for n in nxt for c in n.children.values()]
        return depth

    @property
    def ahead(self) -> int:
        """Nodes ahead of C now (a walk of the live tree; for tests and statistics)."""
        stack = [c for a in self._on_c.get(self._synced - 1, []) for c in a.children.values()]
        count = 0
        while stack:
            n = stack.pop()
            count += 1
            stack.extend(n.children.values())
        return count
