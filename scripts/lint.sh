#!/usr/bin/env bash
# Checks the naming rules of .clang-tidy (readability-identifier-naming:
# types CamelCase, functions and variables snake_case, private members with
# a trailing _, constants and enumerators kCamel) on the C++ sources a change
# touched: the .cpp files changed since BASE (default: the commit before
# HEAD), with the headers of tide they include. Only the naming rules count:
# clang-tidy's own parse errors (clang 14 on libtorch's headers) are not
# reported. The compile commands come from a configure of its own in
# BUILD/lint-db (BUILD default: build) without the unity build, whose
# database names batches rather than the files.
#
#   scripts/lint.sh [BASE] [BUILD]
#
# Exit status: 0 when every file passes (or none changed); 1 naming the
# identifiers that break a rule.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
base=${1:-HEAD~1}
build=${2:-build}
if ! git rev-parse --verify --quiet "$base^{commit}" >/dev/null; then
  echo "lint: no commit $base to compare with; nothing checked"
  exit 0
fi
db=$build/lint-db
[[ $db = /* ]] || db="$root/$db"
cmake -S "$root" -B "$db" -G Ninja -DTIDE_UNITY_BUILD=OFF -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
  >"$db.log" 2>&1 || { tail -20 "$db.log"; echo "lint: configure failed" >&2; exit 1; }
mapfile -t files < <(git diff --name-only --diff-filter=AMR "$base" -- '*.cpp' |
  while read -r f; do
    [[ -f $f ]] && grep -q "\"file\": \"$root/$f\"" "$db/compile_commands.json" && echo "$f"
  done)
if ((${#files[@]} == 0)); then
  echo "lint: no C++ source changed since $base"
  exit 0
fi
echo "lint: ${#files[@]} file(s) changed since $base"
printf '%s\n' "${files[@]}" |
  xargs -P "$(nproc)" -n 4 clang-tidy -p "$db" --quiet 2>&1 |
  grep -E 'readability-identifier-naming' | sort -u >/tmp/tide-lint.$$ || true
if [[ -s /tmp/tide-lint.$$ ]]; then
  cat /tmp/tide-lint.$$
  rm -f /tmp/tide-lint.$$
  exit 1
fi
rm -f /tmp/tide-lint.$$
echo "lint: naming rules hold"
