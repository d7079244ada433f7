"""A script that runs torch.profiler itself (schedule + tensorboard_trace_handler into argv[1])."""

import sys

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with profile(
    activities=[ProfilerActivity.CPU],
    schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
    on_trace_ready=tensorboard_trace_handler(sys.argv[1], worker_name="mine"),
) as prof:
    for _ in range(8):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        prof.step()
print("own_profiler: done")
