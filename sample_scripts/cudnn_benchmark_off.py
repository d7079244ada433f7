"""cuDNN benchmark off: fixed-shape convolutions with ``torch.backends.cudnn.benchmark`` left False.

Problem: every batch has the same shape (128 x 3 x 64 x 64, ``drop_last=True``)
and the network uses 5x5 and 7x7 convolutions, dilated and grouped ones among
them. With ``cudnn.benchmark`` off (PyTorch's default) cuDNN picks each
convolution's algorithm by heuristics, which for these shapes is often not the
fastest; nothing requires determinism here.
Expected: GD403
Needs: GPU
Fix: ``torch.backends.cudnn.benchmark = True`` before training: cuDNN times the
candidate algorithms once per input shape and keeps the fastest. Not when input
shapes change from batch to batch, nor when bitwise determinism is required.
On a CPU-only machine the flag has no effect and both variants run alike.

    python sample_scripts/cudnn_benchmark_off.py            # planted
    python sample_scripts/cudnn_benchmark_off.py --fixed    # the fix
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    def __init__(self, n: int, size: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=gen)
        self.labels = torch.randint(0, 10, (n,), generator=gen)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.images[i].float() - 127.5) / 64.0, self.labels[i]


def make_model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 7, padding=3), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
        nn.Conv2d(width, width, 5, padding=4, dilation=2, groups=4), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 5, padding=2), nn.BatchNorm2d(2 * width), nn.ReLU(inplace=True),
        nn.Conv2d(2 * width, 2 * width, 3, padding=1, groups=8), nn.BatchNorm2d(2 * width), nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(2 * width, 4 * width, 3, padding=1), nn.BatchNorm2d(4 * width), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, 10),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Train a fixed-shape CNN with large and grouped kernels.")
    p.add_argument("--fixed", action="store_true", help="torch.backends.cudnn.benchmark = True (the fix)")
    p.add_argument("--samples", type=int, default=None, help="dataset size (default 19200 on CUDA, 512 on CPU)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    args = p.parse_args(argv)

    if args.fixed:
        torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_cuda = device.type == "cuda"
    size, width = (64, 64) if on_cuda else (32, 16)
    samples = args.samples or (19200 if on_cuda else 512)
    if args.quick:
        samples, args.batch_size = 64, 16
    loader = DataLoader(
        Images(samples, size), batch_size=args.batch_size, shuffle=True, drop_last=True,
        num_workers=2, persistent_workers=True, pin_memory=on_cuda,
    )  # fmt: skip

    model = make_model(width).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    start = time.perf_counter()
    running = torch.zeros((), device=device)
    for images, labels in loader:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(images), labels)
        loss.backward()
        optimizer.step()
        running += loss.detach()
    print(f"{len(loader)} steps, mean loss {running.item() / len(loader):.3f}, {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
