#!/usr/bin/env bash
# Configures and builds tide in BUILD_DIR (default: build) with ccache:
# everything, or the targets after `--`.
# Usage: scripts/build.sh [BUILD_DIR] [extra cmake args...] [-- TARGET...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
shift || true
[[ $build = /* ]] || build="$root/$build"
cmake_args=() targets=()
while (($#)); do
  if [[ $1 == -- ]]; then
    shift
    targets=("$@")
    break
  fi
  cmake_args+=("$1")
  shift
done
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/tide-ccache}
export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
cmake -S "$root" -B "$build" -G Ninja "${cmake_args[@]}" >/dev/null
cmake --build "$build" -j"$(nproc)" ${targets[@]:+--target "${targets[@]}"}
