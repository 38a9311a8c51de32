"""The key invariant over real gRPC: greedy speculative output == target-only output.

Every draft pattern an edge can produce (right, wrong at any place, stale, from an old
base, empty, as wide as the server allows, running past the end of the answer, crossing
a stop string, hidden behind the prefill, duplicated or late) runs on every case: the
tiny random target on several questions and clips, and the trained toy target on
several scenes, with and without stop strings. Each speculative answer must equal the
target-only answer over the same server token for token, with the same text and finish
reason; the target-only answer must itself equal an independent greedy loop cut by the
stop rules (and HF ``generate`` where no stop string applies).

The drafts that run past the end are the target's own greedy continuation beyond EOS,
the token cap or the stop string, so the verifier accepts them: only the stop rules,
applied per token inside a bulk commit, keep them out of the answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import pytest
import pytest_asyncio
import torch
from transformers import DynamicCache

from eventspec.cloud.model_dirs import model_dir
from eventspec.cloud.server import VerifierServer
from eventspec.cloud.target import TargetModel, load_target
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.contract.types import FinishReason
from eventspec.shared.node.imageproc import encode_png
from eventspec.shared.node.kvcache import cache_kwarg
from eventspec.shared.pb.eventspec.v1 import verifier_pb2
from eventspec.shared.toyworld.qa import all_questions
from eventspec.shared.toyworld.scenes import EVAL_SEED_MIN, clip_frames, sample_scene
from tests.support import cloud_harness as h

TINY_QUESTIONS = [
    "What is moving?",
    "Which way does the car go?",
    "Describe the scene.",
    "How many objects are there?",
    "Is it fast or slow?",
]
#: How far past the answer's end the oracle continues (drafts that overrun it).
OVERRUN = 10


@dataclass(frozen=True)
class Case:
    """One request: which target, what it is asked about which clip, and its limits."""

    model: str  # "tiny" | "toy"
    question: str
    clip_seed: int
    max_new: int
    with_stop: bool  # a stop string drawn from the answer's middle

    @property
    def id(self) -> str:
        return f"{self.model}-{self.clip_seed}-{self.max_new}{'-stop' if self.with_stop else ''}"


def tiny_cases(n: int, first_seed: int = 1000) -> list[Case]:
    """Random clips; token caps 8..24 so both the cap and EOS end answers."""
    return [Case("tiny", TINY_QUESTIONS[i % len(TINY_QUESTIONS)], first_seed + i,
                 8 + (i % 3) * 8, with_stop=i % 2 == 1) for i in range(n)]


def toy_cases(n: int, first_seed: int = EVAL_SEED_MIN + 10) -> list[Case]:
    """Fresh toy scenes (evaluation seeds), a different question type on each."""
    out = []
    for i in range(n):
        seed = first_seed + i
        questions = all_questions(sample_scene(seed))
        out.append(Case("toy", questions[i % len(questions)].question, seed,
                        16 if i % 3 else 4, with_stop=i % 2 == 0))
    return out


CASES = tiny_cases(5) + toy_cases(4)
SLOW_CASES = tiny_cases(16, first_seed=5000) + toy_cases(12, first_seed=EVAL_SEED_MIN + 100)


# -- the oracle -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    tokens: list[int]
    text: str
    finish_reason: FinishReason


@dataclass(frozen=True)
class Reference:
    """What target-only decoding answers for one case, and what lies past its end."""

    frames: tuple[bytes, ...]
    continuation: list[int]  # greedy, EOS ignored, OVERRUN tokens past the cap
    stop: tuple[str, ...]  # a stop string that completes inside the plain answer
    plain: Answer  # no stop string
    stopped: Answer  # under ``stop``


def frames_for(case: Case) -> tuple[bytes, ...]:
    if case.model == "toy":
        return tuple(encode_png(f) for f in clip_frames(sample_scene(case.clip_seed)))
    return h.make_frames(case.clip_seed)


def greedy_past_the_end(target: TargetModel, question: str, frames: Sequence[bytes],
                        n: int) -> list[int]:
    """The target's greedy tokens over its text vocabulary, ``n`` of them, EOS ignored."""
    ids = target.build_prompt_ids(question)
    pix = target.preprocess_frames(frames)  # [1, F, 3, S, S]
    cache = DynamicCache(config=target.model.config)
    out: list[int] = []
    kv = {cache_kwarg(target.model): cache}
    with torch.inference_mode():
        logits = target.model(input_ids=torch.tensor([ids]), pixel_values_videos=pix,
                              use_cache=True, **kv).logits[0, -1]  # [V]
        for _ in range(n):
            out.append(int(torch.argmax(logits[: target.text_vocab_size])))
            logits = target.model(input_ids=torch.tensor([[out[-1]]]), use_cache=True,
                                  **kv).logits[0, -1]  # [V]
    return out


def cut(tokens: Sequence[int], *, eos: int, max_new: int, stop: Sequence[str],
        decode: Callable[[Sequence[int]], str]) -> list[int]:
    """``tokens`` cut where target-only decoding stops: EOS, a stop string, the cap."""
    for n in range(1, len(tokens) + 1):
        head = list(tokens[:n])
        if head[-1] == eos or any(s in decode(head) for s in stop) or n >= max_new:
            return head
    raise AssertionError("the continuation ends before the answer does")


def stop_string_for(target: TargetModel, tokens: Sequence[int]) -> str:
    """A stop string that first completes in the answer's middle (never at token 0)."""
    for mid in range(max(2, len(tokens) // 2), len(tokens) + 1):
        text = target.decode(tokens[:mid]).rstrip()
        if len(text) >= 2 and text[-2:].strip() and text[-2:] not in target.decode(tokens[:1]):
            return text[-2:]
    return target.decode(tokens).strip()[-1:] or "."


# -- draft patterns -------------------------------------------------------------------------


@dataclass(frozen=True)
class Drafting:
    """What a pattern draws its drafts from."""

    truth: list[int]  # the answer target-only decoding gives
    cont: list[int]  # the target's greedy continuation, past the answer's end
    vocab: int
    width: int  # the server's max_draft_tokens


@dataclass(frozen=True)
class Plan:
    """How one request drafts: a hidden tail at base 0, a policy per Commit, raw extras."""

    hidden: list[int] | None = None
    policy: h.DraftPolicy | None = None
    extra: tuple[verifier_pb2.EdgeMessage, ...] = ()


def wrong(tok: int, vocab: int) -> int:
    return (tok + 7) % vocab


def first_wrong(d: Drafting) -> Plan:
    def policy(b: int, _c: Sequence[int]) -> list[int]:
        tail = d.cont[b : b + 5]
        return [wrong(tail[0], d.vocab), *tail[1:]]
    return Plan(policy=policy)


def mid_wrong(d: Drafting) -> Plan:
    def policy(b: int, _c: Sequence[int]) -> list[int]:
        tail = list(d.cont[b : b + 6])
        tail[3] = wrong(tail[3], d.vocab)
        return tail
    return Plan(policy=policy)


def old_base(d: Drafting) -> Plan:
    """Valid tails re-sent from a base up to 3 tokens back (their overlap agrees)."""
    return Plan(policy=lambda b, _c: (max(0, b - 3), d.cont[max(0, b - 3) : b + 4]))


def duplicated_late(d: Drafting) -> Plan:
    """The same tail twice before any Commit, then tails re-sent after being committed."""
    twice = (h.drafts_msg(0, d.cont[:4]), h.drafts_msg(0, d.cont[:4]))
    return Plan(policy=lambda b, _c: (max(0, b - 2), d.cont[max(0, b - 2) : b + 4]),
                extra=twice)


def max_width(d: Drafting) -> Plan:
    """Tails exactly as wide as the server allows: right as far as known, then wrong."""
    def policy(b: int, _c: Sequence[int]) -> list[int]:
        tail = d.cont[b : b + d.width]
        return tail + [wrong(tail[-1], d.vocab)] * (d.width - len(tail))
    return Plan(policy=policy)


def past_the_end(d: Drafting) -> Plan:
    """Right drafts that run on past EOS, the cap or the stop string (hidden ones too)."""
    return Plan(hidden=d.cont[:8], policy=lambda b, _c: d.cont[b : b + 8])


PATTERNS: dict[str, Callable[[Drafting], Plan]] = {
    "none": lambda d: Plan(),
    "all_right": lambda d: Plan(policy=h.perfect(d.truth)),
    "all_wrong": lambda d: Plan(policy=h.all_wrong(d.truth, d.vocab)),
    "first_wrong": first_wrong,
    "mid_wrong": mid_wrong,
    "random_wrong": lambda d: Plan(policy=h.random_wrong(d.cont, d.vocab, seed=len(d.truth))),
    "stale_tail": lambda d: Plan(policy=h.stale(d.cont, d.vocab)),
    "old_base": old_base,
    "hidden_right": lambda d: Plan(hidden=d.cont[:10], policy=h.perfect(d.truth, k=3)),
    "hidden_wrong": lambda d: Plan(hidden=[wrong(t, d.vocab) for t in d.cont[:10]],
                                   policy=h.all_wrong(d.truth, d.vocab)),
    "duplicated_late": duplicated_late,
    # empty tails (a plain decode step) alternating with right ones
    "empty": lambda d: Plan(policy=lambda b, _c: [] if b % 2 else d.cont[b : b + 4]),
    "max_width": max_width,
    "past_the_end": past_the_end,
    # past_the_end on every case, with a stop string that completes inside the answer
    "stop_crossing": past_the_end,
}

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def targets() -> dict[str, TargetModel]:
    return {"tiny": build_tiny_random_target(seed=0), "toy": load_target(model_dir("toy"))}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def servers(targets: dict[str, TargetModel]) -> AsyncIterator[dict[str, VerifierServer]]:
    started = {name: await h.start_verifier(t, max_sessions=4) for name, t in targets.items()}
    yield started
    for srv in started.values():
        await srv.stop(0)


_REFERENCES: dict[Case, Reference] = {}


def finish_reason_of(tokens: Sequence[int], stop: Sequence[str],
                     target: TargetModel) -> FinishReason:
    """Which rule ended an answer cut by :func:`cut` (the order the cloud checks them in)."""
    if tokens[-1] == target.eos_token_id:
        return FinishReason.EOS
    if any(s in target.decode(tokens) for s in stop):
        return FinishReason.STOP_STRING
    return FinishReason.MAX_TOKENS


async def target_only(case: Case, server: VerifierServer, frames: tuple[bytes, ...],
                      stop: tuple[str, ...]) -> Answer:
    out = await h.run_generate(server.port, h.open_msg(
        case.question, frames, max_new_tokens=case.max_new, speculative=False, stop=stop))
    assert out.done.stats.drafted == 0
    return Answer(out.tokens, out.done.text, out.done.finish_reason)


async def reference(case: Case, target: TargetModel, server: VerifierServer) -> Reference:
    """The case's target-only answers (computed once), checked against the oracle."""
    if case in _REFERENCES:
        return _REFERENCES[case]
    frames = frames_for(case)
    cont = greedy_past_the_end(target, case.question, frames, case.max_new + OVERRUN)
    plain = cut(cont, eos=target.eos_token_id, max_new=case.max_new, stop=(),
                decode=target.decode)
    assert plain == h.target_greedy(target, case.question, frames, case.max_new), (
        "the greedy loop disagrees with HF generate()")
    stop = (stop_string_for(target, plain),)
    stopped = cut(cont, eos=target.eos_token_id, max_new=case.max_new, stop=stop,
                  decode=target.decode)
    answers = {}
    for key, stops, tokens in (("plain", (), plain), ("stopped", stop, stopped)):
        got = await target_only(case, server, frames, stops)
        assert got.tokens == tokens, f"target-only ({key}) over gRPC differs from the oracle"
        assert got.finish_reason == finish_reason_of(tokens, stops, target)
        assert not any(s in got.text for s in stops)
        answers[key] = got
    ref = Reference(frames, cont, stop, answers["plain"], answers["stopped"])
    _REFERENCES[case] = ref
    return ref


async def check_pattern(servers: dict[str, VerifierServer], targets: dict[str, TargetModel],
                        pattern: str, case: Case) -> None:
    """One speculative request drafting with ``pattern`` equals target-only, text and all."""
    target, server = targets[case.model], servers[case.model]
    ref = await reference(case, target, server)
    use_stop = case.with_stop or pattern == "stop_crossing"
    want = ref.stopped if use_stop else ref.plain
    plan = PATTERNS[pattern](Drafting(want.tokens, ref.continuation, target.text_vocab_size,
                                      server.settings.limits.max_draft_tokens))
    spec = await h.run_generate(
        server.port,
        h.open_msg(case.question, ref.frames, max_new_tokens=case.max_new,
                   stop=ref.stop if use_stop else ()),
        hidden=plan.hidden, policy=plan.policy, extra=plan.extra,
    )
    assert spec.tokens == want.tokens, f"speculative ({pattern}) differs from target-only"
    assert (spec.done.text, spec.done.finish_reason) == (want.text, want.finish_reason)
    stats, n = spec.done.stats, len(want.tokens)
    assert 0 <= stats.accepted <= stats.drafted
    if pattern == "none":
        assert stats.drafted == 0 and stats.target_steps == n  # the prefill counts
    # Right drafts save steps. The cloud never waits for drafts, so a tail sent after a
    # Commit can miss the next step: only long answers, or hidden tails (sent before
    # the prefill ends), make the saving certain.
    if (pattern in ("hidden_right", "past_the_end") and n > 2) or (
            pattern == "all_right" and n >= 8):
        assert stats.accepted > 0 and stats.target_steps < n
    if pattern in ("all_wrong", "hidden_wrong"):
        assert stats.accepted == 0 and stats.hidden_accepted == 0
    if pattern == "all_wrong" and stats.drafted:
        assert spec.done.final_plan is not None
        assert spec.done.final_plan.acceptance_estimate < 0.5
    if pattern == "hidden_right" and n > 1:
        assert stats.hidden_drafted > 0 and stats.hidden_accepted > 0


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("pattern", list(PATTERNS))
async def test_every_draft_pattern_equals_target_only(
    servers: dict[str, VerifierServer], targets: dict[str, TargetModel], pattern: str,
    case: Case,
) -> None:
    await check_pattern(servers, targets, pattern, case)


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW_CASES, ids=lambda c: c.id)
async def test_every_draft_pattern_on_a_wider_sweep(
    servers: dict[str, VerifierServer], targets: dict[str, TargetModel], case: Case,
) -> None:
    for pattern in PATTERNS:
        await check_pattern(servers, targets, pattern, case)


async def test_the_cases_cover_both_targets_and_every_stop_rule(
    servers: dict[str, VerifierServer], targets: dict[str, TargetModel],
) -> None:
    """The sweep is only as good as its cases: distinct requests on both targets, and
    answers ended by EOS, by the token cap and by a stop string inside the answer."""
    assert len({(c.model, c.question, c.clip_seed) for c in CASES}) == len(CASES) >= 6
    assert {c.model for c in CASES} == {"tiny", "toy"}
    assert any(c.with_stop for c in CASES) and not all(c.with_stop for c in CASES)
    refs = [await reference(c, targets[c.model], servers[c.model]) for c in CASES]
    reasons = {r.plain.finish_reason for r in refs} | {r.stopped.finish_reason for r in refs}
    assert reasons == {FinishReason.EOS, FinishReason.MAX_TOKENS, FinishReason.STOP_STRING}
    assert sum(len(r.stopped.tokens) < len(r.plain.tokens) for r in refs) >= len(refs) // 2


async def test_perfect_drafts_cut_target_steps(servers: dict[str, VerifierServer],
                                               targets: dict[str, TargetModel]) -> None:
    target, server = targets["tiny"], servers["tiny"]
    frames = h.make_frames(5)
    truth = h.target_greedy(target, "What is moving?", frames, 24)
    out = await h.run_generate(
        server.port, h.open_msg("What is moving?", frames, max_new_tokens=24),
        hidden=truth[:12], policy=h.perfect(truth, k=12),
    )
    assert out.tokens == truth
    s = out.done.stats
    assert s.mean_accepted_length > 2.0, s
    assert s.target_steps <= len(truth) // 2
