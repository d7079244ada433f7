"""Calibration loop (issue 42): a DataLoader whose collate waits, num_workers=0, a tiny model.

Each batch's collate sleeps ``--wait-ms`` (30 ms: storage or network latency, no CPU) and
the model is a 2-layer MLP on 64-row batches, so the step's own work is a few ms at most
and its speed depends on whether the CPU is warm: while the loop sleeps, clocks, caches
and thread pools go cold (docs/account.md, "Calibration"). GD201's expected speed-up is
checked against what ``gpudoctor profile --verify`` measures on it.
Expected: GD201
Fix: ``num_workers`` as GD201 sizes it, ``persistent_workers=True``.

    python benchmarks/calibration/waiting_loader.py            # planted
    python benchmarks/calibration/waiting_loader.py --fixed    # 8 workers
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, default_collate


class Rows(Dataset):
    """Random feature rows with a class label, in memory."""

    def __init__(self, n: int, features: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, features, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class WaitingCollate:
    """default_collate after a wait, as a read from remote storage costs (no CPU)."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s

    def __call__(self, batch: list) -> list:
        time.sleep(self.wait_s)
        return default_collate(batch)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fixed", action="store_true", help="load in 8 worker processes")
    p.add_argument("--wait-ms", type=float, default=30.0, help="collate's wait per batch (default 30)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--samples", type=int, default=64 * 400)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    data = Rows(args.samples, 32)
    extra = {"num_workers": 8, "persistent_workers": True} if args.fixed else {"num_workers": 0}
    loader = DataLoader(data, batch_size=64, shuffle=True, collate_fn=WaitingCollate(args.wait_ms / 1e3), **extra)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    criterion = nn.CrossEntropyLoss()
    start = time.perf_counter()
    for _epoch in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    print(f"trained in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
