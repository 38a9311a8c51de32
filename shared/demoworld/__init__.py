"""The toy world: generated scenes the embedded demo models are trained and judged on.

Scenes (:mod:`.scenes`) render to RGB clips and, through a DVS simulator
(:mod:`.events`), to event streams; :mod:`.qa` turns a scene into templated questions
with parseable answers, and :mod:`.corpus` trains the tokenizer both toy models
share. It lives in ``shared`` because the edge plays scenes back as an event source,
the cloud's and the trainer's code renders the same scenes, and all must agree.
"""

from shared.demoworld.scenes import (
    DEMO_SEED,
    EVAL_SEED_MIN,
    RGB_FRAME_TIMES_US,
    SPLITS,
    ToyObject,
    ToyScene,
    clip_frames,
    render_rgb,
    rgb_frame_times_us,
    sample_scene,
)

__all__ = [
    "DEMO_SEED",
    "EVAL_SEED_MIN",
    "RGB_FRAME_TIMES_US",
    "SPLITS",
    "ToyObject",
    "ToyScene",
    "clip_frames",
    "render_rgb",
    "rgb_frame_times_us",
    "sample_scene",
]
