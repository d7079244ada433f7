"""The script the --verify injection tests change: it sets, itself, everything an injection targets.

cudnn.benchmark off, float32 matmuls at "highest" (no TF32), two intra-op threads, a
DataLoader without pinned memory or persistent workers, AdamW without fused or foreach,
a host→device copy of every batch (to the meta device, which stands in for a GPU on a
CPU-only machine), and torch.cuda.empty_cache() every step (a no-op without CUDA).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=0)
    args = p.parse_args()
    torch.backends.cudnn.benchmark = False
    torch.set_float32_matmul_precision("highest")
    torch.set_num_threads(2)
    data = TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
    loader = DataLoader(data, batch_size=16, num_workers=args.workers)
    model = nn.Linear(16, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    device = torch.device("meta")
    for _ in range(2):
        for x, y in loader:
            x.to(device)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
