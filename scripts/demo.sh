#!/usr/bin/env bash
# The main job. For now: start a tide store server, have four C++ workers
# meet at it, then read what they wrote from PyTorch's own TCPStore client.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh" build

out=$(mktemp)
"$root/build/apps/tide-store" --host 127.0.0.1 --port 0 >"$out" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$out"' EXIT
port=""
for _ in $(seq 1 100); do   # the server prints its port once it listens
  port=$(sed -n 's/^tide-store listening on .*:\([0-9]*\)$/\1/p' "$out")
  [[ -n $port ]] && break
  sleep 0.05
done
[[ -n $port ]] || { echo "demo: tide-store did not start" >&2; exit 1; }
echo "== tide-store listening on 127.0.0.1:$port"

echo "== four C++ workers meet at the store"
"$root/build/examples/store_demo" 127.0.0.1 "$port"

echo "== PyTorch's TCPStore client reads the same store"
/usr/bin/python3 - "$port" <<'PY'
import datetime, sys
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False,
                      timeout=datetime.timedelta(seconds=10))
print("torch", __import__("torch").__version__, "reads demo/greeting =",
      store.get("demo/greeting").decode(), "and", store.get("demo/round_0/arrived").decode(),
      "workers arrived")
PY
