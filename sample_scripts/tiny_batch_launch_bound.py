"""Tiny batch, launch-bound: a batch of 4 through many small layers.

Problem: a 12-block residual MLP (width 64: Linear, LayerNorm, GELU, Linear) is
trained with ``batch_size=4``. Each op then does a few hundred floating-point
operations, far less than what it costs to dispatch it: on a GPU most kernels
run for a few microseconds and the host cannot launch them as fast as they
finish (launch-bound); on a CPU the same per-op overhead (Python, dispatcher,
autograd bookkeeping) dominates the step. Most of each step is spent issuing
work, not doing it.
Expected: GD103
Fix: a larger batch: ``batch_size=256`` with the learning rate scaled linearly
(0.002 x 256/4 for Adam, with warm-up on real jobs). On a GPU, ``torch.compile``
or CUDA graphs and a fused optimizer also cut the launches. The rows are
gathered a batch at a time (``Dataset.__getitems__``), so loading stays cheap
at any batch size. The benchmark compares time per sample, since the batch
changes.

    python sample_scripts/tiny_batch_launch_bound.py            # planted
    python sample_scripts/tiny_batch_launch_bound.py --fixed    # the fix
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

WIDTH = 64
BLOCKS = 12


class Tabular(Dataset):
    """Feature rows in memory; ``__getitems__`` gathers a whole batch with one index op."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        self.features, self.labels = features, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.features[i], self.labels[i]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(indices)
        return self.features[idx], self.labels[idx]


def already_batched(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return batch


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(32, WIDTH), *[Block(WIDTH) for _ in range(BLOCKS)], nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 10)
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Train a deep, narrow MLP on tabular features.")
    p.add_argument("--fixed", action="store_true", help="batch 256 with a scaled learning rate (the fix)")
    p.add_argument("--samples", type=int, default=4096, help="samples to train on (default 4096)")
    p.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.samples = 128

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    features = torch.randn(args.samples, 32)
    labels = (features[:, :10].argmax(dim=1) + (features[:, 10] > 1).long()) % 10
    batch_size = 256 if args.fixed else 4
    loader = DataLoader(
        Tabular(features, labels), batch_size=batch_size, shuffle=True, collate_fn=already_batched,
        pin_memory=device.type == "cuda",
    )  # fmt: skip

    model = make_model().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.002 * batch_size / 4 if args.fixed else 0.002)
    criterion = nn.CrossEntropyLoss()
    start = time.perf_counter()
    running = torch.zeros((), device=device)
    for x, y in loader:
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        running += loss.detach()
    elapsed = time.perf_counter() - start
    print(f"{len(loader)} steps of {batch_size}: mean loss {running.item() / len(loader):.3f}, "
          f"{1e6 * elapsed / args.samples:.0f} us per sample")  # fmt: skip


if __name__ == "__main__":
    main()
