"""The persistent TMA GEMM's per-call questions (can this device run it, how many
multiprocessors) go to the driver once a device, on CPU with a fake CUDA and a fake
Triton: the batch-invariant GEMM asks them about 160 times an eager prefill."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest
import torch

from eventspec.shared.node.static import invariant_tma as tma

Calls = dict[str, list[int]]


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    """Device 0 a Hopper of 132 multiprocessors, device 1 (the current one) an Ampere of
    108; Triton present, with host tensor descriptors. Every driver question recorded."""
    calls: Calls = {"capability": [], "properties": []}

    def capability(index: int) -> tuple[int, int]:
        calls["capability"].append(index)
        return (9, 0) if index == 0 else (8, 0)

    def properties(index: int) -> types.SimpleNamespace:
        calls["properties"].append(index)
        return types.SimpleNamespace(multi_processor_count=132 if index == 0 else 108)

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(tma, "HAVE_TRITON", True)
    descriptor = types.ModuleType("triton.tools.tensor_descriptor")
    descriptor.TensorDescriptor = object  # type: ignore[attr-defined]
    for name in ("triton", "triton.tools"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "triton.tools.tensor_descriptor", descriptor)
    tma._tma_on.cache_clear()
    tma.sm_count.cache_clear()
    yield calls
    tma._tma_on.cache_clear()  # no fake answer outlives the test
    tma.sm_count.cache_clear()


def test_tma_is_asked_of_the_driver_once_a_device(fake_cuda: Calls) -> None:
    devices = [torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cuda")] * 3
    assert [tma.tma_available(d) for d in devices] == [True, False, False] * 3
    assert sorted(fake_cuda["capability"]) == [0, 1]  # plain "cuda" is device 1, cached


def test_the_multiprocessors_are_asked_once_a_device(fake_cuda: Calls) -> None:
    devices = [torch.device("cuda", 0), torch.device("cuda")] * 4
    assert [tma.sm_count(tma.cuda_index(d)) for d in devices] == [132, 108] * 4
    assert fake_cuda["properties"] == [0, 1]


def test_no_cuda_device_or_no_triton_asks_nothing(fake_cuda: Calls,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert not tma.tma_available(torch.device("cpu"))
    monkeypatch.setattr(tma, "HAVE_TRITON", False)
    assert not tma.tma_available(torch.device("cuda", 0))
    assert fake_cuda["capability"] == []
