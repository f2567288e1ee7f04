"""A worker that uses the agent's store as torch >= 2.5's workers do: its
keys as they are, with no /worker/attempt_N prefix (torch 1.13's own
init_process_group adds one; 2.5 and later do not). Attempt 0 leaves a key
where gloo leaves its address, then fails; attempt 1 must not find it, as
a restarted group must never read the previous attempt's addresses.

Run under a launcher, one worker: on the agent's store
(TORCHELASTIC_USE_AGENT_STORE=True), else on the store it hosts as torch's
rank 0 does (tiderun's choice for a torch without libuv)."""
import os
import sys
from datetime import timedelta

import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from torch_facts import store_kwargs  # noqa: E402

store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                      is_master=os.environ["TORCHELASTIC_USE_AGENT_STORE"] != "True",
                      timeout=timedelta(seconds=60), **store_kwargs())
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
key = f"default_pg/0/rank_{os.environ['RANK']}"
if attempt == 0:
    store.set(key, "attempt 0's address")
    print("attempt 0 wrote its address and fails", flush=True)
    sys.exit(1)
# compare_set answers the stored value, or `expected` when the key is
# absent (torch 1.13's TCPStore has no check()).
found = store.compare_set(key, "<absent>", "<unused>").decode()
if found != "<absent>":
    print(f"attempt {attempt} read attempt 0's address: {found!r}", flush=True)
    sys.exit(3)
store.set(key, f"attempt {attempt}'s address")
assert store.get(key).decode() == f"attempt {attempt}'s address"
print(f"attempt {attempt} found nothing of attempt 0", flush=True)
