"""Calibration loop (issue 42): a DataLoader that computes (pure-Python decoding), num_workers=0.

Each sample is a record encoded as text (comma-separated integers, base-36) that
``__getitem__`` decodes in pure Python: a loading that keeps a core busy, so workers
can only hide it on free cores. GD201 sizes the workers to the cores not taken (by the
training process and by other processes) and its expected speed-up is checked against
what ``gpudoctor profile --verify`` measures (docs/account.md, "Calibration").
Expected: GD201
Fix: ``num_workers`` as GD201 sizes it (the free cores), ``persistent_workers=True``.

    python benchmarks/calibration/computing_loader.py            # planted
    python benchmarks/calibration/computing_loader.py --fixed    # workers on the free cores
"""

from __future__ import annotations

import argparse
import os
import random
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def encode(values: list[int]) -> str:
    out = []
    for v in values:
        s = ""
        while True:
            v, r = divmod(v, 36)
            s = DIGITS[r] + s
            if not v:
                break
        out.append(s)
    return ",".join(out)


class EncodedRecords(Dataset):
    """Records of ``features`` integers kept as text, decoded on every access (pure Python)."""

    def __init__(self, n: int, features: int, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.texts = [encode([rng.randrange(1 << 20) for _ in range(features)]) for _ in range(n)]
        self.labels = [rng.randrange(10) for _ in range(n)]

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        values = []
        for token in self.texts[i].split(","):
            v = 0
            for ch in token:
                v = v * 36 + DIGITS.index(ch)
            values.append((v % 2048) / 1024.0 - 1.0)
        return torch.tensor(values), self.labels[i]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fixed", action="store_true", help="load in worker processes (cores - 1)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--samples", type=int, default=32 * 300)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    data = EncodedRecords(args.samples, 256)
    workers = max(1, (os.cpu_count() or 2) - 1)
    extra = {"num_workers": workers, "persistent_workers": True} if args.fixed else {"num_workers": 0}
    loader = DataLoader(data, batch_size=32, shuffle=True, **extra)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
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
