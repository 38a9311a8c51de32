"""Install a CPU build of PyTorch, or stop with a clear message: never a silent CUDA pull.

Why: a bare ``torch`` requirement on Linux resolves to a build that pulls several GB of
CUDA libraries. ``make demo`` / ``make test`` need only the CPU. This script asks pip
which file it *would* install (``pip install --dry-run --report``, metadata only), refuses
a build that depends on ``nvidia-*`` packages, and only then installs it.

    python tools/install_cpu_torch.py            # torch==2.13.0, CPU build
    TORCH_SPEC='torch==2.6.0' python tools/install_cpu_torch.py
    EVENTSPEC_ALLOW_CUDA_TORCH=1 ...             # a GPU machine: accept a CUDA build

Point pip at a CPU wheel with pip's own settings (``PIP_FIND_LINKS=DIR`` or an index
that serves CPU builds through ``PIP_INDEX_URL``) when the default resolves to CUDA.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import unquote

DEFAULT_SPEC = "torch==2.13.0"


def _is_cuda_build(report: dict[str, object]) -> tuple[bool, str]:
    """Whether pip's chosen torch distribution is a CUDA build, and its file name."""
    for item in report.get("install", []):  # type: ignore[attr-defined]
        meta = item["metadata"]
        if meta.get("name", "").lower() != "torch":
            continue
        url = str(item["download_info"]["url"])
        requires = [str(r).lower() for r in meta.get("requires_dist", []) or []]
        # The local version arrives URL-encoded (``torch-2.6.0%2Bcu124-...``).
        cuda = any(r.startswith("nvidia-") for r in requires) or "+cu" in unquote(url)
        return cuda, url.rsplit("/", 1)[-1]
    return False, "(already satisfied)"


def main() -> int:
    spec = os.environ.get("TORCH_SPEC", DEFAULT_SPEC)
    pip = [sys.executable, "-m", "pip"]
    try:
        import torch

        if torch.version.cuda is None or os.environ.get("EVENTSPEC_ALLOW_CUDA_TORCH"):
            return 0
    except ImportError:
        pass
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        probe = subprocess.run(
            [*pip, "install", "--dry-run", "--no-deps", "--ignore-installed", "-q",
             "--report", str(report_path), spec],
            capture_output=True, text=True,
        )
        if probe.returncode != 0:
            print(f"install_cpu_torch: pip cannot resolve {spec}:\n{probe.stderr.strip()}",
                  file=sys.stderr)
            return 1
        cuda, filename = _is_cuda_build(json.loads(report_path.read_text()))
    if cuda and not os.environ.get("EVENTSPEC_ALLOW_CUDA_TORCH"):
        print(
            f"install_cpu_torch: pip would install {filename}, a CUDA build of PyTorch "
            "(several GB). Make a CPU build findable (PIP_FIND_LINKS=DIR with a '+cpu' "
            "wheel, or PIP_INDEX_URL of an index serving CPU builds), choose another with "
            "TORCH_SPEC, or set EVENTSPEC_ALLOW_CUDA_TORCH=1 on a GPU machine.",
            file=sys.stderr,
        )
        return 1
    print(f"install_cpu_torch: installing {filename}")
    return subprocess.call([*pip, "install", "-q", spec])


if __name__ == "__main__":
    raise SystemExit(main())
