"""The contract installs and imports without PyTorch; the CPU-torch installer refuses CUDA."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_client_imports_without_torch_or_transformers() -> None:
    code = (
        "import sys, time; t = time.perf_counter(); "
        "import eventspec.shared.client.edge_client, eventspec.shared.contract.convert, "
        "eventspec.shared.contract.convert_verifier, eventspec.shared.contract.convert_ask, "
        "eventspec.shared.contract.codec, eventspec.shared.contract.tensor_assembly, "
        "eventspec.shared.contract.timing, eventspec.shared.contract.timing_model, "
        "eventspec.shared.contract.types; "
        "print(time.perf_counter() - t); "
        "print(sorted(m for m in ('torch', 'transformers', 'eventspec.edge', 'eventspec.cloud') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.splitlines()
    assert out[1] == "[]", f"the client pulled in {out[1]}"


def _installer() -> object:
    spec = importlib.util.spec_from_file_location("install_cpu_torch",
                                                  ROOT / "tools" / "install_cpu_torch.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _report(url: str, requires: list[str]) -> dict[str, object]:
    return json.loads(json.dumps({"install": [{
        "download_info": {"url": url},
        "metadata": {"name": "torch", "requires_dist": requires},
    }]}))


def test_installer_tells_cpu_from_cuda_builds() -> None:
    is_cuda = _installer()._is_cuda_build  # type: ignore[attr-defined]
    cpu = _report("file:///w/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl",
                  ["filelock", "sympy"])
    cuda = _report("https://h/torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                   ["filelock", "nvidia-cublas-cu12==12.8; platform_system == 'Linux'"])
    assert is_cuda(cpu) == (False, "torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    assert is_cuda(cuda)[0] is True


def test_installer_reads_a_cuda_local_version_as_cuda() -> None:
    is_cuda = _installer()._is_cuda_build  # type: ignore[attr-defined]
    cu = _report("https://h/torch-2.6.0%2Bcu124-cp311-cp311-linux_x86_64.whl", ["filelock"])
    assert is_cuda(cu)[0] is True


def test_make_installs_cpu_torch_before_the_project(tmp_path: Path) -> None:
    """``make test`` on a fresh checkout: the CPU-torch installer runs before the editable
    install, so the extras' bare ``torch`` requirement finds torch already satisfied."""
    # Under an outer make (CI runs `make test`), MAKEFLAGS/MAKELEVEL would make the inner
    # make print "Entering/Leaving directory" lines: run it as a top-level make.
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MAKELEVEL", "MFLAGS"}}
    plan = subprocess.run(["make", "--no-print-directory", "-n", "test",
                           f"VENV={tmp_path / 'venv'}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True).stdout.splitlines()
    installer = next(i for i, line in enumerate(plan) if "tools/install_cpu_torch.py" in line)
    project = next(i for i, line in enumerate(plan) if "pip install -q -e" in line)
    assert installer < project
    assert plan[-1].rstrip().endswith("-m pytest -q")  # then $(PYTEST_ARGS), empty
