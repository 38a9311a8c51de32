"""Network frames: held to pixel and aspect caps from the header, before decoding, one
frame decoded at a time, with errors that name the frame."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.imageproc import (
    clip_preprocess,
    encode_png,
    frame_size,
    frames_to_pixels,
    preprocess_memory_bound,
)


def test_frames_to_pixels_equals_clip_preprocess_of_the_decoded_frames() -> None:
    rng = np.random.default_rng(7)
    frames = [rng.integers(0, 256, (60 + 8 * i, 90, 3), dtype=np.uint8) for i in range(4)]
    sent = [encode_png(f) for f in frames]
    assert torch.equal(frames_to_pixels(sent, 32), clip_preprocess(frames, 32))


@pytest.mark.parametrize("shape, says", [
    ((3000, 3000), "exceeds 8294400 pixels"),
    ((10, 100), r"aspect ratio 10\.0, over the cap of 4"),
])
def test_frames_to_pixels_refuses_big_or_elongated_frames_naming_them(
    shape: tuple[int, int], says: str
) -> None:
    good = encode_png(np.zeros((40, 48, 3), dtype=np.uint8))
    bad = encode_png(np.zeros((*shape, 3), dtype=np.uint8))
    with pytest.raises(InvalidInput, match=rf"^frame 2: .*{says}"):
        frames_to_pixels([good, good, bad, good], 32)


def test_the_size_comes_from_the_header_without_decoding() -> None:
    png = encode_png(np.zeros((4000, 3000, 3), dtype=np.uint8))
    truncated = png[: len(png) // 2]  # the pixels could not even be decoded
    with pytest.raises(InvalidInput, match="image of 3000x4000 exceeds"):
        frame_size(truncated)
    assert frame_size(encode_png(np.zeros((30, 40, 3), dtype=np.uint8))) == (40, 30)


def test_frames_must_be_jpeg_or_png() -> None:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buf, format="BMP")
    with pytest.raises(InvalidInput, match="JPEG or PNG"):
        frame_size(buf.getvalue())


def test_the_stated_preprocessing_memory_bound() -> None:
    """Video-LLaVA's clip: 8 frames at 224 px, one 4K frame decoding at a time."""
    bound = preprocess_memory_bound(8, 224)
    assert bound == 10 * 3840 * 2160 + 3 * 224 * 896 + 8 * 3 * 224 * 224 * 4
    assert bound < 90 * (1 << 20)  # about 85 MiB per request
