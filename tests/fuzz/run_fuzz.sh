#!/usr/bin/env bash
# Builds a decoder fuzzer with clang's libFuzzer and runs it.
# Usage: tests/fuzz/run_fuzz.sh OUT_DIR SECONDS [TARGET]
#   TARGET: store_wire (the store's request decoder, the default),
#   rpc_frame (the RPC frame decoder, gated as before a handshake or not) or
#   torch_pickle (the check of a peer's pickle). One OUT_DIR per target.
#   A short run (30 s) is part of the test suite; for a long hand run:
#   tests/fuzz/run_fuzz.sh /tmp/fuzz 3600 rpc_frame
set -euo pipefail
out=${1:?output directory}
seconds=${2:-30}
target=${3:-store_wire}
root=$(cd "$(dirname "$0")/../.." && pwd)
clang=${CLANGXX:-clang++}
case $target in
  store_wire)
    bin=wire_fuzz
    seeds=tests/fuzz/corpus
    sources=(tests/fuzz/wire_fuzz.cpp src/store/wire.cpp src/store/kv_map.cpp
      src/common/error.cpp)
    ;;
  rpc_frame)
    bin=rpc_frame_fuzz
    seeds=tests/fuzz/rpc_frame_corpus
    sources=(tests/fuzz/rpc_frame_fuzz.cpp src/transport/frame.cpp src/common/error.cpp)
    ;;
  torch_pickle)
    bin=pickle_check_fuzz
    seeds=tests/fuzz/pickle_corpus
    sources=(tests/fuzz/pickle_check_fuzz.cpp src/torch_rpc/pickle_check.cpp
      src/common/error.cpp)
    ;;
  *)
    echo "run_fuzz.sh: unknown target '$target'; known: store_wire, rpc_frame, torch_pickle" >&2
    exit 2
    ;;
esac
mkdir -p "$out/corpus"
cp -n "$root/$seeds"/* "$out/corpus/" 2>/dev/null || true
"$clang" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined \
  -fno-sanitize-recover=undefined \
  -I"$root/include" -I"$root/src" \
  "${sources[@]/#/$root/}" \
  -o "$out/$bin"
# Findings are written to $out; a crash makes libFuzzer exit non-zero.
"$out/$bin" -max_total_time="$seconds" -print_final_stats=1 \
  -artifact_prefix="$out/" -max_len=4096 "$out/corpus"
