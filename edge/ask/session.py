"""One speculative request on the edge, as a pure state machine: events in, actions out.

The cloud owns the committed answer C; the edge mirrors it and keeps a speculative tail
of greedy drafts beyond it (DESIGN, "Speculation invariants"). This module decides:

- when to draft: after the draft prefill, up to the plan's hidden-draft budget before
  the first commit and its lookahead after, never past EOS or the token cap;
- what ``Drafts`` to send: the whole tail with the committed length it extends
  (``base``), at the plan's cadence; a self-validating tail needs no epochs. With
  ``tree`` (a drafter that expands several contexts in one forward, and a cloud that
  keeps trees), the session grows a tree below C instead, by likelihood and within a
  node budget, without waiting for commits, and only new nodes go out
  (:mod:`eventspec.edge.drafting.tree`);
- how to fold a ``Commit``: a tail that agrees is kept (its confirmed head moves into
  C), one that diverges is dropped; the drafter re-syncs its KV cache from
  :meth:`EdgeSession.draft_context` on its next call, so a draft computed for a context
  that has since changed is discarded here (:meth:`on_draft`);
- previews and statistics.

No asyncio, gRPC or model calls: ``eventspec.edge.ask.agent`` executes the actions, and tests drive
this class directly against a fake cloud.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from eventspec.edge.drafting.tree import EdgeTree, Key, TreeShape
from eventspec.shared.contract.errors import FailedPrecondition
from eventspec.shared.contract.timing import TimingPlan
from eventspec.shared.contract.types import CommitEvent, DoneEvent, DraftTail

#: Drafting budget when ``--speculation always`` overrides a plan that said no.
FORCED_HIDDEN_DRAFTS = 16
FORCED_LOOKAHEAD = 6


def forced_plan(p: TimingPlan) -> TimingPlan:
    """``p`` with drafting switched on (``--speculation always``, for measuring acceptance).

    The cloud verifies whatever valid drafts arrive, so this changes speed, never output.
    """
    if p.speculate:
        return p
    return replace(
        p,
        speculate=True,
        hidden_draft_budget=max(p.hidden_draft_budget, FORCED_HIDDEN_DRAFTS),
        lookahead_tokens=max(p.lookahead_tokens, FORCED_LOOKAHEAD),
        chunk_cadence_tokens=1,
        reason=f"forced by --speculation always; the plan said: {p.reason}",
    )


@dataclass(frozen=True)
class SendDrafts:
    """Write this tail to the cloud (best effort: a finished call just drops it)."""

    tail: DraftTail


@dataclass(frozen=True)
class ShowPreview:
    """Show the client the drafts beyond C (marked as unverified)."""

    base: int
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class ShowCommitted:
    """Stream committed tokens to the client."""

    start: int
    token_ids: tuple[int, ...]
    text: str


Action = SendDrafts | ShowPreview | ShowCommitted


@dataclass
class EdgeCounters:
    """What the edge did for one request (the cloud reports what it verified)."""

    drafted: int = 0
    discarded: int = 0  # drafts computed for a context a commit had changed
    tails_sent: int = 0
    rollbacks: int = 0  # commits that cut a non-empty tail


class EdgeSession:
    """The edge's view of one request: C as committed by the cloud, and its own tail."""

    def __init__(
        self,
        *,
        plan: TimingPlan,
        max_new_tokens: int,
        eos_token_id: int,
        speculative: bool,
        force_speculation: bool = False,
        preview_every: int = 4,
        tree: TreeShape | None = None,
        max_nodes_per_message: int = 128,
        drafts_every: int = 1,
    ) -> None:
        self.max_new_tokens = max_new_tokens
        self.eos_token_id = eos_token_id
        self.speculative = speculative
        self.force_speculation = force_speculation
        self.preview_every = max(1, preview_every)
        self.plan = self._adopt(plan)
        self.committed: list[int] = []
        self.tail: list[int] = []
        self.text = ""
        self.prefilled = False
        self.done: DoneEvent | None = None
        self.counters = EdgeCounters()
        self._sent_len = 0  # len(C) + len(tail) when the last tail was sent
        #: Draft forwards (chains: tokens) per Drafts message at least (``--drafts-every``).
        self.drafts_every = max(1, drafts_every)
        self._held_forwards = 0  # trees: forwards whose nodes have not gone out yet
        self._preview_len = 0
        #: Draft trees: growth, ids, what was sent, where C stands (None: chains).
        self.tree = EdgeTree(max_nodes_per_message, tree) if tree is not None else None

    # -- queries -----------------------------------------------------------------------

    @property
    def wants_prefill(self) -> bool:
        """Whether the draft model should prefill at all for this request."""
        return self.speculative and self.plan.speculate

    def wants_draft(self) -> bool:
        """Whether drafting one more token now is within the plan."""
        if not (self.wants_prefill and self.prefilled) or self.done is not None:
            return False
        if self.tree is not None:
            return bool(self.expansion(1))
        seq_len = len(self.committed) + len(self.tail)
        if seq_len >= self.max_new_tokens:
            return False
        last = self.tail[-1] if self.tail else (self.committed[-1] if self.committed else None)
        if last == self.eos_token_id:
            return False
        limit = self.plan.hidden_draft_budget if not self.committed else self.plan.lookahead_tokens
        return len(self.tail) < max(limit, 0)

    @property
    def cadence(self) -> int:
        """Draft forwards (trees) or tokens (chains) per Drafts message: the plan's, or
        ``drafts_every`` where that is more (fewer messages spare the cloud's host)."""
        return max(1, self.plan.chunk_cadence_tokens, self.drafts_every)

    def draft_context(self) -> tuple[int, ...]:
        """The sequence the next draft extends: C followed by the tail."""
        return (*self.committed, *self.tail)

    def expansion(self, limit: int | None = None) -> list[tuple[Key, tuple[int, ...]]]:
        """Trees: the nodes to expand in the next forward, likeliest path first, each with
        its context (C and the path down to it); none when C already ends the answer."""
        tree = self.tree
        assert tree is not None, "expansion is for trees"
        if self.committed and self.committed[-1] == self.eos_token_id:
            return []
        keys = tree.frontier(tree.per_forward if limit is None else limit,
                             stop_token=self.eos_token_id, max_position=self.max_new_tokens)
        on_tree = self.committed[: len(self.committed) - tree.pending]  # C to the anchor
        return [(k, (*on_tree, *tree.path(k))) for k in keys]

    # -- events ------------------------------------------------------------------------

    def on_plan(self, plan: TimingPlan) -> None:
        """The cloud's Plan: the same function on the same facts; its copy wins. Its
        token cap (clamped to the cloud's context) bounds drafting too."""
        self.plan = self._adopt(plan)
        if plan.max_new_tokens > 0:
            self.max_new_tokens = min(self.max_new_tokens, plan.max_new_tokens)

    def on_prefill_done(self) -> None:
        self.prefilled = True

    def on_expanded(self, keys: Sequence[Key],
                    children: Sequence[Sequence[tuple[int, float]]]) -> list[Action]:
        """Trees: the drafter's top-k ``(token, logprob)`` after each expanded node. A node
        a commit has since ruled out is dropped (counted as discarded); the new nodes go
        out at once."""
        tree = self.tree
        assert tree is not None, "on_expanded is for trees"
        if self.done is not None:
            return []
        for key, kids in zip(keys, children, strict=True):
            added = tree.expand(key, kids)
            self.counters.drafted += added
            self.counters.discarded += 0 if tree.is_live(key) else 1
        self.tail = tree.best_path()
        self._held_forwards += 1
        send = tree.unsent and (self._held_forwards >= self.cadence or not self.wants_draft())
        actions: list[Action] = list(self._send_tail()) if send else []
        seq_len = len(self.committed) + len(self.tail)
        if seq_len - self._preview_len >= self.preview_every:
            self._preview_len = seq_len
            actions.append(ShowPreview(len(self.committed), tuple(self.tail)))
        return actions

    def on_draft(self, context: Sequence[int], token: int) -> list[Action]:
        """Chains: a draft token computed after ``context``; stale if a commit changed
        the context."""
        if self.done is not None or tuple(context) != self.draft_context():
            self.counters.discarded += 1
            return []
        self.tail.append(int(token))
        self.counters.drafted += 1
        actions: list[Action] = []
        seq_len = len(self.committed) + len(self.tail)
        if seq_len - self._sent_len >= self.cadence or not self.wants_draft():
            actions.extend(self._send_tail())
        if seq_len - self._preview_len >= self.preview_every:
            self._preview_len = seq_len
            actions.append(ShowPreview(len(self.committed), tuple(self.tail)))
        return actions

    def on_commit(self, commit: CommitEvent) -> list[Action]:
        """Fold a Commit into C: keep the tail's confirmed part, or drop a diverged tail."""
        if commit.start != len(self.committed):
            raise FailedPrecondition(
                f"Commit.start {commit.start} does not follow the {len(self.committed)} "
                "tokens committed so far"
            )
        tokens = list(commit.token_ids)
        if self.tree is not None:  # C moves down the tree, or leaves it
            misses, hits = self.tree.misses, self.tree.branch_hits
            self.tree.on_commit(len(self.committed), tokens)
            self.committed.extend(tokens)
            self.counters.rollbacks += (self.tree.misses - misses) + (self.tree.branch_hits - hits)
            self.tail = self.tree.best_path()
            self._preview_len = min(self._preview_len, len(self.committed) + len(self.tail))
            self.text = commit.text
            return [ShowCommitted(commit.start, tuple(tokens), commit.text)]
        agree = 0
        while agree < min(len(tokens), len(self.tail)) and tokens[agree] == self.tail[agree]:
            agree += 1
        self.committed.extend(tokens)
        if agree == len(tokens):
            self.tail = self.tail[agree:]
        else:
            if self.tail:
                self.counters.rollbacks += 1
            self.tail = []
        # Anything sent beyond a diverged point is moot; the next tail is re-based on C.
        self._sent_len = min(self._sent_len, len(self.committed) + len(self.tail))
        self._preview_len = min(self._preview_len, len(self.committed) + len(self.tail))
        self.text = commit.text
        return [ShowCommitted(commit.start, tuple(tokens), commit.text)]

    def on_done(self, done: DoneEvent) -> None:
        self.done = done
        self.tail = []

    # -- helpers -----------------------------------------------------------------------

    def _adopt(self, plan: TimingPlan) -> TimingPlan:
        if self.speculative and self.force_speculation:
            return forced_plan(plan)
        return plan

    def _send_tail(self) -> list[Action]:
        self._sent_len = len(self.committed) + len(self.tail)
        self._held_forwards = 0
        if self.tree is not None:
            messages = self.tree.flush(len(self.committed))
            self.counters.tails_sent += len(messages)
            return [SendDrafts(m) for m in messages]
        self.counters.tails_sent += 1
        return [SendDrafts(DraftTail(len(self.committed), tuple(self.tail), 0.0))]
