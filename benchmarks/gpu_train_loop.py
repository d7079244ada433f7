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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("resnet", "mlp"), default="resnet")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--step-times", default=None, help="write per-step times (s) here")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_train_loop: needs a CUDA device")
    torch.manual_seed(0)
    dev = torch.device("cuda")
    if args.model == "resnet":
        model = resnet().to(dev, memory_format=torch.channels_last)
        x = torch.randn(128, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (128,), device=dev)
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        amp = True
    else:
        model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                              nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to(dev)
        x = torch.randn(32, 256, device=dev)
        y = torch.randint(0, 10, (32,), device=dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        amp = False
    loss_fn = nn.CrossEntropyLoss()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps + 1)]
    walls: list[float] = []
    events[0].record()
    t_prev = time.perf_counter()
    for step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        events[step + 1].record()
        t = time.perf_counter()
        walls.append(t - t_prev)
        t_prev = t
    torch.cuda.synchronize()
    gpu = [events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(args.steps)]
    if args.step_times:
        with open(args.step_times, "w", encoding="utf-8") as f:
            json.dump({"gpu": gpu, "wall": walls}, f)
    print(f"trained {args.steps} steps of {args.model}, final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
