"""The toy draft's vision path exported to ONNX once per test process, and toy scenes'
event frames as the edge renders them."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import torch

from eventspec.edge import cli as edge_cli
from eventspec.edge.drafting.eventgpt import DraftModel
from eventspec.edge.events.render import canvas_for, event_pixel_values
from eventspec.edge.events.toy import ToySource
from eventspec.edge.events.windows import events_for_window, select_window

_EXPORT: Path | None = None


def toy_onnx_export() -> Path:
    """The shipped toy draft and adapter, exported by ``eventspec-edge export-onnx --model
    toy`` (the real command, in process) into a temporary directory, once."""
    global _EXPORT
    if _EXPORT is None:
        root = Path(tempfile.mkdtemp(prefix="eventspec-onnx-"))
        atexit.register(shutil.rmtree, root, True)
        out = root / "toy-onnx"
        assert edge_cli.main(["export-onnx", "--model", "toy", "--out", str(out),
                              "--log-level", "WARNING"]) == 0
        _EXPORT = out
    return _EXPORT


def toy_pixels(draft: DraftModel, seed: int) -> torch.Tensor:
    """Toy scene ``seed``'s default event window as the draft's 5 frames [5, 3, S, S]."""
    source = ToySource([seed])
    window = select_window(source)
    events = events_for_window(source, window)
    return event_pixel_values(events, source.sensor_size, draft.image_size,
                              canvas=canvas_for(draft))
