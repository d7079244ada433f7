"""What a script may do with its model while gpudoctor watches it: deepcopy, TorchScript,
DataParallel, state_dict round trip, torch.save. Prints one JSON line of what it saw.

``python model_ops.py net``: the model is the script's own class (its forward is wrapped on
the class, not hooked); otherwise an ``nn.Sequential`` (hooked on the instance)."""

import copy
import inspect
import io
import json
import sys

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def build() -> nn.Module:
    return Net() if sys.argv[1:] == ["net"] else nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


torch.manual_seed(0)
model = build()
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
fresh = build()
fresh.load_state_dict(model.state_dict())
with torch.no_grad():
    seen["state_dict_same"] = bool(torch.equal(fresh(x), model(x)))
buf = io.BytesIO()
torch.save(model, buf)
buf.seek(0)
loaded = torch.load(buf, weights_only=False)
seen["saved_hooks"] = len(loaded._forward_hooks) + len(loaded._forward_pre_hooks)  # gpudoctor's stay out
with torch.no_grad():
    seen["saved_same"] = bool(torch.equal(loaded(x), model(x)))
seen["signature"] = list(inspect.signature(model.forward).parameters)
seen["class_forward_wrapped"] = hasattr(type(model).forward, "__wrapped__")
print(json.dumps(seen, sort_keys=True))
