"""One ONNX Runtime session of the vision path, run on torch tensors through bound buffers.

:class:`OrtGraph` opens a graph with fixed shapes on one execution provider and keeps an
input and an output buffer for the life of the session, bound once with an
``IOBinding``: a call copies its input into the bound input, runs, and returns a copy of
the bound output. Fixed addresses are what ONNX Runtime's CUDA graphs need (the CUDA
EP's ``enable_cuda_graph``, the TensorRT EP's ``trt_cuda_graph_enable``): the graph
captured in the warm-up replays reading and writing the same memory. The CUDA EP docs
list the other conditions: fixed shapes (the export has them), no control flow, every
compute node on the EP, I/O binding, and no concurrent ``Run`` on one session (a lock
here). When the session with graphs cannot be created or its warm-up fails (a node on
the CPU, say), the graph logs why and reopens without graphs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime
import torch

from eventspec.shared.contract.errors import FailedPrecondition, InvalidInput, NotFound

log = logging.getLogger(__name__)

CUDA_EP = "CUDAExecutionProvider"
CPU_EP = "CPUExecutionProvider"
TRT_EP = "TensorrtExecutionProvider"
#: The providers that can capture CUDA graphs.
GRAPH_EPS = (CUDA_EP, TRT_EP)
#: Warm-up runs with graphs: ONNX Runtime runs a couple of plain ``Run``s (its memory
#: pattern settles) before the one that captures; the last of these replays the graph,
#: so a capture that cannot replay fails here and not on a request.
GRAPH_WARM_UP_RUNS = 4
#: One plain run allocates ORT's arena, so the first request does not pay for it.
PLAIN_WARM_UP_RUNS = 1

#: An entry of ``InferenceSession(providers=...)``: a name, or a name and its options.
ProviderSpec = str | tuple[str, dict[str, str]]


class Session(Protocol):
    """What :class:`OrtGraph` uses of an ``onnxruntime.InferenceSession``."""

    def get_inputs(self) -> Sequence[Any]: ...
    def get_outputs(self) -> Sequence[Any]: ...
    def get_providers(self) -> Sequence[str]: ...
    def io_binding(self) -> Any: ...
    def run_with_iobinding(self, iobinding: Any, run_options: Any = None) -> None: ...


#: Opens a session of a graph file with these providers (the seam tests replace).
SessionOpener = Callable[[Path, list[ProviderSpec]], Session]


class ProviderUnavailable(FailedPrecondition):
    """ONNX Runtime built the session without the execution provider asked for (its
    libraries did not load, or this build lacks it)."""


def open_session(path: Path, providers: list[ProviderSpec]) -> Session:
    """An ``InferenceSession`` of ``path`` on exactly ``providers``.

    ``enable_fallback=0``: ONNX Runtime's own fallback would retry on other providers
    and print why to stdout; the caller falls back itself, and logs the reason.
    """
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # warnings about unused initializers are noise
    session: Session = onnxruntime.InferenceSession(
        str(path), options, providers=providers, enable_fallback=0)
    return session


def provider_specs(provider: str, device_index: int, cuda_graph: bool,
                   trt_cache: Path | None = None) -> list[ProviderSpec]:
    """The ``providers`` argument for ``provider`` on CUDA device ``device_index``.

    TensorRT builds fp16 engines itself from the fp32 graph (``trt_fp16_enable``); nodes
    it cannot take run on the CUDA EP listed after it. Its engines take minutes to build
    at full size, so they are cached in ``trt_cache`` when given.
    """
    on = "1" if cuda_graph else "0"
    cuda: ProviderSpec = (CUDA_EP, {"device_id": str(device_index), "enable_cuda_graph": on})
    if provider == CUDA_EP:
        return [cuda]
    if provider == TRT_EP:
        trt = {"device_id": str(device_index), "trt_fp16_enable": "True",
               "trt_cuda_graph_enable": "True" if cuda_graph else "False"}
        if trt_cache is not None:
            trt.update(trt_engine_cache_enable="True", trt_engine_cache_path=str(trt_cache),
                       trt_timing_cache_enable="True", trt_timing_cache_path=str(trt_cache))
        return [(TRT_EP, trt), (CUDA_EP, {"device_id": str(device_index)})]
    return [provider]


class OrtGraph:
    """One ONNX graph with a float32 input and output of fixed shapes, run on torch tensors.

    ``cuda_graph`` asks for CUDA graphs on the CUDA and TensorRT EPs (ignored on the
    CPU); :attr:`cuda_graph` says whether they are on, and :attr:`graph_fallback` why
    not when the session fell back. A call returns a new tensor, not the bound output:
    the next call overwrites that buffer, and callers keep results across calls (the
    aligned path holds CLIP's features while the adapter and the prefill read them).
    The copy costs one device copy of the output, a few MB at full size.

    Streams: ONNX Runtime runs on a stream of its own, and ``Run`` synchronises it
    before returning. Before a run, torch's current stream is synchronised (the input
    copy is on it) and so is the event recorded after the previous call's output copy
    (ORT must not overwrite the output while torch still reads it). ORT's
    ``user_compute_stream`` would let it run on torch's stream instead, but it is not
    used: torch's default stream is the legacy stream 0, which ORT does not take as a
    user stream and on which CUDA cannot capture a graph; the CUDA EP docs state no
    support for a user stream together with ``enable_cuda_graph``, and ORT's CUDA
    plugin EP refused the pair until recently (ORT PR 29221). With ``Run`` synchronising
    anyway, what a shared stream would save is one host wait per call.
    """

    def __init__(self, path: Path, provider: str, device: torch.device, *,
                 cuda_graph: bool = True, trt_cache: Path | None = None,
                 opener: SessionOpener = open_session) -> None:
        if not path.is_file():
            raise NotFound(f"ONNX graph {path} not found; re-run `eventspec-edge export-onnx`")
        self.path, self.provider = path, provider
        if provider == CPU_EP:
            device = torch.device("cpu")
        elif device.type == "cuda" and device.index is None:  # ORT needs the number
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self._trt_cache, self._opener = trt_cache, opener
        self._lock = threading.Lock()
        #: Recorded after each call's output copy; on a CPU graph, none.
        self._copied = (torch.cuda.Event()  # type: ignore[no-untyped-call]
                        if self.device.type == "cuda" else None)
        self.graph_fallback: str | None = None
        wants = cuda_graph and provider in GRAPH_EPS
        if wants:
            try:
                self._open(cuda_graph=True)
                return
            except ProviderUnavailable:
                raise
            except Exception as exc:  # any failure to capture: reopen without graphs
                self.graph_fallback = f"{type(exc).__name__}: {exc}".strip()
                log.warning("ONNX graph %s: CUDA graphs on %s failed (%s); running it "
                            "without CUDA graphs", path.name, provider, self.graph_fallback)
        self._open(cuda_graph=False)

    def _open(self, *, cuda_graph: bool) -> None:
        """Open the session, allocate and bind the buffers, and warm up (capturing the
        CUDA graph when ``cuda_graph``)."""
        index = self.device.index or 0
        providers = provider_specs(self.provider, index, cuda_graph, self._trt_cache)
        session = self._opener(self.path, providers)
        got = list(session.get_providers())
        if self.provider not in got:
            raise ProviderUnavailable(
                f"ONNX Runtime opened {self.path.name} without {self.provider} (it has: "
                f"{', '.join(got)}): that provider's libraries did not load")
        inp, out = session.get_inputs()[0], session.get_outputs()[0]
        self.input_shape = tuple(int(d) for d in inp.shape)
        self.output_shape = tuple(int(d) for d in out.shape)
        with torch.inference_mode(False):  # updated in place in and out of inference mode
            self._input = torch.zeros(self.input_shape, dtype=torch.float32, device=self.device)
            self._output = torch.zeros(self.output_shape, dtype=torch.float32,
                                       device=self.device)
        kind = self.device.type
        if kind == "cuda":  # the zeros are on torch's stream; ORT reads them on its own
            torch.cuda.current_stream(self.device).synchronize()
        binding = session.io_binding()
        binding.bind_input(inp.name, kind, index, np.float32, self.input_shape,
                           self._input.data_ptr())
        binding.bind_output(out.name, kind, index, np.float32, self.output_shape,
                            self._output.data_ptr())
        self.session, self._binding, self.cuda_graph = session, binding, cuda_graph
        for _ in range(GRAPH_WARM_UP_RUNS if cuda_graph else PLAIN_WARM_UP_RUNS):
            session.run_with_iobinding(binding)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x of the graph's input shape (any dtype, any device) -> float32 output on the
        session's device, a tensor of its own."""
        if tuple(x.shape) != self.input_shape:
            raise InvalidInput(
                f"the ONNX graph {self.path.name} takes {list(self.input_shape)}, got "
                f"{list(x.shape)} (an export has fixed shapes: 5 event frames)"
            )
        with self._lock:
            self._input.copy_(x.detach())
            if self._copied is not None:
                torch.cuda.current_stream(self.device).synchronize()
                self._copied.synchronize()  # returns at once before the first record
            self.session.run_with_iobinding(self._binding)  # synchronises ORT's stream
            result = self._output.clone()
            if self._copied is not None:
                self._copied.record(torch.cuda.current_stream(self.device))
            return result
