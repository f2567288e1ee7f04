#!/usr/bin/env bash
# Configures and builds tide in BUILD_DIR (default: build) with ccache.
# Usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
shift || true
[[ $build = /* ]] || build="$root/$build"
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/tide-ccache}
export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
cmake -S "$root" -B "$build" -G Ninja "$@" >/dev/null
cmake --build "$build" -j"$(nproc)"
