"""A compute-bound loop with its data in memory: nothing for ``--verify`` to confirm.

The dataset is tensors made once before the loop, batched by a DataLoader without
workers (collating 32 in-memory rows costs well under a millisecond); each step is
matrix multiplications (~13 ms on one core). Workers or any other injectable change
cannot make it measurably faster.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    args = p.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 256), torch.randint(0, 10, (4096,)))
    loader = DataLoader(data, batch_size=32, shuffle=True)
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
