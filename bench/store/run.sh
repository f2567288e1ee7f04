#!/usr/bin/env bash
# Builds store_bench and tide-store (Release, in build-bench/ unless
# TIDE_BENCH_BUILD_DIR says otherwise) if needed, then runs store_bench with
# its defaults: 1, 16 and 256 clients, tide-store against torch's TCPStore
# server (needs /usr/bin/python3 with python3-torch), 5 reps of 2 s per cell.
# Extra arguments go to store_bench (--help lists them). A few minutes.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${TIDE_BENCH_BUILD_DIR:-$root/build-bench}

if [[ ! -f $build/CMakeCache.txt ]]; then
  generator=()
  if command -v ninja > /dev/null; then
    generator=(-G Ninja)
  fi
  cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$build" --parallel "$(nproc)" --target store_bench tide-store

exec "$build/bench/store_bench" "$@"
