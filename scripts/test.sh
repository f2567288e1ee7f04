#!/usr/bin/env bash
# Sets everything up and runs every test: on the normal build everything
# that runs programs, Python, libtorch, packages (multi-process, interop with
# PyTorch 1.13, the rpc backend under torch's own suite, a 30 s fuzz run);
# the unit tests (tide's code in the test process) under ASan+UBSan and under
# TSan (TIDE_TSAN=0 skips that pass); the tests that involve torch again
# beside Debian 13's torch 2.6, in a root scripts/torch2.sh makes and keeps
# (TIDE_TORCH2=0 skips that pass).
#
# The sanitizer builds need only the unit tests' packages: they start as
# soon as those are installed and compile in the background, at the lowest
# priority, while the other packages install, the normal build compiles and
# its tests run, using what CPU those leave. Their output goes to
# build-asan.log and build-tsan.log. The Debian 13 root and tide's build in
# it start once every package is in, in the background too (torch2.log).
set -euo pipefail
SECONDS=0
step() { echo "== [$((SECONDS / 60))m$((SECONDS % 60))s] $*"; }
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# Every part, whatever an earlier configure (scripts/demo.sh's) chose.
everything=(-DTIDE_BUILD_TESTS=ON -DTIDE_BUILD_BENCH=ON -DTIDE_WITH_TORCH=ON -DTIDE_WITH_PYTHON=ON)
# The benchmarks compiled (so that they do not rot) but not optimised: the
# tests run only scale_bench's small cells.
plain=(build "${everything[@]}" -DTIDE_TESTS=integration -DTIDE_BENCH_OPTIMIZATION=-O0)
# The sanitizers see tide's own code: the unit tests, without libtorch
# (uninstrumented, and minutes a file to compile instrumented) or Python.
unit=(-DTIDE_BUILD_TESTS=ON -DTIDE_TESTS=unit -DTIDE_BUILD_BENCH=OFF
  -DTIDE_WITH_TORCH=OFF -DTIDE_WITH_PYTHON=OFF -- tide_unit_tests)
asan=(build-asan -DTIDE_SANITIZE=address "${unit[@]}")
tsan=(build-tsan -DTIDE_SANITIZE=thread "${unit[@]}")
tsan_on=${TIDE_TSAN:-1}
torch2_on=${TIDE_TORCH2:-1}
as_root=""
if [[ $(id -u) -ne 0 ]]; then as_root="sudo"; fi

step "packages the unit tests' builds need"
scripts/setup.sh unit

# The background builds report each result through a pipe, so that the ASan
# tests start as soon as theirs is done while the TSan build goes on.
pipe=$(mktemp -u) && mkfifo "$pipe"
exec {results}<>"$pipe"
rm -f "$pipe"
background_build() {
  local log=$1.log
  if nice -n 19 scripts/build.sh "$@" >"$log" 2>&1; then
    echo "$1 0" >&"$results"
  else
    echo "$1 $?" >&"$results"
  fi
}
# In a process group of its own (set -m), so that an early exit stops it.
set -m
(
  background_build "${asan[@]}"
  if [[ $tsan_on == 1 ]]; then background_build "${tsan[@]}"; fi
) &
builds=$!
set +m
trap 'kill -- -$builds 2>/dev/null || true' EXIT
# Results in the order the builds finish.
declare -A finished
wait_for_build() {
  local name status
  step "waiting for the $1 build (background, $1.log)"
  while [[ -z ${finished[$1]:-} ]]; do
    read -r name status <&"$results"
    finished[$name]=$status
  done
  if [[ ${finished[$1]} != 0 ]]; then
    tail -40 "$1.log"
    echo "== the $1 build failed (exit status ${finished[$1]}); its log: $1.log" >&2
    exit 1
  fi
}

step "the other packages (the sanitizer builds compile meanwhile)"
scripts/setup.sh
if [[ $torch2_on == 1 ]]; then
  step "a Debian 13 root with torch 2.6, and tide built there (background, torch2.log)"
  set -m
  (
    if nice -n 19 $as_root scripts/torch2.sh build >torch2.log 2>&1; then
      echo "torch2 0" >&"$results"
    else
      echo "torch2 $?" >&"$results"
    fi
  ) &
  torch2=$!
  set +m
  trap 'kill -- -$builds -$torch2 2>/dev/null || true' EXIT
fi
step "build (RelWithDebInfo)"
scripts/build.sh "${plain[@]}"
step "naming rules on the last commit's sources (.clang-tidy)"
scripts/lint.sh HEAD~1 build
step "tests"
ctest --test-dir build --output-on-failure -j2 --timeout 600

wait_for_build build-asan
step "unit tests under ASan+UBSan"
ctest --test-dir build-asan --output-on-failure -j2 --timeout 600

if [[ $tsan_on == 1 ]]; then
  wait_for_build build-tsan
  step "unit tests under TSan"
  # Known false positives of uninstrumented libstdc++ (see the file).
  TSAN_OPTIONS="suppressions=$PWD/tests/tsan.supp ${TSAN_OPTIONS:-}" \
    ctest --test-dir build-tsan --output-on-failure -j2 --timeout 600
fi
if [[ $torch2_on == 1 ]]; then
  wait_for_build torch2
  step "the tests that involve torch, beside Debian 13's torch 2.6 (scripts/torch2.sh)"
  $as_root scripts/torch2.sh test
fi
step "all tests passed"
