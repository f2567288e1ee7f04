#!/usr/bin/env bash
# The main job: tiderun launching elastic worker groups on this machine.
#  1. four C++ workers that meet at the agent's store; one crashes on the
#     first attempt, the group restarts and finishes;
#  2. a PyTorch DDP training script written for torchrun, unchanged, under
#     tiderun, with the same injected failure.
set -euo pipefail
SECONDS=0
step() { echo "== [${SECONDS}s] $*"; }
root=$(cd "$(dirname "$0")/.." && pwd)
step "packages (scripts/setup.sh demo)"
"$root/scripts/setup.sh" demo
step "build: tiderun and the C++ worker"
# Only what the job runs: tiderun and the C++ worker (no tests, benchmarks
# or libtorch parts).
"$root/scripts/build.sh" build -DTIDE_BUILD_TESTS=OFF -DTIDE_BUILD_BENCH=OFF \
  -- tiderun store_worker
tiderun="$root/build/apps/tiderun"

echo
step "tiderun --standalone --nproc-per-node=4 --max-restarts=1 store_worker --fail-once"
"$tiderun" --standalone --nproc-per-node=4 --max-restarts=1 \
  "$root/build/examples/store_worker" --fail-once

echo
step "tiderun --standalone --nproc-per-node=2 --max-restarts=1 examples/ddp_train.py --fail-once"
# Debian's PyTorch lives with /usr/bin/python3.
PYTHON_EXEC=/usr/bin/python3 "$tiderun" --standalone --nproc-per-node=2 --max-restarts=1 \
  "$root/examples/ddp_train.py" --fail-once
step "done"
