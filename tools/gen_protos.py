"""Regenerate shared/pb from protos/ (``make proto``), or check for drift (``--check``).

The generated modules import each other as ``eventspec.v1.*``; they are rewritten to
``eventspec.shared.pb.eventspec.v1.*`` so the stubs live inside the project's package.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
OUT_DIR = ROOT / "shared" / "pb"


def generate(out: Path) -> None:
    """Run protoc into ``out`` and fix the package-relative imports."""
    # The mypy plugins live beside this interpreter (e.g. .venv/bin).
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for path in out.rglob("*.py*"):
        text = path.read_text()
        text = re.sub(r"^from eventspec\.v1 import", "from eventspec.shared.pb.eventspec.v1 import",
                      text, flags=re.M)
        text = re.sub(r"^import eventspec\.v1\.", "import eventspec.shared.pb.eventspec.v1.",
                      text, flags=re.M)
        path.write_text(text)
    for pkg in [out, *(p for p in out.rglob("*") if p.is_dir())]:
        (pkg / "__init__.py").touch()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if shared/pb is stale")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generate(fresh)
        if opts.check:
            stale = _diff(fresh, OUT_DIR)
            if stale:
                print("shared/pb is out of date with protos/ (run `make proto`):", *stale,
                      sep="\n  ", file=sys.stderr)
                return 1
            print("shared/pb matches protos/")
            return 0
        if OUT_DIR.exists():
            shutil.rmtree(OUT_DIR)
        shutil.copytree(fresh, OUT_DIR)
    print(f"generated {OUT_DIR.relative_to(ROOT)}")
    return 0


def _diff(fresh: Path, current: Path) -> list[str]:
    names = {p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file()}
    names |= {p.relative_to(current) for p in current.rglob("*")
              if p.is_file() and "__pycache__" not in p.parts} if current.exists() else set()
    stale = []
    for name in sorted(names):
        a, b = fresh / name, current / name
        if not (a.exists() and b.exists() and filecmp.cmp(a, b, shallow=False)):
            stale.append(str(name))
    return stale


if __name__ == "__main__":
    sys.exit(main())
