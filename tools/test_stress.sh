#!/usr/bin/env bash
# `make test` several times in a row on a fresh clone of HEAD while busy loops load the
# CPU: the proof that the suite does not flake on a busy machine (issue 18).
#
#   STRESS_RUNS         runs of `make test` (default 5)
#   STRESS_BUSY         busy loops beside them (default 2: both cores of a 2-core CI box)
#   STRESS_PYTEST_ARGS  extra pytest arguments for every run (default: none, the full suite)
#
# The clone gets its own .venv, set up before the busy loops start. Prints pass/fail and
# the duration of each run and a summary line; exits 1 if any run failed (its log is kept).
set -u

runs="${STRESS_RUNS:-5}"
busy_count="${STRESS_BUSY:-2}"
pytest_args="${STRESS_PYTEST_ARGS:-}"
case "$runs" in '' | *[!0-9]* | 0) echo "STRESS_RUNS must be a positive integer, got '$runs'" >&2; exit 2 ;; esac
case "$busy_count" in '' | *[!0-9]*) echo "STRESS_BUSY must be an integer >= 0, got '$busy_count'" >&2; exit 2 ;; esac

root="$(git rev-parse --show-toplevel)" || exit 2
head="$(git -C "$root" rev-parse HEAD)" || exit 2
work="$(mktemp -d "${TMPDIR:-/tmp}/eventspec-stress.XXXXXX")" || exit 2
busy_pids=()
keep=0

cleanup() {
    for pid in "${busy_pids[@]}"; do
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    if [ "$keep" = 1 ]; then
        echo "logs kept in $work"
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "stress: cloning $(git -C "$root" rev-parse --short HEAD) into $work/repo"
git clone -q --no-local "$root" "$work/repo" && git -C "$work/repo" checkout -q --detach "$head" || exit 2
if [ -n "$(git -C "$root" status --porcelain --untracked-files=no)" ]; then
    echo "stress: note: uncommitted changes in $root are not tested (HEAD is)"
fi

echo "stress: setting up the clone's .venv (not timed, no load)"
setup_start=$SECONDS
if ! make -C "$work/repo" .venv/.eventspec-installed >"$work/setup.log" 2>&1; then
    keep=1
    tail -n 30 "$work/setup.log"
    echo "stress: set-up failed"
    exit 1
fi
echo "stress: set-up took $((SECONDS - setup_start)) s"

for _ in $(seq "$busy_count"); do
    python3 -c 'while True: pass' &
    busy_pids+=("$!")
done
echo "stress: $busy_count busy loop(s) running (pids ${busy_pids[*]:-none}); $runs run(s) of make test${pytest_args:+ with PYTEST_ARGS=\"$pytest_args\"}"

failed=0
for i in $(seq "$runs"); do
    log="$work/run-$i.log"
    start=$SECONDS
    if make -C "$work/repo" test PYTEST_ARGS="$pytest_args" >"$log" 2>&1; then
        outcome=PASS
    else
        outcome=FAIL
        failed=$((failed + 1))
        keep=1
    fi
    summary="$(grep -E '(passed|failed|error|errors|no tests ran).* in [0-9.]+s' "$log" | tail -n 1)"
    echo "run $i/$runs: $outcome in $((SECONDS - start)) s: ${summary:-no pytest summary}"
    if [ "$outcome" = FAIL ]; then
        # pytest's short summary (-ra), or the log's tail when there is none.
        grep -E '^(FAILED|ERROR)' "$log" | sed 's/^/    /' | grep . || tail -n 5 "$log" | sed 's/^/    /'
    fi
done

echo "stress summary: $((runs - failed))/$runs runs passed, $failed failed, under $busy_count busy loop(s), HEAD $(git -C "$work/repo" rev-parse --short HEAD)"
[ "$failed" -eq 0 ]
