"""Starved DataLoader: every batch is read and decoded in the training process.

Problem: each sample costs a storage read (0.2 ms of latency, simulated with
``time.sleep`` as a network file system or object store would cost) plus real
decode and augmentation work (zlib inflate of a compressed image, random crop,
flip, brightness jitter, normalisation in numpy), and the DataLoader has
``num_workers=0``: the loop blocks in ``DataLoader.__next__`` for every batch, for
about a third of the step time on a 2-core CPU. Latency plus CPU work is what real
input pipelines look like, and it is why a worker pays even on 2 cores: while
it waits on storage or decodes, the training process computes.
Expected: GD201
Fix: load in worker processes: ``num_workers`` = cores - 1 (at most 4: one
core stays with the training process, as gpudoctor derives it; 1 on a 2-core
machine), ``persistent_workers=True``, ``prefetch_factor=4``,
``pin_memory=True`` when training on CUDA.

    python sample_scripts/starved_dataloader.py            # planted
    python sample_scripts/starved_dataloader.py --fixed    # the fix
"""

from __future__ import annotations

import argparse
import os
import time
import zlib

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

IMAGE_SIZE = 36
CROP = 32


class EncodedImages(Dataset):
    """Compressed 3x36x36 images kept in memory, decoded on every access."""

    def __init__(self, n: int, read_latency_s: float, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        yy, xx = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE]
        self.blobs: list[bytes] = []
        self.labels = rng.integers(0, 10, size=n)
        for i in range(n):
            base = np.sin(xx / (3 + i % 7)) * 60 + np.cos(yy / (2 + i % 5)) * 60 + 128
            img = np.stack([base + rng.normal(0, 3, base.shape) for _ in range(3)])
            self.blobs.append(zlib.compress(img.clip(0, 255).astype(np.uint8).tobytes(), 6))
        self.read_latency_s = read_latency_s

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.read_latency_s)  # the storage read
        raw = np.frombuffer(zlib.decompress(self.blobs[i]), np.uint8)
        img = raw.reshape(3, IMAGE_SIZE, IMAGE_SIZE).astype(np.float32) / 255.0
        rng = np.random.default_rng(i)
        top, left = rng.integers(0, IMAGE_SIZE - CROP + 1, size=2)
        img = img[:, top : top + CROP, left : left + CROP]
        if rng.random() < 0.5:
            img = img[:, :, ::-1]
        img = img * rng.uniform(0.8, 1.2) + rng.normal(0.0, 0.02, img.shape)
        img = (img - img.mean(axis=(1, 2), keepdims=True)) / (img.std(axis=(1, 2), keepdims=True) + 1e-6)
        return torch.from_numpy(np.ascontiguousarray(img, dtype=np.float32)), int(self.labels[i])


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Train a small CNN on a slow-to-decode dataset.")
    p.add_argument("--fixed", action="store_true", help="load in worker processes (the fix)")
    p.add_argument("--samples", type=int, default=4096, help="dataset size (default 4096)")
    p.add_argument("--epochs", type=int, default=2, help="epochs (default 2)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.samples, args.epochs, args.batch_size = 128, 1, 32

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dataset = EncodedImages(args.samples, read_latency_s=0.0002)
    if args.fixed:
        loader = DataLoader(
            dataset, batch_size=args.batch_size, shuffle=True, num_workers=min(4, max(1, (os.cpu_count() or 2) - 1)),
            persistent_workers=True, prefetch_factor=4, pin_memory=device.type == "cuda",
        )  # fmt: skip
    else:
        loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=0)

    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    start = time.perf_counter()
    for epoch in range(args.epochs):
        running = torch.zeros((), device=device)
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()
            running += loss.detach()
        print(f"epoch {epoch}: mean loss {running.item() / len(loader):.3f}")
    print(f"trained {args.epochs} epochs in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
