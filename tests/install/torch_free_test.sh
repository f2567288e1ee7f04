#!/usr/bin/env bash
# The elastic half without libtorch or pybind11: a configure that cannot
# find them (as on a machine without libtorch-dev) must succeed with the
# libtorch parts off, build tiderun, tide-store and a C++ worker, and run
# the demo's first job (four workers, one crash, one restart). This is also
# what scripts/demo.sh builds. Run by ctest.
#
#   torch_free_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
# Beside BUILD_DIR, at its depth: the compile commands then name the same
# relative paths (ccache's base directory is SOURCE_DIR), so the sources the
# main build compiled come from the cache.
work=$build-torch-free
fail() { echo "FAIL: $*" >&2; exit 1; }
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/tide-ccache}
export CCACHE_BASEDIR=$src CCACHE_NOHASHDIR=1

rm -rf "$work"
configure=$(cmake -S "$src" -B "$work" -G Ninja \
  -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON -DCMAKE_DISABLE_FIND_PACKAGE_pybind11=ON \
  -DTIDE_BUILD_TESTS=OFF -DTIDE_BUILD_BENCH=OFF 2>&1) ||
  { echo "$configure"; fail "configure without libtorch failed"; }
grep -E '^-- tide: ' <<<"$configure"
grep -q 'tide: TIDE_WITH_TORCH AUTO: OFF' <<<"$configure" || fail "the libtorch parts were not turned off"
grep -q 'tide: TIDE_WITH_PYTHON AUTO: OFF' <<<"$configure" || fail "the Python modules were not turned off"
cmake --build "$work" -j"$(nproc)" --target tiderun tide-store store_worker >"$work/build.log" 2>&1 ||
  { tail -30 "$work/build.log"; fail "the torch-free build failed"; }
if grep -qE 'libtorch|/include/torch|pybind11' "$work/build.ninja"; then
  grep -oE '[^ ]*(libtorch|/include/torch|pybind11)[^ ]*' "$work/build.ninja" | sort -u | head
  # pickle_check.cpp, the torch backend's pure check, is built into the
  # tests only, which are off here.
  fail "the torch-free build still names libtorch or pybind11"
fi
out=$("$work/apps/tiderun" --standalone --nproc-per-node=4 --max-restarts=1 \
  --log-dir "$work/logs" "$work/examples/store_worker" --fail-once 2>&1) ||
  { echo "$out"; fail "the job failed"; }
echo "$out" | tail -5
grep -q 'restart' <<<"$out" || fail "no restart in the job's output"
echo "PASS: tiderun built and ran without libtorch"
