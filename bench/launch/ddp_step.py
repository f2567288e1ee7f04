"""The training script of bench/launch/ddp_restart_bench.py: a small DDP model
(gloo, CPU) written for torchrun. It stamps, per attempt and rank, when the
script starts running (before its imports), when torch is imported, when the
process group is up and when its first training step completes. Attempt 0
trains until rank BENCH_FAIL_RANK raises, after its step 3 once the script
has run BENCH_FAIL_AFTER seconds (9: a job that fails has trained a while,
and tiderun --prestart's pool imports 5 s into an attempt). Attempt 1 runs
BENCH_STEPS steps and exits."""
import itertools
import os
import sys
import time

T0 = time.time()
STAMPS = os.environ["BENCH_STAMPS"]
ATTEMPT = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
RANK = int(os.environ["RANK"])


def stamp(name, t=None):
    path = os.path.join(STAMPS, f"{name}.{ATTEMPT}.{RANK}")
    with open(path + ".tmp", "w") as f:
        f.write(repr(t if t is not None else time.time()))
    os.rename(path + ".tmp", path)


stamp("up", T0)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

# A torch built without libuv that asks for it (Debian 13's 2.6): the store
# under torchrun's agent needs USE_LIBUV honoured (bench/peers/libuv_fix.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
from libuv_fix import follow_use_libuv  # noqa: E402

follow_use_libuv()
stamp("imported")
dist.init_process_group("gloo")
stamp("pg")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
gen = torch.Generator().manual_seed(RANK)
steps = itertools.count() if ATTEMPT == 0 else range(int(os.environ.get("BENCH_STEPS", "5")))
fail_at = T0 + float(os.environ.get("BENCH_FAIL_AFTER", "9"))
for step in steps:
    x = torch.randn(32, 64, generator=gen)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 0:
        stamp("step1")
    if ATTEMPT == 0 and RANK == int(os.environ.get("BENCH_FAIL_RANK", "1")) and step >= 2 \
            and time.time() >= fail_at:
        stamp("failure")
        raise RuntimeError("injected failure")
print(f"rank {RANK} attempt {ATTEMPT}: final loss {loss.item():.6f}", flush=True)
dist.destroy_process_group()
