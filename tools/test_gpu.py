"""``make test-gpu``: the GPU tests (marker ``gpu``), with a JSON summary to commit.

    python3 tools/test_gpu.py [--out benchmarks/results/test-gpu-h100.json] [pytest args]

Runs ``pytest -m gpu`` over the GPU test modules in this interpreter (no virtual
environment is made: a GPU machine brings its own CUDA PyTorch) and writes the device,
the library versions and each test's outcome, duration and recorded measurements
(``record_property``: how far graphs, padding and verify steps moved the logits). The
default ``--out`` is ``benchmarks/results/test-gpu-<device>.json`` (e.g. ``h100``).
Exits with pytest's status.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The modules holding ``gpu`` tests (collecting the whole tree would need every test
#: dependency on the GPU machine, trustme and dv-processing among them).
GPU_TEST_PATHS = ("tests/gpu", "tests/unit/cloud/test_static_engine.py")


class Summary:
    """A pytest plugin that keeps each test's outcome and call duration."""

    def __init__(self) -> None:
        self.tests: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            entry: dict[str, Any] = {"test": report.nodeid, "outcome": report.outcome,
                                     "seconds": round(report.duration, 3)}
            if report.user_properties:
                entry["measured"] = dict(report.user_properties)
            self.tests.append(entry)


def _versions() -> dict[str, str]:
    import torch
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = "absent"
    out["device"] = (torch.cuda.get_device_name() if torch.cuda.is_available()
                     else "no CUDA device")
    return out


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; 'no CUDA device' -> 'no-cuda'."""
    for word in name.lower().replace("nvidia", "").replace("-", " ").split():
        if any(c.isdigit() for c in word) and any(c.isalpha() for c in word):
            return "".join(c for c in word if c.isalnum())
    return "no-cuda" if "no cuda" in name.lower() else "gpu"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="the JSON summary (default: results/test-gpu-<device>.json)")
    args, rest = parser.parse_known_args()
    summary = Summary()
    started = time.time()
    status = pytest.main(["-m", "gpu", "-p", "no:cacheprovider", "-q", "-rs",
                          *(str(ROOT / p) for p in GPU_TEST_PATHS), *rest], plugins=[summary])
    counts: dict[str, int] = {}
    for t in summary.tests:
        counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
    versions = _versions()
    out: Path = args.out or ROOT / "benchmarks" / "results" / (
        f"test-gpu-{device_slug(versions['device'])}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))  # run as a script from tools/: the stamp's module
    from benchmarks.stamp import stamp

    out.write_text(json.dumps({
        "stamp": stamp(), "command": "make test-gpu", **versions, "exit_status": int(status),
        "wall_s": round(time.time() - started, 1), "counts": counts, "tests": summary.tests,
    }, indent=2) + "\n")
    print(f"wrote {out}: {counts}")
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
