"""Image decode/encode and CLIP preprocessing without torchvision.

Both nodes need CLIP-style preprocessing (EventGPT at 336 px, Video-LLaVA at 224 px):
resize the short side with bicubic filtering, center-crop, scale to [0, 1] and
normalise with the OpenAI CLIP mean/std. transformers' processors would pull in
torchvision, so this is done here with Pillow and numpy.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from shared.errors import InvalidInput

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

#: Refuse images with more pixels than this (decompression bombs).
MAX_IMAGE_PIXELS = 40_000_000


def decode_image(data: bytes) -> np.ndarray:
    """Decode JPEG/PNG bytes to an RGB array [H, W, 3] uint8, or raise InvalidInput."""
    if not data:
        raise InvalidInput("image is empty (0 bytes)")
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.width * img.height > MAX_IMAGE_PIXELS:
                raise InvalidInput(
                    f"image of {img.width}x{img.height} exceeds {MAX_IMAGE_PIXELS} pixels"
                )
            rgb = img.convert("RGB")
            rgb.load()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise InvalidInput(f"could not decode image ({len(data)} bytes): {exc}") from exc
    return np.asarray(rgb, dtype=np.uint8)


def encode_jpeg(image: np.ndarray, quality: int = 90) -> bytes:
    """Encode an RGB array [H, W, 3] uint8 as JPEG at ``quality`` (1..100)."""
    if not 1 <= quality <= 100:
        raise InvalidInput(f"JPEG quality must be in 1..100, got {quality}")
    _check_rgb(image)
    buf = io.BytesIO()
    Image.fromarray(image, mode="RGB").save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def encode_png(image: np.ndarray) -> bytes:
    """Encode an RGB array [H, W, 3] uint8 losslessly as PNG."""
    _check_rgb(image)
    buf = io.BytesIO()
    Image.fromarray(image, mode="RGB").save(buf, format="PNG")
    return buf.getvalue()


def _check_rgb(image: np.ndarray) -> None:
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise InvalidInput(
            f"expected an RGB image [H, W, 3] uint8, got {image.dtype} {tuple(image.shape)}"
        )


def downscale_short_side(image: np.ndarray, size: int) -> np.ndarray:
    """Shrink so the short side is ``size`` (bicubic); smaller images pass unchanged.

    The edge sends frames no larger than the cloud's tower needs: the cloud resizes to
    that short side anyway, so this only saves uplink bytes.
    """
    _check_rgb(image)
    h, w = image.shape[:2]
    if min(h, w) <= size:
        return image
    scale = size / min(h, w)
    new_w, new_h = max(size, round(w * scale)), max(size, round(h * scale))
    pil = Image.fromarray(image, mode="RGB").resize(
        (new_w, new_h), resample=Image.Resampling.BICUBIC
    )
    return np.asarray(pil, dtype=np.uint8)


def resize_center_crop(image: np.ndarray, size: int) -> np.ndarray:
    """Resize the short side to ``size`` (bicubic) and center-crop to [size, size, 3]."""
    _check_rgb(image)
    h, w = image.shape[:2]
    if h == 0 or w == 0:
        raise InvalidInput(f"image has zero extent: {w}x{h}")
    scale = size / min(h, w)
    new_w, new_h = max(size, round(w * scale)), max(size, round(h * scale))
    pil = Image.fromarray(image, mode="RGB")
    if (new_w, new_h) != (w, h):
        pil = pil.resize((new_w, new_h), resample=Image.Resampling.BICUBIC)
    left, top = (new_w - size) // 2, (new_h - size) // 2
    return np.asarray(pil.crop((left, top, left + size, top + size)), dtype=np.uint8)


def clip_preprocess(images: Sequence[np.ndarray], size: int) -> torch.Tensor:
    """CLIP preprocessing of RGB uint8 images -> float32 tensor [N, 3, size, size]."""
    if len(images) == 0:
        raise InvalidInput("no images to preprocess")
    batch = np.stack([resize_center_crop(img, size) for img in images])  # [N, S, S, 3]
    pixels = torch.from_numpy(batch).permute(0, 3, 1, 2).float().div_(255.0)  # [N, 3, S, S]
    mean = torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CLIP_STD).view(1, 3, 1, 1)
    return (pixels - mean) / std
