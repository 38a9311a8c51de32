"""One ONNX Runtime session on bound buffers (:class:`OrtGraph`), on the CPU EP.

The toy export's ``events`` graph (tests/support/onnx_vision.py) is the graph under test;
each result is checked against a plain ``InferenceSession.run`` of the same file. CUDA
graphs need a GPU (tests/gpu/test_onnx_vision_cuda.py); here their fallback logic runs
through the opener seam: a session that reports the CUDA EP but wraps a CPU session,
and fails to open or to warm up when the provider options ask for graphs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnxruntime
import pytest
import torch

from eventspec.edge.vision.onnx_manifest import read_manifest
from eventspec.edge.vision.onnx_session import (
    CPU_EP,
    CUDA_EP,
    GRAPH_WARM_UP_RUNS,
    PLAIN_WARM_UP_RUNS,
    TRT_EP,
    OrtGraph,
    ProviderSpec,
    ProviderUnavailable,
    Session,
    open_session,
    provider_specs,
)
from eventspec.shared.contract.errors import InvalidInput
from tests.support.onnx_vision import toy_onnx_export


@pytest.fixture(scope="module")
def events_graph() -> Path:
    export = toy_onnx_export()
    return export / str(read_manifest(export)["graphs"]["events"]["fp32"])


def reference(path: Path, x: torch.Tensor) -> torch.Tensor:
    """The graph run the plain way: numpy in, numpy out, a session of its own."""
    session = onnxruntime.InferenceSession(str(path), providers=[CPU_EP])
    name = session.get_inputs()[0].name
    return torch.from_numpy(session.run(None, {name: x.float().numpy()})[0])


def features(graph: OrtGraph, seed: int) -> torch.Tensor:
    return torch.randn(graph.input_shape, generator=torch.Generator().manual_seed(seed))


def test_consecutive_calls_return_independent_correct_results(events_graph: Path) -> None:
    graph = OrtGraph(events_graph, CPU_EP, torch.device("cpu"))
    assert graph.cuda_graph is False and graph.graph_fallback is None
    x1, x2 = features(graph, 1), features(graph, 2)
    kept = x1.clone()
    first = graph(x1)
    held = first.clone()
    second = graph(x2)
    assert torch.equal(first, held), "the second call changed the first result"
    assert torch.equal(x1, kept), "the call changed its input"
    assert first.data_ptr() != second.data_ptr()
    assert not torch.allclose(first, second)
    torch.testing.assert_close(first, reference(events_graph, x1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(second, reference(events_graph, x2), rtol=1e-5, atol=1e-5)
    assert second.dtype == torch.float32 and tuple(second.shape) == graph.output_shape


def test_any_input_dtype_is_taken_as_float32(events_graph: Path) -> None:
    graph = OrtGraph(events_graph, CPU_EP, torch.device("cpu"))
    x = features(graph, 3)
    torch.testing.assert_close(graph(x.double()), graph(x), rtol=1e-6, atol=1e-6)


def test_a_wrong_shape_is_refused_naming_both(events_graph: Path) -> None:
    graph = OrtGraph(events_graph, CPU_EP, torch.device("cpu"))
    wrong = (graph.input_shape[0] - 1, *graph.input_shape[1:])
    with pytest.raises(InvalidInput) as err:
        graph(torch.zeros(wrong))
    assert str(list(graph.input_shape)) in err.value.message
    assert str(list(wrong)) in err.value.message


class FakeCudaSession:
    """A CPU session that says it runs on the CUDA EP; its runs counted, and failing
    from the first when ``fail_run``."""

    def __init__(self, path: Path, fail_run: bool) -> None:
        self.inner = onnxruntime.InferenceSession(str(path), providers=[CPU_EP])
        self.fail_run, self.runs = fail_run, 0
        self.bindings: list[Any] = []  # each io_binding() made, and each run's

    def get_inputs(self) -> Sequence[Any]:
        return list(self.inner.get_inputs())

    def get_outputs(self) -> Sequence[Any]:
        return list(self.inner.get_outputs())

    def get_providers(self) -> Sequence[str]:
        return [CUDA_EP, CPU_EP]

    def io_binding(self) -> Any:
        binding = self.inner.io_binding()
        self.bindings.append(binding)
        return binding

    def run_with_iobinding(self, iobinding: Any, run_options: Any = None) -> None:
        self.runs += 1
        assert self.bindings and iobinding is self.bindings[0], "a binding made per call"
        if self.fail_run:
            raise RuntimeError("CUDA failure 900: operation not permitted when stream is "
                               "capturing")
        self.inner.run_with_iobinding(iobinding, run_options)


class Opener:
    """Records whether each session asked for CUDA graphs; fails those that do, at open
    (``fail_open``) or at their first run (``fail_run``)."""

    def __init__(self, *, fail_open: bool = False, fail_run: bool = False) -> None:
        self.fail_open, self.fail_run = fail_open, fail_run
        self.graphs: list[bool] = []
        self.sessions: list[FakeCudaSession] = []

    def __call__(self, path: Path, providers: list[ProviderSpec]) -> Session:
        spec = providers[0]
        assert isinstance(spec, tuple) and spec[0] == CUDA_EP
        graphs = spec[1]["enable_cuda_graph"] == "1"
        self.graphs.append(graphs)
        if graphs and self.fail_open:
            raise RuntimeError("This session cannot use the CUDA Graph feature as requested "
                               "by the user as all compute graph nodes have not been "
                               "partitioned to the CUDA EP")
        self.sessions.append(FakeCudaSession(path, graphs and self.fail_run))
        return self.sessions[-1]


def test_graphs_that_open_and_warm_up_stay_on(events_graph: Path) -> None:
    opener = Opener()
    graph = OrtGraph(events_graph, CUDA_EP, torch.device("cpu"), opener=opener)
    assert opener.graphs == [True]
    assert graph.cuda_graph is True and graph.graph_fallback is None
    assert opener.sessions[0].runs == GRAPH_WARM_UP_RUNS  # captured and replayed at start
    for seed in (4, 5):
        x = features(graph, seed)
        torch.testing.assert_close(graph(x), reference(events_graph, x), rtol=1e-5, atol=1e-5)
    assert opener.sessions[0].runs == GRAPH_WARM_UP_RUNS + 2
    assert len(opener.sessions[0].bindings) == 1  # bound once, to the same two buffers


@pytest.mark.parametrize("where", ["open", "run"])
def test_graphs_that_fail_fall_back_with_a_warning(
    events_graph: Path, where: str, caplog: pytest.LogCaptureFixture,
) -> None:
    opener = Opener(fail_open=where == "open", fail_run=where == "run")
    with caplog.at_level(logging.WARNING, logger="eventspec.edge.vision.onnx_session"):
        graph = OrtGraph(events_graph, CUDA_EP, torch.device("cpu"), opener=opener)
    assert opener.graphs == [True, False]
    assert graph.cuda_graph is False
    reason = "partitioned to the CUDA EP" if where == "open" else "stream is capturing"
    assert graph.graph_fallback is not None and reason in graph.graph_fallback
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and reason in warnings[0] and events_graph.name in warnings[0]
    if where == "run":
        assert opener.sessions[0].runs == 1  # the capturing session failed on its first run
    assert opener.sessions[-1].runs == PLAIN_WARM_UP_RUNS
    x = features(graph, 5)
    torch.testing.assert_close(graph(x), reference(events_graph, x), rtol=1e-5, atol=1e-5)


def test_graphs_are_not_asked_for_when_off(events_graph: Path) -> None:
    opener = Opener(fail_open=True)
    graph = OrtGraph(events_graph, CUDA_EP, torch.device("cpu"), cuda_graph=False,
                     opener=opener)
    assert opener.graphs == [False] and graph.cuda_graph is False
    assert graph.graph_fallback is None


@pytest.mark.skipif(TRT_EP in onnxruntime.get_available_providers(),
                    reason="this ONNX Runtime has a TensorRT EP")
@pytest.mark.filterwarnings("ignore:Specified provider")
def test_a_provider_the_runtime_cannot_open_is_named_and_not_retried(
    events_graph: Path,
) -> None:
    """Real ONNX Runtime: asked for TensorRT without it, it opens a CPU session; the
    graph refuses that session, and does not retry without graphs (that cannot help)."""
    asked: list[list[ProviderSpec]] = []

    def counting(path: Path, providers: list[ProviderSpec]) -> Session:
        asked.append(providers)
        return open_session(path, providers)

    with pytest.raises(ProviderUnavailable) as err:
        OrtGraph(events_graph, TRT_EP, torch.device("cpu"), opener=counting)
    assert TRT_EP in err.value.message and "did not load" in err.value.message
    assert len(asked) == 1


def test_provider_options_ask_for_graphs_and_fp16_engines() -> None:
    assert provider_specs(CPU_EP, 0, True) == [CPU_EP]
    assert provider_specs(CUDA_EP, 1, True) == [
        (CUDA_EP, {"device_id": "1", "enable_cuda_graph": "1"})]
    assert provider_specs(CUDA_EP, 0, False) == [
        (CUDA_EP, {"device_id": "0", "enable_cuda_graph": "0"})]
    trt, cuda = provider_specs(TRT_EP, 0, True, Path("/cache"))
    assert isinstance(trt, tuple) and trt[0] == TRT_EP
    assert trt[1]["trt_fp16_enable"] == "True" and trt[1]["trt_cuda_graph_enable"] == "True"
    assert trt[1]["trt_engine_cache_enable"] == "True"
    assert trt[1]["trt_engine_cache_path"] == "/cache"
    assert cuda == (CUDA_EP, {"device_id": "0"})  # TensorRT's leftovers, never graphed
    (trt_off, _) = provider_specs(TRT_EP, 0, False)
    assert isinstance(trt_off, tuple) and trt_off[1]["trt_cuda_graph_enable"] == "False"
    assert "trt_engine_cache_enable" not in trt_off[1]
