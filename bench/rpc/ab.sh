#!/usr/bin/env bash
# Two builds of tide's RPC, back to back: did a change cost the fast path?
# Alternates the builds' rpc_bench (both ranks in one process: the rpc_sync
# round trip, pipelined rpc_async calls with 64 and 256 in flight, each with
# a continuation, tensor echoes of 1 and 64 MiB, RRef creation, proxy calls
# and passing, the model-parallel steps) and torch's Python program on each build's TIDE backend
# (bench/peers/torch_rpc_peer.py --backend tide: round trip, pipelined calls,
# the two model-parallel steps), --reps times each, then prints the medians
# of each build and new/old. The machine is noisy: alternating puts the
# noise on both sides alike; read ratios within about 10% as noise.
#
#   git worktree add /tmp/old HEAD~1 && scripts/build.sh /tmp/old/build
#   bench/rpc/ab.sh /tmp/old/build build [--reps 6]
#
# Needs /usr/bin/python3 with Debian's python3-torch for the Python side.
# Exit status: 0; 2 on bad arguments or a build without the programs.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if (($# < 2)); then
  sed -n '2,14p' "$0" >&2
  exit 2
fi
old="$1" new="$2"
shift 2
reps=6
while (($#)); do
  case "$1" in
    --reps) reps="$2"; shift 2 ;;
    *) echo "ab.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
for b in "$old" "$new"; do
  if [[ ! -x $b/bench/rpc_bench || ! -d $b/python/tide ]]; then
    echo "ab.sh: $b lacks bench/rpc_bench or python/tide (build it first)" >&2
    exit 2
  fi
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((i = 1; i <= reps; i++)); do
  for side in old new; do
    b=$old
    [[ $side == new ]] && b=$new
    timeout 120 "$b/bench/rpc_bench" 2>/dev/null | sed "s/^/$side cpp /" >>"$out" || true
    PYTHONPATH="$b/python" timeout 300 /usr/bin/python3 \
      "$root/bench/peers/torch_rpc_peer.py" --backend tide --calls 2000 2>/dev/null |
      sed "s/^/$side py /" >>"$out" || true
  done
  echo "ab.sh: round $i/$reps done" >&2
done
/usr/bin/python3 - "$out" <<'EOF'
import collections, json, statistics, sys
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    side, kind, text = line.split(" ", 2)
    try:
        r = json.loads(text)
    except ValueError:
        continue
    m = r.get("metric")
    if m == "sync_rtt_us":
        key, v = f"{kind} rpc_sync round trip, median us", r["median"]
    elif m == "async_calls_per_s":
        key, v = f"{kind} rpc_async, {r['window']} in flight, calls/s", r["value"]
    elif m == "dist_autograd_step_us":
        key, v = f"{kind} model-parallel step ({r['variant']}), median us", r["median"]
    elif m in ("echo", "echo_clone"):
        key = f"{kind} {m.replace('_', ' ')} {r['size_bytes'] / 2**20:g} MiB, median ms"
        v = r["rtt_ms_median"]
    elif m in ("remote_to_here_us", "proxy_rtt_us", "rref_pass_us"):
        what = {"remote_to_here_us": "remote() + to_here()",
                "proxy_rtt_us": "RRef proxy call",
                "rref_pass_us": "RRef passed to a third worker"}[m]
        key, v = f"{kind} {what}, median us", r["median"]
    else:
        continue
    rows[key][side].append(v)
print("| metric | old | new | new/old | n |")
print("|---|--:|--:|--:|--:|")
for key in sorted(rows):
    o, n = rows[key]["old"], rows[key]["new"]
    if o and n:
        mo, mn = statistics.median(o), statistics.median(n)
        print(f"| {key} | {mo:.4g} | {mn:.4g} | {mn / mo:.2f} | {min(len(o), len(n))} |")
EOF
