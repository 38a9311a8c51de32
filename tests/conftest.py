"""Shared fixtures: in-process servers on port 0 with tiny models."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# Tests never touch a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Nor the user's cache: the nodes keep calibration profiles under $XDG_CACHE_HOME, and a
# profile another process wrote there (a benchmark, another checkout's tests) made an
# edge log "stale profile" first, ahead of the lines a test read. One directory per test
# session, so its own processes still share what they calibrate.
_CACHE = tempfile.mkdtemp(prefix="eventspec-test-cache-")
os.environ["XDG_CACHE_HOME"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
