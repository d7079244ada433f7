"""Tiny loops of each step-marker shape, for the hook-cost part of ``benchmarks/overhead.py``.

The steps are kept short (a small MLP, batch 8: ~0.1-0.3 ms on one core) so that a few
microseconds of gpudoctor's hooks per step stand out of the step-to-step noise. The model is
the script's own ``nn.Module`` class, as in PyTorch's examples and most training scripts.
Nothing in it knows about gpudoctor.

    python benchmarks/hook_loop.py --shape optimizer --steps 3000 --step-times out.json

Shapes (what marks the steps under ``gpudoctor profile``):

- ``optimizer``: DataLoader batches, forward, ``loss.backward()``, ``optimizer.step()``;
- ``amp``: the ``optimizer`` shape with the forward and the loss under ``torch.autocast``
  (bfloat16 on the CPU), entered at every step as AMP training does;
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

``--ab-hooks`` (run under ``gpudoctor profile``): after ``--ab-warmup`` steps, every function
gpudoctor patched for its step hooks (its wrappers, which carry ``__wrapped__``: ``optimizer.step`` of the
optimizer's class, ``torch.autograd.backward``, the DataLoader iterator's ``__next__``,
``torch.autocast``'s ``__init__``, the model class's ``forward``) and the hooks it put on the model instance are switched off (the
originals put back) and on again every ``--ab-block`` steps, between two iterations. The file
then also holds each step's state (``"on"``: 1 hooks on, 0 off, -1 left out: a warm-up step or
the first step after a switch, which the switch straddles) and what was switched
(``"switched"``), so that the hooks' cost is the difference of two medians taken over the same
seconds of one process.
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


class HookSwitch:
    """Switches gpudoctor's step hooks off and on (``--ab-hooks``, see the module docstring)."""

    def __init__(self, model: nn.Module | None, opt: torch.optim.Optimizer | None) -> None:
        from torch.utils.data import dataloader  # noqa: PLC0415

        owners = [(torch.autograd, "backward"), (dataloader._BaseDataLoaderIter, "__next__"),
                  (torch.amp.autocast_mode.autocast, "__init__")]
        if opt is not None:
            owners.append((type(opt), "step"))
        if model is not None:
            owners.append((type(model), "forward"))
        # gpudoctor's own wrappers (torch's optimizer.step wrapper carries __wrapped__ too)
        self.functions = [(owner, name, fn, fn.__wrapped__) for owner, name in owners
                          if hasattr(fn := owner.__dict__.get(name), "__wrapped__")
                          and "gpudoctor" in getattr(getattr(fn, "__code__", None), "co_filename", "")]
        self.instance = [(model, attr, dict(getattr(model, attr))) for attr in ("_forward_pre_hooks", "_forward_hooks")
                         if model is not None and getattr(model, attr)]
        self.switched = [f"{getattr(o, '__name__', type(o).__name__)}.{n}" for o, n, _, _ in self.functions]
        self.switched += [f"{type(m).__name__} instance {attr}" for m, attr, _ in self.instance]

    def set(self, on: bool) -> None:
        for owner, name, hooked, orig in self.functions:
            setattr(owner, name, hooked if on else orig)
        for module, attr, hooks in self.instance:
            d = getattr(module, attr)
            d.clear()
            if on:
                d.update(hooks)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", required=True, choices=["optimizer", "amp", "backward", "module", "dataloader", "deep", "sequential"])
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--step-times", default=None)
    p.add_argument("--global-hook", action="store_true",
                   help="register a no-op global module forward pre-hook (what gpudoctor avoids)")
    p.add_argument("--ab-hooks", action="store_true",
                   help="switch gpudoctor's step hooks off and on every --ab-block steps (see the module docstring)")
    p.add_argument("--ab-block", type=int, default=25)
    p.add_argument("--ab-warmup", type=int, default=200)
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
    states: list[int] = []
    switch: HookSwitch | None = None
    model: nn.Module | None = None
    opt: torch.optim.Optimizer | None = None
    t = time.perf_counter_ns()

    def tick() -> None:
        nonlocal t, switch
        now = time.perf_counter_ns()
        times.append(now - t)
        if not args.ab_hooks:
            t = now
            return
        i = len(times) - 1
        if i < args.ab_warmup:
            states.append(-1)
        else:
            k = i - args.ab_warmup
            on = (k // args.ab_block) % 2 == 0
            states.append(-1 if k % args.ab_block == 0 else 1 if on else 0)  # the first step of a block straddles the switch
            if k % args.ab_block == args.ab_block - 1:
                if switch is None:
                    switch = HookSwitch(model, opt)
                switch.set(not on)
        t = time.perf_counter_ns()  # the switch itself is in no step

    if args.shape in ("optimizer", "sequential"):
        model = _mlp() if args.shape == "optimizer" else nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for xb, yb in DataLoader(TensorDataset(x, y), batch_size=8):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(xb), yb).backward()
            opt.step()
            tick()
    elif args.shape == "amp":
        model = _mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for xb, yb in DataLoader(TensorDataset(x, y), batch_size=8):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_fn(model(xb), yb)
            loss.backward()
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
    if switch is not None:
        switch.set(True)
    if args.step_times:
        with open(args.step_times, "w", encoding="utf-8") as f:
            out: dict[str, object] = {"ns": times}
            if args.ab_hooks:
                out |= {"on": states, "switched": switch.switched if switch is not None else []}
            json.dump(out, f)


if __name__ == "__main__":
    main()
