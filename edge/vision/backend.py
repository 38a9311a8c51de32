"""The edge's vision path behind one seam: PyTorch or ONNX Runtime (``--vision-backend``).

EventGPT's vision path is CLIP (pixels -> features), then the projector, feature
adaptor and pooling (features -> event tokens); an event-only edge adds the feature
adapter (features -> Video-LLaVA's pre-projector space). The drafters (``DraftModel``,
``StaticDraftBackend``) and ``prepare_visual`` reach these only through the two roles
here, so the same drafts come from either runtime:

- :class:`VisionBackend`: CLIP features and event tokens, held by the DraftModel
  (``draft.vision``);
- :class:`Aligner`: the adapter, held by the agent in place of the torch module
  (defined beside the adapter and its config, :mod:`eventspec.edge.vision.align`, and named
  here too).

The torch implementations wrap the loaded modules; the ONNX Runtime ones live in
:mod:`eventspec.edge.vision.onnx_backend`. This module sits below the models it fronts:
:class:`TorchVision` reads the model through :class:`VisionModel`, so
:mod:`eventspec.edge.drafting.eventgpt` can build one without this module importing it back.
"""

from __future__ import annotations

from typing import Protocol

import torch

from eventspec.edge.vision.align import Aligner as Aligner


class VisionBackend(Protocol):
    """EventGPT's vision path: CLIP, then projector + feature adaptor + pooling."""

    #: What ran it, for logs and GetStatus: "torch" or "onnx (CUDAExecutionProvider, fp16)".
    name: str

    def clip_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, 3, S, S] preprocessed frames -> CLIP last layer [N, T, Dv] on the draft's
        device."""
        ...

    def event_tokens(self, clip_features: torch.Tensor) -> torch.Tensor:
        """[F, T, Dv] CLIP features -> [F + T, H] event embeddings on the draft's device."""
        ...


class VisionModel(Protocol):
    """What :class:`TorchVision` runs: EventGPT's model
    (:class:`~eventspec.edge.drafting.eventgpt.EventGPTForCausalLM`) is one."""

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    def clip_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, 3, S, S] -> CLIP last layer [N, T, Dv]."""
        ...

    def event_tokens(self, clip_features: torch.Tensor) -> torch.Tensor:
        """[F, T, Dv] on the model's device and dtype -> [F + T, H] event embeddings."""
        ...


class TorchVision:
    """The vision path in PyTorch, on the model's own device and dtype (the default)."""

    name = "torch"

    def __init__(self, model: VisionModel) -> None:
        self.model = model

    def clip_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model.clip_features(pixel_values)  # [N, T, Dv]

    def event_tokens(self, clip_features: torch.Tensor) -> torch.Tensor:
        model = self.model
        return model.event_tokens(clip_features.to(model.device, model.dtype))  # [F + T, H]
