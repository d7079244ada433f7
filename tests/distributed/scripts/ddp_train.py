"""A small DDP training loop on the CPU (gloo), for the distributed end-to-end tests.

Environment knobs (the same script serves every test):
- DDP_SLEEP_MS: every rank sleeps this long in every step, standing in for GPU time (steps of
  realistic length, so that CPU scheduling jitter on a busy 2-core machine stays small beside them);
- DDP_SLOW_RANK / DDP_SLOW_MS: that rank sleeps this much longer (a planted straggler);
- DDP_FAIL_RANK / DDP_FAIL_STEP: that rank raises at that step;
- DDP_STEPS: steps to train (default 10);
- DDP_HIDDEN: width of the model (default 128; wider: longer, steadier steps).
"""

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
sleep_s = float(os.environ.get("DDP_SLEEP_MS", "0")) / 1000
slow_rank = int(os.environ.get("DDP_SLOW_RANK", "-1"))
slow_s = float(os.environ.get("DDP_SLOW_MS", "0")) / 1000
fail_rank = int(os.environ.get("DDP_FAIL_RANK", "-1"))
fail_step = int(os.environ.get("DDP_FAIL_STEP", "-1"))
steps = int(os.environ.get("DDP_STEPS", "10"))
hidden = int(os.environ.get("DDP_HIDDEN", "128"))

data = TensorDataset(torch.randn(64 * steps * dist.get_world_size(), 64), torch.randint(0, 10, (64 * steps * dist.get_world_size(),)))
loader = DataLoader(data, batch_size=64, sampler=DistributedSampler(data))
model = DDP(nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

for step, (x, y) in enumerate(loader):
    if step == steps:
        break
    if rank == fail_rank and step == fail_step:
        raise RuntimeError(f"planted failure on rank {rank} at step {step}")
    time.sleep(sleep_s + (slow_s if rank == slow_rank else 0.0))
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()

dist.destroy_process_group()
