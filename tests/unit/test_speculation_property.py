"""The edge session and the cloud's decoding session, driven against each other.

A fake link delivers messages both ways in an order hypothesis chooses (so tails go
stale, commits overtake drafts, the cloud steps with or without drafts), a fake engine
plays a deterministic target, and a fake drafter is right or wrong per context. Every
run's answer must equal the same cloud session run target-only (tokens, text and
finish reason, stop strings included), and the edge must end mirroring it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.scheduling.sampler import BatchedSampler, SampleSpec
from eventspec.cloud.speculation.decoding import Committed, DecodingSession
from eventspec.cloud.speculation.tree_checks import TreeChecks
from eventspec.edge.ask.session import EdgeSession, SendDrafts
from eventspec.edge.drafting.tree import TreeShape
from eventspec.shared.contract.timing import TimingPlan
from eventspec.shared.contract.types import (
    CommitEvent,
    DoneEvent,
    DraftTail,
    FinishReason,
    GenerationSettings,
)
from eventspec.shared.node.static.batch import StepBatch
from tests.support.alone import decode_alone

VOCAB = 40
EOS = 2
PROMPT = [1, 7, 9]


def target_next(seq: Sequence[int], salt: int) -> int:
    """The target's greedy token after ``seq``: a fixed pseudo-random function."""
    h = hashlib.blake2b(bytes([salt % 256, *[t % 256 for t in seq[-3:]], len(seq) % 256]),
                        digest_size=2).digest()
    tok = 3 + int.from_bytes(h, "little") % (VOCAB - 3)
    return EOS if len(seq) >= 6 and tok % 11 == 0 else tok


def decode(ids: Sequence[int]) -> str:
    return "".join(chr(ord("a") + t % 26) for t in ids if t != EOS)


class FakeEngine:
    """A one-slot ``BatchedEngine`` whose logits are one-hot at :func:`target_next`."""

    device = torch.device("cpu")
    num_slots = 1
    max_seq_len = 4096

    def __init__(self, salt: int) -> None:
        self.salt = salt
        self.fed: list[int] = []  # tokens after the prompt held in the slot

    def _row(self, seq: Sequence[int]) -> torch.Tensor:
        row = torch.full((VOCAB,), -10.0)
        row[target_next(seq, self.salt)] = 10.0
        return row  # [V]

    def prefill(self, requests: Sequence[PrefillRequest]) -> torch.Tensor:
        self.fed = []
        return self._row([]).unsqueeze(0)  # [1, V]

    def step(self, batch: StepBatch) -> torch.Tensor:
        del self.fed[batch.start_positions[0] - len(PROMPT):]  # rejected drafts: overwritten
        rows = []
        for t in batch.token_ids.tolist():
            self.fed.append(int(t))
            rows.append(self._row(self.fed))
        return torch.stack(rows)  # [k, V]

    def free(self, slot: int) -> None:
        self.fed = []


SAMPLER = BatchedSampler(VOCAB)


def cloud_session(gen: GenerationSettings, speculative: bool) -> DecodingSession:
    return DecodingSession(settings=gen, slot=0, prompt_len=len(PROMPT),
                           max_seq_len=FakeEngine.max_seq_len, eos_token_id=EOS,
                           max_verify_tokens=9, decode=decode, speculative=speculative)


def target_only(gen: GenerationSettings, salt: int) -> DecodingSession:
    return decode_alone(FakeEngine(salt), cloud_session(gen, speculative=False), PROMPT,
                        pixel_values_videos=torch.zeros(1), text_vocab_size=VOCAB)


def verify(engine: FakeEngine, cloud: DecodingSession) -> Committed:
    """One scheduler iteration for this session: prefill (its logits give the first token)
    or a step over C[-1] + drafts; the batched sampler decides; C grows under the stops."""
    if not cloud.prefilled:
        logits = engine.prefill([PrefillRequest(0, PROMPT, torch.zeros(1))])  # [1, V]
        cloud.mark_prefilled(0.0)
        drafts = cloud.drafts_now()
        v = SAMPLER(logits, [SampleSpec(1, drafts)])[0]
        return cloud.commit(v.accepted, v.tokens, len(drafts), 0.0)
    inp = cloud.step_input()
    rows = engine.step(StepBatch((0,), (inp.start_position,), (len(inp.tokens),),
                                 torch.tensor(inp.tokens)))  # [1 + drafts, V]
    v = SAMPLER(rows, [SampleSpec(len(inp.tokens), inp.drafts)])[0]
    return cloud.commit(v.accepted, v.tokens, len(inp.drafts), 0.0)


def plan(hidden: int, lookahead: int, cadence: int) -> TimingPlan:
    return TimingPlan(True, hidden, lookahead, cadence, False, 0.8, 10.0, 1.0, 1.5, "test")


#: What a cloud re-planning mid-answer may send (cloud/requests/replanning.py), in turn: stop
#: drafting, draft 2 ahead, draft 8 ahead two tokens a message, draft 1 ahead.
REPLANS = (dataclasses.replace(plan(0, 0, 1), speculate=False), plan(0, 2, 1), plan(0, 8, 2),
           plan(0, 1, 1))


@dataclass
class Link:
    up: deque[DraftTail] = field(default_factory=deque)
    down: deque[CommitEvent | DoneEvent | TimingPlan] = field(default_factory=deque)


def run_speculative(gen: GenerationSettings, salt: int, error_pct: int, schedule: list[int],
                    hidden: int, lookahead: int, cadence: int,
                    coverage_pct: int | None = None) -> tuple[DecodingSession, EdgeSession]:
    """Interleave edge drafting, both link directions and cloud steps by ``schedule``.

    ``coverage_pct`` (trees): the edge grows a tree of three children per node (a small
    budget, two nodes per forward); where its top-1 is wrong, the true token is the
    second child that often (percent); every tree message passes the stream's checks
    (``TreeChecks``) before the cloud reads it."""
    engine = FakeEngine(salt)
    cloud = cloud_session(gen, speculative=True)
    shape = TreeShape(node_budget=24, top_k=3, per_forward=2)
    edge = EdgeSession(plan=plan(hidden, lookahead, cadence), max_new_tokens=gen.max_new_tokens,
                       eos_token_id=EOS, speculative=True,
                       tree=shape if coverage_pct is not None else None,
                       max_nodes_per_message=32)
    link = Link()
    checks = TreeChecks(max_nodes=512, max_depth=64, max_per_message=32,
                        text_vocab_size=VOCAB)
    sent = [0]  # committed tokens the cloud has sent down (the stream's count)
    replans = [0]  # plans sent after the first

    def children(ctx: Sequence[int]) -> list[tuple[int, float]]:
        right, top = target_next(ctx, salt), draft(ctx)
        coin = hashlib.blake2b(bytes([salt % 256, len(ctx) % 256, 7]), digest_size=1)
        covered = coverage_pct is not None and coin.digest()[0] % 100 < coverage_pct
        second = right if top != right and covered else (top + 2) % VOCAB
        third = (top + 3) % VOCAB if (top + 3) % VOCAB != right else (top + 4) % VOCAB
        ranked = list(dict.fromkeys([top, second, third]))
        return [(t, -0.2 if i == 0 else -2.0) for i, t in enumerate(ranked)]

    def draft(ctx: Sequence[int]) -> int:
        right = target_next(ctx, salt)
        wrong = int(hashlib.blake2b(bytes([salt % 256, len(ctx) % 256]), digest_size=1)
                    .digest()[0]) % 100 < error_pct
        return (right + 1) % VOCAB if wrong and right != EOS else right

    def cloud_step() -> None:
        if cloud.finish_reason is not None:
            return
        c = verify(engine, cloud)
        if c.tokens:
            link.down.append(CommitEvent(c.start, c.tokens, c.verified, c.accepted,
                                         cloud.text(), 0.0))
            sent[0] += len(c.tokens)
        if cloud.finish_reason is not None:
            link.down.append(DoneEvent(cloud.finish_reason, tuple(cloud.committed), cloud.text(),
                                       cloud.stats()))

    def edge_event(choice: int) -> None:
        if choice == 0 and not edge.prefilled:
            edge.on_prefill_done()
        elif choice == 1 and edge.wants_draft():
            if edge.tree is not None:
                wanted = edge.expansion()
                actions = edge.on_expanded([k for k, _ in wanted],
                                           [children(ctx) for _, ctx in wanted])
            else:
                ctx = edge.draft_context()
                actions = edge.on_draft(ctx, draft(ctx))
            link.up.extend(a.tail for a in actions if isinstance(a, SendDrafts))
        elif choice == 2 and link.up:
            tail = link.up.popleft()
            cloud.offer_drafts(checks.check(tail, sent[0]) if tail.nodes else tail)
        elif choice == 3 and link.down:
            msg = link.down.popleft()
            if isinstance(msg, DoneEvent):
                edge.on_done(msg)
            elif isinstance(msg, TimingPlan):
                edge.on_plan(msg)
            else:
                edge.on_commit(msg)
        elif choice == 4:
            cloud_step()
        elif choice == 5 and sent[0] and cloud.finish_reason is None:  # between Commits
            link.down.append(REPLANS[replans[0] % len(REPLANS)])
            replans[0] += 1

    for choice in schedule:
        edge_event(choice)
    while cloud.finish_reason is None:  # then a steady rhythm until the answer ends
        for choice in (0, 3, 1, 1, 2, 4):
            edge_event(choice)
    while link.down:
        edge_event(3)
    return cloud, edge


def _assert_target_only(gen: GenerationSettings, salt: int, error_pct: int,
                        schedule: list[int], hidden: int, lookahead: int, cadence: int,
                        coverage_pct: int | None) -> None:
    """The answer, its text and its end are target-only's, and the edge mirrors C."""
    reference = target_only(gen, salt)
    cloud, edge = run_speculative(gen, salt, error_pct, schedule, hidden, lookahead, cadence,
                                  coverage_pct)
    assert cloud.committed == reference.committed
    assert cloud.text() == reference.text()
    assert cloud.finish_reason == reference.finish_reason
    assert edge.committed == cloud.committed


@st.composite
def generation(draw: st.DrawFn, salt: int) -> GenerationSettings:
    """Settings whose stop string, when there is one, occurs in the target's answer."""
    max_new = draw(st.integers(1, 24))
    text = decode(target_only(GenerationSettings(max_new_tokens=max_new), salt).committed)
    if not text or draw(st.booleans()):
        return GenerationSettings(max_new_tokens=max_new)
    at = draw(st.integers(0, len(text) - 1))
    return GenerationSettings(max_new_tokens=max_new,
                              stop=(text[at : at + draw(st.integers(1, 2))],))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), salt=st.integers(0, 255), error_pct=st.sampled_from([0, 20, 60, 100]),
       schedule=st.lists(st.integers(0, 4), min_size=10, max_size=120), hidden=st.integers(0, 12),
       lookahead=st.integers(0, 8), cadence=st.integers(1, 4))
def test_any_interleaving_equals_target_only(
    data: st.DataObject, salt: int, error_pct: int, schedule: list[int], hidden: int,
    lookahead: int, cadence: int,
) -> None:
    gen = data.draw(generation(salt))
    reference = target_only(gen, salt)
    cloud, edge = run_speculative(gen, salt, error_pct, schedule, hidden, lookahead, cadence)
    assert cloud.committed == reference.committed
    assert cloud.text() == reference.text()
    assert cloud.finish_reason == reference.finish_reason
    assert edge.done is not None and list(edge.done.token_ids) == reference.committed
    assert edge.committed == cloud.committed  # the edge mirrors C exactly


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), salt=st.integers(0, 255), error_pct=st.sampled_from([20, 60, 100]),
       coverage_pct=st.sampled_from([0, 50, 100]),
       schedule=st.lists(st.integers(0, 4), min_size=10, max_size=120), hidden=st.integers(0, 12),
       lookahead=st.integers(0, 8), cadence=st.integers(1, 4))
def test_any_interleaving_with_trees_equals_target_only(
    data: st.DataObject, salt: int, error_pct: int, coverage_pct: int, schedule: list[int],
    hidden: int, lookahead: int, cadence: int,
) -> None:
    """The same with an edge that sends trees: every message passes the stream's checks
    (none raises), and the answer, its text and its end are target-only's."""
    _assert_target_only(data.draw(generation(salt)), salt, error_pct, schedule, hidden,
                        lookahead, cadence, coverage_pct)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), salt=st.integers(0, 255), error_pct=st.sampled_from([0, 20, 60, 100]),
       coverage_pct=st.sampled_from([None, 0, 100]),
       schedule=st.lists(st.integers(0, 5), min_size=10, max_size=120), hidden=st.integers(0, 12),
       lookahead=st.integers(0, 8), cadence=st.integers(1, 4))
def test_plans_changed_mid_answer_keep_it_target_only(
    data: st.DataObject, salt: int, error_pct: int, coverage_pct: int | None,
    schedule: list[int], hidden: int, lookahead: int, cadence: int,
) -> None:
    """Re-plans arriving between Commits (drafting stopped, resumed, deeper, shallower),
    chains or trees: the answer, its text and its end are still target-only's."""
    _assert_target_only(data.draw(generation(salt)), salt, error_pct, schedule, hidden,
                        lookahead, cadence, coverage_pct)


def test_a_stop_plan_mid_answer_stops_drafting() -> None:
    """A re-plan that says not to speculate ends drafting at once; one that says to
    resumes it (the edge's draft prefill is already done)."""
    edge = EdgeSession(plan=plan(0, 4, 1), max_new_tokens=64, eos_token_id=EOS,
                       speculative=True)
    edge.on_prefill_done()
    edge.on_commit(CommitEvent(0, (5,), 0, 0, "", 0.0))
    assert edge.wants_draft()
    edge.on_plan(REPLANS[0])
    assert not edge.wants_draft()
    edge.on_plan(REPLANS[1])
    assert edge.wants_draft()
    for _ in range(2):
        edge.on_draft(edge.draft_context(), 7)
    assert not edge.wants_draft(), "two ahead is the new plan's depth"


def test_a_drafted_branch_saves_steps_end_to_end() -> None:
    """A slow link (three cloud steps between the edge's hearing of commits), 40% of
    top-1 drafts wrong and the truth always the runner-up: the cloud goes down branches
    the edge drafted instead of stepping without drafts, so the answers take fewer
    target steps than with chains, and stay target-only's."""
    gen = GenerationSettings(max_new_tokens=24)
    rhythm = ([0] + [1] * 6 + [2] * 8 + [4] * 3 + [3] * 4) * 12
    chain_steps = tree_steps = hits = 0
    for salt in range(20):
        chains, _ = run_speculative(gen, salt, 40, rhythm, 4, 8, 1)
        trees, edge = run_speculative(gen, salt, 40, rhythm, 4, 8, 1, coverage_pct=100)
        assert trees.committed == chains.committed == target_only(gen, salt).committed
        assert edge.tree is not None
        chain_steps += chains.counters.steps
        tree_steps += trees.counters.steps
        hits += edge.tree.branch_hits
    assert hits > 0
    assert tree_steps < 0.95 * chain_steps


def test_right_drafts_after_the_first_commit_are_accepted() -> None:
    """With a perfect drafter and prompt delivery, every later step verifies drafts and
    accepts all of them (the tail's base tracks C, so nothing goes stale)."""
    gen = GenerationSettings(max_new_tokens=24)
    salt = 3
    reference = target_only(gen, salt)
    assert len(reference.committed) >= 8
    # edge: prefill, draft a hidden token, deliver; cloud: prefill, step; then cycles of
    # (deliver commit, draft, draft, deliver tail, cloud step).
    schedule = [0, 1, 2, 4, 4] + [3, 1, 1, 2, 2, 4] * 12
    cloud, edge = run_speculative(gen, salt, 0, schedule, hidden=1, lookahead=4, cadence=1)
    assert cloud.committed == reference.committed
    assert cloud.counters.drafted > 0
    assert cloud.counters.accepted == cloud.counters.drafted
    assert cloud.counters.stale == 0
    assert edge.counters.discarded == 0


def test_stop_string_cuts_a_bulk_commit_where_target_only_stops() -> None:
    """The lossless bug: accepting drafts in bulk must not run past a stop string."""
    salt = 3
    full = target_only(GenerationSettings(max_new_tokens=24), salt)
    stop = decode(full.committed)[2:4]
    gen = GenerationSettings(max_new_tokens=24, stop=(stop,))
    reference = target_only(gen, salt)
    assert reference.finish_reason == FinishReason.STOP_STRING
    cloud, _ = run_speculative(gen, salt, 0, [0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 4], hidden=8,
                               lookahead=8, cadence=8)
    assert (cloud.committed, cloud.text(), cloud.finish_reason) == (
        reference.committed, reference.text(), reference.finish_reason)


def test_a_tree_edge_holds_its_nodes_for_the_cadence_and_sends_them_together() -> None:
    """``drafts_every`` 3: two forwards send nothing, the third sends the nodes of all
    three in one message, parents first (fewer messages for the cloud's host to read)."""
    edge = EdgeSession(plan=plan(4, 8, 1), max_new_tokens=64, eos_token_id=EOS,
                       speculative=True, tree=TreeShape(node_budget=64, top_k=2, per_forward=1),
                       drafts_every=3)
    edge.on_prefill_done()
    sent: list[DraftTail] = []
    for forward in range(3):
        wanted = edge.expansion()
        actions = edge.on_expanded([k for k, _ in wanted],
                                   [[(10 + forward, -0.1), (20 + forward, -3.0)]] * len(wanted))
        sent += [a.tail for a in actions if isinstance(a, SendDrafts)]
        assert (len(sent) > 0) == (forward == 2)
    (message,) = sent
    assert [n.token_id for n in message.nodes] == [10, 20, 11, 21, 12, 22]
    assert edge.cadence == 3 and edge.tree is not None and edge.tree.unsent == 0
