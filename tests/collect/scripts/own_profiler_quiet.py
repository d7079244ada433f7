"""A script that runs torch.profiler itself and only prints a table, as the PyTorch recipe does:
it never exports a trace. argv[1]: "plain" (a bare `with profile()`), "schedule" (a schedule
whose on_trace_ready prints), or "legacy" (torch.autograd.profiler.profile)."""

import sys

import torch
from torch.profiler import ProfilerActivity, profile, schedule

kind = sys.argv[1]
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def train_step():
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()


if kind == "plain":
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(4):
            train_step()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=3))
elif kind == "schedule":
    def show(p):
        print(p.key_averages().table(sort_by="cpu_time_total", row_limit=3))

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                 on_trace_ready=show) as prof:
        for _ in range(6):
            train_step()
            prof.step()
else:
    with torch.autograd.profiler.profile() as prof:
        for _ in range(4):
            train_step()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=3))
print("own_profiler_quiet: done")
