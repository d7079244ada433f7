"""Worker restart: DataLoader workers are started again at every one of many short epochs.

Problem: a fine-tuning job runs 12 short epochs (8 steps each) over a small
dataset with ``num_workers=2`` and ``persistent_workers=False``. Every epoch the
DataLoader forks two new workers, and each opens its record store again (a lazy
per-process ``_open()``: 0.3 s of connection latency, simulated with
``time.sleep``, plus building a normalisation table in numpy, as an LMDB / HDF5 /
object-store reader does in each new process). The first step of every epoch
waits for that start-up; steady-state steps do not wait at all.
Expected: GD202
Fix: ``persistent_workers=True``: the workers, and what they opened, survive from
one epoch to the next, so start-up is paid once.

    python sample_scripts/worker_restart.py            # planted
    python sample_scripts/worker_restart.py --fixed    # the fix
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class RecordStore(Dataset):
    """32x32 images behind a store that each process must open before reading."""

    def __init__(self, n: int, open_latency_s: float, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.images = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
        self.labels = rng.integers(0, 10, size=n)
        self.open_latency_s = open_latency_s
        self._opened_by: int | None = None
        self._table: np.ndarray | None = None

    def _open(self) -> None:
        time.sleep(self.open_latency_s)  # connect / open the shards
        sample = self.images[:: max(1, len(self.images) // 256)].astype(np.float32)
        mean = sample.mean(axis=(0, 2, 3))
        std = sample.std(axis=(0, 2, 3)) + 1e-6
        self._table = ((np.arange(256, dtype=np.float32)[None, :] - mean[:, None]) / std[:, None])
        self._opened_by = os.getpid()

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self._opened_by != os.getpid():
            self._open()
        assert self._table is not None
        img = np.take_along_axis(self._table, self.images[i].reshape(3, -1).astype(np.intp), axis=1)
        if i % 2:
            img = img.reshape(3, 32, 32)[:, :, ::-1]
        return torch.from_numpy(np.ascontiguousarray(img, dtype=np.float32).reshape(3, 32, 32)), int(
            self.labels[i]
        )


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Fine-tune a small CNN for many short epochs.")
    p.add_argument("--fixed", action="store_true", help="keep the workers between epochs (the fix)")
    p.add_argument("--epochs", type=int, default=12, help="epochs (default 12)")
    p.add_argument("--samples", type=int, default=1024, help="dataset size (default 1024: 8 steps)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.samples, args.batch_size = 2, 128, 32

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dataset = RecordStore(args.samples, open_latency_s=0.3)
    loader = DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, num_workers=2,
        persistent_workers=args.fixed, pin_memory=device.type == "cuda",
    )  # fmt: skip

    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    criterion = nn.CrossEntropyLoss()
    start = time.perf_counter()
    running = torch.zeros((), device=device)
    for _ in range(args.epochs):
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()
            running += loss.detach()
        scheduler.step()
    steps = args.epochs * len(loader)
    print(f"{args.epochs} epochs, mean loss {running.item() / steps:.3f}, {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
