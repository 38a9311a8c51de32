"""The edge's drafter, HF eager vs the static-KV runtime, against the cloud's step.

    python -m benchmarks.bench_edge                 # GPU: full-size EventGPT-7B and
                                                    # Video-LLaVA-7B shapes, random bf16
    python -m benchmarks.bench_edge --tiny          # the same code on CPU, tiny models

For each draft engine (``hf``: ``DraftModel`` with a ``DynamicCache``; ``static``:
``StaticDraftBackend`` with CUDA graphs; ``static_int8`` / ``static_int4``: the same
with weight-only int8 / int4 decoder weights, ``--draft-quant``) it times, with a
device sync around each call:
the vision path (five frames through CLIP, projector, adaptor and pooling), the prefill
(prompt plus event tokens), one draft token (a 1-token step after the prefill and a few
drafts, then rolled back so every repeat sees the same context), and a 9-token step
(a Commit's refeed). In the same process it builds the cloud's static engine over the
7B-shaped target and times its step at B = 1 (one token) and B = 16 (9 tokens each), so
c = t_draft / t_step is measured on one GPU in one run.

The vision path alone (``vision``): five frames through CLIP, projector, adaptor and
the feature adapter (to the target's video geometry), torch eager in the draft's dtype
vs ONNX Runtime on an export of the same shapes (``eventspec.edge.vision.onnx_export``): the
CUDA execution provider with the fused fp16 graphs on a GPU (the row is skipped, with
a note, when this ONNX Runtime has no CUDA EP), the CPU EP in fp32 with ``--tiny``. On
a GPU it times the sessions with CUDA graphs (``cuda_graph`` says whether every graph
captured) and ``without_cuda_graphs``, and ``tensorrt``: TensorRT's EP where it opens,
else why not (``--no-tensorrt`` skips it). ``--no-vision`` skips the vision path.
Writes ``edge_<device>.json`` to ``--out`` ($OUT or .).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.device_timing import median_p10_ms
from benchmarks.stamp import write_result
from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.engine.static.build import (
    build_static_engine,
    kv_bytes_per_slot,
    static_kv_plan,
)
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_draft import build_tiny_random_draft
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.edge.drafting.cache import DraftBackend
from eventspec.edge.drafting.eventgpt import DraftModel, EventGPTConfig, EventGPTForCausalLM
from eventspec.edge.drafting.static_backend import StaticDraftBackend
from eventspec.edge.vision.align import FeatureAdapter, build_adapter_for
from eventspec.shared.node.static.batch import StepBatch
from eventspec.shared.node.static.quant import QuantMode
from tests.support.fullsize import build_full_draft, build_full_target

QUESTION = "What is moving in the scene, and which way does it go?"
CONTEXT_DRAFTS = 8  # draft tokens fed before the timed one


def draft_timings(draft: DraftModel, backend: DraftBackend, repeats: int) -> dict[str, Any]:
    """Vision, prefill, one draft token and a 9-token step of one backend, in ms."""
    s = draft.image_size
    pixels = torch.randn(5, 3, s, s, generator=torch.Generator().manual_seed(0))
    vision, _ = median_p10_ms(
        lambda: draft.model.event_tokens(draft.clip_features(pixels).to(draft.dtype)),
        repeats)
    prefill, _ = median_p10_ms(lambda: backend.prefill(QUESTION, pixels), max(3, repeats // 4))
    state, logits = backend.prefill(QUESTION, pixels)
    prompt = backend.seq_len(state)
    tokens = [backend.greedy_next(logits)]
    for _ in range(CONTEXT_DRAFTS):
        tokens.append(backend.greedy_next(backend.step(state, tokens[-1:])[-1]))
    base = backend.seq_len(state)

    def one_token() -> None:
        backend.step(state, tokens[-1:])
        backend.rollback(state, base)

    def nine_tokens() -> None:
        backend.step(state, tokens[:9])
        backend.rollback(state, base)

    token_ms, token_p10 = median_p10_ms(one_token, repeats * 2)
    step9_ms, _ = median_p10_ms(nine_tokens, repeats)
    return {
        "vision_5_frames_ms": vision, "prefill_ms": prefill, "prefill_tokens": prompt,
        "context_tokens": base + 1, "draft_ms_per_token": token_ms,
        "draft_ms_per_token_p10": token_p10, "step_9_tokens_ms": step9_ms,
    }


def vision_timings(draft: DraftModel, dst: tuple[int, int, int], repeats: int,
                   tensorrt: bool = True) -> dict[str, Any]:
    """Five frames through CLIP + projector + adaptor + adapter: torch eager vs ONNX
    Runtime, each stage and the chain, in ms."""
    s, dev = draft.image_size, draft.device
    pixels = torch.randn(5, 3, s, s, generator=torch.Generator().manual_seed(0)).to(dev)
    clip = draft.clip_features(pixels)  # [5, T, Dv]
    adapter = build_adapter_for(tuple(clip.shape), dst).to(dev, draft.dtype)  # type: ignore[arg-type]
    result: dict[str, Any] = {"adapter_geometry": [list(clip.shape), list(dst)]}
    result["torch"] = _stage_timings(
        draft.clip_features, lambda c: draft.model.event_tokens(c.to(draft.dtype)), adapter,
        pixels, repeats)
    result["torch"]["dtype"] = str(draft.dtype)
    result["onnx"] = _onnx_timings(draft, adapter, pixels, repeats, tensorrt)
    return result


def _stage_timings(clip_fn: Callable[[torch.Tensor], torch.Tensor],
                   events_fn: Callable[[torch.Tensor], torch.Tensor],
                   adapter_fn: Callable[[torch.Tensor], torch.Tensor],
                   pixels: torch.Tensor, repeats: int) -> dict[str, Any]:
    clip = clip_fn(pixels)

    def chain() -> None:
        c = clip_fn(pixels)
        events_fn(c)
        adapter_fn(c)

    return {"clip_ms": median_p10_ms(lambda: clip_fn(pixels), repeats)[0],
            "events_ms": median_p10_ms(lambda: events_fn(clip), repeats)[0],
            "adapter_ms": median_p10_ms(lambda: adapter_fn(clip), repeats)[0],
            "total_ms": median_p10_ms(chain, repeats)[0]}


def _onnx_timings(draft: DraftModel, adapter: FeatureAdapter, pixels: torch.Tensor,
                  repeats: int, tensorrt: bool = True) -> dict[str, Any]:
    """Export a vision-only model of the draft's shapes (one LLM layer: the export never
    reads the LLM) and time it on the provider ``--vision-backend onnx`` would pick: on
    a GPU with CUDA graphs (the default), then the same export without, then TensorRT
    where its execution provider opens (its reason recorded where it does not)."""
    try:
        import onnxruntime

        from eventspec.edge.vision.onnx_backend import CUDA_EP, TRT_EP, choose_provider
        from eventspec.edge.vision.onnx_export import export_graphs
    except ImportError as exc:
        return {"skipped": f"ONNX Runtime or onnx not installed ({exc})"}
    available = onnxruntime.get_available_providers()
    dev = draft.device
    if dev.type == "cuda" and CUDA_EP not in available:
        return {"skipped": "this ONNX Runtime has no CUDA execution provider (providers: "
                           f"{', '.join(available)}); install onnxruntime-gpu"}
    provider, precision = choose_provider(dev, available)
    with torch.inference_mode(False), tempfile.TemporaryDirectory() as tmp:
        cfg = EventGPTConfig.from_dict(draft.model.config.to_dict())
        cfg.num_hidden_layers = 1
        t0 = time.perf_counter()
        graphs = export_graphs(EventGPTForCausalLM(cfg), copy.deepcopy(adapter), Path(tmp))
        export_s = time.perf_counter() - t0
        files = {name: {p: Path(tmp) / f for p, f in pair.items()}
                 for name, pair in graphs.files.items()}
        timings = _ort_timings(files, provider, dev, pixels, repeats, cuda_graph=True)
        if dev.type == "cuda":
            timings["without_cuda_graphs"] = _ort_timings(files, provider, dev, pixels,
                                                          repeats, cuda_graph=False)
            timings["tensorrt"] = (
                _ort_timings(files, TRT_EP, dev, pixels, repeats, cuda_graph=True,
                             trt_cache=Path(tmp) / "trt") if tensorrt and TRT_EP in available
                else {"skipped": "--no-tensorrt" if not tensorrt else
                      f"this ONNX Runtime has no {TRT_EP} (providers: {', '.join(available)})"})
    timings.update({"provider": provider, "precision": precision, "export_s": export_s,
                    "fused_operators": graphs.fused,
                    "max_abs_diff_fp32_cpu": graphs.max_abs_diff,
                    "onnxruntime": onnxruntime.__version__})
    return timings


def _ort_timings(files: dict[str, dict[str, Path]], provider: str, dev: torch.device,
                 pixels: torch.Tensor, repeats: int, *, cuda_graph: bool,
                 trt_cache: Path | None = None) -> dict[str, Any]:
    """The stages on sessions of ``provider`` (with or without CUDA graphs), and whether
    each graph did capture; TensorRT's failure to open is recorded, not raised."""
    from eventspec.edge.vision.onnx_backend import (
        GRAPH_FILE,
        PRECISION,
        TRT_EP,
        OnnxVision,
        describe,
    )
    from eventspec.edge.vision.onnx_session import OrtGraph

    t0 = time.perf_counter()
    try:
        run = {name: OrtGraph(pair[GRAPH_FILE[provider]], provider, dev,
                              cuda_graph=cuda_graph, trt_cache=trt_cache)
               for name, pair in files.items()}
    except Exception as exc:
        if provider != TRT_EP:
            raise
        return {"skipped": f"{provider} could not open the export: {type(exc).__name__}: {exc}"}
    open_s = time.perf_counter() - t0
    on = {name: g.cuda_graph for name, g in run.items()}
    name = describe(provider, PRECISION[provider], on)
    vision = OnnxVision(run["clip"], run["events"], dev, name)
    timings = _stage_timings(vision.clip_features, vision.event_tokens, run["adapter"],
                             pixels, repeats)
    fallbacks = {n: g.graph_fallback for n, g in run.items() if g.graph_fallback}
    timings.update({"name": name, "cuda_graph": all(on.values()), "cuda_graphs": on,
                    "open_s": open_s, **({"graph_fallback": fallbacks} if fallbacks else {})})
    return timings


def cloud_steps(target: TargetModel, repeats: int, max_seq: int) -> dict[str, float]:
    """The cloud's static engine: B = 1 with one token, B = 16 with 9 tokens each."""
    n_slots = 16
    kv = static_kv_plan(target, kv_cache_bytes=(n_slots + 1) * kv_bytes_per_slot(target, max_seq),
                        max_seq_len=max_seq)
    engine = build_static_engine(target, kv, session_buckets=(1, 16), token_buckets=(1, 9))
    ids = target.build_prompt_ids(QUESTION)
    g = target.geometry
    for slot in range(n_slots):
        engine.prefill([PrefillRequest(slot, ids, video_features=torch.zeros(
            g.num_frames, g.tokens_per_frame, g.feature_dim, device=target.device,
            dtype=target.dtype))])
    start = len(ids)
    dev = target.device

    def step(b: int, k: int) -> None:
        tok = torch.full((b * k,), 5, dtype=torch.long, device=dev)
        engine.step(StepBatch(tuple(range(b)), (start,) * b, (k,) * b, tok))

    b1, _ = median_p10_ms(lambda: step(1, 1), repeats * 2)
    b16, _ = median_p10_ms(lambda: step(16, 9), repeats * 2)
    return {"step_B1_k0_ms": b1, "step_B16_k8_ms": b16, "context_tokens": start}


@torch.inference_mode()
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run on tiny models")
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--no-vision", action="store_true",
                        help="skip the vision path's torch vs ONNX Runtime timings")
    parser.add_argument("--no-tensorrt", action="store_true",
                        help="do not try ONNX Runtime's TensorRT EP (it builds its engines "
                             "when the session opens, slowly for CLIP)")
    parser.add_argument("--vision-only", action="store_true",
                        help="time only the vision path (no drafters, no cloud step); "
                             "writes edge-vision_<device>.json")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.tiny:
        draft, target, max_seq = build_tiny_random_draft(seed=0), build_tiny_random_target(0), 512
    else:
        draft, target = build_full_draft("cuda"), build_full_target("cuda")
        max_seq = 2560
    dev = draft.device
    result: dict[str, Any] = {
        "command": "python -m benchmarks.bench_edge" + (" --tiny" if args.tiny else "")
                   + (" --no-vision" if args.no_vision else "")
                   + (" --no-tensorrt" if args.no_tensorrt else "")
                   + (" --vision-only" if args.vision_only else ""),
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
        "dtype": str(draft.dtype), "draft_model": draft.model_id, "target_model": target.model_id,
        "repeats": args.repeats, "engines": {},
    }
    if not args.vision_only:
        result["engines"]["hf"] = draft_timings(draft, draft, args.repeats)
    for quant in () if args.vision_only else QuantMode:
        name = "static" if quant is QuantMode.NONE else f"static_{quant.value}"
        t0 = time.perf_counter()
        static = StaticDraftBackend(draft, max_seq_len=min(draft.max_positions, 2048),
                                    quant=quant)
        warm = static.warm_up()
        timings = draft_timings(draft, static, args.repeats)
        timings.update(build_s=time.perf_counter() - t0, warm_up=warm,
                       weight_bytes=static.runtime.weights.weight_bytes)
        result["engines"][name] = timings
        del static
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if not args.vision_only:
        result["cloud"] = cloud_steps(target, args.repeats, max_seq)
    if not args.no_vision or args.vision_only:
        g = target.geometry
        result["vision"] = vision_timings(
            draft, (g.num_frames, g.tokens_per_frame, g.feature_dim), args.repeats,
            tensorrt=not args.no_tensorrt)
        v = result["vision"]
        o = v["onnx"]
        plain = o.get("without_cuda_graphs", {}).get("total_ms")
        logging.info("vision path, 5 frames: torch %.2f ms, onnx %s", v["torch"]["total_ms"],
                     o.get("skipped") or f"{o['total_ms']:.2f} ms ({o['name']})"
                     + (f", {plain:.2f} ms without CUDA graphs" if plain else ""))
    for name, e in result["engines"].items():
        e["c_B1"] = e["draft_ms_per_token"] / result["cloud"]["step_B1_k0_ms"]
        e["c_B16"] = e["draft_ms_per_token"] / result["cloud"]["step_B16_k8_ms"]
        logging.info("%s drafter: %.2f ms/token, c = %.2f at B=1, %.2f at B=16", name,
                     e["draft_ms_per_token"], e["c_B1"], e["c_B16"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "cpu" if dev.type != "cuda" else torch.cuda.get_device_name().split()[1].lower()
    path = out / f"{'edge-vision' if args.vision_only else 'edge'}_{tag}.json"
    write_result(path, result)
    print(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
