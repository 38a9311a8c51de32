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

from eventspec.shared.contract.errors import InvalidInput

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

#: Refuse local images (dataset files) with more pixels than this (decompression bombs).
MAX_IMAGE_PIXELS = 40_000_000

#: Frames that arrive over the network (the cloud's frames clip) are held to tighter
#: bounds, checked from the header before any pixel is decoded: at most 4K UHD ...
MAX_FRAME_PIXELS = 3840 * 2160
#: ... and at most this long side / short side, since the resize keeps the aspect ratio:
#: a 1 x 8 M-pixel strip would otherwise resize to 224 x 1.8 G pixels.
MAX_FRAME_ASPECT = 4.0
#: Formats a network frame may use (the edge sends JPEG; PNG for lossless tests).
FRAME_FORMATS = ("JPEG", "PNG")
#: Bytes per pixel alive at most while one frame is decoded: Pillow's decoded image
#: (<= 4: CMYK, RGBA, 32-bit), its RGB conversion (3) and the numpy copy (3).
DECODE_BYTES_PER_PIXEL = 10


def preprocess_memory_bound(num_frames: int, size: int) -> int:
    """Most bytes ``frames_to_pixels`` holds for one request: one frame decoding at a time
    (``DECODE_BYTES_PER_PIXEL * MAX_FRAME_PIXELS``), its resize (short side ``size``,
    long side at most ``MAX_FRAME_ASPECT`` times that), and the finished float32 crops."""
    decode = DECODE_BYTES_PER_PIXEL * MAX_FRAME_PIXELS
    resized = 3 * size * int(size * MAX_FRAME_ASPECT)
    return decode + resized + num_frames * 3 * size * size * 4


def check_image_size(width: int, height: int, *, max_pixels: int = MAX_FRAME_PIXELS,
                     max_aspect: float | None = MAX_FRAME_ASPECT) -> None:
    """Raise InvalidInput if a ``width`` x ``height`` image is empty, too large or too
    elongated to decode and resize within the stated memory bound."""
    if width <= 0 or height <= 0:
        raise InvalidInput(f"image has zero extent: {width}x{height}")
    if width * height > max_pixels:
        raise InvalidInput(f"image of {width}x{height} exceeds {max_pixels} pixels")
    aspect = max(width, height) / min(width, height)
    if max_aspect is not None and aspect > max_aspect:
        raise InvalidInput(f"image of {width}x{height} has aspect ratio {aspect:.1f}, over "
                           f"the cap of {max_aspect:g}")


def frame_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a network frame from its header alone, checked against the
    frame caps; raises InvalidInput for an empty, undecodable or oversized frame."""
    if not data:
        raise InvalidInput("image is empty (0 bytes)")
    try:
        with Image.open(io.BytesIO(data), formats=FRAME_FORMATS) as img:
            width, height = img.size
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise InvalidInput(f"could not decode image ({len(data)} bytes) as "
                           f"{' or '.join(FRAME_FORMATS)}: {exc}") from exc
    check_image_size(width, height)
    return width, height


def decode_image(data: bytes, *, max_pixels: int = MAX_IMAGE_PIXELS,
                 max_aspect: float | None = None,
                 formats: tuple[str, ...] | None = None) -> np.ndarray:
    """Decode image bytes to an RGB array [H, W, 3] uint8, or raise InvalidInput.

    The size is checked from the header, before the pixels are decoded.
    """
    if not data:
        raise InvalidInput("image is empty (0 bytes)")
    try:
        with Image.open(io.BytesIO(data), formats=formats) as img:
            check_image_size(img.width, img.height, max_pixels=max_pixels,
                             max_aspect=max_aspect)
            rgb = img.convert("RGB")
            rgb.load()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise InvalidInput(f"could not decode image ({len(data)} bytes): {exc}") from exc
    return np.asarray(rgb, dtype=np.uint8)


def frames_to_pixels(frames: Sequence[bytes], size: int) -> torch.Tensor:
    """Network frames -> CLIP-preprocessed float32 [F, 3, size, size], one frame at a
    time so at most one decoded frame is alive (``preprocess_memory_bound``).

    Each frame is held to the frame caps before decoding; errors name the frame index.
    """
    if len(frames) == 0:
        raise InvalidInput("no images to preprocess")
    crops = []
    for i, data in enumerate(frames):
        try:
            image = decode_image(bytes(data), max_pixels=MAX_FRAME_PIXELS,
                                 max_aspect=MAX_FRAME_ASPECT, formats=FRAME_FORMATS)
            crops.append(resize_center_crop(image, size))  # [S, S, 3] uint8
        except InvalidInput as exc:
            raise InvalidInput(f"frame {i}: {exc.message}") from exc
        del image
    return _normalise(np.stack(crops))


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
    return _normalise(np.stack([resize_center_crop(img, size) for img in images]))


def _normalise(batch: np.ndarray) -> torch.Tensor:
    """[N, S, S, 3] uint8 crops -> CLIP-normalised float32 [N, 3, S, S]."""
    pixels = torch.from_numpy(batch).permute(0, 3, 1, 2).float().div_(255.0)  # [N, 3, S, S]
    mean = torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CLIP_STD).view(1, 3, 1, 1)
    return (pixels - mean) / std
