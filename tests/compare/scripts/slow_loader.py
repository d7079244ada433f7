"""A training loop whose Dataset is slow to read: the before/after pair of the compare tests.

Each sample costs 2 ms of storage latency (``time.sleep``: no CPU, so the test does not
depend on how busy the machine is) and each step 60 ms of stand-in device work. With
``--workers 0`` the loop reads every batch itself (32 ms of waiting per step, GD201);
with ``--workers 2`` two worker processes read ahead and the loop hardly waits.

    python slow_loader.py --workers 0    # before
    python slow_loader.py --workers 2    # after
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowReads(Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int):
        time.sleep(0.002)  # a storage read
        return np.full(16, i % 7, np.float32), i % 2


def collate(batch):
    """Stack into numpy arrays: they travel from a worker through its pipe, without the
    file-descriptor handshake of a tensor's shared memory (which waits for the worker to be
    scheduled, and so for an idle CPU, on a busy test machine)."""
    return np.stack([x for x, _ in batch]), np.array([y for _, y in batch])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Linear(16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowReads(), batch_size=16, num_workers=args.workers, collate_fn=collate)
    for xs, ys in loader:
        x, y = torch.from_numpy(xs), torch.from_numpy(ys)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        time.sleep(0.060)  # stands in for the device's share of the step
        opt.step()


if __name__ == "__main__":
    main()
