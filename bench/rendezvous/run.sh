#!/usr/bin/env bash
# Builds rendezvous_bench (with tide-store) optimised (Release, in
# build-bench/ unless BUILD_DIR says otherwise) and runs it: one rendezvous
# round of N simulated agents, tide's dynamic rendezvous (c10d backend over
# a tide-store process) against torch's c10d dynamic rendezvous, at N = 8,
# 64, 512 and 2048 (torch up to 512). Needs Debian's python3-torch
# (apt-get install python3-torch), run as /usr/bin/python3, and etcd-server
# for the etcd rows. Arguments go to rendezvous_bench (--n, --reps, --impl,
# --torch-max-n, --torch-timeout, --phases, --json, ...; see --help). Two to
# three minutes with the defaults, most of it torch at N=512 (and a failing
# backend's round, which waits out --timeout).
#
#   bench/rendezvous/run.sh [--n 512,2048] [--reps 5] [--json out.jsonl]
#   BUILD_DIR=build-rbench bench/rendezvous/run.sh --phases
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
cmake --build "$build" -j2 --target rendezvous_bench
exec "$build/bench/rendezvous_bench" "$@"
