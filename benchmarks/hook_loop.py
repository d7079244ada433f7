"""Tiny loops of each step-marker shape, for the hook-cost part of ``benchmarks/overhead.py``.

The steps are kept short (a small MLP, batch 8: ~0.1-0.3 ms on one core) so that a few
microseconds of gpudoctor's hooks per step stand out of the step-to-step noise. The model is
the script's own ``nn.Module`` class, as in PyTorch's examples and most training scripts.
Nothing in it knows about gpudoctor.

    python benchmarks/hook_loop.py --shape optimizer --steps 3000 --step-times out.json

Shapes (what marks the steps under ``gpudoctor profile``):

- ``optimizer``: DataLoader batches, forward, ``loss.backward()``, ``optimizer.step()``;
- ``backward``: forward and ``loss.backward()``, parameters updated by hand, batches sliced
  from a tensor;
- ``module``: forward only (evaluation) over a list of tensors;
- ``dataloader``: DataLoader batches only;
- ``sequential``: the ``optimizer`` shape with an ``nn.Sequential`` as the model (a torch
  class: gpudoctor hooks the instance instead of wrapping the class's forward);
- ``deep``: forward of a 300-submodule model (the cost gpudoctor's hook on the root module
  adds, against the ~0.8 µs per submodule call a global module hook would).

``--step-times FILE`` writes the loop's own per-step times (``time.perf_counter_ns`` at the
end of each iteration) as ``{"ns": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class MLP(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _mlp(width: int = 32) -> nn.Module:
    return MLP(width)


def _deep(blocks: int = 100) -> nn.Module:
    return nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Identity()) for _ in range(blocks)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", required=True, choices=["optimizer", "backward", "module", "dataloader", "deep", "sequential"])
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--step-times", default=None)
    p.add_argument("--global-hook", action="store_true",
                   help="register a no-op global module forward pre-hook (what gpudoctor avoids)")
    args = p.parse_args()
    if args.global_hook:
        nn.modules.module.register_module_forward_pre_hook(lambda module, inputs: None)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    n = args.steps
    x = torch.randn(n * 8, 32)
    y = torch.randint(0, 4, (n * 8,))
    loss_fn = nn.CrossEntropyLoss()
    times: list[int] = []
    t = time.perf_counter_ns()

    def tick() -> None:
        nonlocal t
        now = time.perf_counter_ns()
        times.append(now - t)
        t = now

    if args.shape in ("optimizer", "sequential"):
        model = _mlp() if args.shape == "optimizer" else nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for xb, yb in DataLoader(TensorDataset(x, y), batch_size=8):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(xb), yb).backward()
            opt.step()
            tick()
    elif args.shape == "backward":
        model = _mlp()
        for i in range(n):
            model.zero_grad(set_to_none=True)
            loss_fn(model(x[i * 8 : i * 8 + 8]), y[i * 8 : i * 8 + 8]).backward()
            with torch.no_grad():
                for q in model.parameters():
                    q.add_(q.grad, alpha=-0.01)
            tick()
    elif args.shape == "module":
        model = _mlp()
        batches = [x[i * 8 : i * 8 + 8] for i in range(n)]
        for xb in batches:
            model(xb)
            tick()
    elif args.shape == "dataloader":
        for xb, _ in DataLoader(TensorDataset(x, y), batch_size=8):
            xb.sum()
            tick()
    else:
        model = _deep()
        xb = torch.randn(2, 8)
        with torch.no_grad():
            for _ in range(n):
                model(xb)
                tick()
    if args.step_times:
        with open(args.step_times, "w", encoding="utf-8") as f:
            json.dump({"ns": times}, f)


if __name__ == "__main__":
    main()
