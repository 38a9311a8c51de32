"""``python -m benchmarks.delay_proxy``: the loopback delay proxy as a process.

The proxy itself is ``tests/support/delay_proxy.py`` (the fault tests and the e2e
benchmark both put it between an edge and a cloud); this keeps the command a reader runs.
"""

from __future__ import annotations

import sys

from tests.support.delay_proxy import main

if __name__ == "__main__":
    sys.exit(main())
