"""Class labels of a scene's attributes, for the trainers' auxiliary vision heads.

The toy models learn to answer from scratch; the answer's one informative token gives
the vision towers only a weak, late signal. An auxiliary classifier on the pooled
vision features (as in a stage-1 alignment) gives them a direct one. ``IGNORE`` marks
attributes that do not apply (shape and colour of a two-object scene).
"""

from __future__ import annotations

from eventspec.shared.toyworld.scenes import ToyScene

IGNORE = -100
HEADS: dict[str, tuple[str, ...]] = {
    "direction": ("left", "right", "up", "down", "still"),
    "shape": ("circle", "square", "triangle"),
    "colour": ("red", "green", "blue", "yellow"),
    "count": ("1", "2"),
}


def attribute_labels(scene: ToyScene) -> dict[str, int]:
    """Class index per head; IGNORE where the attribute is undefined."""
    single = len(scene.objects) == 1
    return {
        "direction": HEADS["direction"].index(scene.motion),
        "shape": HEADS["shape"].index(scene.objects[0].shape) if single else IGNORE,
        "colour": HEADS["colour"].index(scene.objects[0].colour) if single else IGNORE,
        "count": HEADS["count"].index(str(len(scene.objects))),
    }
