#!/usr/bin/env bash
# Draws docs/img/job_page.png: the live page of a real two-node job (two
# tiderun agents on this machine, 4 ranks each, one straggler, one restart),
# taken by headless chromium.
#
#   scripts/job_page_picture.sh [BUILD_DIR] [OUT.png]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-docs/img/job_page.png}
dir=$(mktemp -d)
trap 'touch "$dir/stop"; wait; rm -rf "$dir"' EXIT
export STOP_FILE=$dir/stop PYTHONPATH=$PWD/python
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for node in a b; do
  health=()
  [[ $node == a ]] && health=(--health-port 127.0.0.1:18080)
  "$build/apps/tiderun" --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d \
    --rdzv-endpoint="127.0.0.1:$port" --rdzv-id=train-llm --max-restarts=3 \
    --status-interval=0.5 --tee=3 --log-dir "$dir/logs-$node" "${health[@]}" \
    --no-python /usr/bin/python3 examples/job_page_job.py > "$dir/$node.log" 2>&1 &
done
# The straggler flagged and the restart behind it: about 10 s in.
sleep 12
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
  --virtual-time-budget=3000 --window-size=1280,900 \
  --screenshot="$out" "http://127.0.0.1:18080/#rank=6" 2>/dev/null
echo "wrote $out"
