"""empty_cache every step: the loop hands the allocator's cache back to the driver after each step.

Problem: "to keep memory low", the loop calls ``torch.cuda.empty_cache()``
after every optimizer step. The caching allocator then returns every free
block to the driver (``cudaFree``), and the next step has to ``cudaMalloc`` its
activations again: slow, synchronizing driver calls inside every step, while
peak memory stays the same.
Expected: GD502
Needs: GPU
Fix: remove the ``empty_cache()`` call; if fragmentation is the real worry, set
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` instead. On a CPU-only
machine ``empty_cache()`` does nothing and both variants run alike.

    python sample_scripts/empty_cache_every_step.py            # planted
    python sample_scripts/empty_cache_every_step.py --fixed    # the fix
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
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(2 * width, 4 * width, 3, padding=1), nn.BatchNorm2d(4 * width), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, 10),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Train a CNN, emptying the CUDA cache every step.")
    p.add_argument("--fixed", action="store_true", help="do not call torch.cuda.empty_cache() (the fix)")
    p.add_argument("--samples", type=int, default=None, help="dataset size (default 25600 on CUDA, 1024 on CPU)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    args = p.parse_args(argv)

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_cuda = device.type == "cuda"
    size, width = (64, 32) if on_cuda else (32, 16)
    samples = args.samples or (25600 if on_cuda else 1024)
    if args.quick:
        samples, args.batch_size = 64, 16
    loader = DataLoader(
        Images(samples, size), batch_size=args.batch_size, shuffle=True, num_workers=2,
        persistent_workers=True, pin_memory=on_cuda,
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
        if not args.fixed:
            torch.cuda.empty_cache()  # "keep memory low"
    print(f"{len(loader)} steps, mean loss {running.item() / len(loader):.3f}, {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
