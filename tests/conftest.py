"""Shared fixtures: in-process servers on port 0 with tiny models."""

from __future__ import annotations

import os

# Tests never touch a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
