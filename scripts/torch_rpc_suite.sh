#!/usr/bin/env bash
# Runs torch's own generic RPC test suites (Debian's python3-torch 1.13.1)
# on the TIDE backend, all 357 tests that can run here (the 8 Ddp* tests
# cannot: an import error in torch itself under Python 3.11, any backend),
# and writes one row per test to torch_rpc_suite.tsv (or --out FILE).
# About 3 minutes on 2 cores (each test's workers forked; with
# --start-method spawn, torch's own way, about 25). Extra arguments go to
# tests/torch_rpc/run_suite.py (-k TEXT, --skip TEXT, --backend TENSORPIPE,
# --start-method spawn).
#
#   scripts/torch_rpc_suite.sh                       # build/ must hold a build
#   scripts/torch_rpc_suite.sh --backend TENSORPIPE  # the same suite on torch's own
#   BUILD_DIR=build-rel scripts/torch_rpc_suite.sh -k DistAutograd
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
if [[ ! -f $build/python/tide/torch_rpc.py ]]; then
  echo "torch_rpc_suite.sh: no $build/python/tide: build first (scripts/build.sh build)" >&2
  exit 2
fi
# A copy: a rebuild during the run must not swap the module under the
# tests' processes.
pkg=$(mktemp -d "${TMPDIR:-/tmp}/tide-python.XXXXXX")
trap 'rm -rf "$pkg"' EXIT
cp -r "$build/python/." "$pkg/"
PYTHONPATH=$pkg /usr/bin/python3 "$root/tests/torch_rpc/run_suite.py" \
  --skip DdpComparison --skip DdpUnderDistAutograd "$@"
