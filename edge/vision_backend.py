"""The edge's vision path behind one seam: PyTorch or ONNX Runtime (``--vision-backend``).

EventGPT's vision path is CLIP (pixels -> features), then the projector, feature
adaptor and pooling (features -> event tokens); an event-only edge adds the feature
adapter (features -> Video-LLaVA's pre-projector space). The drafters (``DraftModel``,
``StaticDraftBackend``) and ``prepare_visual`` reach these only through the two roles
here, so the same drafts come from either runtime:

- :class:`VisionBackend`: CLIP features and event tokens, held by the DraftModel
  (``draft.vision``);
- :class:`Aligner`: the adapter, held by the agent in place of the torch module.

The torch implementations wrap the loaded modules; the ONNX Runtime ones live in
:mod:`eventspec.edge.onnx_vision`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from eventspec.edge.align import AdapterConfig
    from eventspec.edge.draft import EventGPTForCausalLM

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


class Aligner(Protocol):
    """The feature adapter: EventGPT's CLIP features -> the cloud's video features.

    :class:`~eventspec.edge.align.FeatureAdapter` is one (an ``nn.Module`` is callable);
    ``config`` gives the geometry the cloud's is checked against.
    """

    config: AdapterConfig

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        """[F_s, T_s, D_s] -> [F_t, T_t, D_t]."""
        ...


class TorchVision:
    """The vision path in PyTorch, on the model's own device and dtype (the default)."""

    name = "torch"

    def __init__(self, model: EventGPTForCausalLM) -> None:
        self.model = model

    def clip_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model.clip_features(pixel_values)  # [N, T, Dv]

    def event_tokens(self, clip_features: torch.Tensor) -> torch.Tensor:
        model = self.model
        return model.event_tokens(clip_features.to(model.device, model.dtype))  # [F + T, H]
