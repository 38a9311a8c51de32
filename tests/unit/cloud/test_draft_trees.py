"""Draft trees at the cloud (issue 36): the tree kept across steps, followed through the
committed text, its likeliest path verified; lossless whatever the tree holds; a
correction the edge drafted as a sibling continues with no new message.

The target is ``test_speculation_property``'s fake (one-hot logits at a fixed
pseudo-random function), so many trees, seeds and stop strings run in seconds.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventspec.cloud.speculation.decoding import DecodingSession
from eventspec.cloud.speculation.draft_forest import DraftForest
from eventspec.shared.contract.types import ROOT, DraftNode, DraftTail, GenerationSettings
from tests.support.alone import decode_alone
from tests.unit.test_speculation_property import (
    PROMPT,
    VOCAB,
    FakeEngine,
    cloud_session,
    decode,
    target_next,
    target_only,
)


def truth_after(seq: Sequence[int], salt: int, n: int) -> list[int]:
    """The target's next ``n`` greedy tokens after the answer ``seq``."""
    out: list[int] = []
    for _ in range(n):
        out.append(target_next([*seq, *out], salt))
    return out


class TreeProposer:
    """An edge that sends, before each step, a new tree rooted at C's end: a main path
    that is wrong with probability ``error``, and at each level a sibling that is the
    true token with probability ``coverage`` when the main one is wrong (with the true
    continuation under it). Node ids increase over the request, as the protocol asks."""

    def __init__(self, salt: int, seed: int, error: float, coverage: float, depth: int,
                 every: int = 1) -> None:
        self.salt, self.rng = salt, random.Random(seed)
        self.error, self.coverage, self.depth, self.every = error, coverage, depth, every
        self.ids = itertools.count()
        self.calls = 0

    def __call__(self, committed: Sequence[int]) -> DraftTail | None:
        self.calls += 1
        if (self.calls - 1) % self.every:
            return None  # a message in flight: the cloud steps on what it keeps
        nodes: list[DraftNode] = []
        parent, path = ROOT, list(committed)
        for _ in range(self.depth):
            true = target_next(path, self.salt)
            wrong_main = self.rng.random() < self.error
            main = (true + 1 + self.rng.randrange(VOCAB - 4)) % VOCAB if wrong_main else true
            node = DraftNode(next(self.ids), parent, main, -0.1)
            nodes.append(node)
            if wrong_main and self.rng.random() < self.coverage:
                sib = DraftNode(next(self.ids), parent, true, -1.5)
                nodes.append(sib)
                below = sib.id
                for tok in truth_after([*path, true], self.salt, 3):
                    child = DraftNode(next(self.ids), below, tok, -0.2)
                    nodes.append(child)
                    below = child.id
            parent, path = node.id, [*path, main]
        return DraftTail(len(committed), (), nodes=tuple(nodes))


def speculative(gen: GenerationSettings, salt: int, propose: TreeProposer) -> DecodingSession:
    return decode_alone(FakeEngine(salt), cloud_session(gen, speculative=True), PROMPT,
                        pixel_values_videos=torch.zeros(1), text_vocab_size=VOCAB,
                        propose=propose)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(salt=st.integers(0, 255), seed=st.integers(0, 10**6),
       error=st.sampled_from([0.0, 0.2, 0.5, 1.0]), coverage=st.sampled_from([0.0, 0.5, 1.0]),
       depth=st.integers(1, 8), every=st.integers(1, 3), max_new=st.integers(1, 40),
       stop_at=st.one_of(st.none(), st.integers(1, 12)))
def test_any_tree_gives_the_target_only_answer(
        salt: int, seed: int, error: float, coverage: float, depth: int, every: int,
        max_new: int, stop_at: int | None) -> None:
    """Greedy answers with trees equal target-only ones token for token, stop strings
    included (the stop string is a piece of the target's own answer)."""
    plain = target_only(GenerationSettings(max_new_tokens=max_new), salt).committed
    stop = () if stop_at is None or stop_at > len(plain) else (decode(plain[stop_at - 1:
                                                                        stop_at + 1]),)
    gen = GenerationSettings(max_new_tokens=max_new, stop=stop)
    want = target_only(gen, salt)
    got = speculative(gen, salt, TreeProposer(salt, seed, error, coverage, depth, every))
    assert got.committed == want.committed
    assert got.finish_reason == want.finish_reason
    assert got.text() == want.text()


def test_a_drafted_correction_continues_without_a_new_message() -> None:
    """Every main-path draft is wrong and every correction is a drafted sibling with the
    truth under it; the edge sends one tree every 3 steps. The steps in between still
    verify drafts (the sibling's branch), so the answer takes fewer target steps than
    the same main path without siblings."""
    gen = GenerationSettings(max_new_tokens=40)
    with_siblings = speculative(gen, 7, TreeProposer(7, 0, 1.0, 1.0, 4, every=3))
    chain_only = speculative(gen, 7, TreeProposer(7, 0, 1.0, 0.0, 4, every=3))
    want = target_only(gen, 7).committed
    assert with_siblings.committed == chain_only.committed == want
    assert with_siblings.counters.accepted > 0 == chain_only.counters.accepted
    assert with_siblings.counters.steps < chain_only.counters.steps


def test_the_likeliest_child_is_verified_and_the_rest_kept() -> None:
    forest = DraftForest()
    nodes = (DraftNode(0, ROOT, 5, -2.0), DraftNode(1, ROOT, 6, -0.1),
             DraftNode(2, 1, 7, -0.5), DraftNode(3, 0, 8, -0.1))
    assert forest.add_nodes(0, nodes, []) == (4, 0)
    assert forest.path(8) == [6, 7]
    forest.sync([5])  # the target chose the unlikely branch: it continues there
    assert forest.path(8) == [8] and forest.ahead == 1
    forest.sync([5, 9])  # off the tree: nothing is left
    assert forest.path(8) == [] and forest.ahead == 0 and forest.pruned == 3


def test_the_whole_tree_accepts_along_any_branch_the_likeliest_path_only_its_own() -> None:
    """``match_depth``: what verifying every kept branch in one step would accept, for
    the simulator's ``--verify tree``. The likeliest path is 6, 7; the answer 5, 8 runs
    down the other branch, so one path accepts nothing and the whole tree two."""
    forest = DraftForest()
    forest.add_nodes(0, (DraftNode(0, ROOT, 5, -2.0), DraftNode(1, ROOT, 6, -0.1),
                         DraftNode(2, 1, 7, -0.5), DraftNode(3, 0, 8, -0.1)), [])
    assert forest.match_depth([5, 8, 9]) == 2 and forest.match_depth([6, 7]) == 2
    assert forest.match_depth([6, 8]) == 1 and forest.match_depth([9]) == 0
    assert forest.match_depth([]) == 0
    forest.sync([5])
    assert forest.match_depth([8, 1]) == 1 and forest.match_depth([7]) == 0


@settings(max_examples=200, deadline=None)
@given(tails=st.lists(st.lists(st.integers(3, 6), min_size=1, max_size=5), min_size=1,
                      max_size=6),
       answer=st.lists(st.integers(3, 6), min_size=1, max_size=6))
def test_the_whole_tree_accepts_at_least_the_likeliest_path(tails: list[list[int]],
                                                            answer: list[int]) -> None:
    """Chains from C's start merged into one tree: the whole tree accepts exactly the
    longest agreement of the answer with any chain sent, never less than its likeliest
    path does."""
    forest = DraftForest()
    for tail in tails:
        forest.add_chain(0, tail, [])
    path = forest.path(8)
    along_path = next((i for i, (a, b) in enumerate(zip(path, answer, strict=False)) if a != b),
                      min(len(path), len(answer)))
    best = max(next((i for i, (a, b) in enumerate(zip(t, answer, strict=False)) if a != b),
                    min(len(t), len(answer))) for t in tails)
    assert forest.match_depth(answer) == best >= along_path


def test_a_late_child_is_dropped_and_a_child_of_c_is_kept() -> None:
    forest = DraftForest()
    forest.add_nodes(0, (DraftNode(0, ROOT, 5), DraftNode(1, 0, 6)), [])
    committed = [5, 6, *range(10, 80)]
    forest.sync(committed)  # node 1 is committed, then 70 more tokens: it is forgotten
    assert forest.add_nodes(0, (DraftNode(2, 1, 9),), committed) == (0, 1)
    short = [5, 6]
    f2 = DraftForest()
    f2.add_nodes(0, (DraftNode(0, ROOT, 5), DraftNode(1, 0, 6)), [])
    f2.sync(short)
    assert f2.add_nodes(0, (DraftNode(2, 1, 9),), short) == (1, 0)  # under C[-1]
    assert f2.path(4) == [9]


@settings(max_examples=300, deadline=None)
@given(tails=st.lists(st.tuples(st.integers(0, 6), st.lists(st.integers(3, 8), max_size=6)),
                      min_size=1, max_size=8),
       committed=st.lists(st.integers(3, 8), max_size=6))
def test_chains_follow_the_newest_tail(tails: list[tuple[int, list[int]]],
                                       committed: list[int]) -> None:
    """Chains sent as before still mean what they meant: the drafts verified continue the
    newest tail that agrees with C (a chain is a tree with one child per node), and
    every path is the rest of some tail that agreed."""
    session = DecodingSession(settings=GenerationSettings(max_new_tokens=64), slot=0,
                              prompt_len=3, max_seq_len=4096, eos_token_id=2,
                              max_verify_tokens=64, decode=decode, speculative=True)
    session.committed = list(committed)
    newest: list[int] | None = None
    rests: list[list[int]] = []
    for base, toks in tails:
        if session.offer_drafts(DraftTail(base, tuple(toks))):
            newest = toks[len(committed) - base:]
            rests.append(newest)
    path = session.drafts_now() if committed else session.drafts.path(64)
    if newest is None:
        assert path == [], "no tail agreed with C: nothing to verify"
        return
    assert path[: len(newest)] == newest
    assert any(path == r[: len(path)] for r in rests)


def test_the_session_counts_drafts_on_offer_and_dry_steps() -> None:
    """Each step's drafts on offer (before the width rule) and the steps with none reach
    the request's stats, so a benchmark can tell a dry pipeline from a wrong drafter."""
    s = DecodingSession(settings=GenerationSettings(max_new_tokens=16), slot=0, prompt_len=2,
                        max_seq_len=64, eos_token_id=2, max_verify_tokens=9,
                        decode=lambda ids: "", speculative=True)
    s.mark_prefilled(0.0)
    s.commit(0, [10], 0, 0.0)
    s.offer_drafts(DraftTail(1, (11, 12, 13)))
    assert s.step_input().drafts == (11, 12, 13)
    s.commit(1, [11, 20], 3, 0.0)  # the second draft was wrong: the tree is empty now
    assert s.step_input().drafts == ()
    stats = s.stats()
    assert (stats.drafts_on_offer, stats.dry_steps) == (3, 1)
