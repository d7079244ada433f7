"""What a script may do with its model while gpudoctor watches it: deepcopy, TorchScript,
DataParallel, state_dict round trip. Prints one JSON line of what it saw."""

import copy
import json

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4, 8)
for _ in range(4):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
seen = {"live_hooks": len(model._forward_hooks) + len(model._forward_pre_hooks)}
twin = copy.deepcopy(model)
seen["copied_hooks"] = len(twin._forward_hooks) + len(twin._forward_pre_hooks)
scripted = torch.jit.script(model)
with torch.no_grad():
    seen["scripted_same"] = bool(torch.equal(scripted(x), model(x)))
seen["live_hooks_after_script"] = len(model._forward_hooks) + len(model._forward_pre_hooks)
with torch.no_grad():
    seen["data_parallel_same"] = bool(torch.equal(nn.DataParallel(model)(x), model(x)))
fresh = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
fresh.load_state_dict(model.state_dict())
with torch.no_grad():
    seen["state_dict_same"] = bool(torch.equal(fresh(x), model(x)))
print(json.dumps(seen, sort_keys=True))
