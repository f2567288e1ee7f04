#!/usr/bin/env bash
# pip install . into a fresh virtual environment (--system-site-packages:
# Debian's torch), from the test build (TIDE_BUILD_DIR: nothing is compiled
# again), offline. Then, from that environment alone: its tiderun runs a
# two-worker job with its own interpreter (PATH does not name the
# environment) whose workers call each other over tide.torch_rpc; and the
# TIDE backend refuses a torch it was not built for, naming both versions.
#
#   tests/install/pip_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
venv=$tmp/venv

/usr/bin/python3 -m venv --system-site-packages "$venv"
TIDE_BUILD_DIR=$build "$venv/bin/pip" install --no-build-isolation --no-index --no-deps \
  --quiet "$src"
for command in tiderun tide-store tide-timeline; do
  [[ -x $venv/bin/$command ]] || { echo "pip_test: no $venv/bin/$command" >&2; exit 1; }
done

cd "$tmp"  # nothing of the sources on sys.path
cat >job.py <<'PY'
import os

import torch
import torch.distributed.rpc as rpc

import tide.torch_rpc

rank = int(os.environ["RANK"])
rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, backend=rpc.BackendType.TIDE)
if rank == 0:
    total = rpc.rpc_sync("w1", torch.add, args=(torch.ones(2), 1))
    print("sum", total.tolist(), "from", os.path.dirname(tide.torch_rpc.__file__))
rpc.shutdown()
PY
env -u PYTHON_EXEC PATH=/usr/bin:/bin "$venv/bin/tiderun" --standalone --nproc-per-node=2 \
  job.py >out.txt 2>err.txt || { cat err.txt >&2; exit 1; }
expected="sum [2.0, 2.0] from $venv/lib/"
grep -qF "$expected" out.txt || {
  echo "pip_test: expected a line with '$expected', got:" >&2
  cat out.txt err.txt >&2
  exit 1
}

# A torch other than the one the backend was built for.
built_for=$(find "$venv/lib" -name _torch_rpc_built_for.py)
sed -i 's/^TORCH_VERSION = .*/TORCH_VERSION = "0.0.1"/' "$built_for"
if "$venv/bin/python" -c "import tide.torch_rpc" 2>err.txt; then
  echo "pip_test: tide.torch_rpc imported under a torch it was not built for" >&2
  exit 1
fi
grep -q "built for torch 0.0.1, but this interpreter has torch $(
  /usr/bin/python3 -c 'import torch; print(torch.__version__)')" err.txt || {
  echo "pip_test: the refusal does not name both versions:" >&2
  cat err.txt >&2
  exit 1
}
echo "pip_test: installed, ran a job and an rpc call from the environment, refused a foreign torch"
