"""The edge's side of a draft tree: node ids, what was sent, and where C stands in it. Pure.

Why: with trees (docs/trees.md) the edge sends each drafted token once, as a node under
its parent, and may add branches beside its best guess (the runner-up tokens, each with
a continuation). When a Commit arrives it must know where C now stands in what it sent:
on its own tail (keep drafting after it), on a branch it drafted (the cloud continues
down that branch with no round trip, so the edge adopts the branch as its tail and
drafts after it), or off the tree (start again with roots at C's end). The cloud's
mirror of the same structure is :mod:`eventspec.cloud.draft_forest`.

A node's parent is another node's id, or a root key ``("root", base)``: the token right
after the first ``base`` committed tokens (sent as ``parent=-1`` in a message whose
``base`` is that length). Ids increase in creation order, and a parent is always created
before its children, so nodes sent in id order always name a parent sent before.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from eventspec.shared.contract.types import ROOT, DraftNode, DraftTail

__all__ = ["EdgeTree"]

Key = int | tuple[str, int]  # a node id, or ("root", base)


@dataclass(frozen=True)
class _Unsent:
    node: DraftNode
    root_base: int | None  # the base a root hangs at; None for a non-root node


class EdgeTree:
    """Ids, children and the unsent nodes of one request's drafts."""

    def __init__(self, max_per_message: int = 128) -> None:
        self.max_per_message = max_per_message
        self._ids = itertools.count()
        self._children: dict[Key, dict[int, int]] = {}
        self._parent: dict[int, Key] = {}
        self._unsent: list[_Unsent] = []
        #: Where C's last token stands: a node id, or a root key when C is off the tree.
        self.anchor: Key = ("root", 0)
        #: Ids of the edge's tail (its best guess after C), aligned with its tokens.
        self.tail_ids: list[int] = []
        #: Commits that went down a branch the edge drafted (no round trip needed).
        self.branch_hits = 0
        self.nodes_sent = 0

    # -- drafting ----------------------------------------------------------------------

    def add_draft(self, token: int, branches: Sequence[Sequence[int]] = (),
                  logprob: float = 0.0, branch_logprob: float = -1.0) -> None:
        """The next token of the tail, and branches beside it: each a path whose first
        token is a sibling of ``token`` (the runner-up), then its continuation."""
        parent = self.tail_ids[-1] if self.tail_ids else self.anchor
        self.tail_ids.append(self._child(parent, int(token), logprob))
        for path in branches:
            at: Key = parent
            for depth, tok in enumerate(path):
                at = self._child(at, int(tok), branch_logprob if depth == 0 else logprob)

    def _child(self, parent: Key, token: int, logprob: float) -> int:
        """``parent``'s child ``token``: the existing node, or a new one queued to send."""
        kids = self._children.setdefault(parent, {})
        if token in kids:
            return kids[token]
        node_id = next(self._ids)
        kids[token] = node_id
        self._parent[node_id] = parent
        root_base = parent[1] if isinstance(parent, tuple) else None
        wire_parent = ROOT if isinstance(parent, tuple) else parent
        self._unsent.append(_Unsent(DraftNode(node_id, wire_parent, token, logprob),
                                    root_base))
        return node_id

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
        self._unsent = []
        return out

    @property
    def unsent(self) -> int:
        return len(self._unsent)

    # -- commits -----------------------------------------------------------------------

    def on_commit(self, committed_before: int, tokens: Sequence[int],
                  tail: Sequence[int]) -> list[int]:
        """Fold committed ``tokens`` (after ``committed_before`` tokens); returns the new
        tail: the old one's rest if C followed it, a drafted branch's rest if C went down
        one, else nothing (C left the tree: new roots hang at its end)."""
        at: Key = self.anchor
        for tok in tokens:
            nxt = self._children.get(at, {}).get(int(tok))
            if nxt is None:
                self._restart(committed_before + len(tokens))
                return []
            at = nxt
        self.anchor = at
        n = len(tokens)
        if list(tail[:n]) == [int(t) for t in tokens] and len(tail) >= n:
            self.tail_ids = self.tail_ids[n:]
            new_tail = list(tail[n:])
        else:
            self.branch_hits += 1
            new_tail, self.tail_ids = self._newest_path(at)
        self._keep_below(at)
        return new_tail

    def _newest_path(self, at: Key) -> tuple[list[int], list[int]]:
        """Tokens and ids down the newest children from ``at``: the branch's continuation."""
        tokens: list[int] = []
        ids: list[int] = []
        while kids := self._children.get(at):
            tok, node_id = max(kids.items(), key=lambda kv: kv[1])
            tokens.append(tok)
            ids.append(node_id)
            at = node_id
        return tokens, ids

    def _restart(self, committed_len: int) -> None:
        self.anchor = ("root", committed_len)
        self.tail_ids = []
        self._children.clear()
        self._parent.clear()
        self._unsent = []

    def _keep_below(self, at: Key) -> None:
        """Forget everything not under ``at``: the commit ruled it out (or consumed it)."""
        keep: dict[Key, dict[int, int]] = {}
        stack: list[Key] = [at]
        while stack:
            key = stack.pop()
            kids = self._children.get(key)
            if kids:
                keep[key] = kids
                stack.extend(kids.values())
        alive = {i for kids in keep.values() for i in kids.values()}
        path: set[int] = set()  # ``at`` and its ancestors: in C now, but an unsent one
        node: Key | None = at  # must still go out, or its children would name no parent
        while isinstance(node, int):
            path.add(node)
            node = self._parent.get(node)
        self._children = keep
        self._parent = {i: p for i, p in self._parent.items() if i in alive or i in path}
        self._unsent = [u for u in self._unsent if u.node.id in alive or u.node.id in path]
