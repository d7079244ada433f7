# One process per GPU (torchrun), gradients all-reduced by DistributedDataParallel.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = DDP(model.cuda(local_rank), device_ids=[local_rank])
for x, y in loader:
    x, y = x.cuda(local_rank, non_blocking=True), y.cuda(local_rank, non_blocking=True)
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
