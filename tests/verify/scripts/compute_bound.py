"""A compute-bound loop with its data in memory: nothing for ``--verify`` to confirm.

The dataset is whole batches made once before the loop, handed out by a DataLoader
without workers and without batching (``batch_size=None``: no collate, a list lookup
per step, microseconds); each step is matrix multiplications (~13 ms on one core).
Workers or any other injectable change cannot make it 5% faster: there is no loading
for them to take off the training process (per-row indexing and collating 32 rows
would be a millisecond or two of it, which workers on a second core can hide).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    args = p.parse_args()
    torch.manual_seed(0)
    x, y = torch.randn(4096, 256), torch.randint(0, 10, (4096,))
    batches = [(x[i:i + 32], y[i:i + 32]) for i in range(0, 4096, 32)]  # made once: no loading per step
    loader = DataLoader(batches, batch_size=None, shuffle=True)
    model = nn.Sequential(nn.Linear(256, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.epochs):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main()
