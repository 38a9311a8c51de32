"""What a tree node costs the cloud's host, per stage, in each wire form.

Why: at 64 clients trees lost to chains (0.77x against 1.02x on the H200,
``e2e-h200-64-*.json``) with about 24 nodes sent per committed token; every node is
decoded and checked on the event loop that serves all streams, and placed in the
request's tree on the engine thread. This measures those stages, in microseconds a
node, for nodes sent as ``DraftNode`` messages and as the packed columns, on messages
shaped as the edge sends them (``--nodes`` per message, chains with side branches).

    python -m benchmarks.bench_tree_nodes --out benchmarks/results/tree-nodes-cpu.json
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.stamp import write_result
from eventspec.cloud.speculation.draft_forest import DraftForest
from eventspec.cloud.speculation.tree_checks import TreeChecks
from eventspec.shared.contract.convert_verifier import drafts_from_pb, drafts_to_pb
from eventspec.shared.contract.types import ROOT, DraftNode, DraftTail
from eventspec.shared.pb.eventspec.v1 import verifier_pb2


def tails(messages: int, per_message: int, seed: int) -> list[DraftTail]:
    """Messages of new nodes, ids increasing: a chain with a sibling every third node."""
    rng = random.Random(seed)
    out, next_id = [], 0
    for _ in range(messages):
        nodes = []
        for i in range(per_message):
            parent = ROOT if i == 0 else next_id - 1 - (1 if i % 3 == 0 and i > 1 else 0)
            nodes.append(DraftNode(next_id, parent, rng.randrange(32000), -rng.random()))
            next_id += 1
        out.append(DraftTail(0, (), nodes=tuple(nodes)))
    return out


def as_messages(tail: DraftTail) -> bytes:
    """The older form: one ``DraftNode`` message per node."""
    return verifier_pb2.Drafts(base=tail.base, nodes=[
        verifier_pb2.DraftNode(id=n.id, parent=n.parent, token_id=n.token_id,
                               logprob=n.logprob) for n in tail.nodes]).SerializeToString()


def per_node_us(run: Callable[[], object], nodes: int, repeats: int) -> float:
    """The median over ``repeats`` of one run's time, per node, in microseconds."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / nodes * 1e6


def measure(messages: int, per_message: int, repeats: int, seed: int) -> dict[str, Any]:
    data = tails(messages, per_message, seed)
    nodes = messages * per_message
    wire = {"messages": [as_messages(t) for t in data],
            "columns": [drafts_to_pb(t).SerializeToString() for t in data]}
    decoded = [drafts_from_pb(verifier_pb2.Drafts.FromString(b)) for b in wire["columns"]]

    def decode(form: str) -> Callable[[], object]:
        return lambda: [drafts_from_pb(verifier_pb2.Drafts.FromString(b)) for b in wire[form]]

    def check() -> object:
        checks = TreeChecks(max_nodes=10**9, max_depth=10**6, max_per_message=10**6,
                            text_vocab_size=32000)
        return [checks.check(t, 0) for t in decoded]

    def place() -> object:
        forest = DraftForest()
        return [forest.add_nodes(0, t.nodes, []) for t in decoded]

    return {
        "nodes": nodes, "per_message": per_message, "repeats": repeats,
        # False on code from before the columns, whose sender wrote messages for both
        "columns_on_wire": len(wire["columns"][0]) != len(wire["messages"][0]),
        "bytes_per_node": {form: sum(map(len, b)) / nodes for form, b in wire.items()},
        "decode_us_per_node": {form: per_node_us(decode(form), nodes, repeats)
                               for form in wire},
        "check_us_per_node": per_node_us(check, nodes, repeats),
        "place_us_per_node": per_node_us(place, nodes, repeats),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--nodes", type=int, default=24, help="nodes per message")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    result = measure(a.messages, a.nodes, a.repeats, a.seed)
    for key, value in result.items():
        print(f"{key}: {value}")
    write_result(a.out, result)


if __name__ == "__main__":
    main()
