"""The speculative pipeline on a virtual clock: the product's own state machines, no models.

Why: the end-to-end benchmark needs processes, a GPU and minutes per point; the reference
model (``benchmarks/spec_model.py``) is a formula for chains. This runs the edge's
``EdgeSession`` (chains, or trees grown by ``EdgeTree``), the oracle drafter's draws,
the stream's ``TreeChecks`` and the cloud's ``DecodingSession`` (its draft tree and
commit rules) against one fixed answer, with a link delay each way, a draft forward of
``draft_ms`` and a target step of ``step_ms``: what the protocol and the edge's policy
give when nothing else costs time. A step verifies the drafts the cloud holds when it
starts and sends its Commit when it ends, ``step_ms`` later; the next step starts then.
Checked against real processes on a CPU (a paced cloud at 26 ms a step, the oracle at
3.39 ms a token, RTT 20 ms, chains): 1.90 tokens per step measured
(``benchmarks/results/e2e-cpu-paced-chains-step26.json``), 1.82-1.92 here.
Greedy verification is exact, so tokens per step and the answer time are those of the
real mechanism, bounded by nothing but the clock.

What it leaves out, by design: every cost but the two paces and the link (the cloud's
host work per node and per message, the padding of a step to its longest session, the
GIL), so it bounds what the protocol and the edge's policy can give; a GPU run that
falls short of it is held back by those costs.

Usage: ``python -m benchmarks.pipeline_sim --alpha 0.8 --coverage 0 0.75 --rtt-ms 20
--step-ms 19 --draft-ms 3.39 --tokens 512 --out benchmarks/results/pipeline-sim.json``
(one JSON line per configuration; ``--out`` also writes them, stamped).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.stamp import write_result
from eventspec.cloud.speculation.decoding import DecodingSession
from eventspec.cloud.speculation.tree_checks import TreeChecks
from eventspec.edge.ask.session import EdgeSession, SendDrafts
from eventspec.edge.drafting.cache import DraftCache
from eventspec.edge.drafting.oracle_backend import OracleDraftBackend, OracleSettings
from eventspec.edge.drafting.tree import TreeShape
from eventspec.shared.contract.timing import TimingPlan
from eventspec.shared.contract.types import CommitEvent, DraftTail, GenerationSettings

VOCAB, EOS = 32000, 2
DEFAULT_SHAPE = TreeShape()


@dataclass(frozen=True)
class Setup:
    """One configuration: the drafter, the link, the two paces and the edge's tree."""

    alpha: float = 0.8
    coverage: float = 0.0  # 0: chains
    rtt_ms: float = 20.0
    step_ms: float = 10.0
    draft_ms: float = 3.4
    prefill_ms: float = 50.0
    draft_prefill_ms: float = 45.0
    tokens: int = 512
    lookahead: int = 12
    max_verify: int = 8
    shape: TreeShape = DEFAULT_SHAPE
    #: A session with no drafts when a step starts sits that step out (SpecEdge), at
    #: most one step in a row, instead of stepping with none (issue 36 item 5).
    sit_out: bool = False
    #: The edge's ``--drafts-every``: draft forwards (chains: tokens) per message.
    drafts_every: int = 1
    #: "path": each step verifies the likeliest path of the kept tree (the product);
    #: "tree": every kept branch at once (tree attention, not built), accepting along
    #: whichever branch the answer takes (``DraftForest.match_depth``), up to
    #: ``max_verify``. Prices what several branches a step would add.
    verify: str = "path"


@dataclass
class Outcome:
    steps: int
    tokens: int
    ms: float
    target_only_ms: float
    verified: int
    accepted: int
    sat_out: int = 0
    nodes_sent: int = 0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / max(self.steps, 1)

    @property
    def speedup(self) -> float:
        return self.target_only_ms / self.ms


def simulate(setup: Setup, seed: int) -> Outcome:
    """One answer of ``setup.tokens`` random tokens, drafted by the oracle and verified on
    the clock."""
    rng = random.Random(seed)
    answer = tuple(rng.randrange(3, VOCAB) for _ in range(setup.tokens))
    question = f"q{seed}"
    backend = OracleDraftBackend(OracleSettings({question: answer}, setup.alpha, 0.0, 0.0,
                                                seed, setup.coverage), VOCAB, EOS)
    drafter = DraftCache(backend)
    drafter.prefill(question, None)
    return replay(setup, drafter, answer, trees=drafter.expands_in_one_forward)


def replay(setup: Setup, drafter: DraftCache, answer: Sequence[int], *, trees: bool,
           eos: int = EOS, vocab: int = VOCAB) -> Outcome:
    """``answer`` (the target's, EOS included where it ended) drafted by ``drafter``
    (already prefilled), as chains or trees, and verified on the clock. ``trees`` may be
    forced for a drafter that expands one context per forward: the clock charges one
    forward whatever it expands."""
    answer = tuple(answer)
    plan = TimingPlan(True, 4, setup.lookahead, 1, False, setup.alpha, setup.prefill_ms,
                      setup.step_ms, 1.0, "simulated")
    edge = EdgeSession(plan=plan, max_new_tokens=len(answer), eos_token_id=eos,
                       speculative=True, tree=setup.shape if trees else None,
                       drafts_every=setup.drafts_every)
    cloud = DecodingSession(settings=GenerationSettings(max_new_tokens=len(answer)), slot=0,
                            prompt_len=1, max_seq_len=len(answer) + 2, eos_token_id=eos,
                            max_verify_tokens=setup.max_verify + 1, decode=lambda ids: "",
                            speculative=True)
    checks = TreeChecks(max_nodes=setup.shape.cloud_nodes, max_depth=setup.shape.max_depth,
                        max_per_message=128, text_vocab_size=vocab)
    half = setup.rtt_ms / 2
    seq = itertools.count()
    events: list[tuple[float, int, str, Any]] = []

    def at(t: float, kind: str, payload: Any = None) -> None:
        heapq.heappush(events, (t, next(seq), kind, payload))

    def send(now: float, actions: Sequence[object]) -> None:
        for a in actions:
            if isinstance(a, SendDrafts):
                at(now + half, "drafts", a.tail)

    def verify() -> tuple[int, list[int]]:
        drafts = cloud.drafts_now()
        n = len(cloud.committed)
        if setup.verify == "tree":  # every kept branch: the rows are the tree's nodes ahead
            ok = min(cloud.drafts.match_depth(answer[n: n + setup.max_verify]),
                     len(answer) - n)
            return cloud.drafts.ahead, [*answer[n: n + ok + 1]]
        ok = 0
        while ok < len(drafts) and n + ok < len(answer) and drafts[ok] == answer[n + ok]:
            ok += 1
        return len(drafts), [*drafts[:ok], *answer[n + ok: n + ok + 1]]

    steps = verified = accepted = sat_out = 0
    sitting = False
    drafting: Callable[[], list[object]] | None = None
    at(setup.prefill_ms, "step")
    at(setup.draft_prefill_ms, "edge_prefilled")
    now = 0.0
    while events and cloud.finish_reason is None:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "drafts":
            tail: DraftTail = payload
            cloud.offer_drafts(checks.check(tail, len(cloud.committed)) if tail.nodes else tail)
        elif kind == "step":  # the step reads the drafts here and commits step_ms later
            if not cloud.prefilled:
                cloud.mark_prefilled(0.0)
            elif setup.sit_out and not cloud.drafts_now() and not sitting:
                sitting = True  # the batch steps without this session
                sat_out += 1
                at(now + setup.step_ms, "step")
                continue
            sitting = False
            at(now + setup.step_ms, "step_done", verify())
        elif kind == "step_done":
            v, tokens = payload
            steps += 1
            verified += v
            accepted += len(tokens) - 1
            c = cloud.commit(len(tokens) - 1, tokens, v, 0.0)
            at(now + half, "commit", CommitEvent(c.start, tuple(c.tokens), v,
                                                  len(tokens) - 1, "", 0.0))
            at(now, "step")
        elif kind == "commit":
            edge.on_commit(payload)
        elif kind == "edge_prefilled":
            edge.on_prefill_done()
        elif kind == "forward_done":
            assert drafting is not None
            send(now, drafting())
            drafting = None
        if drafting is None and kind not in ("step", "step_done") and edge.wants_draft():
            if edge.tree is not None:
                wanted = edge.expansion()
                result = drafter.expand([c for _, c in wanted], edge.tree.top_k)
                keys = [k for k, _ in wanted]
                drafting = lambda keys=keys, result=result: edge.on_expanded(keys, result)  # noqa: E731
            else:
                ctx = edge.draft_context()
                token = drafter.draft_next(ctx)
                drafting = lambda ctx=ctx, token=token: edge.on_draft(ctx, token)  # noqa: E731
            at(now + setup.draft_ms, "forward_done")
    assert tuple(cloud.committed) == answer[: len(cloud.committed)], "lossless"
    target_only = setup.prefill_ms + len(answer) * setup.step_ms
    nodes = edge.tree.nodes_sent if edge.tree is not None else 0
    return Outcome(steps, len(cloud.committed), now, target_only, verified, accepted, sat_out,
                   nodes)


def run(setup: Setup, seeds: int) -> dict[str, Any]:
    outs = [simulate(setup, s) for s in range(seeds)]
    return {
        "alpha": setup.alpha, "coverage": setup.coverage, "rtt_ms": setup.rtt_ms,
        "step_ms": setup.step_ms, "draft_ms": setup.draft_ms, "tokens": setup.tokens,
        "tree": None if setup.coverage <= 0 else vars(setup.shape),
        "sit_out": setup.sit_out,
        "verify": setup.verify,
        "nodes_sent_per_step": (sum(o.nodes_sent for o in outs)
                                / max(1, sum(o.steps for o in outs))),
        "sat_out_share": (sum(o.sat_out for o in outs)
                          / max(1, sum(o.steps + o.sat_out for o in outs))),
        "seeds": seeds,
        "tokens_per_step": statistics.median(o.tokens_per_step for o in outs),
        "speedup": statistics.median(o.speedup for o in outs),
        "accepted_over_verified": (sum(o.accepted for o in outs)
                                   / max(1, sum(o.verified for o in outs))),
    }


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--alpha", type=float, default=0.8)
    p.add_argument("--coverage", type=float, nargs="+", default=[0.0, 0.75])
    p.add_argument("--rtt-ms", type=float, nargs="+", default=[20.0])
    p.add_argument("--step-ms", type=float, default=10.0)
    p.add_argument("--draft-ms", type=float, default=3.4)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--tree-nodes", type=int, default=DEFAULT_SHAPE.node_budget)
    p.add_argument("--tree-top-k", type=int, default=DEFAULT_SHAPE.top_k)
    p.add_argument("--tree-per-forward", type=int, default=DEFAULT_SHAPE.per_forward)
    p.add_argument("--tree-depth", type=int, default=DEFAULT_SHAPE.max_depth,
                   help="the edge's depth cap below C's end")
    p.add_argument("--tree-branch-top-k", type=int, default=DEFAULT_SHAPE.branch_top_k)
    p.add_argument("--max-verify", type=int, default=8)
    p.add_argument("--sit-out", action="store_true",
                   help="also run each configuration with a session sitting out a step it "
                        "has no drafts for (at most one in a row)")
    p.add_argument("--verify", nargs="+", choices=("path", "tree"), default=["path"],
                   help="path: each step verifies the kept tree's likeliest path (the "
                        "product); tree: every kept branch at once (tree attention)")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--out", type=Path, default=None, help="also write the runs here, stamped")
    a = p.parse_args(argv)
    shape = TreeShape(a.tree_nodes, a.tree_top_k, a.tree_per_forward, a.tree_depth,
                      branch_top_k=a.tree_branch_top_k)
    runs = []
    for rtt in a.rtt_ms:
        for q in a.coverage:
            for sit_out, verify in itertools.product(
                    (False, True) if a.sit_out else (False,), a.verify):
                setup = Setup(a.alpha, q, rtt, a.step_ms, a.draft_ms, tokens=a.tokens,
                              max_verify=a.max_verify, shape=shape, sit_out=sit_out,
                              verify=verify)
                runs.append(run(setup, a.seeds))
                print(json.dumps(runs[-1]))
    if a.out is not None:
        command = "python -m benchmarks.pipeline_sim " + " ".join(
            sys.argv[1:] if argv is None else argv)
        write_result(a.out, {"benchmark": "pipeline-sim", "command": command,
                             "seeds": a.seeds, "runs": runs})


if __name__ == "__main__":
    main()
