"""Image decode/encode and CLIP preprocessing without torchvision.

Both nodes need CLIP-style preprocessing (EventGPT at 336 px, Video-LLaVA at 224 px):
resize the short side with bicubic filtering, center-crop, scale to [0, 1] and
normalise with the OpenAI CLIP mean/std. This reproduces transformers'
``VideoLlavaImageProcessor`` and ``CLIPImageProcessor`` (PIL backend) step for step
rather than calling them, so that neither node's hot path imports transformers and
the result does not move with its version:

* the resized size is transformers' ``get_resize_output_image_size`` with
  ``default_to_square=False``: the short side becomes ``size`` and the long side
  ``int(size * long / short)``, truncated (rounding instead gave a 299-px-wide
  resize of 640x480 where the reference has 298: mean |Δ| 0.079, max 0.57);
* the resize is Pillow's bicubic on the uint8 image, as both processors do;
* the crop's top-left is ``((h - size) // 2, (w - size) // 2)``.

``tests/unit/shared/test_imageproc_parity.py`` compares both paths with the
transformers processors over the sensor sizes that matter.
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

    The edge sends frames no larger than the cloud's tower needs. The size is the one
    ``resize_center_crop`` (and transformers) would pick, so the cloud's resize of the
    received frame is a no-op and what its tower sees differs from the reference
    processor on the original frame by the JPEG coding alone.
    """
    _check_rgb(image)
    h, w = image.shape[:2]
    if min(h, w) <= size:
        return image
    new_w, new_h = short_side_size(w, h, size)
    pil = Image.fromarray(image, mode="RGB").resize(
        (new_w, new_h), resample=Image.Resampling.BICUBIC
    )
    return np.asarray(pil, dtype=np.uint8)


def short_side_size(width: int, height: int, size: int) -> tuple[int, int]:
    """(new width, new height) with the short side ``size`` and the long side truncated,
    as transformers' ``get_resize_output_image_size(default_to_square=False)``."""
    if width <= height:
        return size, int(size * height / width)
    return int(size * width / height), size


def resize_center_crop(image: np.ndarray, size: int) -> np.ndarray:
    """Resize the short side to ``size`` (bicubic) and center-crop to [size, size, 3]."""
    _check_rgb(image)
    h, w = image.shape[:2]
    if h == 0 or w == 0:
        raise InvalidInput(f"image has zero extent: {w}x{h}")
    new_w, new_h = short_side_size(w, h, size)
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
