"""Feature adapter: EventGPT's CLIP features -> Video-LLaVA's pre-projector video features.

An event-only edge (or one with a thin uplink) cannot send RGB frames, so it sends
what the cloud's video tower would have produced instead. The cheapest space to align
to is the tower's selected layer *before* the projector ([8, 257, 1024] at 7B, 4x
smaller than the projector output; see DESIGN.md "Visual paths"); the cloud then
applies its own projector.

The two geometries differ in every axis: EventGPT reads 5 frames of 336-px CLIP
(1 + 24² tokens), Video-LLaVA 8 frames of 224-px CLIP (1 + 16² tokens). The adapter
handles each axis with the structure it has, so that only the channel map has to be
learned:

- CLS is kept apart (it is not a grid position);
- the patch grid is resampled bilinearly (antialiased when shrinking);
- frames are interpolated linearly in time, first and last frames aligned;
- channels go through a linear map plus a residual MLP whose last layer starts at
  zero, so an untrained adapter is exactly the linear map (the identity when the
  dimensions match) and training starts from "copy the features";
- optionally (``mixer_layers``), a few self-attention layers over all output tokens,
  with learned frame/position embeddings and a zero-initialised residual output. The
  structured path puts the event window's content into every output frame; the mixer
  can move it, e.g. place an object where it was earlier in the clip given its motion.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from eventspec.shared.contract.errors import FailedPrecondition, InvalidInput, NotFound

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter.safetensors"
FORMAT_VERSION = 1

Geometry = tuple[int, int, int]  # (frames, tokens per frame incl. CLS, feature dim)


@dataclass(frozen=True)
class AdapterConfig:
    """Source and destination geometries, plus the residual MLP's hidden width."""

    src_frames: int
    src_tokens: int
    src_dim: int
    dst_frames: int
    dst_tokens: int
    dst_dim: int
    hidden: int
    #: Self-attention layers over all output tokens after the resampling (0: none).
    mixer_layers: int = 0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if name == "mixer_layers" and isinstance(value, int) and value >= 0:
                continue
            if not isinstance(value, int) or value <= 0:
                raise InvalidInput(f"adapter {name} must be a positive int, got {value!r}")
        for side, tokens in (("src", self.src_tokens), ("dst", self.dst_tokens)):
            grid = math.isqrt(tokens - 1)
            if tokens < 2 or grid * grid != tokens - 1:
                raise InvalidInput(
                    f"adapter {side}_tokens must be 1 CLS + a square patch grid, got {tokens}"
                )

    @property
    def src(self) -> Geometry:
        return self.src_frames, self.src_tokens, self.src_dim

    @property
    def dst(self) -> Geometry:
        return self.dst_frames, self.dst_tokens, self.dst_dim


class Aligner(Protocol):
    """The feature adapter: EventGPT's CLIP features -> the cloud's video features.

    :class:`FeatureAdapter` is one (an ``nn.Module`` is callable);
    ``config`` gives the geometry the cloud's is checked against.
    """

    config: AdapterConfig

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        """[F_s, T_s, D_s] -> [F_t, T_t, D_t]."""
        ...


class FeatureAdapter(nn.Module):
    """[F_s, 1 + g_s², D_s] (or batched [B, ...]) -> [F_t, 1 + g_t², D_t]."""

    def __init__(self, config: AdapterConfig) -> None:
        super().__init__()
        self.config = config
        d_s, d_t = config.src_dim, config.dst_dim
        self.cls_proj = nn.Linear(d_s, d_t)
        self.patch_proj = nn.Linear(d_s, d_t)
        self.norm = nn.LayerNorm(d_t)
        self.mlp = nn.Sequential(
            nn.Linear(d_t, config.hidden), nn.GELU(), nn.Linear(config.hidden, d_t)
        )
        self.mixer: nn.Module | None = None
        if config.mixer_layers:
            heads = 4 if d_t % 4 == 0 else 1
            self.pos = nn.Parameter(torch.zeros(config.dst_frames * config.dst_tokens, d_t))
            layer = nn.TransformerEncoderLayer(
                d_t, heads, dim_feedforward=2 * d_t, dropout=0.0, batch_first=True,
                norm_first=True,
            )
            self.mixer = nn.TransformerEncoder(
                layer, config.mixer_layers, enable_nested_tensor=False
            )
            self.mixer_out = nn.Linear(d_t, d_t)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Identity-ish start: channel maps are I (square) or orthogonal-scaled, the MLP's
        output layer is zero, so the untrained adapter only resamples and projects."""
        for proj in (self.cls_proj, self.patch_proj):
            if proj.in_features == proj.out_features:
                nn.init.eye_(proj.weight)
            else:
                nn.init.orthogonal_(proj.weight)
            nn.init.zeros_(proj.bias)
        first, last = self.mlp[0], self.mlp[2]
        assert isinstance(first, nn.Linear) and isinstance(last, nn.Linear)
        nn.init.xavier_uniform_(first.weight)
        nn.init.zeros_(first.bias)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        if self.mixer is not None:
            nn.init.normal_(self.pos, std=0.02)
            nn.init.zeros_(self.mixer_out.weight)
            nn.init.zeros_(self.mixer_out.bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        if features.shape[-3:] != cfg.src or features.ndim not in (3, 4):
            raise InvalidInput(
                f"adapter expects features [{cfg.src_frames}, {cfg.src_tokens}, "
                f"{cfg.src_dim}] (optionally batched), got {tuple(features.shape)}"
            )
        batched = features.ndim == 4
        x = features if batched else features.unsqueeze(0)  # [B, F_s, T_s, D_s]
        weight = self.patch_proj.weight
        x = x.to(weight.device, weight.dtype)
        tokens = self.resample_time(self.resample_grid(x))  # [B, F_t, T_t, D_s]
        out = self.project(tokens)  # [B, F_t, T_t, D_t]
        return out if batched else out.squeeze(0)

    def resample_grid(self, x: torch.Tensor) -> torch.Tensor:
        """[B, F, 1 + g_s², D] -> [B, F, 1 + g_t², D]: CLS kept, the patch grid resized
        bilinearly (antialiased when shrinking). Linear in ``x`` and the same for every
        channel, which the ONNX export uses to replace it by one matrix
        (:mod:`eventspec.edge.vision.onnx_export`)."""
        b, f, t_s, d = x.shape
        g_s, g_t = math.isqrt(t_s - 1), math.isqrt(self.config.dst_tokens - 1)
        if g_s == g_t:
            return x
        grid = x[:, :, 1:].reshape(b * f, g_s, g_s, d).permute(0, 3, 1, 2)  # [B*F, D, g_s, g_s]
        grid = F.interpolate(
            grid, size=(g_t, g_t), mode="bilinear", align_corners=False, antialias=g_t < g_s
        )
        patches = grid.permute(0, 2, 3, 1).reshape(b, f, g_t * g_t, d)
        return torch.cat([x[:, :, :1], patches], dim=2)  # [B, F, 1 + g_t², D]

    def resample_time(self, x: torch.Tensor) -> torch.Tensor:
        """[B, F_s, T, D] -> [B, F_t, T, D]: frames interpolated linearly in time, first
        and last aligned (one source frame is repeated). Linear, as ``resample_grid``."""
        b, f_s, t, d = x.shape
        f_t = self.config.dst_frames
        if f_s == f_t:
            return x
        flat = x.permute(0, 2, 3, 1).reshape(b, t * d, f_s)  # [B, T*D, F_s]
        if f_s == 1:
            flat = flat.expand(-1, -1, f_t)
        else:
            flat = F.interpolate(flat, size=f_t, mode="linear", align_corners=True)
        return flat.reshape(b, t, d, f_t).permute(0, 3, 1, 2)  # [B, F_t, T, D]

    def project(self, tokens: torch.Tensor) -> torch.Tensor:
        """[B, F_t, T_t, D_s] resampled tokens -> [B, F_t, T_t, D_t]: the channel maps,
        the residual MLP and the optional mixer."""
        y = torch.cat(
            [self.cls_proj(tokens[:, :, :1]), self.patch_proj(tokens[:, :, 1:])], dim=2
        )  # [B, F_t, T_t, D_t]
        out: torch.Tensor = y + self.mlp(self.norm(y))
        if self.mixer is not None:
            z = out.flatten(1, 2) + self.pos  # [B, F_t * T_t, D_t]
            out = out + self.mixer_out(self.mixer(z)).view_as(out)
        return out


def build_adapter_for(
    src: Geometry, dst: Geometry, seed: int = 0, hidden: int | None = None,
    mixer_layers: int = 0,
) -> FeatureAdapter:
    """An untrained adapter between two (frames, tokens, dim) geometries, seeded."""
    config = AdapterConfig(*src, *dst, hidden=hidden or max(dst[2], 16),
                           mixer_layers=mixer_layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return FeatureAdapter(config)


def check_geometry(adapter: Aligner, dst: Geometry) -> None:
    """Refuse an adapter whose output does not fit the cloud's video geometry (from
    GetServerInfo): FailedPrecondition, since the edge's setup, not the request, is wrong."""
    if tuple(dst) != adapter.config.dst:
        raise FailedPrecondition(
            f"the adapter produces {list(adapter.config.dst)}, but the cloud expects "
            f"{list(dst)}; retrain or reload the adapter"
        )


def save_adapter(adapter: FeatureAdapter, directory: str | Path) -> Path:
    """Write ``adapter_config.json`` and ``adapter.safetensors`` into ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"format_version": FORMAT_VERSION, **asdict(adapter.config)}
    (out / CONFIG_NAME).write_text(json.dumps(meta, indent=2))
    state = {k: v.detach().contiguous().cpu() for k, v in adapter.state_dict().items()}
    save_file(state, str(out / WEIGHTS_NAME), metadata={"format": "pt"})
    return out


def load_adapter(directory: str | Path) -> FeatureAdapter:
    """Load an adapter saved by :func:`save_adapter`; InvalidInput if weights and config
    disagree (e.g. weights trained for another geometry)."""
    root = Path(directory)
    cfg_path, weights_path = root / CONFIG_NAME, root / WEIGHTS_NAME
    for p in (cfg_path, weights_path):
        if not p.is_file():
            raise NotFound(f"feature adapter file {p} not found")
    try:
        raw = json.loads(cfg_path.read_text())
        version = raw.pop("format_version", FORMAT_VERSION)
        config = AdapterConfig(**raw)
    except (json.JSONDecodeError, TypeError) as exc:
        raise InvalidInput(f"bad adapter config {cfg_path}: {exc}") from exc
    if version != FORMAT_VERSION:
        raise InvalidInput(f"adapter format {version} is not supported (want {FORMAT_VERSION})")
    adapter = FeatureAdapter(config)
    state = load_file(str(weights_path))
    expected = adapter.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(
        f"{k}: {tuple(state[k].shape)} != {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    )
    if missing or unexpected or wrong:
        raise InvalidInput(
            f"adapter weights in {weights_path} do not match its config {list(config.src)} -> "
            f"{list(config.dst)}: missing {missing}, unexpected {unexpected}, shapes {wrong}"
        )
    adapter.load_state_dict(state)
    return adapter.eval()
