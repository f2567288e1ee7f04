#!/usr/bin/env bash
# Runs the plain test build's suite (build/, as scripts/test.sh builds it)
# on a machine whose every core is kept busy by a CPU hog this script starts
# and stops itself, with the suite at -j2: the tests must hold on a loaded
# machine, as on a busy CI runner or a login node. Stops at the first failing
# run; no run is retried. Prints each run's wall time.
#
#   scripts/stress_tests.sh [RUNS] [CTEST_ARGS...]
#   scripts/stress_tests.sh 3                      # the whole suite, 3 times
#   scripts/stress_tests.sh 20 -R JobStatusTest    # one suite, 20 times
#
# The hog is one busy loop per core at the tests' own priority (HOGS=N to
# choose how many); BUILD=DIR for another test build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-3}
shift || true
build=${BUILD:-$root/build}
hogs=${HOGS:-$(nproc)}
if [[ ! -f $build/CTestTestfile.cmake ]]; then
  echo "stress_tests.sh: no test build in $build (scripts/test.sh makes it)" >&2
  exit 2
fi

hog_pids=()
stop_hogs() {
  ((${#hog_pids[@]})) && kill "${hog_pids[@]}" 2>/dev/null || true
  wait "${hog_pids[@]}" 2>/dev/null || true
  hog_pids=()
}
trap stop_hogs EXIT
for ((i = 0; i < hogs; i++)); do
  (while :; do :; done) &
  hog_pids+=($!)
done
echo "== stress: $hogs busy loop(s) on $(nproc) core(s); $runs run(s) of ctest -j2 $*"

times=()
for ((run = 1; run <= runs; run++)); do
  start=$SECONDS
  if ! ctest --test-dir "$build" --output-on-failure -j2 --timeout 600 "$@"; then
    echo "== stress: run $run of $runs FAILED after $((SECONDS - start)) s" >&2
    exit 1
  fi
  times+=("$((SECONDS - start))")
  echo "== stress: run $run of $runs passed in ${times[-1]} s"
done
echo "== stress: $runs run(s) passed under load; wall times (s): ${times[*]}"
