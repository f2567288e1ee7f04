#!/usr/bin/env bash
# Builds the store-decoder fuzzer with clang's libFuzzer and runs it.
# Usage: tests/fuzz/run_fuzz.sh OUT_DIR SECONDS
#   A short run (30 s) is part of the test suite; for a long hand run:
#   tests/fuzz/run_fuzz.sh /tmp/fuzz 3600
set -euo pipefail
out=${1:?output directory}
seconds=${2:-30}
root=$(cd "$(dirname "$0")/../.." && pwd)
clang=${CLANGXX:-clang++}
mkdir -p "$out/corpus"
cp -n "$root"/tests/fuzz/corpus/* "$out/corpus/" 2>/dev/null || true
"$clang" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined \
  -fno-sanitize-recover=undefined \
  -I"$root/include" -I"$root/src" \
  "$root/tests/fuzz/wire_fuzz.cpp" "$root/src/store/wire.cpp" \
  "$root/src/store/kv_map.cpp" "$root/src/common/error.cpp" \
  -o "$out/wire_fuzz"
# Findings are written to $out; a crash makes libFuzzer exit non-zero.
"$out/wire_fuzz" -max_total_time="$seconds" -print_final_stats=1 \
  -artifact_prefix="$out/" -max_len=4096 "$out/corpus"
