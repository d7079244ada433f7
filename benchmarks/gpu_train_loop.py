"""Two GPU training loops for ``benchmarks/overhead.py --gpu``: one the GPU limits, one the host limits.

- ``--model resnet``: ResNet-50 (torchvision's when installed, else a ResNet-50-shaped stack of
  bottleneck blocks written here), batch 128 of 224x224 images, BF16 autocast, channels_last, SGD
  with momentum: about 30 ms per step on an H200, the GPU busy throughout (the host runs ahead).
- ``--model mlp``: a 4-layer 256-wide MLP, batch 32, FP32, Adam: about 2 ms per step on an H200,
  every one of them spent issuing small kernels (launch-bound: the GPU waits for the host).

The data are made once on the GPU (no DataLoader): what the benchmark compares is the step
itself, bare and under ``gpudoctor profile``. Nothing in it knows about gpudoctor.

    python benchmarks/gpu_train_loop.py --model resnet --steps 400 --step-times out.json

``--step-times FILE`` writes ``{"gpu": [...], "wall": [...]}`` in seconds per step: ``gpu`` from one CUDA
event recorded after each ``optimizer.step()`` (event to event: the rate the loop sustains, read once at
the end, no synchronization in the loop), ``wall`` from ``time.perf_counter`` at the same points (the
host's enqueue time, which is not the step time when the GPU is behind).

``--ab-hooks`` (run under ``gpudoctor profile``): after ``--ab-warmup`` steps, gpudoctor's step hooks are
switched off (the original functions put back) and on again every ``--ab-block`` steps, between two
iterations (``hook_loop.HookSwitch``); the file then also holds each step's state (``"on"``: 1, 0, or -1
for a warm-up step or the first after a switch) and what was switched. The difference of the two
medians is what the hooks and the step bookkeeping behind them (CUDA events included) cost a step, in
one process over the same seconds: what is left of the overhead beyond it comes with the process
(the instruments' start-up, the windows' aftermath, the environment).

``--profiler-window START`` (run bare, without gpudoctor: ``benchmarks/cupti_weight.py``): one
torch.profiler window of the loop's own (CPU and, on CUDA, CUDA activities) over steps START to
START + ``--profiler-steps`` - 1, entered before step START and left after its last step; the steps
before and after it measure what the profiler (CUPTI) leaves behind once its session has ended. The
file then also holds ``"window": [START, END)``. ``TEARDOWN_CUPTI`` in the environment is Kineto's.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True), nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout),
        )
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def resnet50_shaped(classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                               nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def resnet() -> nn.Module:
    try:
        from torchvision.models import resnet50  # noqa: PLC0415

        return resnet50()
    except Exception:  # torchvision absent, or built against another torch
        return resnet50_shaped()


class Stamp:
    """A CUDA event (recorded on the current stream, read at the end), or on the CPU the host's clock."""

    def __init__(self, cuda: bool) -> None:
        self.event = torch.cuda.Event(enable_timing=True) if cuda else None
        self.t = 0.0

    def record(self) -> None:
        if self.event is not None:
            self.event.record()
        else:
            self.t = time.perf_counter()

    def elapsed_time(self, end: Stamp) -> float:
        """Milliseconds from this stamp to ``end`` (``torch.cuda.Event.elapsed_time``'s unit)."""
        if self.event is not None:
            return self.event.elapsed_time(end.event)
        return (end.t - self.t) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("resnet", "mlp"), default="resnet")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--step-times", default=None, help="write per-step times (s) here")
    p.add_argument("--device", default="cuda", help="cuda (default); cpu runs the same code for the tests, "
                   "its 'gpu' times then taken by the host's clock")
    p.add_argument("--ab-hooks", action="store_true", help="switch gpudoctor's hooks off and on (see above)")
    p.add_argument("--ab-block", type=int, default=25)
    p.add_argument("--ab-warmup", type=int, default=50)
    p.add_argument("--profiler-window", type=int, default=None, metavar="START",
                   help="one torch.profiler window of the loop's own from this step (see above)")
    p.add_argument("--profiler-steps", type=int, default=5, help="steps in that window (default 5)")
    args = p.parse_args()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("gpu_train_loop: needs a CUDA device (or --device cpu)")
    torch.manual_seed(0)
    dev = torch.device(args.device)
    if args.model == "resnet":
        model = resnet().to(dev, memory_format=torch.channels_last)
        batch, size = (128, 224) if cuda else (2, 32)  # on the CPU a smoke test of the same code
        x = torch.randn(batch, 3, size, size, device=dev).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), device=dev)
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        amp = cuda
    else:
        model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                              nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to(dev)
        x = torch.randn(32, 256, device=dev)
        y = torch.randint(0, 10, (32,), device=dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        amp = False
    loss_fn = nn.CrossEntropyLoss()
    events = [Stamp(cuda) for _ in range(args.steps + 1)]
    walls: list[float] = []
    states: list[int] = []
    switch = None
    prof = None
    window = (args.profiler_window, args.profiler_window + args.profiler_steps) if args.profiler_window is not None else None
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    events[0].record()
    t_prev = time.perf_counter()
    for step in range(args.steps):
        if args.ab_hooks:
            k = step - args.ab_warmup
            on = k < 0 or (k // args.ab_block) % 2 == 0
            states.append(-1 if k < 0 or k % args.ab_block == 0 else 1 if on else 0)
            if k >= 0 and k % args.ab_block == 0:
                if switch is None:
                    from hook_loop import HookSwitch  # noqa: PLC0415 (beside this file)

                    switch = HookSwitch(model, opt)
                switch.set(on)
        if window is not None and step == window[0]:
            prof = torch.profiler.profile(activities=activities)
            prof.__enter__()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if prof is not None and step == window[1] - 1:
            prof.__exit__(None, None, None)  # the session ends here: Kineto tears CUPTI down or not
            prof = None
        events[step + 1].record()
        t = time.perf_counter()
        walls.append(t - t_prev)
        t_prev = t
    if prof is not None:  # a window past the last step
        prof.__exit__(None, None, None)
    if cuda:
        torch.cuda.synchronize()
    if switch is not None:
        switch.set(True)
    gpu = [events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(args.steps)]
    if args.step_times:
        out: dict = {"gpu": gpu, "wall": walls}
        if window is not None:
            out["window"] = list(window)
        if args.ab_hooks:
            out |= {"on": states, "switched": switch.switched if switch is not None else []}
        with open(args.step_times, "w", encoding="utf-8") as f:
            json.dump(out, f)
    print(f"trained {args.steps} steps of {args.model}, final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
