#!/usr/bin/env bash
# Builds timer_bench optimised (Release, in build-bench/ unless BUILD_DIR says
# otherwise) and runs it: tide's expiration timers against torch's
# FileTimerServer/FileTimerClient, acquire+release throughput from 1 and 8
# clients and expiry-to-kill latency at max_interval 0.1 and 1.0, in one run.
# Needs Debian's python3-torch (apt-get install python3-torch), run as
# /usr/bin/python3. Arguments go to timer_bench (--reps, --tide-pairs,
# --torch-pairs, --expiry-reps, --sides, --cases, ...; see --help). About a
# minute and a half with the defaults.
#
#   bench/timer/run.sh [--reps 3] [--expiry-reps 10]
#   BUILD_DIR=build-timer bench/timer/run.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${BUILD_DIR:-$root/build-bench}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  generator=()
  if command -v ninja > /dev/null; then
    generator=(-G Ninja)
  fi
  cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$build" -j2 --target timer_bench
exec "$build/bench/timer_bench" "$@"
