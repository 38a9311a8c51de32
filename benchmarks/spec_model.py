"""``python -m benchmarks.spec_model``: the reference model of ideal speculation, asked once.

The model itself is ``tests/support/spec_model.py``: the benchmarks compare their speedup
with it, and the timing tests hold the planner to it; this keeps the command.
"""

from __future__ import annotations

import sys

from tests.support.spec_model import main

if __name__ == "__main__":
    sys.exit(main())
