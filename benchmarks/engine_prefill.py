"""The prefill's parts on the static engine, graphed against eager, and a step that
carries a prompt piece: ``python -m benchmarks.bench_engine --prefill-only`` runs these
and writes ``prefill-<card>.json``; the docs' tables are rendered from it by
``tools/render_results.py`` (kinds ``prefill-parts`` and ``mixed-steps``)."""

from __future__ import annotations

import statistics
import time
from functools import partial
from typing import Any

import torch

from benchmarks.device_timing import median_ms, sync, times_ms
from benchmarks.engine_agreement import QUESTION, pixels
from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.cloud.target import TargetModel
from eventspec.shared.node.static.batch import StepBatch


def fill_slots(engine: StaticEngine, n: int) -> None:
    """Give slots 1..n-1 slot 0's KV (timing does not depend on values)."""
    for s in range(1, n):
        engine.k_cache[:, s].copy_(engine.k_cache[:, 0])
        engine.v_cache[:, s].copy_(engine.v_cache[:, 0])
        engine.occupancy.hold(s, engine.occupancy.filled(0))


def prefill_costs(engine: StaticEngine, target: TargetModel, repeats: int) -> dict[str, Any]:
    """The prefill's parts, each as the engine runs it now ("graphed": the tower from its
    CUDA graph, prompt attention at rounded lengths) and as before ("eager": the tower
    eager, attention at the exact length), in one process:

    - ``prefill_ms``: 8 frames + the 2,103-token prompt, tower included;
    - ``tower_ms``: the tower and projector alone;
    - ``new_length_first_ms`` / ``new_length_again_ms``: a prompt of a length the
      server has not seen (3 lengths, each a few tokens longer), its first call and
      a second one: what a new question's length costs its time to first token;
    - ``question_after_prefix_ms``: 20 text tokens after a prompt's first rows (a new
      question on a reused clip): the eager prefill against one graphed step.
    """
    ids = target.build_prompt_ids(QUESTION)
    pix = pixels(target, 0)
    req = PrefillRequest(slot=0, input_ids=ids, pixel_values_videos=pix)
    tower, step = engine.tower_graph, engine.prompt_length_step
    hidden = engine.weights.hidden
    out: dict[str, Any] = {"prompt_tokens": len(ids)}

    def use(mode: str) -> None:
        engine.tower_graph = tower if mode == "graphed" else None
        engine.prompt_length_step = step if mode == "graphed" else 1

    modes = ("eager", "graphed")
    for name, fn in (("prefill_ms", lambda: engine.prefill([req])),
                     ("tower_ms", partial(engine.prompt_embeds, req))):
        runs: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(repeats):  # interleaved, so a slower moment of the host hits both
            for mode in modes:
                use(mode)
                runs[mode].extend(times_ms(fn, 1, warmup=1))
        for mode in modes:
            out[f"{name}_{mode}"] = statistics.median(runs[mode])
    # Grow the allocator to the longest prompt below first, so a first call pays only
    # what its new length costs.
    engine.prefill_embeds([0], [torch.randn(len(ids) + 40, hidden, device=engine.device,
                                            dtype=engine.dtype)])
    for mode, base in (("eager", len(ids) + 7), ("graphed", len(ids) + 17)):
        use(mode)
        first, again = [], []
        for n in range(base, base + 3):
            e = torch.randn(n, hidden, device=engine.device, dtype=engine.dtype)  # [n, H]
            for times in (first, again):
                sync()
                t0 = time.perf_counter()
                engine.prefill_embeds([0], [e])
                sync()
                times.append((time.perf_counter() - t0) * 1e3)
        out[f"new_length_first_ms_{mode}"] = first
        out[f"new_length_again_ms_{mode}"] = again
    engine.tower_graph, engine.prompt_length_step = tower, step
    engine.prefill([req])
    n_q, start = 20, len(ids)
    q_ids = tuple(int(i) for i in ids[-n_q:])
    q_embeds = engine.weights.embed.index_select(0, torch.tensor(q_ids, device=engine.device))

    def eager() -> None:
        engine.occupancy.hold(0, start)
        engine.prefill_embeds([0], [q_embeds], [start])

    def graphed() -> None:
        engine.occupancy.hold(0, start)
        engine.prompt_rows_as_step([0], [start], [q_ids])

    out["question_tokens"] = n_q
    out["question_after_prefix_ms_eager"] = median_ms(eager, repeats)
    out["question_after_prefix_ms_graphed"] = median_ms(graphed, repeats)
    return out


def mixed_costs(engine: StaticEngine, ctx: int, repeats: int,
                sessions: tuple[int, ...] = (1, 16), rows: int = 512) -> dict[str, Any]:
    """A step of B sessions at ``ctx`` alone, with a prompt piece of ``rows`` rows inside
    it (replayed from its mixed-step graph, and eager at exact shapes), and the piece
    in a prefill call of its own followed by the step: ms each, per B."""
    piece_slot, piece_start = max(sessions) + 1, min(1024, engine.max_seq_len - rows - 2)
    fill_slots(engine, piece_slot)
    piece = torch.randn(rows, engine.weights.hidden, device=engine.device,
                        dtype=engine.dtype)  # [rows, H]
    graphs = engine.mixed_graphs
    out: dict[str, Any] = {"piece_rows": rows, "context": ctx}

    def mixed(batch: StepBatch) -> None:
        engine.occupancy.hold(piece_slot, piece_start)
        engine.step_with_pieces(batch, [piece_slot], [piece], [piece_start])

    def apart(batch: StepBatch) -> None:
        engine.occupancy.hold(piece_slot, piece_start)
        engine.prefill_embeds([piece_slot], [piece], [piece_start])
        engine.step(batch)

    for b in sessions:
        batch = StepBatch(tuple(range(b)), (ctx,) * b, (1,) * b,
                          torch.ones(b, dtype=torch.long, device=engine.device))
        out[f"B{b}_step_ms"] = median_ms(partial(engine.step, batch), repeats)
        out[f"B{b}_mixed_graphed_ms"] = median_ms(partial(mixed, batch), repeats)
        engine.mixed_graphs = {}
        out[f"B{b}_mixed_eager_ms"] = median_ms(partial(mixed, batch), repeats)
        engine.mixed_graphs = graphs
        out[f"B{b}_apart_ms"] = median_ms(partial(apart, batch), repeats)
    return out
