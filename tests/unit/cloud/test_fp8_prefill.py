"""``--prefill-dtype fp8`` (issue 39 item 2; and the engine's ``step_dtype``) on CPU,
the code path the GPU runs (PyTorch's CPU ``_scaled_mm``): the quantisation's error
bounds, the fp8 GEMM against its dequantised reference, which calls read the fp8
copies (prefill calls with the flag, steps with ``step_dtype``, one copy for both),
the refusals, and through the real server: speculative answers equal target-only ones
with an fp8 prefill, whatever the drafts."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.cloud import server as server_module
from eventspec.cloud.config import CloudSettings
from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.engine.choice import choose_engine
from eventspec.cloud.engine.kv import (
    GIB,
    check_beside_explicit_kv,
    device_free_bytes,
    fit_arena,
    plan_kv,
)
from eventspec.cloud.engine.static.build import (
    build_static_engine,
    fp8_copy_bytes_for,
    kv_bytes_per_slot,
    static_kv_plan,
)
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.cloud.server import VerifierServer
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.settings_fields import SettingsError
from eventspec.shared.node.static import fp8 as fp8_module
from eventspec.shared.node.static.batch import StepBatch
from eventspec.shared.node.static.fp8 import (
    FP8_MAX,
    fp8_mm,
    fp8_unsupported_reason,
    fp8_weights,
    quantize_fp8,
    quantize_rows,
    runtime_weights,
)
from eventspec.shared.node.static.linear_dtypes import check_linear_dtype
from eventspec.shared.node.static.weight_formats import Fp8Weight
from tests.support import cloud_harness as h

QUESTION = "What is moving?"
#: E4M3 keeps 3 mantissa bits: a normal value is within 2^-4 of itself; below the
#: smallest normal (2^-6) the spacing is 2^-9 (in units of the scale).
REL, ABS = 2.0**-4, 2.0**-9


@settings(max_examples=40, deadline=None)
@given(n=st.sampled_from([16, 32, 48]), k=st.sampled_from([16, 64]),
       seed=st.integers(0, 10_000), magnitude=st.sampled_from([1e-3, 1.0, 300.0]))
def test_weights_and_rows_round_trip_within_e4m3s_spacing(n: int, k: int, seed: int,
                                                          magnitude: float) -> None:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * magnitude  # [N, K]
    q = quantize_fp8(w)
    assert q.q.dtype == torch.float8_e4m3fn and q.scales.shape == (n,)
    err = (q.dequantize() - w).abs()
    bound = REL * w.abs() + ABS * q.scales[:, None]
    assert bool((err <= bound).all())
    assert bool((q.q.float().abs() <= FP8_MAX).all())
    xq, xs = quantize_rows(w)  # rows of activations: the same rule per row
    assert bool(((xq.float() * xs - w).abs() <= REL * w.abs() + ABS * xs).all())


def test_the_fp8_gemm_is_its_dequantised_product_and_close_to_the_dense_one() -> None:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(37, 64, generator=g), torch.randn(48, 64, generator=g)
    wq = quantize_fp8(w)
    xq, xs = quantize_rows(x)
    reference = (xq.double() * xs.double()) @ (wq.q.double() * wq.scales.double()[:, None]).t()
    got = fp8_mm(x, wq)  # [37, 48]
    assert got.shape == (37, 48) and got.dtype == x.dtype
    torch.testing.assert_close(got.double(), reference, rtol=1e-5, atol=1e-5)
    dense = x @ w.t()
    assert float((got - dense).norm() / dense.norm()) < 0.1  # two 3-bit mantissas


def test_a_zero_row_stays_zero_and_finite() -> None:
    x = torch.zeros(3, 32)
    x[1] = torch.linspace(-2, 2, 32)
    out = fp8_mm(x, quantize_fp8(torch.randn(16, 32)))
    assert bool(torch.isfinite(out).all())
    assert bool((out[0] == 0).all() and (out[2] == 0).all())


def _prompt(target: TargetModel, seed: int) -> tuple[list[int], torch.Tensor]:
    """The question's prompt ids and a random clip's pixels [1, F, 3, S, S]."""
    g = target.geometry
    pixels = torch.randn((1, g.num_frames, 3, g.image_size, g.image_size),
                         generator=torch.Generator().manual_seed(seed))
    return target.build_prompt_ids(QUESTION), pixels


def _engine(prefill_dtype: str, slots: int = 2) -> tuple[TargetModel, StaticEngine]:
    target = build_tiny_random_target(seed=0)
    kv = static_kv_plan(target, kv_cache_bytes=(slots + 1) * kv_bytes_per_slot(target, 256),
                        max_seq_len=256)
    return target, build_static_engine(target, kv, use_graphs=False, prefill_dtype=prefill_dtype)


def test_fp8_copies_serve_prefill_calls_and_never_a_decode_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target, engine = _engine("fp8")
    assert isinstance(engine.weights.layers[0].wqkv, torch.Tensor)  # decode: the model's
    assert all(isinstance(getattr(lw, m), Fp8Weight) for lw in engine.prefill_weights.layers
               for m in ("wqkv", "wo", "w_gate_up", "w_down"))
    calls: list[int] = []
    real = fp8_module.fp8_mm
    monkeypatch.setattr("eventspec.shared.node.static.quant.fp8_mm",
                        lambda x, w: calls.append(int(x.shape[0])) or real(x, w))
    ids, pixels = _prompt(target, seed=1)
    logits = engine.prefill([PrefillRequest(0, ids, pixel_values_videos=pixels)])  # [1, V]
    layers = len(engine.weights.layers)
    assert calls == [len(ids)] * (4 * layers)  # every layer's four GEMMs, once each
    calls.clear()
    first = int(logits[0, : target.text_vocab_size].argmax())
    engine.step(StepBatch((0,), (len(ids),), (1,), torch.tensor([first])))
    assert calls == []  # the step read the model's weights


def test_fp8_steps_share_one_copy_with_an_fp8_prefill_and_read_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target = build_tiny_random_target(seed=0)
    kv = static_kv_plan(target, kv_cache_bytes=3 * kv_bytes_per_slot(target, 256),
                        max_seq_len=256)
    both = build_static_engine(target, kv, use_graphs=False, prefill_dtype="fp8",
                               step_dtype="fp8")
    assert both.weights is both.prefill_weights  # one copy, not two
    steps_only = build_static_engine(target, kv, use_graphs=False, step_dtype="fp8")
    assert isinstance(steps_only.prefill_weights.layers[0].wqkv, torch.Tensor)
    assert isinstance(steps_only.weights.layers[0].wqkv, Fp8Weight)
    calls: list[int] = []
    real = fp8_module.fp8_mm
    monkeypatch.setattr("eventspec.shared.node.static.quant.fp8_mm",
                        lambda x, w: calls.append(int(x.shape[0])) or real(x, w))
    ids, pixels = _prompt(target, seed=1)
    steps_only.prefill([PrefillRequest(0, ids, pixel_values_videos=pixels)])
    assert calls == []  # the prompt ran in the model's dtype
    steps_only.step(StepBatch((0,), (len(ids),), (3,), torch.tensor([5, 6, 7])))
    assert calls == [3] * (4 * len(steps_only.weights.layers))


def test_an_fp8_prefill_stays_close_to_the_model_dtypes() -> None:
    target, fp8 = _engine("fp8")
    _, plain = _engine("model")
    ids, pixels = _prompt(target, seed=2)
    a = fp8.prefill([PrefillRequest(0, ids, pixel_values_videos=pixels)])[0]
    b = plain.prefill([PrefillRequest(0, ids, pixel_values_videos=pixels)])[0]
    assert not torch.equal(a, b)  # it did run in fp8
    assert float(torch.nn.functional.cosine_similarity(a, b, dim=0)) > 0.95  # 0.984 here


def test_the_flag_is_refused_where_it_cannot_hold() -> None:
    _, engine = _engine("model")
    w = engine.weights
    assert runtime_weights(w, prefill_dtype="model", step_dtype="model",
                           batch_invariant=True) == (w, w)
    for flag, prefill, step in (("--prefill-dtype", "fp8", "model"),
                                ("step_dtype", "model", "fp8")):
        with pytest.raises(InvalidInput, match=f"{flag} fp8 with --batch-invariant"):
            runtime_weights(w, prefill_dtype=prefill, step_dtype=step, batch_invariant=True)
    with pytest.raises(InvalidInput, match="step_dtype must be one of model, fp8"):
        runtime_weights(w, prefill_dtype="model", step_dtype="fp16", batch_invariant=False)
    with pytest.raises(InvalidInput, match="--prefill-dtype must be one of model, fp8"):
        check_linear_dtype("--prefill-dtype", "fp16")
    odd = replace(engine.weights.layers[0], wo=torch.zeros(20, 192))
    bad = replace(engine.weights, layers=(odd, *engine.weights.layers[1:]))
    assert "multiple of 16" in (fp8_unsupported_reason(bad) or "")
    with pytest.raises(InvalidInput, match="layer 0 wo is \\[20, 192\\]"):
        fp8_weights(bad)
    quantised = fp8_weights(engine.weights)
    assert "already quantised" in (fp8_unsupported_reason(quantised) or "")


def test_the_kv_budget_leaves_exactly_the_copys_bytes() -> None:
    target, engine = _engine("fp8")
    held = sum(getattr(lw, m).nbytes for lw in engine.prefill_weights.layers
               for m in ("wqkv", "wo", "w_gate_up", "w_down"))
    assert fp8_copy_bytes_for(target.model.config.get_text_config(decoder=True)) == held


def test_a_plans_kv_bytes_are_what_the_engine_allocates() -> None:
    target = build_tiny_random_target(seed=0)
    per_token = kv_bytes_per_slot(target, 1)
    slots = static_kv_plan(target, kv_cache_bytes=3 * 256 * per_token, max_seq_len=256)
    arena = fit_arena(1000 * per_token, "test", bytes_per_token=per_token, max_seq_len=256,
                      max_sessions=2)
    for kv in (slots, arena):
        engine = build_static_engine(target, kv, use_graphs=False, warm_up=False)
        held = sum(t.untyped_storage().nbytes() for t in (engine.k_cache, engine.v_cache))
        assert kv.kv_bytes == held, kv.describe()


def test_the_copy_beside_an_explicit_kv_size_must_fit_what_is_free(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # An explicit --kv-cache-gb is the KV alone: nothing is taken out of it for the copy.
    kv = plan_kv(bytes_per_token=10, max_seq_len=100, device=torch.device("cuda"),
                 kv_cache_gb=10_000 / GIB, memory_fraction=0.9, max_slots=64,
                 scratch_slots=1, reserved_bytes=500)
    assert kv.kv_bytes == 10_000  # 9 slots and the scratch one
    check_beside_explicit_kv(kv, free_bytes=10_500, beside_bytes=500, beside="the copy")
    with pytest.raises(InvalidInput, match=r"--kv-cache-gb plans .* GiB of KV, and the copy needs"):
        check_beside_explicit_kv(kv, free_bytes=10_499, beside_bytes=500, beside="the copy")
    # What is free: the driver's free memory and the allocator's cached, unused blocks.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (1000, 5000))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 300)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 200)
    assert device_free_bytes(torch.device("cuda")) == 1100


def test_an_explicit_kv_size_with_no_room_for_the_copy_is_refused_at_start_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Refused before the engine is built (it would fail with a bare CUDA out-of-memory
    # error), naming both flags; no GPU is touched before the check.
    target = build_tiny_random_target(seed=0)
    monkeypatch.setattr(target, "device", torch.device("cuda"))
    monkeypatch.setattr(server_module, "device_free_bytes", lambda device: 10**6)
    settings = CloudSettings(prefill_dtype="fp8", kv_cache_gb=0.01)
    with pytest.raises(InvalidInput, match=r"--kv-cache-gb .* --prefill-dtype fp8.s weight copy"):
        server_module.build_engine(settings, target)


def test_settings_refuse_fp8_with_batch_invariance_or_the_hf_engine() -> None:
    with pytest.raises(SettingsError, match="--prefill-dtype fp8 with --batch-invariant"):
        CloudSettings(prefill_dtype="fp8", batch_invariant=True).check()
    with pytest.raises(SettingsError, match="--prefill-dtype fp8 needs the static engine, not"):
        CloudSettings(prefill_dtype="fp8", engine="hf").check()
    target = build_tiny_random_target(seed=0)
    assert choose_engine("auto", target) == "hf"  # CPU
    assert choose_engine("auto", target, fp8="--prefill-dtype fp8") == "static"
    with pytest.raises(InvalidInput, match="--prefill-dtype fp8 needs the static engine"):
        choose_engine("hf", target, fp8="--prefill-dtype fp8")


@pytest.mark.parametrize("policy_name", ["perfect", "random_wrong", "all_wrong"])
async def test_speculative_equals_target_only_with_an_fp8_prefill(policy_name: str) -> None:
    settings = replace(h.settings(kv_cache_gb=0.05), prefill_dtype="fp8", prefill_chunk="off")
    target = build_tiny_random_target(seed=0)
    server = VerifierServer(settings, target=target, cost=h.TEST_COST)
    await server.start()
    try:
        assert server.runtime is not None
        engine = server.runtime.scheduler.engine
        assert isinstance(engine, StaticEngine)
        assert isinstance(engine.prefill_weights.layers[0].wqkv, Fp8Weight)
        assert isinstance(engine.weights.layers[0].wqkv, torch.Tensor)  # steps: the model's
        for clip in (0, 1):
            msg = h.open_msg(QUESTION, h.make_frames(clip), max_new_tokens=12)
            alone = (await h.run_generate(server.port, msg)).tokens
            vocab = target.text_vocab_size
            policy = {"perfect": h.perfect(alone),
                      "random_wrong": h.random_wrong(alone, vocab, seed=clip),
                      "all_wrong": h.all_wrong(alone, vocab)}[policy_name]
            spec = await h.run_generate(server.port, msg, policy=policy)
            assert spec.tokens == alone, (policy_name, clip)
    finally:
        await server.stop()
