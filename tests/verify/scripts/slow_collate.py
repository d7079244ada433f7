"""A loop that waits for its DataLoader: ``num_workers=0`` and a slow ``collate_fn``.

The collate function stands for per-batch work that takes time without using much CPU
(a storage read, a remote fetch: 20 ms of sleep), done in the training process
between steps. GD201 fires; its fix (a waiting load: enough workers to hide the wait,
more than the cores of a 2-core machine) hides it behind the step, which ``--verify``
must measure as a speed-up. With
``--refuse-workers`` it raises when given workers: a fix that crashes the script.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def slow_collate(batch):
    time.sleep(0.02)  # fetching and decoding a batch
    xs, ys = zip(*batch, strict=True)
    return torch.stack(xs), torch.stack(ys)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--refuse-workers", action="store_true", help="raise when the DataLoader has workers")
    args = p.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 256), torch.randint(0, 10, (4096,)))
    loader = DataLoader(data, batch_size=32, shuffle=True, collate_fn=slow_collate)
    model = nn.Sequential(nn.Linear(256, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if args.refuse_workers and loader.num_workers:
        raise RuntimeError("this script cannot run with DataLoader workers")
    for _ in range(args.epochs):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main()
