"""The visual inputs of one request: the window, EventGPT's frames, and what the cloud gets.

The draft always needs the event window rendered as EventGPT's 5 polarity frames. The
cloud gets either 8 RGB frames of the clip (JPEG, no larger than its tower needs) or,
on event-only edges, the adapter's features in its pre-projector video space, computed
from the same CLIP pass the draft's prefill then reuses.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from functools import partial

import torch

from eventspec.edge.drafting.eventgpt import DraftModel
from eventspec.edge.events.base import EventSource
from eventspec.edge.events.render import canvas_for, event_pixel_values
from eventspec.edge.events.windows import events_for_window, sample_rgb_frames, select_window
from eventspec.edge.uplink.roles import VerifierStream
from eventspec.edge.vision.align import check_geometry
from eventspec.edge.vision.backend import Aligner
from eventspec.edge.worker import ModelWorker
from eventspec.shared.contract.codec import WireDtype, encode_tensor, quantize_int8
from eventspec.shared.contract.errors import FailedPrecondition, InvalidInput
from eventspec.shared.contract.types import (
    VIDEO_FEATURES_TENSOR,
    AskSpec,
    FeatureMode,
    ServerInfo,
    TensorChunkData,
    WindowInfo,
)
from eventspec.shared.node.imageproc import downscale_short_side, encode_jpeg


@dataclass
class PreparedVisual:
    """The visual inputs of one request."""

    window: WindowInfo
    event_pixels: torch.Tensor  # [5, 3, S, S]
    feature_mode: FeatureMode
    frames: tuple[bytes, ...] | None = None
    features: torch.Tensor | None = None  # [F, T, D], aligned mode
    clip_features: torch.Tensor | None = None  # [5, T_s, D_s], when computed for features
    render_ms: float = 0.0
    #: perf_counter when the inputs were ready (the request's timeline draws the
    #: rendering as ending here).
    ready_at: float = field(default_factory=time.perf_counter)


def choose_feature_mode(
    requested: FeatureMode, source: EventSource, adapter: Aligner | None
) -> FeatureMode:
    """Frames when asked (and the source has RGB), aligned when asked (and an adapter is
    loaded); ``auto`` prefers frames and falls back to aligned."""
    if requested == FeatureMode.FRAMES:
        if not source.has_rgb:
            raise InvalidInput(
                f"feature mode frames needs RGB frames, and {source.describe()} has "
                "none; use aligned or auto"
            )
        return FeatureMode.FRAMES
    if requested == FeatureMode.ALIGNED:
        if adapter is None:
            raise FailedPrecondition(
                "feature mode aligned needs a feature adapter; start the edge with --adapter"
            )
        return FeatureMode.ALIGNED
    if source.has_rgb:
        return FeatureMode.FRAMES
    if adapter is not None:
        return FeatureMode.ALIGNED
    raise FailedPrecondition(
        f"{source.describe()} has no RGB frames and no feature adapter is loaded"
    )


async def prepare_visual(
    spec: AskSpec,
    *,
    source: EventSource,
    draft: DraftModel,
    adapter: Aligner | None,
    worker: ModelWorker,
    info: ServerInfo | None,
    jpeg_quality: int,
    need_frames: bool,
    need_features: bool,
) -> PreparedVisual:
    """Select the window, render event frames, and build the cloud's visual input."""
    t0 = time.perf_counter()
    window = await asyncio.to_thread(  # a live source may wait for its clip to fill
        select_window,
        source,
        latest_ms=spec.latest_ms if spec.t0_us is None else None,
        t0_us=spec.t0_us,
        t1_us=spec.t1_us,
        event_window_ms=spec.event_window_ms or 50,
    )
    events = await asyncio.to_thread(events_for_window, source, window)
    pixels = await asyncio.to_thread(
        partial(event_pixel_values, canvas=canvas_for(draft)),
        events, source.sensor_size, draft.image_size,
    )  # [5, 3, S, S]
    info_w = WindowInfo(
        window.t0_us, window.t1_us, window.event_t0_us, window.event_t1_us, int(events.size)
    )
    prepared = PreparedVisual(info_w, pixels, FeatureMode.FRAMES)
    if need_frames:
        quality = spec.jpeg_quality or jpeg_quality
        n = info.geometry.num_frames if info is not None else 8
        rgb = await asyncio.to_thread(sample_rgb_frames, source, window, n)
        side = info.geometry.image_size if info is not None else 0

        def encode() -> list[bytes]:
            return [encode_jpeg(downscale_short_side(f, side) if side else f, quality)
                    for f in rgb]

        prepared.frames = tuple(await asyncio.to_thread(encode))
    if need_features:
        assert adapter is not None and info is not None
        check_geometry(adapter, info.geometry.feature_shape)
        chosen = adapter

        def features() -> tuple[torch.Tensor, torch.Tensor]:
            with torch.inference_mode():  # both through the selected vision backend
                clip = draft.clip_features(pixels)  # [5, T_s, D_s]
                out = chosen(clip)  # [F, T, D]
            return clip, out.float().cpu()

        clip, feats = await worker.run(features)  # [F, T, D] = the adapter's dst
        prepared.feature_mode = FeatureMode.ALIGNED
        prepared.features = feats
        prepared.clip_features = clip
    prepared.render_ms = (time.perf_counter() - t0) * 1e3
    return prepared


async def send_features(
    stream: VerifierStream, prepared: PreparedVisual, dtype: WireDtype
) -> int:
    """Stream the aligned features as a chunked tensor (fp16, or int8 with a scale when
    the plan says fp16 does not fit the uplink). Returns the payload bytes sent."""
    if prepared.features is None:
        return 0
    feats = prepared.features.detach().cpu().float().numpy()  # [F, T, D] float32
    if dtype is WireDtype.INT8:
        q, scale = quantize_int8(feats)
        header, chunks = encode_tensor(VIDEO_FEATURES_TENSOR, q, scale=scale)
    elif dtype is WireDtype.FLOAT16:
        header, chunks = encode_tensor(VIDEO_FEATURES_TENSOR, feats.astype("float16"))
    else:
        raise InvalidInput(f"aligned features are sent as float16 or int8, not {dtype.label}")
    await stream.send(header)
    for i, chunk in enumerate(chunks):
        await stream.send(TensorChunkData(VIDEO_FEATURES_TENSOR, i, bytes(chunk)))
    return header.total_bytes
