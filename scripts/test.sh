#!/usr/bin/env bash
# Sets everything up and runs every test: the normal build (unit,
# multi-process, interop with PyTorch, a 30 s fuzz run), then the unit tests
# again under ASan+UBSan and under TSan (TIDE_TSAN=0 skips the TSan pass).
set -euo pipefail
SECONDS=0
step() { echo "== [$((SECONDS / 60))m$((SECONDS % 60))s] $*"; }
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh
# Every part, whatever an earlier configure (scripts/demo.sh's) chose.
everything=(-DTIDE_BUILD_TESTS=ON -DTIDE_BUILD_BENCH=ON -DTIDE_WITH_TORCH=ON -DTIDE_WITH_PYTHON=ON)

step "build (RelWithDebInfo)"
scripts/build.sh build "${everything[@]}"
step "naming rules on the last commit's sources (.clang-tidy)"
scripts/lint.sh HEAD~1 build
step "tests"
ctest --test-dir build --output-on-failure -j2 --timeout 600

step "build (ASan+UBSan)"
scripts/build.sh build-asan "${everything[@]}" -DTIDE_SANITIZE=address -DTIDE_BUILD_BENCH=OFF
step "tests under ASan+UBSan"
ctest --test-dir build-asan --output-on-failure -j2 --timeout 600 -LE 'fuzz|interop'

if [[ ${TIDE_TSAN:-1} == 1 ]]; then
  step "build (TSan)"
  scripts/build.sh build-tsan "${everything[@]}" -DTIDE_SANITIZE=thread -DTIDE_BUILD_BENCH=OFF
  step "tests under TSan"
  # Known false positives of uninstrumented libstdc++ (see the file).
  TSAN_OPTIONS="suppressions=$PWD/tests/tsan.supp ${TSAN_OPTIONS:-}" \
    ctest --test-dir build-tsan --output-on-failure -j2 --timeout 600 -LE 'fuzz|interop'
fi
step "all tests passed"
