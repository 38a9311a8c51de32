"""The Video-LLaVA target: loading, prompt building, preprocessing, visual features.

The cloud verifies drafts against ``transformers.VideoLlavaForConditionalGeneration``.
This module is the only place in the cloud that knows how that model is laid out:
where the video tower and projector live, how many ``<video>`` placeholders a clip
needs, which ids are text. Engines (``eventspec.cloud.engine``) and the verifier only see
token ids, tensors and a :class:`VisualGeometry`.

:func:`load_target` reads a local directory with the real
``LanguageBind/Video-LLaVA-7B-hf`` layout (never a hub id); the small models of the
demo world (``eventspec.demoworld``) are built there and wrapped in the same
:class:`TargetModel`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoTokenizer,
    PreTrainedTokenizerFast,
    VideoLlavaConfig,
    VideoLlavaForConditionalGeneration,
)

from eventspec.shared.contract.errors import InvalidInput, NotFound
from eventspec.shared.contract.types import VisualGeometry
from eventspec.shared.node.imageproc import frames_to_pixels
from eventspec.shared.node.vocab import text_vocab_fingerprint

logger = logging.getLogger(__name__)

#: The Video-LLaVA chat template; ``{video}`` is the single placeholder before expansion.
PROMPT_TEMPLATE = "USER: {video}\n{question} ASSISTANT:"
VIDEO_TOKEN = "<video>"

_WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


def geometry_from_config(config: VideoLlavaConfig) -> VisualGeometry:
    """Derive the clip geometry from a Video-LLaVA config.

    Video keeps the CLS token (unlike images), so a frame is ``(S/P)^2 + 1`` tokens;
    the frame count follows from ``video_seq_length`` (2056 = 8 x 257 at 7B).
    """
    vision: Any = config.vision_config
    image_size = int(vision.image_size)
    patch = int(vision.patch_size)
    if image_size % patch:
        raise InvalidInput(f"vision image_size {image_size} is not a multiple of patch {patch}")
    tokens_per_frame = (image_size // patch) ** 2 + 1
    video_seq_length = int(config.video_seq_length)
    if video_seq_length <= 0 or video_seq_length % tokens_per_frame:
        raise InvalidInput(
            f"video_seq_length {video_seq_length} is not a multiple of "
            f"{tokens_per_frame} tokens per frame"
        )
    layer = config.vision_feature_layer
    n_layers = 1 if isinstance(layer, int) else len(layer)
    return VisualGeometry(
        num_frames=video_seq_length // tokens_per_frame,
        tokens_per_frame=tokens_per_frame,
        feature_dim=int(vision.hidden_size) * n_layers,
        image_size=image_size,
    )


class TargetModel:
    """A Video-LLaVA model plus everything the cloud derives from it.

    The wrapper validates the model/tokenizer pair once, so later code can trust
    ``text_vocab_size`` (ids at or above it are placeholders or padding, never text)
    and the geometry.
    """

    def __init__(
        self,
        model: VideoLlavaForConditionalGeneration,
        tokenizer: PreTrainedTokenizerFast,
        model_id: str,
    ) -> None:
        config = model.config
        torch.nn.Module.eval(model)
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.geometry = geometry_from_config(config)
        self.text_vocab_size = int(config.image_token_index)
        self.video_token_id = int(config.video_token_index)
        self.vocab_size = int(model.lm_head.weight.shape[0])
        param = next(model.parameters())
        self.device: torch.device = param.device
        self.dtype: torch.dtype = param.dtype

        if not 0 < self.text_vocab_size <= self.vocab_size:
            raise InvalidInput(
                f"image_token_index {self.text_vocab_size} outside the vocab of {self.vocab_size}"
            )
        tok_video = tokenizer.convert_tokens_to_ids(VIDEO_TOKEN)
        if tok_video != self.video_token_id:
            raise InvalidInput(
                f"tokenizer maps {VIDEO_TOKEN} to {tok_video}, "
                f"but the model expects video_token_index {self.video_token_id}"
            )
        text_config = config.get_text_config(decoder=True)
        self.eos_token_id: int = _first_id(tokenizer.eos_token_id, text_config.eos_token_id)
        self.bos_token_id: int = _first_id(tokenizer.bos_token_id, text_config.bos_token_id)
        self.max_positions = int(text_config.max_position_embeddings)

        pieces = tokenizer.convert_ids_to_tokens(list(range(self.text_vocab_size)))
        if any(p is None for p in pieces):
            raise InvalidInput(f"tokenizer lacks some of ids 0..{self.text_vocab_size - 1}")
        self.vocab_fingerprint = text_vocab_fingerprint([str(p) for p in pieces])

    def build_prompt_ids(self, question: str) -> list[int]:
        """Token ids of ``USER: <video>\\n{question} ASSISTANT:``, placeholders expanded.

        The whole template is tokenized in one call with a single ``<video>`` (an added
        token, so the tokenizer splits the text around it), then that id is repeated
        ``F*T`` times. This gives exactly the ids the HF processor produces for the
        fully expanded string, without tokenizing 2056 copies of ``<video>``.
        """
        if not isinstance(question, str):
            raise InvalidInput(f"question must be a string, got {type(question).__name__}")
        text = PROMPT_TEMPLATE.format(video=VIDEO_TOKEN, question=question)
        ids: list[int] = list(self.tokenizer(text, add_special_tokens=True)["input_ids"])
        if not ids or ids[0] != self.bos_token_id:
            ids.insert(0, self.bos_token_id)
        # Reject user text that smuggles placeholders or other non-text ids into the
        # prompt: the video placeholder count must stay exact.
        non_text = [i for i in ids if i >= self.text_vocab_size]
        if non_text != [self.video_token_id]:
            raise InvalidInput(
                "question must not contain special tokens such as <video> or <image>"
            )
        if ids.count(self.bos_token_id) != 1:
            raise InvalidInput("question must not contain the BOS token")
        at = ids.index(self.video_token_id)
        expanded = ids[:at] + [self.video_token_id] * self.geometry.visual_tokens + ids[at + 1 :]
        if len(expanded) >= self.max_positions:
            raise InvalidInput(
                f"prompt of {len(expanded)} tokens exceeds "
                f"the model's {self.max_positions} positions"
            )
        return expanded

    def preprocess_frames(self, frames: Sequence[bytes]) -> torch.Tensor:
        """Decode encoded frames and CLIP-preprocess them -> float32 [1, F, 3, S, S] on CPU.

        The engine moves the result to the model's device and dtype; keeping this on
        the CPU lets the servicer preprocess while the GPU is busy with other sessions.
        """
        g = self.geometry
        if len(frames) == 0:
            raise InvalidInput("no frames in the clip")
        if len(frames) != g.num_frames:
            raise InvalidInput(f"the target needs {g.num_frames} frames, got {len(frames)}")
        # One frame decoded at a time, each held to the frame caps before decoding
        # (eventspec.shared.node.imageproc.preprocess_memory_bound); errors name the frame.
        pixels = frames_to_pixels(frames, g.image_size)  # [F, 3, S, S]
        return pixels.unsqueeze(0)  # [1, F, 3, S, S]

    def video_pixels(self, pixel_values_videos: torch.Tensor) -> torch.Tensor:
        """Checked pixels [1, F, 3, S, S] (or [F, 3, S, S]) -> [F, 3, S, S] on the model's
        device and dtype; InvalidInput names the shape expected."""
        g = self.geometry
        pix = pixel_values_videos
        if pix.dim() == 5 and pix.shape[0] == 1:
            pix = pix[0]  # [F, 3, S, S]
        expected = (g.num_frames, 3, g.image_size, g.image_size)
        if tuple(pix.shape) != expected:
            raise InvalidInput(
                f"pixel_values_videos must be [1, {', '.join(map(str, expected))}], "
                f"got {list(pixel_values_videos.shape)}"
            )
        # Pinned pixels (the engine's towers ahead) copy without blocking the host.
        return pix.to(self.device, non_blocking=pix.is_pinned()).to(self.dtype)

    @torch.inference_mode()
    def video_features_from_pixels(self, pixel_values_videos: torch.Tensor) -> torch.Tensor:
        """Video-tower features of the selected layer, before the projector -> [F, T, D].

        This is the space aligned features live in. Running the tower directly (rather
        than ``get_video_features``, which returns the projector's output) keeps it
        independent of how transformers versions package that method's outputs.
        """
        pix = self.video_pixels(pixel_values_videos)  # [F, 3, S, S]
        out = self.model.model.video_tower(pixel_values=pix, output_hidden_states=True)
        layer = self.model.config.vision_feature_layer
        if isinstance(layer, int):
            feats: torch.Tensor = out.hidden_states[layer]  # [F, T, D]
        else:
            feats = torch.cat([out.hidden_states[i] for i in layer], dim=-1)  # [F, T, D]
        return feats

    @torch.inference_mode()
    def project_video_features(self, feats: torch.Tensor) -> torch.Tensor:
        """Apply the model's multi-modal projector: [F, T, D] -> [F, T, H]."""
        self.check_video_features(feats)
        projected: torch.Tensor = self.model.model.multi_modal_projector(
            feats.to(self.device, self.dtype)
        )  # [F, T, H]
        return projected

    def check_video_features(self, feats: torch.Tensor) -> None:
        """Raise InvalidInput unless ``feats`` is a finite [F, T, D] float tensor."""
        g = self.geometry
        expected = (g.num_frames, g.tokens_per_frame, g.feature_dim)
        if tuple(feats.shape) != expected:
            raise InvalidInput(f"video features must be {list(expected)}, got {list(feats.shape)}")
        if not feats.is_floating_point():
            raise InvalidInput(f"video features must be floating point, got {feats.dtype}")
        if not bool(torch.isfinite(feats).all()):
            raise InvalidInput("video features contain NaN or infinite values")

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenize generated ids, dropping special tokens."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))


def _move(model: Any, device: str | torch.device, dtype: torch.dtype | None) -> None:
    """Move a model in place and switch it to eval mode.

    Typed ``Any`` because transformers wraps ``PreTrainedModel.to`` in a decorator
    that type checkers cannot see through.
    """
    if dtype is None:
        model.to(device)
    else:
        model.to(device=device, dtype=dtype)
    model.eval()


def _first_id(*candidates: object) -> int:
    for c in candidates:
        if isinstance(c, int):
            return c
        if isinstance(c, list | tuple) and c and isinstance(c[0], int):
            return int(c[0])
    raise InvalidInput("could not determine a BOS/EOS token id from tokenizer or config")


def save_target(target: TargetModel, path: str | Path) -> Path:
    """Write the model (safetensors) and tokenizer in the HF layout ``load_target`` reads."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    target.model.save_pretrained(out)
    target.tokenizer.save_pretrained(out)
    return out


def load_target(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> TargetModel:
    """Load Video-LLaVA from a local directory with the ``Video-LLaVA-7B-hf`` layout.

    ``dtype`` defaults to float32 on CPU and bfloat16 elsewhere. Only local files are
    read (``local_files_only=True``); a missing directory or file is NotFound, a
    directory holding something else is InvalidInput.
    """
    root = Path(path).expanduser()
    if not root.is_dir():
        raise NotFound(f"target model directory {str(root)!r} does not exist")
    if not (root / "config.json").is_file():
        raise NotFound(f"target model directory {str(root)!r} has no config.json")
    if not any(any(root.glob(pat)) for pat in _WEIGHT_PATTERNS):
        raise NotFound(f"target model directory {str(root)!r} has no weights (*.safetensors)")
    if not any((root / name).is_file() for name in _TOKENIZER_FILES):
        raise NotFound(
            f"target model directory {str(root)!r} has no tokenizer "
            f"({' or '.join(_TOKENIZER_FILES)})"
        )
    if dtype is None:
        dtype = torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16

    try:
        model_type = json.loads((root / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as exc:
        raise InvalidInput(f"cannot read {root / 'config.json'}: {exc}") from exc
    if model_type != "video_llava":
        raise InvalidInput(f"{root} holds a {model_type!r} model, expected 'video_llava'")
    try:
        config = VideoLlavaConfig.from_pretrained(root, local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        raise InvalidInput(f"cannot read {root / 'config.json'}: {exc}") from exc
    try:
        model = VideoLlavaForConditionalGeneration.from_pretrained(
            root, config=config, local_files_only=True, dtype=dtype
        )
        tokenizer = AutoTokenizer.from_pretrained(root, local_files_only=True)
    except (OSError, ValueError, RuntimeError) as exc:
        raise InvalidInput(f"cannot load the target from {root}: {exc}") from exc
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise InvalidInput(
            f"{root}: expected a fast (tokenizers) tokenizer, got {type(tokenizer).__name__}"
        )
    _move(model, device, None)
    logger.info("loaded target %s on %s (%s)", root, device, dtype)
    return TargetModel(model, tokenizer, model_id=root.name)
