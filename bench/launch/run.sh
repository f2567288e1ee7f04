#!/usr/bin/env bash
# Builds launch_bench (with tiderun and the restart worker) optimised and runs
# it: tiderun against torchrun, launch wall time and failure-to-restart
# latency, and a hung rank to the group running again (--cases hang).
# Arguments go to launch_bench (--reps, --slow-reps, --cases, ...;
# see --help). Needs Debian's python3-torch (apt-get install python3-torch),
# run as /usr/bin/python3.
#
#   bench/launch/run.sh [--reps 5] [--slow-reps 3]
#   BUILD_DIR=build-launch bench/launch/run.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${BUILD_DIR:-$root/build-bench}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$build" -j2 --target launch_bench
exec "$build/bench/launch_bench" "$@"
