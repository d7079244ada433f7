"""Oversubscribed threads: every DataLoader worker runs as many intra-op threads as there are cores.

Problem: the Dataset augments with torch ops (resize, blur), and a
``worker_init_fn`` meant to "let augmentation use every core" calls
``torch.set_num_threads(os.cpu_count())`` in each worker. PyTorch had set one
thread per worker on purpose: now 2 workers x cpu_count threads, plus the
training process's own intra-op threads, compete for the cores. OpenMP threads
spin while they wait for work and each parallel region ends in a barrier, so
threads that share a core stall each other: the workers slow down, and they
take CPU time from the training step. (The workers are started with ``spawn``,
as on macOS and Windows: OpenMP threads in a *forked* worker can deadlock once
the parent has run OpenMP itself.)
Expected: GD204
Fix: one intra-op thread per worker: ``torch.set_num_threads(1)`` in
``worker_init_fn`` (PyTorch's own default for workers; ``OMP_NUM_THREADS=1``
does the same for OpenMP code the Dataset calls), and leave the cores to the
training process.

    python sample_scripts/oversubscribed_threads.py            # planted
    python sample_scripts/oversubscribed_threads.py --fixed    # the fix
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


def set_worker_threads(worker_id: int, threads: int) -> None:
    torch.set_num_threads(threads)


class Photos(Dataset):
    """uint8 3x48x48 images, resized to 32x32 and blurred on access."""

    def __init__(self, n: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (n, 3, 48, 48), dtype=torch.uint8, generator=gen)
        self.labels = torch.randint(0, 10, (n,), generator=gen)
        g = torch.exp(-(torch.arange(5.0) - 2) ** 2 / 2)
        self.blur = (torch.outer(g, g) / torch.outer(g, g).sum()).expand(3, 1, 5, 5).contiguous()

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        img = self.images[i].float()[None] / 255.0
        img = F.interpolate(img, size=(40, 40), mode="bilinear", align_corners=False)
        img = F.conv2d(img, self.blur, padding=2, groups=3)
        img = F.interpolate(img, size=(32, 32), mode="bilinear", align_corners=False)[0]
        if i % 2:
            img = img.flip(-1)
        return (img - img.mean()) / (img.std() + 1e-6), self.labels[i]


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Train a small CNN with torch-op augmentation in workers.")
    p.add_argument("--fixed", action="store_true", help="one intra-op thread per worker (the fix)")
    # How long the planted workers take swings from run to run on 2 cores (8 to 38 s for the whole
    # script: whether their OpenMP threads happen to be descheduled at barriers). Smaller runs were
    # tried and dropped: at 768-1280 samples the planted run sometimes showed no oversubscription at
    # all, and the fixed one's short steps made receiving a batch look like a data stall.
    p.add_argument("--samples", type=int, default=2560, help="dataset size (default 2560: 20 steps)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.samples, args.batch_size = 128, 32

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    worker_threads = 1 if args.fixed else (os.cpu_count() or 1)
    loader = DataLoader(
        Photos(args.samples), batch_size=args.batch_size, shuffle=True, num_workers=2,
        persistent_workers=True, prefetch_factor=4, pin_memory=device.type == "cuda", multiprocessing_context="spawn",
        worker_init_fn=functools.partial(set_worker_threads, threads=worker_threads),
    )  # fmt: skip

    model = make_model().to(device)
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
